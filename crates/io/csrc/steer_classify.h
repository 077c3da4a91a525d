// SPDX-License-Identifier: Apache-2.0
//
// The steering classifier of steer.bpf.c over one kind of program context,
// included once per context: FP_CTX (the context type), FP_LOAD (its
// load-bytes helper) and FP_FN (a name with the context's suffix) are
// defined by the includer. Reads only through FP_LOAD, bounded by `len`
// (the frame's length as the context sees it).

static __always_inline int FP_FN(ld16)(FP_CTX *ctx, __u32 off, __u16 *v)
{
	__u8 b[2];
	if (FP_LOAD(ctx, off, b, 2))
		return -1;
	*v = ((__u16)b[0] << 8) | b[1];
	return 0;
}

// The ports of `proto` at l4, inside `end` (crates/wire/src/frame.rs `ports`). -1: refused.
static __always_inline int FP_FN(ports)(FP_CTX *ctx, __u32 l4, __u32 end, __u8 proto, __u8 *p)
{
	if (proto == 6 || proto == 17 || proto == 132 || proto == 136 || proto == 33) {
		if (l4 + 4 > end || FP_LOAD(ctx, l4, p, 4))
			return -1;
		return 0;
	}
	if (proto == 1 || proto == 58) {
		__u8 h[8];
		if (l4 + 8 > end || FP_LOAD(ctx, l4, h, 8))
			return -1;
		int echo = proto == 1 ? (h[0] == 8 || h[0] == 0) : (h[0] == 128 || h[0] == 129);
		if (echo) {
			p[0] = h[4];
			p[1] = h[5];
			p[2] = h[4];
			p[3] = h[5];
		}
		return 0;
	}
	return 0;
}

static __always_inline int FP_FN(parse_v4)(FP_CTX *ctx, __u32 len, __u32 off, struct tuple *t, __u32 *l4_out)
{
	__u8 ip[20];
	if (FP_LOAD(ctx, off, ip, 20))
		return -1;
	__u32 ihl = (ip[0] & 0x0f) * 4;
	__u32 total = ((__u32)ip[2] << 8) | ip[3];
	if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl)
		return -1;
	__u32 end = off + total;
	if (end > len)
		end = len;
	__u32 l4 = off + ihl;
	if (l4 > end)
		return -1;
	t->proto = ip[9];
	__builtin_memcpy(t->a, &ip[12], 8);
	__u16 frag = ((__u16)ip[6] << 8) | ip[7];
	*l4_out = l4;
	if (frag & 0x3fff) {
		t->frag = 1;
		t->id = ((__u32)ip[4] << 8) | ip[5];
	}
	if (frag & 0x1fff) {
		t->later = 1;
		return 0;
	}
	return FP_FN(ports)(ctx, l4, end, t->proto, t->p);
}

static __always_inline int FP_FN(parse_v6)(FP_CTX *ctx, __u32 len, __u32 off, struct tuple *t)
{
	__u8 ip[40];
	if (FP_LOAD(ctx, off, ip, 40))
		return -1;
	if ((ip[0] >> 4) != 6)
		return -1;
	__u32 plen = ((__u32)ip[4] << 8) | ip[5];
	// Payload length 0 is a jumbogram: bounded by the frame only.
	__u32 end = len;
	if (plen != 0 && off + 40 + plen < end)
		end = off + 40 + plen;
	t->v6 = 1;
	__builtin_memcpy(t->a, &ip[8], 32);
	__u8 nh = ip[6];
	__u32 l4 = off + 40;
#pragma unroll
	for (int i = 0; i < MAX_EXT; i++) {
		if (!is_v6_ext(nh))
			break;
		if (nh == 44) {
			__u8 h[8];
			if (l4 + 8 > end || FP_LOAD(ctx, l4, h, 8))
				return -1;
			nh = h[0];
			l4 += 8;
			__u16 fo = ((__u16)h[2] << 8) | h[3];
			if (fo & 0xfff9) {
				// Not an atomic fragment (offset 0 without M: a whole datagram).
				t->frag = 1;
				t->id = ((__u32)h[4] << 24) | ((__u32)h[5] << 16) | ((__u32)h[6] << 8) | h[7];
			}
			if (fo >> 3) {
				t->proto = nh;
				t->later = 1;
				return 0;
			}
		} else {
			__u8 h[2];
			if (l4 + 2 > end || FP_LOAD(ctx, l4, h, 2))
				return -1;
			__u32 len = nh == 51 ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;
			nh = h[0];
			l4 += len;
		}
	}
	if (is_v6_ext(nh))
		return -1;
	t->proto = nh;
	return FP_FN(ports)(ctx, l4, end, nh, t->p);
}

// The IPv4 flow an ICMPv4 error quotes (crates/scale/src/steer.rs `icmp_quoted`). -1: none.
static __always_inline int FP_FN(icmp_quoted)(FP_CTX *ctx, __u32 len, __u32 l3, struct tuple *q)
{
	__u8 b0, type;
	if (FP_LOAD(ctx, l3, &b0, 1))
		return -1;
	__u32 ihl = (b0 & 0x0f) * 4;
	if (FP_LOAD(ctx, l3 + ihl, &type, 1) || !is_icmp_error(type))
		return -1;
	__u32 inner = l3 + ihl + 8;
	__u8 ip[20];
	if (FP_LOAD(ctx, inner, ip, 1))
		return -1;
	__u32 ihl2 = (ip[0] & 0x0f) * 4;
	if (ihl2 < 20 || inner + ihl2 + 4 > len || FP_LOAD(ctx, inner, ip, 20))
		return -1;
	__builtin_memset(q, 0, sizeof(*q));
	q->proto = ip[9];
	__builtin_memcpy(q->a, &ip[12], 8);
	if ((q->proto == 6 || q->proto == 17) && FP_LOAD(ctx, inner + ihl2, q->p, 4))
		return -1;
	return 0;
}

// The owner of a frame whose (innermost) EtherType `et` is at `off - 2`, with `tags` VLAN tags
// already stripped by the device (the first one's TPID `tpid0`): steps 1-7 of steer.bpf.c.
static __always_inline __u32 FP_FN(classify)(FP_CTX *ctx, __u32 len, __u16 et, __u32 off, __u32 tags, __u16 tpid0,
					     struct fp_cfg *cfg)
{
	__u32 zero = 0;
#pragma unroll
	for (int i = 0; i < 3; i++) {
		if (!is_vlan(et))
			break;
		if (tags >= 2)
			goto unclassified;
		if (tags == 0)
			tpid0 = et;
		tags++;
		__u8 tag[4];
		if (FP_LOAD(ctx, off, tag, 4))
			goto unclassified;
		et = ((__u16)tag[2] << 8) | tag[3];
		off += 4;
	}

	struct tuple t;
	__builtin_memset(&t, 0, sizeof(t));
	__u32 l4 = 0;
	if (et == 0x0800) {
		if (FP_FN(parse_v4)(ctx, len, off, &t, &l4))
			goto unclassified;
	} else if (et == 0x86dd) {
		if (FP_FN(parse_v6)(ctx, len, off, &t))
			goto unclassified;
	} else {
		goto unclassified;
	}

	// Step 8: a later fragment of a datagram whose first fragment was steered goes the same way.
	struct fp_fragk fk;
	__builtin_memset(&fk, 0, sizeof(fk));
	if (t.frag) {
		__builtin_memcpy(fk.a, t.a, 32);
		fk.id = t.id;
		fk.v6 = t.v6;
		fk.proto = t.proto;
		if (t.later) {
			__u32 *fkey = bpf_map_lookup_elem(&fp_frags, &fk);
			if (fkey) {
				count(ST_FRAG);
				return owner(cfg, *fkey);
			}
		}
	}

	// The flow the key is computed on: the frame's, or the one its ICMP error quotes.
	struct tuple k = t;
	__u32 sk;
	if (cfg->icmp_inner && !t.v6 && t.proto == 1 && (tags == 0 || (tags == 1 && tpid0 == 0x8100))) {
		struct tuple q;
		if (FP_FN(icmp_quoted)(ctx, len, off, &q) == 0)
			k = q;
	}

	__u32 nrules = cfg->nrules;
	if (!k.v6 && nrules) {
		__u32 dst;
		__builtin_memcpy(&dst, &k.a[4], 4);
		__u16 dport = ((__u16)k.p[2] << 8) | k.p[3];
		__u32 hit = MAX_FDIR;
		for (__u32 r = 0; r < MAX_FDIR; r++) {
			if (r >= nrules)
				break;
			struct fp_fdir *f = bpf_map_lookup_elem(&fp_fdir, &r);
			if (!f)
				break;
			if (!f->any_proto && f->proto != k.proto)
				continue;
			if ((dst & f->mask) != (f->net & f->mask))
				continue;
			if (dport < f->lo || dport > f->hi)
				continue;
			hit = r;
			break;
		}
		if (hit < MAX_FDIR) {
			count(ST_FDIR);
			sk = cfg->reta_size + hit;
			goto steered;
		}
	}

	struct fp_toep_t *tp = bpf_map_lookup_elem(&fp_toep, &zero);
	if (!tp)
		goto unclassified;
	__u8 in[TOEP_LEN];
	__builtin_memset(in, 0, sizeof(in));
	__u32 n;
	if (cfg->hash_on == ON_SRC_IP) {
		if (k.v6) {
			__builtin_memcpy(in, k.a, 16);
			n = 16;
		} else {
			__builtin_memcpy(in, k.a, 4);
			n = 4;
		}
	} else if (cfg->hash_on == ON_DST_IP) {
		if (k.v6) {
			__builtin_memcpy(&in[16], &k.a[16], 16);
			n = 32;
		} else {
			__builtin_memcpy(&in[4], &k.a[4], 4);
			n = 8;
		}
	} else {
		int with_ports = (k.proto == 6 || k.proto == 17) && !k.later;
		if (k.v6) {
			__builtin_memcpy(in, k.a, 32);
			__builtin_memcpy(&in[32], k.p, 4);
			n = with_ports ? 36 : 32;
		} else {
			__builtin_memcpy(in, k.a, 8);
			__builtin_memcpy(&in[8], k.p, 4);
			n = with_ports ? 12 : 8;
		}
	}
	__u32 h = 0;
#pragma unroll
	for (int i = 0; i < TOEP_LEN; i++) {
		if (i < n)
			h ^= tp->t[i * 256 + in[i]];
	}
	__u32 key = h & cfg->reta_mask;

	// An exact-match rule (Dyssect's offloaded flow) on the frame's own IPv4 flow, bound to this entry.
	if (cfg->nflows && !t.v6) {
		struct fp_flow f;
		__builtin_memset(&f, 0, sizeof(f));
		__builtin_memcpy(&f.src, &t.a[0], 4);
		__builtin_memcpy(&f.dst, &t.a[4], 4);
		__builtin_memcpy(&f.sport, &t.p[0], 2);
		__builtin_memcpy(&f.dport, &t.p[2], 2);
		f.proto = t.proto;
		struct fp_slot *s = bpf_map_lookup_elem(&fp_flows, &f);
		if (s && s->entry == key) {
			count(ST_FLOW);
			sk = s->slot;
			goto steered;
		}
	}
	count(ST_RETA);
	sk = key;

steered:
	if (t.frag && !t.later)
		bpf_map_update_elem(&fp_frags, &fk, &sk, BPF_ANY);
	return owner(cfg, sk);

unclassified:
	count(ST_UNCLASSIFIED);
	return owner(cfg, 0);
}


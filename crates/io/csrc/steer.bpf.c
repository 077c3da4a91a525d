// SPDX-License-Identifier: Apache-2.0
//
// Kernel steering for AF_PACKET ports: a PACKET_FANOUT_EBPF program (a
// BPF_PROG_TYPE_SOCKET_FILTER run by the fanout group on every received
// frame) that computes flowplane's steering key exactly as
// `flowplane_scale::steer::Classifier::classify` plus the dispatcher's
// exact-match flow rules do, and returns the key's owner: the index of the
// worker, which is the socket's index in the fanout group (sockets join in
// worker order; the kernel takes the result modulo the group's size).
//
// Steps (each mirrors crates/wire/src/frame.rs `walk` or crates/scale/src/steer.rs):
//  1. Ethernet: up to two VLAN tags (0x8100, 0x88a8, 0x9100), one of which the
//     kernel may already have moved into the skb's metadata; then IPv4 or IPv6.
//  2. IPv4: IHL >= 20, total length >= IHL, the transport header inside
//     min(frame, datagram); a later fragment has no ports. IPv6: at most 8
//     extension headers (hop-by-hop, routing, fragment, AH, destination
//     options); a later fragment has no ports.
//  3. Ports: TCP, UDP, SCTP, UDP-Lite, DCCP: 4 bytes; ICMP/ICMPv6: an 8-byte
//     header, the echo identifier as both ports. Anything the walk refuses is
//     unclassified: steering key 0, as the dispatcher does.
//  4. icmp_inner: an ICMPv4 error (type 3, 4, 5, 11, 12) on a frame with no
//     tag or one 0x8100 tag is classified by the flow it quotes.
//  5. Flow-director rules (fp_fdir, first match wins, IPv4 only): key
//     reta_size + rule index.
//  6. Otherwise the Toeplitz hash (fp_toep: per input byte position and value,
//     its 32-bit contribution, filled from flowplane's own key) over the
//     HashOn input, masked: the RETA entry. An exact-match flow rule of the
//     frame's own IPv4 flow (either direction) bound to that entry
//     (fp_flows) takes the frame to its slot key instead.
//  7. fp_reta[key]: the owner.

#include <linux/bpf.h>
#include <linux/if_packet.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TOEP_LEN 36
#define MAX_FDIR 64
#define MAX_EXT 8

enum { ON_FIVE_TUPLE = 0, ON_SRC_IP = 1, ON_DST_IP = 2 };
enum { ST_RETA = 0, ST_FDIR = 1, ST_FLOW = 2, ST_UNCLASSIFIED = 3, ST_N = 4 };

// Layouts shared with crates/io/src/fanout_steer.rs (repr(C) there).
struct fp_cfg {
	__u32 reta_mask;
	__u32 reta_size;
	__u32 nrules;
	__u32 nflows;
	__u32 keys;
	__u8 hash_on;
	__u8 icmp_inner;
	__u8 count; // fp_counts kept (a strategy that moves keys reads them)
	__u8 pad;
};

struct fp_fdir {
	__u32 net;  // destination prefix, wire byte order
	__u32 mask; // wire byte order
	__u16 lo;   // inclusive destination port range, host order
	__u16 hi;
	__u8 proto;
	__u8 any_proto;
	__u8 pad[2];
};

struct fp_flow {
	__u32 src; // wire byte order
	__u32 dst;
	__u16 sport; // wire byte order
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct fp_slot {
	__u16 entry;
	__u16 slot;
};

struct fp_toep_t {
	__u32 t[TOEP_LEN * 256];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_cfg);
} fp_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_toep_t);
} fp_toep SEC(".maps");

// Owner per steering key (RETA entries, then fixed rules, then flow slots); sized at load.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, __u32);
} fp_reta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FDIR);
	__type(key, __u32);
	__type(value, struct fp_fdir);
} fp_fdir SEC(".maps");

// Both directions of every exact-match flow rule; sized at load.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct fp_flow);
	__type(value, struct fp_slot);
} fp_flows SEC(".maps");

// Frames per (owner, key), at owner * keys + key; sized at load, mmap'ed by flowplane.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} fp_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_N);
	__type(key, __u32);
	__type(value, __u64);
} fp_stats SEC(".maps");

// A parsed flow: addresses as on the wire (IPv4 in a[0..8]), ports as on the wire.
struct tuple {
	__u8 a[32];
	__u8 p[4];
	__u8 v6;
	__u8 proto;
	__u8 later; // a non-first fragment: no ports
	__u8 pad;
};

static __always_inline int is_vlan(__u16 et)
{
	return et == 0x8100 || et == 0x88a8 || et == 0x9100;
}

static __always_inline int ld16(struct __sk_buff *skb, __u32 off, __u16 *v)
{
	__u8 b[2];
	if (bpf_skb_load_bytes(skb, off, b, 2))
		return -1;
	*v = ((__u16)b[0] << 8) | b[1];
	return 0;
}

// The ports of `proto` at l4, inside `end` (crates/wire/src/frame.rs `ports`). -1: refused.
static __always_inline int ports(struct __sk_buff *skb, __u32 l4, __u32 end, __u8 proto, __u8 *p)
{
	if (proto == 6 || proto == 17 || proto == 132 || proto == 136 || proto == 33) {
		if (l4 + 4 > end || bpf_skb_load_bytes(skb, l4, p, 4))
			return -1;
		return 0;
	}
	if (proto == 1 || proto == 58) {
		__u8 h[8];
		if (l4 + 8 > end || bpf_skb_load_bytes(skb, l4, h, 8))
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

static __always_inline int parse_v4(struct __sk_buff *skb, __u32 off, struct tuple *t, __u32 *l4_out)
{
	__u8 ip[20];
	if (bpf_skb_load_bytes(skb, off, ip, 20))
		return -1;
	__u32 ihl = (ip[0] & 0x0f) * 4;
	__u32 total = ((__u32)ip[2] << 8) | ip[3];
	if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl)
		return -1;
	__u32 end = off + total;
	if (end > skb->len)
		end = skb->len;
	__u32 l4 = off + ihl;
	if (l4 > end)
		return -1;
	t->proto = ip[9];
	__builtin_memcpy(t->a, &ip[12], 8);
	__u16 frag = ((__u16)ip[6] << 8) | ip[7];
	*l4_out = l4;
	if (frag & 0x1fff) {
		t->later = 1;
		return 0;
	}
	return ports(skb, l4, end, t->proto, t->p);
}

static __always_inline int is_v6_ext(__u8 nh)
{
	return nh == 0 || nh == 43 || nh == 44 || nh == 51 || nh == 60;
}

static __always_inline int parse_v6(struct __sk_buff *skb, __u32 off, struct tuple *t)
{
	__u8 ip[40];
	if (bpf_skb_load_bytes(skb, off, ip, 40))
		return -1;
	if ((ip[0] >> 4) != 6)
		return -1;
	__u32 plen = ((__u32)ip[4] << 8) | ip[5];
	// Payload length 0 is a jumbogram: bounded by the frame only.
	__u32 end = skb->len;
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
			if (l4 + 8 > end || bpf_skb_load_bytes(skb, l4, h, 8))
				return -1;
			nh = h[0];
			l4 += 8;
			if ((((__u16)h[2] << 8) | h[3]) >> 3) {
				t->proto = nh;
				t->later = 1;
				return 0;
			}
		} else {
			__u8 h[2];
			if (l4 + 2 > end || bpf_skb_load_bytes(skb, l4, h, 2))
				return -1;
			__u32 len = nh == 51 ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;
			nh = h[0];
			l4 += len;
		}
	}
	if (is_v6_ext(nh))
		return -1;
	t->proto = nh;
	return ports(skb, l4, end, nh, t->p);
}

static __always_inline int is_icmp_error(__u8 type)
{
	return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
}

// The IPv4 flow an ICMPv4 error quotes (crates/scale/src/steer.rs `icmp_quoted`). -1: none.
static __always_inline int icmp_quoted(struct __sk_buff *skb, __u32 l3, struct tuple *q)
{
	__u8 b0, type;
	if (bpf_skb_load_bytes(skb, l3, &b0, 1))
		return -1;
	__u32 ihl = (b0 & 0x0f) * 4;
	if (bpf_skb_load_bytes(skb, l3 + ihl, &type, 1) || !is_icmp_error(type))
		return -1;
	__u32 inner = l3 + ihl + 8;
	__u8 ip[20];
	if (bpf_skb_load_bytes(skb, inner, ip, 1))
		return -1;
	__u32 ihl2 = (ip[0] & 0x0f) * 4;
	if (ihl2 < 20 || inner + ihl2 + 4 > skb->len || bpf_skb_load_bytes(skb, inner, ip, 20))
		return -1;
	__builtin_memset(q, 0, sizeof(*q));
	q->proto = ip[9];
	__builtin_memcpy(q->a, &ip[12], 8);
	if ((q->proto == 6 || q->proto == 17) && bpf_skb_load_bytes(skb, inner + ihl2, q->p, 4))
		return -1;
	return 0;
}

static __always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&fp_stats, &what);
	if (c)
		*c += 1;
}

// The owner of `key`, counted against (owner, key) when the run reads loads.
static __always_inline __u32 owner(struct fp_cfg *cfg, __u32 key)
{
	__u32 *o = bpf_map_lookup_elem(&fp_reta, &key);
	__u32 q = o ? *o : 0;
	if (cfg->count) {
		__u32 i = q * cfg->keys + key;
		__u64 *c = bpf_map_lookup_elem(&fp_counts, &i);
		if (c)
			__sync_fetch_and_add(c, 1);
	}
	return q;
}

SEC("socket")
int fp_steer(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fp_cfg *cfg = bpf_map_lookup_elem(&fp_cfg, &zero);
	if (!cfg)
		return 0;

	// Received frames start at the network header (the MAC header and a
	// stripped tag are behind skb->data); our own transmissions at the MAC header.
	__u16 et;
	__u32 off;
	if (skb->pkt_type == PACKET_OUTGOING) {
		if (ld16(skb, 12, &et))
			goto unclassified;
		off = 14;
	} else {
		et = bpf_ntohs((__u16)skb->protocol);
		off = 0;
	}
	__u32 tags = 0;
	__u16 tpid0 = 0;
	if (skb->vlan_present) {
		tags = 1;
		tpid0 = bpf_ntohs((__u16)skb->vlan_proto);
	}
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
		if (bpf_skb_load_bytes(skb, off, tag, 4))
			goto unclassified;
		et = ((__u16)tag[2] << 8) | tag[3];
		off += 4;
	}

	struct tuple t;
	__builtin_memset(&t, 0, sizeof(t));
	__u32 l4 = 0;
	if (et == 0x0800) {
		if (parse_v4(skb, off, &t, &l4))
			goto unclassified;
	} else if (et == 0x86dd) {
		if (parse_v6(skb, off, &t))
			goto unclassified;
	} else {
		goto unclassified;
	}

	// The flow the key is computed on: the frame's, or the one its ICMP error quotes.
	struct tuple k = t;
	if (cfg->icmp_inner && !t.v6 && t.proto == 1 && (tags == 0 || (tags == 1 && tpid0 == 0x8100))) {
		struct tuple q;
		if (icmp_quoted(skb, off, &q) == 0)
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
			return owner(cfg, cfg->reta_size + hit);
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
			return owner(cfg, s->slot);
		}
	}
	count(ST_RETA);
	return owner(cfg, key);

unclassified:
	count(ST_UNCLASSIFIED);
	return owner(cfg, 0);
}

// No GPL-only helper is used: the workspace licence applies.
char LICENSE[] SEC("license") = "Apache-2.0";

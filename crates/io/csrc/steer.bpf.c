// SPDX-License-Identifier: Apache-2.0
//
// Kernel steering for AF_PACKET and AF_XDP ports. For AF_PACKET, a
// PACKET_FANOUT_EBPF program (fp_steer: a BPF_PROG_TYPE_SOCKET_FILTER run by
// the fanout group on every received frame) that computes flowplane's steering key exactly as
// `flowplane_scale::steer::Classifier::classify` plus the dispatcher's
// exact-match flow rules do, and returns the key's owner: the index of the
// worker, which is the socket's index in the fanout group (sockets join in
// worker order; the kernel takes the result modulo the group's size). For
// AF_XDP, an XDP program (fp_xdp_steer) computing the same owner and
// redirecting the frame to that worker's socket on its queue (fp_xsks). The
// classifier is written once (steer_classify.h) over either context.
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
//  8. Fragments (crates/scale/src/fragsteer.rs): a first fragment (IPv4 MF
//     at offset 0; IPv6 Fragment header, M at offset 0) classified by 1-6
//     leaves its steering key in fp_frags under its datagram (addresses,
//     identification, protocol); a later fragment whose datagram is there
//     takes that key (then step 7), else it goes through 1-6 on its addresses.

#include <linux/bpf.h>
#include <linux/if_packet.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TOEP_LEN 36
#define MAX_FDIR 64
#define MAX_EXT 8

enum { ON_FIVE_TUPLE = 0, ON_SRC_IP = 1, ON_DST_IP = 2 };
enum { ST_RETA = 0, ST_FDIR = 1, ST_FLOW = 2, ST_UNCLASSIFIED = 3, ST_FRAG = 4, ST_N = 5 };

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
	__u32 xsk_queue0;  // AF_XDP: the port's first queue,
	__u32 xsk_queues;  // its queues (0: no AF_XDP port),
	__u32 xsk_workers; // and the workers each has a socket for.
	__u32 pad2;
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

// AF_XDP sockets by (queue, worker) (fp_xdp_steer); sized at load.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} fp_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_N);
	__type(key, __u32);
	__type(value, __u64);
} fp_stats SEC(".maps");

// A fragmented datagram: addresses as on the wire (IPv4 in a[0..8]), identification, protocol.
struct fp_fragk {
	__u8 a[32];
	__u32 id;
	__u8 v6;
	__u8 proto;
	__u8 pad[2];
};

// First fragments' steering keys by datagram (step 8).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fp_fragk);
	__type(value, __u32);
} fp_frags SEC(".maps");

// A parsed flow: addresses as on the wire (IPv4 in a[0..8]), ports as on the wire.
struct tuple {
	__u8 a[32];
	__u8 p[4];
	__u8 v6;
	__u8 proto;
	__u8 later; // a non-first fragment: no ports
	__u8 frag;  // a fragment (first or later) of a fragmented datagram
	__u32 id;   // its identification
};

static __always_inline int is_vlan(__u16 et)
{
	return et == 0x8100 || et == 0x88a8 || et == 0x9100;
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

static __always_inline int is_v6_ext(__u8 nh)
{
	return nh == 0 || nh == 43 || nh == 44 || nh == 51 || nh == 60;
}

static __always_inline int is_icmp_error(__u8 type)
{
	return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
}

#define FP_CAT2(a, b) a##b
#define FP_CAT(a, b) FP_CAT2(a, b)
#define FP_FN(name) FP_CAT(name, FP_SFX)

// The classifier over a socket buffer (fanout): data starts at the network header.
#define FP_CTX struct __sk_buff
#define FP_LOAD bpf_skb_load_bytes
#define FP_SFX _skb
#include "steer_classify.h"
#undef FP_CTX
#undef FP_LOAD
#undef FP_SFX

// The classifier over an XDP buffer: data starts at the MAC header.
#define FP_CTX struct xdp_md
#define FP_LOAD bpf_xdp_load_bytes
#define FP_SFX _xdp
#include "steer_classify.h"
#undef FP_CTX
#undef FP_LOAD
#undef FP_SFX

SEC("socket")
int fp_steer(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fp_cfg *cfg = bpf_map_lookup_elem(&fp_cfg, &zero);
	if (!cfg)
		return 0;

	// Received frames start at the network header (the MAC header and a
	// stripped tag are behind skb->data); our own transmissions at the MAC header.
	__u16 et = 0;
	__u32 off = 0;
	if (skb->pkt_type == PACKET_OUTGOING) {
		// A short frame leaves et 0: unclassified.
		ld16_skb(skb, 12, &et);
		off = 14;
	} else {
		et = bpf_ntohs((__u16)skb->protocol);
	}
	__u32 tags = 0;
	__u16 tpid0 = 0;
	if (skb->vlan_present) {
		tags = 1;
		tpid0 = bpf_ntohs((__u16)skb->vlan_proto);
	}
	return classify_skb(skb, skb->len, et, off, tags, tpid0, cfg);
}

// AF_XDP kernel steering: the same owner as fp_steer, then the frame goes to
// that worker's socket on the queue it arrived on (fp_xsks[(queue - xsk_queue0)
// * xsk_workers + owner]: every worker has a socket on every queue, sharing its
// UMEM, since an XSK receives only from the queue it is bound to). A queue the
// port does not hold, or a slot without a socket, passes the frame to the stack,
// as libxdp's default program does.
SEC("xdp")
int fp_xdp_steer(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct fp_cfg *cfg = bpf_map_lookup_elem(&fp_cfg, &zero);
	if (!cfg || !cfg->xsk_workers)
		return XDP_PASS;
	__u32 q = ctx->rx_queue_index - cfg->xsk_queue0;
	if (q >= cfg->xsk_queues)
		return XDP_PASS;
	__u16 et = 0;
	// A frame shorter than an Ethernet header leaves et 0: unclassified.
	ld16_xdp(ctx, 12, &et);
	__u32 o = classify_xdp(ctx, bpf_xdp_get_buff_len(ctx), et, 14, 0, 0, cfg);
	return bpf_redirect_map(&fp_xsks, q * cfg->xsk_workers + o, XDP_PASS);
}
// No GPL-only helper is used: the workspace licence applies.
char LICENSE[] SEC("license") = "Apache-2.0";

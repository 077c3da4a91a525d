/*
 * Plain-function shim over libxdp's AF_XDP sockets for flowplane-io.
 *
 * The ring accessors in <xdp/xsk.h> are static inline functions, which
 * Rust cannot call: each function here does one whole burst (fill, receive,
 * transmit, completions) so the cost is one call per batch, never one per
 * packet. Socket and UMEM set-up and teardown go through libxdp, which loads
 * its default XDP redirect program on the first RX socket of an interface
 * and removes it when the last one is deleted.
 */
#include <errno.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <xdp/xsk.h>
#include <xdp/libxdp.h>
#include <bpf/libbpf.h>

/* libbpf and libxdp narrate program loading on stderr; flowplane reports failures itself. */
static int quiet_bpf(enum libbpf_print_level l, const char *f, va_list a) { (void)l; (void)f; (void)a; return 0; }
static int quiet_xdp(enum libxdp_print_level l, const char *f, va_list a) { (void)l; (void)f; (void)a; return 0; }

struct fp_xsk {
	struct xsk_umem *umem;
	struct xsk_socket *xsk;
	struct xsk_ring_prod fill;
	struct xsk_ring_cons comp;
	struct xsk_ring_cons rx;
	struct xsk_ring_prod tx;
	int has_rx, has_tx;
	int zerocopy;
	int shared; /* the UMEM is another socket's (closed with that one) */
};

/*
 * Opens an AF_XDP socket on ifname/queue with `area` (size bytes, page
 * aligned, frames of frame_size) as its UMEM. rx/tx: whether it receives
 * (loads the default redirect program) and/or transmits. Tries native XDP
 * with zero copy first, then generic XDP in copy mode (veth, any driver).
 * Returns 0 or a negative errno; *mode is 1 for zero copy, 0 for copy.
 */
int fp_xsk_open(const char *ifname, uint32_t queue, void *area, uint64_t size, uint32_t frame_size,
		uint32_t ring, int rx, int tx, int *mode, struct fp_xsk **out)
{
	libbpf_set_print(quiet_bpf);
	libxdp_set_print(quiet_xdp);
	struct fp_xsk *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	struct xsk_umem_config uc = {
		.fill_size = ring, .comp_size = ring, .frame_size = frame_size, .frame_headroom = 0, .flags = 0,
	};
	int r = xsk_umem__create(&x->umem, area, size, &x->fill, &x->comp, &uc);
	if (r) {
		free(x);
		return r < 0 ? r : -r;
	}
	const uint32_t xdp_modes[2] = { XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE };
	const uint16_t bind_modes[2] = { XDP_ZEROCOPY, XDP_COPY };
	for (int i = 0; i < 2; i++) {
		struct xsk_socket_config sc = {
			.rx_size = rx ? ring : 0,
			.tx_size = tx ? ring : 0,
			.libxdp_flags = rx ? 0 : XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD,
			.xdp_flags = xdp_modes[i] | XDP_FLAGS_UPDATE_IF_NOEXIST,
			.bind_flags = bind_modes[i] | XDP_USE_NEED_WAKEUP,
		};
		r = xsk_socket__create(&x->xsk, ifname, queue, x->umem, rx ? &x->rx : NULL, tx ? &x->tx : NULL, &sc);
		/* After a failed zero-copy attempt the kernel releases that socket's hold on the
		 * queue in deferred work: EBUSY until it has run (long under a real-time priority,
		 * whose threads keep the kernel's workers off the CPUs). Wait for it, 1 s at most. */
		for (int t = 0; i == 1 && r == -EBUSY && t < 100; t++) {
			usleep(10000);
			r = xsk_socket__create(&x->xsk, ifname, queue, x->umem, rx ? &x->rx : NULL, tx ? &x->tx : NULL, &sc);
		}
		if (!r) {
			x->zerocopy = i == 0;
			break;
		}
	}
	if (r) {
		xsk_umem__delete(x->umem);
		free(x);
		return r < 0 ? r : -r;
	}
	x->has_rx = rx;
	x->has_tx = tx;
	*mode = x->zerocopy;
	*out = x;
	return 0;
}

/*
 * A receive socket for kernel steering (flowplane's fp_xdp_steer redirects to
 * it; no program is loaded here). With `first`, the socket shares first's UMEM
 * (XDP_SHARED_UMEM) with fill and completion rings of its own: a worker has one
 * socket per queue of the port, all receiving into its pool. Without, `area`
 * becomes a new UMEM. Zero copy tried first, then copy. Returns 0 or -errno.
 */
int fp_xsk_open_steered(const char *ifname, uint32_t queue, void *area, uint64_t size, uint32_t frame_size,
			uint32_t ring, struct fp_xsk *first, int *mode, struct fp_xsk **out)
{
	libbpf_set_print(quiet_bpf);
	libxdp_set_print(quiet_xdp);
	struct fp_xsk *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	int r = 0;
	if (first) {
		x->umem = first->umem;
		x->shared = 1;
	} else {
		struct xsk_umem_config uc = {
			.fill_size = ring, .comp_size = ring, .frame_size = frame_size, .frame_headroom = 0, .flags = 0,
		};
		r = xsk_umem__create(&x->umem, area, size, &x->fill, &x->comp, &uc);
		if (r) {
			free(x);
			return r < 0 ? r : -r;
		}
	}
	const uint16_t bind_modes[2] = { XDP_ZEROCOPY, XDP_COPY };
	for (int i = 0; i < 2; i++) {
		struct xsk_socket_config sc = {
			.rx_size = ring,
			.tx_size = 0,
			.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD,
			.xdp_flags = 0,
			.bind_flags = bind_modes[i] | XDP_USE_NEED_WAKEUP,
		};
		for (int t = 0; t < (i == 1 ? 100 : 1); t++) {
			if (first)
				r = xsk_socket__create_shared(&x->xsk, ifname, queue, x->umem, &x->rx, NULL, &x->fill,
							      &x->comp, &sc);
			else
				r = xsk_socket__create(&x->xsk, ifname, queue, x->umem, &x->rx, NULL, &sc);
			/* A failed zero-copy bind releases the queue in deferred work (see fp_xsk_open). */
			if (r != -EBUSY)
				break;
			usleep(10000);
		}
		if (!r) {
			x->zerocopy = i == 0;
			break;
		}
	}
	if (r) {
		if (!x->shared)
			xsk_umem__delete(x->umem);
		free(x);
		return r < 0 ? r : -r;
	}
	x->has_rx = 1;
	*mode = x->zerocopy;
	*out = x;
	return 0;
}

/* The socket's descriptor (what an XSKMAP entry holds). */
int fp_xsk_fd(struct fp_xsk *x)
{
	return xsk_socket__fd(x->xsk);
}

/*
 * Attaches program `prog_fd` to ifindex as its only XDP program: native mode
 * first, then generic. Fails (-EBUSY) where a program is attached already.
 * Returns 0 or -errno; *native is 1 for native mode.
 */
int fp_xdp_attach(int ifindex, int prog_fd, int *native)
{
	libbpf_set_print(quiet_bpf);
	int r = bpf_xdp_attach(ifindex, prog_fd, XDP_FLAGS_DRV_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
	*native = r == 0;
	if (r)
		r = bpf_xdp_attach(ifindex, prog_fd, XDP_FLAGS_SKB_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
	return r < 0 ? r : -r;
}

/* Deletes the socket (libxdp detaches its program with the last socket), then the UMEM unless shared. */
void fp_xsk_close(struct fp_xsk *x)
{
	if (!x)
		return;
	xsk_socket__delete(x->xsk);
	if (!x->shared)
		xsk_umem__delete(x->umem);
	free(x);
}

/* Puts up to n buffer addresses on the fill ring; returns how many. */
uint32_t fp_xsk_fill(struct fp_xsk *x, const uint64_t *addr, uint32_t n)
{
	uint32_t idx = 0;
	uint32_t got = xsk_ring_prod__reserve(&x->fill, n, &idx);
	for (uint32_t i = 0; i < got; i++)
		*xsk_ring_prod__fill_addr(&x->fill, idx + i) = addr[i];
	if (got)
		xsk_ring_prod__submit(&x->fill, got);
	return got;
}

/* True if the kernel asks for a wake-up to refill (one recvfrom then). */
void fp_xsk_rx_wakeup(struct fp_xsk *x)
{
	if (xsk_ring_prod__needs_wakeup(&x->fill))
		recvfrom(xsk_socket__fd(x->xsk), NULL, 0, MSG_DONTWAIT, NULL, NULL);
}

/* Takes up to max received descriptors: addresses and lengths. */
uint32_t fp_xsk_rx(struct fp_xsk *x, uint64_t *addr, uint32_t *len, uint32_t max)
{
	uint32_t idx = 0;
	uint32_t got = xsk_ring_cons__peek(&x->rx, max, &idx);
	for (uint32_t i = 0; i < got; i++) {
		const struct xdp_desc *d = xsk_ring_cons__rx_desc(&x->rx, idx + i);
		addr[i] = xsk_umem__add_offset_to_addr(d->addr);
		len[i] = d->len;
	}
	if (got)
		xsk_ring_cons__release(&x->rx, got);
	return got;
}

/* Queues up to n frames for transmit and kicks the kernel; returns how many were queued. */
uint32_t fp_xsk_tx(struct fp_xsk *x, const uint64_t *addr, const uint32_t *len, uint32_t n)
{
	uint32_t idx = 0;
	uint32_t got = xsk_ring_prod__reserve(&x->tx, n, &idx);
	for (uint32_t i = 0; i < got; i++) {
		struct xdp_desc *d = xsk_ring_prod__tx_desc(&x->tx, idx + i);
		d->addr = addr[i];
		d->len = len[i];
		d->options = 0;
	}
	if (got) {
		xsk_ring_prod__submit(&x->tx, got);
		/* Copy mode sends at most 32 descriptors per kick (the kernel's TX batch): kick per 32. */
		if (!x->zerocopy) {
			for (uint32_t k = 0; k < got; k += 32)
				if (sendto(xsk_socket__fd(x->xsk), NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN &&
				    errno != EBUSY)
					break;
		} else if (xsk_ring_prod__needs_wakeup(&x->tx)) {
			sendto(xsk_socket__fd(x->xsk), NULL, 0, MSG_DONTWAIT, NULL, 0);
		}
	}
	return got;
}

/* Takes up to max completed transmit addresses. */
uint32_t fp_xsk_complete(struct fp_xsk *x, uint64_t *addr, uint32_t max)
{
	uint32_t idx = 0;
	uint32_t got = xsk_ring_cons__peek(&x->comp, max, &idx);
	for (uint32_t i = 0; i < got; i++)
		addr[i] = *xsk_ring_cons__comp_addr(&x->comp, idx + i);
	if (got)
		xsk_ring_cons__release(&x->comp, got);
	return got;
}

/* The kernel's drop counters: RX dropped (no fill buffer or ring full) and invalid TX descriptors. */
int fp_xsk_stats(struct fp_xsk *x, uint64_t *rx_dropped, uint64_t *rx_ring_full, uint64_t *fill_empty)
{
	struct xdp_statistics st;
	socklen_t l = sizeof(st);
	memset(&st, 0, sizeof(st));
	if (getsockopt(xsk_socket__fd(x->xsk), SOL_XDP, XDP_STATISTICS, &st, &l))
		return -errno;
	*rx_dropped = st.rx_dropped;
	*rx_ring_full = st.rx_ring_full;
	*fill_empty = st.rx_fill_ring_empty_descs;
	return 0;
}

/*
 * The XDP program named `name` on ifindex: attached alone (legacy) or as one
 * of libxdp's dispatcher's programs. Returns its id, 0 if there is none.
 */
uint32_t fp_xdp_find(int ifindex, const char *name)
{
	libxdp_set_print(quiet_xdp);
	struct xdp_multiprog *mp = xdp_multiprog__get_from_ifindex(ifindex);
	if (!mp || libxdp_get_error(mp))
		return 0;
	uint32_t id = 0;
	if (xdp_multiprog__is_legacy(mp)) {
		struct xdp_program *p = xdp_multiprog__main_prog(mp);
		if (p && !strcmp(xdp_program__name(p), name))
			id = xdp_program__id(p);
	} else {
		for (struct xdp_program *p = xdp_multiprog__next_prog(NULL, mp); p; p = xdp_multiprog__next_prog(p, mp))
			if (!strcmp(xdp_program__name(p), name)) {
				id = xdp_program__id(p);
				break;
			}
	}
	xdp_multiprog__close(mp);
	return id;
}

/*
 * Detaches the XDP program of id `id` from ifindex, and only it: alone, the
 * attachment is removed; in libxdp's dispatcher, that one program (the
 * dispatcher goes with its last). Returns 1 if detached, 0 if no such
 * program is attached, or a negative errno.
 */
int fp_xdp_detach(int ifindex, uint32_t id)
{
	libxdp_set_print(quiet_xdp);
	struct xdp_multiprog *mp = xdp_multiprog__get_from_ifindex(ifindex);
	if (!mp || libxdp_get_error(mp))
		return 0;
	int r = 0;
	if (xdp_multiprog__is_legacy(mp)) {
		struct xdp_program *p = xdp_multiprog__main_prog(mp);
		if (p && xdp_program__id(p) == id)
			r = xdp_multiprog__detach(mp) ? -EBUSY : 1;
	} else {
		for (struct xdp_program *p = xdp_multiprog__next_prog(NULL, mp); p; p = xdp_multiprog__next_prog(p, mp))
			if (xdp_program__id(p) == id) {
				int e = xdp_program__detach(p, ifindex, xdp_multiprog__attach_mode(mp), 0);
				r = e ? (e < 0 ? e : -e) : 1;
				break;
			}
	}
	xdp_multiprog__close(mp);
	return r;
}

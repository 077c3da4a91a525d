/*
 * Plain-function shim over DPDK ethdev for flowplane-io's `dpdk` feature.
 *
 * rte_eth_rx_burst/tx_burst and the mbuf helpers are static inline in
 * DPDK's headers: each function here does one whole burst, so the cost is
 * one call per batch. Received mbufs are handed to Rust as (buffer index,
 * data offset, length) within their mempool's contiguous object region;
 * flowplane processes the packet bytes in place and gives the same mbufs
 * back to tx_burst (or to the mempool when dropped).
 */
#define _GNU_SOURCE
#include <rte_config.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_malloc.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>

/* Starts the EAL (the caller's CPU affinity is restored afterwards). Returns 0 or a negative errno. */
int fp_dpdk_init(int argc, char **argv)
{
	cpu_set_t saved;
	int have_saved = pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
	int ret = rte_eal_init(argc, argv);
	int err = rte_errno;
	if (have_saved)
		pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
	if (ret < 0)
		return err > 0 ? -err : -EINVAL;
	return 0;
}

/* Finds a port by device name, probing `devargs` (a vdev such as net_null0) if it is not there yet. */
int fp_dpdk_port(const char *name, const char *devargs, uint16_t *port)
{
	if (rte_eth_dev_get_port_by_name(name, port) == 0)
		return 0;
	if (devargs && devargs[0]) {
		int r = rte_dev_probe(devargs);
		if (r < 0)
			return r;
		if (rte_eth_dev_get_port_by_name(name, port) == 0)
			return 0;
	}
	return -ENODEV;
}

/* Lets a non-EAL thread use per-lcore mempool caches. */
int fp_dpdk_thread_register(void)
{
	if (rte_lcore_id() != LCORE_ID_ANY)
		return 0;
	return rte_thread_register();
}

static void free_chunk(struct rte_mempool_memhdr *h, void *opaque)
{
	(void)h;
	rte_free(opaque);
}

/*
 * An mbuf pool laid out as ONE virtually contiguous chunk at a constant
 * stride (what flowplane's buffer indices need), for when the default layout
 * is split (no huge pages: objects kept within 4 KiB pages). IOVAs are not
 * set: enough for the virtual devices (net_null, net_ring, net_pcap,
 * net_af_packet), which never DMA; a NIC gets the default pool on huge pages.
 */
static struct rte_mempool *pool_one_chunk(const char *name, unsigned n, int socket)
{
	struct rte_mempool *mp = rte_mempool_create_empty(name, n, sizeof(struct rte_mbuf) + RTE_MBUF_DEFAULT_BUF_SIZE,
							  256, sizeof(struct rte_pktmbuf_pool_private), socket,
							  RTE_MEMPOOL_F_NO_IOVA_CONTIG);
	if (!mp)
		return NULL;
	if (rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), NULL))
		goto fail;
	struct rte_pktmbuf_pool_private pp;
	memset(&pp, 0, sizeof(pp));
	pp.mbuf_data_room_size = RTE_MBUF_DEFAULT_BUF_SIZE;
	pp.mbuf_priv_size = 0;
	rte_pktmbuf_pool_init(mp, &pp);
	size_t sz = (size_t)(mp->header_size + mp->elt_size + mp->trailer_size) * n + 4096;
	char *mem = rte_malloc_socket("fp_mbufs", sz, 4096, socket);
	if (!mem)
		goto fail;
	int r = rte_mempool_populate_iova(mp, mem, RTE_BAD_IOVA, sz, free_chunk, mem);
	if (r < (int)n) {
		if (r <= 0)
			rte_free(mem);
		goto fail;
	}
	rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
	return mp;
fail:
	rte_mempool_free(mp);
	return NULL;
}

struct region {
	uintptr_t min, max;
	uint32_t n;
};

static void obj_cb(struct rte_mempool *mp, void *arg, void *obj, unsigned idx)
{
	(void)mp;
	(void)idx;
	struct region *r = arg;
	uintptr_t a = (uintptr_t)obj;
	if (r->n == 0 || a < r->min)
		r->min = a;
	if (r->n == 0 || a > r->max)
		r->max = a;
	r->n++;
}

/* True if mp's objects form one region at a constant stride (reg: first object, count). */
static int one_region(struct rte_mempool *mp, struct region *reg)
{
	memset(reg, 0, sizeof(*reg));
	rte_mempool_obj_iter(mp, obj_cb, reg);
	uint32_t st = mp->header_size + mp->elt_size + mp->trailer_size;
	return mp->nb_mem_chunks == 1 && reg->n == mp->size && (reg->max - reg->min) == (uintptr_t)st * (reg->n - 1);
}

/*
 * Configures `port` with nq RX and TX queues (RSS over IP/TCP/UDP when nq > 1),
 * one mbuf pool of `mbufs` per queue, and starts it. For each queue, the pool's
 * objects must form one region at a constant stride: base[q] is the first mbuf,
 * stride[q] the object stride, count[q] the objects, floor[q] the offset of the
 * data buffer from its mbuf. Returns 0 or a negative errno (-E2BIG: a pool is
 * not contiguous).
 */
int fp_dpdk_setup(uint16_t port, uint16_t nq, uint32_t mbufs, uint16_t desc, struct rte_mempool **pools,
		  uintptr_t *base, uint32_t *stride, uint32_t *count, uint32_t *floor)
{
	struct rte_eth_dev_info info;
	int r = rte_eth_dev_info_get(port, &info);
	if (r)
		return r;
	if (nq > info.max_rx_queues || nq > info.max_tx_queues)
		return -ERANGE;
	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	if (nq > 1 && info.flow_type_rss_offloads) {
		conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
		conf.rx_adv_conf.rss_conf.rss_hf =
			(RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
	}
	r = rte_eth_dev_configure(port, nq, nq, &conf);
	if (r)
		return r;
	int socket = rte_eth_dev_socket_id(port);
	if (socket < 0)
		socket = SOCKET_ID_ANY;
	for (uint16_t q = 0; q < nq; q++) {
		char name[RTE_MEMPOOL_NAMESIZE];
		snprintf(name, sizeof(name), "fp_p%u_q%u", port, q);
		struct rte_mempool *mp = rte_pktmbuf_pool_create(name, mbufs, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, socket);
		struct region reg;
		if (mp && !one_region(mp, &reg)) {
			rte_mempool_free(mp);
			mp = pool_one_chunk(name, mbufs, socket);
			if (mp && !one_region(mp, &reg)) {
				rte_mempool_free(mp);
				return -E2BIG;
			}
		}
		if (!mp)
			return rte_errno > 0 ? -rte_errno : -ENOMEM;
		uint32_t st = mp->header_size + mp->elt_size + mp->trailer_size;
		struct rte_mbuf *m0 = (struct rte_mbuf *)reg.min;
		pools[q] = mp;
		base[q] = reg.min;
		stride[q] = st;
		count[q] = reg.n;
		floor[q] = (uint32_t)((uintptr_t)m0->buf_addr - reg.min);
		r = rte_eth_rx_queue_setup(port, q, desc, socket, NULL, mp);
		if (r)
			return r;
		r = rte_eth_tx_queue_setup(port, q, desc, socket, NULL);
		if (r)
			return r;
	}
	r = rte_eth_dev_start(port);
	if (r)
		return r;
	rte_eth_promiscuous_enable(port);
	return 0;
}

/*
 * n / stride without a divide: `magic` is ceil(2^64 / stride), exact for
 * n < 2^64 / stride (any region: the caller checks its size). A 64-bit
 * divide per packet on each side was a measurable share of a forward's cost.
 */
static inline uint64_t div_stride(uint64_t n, uint64_t magic)
{
	return (uint64_t)(((unsigned __int128)n * magic) >> 64);
}

/*
 * Receives up to max packets: per packet its buffer index in the pool region
 * at `base` (`count` objects of stride bytes; magic: see div_stride), the data
 * offset from the buffer start, the length and the RSS hash (0 if none).
 * Multi-segment packets and mbufs from outside the region are freed and
 * counted in *dropped.
 */
uint16_t fp_dpdk_rx(uint16_t port, uint16_t q, uintptr_t base, uint32_t stride, uint64_t magic, uint32_t count,
		    uint32_t *idx, uint16_t *off, uint16_t *len, uint32_t *hash, uint16_t max, uint32_t *dropped)
{
	struct rte_mbuf *m[256];
	if (max > 256)
		max = 256;
	uint16_t n = rte_eth_rx_burst(port, q, m, max);
	uint16_t k = 0;
	uint64_t span = (uint64_t)count * stride;
	for (uint16_t i = 0; i < n; i++) {
		struct rte_mbuf *mb = m[i];
		/* Unsigned: an mbuf below base wraps past span. */
		uint64_t at = (uintptr_t)mb - base;
		if (unlikely(mb->nb_segs != 1 || at >= span)) {
			rte_pktmbuf_free(mb);
			(*dropped)++;
			continue;
		}
		idx[k] = (uint32_t)div_stride(at, magic);
		off[k] = (uint16_t)(rte_pktmbuf_mtod(mb, uintptr_t) - (uintptr_t)mb);
		len[k] = mb->data_len;
		hash[k] = (mb->ol_flags & RTE_MBUF_F_RX_RSS_HASH) ? mb->hash.rss : 0;
		k++;
	}
	return k;
}

/*
 * Transmits n packets in place: buffer idx[i] of the region at `base` (an
 * mbuf every `stride` bytes) holds the packet at off[i] from the mbuf's
 * start, len[i] bytes. What the queue does not take goes back to the
 * mempool. Returns how many were sent.
 */
uint16_t fp_dpdk_tx(uint16_t port, uint16_t q, uintptr_t base, uint32_t stride, const uint32_t *idx,
		    const uint16_t *off, const uint16_t *len, uint16_t n)
{
	struct rte_mbuf *m[256];
	if (n > 256)
		n = 256;
	for (uint16_t i = 0; i < n; i++) {
		struct rte_mbuf *mb = (struct rte_mbuf *)(base + (uintptr_t)idx[i] * stride);
		mb->data_off = (uint16_t)((uintptr_t)mb + off[i] - (uintptr_t)mb->buf_addr);
		mb->data_len = len[i];
		mb->pkt_len = len[i];
		m[i] = mb;
	}
	uint16_t sent = rte_eth_tx_burst(port, q, m, n);
	if (sent < n)
		rte_pktmbuf_free_bulk(m + sent, n - sent);
	return sent;
}

/* Copies n packets into fresh mbufs of `mp` and transmits them (a pool that is not DPDK's). */
uint16_t fp_dpdk_tx_copy(uint16_t port, uint16_t q, struct rte_mempool *mp, const uint8_t *const *data,
			 const uint16_t *len, uint16_t n, uint32_t *nombuf)
{
	struct rte_mbuf *m[256];
	if (n > 256)
		n = 256;
	if (rte_pktmbuf_alloc_bulk(mp, m, n)) {
		*nombuf += n;
		return 0;
	}
	for (uint16_t i = 0; i < n; i++) {
		char *d = rte_pktmbuf_append(m[i], len[i]);
		if (d)
			memcpy(d, data[i], len[i]);
	}
	uint16_t sent = rte_eth_tx_burst(port, q, m, n);
	if (sent < n)
		rte_pktmbuf_free_bulk(m + sent, n - sent);
	return sent;
}

/* Gives n free buffers (by index in the region) back to their mempool. */
void fp_dpdk_put(uintptr_t base, uint32_t stride, const uint32_t *idx, uint32_t n)
{
	struct rte_mbuf *m[256];
	while (n) {
		uint32_t k = n > 256 ? 256 : n;
		for (uint32_t i = 0; i < k; i++)
			m[i] = (struct rte_mbuf *)(base + (uintptr_t)idx[i] * stride);
		rte_pktmbuf_free_bulk(m, k);
		idx += k;
		n -= k;
	}
}

/* A TX mempool for the copy path. */
struct rte_mempool *fp_dpdk_tx_pool(uint16_t port, uint16_t q, uint32_t mbufs)
{
	char name[RTE_MEMPOOL_NAMESIZE];
	snprintf(name, sizeof(name), "fp_tx_p%u_q%u", port, q);
	struct rte_mempool *mp = rte_mempool_lookup(name);
	if (mp)
		return mp;
	return rte_pktmbuf_pool_create(name, mbufs, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
}

/* The port's drop counters: missed (RX ring full), no mbuf, TX errors. */
int fp_dpdk_stats(uint16_t port, uint64_t *imissed, uint64_t *rx_nombuf, uint64_t *oerrors)
{
	struct rte_eth_stats st;
	int r = rte_eth_stats_get(port, &st);
	if (r)
		return r;
	*imissed = st.imissed;
	*rx_nombuf = st.rx_nombuf;
	*oerrors = st.oerrors;
	return 0;
}

/* Stops and closes the port. */
void fp_dpdk_close(uint16_t port)
{
	rte_eth_dev_stop(port);
	rte_eth_dev_close(port);
}

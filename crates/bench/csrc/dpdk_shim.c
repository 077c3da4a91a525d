/*
 * Plain-function shim over DPDK for flowplane-bench's `dpdk` feature.
 *
 * Only what Rust cannot reach by FFI lives here: EAL start-up (with the
 * caller's CPU affinity restored, because rte_eal_init pins the calling
 * thread to the main lcore and later threads would inherit that) and hash
 * creation with `rte_hash_crc`, which is a static inline function in
 * rte_hash_crc.h. Lookups, insertions and deletions are exported library
 * functions called directly from Rust, so the shim adds no cost to them.
 */
#define _GNU_SOURCE
#include <rte_config.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_hash.h>
#include <rte_hash_crc.h>

/* Starts the EAL. Returns 0 or a negative errno. */
int fp_dpdk_eal_init(int argc, char **argv)
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

/*
 * Creates a single-writer rte_hash of `entries` keys of `key_len` bytes,
 * hashed with CRC32C (rte_hash_crc), on `socket_id`. NULL on failure, with
 * the negative errno in *err.
 */
struct rte_hash *fp_dpdk_hash_create(const char *name, uint32_t entries, uint32_t key_len, int socket_id, int *err)
{
	struct rte_hash_parameters p;
	memset(&p, 0, sizeof(p));
	p.name = name;
	p.entries = entries;
	p.key_len = key_len;
	p.hash_func = rte_hash_crc;
	p.hash_func_init_val = 0;
	p.socket_id = socket_id;
	p.extra_flag = 0;
	struct rte_hash *h = rte_hash_create(&p);
	*err = h == NULL ? -(rte_errno > 0 ? rte_errno : ENOMEM) : 0;
	return h;
}

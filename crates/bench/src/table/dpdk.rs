//! DPDK `rte_hash` baseline for `flowplane bench table` (cargo feature `dpdk`).
//!
//! This module owns the FFI to Debian's DPDK 22.11 hash library and its
//! measurement on the benchmark's keys: [`DpdkHash`] is a safe single-owner
//! wrapper over an `rte_hash` with 16-byte keys (the [`BenchKey`] layout) hashed
//! with CRC32C, and [`run_dpdk`] produces `rte_hash` rows for lookup-hit
//! (batch 1 through `rte_hash_lookup_with_hash_data`, larger batches through
//! `rte_hash_lookup_bulk_data`), lookup-miss, insertion and deletion.
//!
//! The EAL starts once per process with `--no-pci --in-memory` on 2 MiB
//! hugepages when at least 1 GiB of them is reserved and free (DPDK's normal
//! setup, and the same TLB reach flowplane's tables get), otherwise with
//! `--no-huge --no-pci --no-shconf`: then DPDK's heap is a memfd of 4 KiB
//! pages that transparent hugepages cannot back, and DRAM-resident lookups pay
//! TLB misses. The rows record which in their `hugepages` extra.
//!
//! Creation and EAL start-up go through the C shim in `csrc/dpdk_shim.c`;
//! every per-operation call is a direct call into librte_hash.

use super::ceiling::{prefetch_read, LineBuf};
use super::{BenchKey, BenchRow, TableBenchOptions, Workload, KEY_SEED};
use crate::tsc::rdtsc;
use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Largest batch `rte_hash_lookup_bulk_data` accepts (`RTE_HASH_LOOKUP_BULK_MAX`).
pub const BULK_MAX: usize = 64;
/// Largest table measured: DPDK's memory is capped by `-m` without hugepages.
pub const MAX_ENTRIES: usize = 1 << 24;
/// Megabytes given to the EAL (`-m`) without hugepages: enough for a
/// 16M-entry table (~0.9 GiB); untouched memory costs nothing.
const EAL_MEM_MB: u32 = 3072;
/// Free hugepages needed to run the EAL on them (a 4M-entry table takes ~250 MiB).
const HUGE_MIN_BYTES: u64 = 1 << 30;
/// Implementation name in the rows (a baseline of `fill_ratios`).
const NAME: &str = "rte_hash";
/// `BenchKey` is 16 bytes with no padding; the table is created with this key length.
const KEY_LEN: u32 = 16;
const _: () = assert!(std::mem::size_of::<BenchKey>() == KEY_LEN as usize);

/// Opaque `struct rte_hash`.
#[repr(C)]
struct RteHash {
    _private: [u8; 0],
}

extern "C" {
    fn fp_dpdk_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn fp_dpdk_hash_create(
        name: *const c_char,
        entries: u32,
        key_len: u32,
        socket_id: c_int,
        err: *mut c_int,
    ) -> *mut RteHash;
    fn rte_hash_free(h: *mut RteHash);
    fn rte_hash_count(h: *const RteHash) -> i32;
    fn rte_hash_hash(h: *const RteHash, key: *const c_void) -> u32;
    fn rte_hash_add_key_with_hash_data(h: *const RteHash, key: *const c_void, sig: u32, data: *mut c_void) -> i32;
    fn rte_hash_del_key_with_hash(h: *const RteHash, key: *const c_void, sig: u32) -> i32;
    fn rte_hash_lookup_with_hash_data(h: *const RteHash, key: *const c_void, sig: u32, data: *mut *mut c_void)
        -> c_int;
    fn rte_hash_lookup_bulk_data(
        h: *const RteHash,
        keys: *const *const c_void,
        num_keys: u32,
        hit_mask: *mut u64,
        data: *mut *mut c_void,
    ) -> c_int;
    fn rte_hash_lookup_with_hash_bulk_data(
        h: *const RteHash,
        keys: *const *const c_void,
        sigs: *const u32,
        num_keys: u32,
        hit_mask: *mut u64,
        data: *mut *mut c_void,
    ) -> c_int;
}

/// Why DPDK could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DpdkError {
    /// `rte_eal_init` failed with this negative errno.
    EalInit(i32),
    /// `rte_hash_create` failed with this negative errno.
    Create(i32),
    /// The requested number of entries is zero or above what the bench allows.
    BadSize(usize),
    /// The table has no room for the key (`-ENOSPC`) or refused it.
    Add(i32),
}

impl fmt::Display for DpdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DpdkError::EalInit(e) => write!(f, "DPDK EAL initialisation failed (errno {})", -e),
            DpdkError::Create(e) => write!(f, "rte_hash_create failed (errno {})", -e),
            DpdkError::BadSize(n) => write!(f, "rte_hash size {n} out of range 1..={MAX_ENTRIES}"),
            DpdkError::Add(e) => write!(f, "rte_hash_add_key failed (errno {})", -e),
        }
    }
}

impl std::error::Error for DpdkError {}

/// Starts the EAL once per process (later calls return the first outcome).
/// `Ok(true)` if it runs on hugepages, `Ok(false)` for `--no-huge`.
pub fn eal_init() -> Result<bool, DpdkError> {
    static INIT: OnceLock<Result<bool, DpdkError>> = OnceLock::new();
    INIT.get_or_init(|| {
        let huge = free_hugepage_bytes() >= HUGE_MIN_BYTES;
        let mem = EAL_MEM_MB.to_string();
        let mut args = vec!["flowplane-bench", "--no-pci", "--no-telemetry", "-l", "0", "--log-level=lib.eal:error"];
        if huge {
            // Memory is taken from the hugepage pool on demand; no files.
            args.push("--in-memory");
        } else {
            // --no-huge implies legacy memory, which --in-memory refuses.
            args.extend(["--no-huge", "--no-shconf", "-m", mem.as_str()]);
        }
        // The EAL may keep pointers into argv, so the strings live for the
        // whole process (leaked once; a few dozen bytes).
        let owned: Vec<CString> = args.iter().filter_map(|a| CString::new(*a).ok()).collect();
        let mut argv: Vec<*mut c_char> = owned.into_iter().map(|c| c.into_raw()).collect();
        let argc = argv.len() as c_int;
        // SAFETY: argv holds `argc` valid NUL-terminated strings that are never
        // freed; the shim calls rte_eal_init once (guarded by this OnceLock).
        let ret = unsafe { fp_dpdk_eal_init(argc, argv.as_mut_ptr()) };
        std::mem::forget(argv);
        if ret < 0 {
            Err(DpdkError::EalInit(ret))
        } else {
            Ok(huge)
        }
    })
    .clone()
}

/// Free hugepages of the default size, in bytes (0 if /proc/meminfo says none
/// or cannot be read).
fn free_hugepage_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else { return 0 };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:").saturating_mul(field("Hugepagesize:")).saturating_mul(1024)
}

/// An `rte_hash` with [`BenchKey`] keys and `usize` values, owned by one thread
/// (rte_hash is single-writer without extra flags; the raw pointer makes this
/// type neither `Send` nor `Sync`).
pub struct DpdkHash {
    h: *mut RteHash,
}

impl DpdkHash {
    /// Creates a table with room for `entries` keys (DPDK rounds its bucket
    /// array up to a power of two), starting the EAL if needed.
    pub fn new(entries: usize) -> Result<DpdkHash, DpdkError> {
        if entries == 0 || entries > MAX_ENTRIES * 2 {
            return Err(DpdkError::BadSize(entries));
        }
        eal_init()?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // rte_hash names must be unique and shorter than RTE_HASH_NAMESIZE (32).
        let name = format!("fp_bench_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let name = CString::new(name).map_err(|_| DpdkError::Create(-22))?;
        let mut err: c_int = 0;
        // SAFETY: `name` is a valid C string for the call (rte_hash copies it);
        // `err` is a valid out-pointer; the EAL is initialised.
        let h = unsafe { fp_dpdk_hash_create(name.as_ptr(), entries as u32, KEY_LEN, 0, &mut err) };
        if h.is_null() {
            return Err(DpdkError::Create(err));
        }
        Ok(DpdkHash { h })
    }

    /// The table's own hash (CRC32C) of `key`, for the `_with_hash` calls.
    #[inline]
    pub fn signature(&self, key: &BenchKey) -> u32 {
        // SAFETY: `self.h` is a live table with 16-byte keys and `key` points
        // to 16 readable bytes.
        unsafe { rte_hash_hash(self.h, (key as *const BenchKey).cast()) }
    }

    /// Number of keys stored.
    pub fn len(&self) -> usize {
        // SAFETY: `self.h` is a live table.
        let n = unsafe { rte_hash_count(self.h) };
        usize::try_from(n).unwrap_or(0)
    }

    /// True if no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts or updates `key` -> `data`; `sig` must be [`Self::signature`] of `key`.
    #[inline]
    pub fn insert(&mut self, key: &BenchKey, sig: u32, data: usize) -> Result<(), DpdkError> {
        // SAFETY: live table, 16 readable key bytes (copied by DPDK); the data
        // pointer is an opaque word DPDK stores and never dereferences.
        let r = unsafe {
            rte_hash_add_key_with_hash_data(self.h, (key as *const BenchKey).cast(), sig, data as *mut c_void)
        };
        if r < 0 {
            Err(DpdkError::Add(r))
        } else {
            Ok(())
        }
    }

    /// Looks `key` up; `sig` must be [`Self::signature`] of `key`.
    #[inline]
    pub fn get(&self, key: &BenchKey, sig: u32) -> Option<usize> {
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: live table, 16 readable key bytes, `data` is a valid out-pointer.
        let r = unsafe { rte_hash_lookup_with_hash_data(self.h, (key as *const BenchKey).cast(), sig, &mut data) };
        (r >= 0).then_some(data as usize)
    }

    /// Removes `key`; returns whether it was present.
    #[inline]
    pub fn remove(&mut self, key: &BenchKey, sig: u32) -> bool {
        // SAFETY: live table, 16 readable key bytes.
        unsafe { rte_hash_del_key_with_hash(self.h, (key as *const BenchKey).cast(), sig) >= 0 }
    }

    /// Bulk lookup of up to [`BULK_MAX`] keys (extra keys are ignored; the
    /// table hashes them itself). Writes the value of each hit into `data[i]`
    /// and returns the hit mask (bit i = `keys[i]` found).
    #[inline]
    pub fn get_bulk(&self, keys: &[&BenchKey], data: &mut [usize; BULK_MAX]) -> u64 {
        let n = keys.len().min(BULK_MAX);
        if n == 0 {
            return 0;
        }
        let mut mask = 0u64;
        // SAFETY: `&BenchKey` has the layout of `*const c_void`, so `keys` is
        // an array of `n` valid pointers to 16-byte keys; `data` has room for
        // `n <= 64` pointer-sized values (`usize` has the layout of a pointer);
        // `mask` is a valid out-pointer.
        unsafe {
            rte_hash_lookup_bulk_data(self.h, keys.as_ptr().cast(), n as u32, &mut mask, data.as_mut_ptr().cast())
        };
        mask
    }

    /// Like [`Self::get_bulk`] with precomputed signatures (`sigs[i]` for
    /// `keys[i]`; only `min(keys.len(), sigs.len(), 64)` keys are looked up).
    #[inline]
    pub fn get_bulk_with_hash(&self, keys: &[&BenchKey], sigs: &[u32], data: &mut [usize; BULK_MAX]) -> u64 {
        let n = keys.len().min(sigs.len()).min(BULK_MAX);
        if n == 0 {
            return 0;
        }
        let mut mask = 0u64;
        // SAFETY: as in `get_bulk`, plus `sigs` holds at least `n` values.
        unsafe {
            rte_hash_lookup_with_hash_bulk_data(
                self.h,
                keys.as_ptr().cast(),
                sigs.as_ptr(),
                n as u32,
                &mut mask,
                data.as_mut_ptr().cast(),
            )
        };
        mask
    }
}

impl Drop for DpdkHash {
    fn drop(&mut self) {
        // SAFETY: `self.h` came from rte_hash_create and is freed exactly once.
        unsafe { rte_hash_free(self.h) }
    }
}

/// Measures `rte_hash` on the benchmark's [`Workload`] at every requested size
/// up to [`MAX_ENTRIES`]: `insert-fresh` (building the table), `lookup-hit`
/// and `lookup-miss` at each batch size (batch 1:
/// `rte_hash_lookup_with_hash_data` with a precomputed signature; batch > 1:
/// `rte_hash_lookup_bulk_data`, at most 64, with the precomputed-signature
/// variant as extra `with_hash_mops`), `insert`/`delete` (churn rounds) and
/// the `mixed` insertion-rate sweep. If DPDK cannot start, returns no rows and
/// says why on stderr (the benchmark continues without the baseline).
pub fn run_dpdk(opts: &TableBenchOptions) -> Vec<BenchRow> {
    match try_run(opts) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("rte_hash baseline skipped: {e}");
            Vec::new()
        }
    }
}

/// [`run_dpdk`] with an EAL failure returned instead of reported (sizes that
/// cannot be created are still skipped with a message on stderr).
pub fn try_run(opts: &TableBenchOptions) -> Result<Vec<BenchRow>, DpdkError> {
    let huge = eal_init()?;
    let mut rows = Vec::new();
    for &size in opts.sizes.iter().filter(|&&s| s > 0 && s <= MAX_ENTRIES) {
        // A size that does not fit (e.g. hugepage pool exhausted) is skipped, not fatal.
        match measure_size(opts, size, huge) {
            Ok(r) => rows.extend(r),
            Err(e) => eprintln!("rte_hash at {size} entries skipped: {e}"),
        }
    }
    Ok(rows)
}

/// All rows for one table size, on the shared [`Workload`] (the same resident
/// keys, hit stream, absent keys and churn set as the other implementations).
///
/// rte_hash stores a pointer-sized value per key; here it is the index of the
/// flow's 64-byte state line in a separate hugepage-advised array, and every
/// hit reads that line (flowplane reads its state, hashbrown its inline value),
/// prefetching the batch's states first after a bulk lookup, as a DPDK NF
/// would.
fn measure_size(opts: &TableBenchOptions, size: usize, huge: bool) -> Result<Vec<BenchRow>, DpdkError> {
    let ops = opts.ops.max(1);
    let w = Workload::new(size, ops, KEY_SEED);
    // Same headroom as a table sized for `size` flows at <= 90% load; DPDK
    // then rounds its bucket array up to a power of two.
    let mut h = DpdkHash::new(size + size / 8 + 1)?;
    let Some(mut states) = LineBuf::new(size * 64) else { return Err(DpdkError::Create(-12)) };
    let sig = |h: &DpdkHash, keys: &[BenchKey]| -> Vec<u32> { keys.iter().map(|k| h.signature(k)).collect() };
    let resident_sigs = sig(&h, &w.resident);
    let stream_sigs = sig(&h, &w.hit_stream);
    let miss_n = w.hit_stream.len().min(w.absent.len());
    let miss_sigs = sig(&h, &w.absent[..miss_n]);
    let mut rows = Vec::new();
    let tag = |mut r: BenchRow, failed: u64| {
        r.extra.push(("hugepages".to_string(), f64::from(u8::from(huge))));
        if failed > 0 {
            r.extra.push(("failed".to_string(), failed as f64));
        }
        r
    };

    // insert-fresh: build the table from empty (rte_hash has no bulk insert).
    let mut failed = 0u64;
    let t0 = rdtsc();
    for (i, (k, &s)) in w.resident.iter().zip(&resident_sigs).enumerate() {
        failed += u64::from(h.insert(k, s, i).is_err());
    }
    let t = rdtsc().wrapping_sub(t0);
    rows.push(tag(BenchRow::new(NAME, "insert-fresh", size, 1, 0, size as u64, t), failed));

    for &batch in &opts.batch_sizes {
        let batch = batch.clamp(1, BULK_MAX);
        let (t, hits) = lookups(&h, &states, &w.hit_stream, &stream_sigs, ops, batch, false);
        let mut r = BenchRow::new(NAME, "lookup-hit", size, batch, 0, ops, t);
        if batch > 1 {
            let (t2, _) = lookups(&h, &states, &w.hit_stream, &stream_sigs, ops, batch, true);
            let with_hash = BenchRow::new(NAME, "lookup-hit", size, batch, 0, ops, t2);
            r.extra.push(("with_hash_mops".to_string(), with_hash.mops));
        }
        rows.push(tag(r, ops.saturating_sub(hits)));
        let (t, hits) = lookups(&h, &states, &w.absent[..miss_n], &miss_sigs, ops, batch, false);
        let mut r = tag(BenchRow::new(NAME, "lookup-miss", size, batch, 0, ops, t), 0);
        r.extra.push(("hits".to_string(), hits as f64));
        rows.push(r);
    }

    // Delete / re-insert rounds on the churn set (steady-state churn in a full table).
    let ck: Vec<BenchKey> = w.churn.iter().map(|&i| w.resident[i as usize]).collect();
    let cs: Vec<u32> = w.churn.iter().map(|&i| resident_sigs[i as usize]).collect();
    let (mut dc, mut ic, mut n, mut failed) = (0u64, 0u64, 0u64, 0u64);
    while n < ops && !ck.is_empty() {
        let t0 = rdtsc();
        for (k, &s) in ck.iter().zip(&cs) {
            failed += u64::from(!h.remove(k, s));
        }
        let t1 = rdtsc();
        for (j, (k, &s)) in ck.iter().zip(&cs).enumerate() {
            failed += u64::from(h.insert(k, s, w.churn[j] as usize).is_err());
        }
        ic += rdtsc().wrapping_sub(t1);
        dc += t1.wrapping_sub(t0);
        n += ck.len() as u64;
    }
    rows.push(tag(BenchRow::new(NAME, "insert", size, 1, 0, n, ic), failed));
    rows.push(tag(BenchRow::new(NAME, "delete", size, 1, 0, n, dc), 0));
    drop(h);
    drop(resident_sigs);
    drop(stream_sigs);
    drop(miss_sigs);
    match sweep(opts, size, &w, &mut states) {
        Ok(r) => rows.extend(r.into_iter().map(|r| tag(r, 0))),
        Err(e) => eprintln!("rte_hash insertion-rate sweep at {size} entries skipped: {e}"),
    }
    Ok(rows)
}

/// Looks up `keys` (cycled until `ops`) in batches of `batch` and reads each
/// hit's state line. Returns (TSC cycles scaled to `ops`, hits among `ops`).
fn lookups(
    h: &DpdkHash,
    states: &LineBuf,
    keys: &[BenchKey],
    sigs: &[u32],
    ops: u64,
    batch: usize,
    with_hash: bool,
) -> (u64, u64) {
    if keys.is_empty() {
        return (0, 0);
    }
    let per_pass = (keys.len() / batch * batch).max(batch.min(keys.len())) as u64;
    let mut data = [0usize; BULK_MAX];
    let mut ptrs: [&BenchKey; BULK_MAX] = [&keys[0]; BULK_MAX];
    let (mut done, mut hits, mut sum) = (0u64, 0u64, 0u64);
    let t0 = rdtsc();
    while done < ops {
        if batch == 1 {
            for (k, &s) in keys.iter().zip(sigs) {
                if let Some(d) = h.get(k, s) {
                    hits += 1;
                    sum = sum.wrapping_add(states.word(d));
                }
            }
        } else {
            for (chunk, csigs) in keys.chunks_exact(batch).zip(sigs.chunks_exact(batch)) {
                for (p, k) in ptrs.iter_mut().zip(chunk) {
                    *p = k;
                }
                let mask = if with_hash {
                    h.get_bulk_with_hash(&ptrs[..batch], csigs, &mut data)
                } else {
                    h.get_bulk(&ptrs[..batch], &mut data)
                };
                hits += u64::from(mask.count_ones());
                let mut m = mask;
                while m != 0 {
                    prefetch_read(states.line_ptr(data[m.trailing_zeros() as usize]));
                    m &= m - 1;
                }
                let mut m = mask;
                while m != 0 {
                    sum = sum.wrapping_add(states.word(data[m.trailing_zeros() as usize]));
                    m &= m - 1;
                }
            }
        }
        done += per_pass;
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    // Scale to exactly `ops` (the last pass may overshoot), as the other implementations do.
    (t.saturating_mul(ops) / done.max(1), hits.saturating_mul(ops) / done.max(1))
}

/// PNA insertion-rate sweep on rte_hash: every `r`-th op is a new flow's
/// first packet (looked up, missed, then added with a fresh state), the others
/// hit resident flows; same op stream as the flow table's. Batches use
/// `rte_hash_lookup_with_hash_bulk_data` and add the misses one by one (rte_hash
/// has no bulk insert). Each rate's new flows are removed afterwards.
fn sweep(
    opts: &TableBenchOptions,
    size: usize,
    w: &Workload,
    states: &mut LineBuf,
) -> Result<Vec<BenchRow>, DpdkError> {
    let ops = opts.ops.max(1);
    let new_n = (ops as usize).min(w.absent.len());
    let mut h = DpdkHash::new(size + new_n + BULK_MAX)?;
    for (i, k) in w.resident.iter().enumerate() {
        let s = h.signature(k);
        h.insert(k, s, i)?;
    }
    let stream_sigs: Vec<u32> = w.hit_stream.iter().map(|k| h.signature(k)).collect();
    let absent_sigs: Vec<u32> = w.absent[..new_n].iter().map(|k| h.signature(k)).collect();
    let mut rows = Vec::new();
    let mut kb = [BenchKey::default(); BULK_MAX];
    let mut sb = [0u32; BULK_MAX];
    let mut data = [0usize; BULK_MAX];
    for &batch in &opts.batch_sizes {
        let batch = batch.clamp(1, BULK_MAX);
        for &r in &opts.insert_rates {
            let r = r.max(1);
            let (mut next_new, mut next_hit, mut done) = (0usize, 0usize, 0u64);
            let t0 = rdtsc();
            while done < ops && next_new + batch <= new_n {
                // Keys copied into a small in-cache array, the way packets arrive.
                for j in 0..batch {
                    if (done + j as u64) % r == r - 1 {
                        kb[j] = w.absent[next_new];
                        sb[j] = absent_sigs[next_new];
                        next_new += 1;
                    } else {
                        kb[j] = w.hit_stream[next_hit];
                        sb[j] = stream_sigs[next_hit];
                        next_hit = if next_hit + 1 == w.hit_stream.len() { 0 } else { next_hit + 1 };
                    }
                }
                let mask = if batch == 1 {
                    match h.get(&kb[0], sb[0]) {
                        Some(d) => {
                            data[0] = d;
                            1
                        }
                        None => 0,
                    }
                } else {
                    let ptrs: [&BenchKey; BULK_MAX] = std::array::from_fn(|j| &kb[j]);
                    h.get_bulk_with_hash(&ptrs[..batch], &sb[..batch], &mut data)
                };
                let mut m = mask;
                while m != 0 {
                    prefetch_read(states.line_ptr(data[m.trailing_zeros() as usize]));
                    m &= m - 1;
                }
                for j in 0..batch {
                    if mask & (1 << j) != 0 {
                        // Hit: update the flow's state in place.
                        states.add_to_word(data[j], 1);
                    } else {
                        // Miss: add-on-miss with a fresh state (state lines are
                        // reused modulo the array: the cost of touching one is what counts).
                        let id = size + done as usize + j;
                        if h.insert(&kb[j], sb[j], id).is_ok() {
                            states.add_to_word(id, 1);
                        }
                    }
                }
                done += batch as u64;
            }
            let c = rdtsc().wrapping_sub(t0);
            rows.push(BenchRow::new(NAME, "mixed", size, batch, r, done, c));
            for (k, &s) in w.absent[..next_new].iter().zip(&absent_sigs) {
                h.remove(k, s);
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::make_keys;
    use super::*;

    #[test]
    fn hash_insert_lookup_remove_agree() {
        let mut h = DpdkHash::new(1024).expect("rte_hash");
        let (keys, _) = make_keys(1000, 3);
        for (i, k) in keys.iter().enumerate() {
            h.insert(k, h.signature(k), i).expect("room");
        }
        assert_eq!(h.len(), 1000);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(h.get(k, h.signature(k)), Some(i));
        }
        let refs: Vec<&BenchKey> = keys[..64].iter().collect();
        let sigs: Vec<u32> = refs.iter().map(|k| h.signature(k)).collect();
        let mut data = [0usize; BULK_MAX];
        assert_eq!(h.get_bulk(&refs, &mut data), u64::MAX);
        assert_eq!(data[17], 17);
        let mut data2 = [0usize; BULK_MAX];
        assert_eq!(h.get_bulk_with_hash(&refs, &sigs, &mut data2), u64::MAX);
        assert_eq!(data, data2);
        assert!(h.remove(&keys[5], h.signature(&keys[5])));
        assert!(!h.remove(&keys[5], h.signature(&keys[5])));
        assert_eq!(h.get(&keys[5], h.signature(&keys[5])), None);
        assert_eq!(h.get_bulk(&refs[..8], &mut data), 0xFF & !(1 << 5));
        assert_eq!(h.len(), 999);
        assert_eq!(h.get_bulk(&[], &mut data), 0);
    }

    /// Decisive when run alone (then this thread is the one starting the EAL):
    /// `cargo test -p flowplane-bench --features dpdk eal_start_keeps`.
    #[test]
    fn eal_start_keeps_this_threads_cpu_affinity() {
        let cpus = || {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; the call writes at most its size.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
            let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
            assert_eq!(r, 0);
            // SAFETY: `set` was filled by the kernel.
            unsafe { libc::CPU_COUNT(&set) }
        };
        let before = cpus();
        eal_init().expect("EAL starts here");
        assert_eq!(cpus(), before);
    }

    /// Prints the rte_hash figures of the report (1M and 4M entries); run with
    /// `cargo test --release -p flowplane-bench --features dpdk -- --ignored --nocapture rte_hash_figures`.
    #[test]
    #[ignore = "takes ~1 min and several GiB; a measurement, not a check"]
    fn rte_hash_figures() {
        let opts = TableBenchOptions {
            sizes: vec![1 << 20, 1 << 22],
            batch_sizes: vec![1, 32, 64],
            ops: 4_000_000,
            ..TableBenchOptions::default()
        };
        // Ceilings over 256 MiB (about a 4M-entry table's footprint), same process.
        let mut rows = super::super::ceiling::measure_with(256 << 20, false).rows();
        rows.extend(try_run(&opts).expect("DPDK runs here"));
        super::super::fill_ceiling_fracs(&mut rows);
        print!("{}", super::super::format_text(&rows));
        // Ceilings: 3; per size: insert-fresh, 3 x (hit, miss), insert, delete, 3 x 6 mixed.
        assert_eq!(rows.len(), 3 + 2 * (1 + 6 + 2 + 18));
        assert!(rows.iter().all(|r| r.cycles_per_op > 0.0 && !r.extra.iter().any(|(n, _)| n == "failed")));
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert_eq!(DpdkHash::new(0).err(), Some(DpdkError::BadSize(0)));
        assert!(DpdkHash::new(usize::MAX).is_err());
    }

    #[test]
    fn quick_run_produces_rows_with_all_hits() {
        let opts = TableBenchOptions { sizes: vec![1 << 10, 1 << 14], ops: 50_000, ..TableBenchOptions::quick() };
        let rows = try_run(&opts).expect("DPDK runs here");
        let failed = |r: &BenchRow| r.extra.iter().any(|(n, _)| n == "failed");
        for size in [1 << 10, 1 << 14] {
            for batch in &opts.batch_sizes {
                let find = |op: &str| {
                    rows.iter().find(|r| r.op == op && r.size == size && r.batch == *batch).expect("row present")
                };
                let hit = find("lookup-hit");
                assert!(hit.mops > 0.0 && hit.cycles_per_op > 0.0 && !failed(hit), "{hit:?}");
                let miss = find("lookup-miss");
                assert_eq!(miss.extra.iter().find(|(n, _)| n == "hits").map(|e| e.1), Some(0.0), "{miss:?}");
                let mixed: Vec<_> =
                    rows.iter().filter(|r| r.op == "mixed" && r.size == size && r.batch == *batch).collect();
                assert_eq!(mixed.len(), opts.insert_rates.len());
                assert!(mixed.iter().all(|r| r.mops > 0.0));
            }
            for op in ["insert-fresh", "insert", "delete"] {
                let r = rows.iter().find(|r| r.op == op && r.size == size).expect("row present");
                assert!(r.mops > 0.0 && !failed(r), "{r:?}");
            }
        }
        assert!(rows.iter().all(|r| r.impl_name == NAME));
    }
}

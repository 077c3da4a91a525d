//! Memory ceilings of this machine, the yardstick for every table benchmark.
//!
//! This module owns the measurement of what DRAM can deliver to one core when
//! the working set is far larger than the last-level cache:
//!
//! - **random lines/s**: independent random cache-line reads with software
//!   prefetch and a fixed window of reads in flight (the memory-level
//!   parallelism limit);
//! - **two-line items/s**: per item, a random "bucket" line that holds the index
//!   of a random "state" line, processed in batches of 64 with a bucket phase and
//!   a state phase, exactly like a bulk hash lookup (FAJITA's pattern);
//! - **chase ns**: a pointer chase, one dependent miss at a time (latency).
//!
//! A flow table lookup-hit touches at least a bucket and a key/state line, so
//! the two-line rate is the physical limit a DRAM-resident table can reach on
//! one core; `flowplane bench table` prints its results as fractions of it.
//!
//! The buffer is mapped once with 2 MiB hugepages (`MAP_HUGETLB`) when the
//! system has them reserved, otherwise with ordinary pages advised for
//! transparent hugepages; [`Ceilings`] records which one was used because TLB
//! misses change every figure.

use super::BenchRow;
use super::SplitMix;
use crate::tsc::{hz, rdtsc};
use std::hint::black_box;

/// Bytes per cache line on every x86_64 CPU this project targets.
const LINE: usize = 64;
/// Reads kept in flight by the prefetch window of the random-read test.
const PREFETCH_DISTANCE: usize = 64;
/// Items per batch in the two-line test (`RTE_HASH_LOOKUP_BULK_MAX`).
const BATCH: usize = 64;
/// Size of a hugetlb page: the smallest mapping, and a divisor of every one.
const HUGE_PAGE: usize = 2 << 20;
/// Lines in the pointer-chase cycle (at most): 256 MiB worth, 8x the LLC.
const MAX_CHASE_NODES: usize = 1 << 22;

/// Measured memory ceilings for one core.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings {
    /// Independent prefetched random cache-line reads per second.
    pub random_lines_per_s: f64,
    /// Items per second when each item reads a random bucket line and then the
    /// random state line it names, in batches of 64 (bucket phase, state phase).
    pub two_line_items_per_s: f64,
    /// Latency of one dependent random DRAM access (pointer chase), in ns.
    pub chase_ns: f64,
    /// True if 2 MiB pages back (most of) the buffer: explicit hugetlb pages,
    /// or transparent hugepages granted for the advised mapping.
    pub hugepages: bool,
    /// True if the buffer came from reserved hugetlb pages (`MAP_HUGETLB`);
    /// false means an ordinary mapping advised with `MADV_HUGEPAGE`.
    pub hugetlb: bool,
    /// Size of the buffer the figures were measured over, in bytes.
    pub buffer_bytes: usize,
    /// Fraction of the buffer on 2 MiB pages (`None` if unknown).
    pub huge_pages: Option<f64>,
}

impl Ceilings {
    /// `rate` (ops/s) as a fraction of the two-line ceiling (0 if unknown).
    pub fn fraction_of_two_line(&self, rate: f64) -> f64 {
        if self.two_line_items_per_s > 0.0 {
            rate / self.two_line_items_per_s
        } else {
            0.0
        }
    }

    /// The ceilings as `impl_name = "ceiling"` rows (`random-lines`,
    /// `two-line-items`, `chase`), the form [`super::fill_ceiling_fracs`]
    /// reads. `size` is the buffer size in cache lines; the chase row's `mops`
    /// is dependent misses per second (1000 / ns) and the hugepage backing is
    /// recorded as extras.
    pub fn rows(&self) -> Vec<BenchRow> {
        let hz = hz();
        let lines = self.buffer_bytes / LINE;
        let row = |op: &str, per_s: f64| {
            let mut r = BenchRow::new("ceiling", op, lines, 1, 0, 0, 0);
            r.mops = per_s / 1e6;
            r.cycles_per_op = if per_s > 0.0 { hz / per_s } else { 0.0 };
            r.extra.push(("hugepages".to_string(), f64::from(u8::from(self.hugepages))));
            r.extra.push(("hugetlb".to_string(), f64::from(u8::from(self.hugetlb))));
            r.huge_pages = self.huge_pages;
            r
        };
        let chase_per_s = if self.chase_ns > 0.0 { 1e9 / self.chase_ns } else { 0.0 };
        let mut chase = row("chase", chase_per_s);
        chase.extra.insert(0, ("ns".to_string(), self.chase_ns));
        vec![row("random-lines", self.random_lines_per_s), row("two-line-items", self.two_line_items_per_s), chase]
    }

    /// `rate` (ops/s) as a fraction of the random-line ceiling (0 if unknown).
    pub fn fraction_of_random_lines(&self, rate: f64) -> f64 {
        if self.random_lines_per_s > 0.0 {
            rate / self.random_lines_per_s
        } else {
            0.0
        }
    }
}

/// Hints the CPU to bring the cache line holding `p` into L1.
///
/// Safe for any pointer value: prefetch instructions never fault and have no
/// architectural effect, so dangling or null pointers are harmless.
#[inline(always)]
pub fn prefetch_read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `prefetcht0` is a hint: it never faults, whatever the address,
        // and SSE (which provides it) is part of the x86_64 baseline.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
    }
}

/// Hints the CPU to bring the cache line holding `p` into L2 (`prefetcht1`).
///
/// For DRAM-bound random reads this reaches ~25% more lines/s than
/// [`prefetch_read`] on this Zen 5 guest (measured: 113 vs 88 M lines/s with 64
/// in flight over 512 MiB), presumably because it does not hold L1 miss
/// buffers until the line arrives. The ceilings are measured with it.
/// Safe for any pointer value, like [`prefetch_read`].
#[inline(always)]
pub fn prefetch_read_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `prefetcht1` is a hint: it never faults, whatever the address,
        // and SSE (which provides it) is part of the x86_64 baseline.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p as *const i8) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
    }
}

/// Measures the ceilings. `quick` uses a 256 MiB buffer and short runs (well
/// under 2 s in total); otherwise a 1 GiB buffer and best-of-five runs (a few
/// seconds).
pub fn measure(quick: bool) -> Ceilings {
    measure_with(if quick { 256 << 20 } else { 1 << 30 }, quick)
}

/// Measures the ceilings over a buffer of `bytes` (rounded up to a power of
/// two, at least 2 MiB). Use a size comparable to a table's footprint to get
/// the ceiling that table sees: TLB reach makes bigger buffers slower here.
/// If the mapping fails, smaller buffers are tried down to 64 MiB; if every
/// mapping fails the figures are zero.
pub fn measure_with(bytes: usize, quick: bool) -> Ceilings {
    let (items, reps, chase_steps) = if quick { (1 << 20, 2, 100_000) } else { (1 << 22, 5, 1_000_000) };
    let mut size = bytes;
    let buf = loop {
        if let Some(b) = LineBuf::new(size) {
            break Some(b);
        }
        if size <= 64 << 20 {
            break None;
        }
        size /= 2;
    };
    let Some(mut buf) = buf else {
        return Ceilings {
            random_lines_per_s: 0.0,
            two_line_items_per_s: 0.0,
            chase_ns: 0.0,
            hugepages: false,
            hugetlb: false,
            buffer_bytes: 0,
            huge_pages: None,
        };
    };
    let mut rng = SplitMix(0x5eed_f10f_1a2e);
    let lines = buf.lines();
    // Buckets live in the first half, states in the second; every bucket names
    // a random state line. Writing every line also faults in all pages.
    let half = lines / 2;
    for i in 0..lines {
        let v = if i < half { (half + rng.below(lines - half)) as u64 } else { i as u64 };
        buf.set_word(i, v);
    }
    let backing = crate::pages::of_addr(buf.ptr as usize);
    let hugepages = buf.hugetlb || backing.huge >= buf.len as u64 / 2;

    let hz = hz();
    let random_idx: Vec<u32> = (0..items + PREFETCH_DISTANCE).map(|_| rng.below(lines) as u32).collect();
    let bucket_idx: Vec<u32> = (0..items).map(|_| rng.below(half) as u32).collect();

    let mut best_random = 0.0f64;
    let mut best_two = 0.0f64;
    for _ in 0..reps {
        let t = random_reads(&buf, &random_idx, items);
        best_random = best_random.max(items as f64 * hz / t as f64);
        let t = two_line(&buf, &bucket_idx, items);
        best_two = best_two.max(items as f64 * hz / t as f64);
    }
    drop(random_idx);
    drop(bucket_idx);

    let chase_ns = chase(&mut buf, &mut rng, chase_steps, reps.min(3)) * 1e9 / hz;
    Ceilings {
        random_lines_per_s: best_random,
        two_line_items_per_s: best_two,
        chase_ns,
        hugepages,
        hugetlb: buf.hugetlb,
        buffer_bytes: buf.len,
        huge_pages: backing.fraction(),
    }
}

/// Cycles for `n` independent random line reads with a prefetch window.
/// `idx` holds `n + PREFETCH_DISTANCE` line indices, all `< buf.lines()`.
fn random_reads(buf: &LineBuf, idx: &[u32], n: usize) -> u64 {
    let mut sum = 0u64;
    let t0 = rdtsc();
    for i in 0..n {
        prefetch_read_l2(buf.line_ptr(idx[i + PREFETCH_DISTANCE] as usize));
        sum = sum.wrapping_add(buf.word(idx[i] as usize));
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    t.max(1)
}

/// Cycles for `n` two-line items in batches: prefetch the batch's buckets,
/// read them and prefetch the states they name, then read the states.
/// `idx` holds bucket lines (first half of the buffer), at least `n` of them.
fn two_line(buf: &LineBuf, idx: &[u32], n: usize) -> u64 {
    let mut sum = 0u64;
    let mut state = [0usize; BATCH];
    let t0 = rdtsc();
    for batch in idx[..n].chunks(BATCH) {
        for &b in batch {
            prefetch_read_l2(buf.line_ptr(b as usize));
        }
        for (s, &b) in state.iter_mut().zip(batch) {
            *s = buf.state_of(b as usize);
            prefetch_read_l2(buf.line_ptr(*s));
        }
        for &s in &state[..batch.len()] {
            sum = sum.wrapping_add(buf.word(s));
        }
    }
    let t = rdtsc().wrapping_sub(t0);
    black_box(sum);
    t.max(1)
}

/// Builds a random cycle over lines spread across the whole buffer and
/// returns the best cycles per dependent step over `reps` runs.
fn chase(buf: &mut LineBuf, rng: &mut SplitMix, steps: usize, reps: usize) -> f64 {
    let lines = buf.lines();
    // Up to 4M nodes (256 MiB of lines, far beyond the LLC), one per stratum at
    // a random line inside it: the cycle spans the whole buffer without
    // shuffling every line of a 1 GiB buffer.
    let nodes = lines.min(MAX_CHASE_NODES);
    let stride = lines / nodes;
    let mut order: Vec<u32> = (0..nodes).map(|j| (j * stride + rng.below(stride)) as u32).collect();
    // Sattolo's algorithm: a single cycle through all nodes.
    for i in (1..order.len()).rev() {
        let j = rng.below(i);
        order.swap(i, j);
    }
    for w in 0..order.len() {
        buf.set_word(order[w] as usize, order[(w + 1) % order.len()] as u64);
    }
    let mut best = f64::MAX;
    let mut p = order[0] as usize;
    for _ in 0..reps.max(1) {
        let t0 = rdtsc();
        for _ in 0..steps {
            p = buf.state_of(p);
        }
        let t = rdtsc().wrapping_sub(t0);
        best = best.min(t as f64 / steps.max(1) as f64);
    }
    black_box(p);
    best
}

/// A large anonymous mapping (hugetlb or THP-advised) viewed as cache lines
/// whose first 8 bytes hold a word (for the ceilings, a line index). Reads mask
/// the line index to `lines()`, a power of two, so no index is ever out of
/// bounds. Also used as the state array of the DPDK baseline.
pub(crate) struct LineBuf {
    ptr: *mut u8,
    len: usize,
    hugetlb: bool,
}

impl LineBuf {
    /// Maps `len` bytes (rounded up to a power of two of at least 2 MiB, so
    /// line indices can be masked), trying hugetlb pages first.
    pub(crate) fn new(len: usize) -> Option<LineBuf> {
        let len = len.max(HUGE_PAGE).checked_next_power_of_two()?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        #[cfg(target_os = "linux")]
        {
            // SAFETY: a fresh anonymous mapping at a kernel-chosen address
            // aliases no Rust object; the result is checked for MAP_FAILED.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags | libc::MAP_HUGETLB, -1, 0) };
            if p != libc::MAP_FAILED {
                return Some(LineBuf { ptr: p.cast(), len, hugetlb: true });
            }
        }
        // SAFETY: as above, without hugetlb pages.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return None;
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `p..p+len` is the mapping just created; MADV_HUGEPAGE only
            // changes how the kernel backs it. Failure (THP off) is harmless.
            unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        }
        Some(LineBuf { ptr: p.cast(), len, hugetlb: false })
    }

    pub(crate) fn lines(&self) -> usize {
        self.len / LINE
    }

    /// Address of line `i`, for prefetching (may be any index: prefetch never faults).
    #[inline(always)]
    pub(crate) fn line_ptr(&self, i: usize) -> *const u8 {
        self.ptr.wrapping_add(i.wrapping_mul(LINE))
    }

    /// First word of line `i`. Callers pass indices below `lines()` (drawn
    /// that way or read from the buffer, which only stores such indices); the
    /// mask is a one-instruction guarantee of that, not a wrap-around feature.
    #[inline(always)]
    pub(crate) fn word(&self, i: usize) -> u64 {
        debug_assert!(i < self.lines());
        // `lines()` is a power of two (see `new`).
        let i = i & (self.lines() - 1);
        // SAFETY: `i < lines()` after masking, so the 8 bytes at
        // `ptr + i*64` lie inside the mapping, which is 64-byte aligned and
        // lives as long as `self`.
        unsafe { self.ptr.add(i * LINE).cast::<u64>().read() }
    }

    /// Line index stored in line `i`.
    #[inline(always)]
    pub(crate) fn state_of(&self, i: usize) -> usize {
        self.word(i) as usize
    }

    pub(crate) fn set_word(&mut self, i: usize, v: u64) {
        assert!(i < self.lines() && v < self.lines() as u64, "line index out of range");
        // SAFETY: `i < lines()` (checked above): inside the mapping, aligned,
        // and `&mut self` guarantees no concurrent reader.
        unsafe { self.ptr.add(i * LINE).cast::<u64>().write(v) }
    }

    /// Adds `v` to the first word of line `i` (masked like [`Self::word`]).
    #[cfg_attr(not(feature = "dpdk"), allow(dead_code))] // only the DPDK baseline writes states
    #[inline(always)]
    pub(crate) fn add_to_word(&mut self, i: usize, v: u64) {
        let i = i & (self.lines() - 1);
        // SAFETY: `i < lines()` after masking: inside the mapping, aligned, and
        // `&mut self` guarantees no concurrent access.
        unsafe {
            let p = self.ptr.add(i * LINE).cast::<u64>();
            p.write(p.read().wrapping_add(v));
        }
    }
}

impl Drop for LineBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe the mapping created in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_ceilings_are_positive_and_plausible() {
        let c = measure(true);
        assert!(c.buffer_bytes >= 64 << 20, "{c:?}");
        assert!(c.random_lines_per_s > 1e6, "{c:?}");
        assert!(c.two_line_items_per_s > 1e6, "{c:?}");
        // A DRAM miss costs more than 10 ns and less than 10 us on any machine.
        assert!(c.chase_ns > 10.0 && c.chase_ns < 10_000.0, "{c:?}");
        // Two dependent lines per item cannot beat independent single lines by much.
        assert!(c.two_line_items_per_s < 2.0 * c.random_lines_per_s, "{c:?}");
        assert!((c.fraction_of_two_line(c.two_line_items_per_s) - 1.0).abs() < 1e-9);
        let rows = c.rows();
        assert_eq!(rows.len(), 3);
        let two = rows.iter().find(|r| r.op == "two-line-items").expect("two-line row");
        assert!((two.mops * 1e6 - c.two_line_items_per_s).abs() < 1.0);
        assert!(two.cycles_per_op > 0.0);
    }

    /// Prints the full ceilings (1 GiB) and the ones over 256 MiB (about a
    /// 4M-entry table's footprint); run with
    /// `cargo test --release -p flowplane-bench -- --ignored --nocapture ceiling_figures`.
    #[test]
    #[ignore = "takes ~5 s and 1 GiB; a measurement, not a check"]
    fn ceiling_figures() {
        for c in [measure(false), measure_with(256 << 20, false)] {
            println!(
                "buffer {} MiB hugepages {} (hugetlb {}): random lines {:.1} M/s, two-line items {:.1} M/s, chase {:.0} ns",
                c.buffer_bytes >> 20,
                c.hugepages,
                c.hugetlb,
                c.random_lines_per_s / 1e6,
                c.two_line_items_per_s / 1e6,
                c.chase_ns
            );
            assert!(c.random_lines_per_s > 0.0 && c.two_line_items_per_s > 0.0 && c.chase_ns > 0.0);
        }
    }

    #[test]
    fn prefetch_accepts_any_pointer() {
        prefetch_read(std::ptr::null());
        prefetch_read(usize::MAX as *const u8);
        let x = [1u8; 64];
        prefetch_read(x.as_ptr());
        assert_eq!(x[0], 1);
    }

    #[test]
    fn chase_cycle_visits_every_node() {
        let mut buf = LineBuf::new(4 << 20).expect("4 MiB mapping");
        let mut rng = SplitMix(7);
        chase(&mut buf, &mut rng, 10, 1);
        // Follow the cycle from a node: it must return after exactly `nodes` steps.
        let nodes = buf.lines().min(MAX_CHASE_NODES);
        let start = (0..buf.lines()).find(|&i| buf.word(i) != 0).expect("a node");
        let mut p = start;
        let mut n = 0;
        loop {
            p = buf.state_of(p);
            n += 1;
            if p == start || n > nodes {
                break;
            }
        }
        assert_eq!(n, nodes);
    }
}

//! `synthetic`: the synthetic NF of FAJITA's Fig. 3 and Fig. 17, with `k`
//! dependent (pointer-chasing) memory accesses per packet.
//!
//! The NF owns a private array of `u32` indices (`mem` bytes, allocated and
//! filled once in the constructor) holding a random cyclic permutation, so
//! following `idx = array[idx]` visits every slot before repeating and the
//! hardware prefetcher cannot guess the next address. A flow's state is a
//! position in that cycle, pseudo-random from the flow's key at creation;
//! each packet walks `k` steps and stores where it ended (so the reads
//! cannot be optimised away; the export shows it). A packet whose flow found
//! no room (the flow table full) passes, counted as `table_full`.
//! The prefetch hook prefetches `array[state.idx]`, the first of the k
//! accesses: exactly what FAJITA's customizable prefetch provides. The
//! resumable action (interleaved executor) is the chase as k steps, each
//! naming the slot the next read touches.

use bytemuck::{Pod, Zeroable};
use flowplane_table::HugeArray;
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::Granularity;
use crate::stateful::{Action, Cursor, StatefulNf, Step};
use crate::{NfContext, ParamError, ParamSpec, Params};
use flowplane_wire::flow::FiveTuple;

/// Most indirect accesses per packet.
pub const MAX_K: u64 = 16;
/// Default array size: 256 MiB.
pub const DEFAULT_MEM: u64 = 256 << 20;
/// Largest array (entries are `u32` indices).
pub const MAX_MEM: u64 = 16 << 30;

const K: ParamSpec = ParamSpec::uint("k", 1, 0, MAX_K, "indirect accesses per packet");
const MEM: ParamSpec = ParamSpec::uint(
    "mem",
    DEFAULT_MEM,
    8,
    MAX_MEM,
    "bytes of the private pointer-chasing array per instance (default 256 MiB; suffixes are decimal)",
)
.allocates(1);
const SEED: ParamSpec = ParamSpec::uint("seed", 1, 0, u64::MAX, "seed of the random permutation and flow starts");

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "synthetic",
    about: "synthetic NF with k dependent indirect memory accesses per packet (FAJITA Fig. 3/17); prefetch hook loads the first",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[K, MEM, SEED],
};

/// Builds `synthetic` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Synthetic::from_params(p)?))
}

/// Per-flow state: the flow's current position in the array.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SyntheticState {
    /// Index of the next slot to read.
    pub idx: u32,
}

/// SplitMix64: a tiny, good-enough generator for setup and flow starts.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, bound)` (Lemire's multiply-shift; bias is negligible here).
    fn below(&mut self, bound: u64) -> u64 {
        ((self.next() as u128 * bound as u128) >> 64) as u64
    }
}

/// The synthetic INFO.
#[derive(Debug)]
pub struct Synthetic {
    k: u32,
    /// On huge pages: a 4 KiB-page array makes every read a TLB miss too.
    array: HugeArray<u32>,
    /// Seed of the flows' start positions.
    seed: u64,
    /// Packets processed (k reads each).
    packets: u64,
    table_full: u64,
}

impl Synthetic {
    /// `synthetic(k=N, mem=BYTES, seed=S)`. Suffixes k/M/G are decimal
    /// (`mem=256M` is 256e6 bytes); the default is 256 MiB.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let k = p.uint(&K)? as u32;
        let mem = p.uint(&MEM)?;
        let seed = p.uint(&SEED)?;
        Synthetic::new(k, mem, seed)
    }

    /// An NF with `k` accesses per packet over `mem` bytes (at least two
    /// entries), its permutation drawn from `seed`. Fails (rather than
    /// aborting) if the array cannot be allocated.
    pub fn new(k: u32, mem: u64, seed: u64) -> Result<Self, ParamError> {
        let n = (mem / 4).clamp(2, u32::MAX as u64) as usize;
        let mut array = HugeArray::<u32>::zeroed(n)
            .map_err(|_| ParamError(format!("synthetic: cannot allocate parameter 'mem={mem}' bytes")))?;
        for (i, x) in array.iter_mut().enumerate() {
            *x = i as u32;
        }
        let mut rng = SplitMix(seed);
        // Sattolo's algorithm: a uniformly random permutation with a single
        // cycle, so a walk never falls into a short loop that stays cached.
        for i in (1..n).rev() {
            let j = rng.below(i as u64) as usize;
            array.swap(i, j);
        }
        Ok(Synthetic { k: k.min(MAX_K as u32), array, seed, packets: 0, table_full: 0 })
    }

    /// Entries in the array.
    pub fn entries(&self) -> usize {
        self.array.len()
    }

    /// The index `steps` reads after `idx` (what a packet of a flow at
    /// `idx` ends on when k = `steps`).
    #[inline(always)]
    fn walk(&self, mut idx: u32, steps: u32) -> u32 {
        for _ in 0..steps {
            // Indices are always in range by construction; a corrupted
            // state restarts at 0 rather than panicking.
            idx = self.array.get(idx as usize).copied().unwrap_or(0);
        }
        idx
    }
}

impl StatefulNf for Synthetic {
    type State = SyntheticState;
    const HAS_PREFETCH: bool = true;
    const STEPS: bool = true;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn init(&mut self, pkt: &Pkt<'_>, _ctx: &NfContext) -> SyntheticState {
        // A pseudo-random start drawn from the flow's key: the same whatever
        // core or order the flow meets (runs compare exactly).
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        pkt.tuple().hash(&mut h);
        let mut rng = SplitMix(h.finish() ^ self.seed);
        SyntheticState { idx: rng.below(self.array.len() as u64) as u32 }
    }

    #[inline]
    fn process(&mut self, _pkt: &mut Pkt<'_>, st: &mut SyntheticState, _ctx: &NfContext) -> Action {
        st.idx = self.walk(st.idx, self.k);
        self.packets += 1;
        Action::Pass
    }

    /// `cur.step` = 1 + reads done, `cur.pos` = the index reached,
    /// `cur.input` = the start (the flow's `idx`).
    #[inline]
    fn step(&self, _pkt: &Pkt<'_>, st: &SyntheticState, cur: &mut Cursor) -> Step {
        if cur.step == 0 {
            *cur = Cursor { step: 1, pos: st.idx, input: u64::from(st.idx), val: [0; 2] };
        } else {
            // The slot named by the previous step: read it (the array never changes).
            cur.pos = self.walk(cur.pos, 1);
            cur.step += 1;
        }
        match self.array.get(cur.pos as usize) {
            Some(x) if cur.step <= self.k => Step::at(x),
            _ => Step::Ready,
        }
    }

    #[inline]
    fn finish(&mut self, _pkt: &mut Pkt<'_>, st: &mut SyntheticState, cur: &Cursor, _ctx: &NfContext) -> Action {
        st.idx = if cur.step > 0 && cur.input == u64::from(st.idx) {
            // Resume the chase where the steps left it.
            self.walk(cur.pos, self.k.saturating_sub(cur.step - 1))
        } else {
            self.walk(st.idx, self.k)
        };
        self.packets += 1;
        Action::Pass
    }

    fn prefetch(&self, st: &SyntheticState) {
        if self.k > 0 {
            if let Some(x) = self.array.get(st.idx as usize) {
                flowplane_packet::prefetch::read(x);
            }
        }
    }

    /// Fails open: counted as `table_full`, passed untouched.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({
            "k": self.k,
            "mem_bytes_per_core": self.array.len() as u64 * 4,
            "entries_per_core": self.array.len(),
            "indirect_reads": self.packets * self.k as u64,
            "table_full": self.table_full,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["k", "mem_bytes_per_core", "entries_per_core"]);
    }

    /// Where each flow's walk stands (so runs can be compared exactly).
    fn export_kind(&self) -> Export {
        Export::State
    }

    fn export_row(&self, key: &FiveTuple, st: &SyntheticState) -> Option<serde_json::Value> {
        Some(json!({
            "src": key.src_ip().to_string(),
            "sport": key.src_port(),
            "dst": key.dst_ip().to_string(),
            "dport": key.dst_port(),
            "idx": st.idx,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt::PktMeta;
    use crate::testutil::{udp4, Harness};

    #[test]
    fn array_is_one_cycle_over_every_slot() {
        let s = Synthetic::new(1, 4 * 1000, 7).unwrap();
        assert_eq!(s.entries(), 1000);
        let mut seen = vec![false; 1000];
        let mut idx = 0u32;
        for _ in 0..1000 {
            assert!(!seen[idx as usize], "slot {idx} visited twice before the cycle closed");
            seen[idx as usize] = true;
            idx = s.array[idx as usize];
        }
        assert_eq!(idx, 0, "the walk returns to its start after n steps");
        assert!(seen.iter().all(|&v| v));
        assert!(s.array.iter().enumerate().all(|(i, &v)| v as usize != i), "no fixed points");
    }

    #[test]
    fn each_packet_walks_k_steps_and_stores_the_end() {
        for k in [0u32, 1, 3, 16] {
            let mut h = Harness::new(Synthetic::new(k, 4096, 3).unwrap());
            let f = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
            let (out, act) = h.run(&f);
            assert_eq!(act, Action::Pass);
            assert_eq!(out, f, "packets are not modified");
            let s1 = h.state_of(&f).unwrap().idx;
            h.run(&f);
            let s2 = h.state_of(&f).unwrap().idx;
            assert_eq!(s2, h.nf.walk(s1, k));
            if k > 0 {
                assert_ne!(s1, s2);
            } else {
                assert_eq!(s1, s2);
            }
            let r = h.nf.report().unwrap();
            assert_eq!(r["indirect_reads"], 2 * k as u64);
        }
    }

    #[test]
    fn resumed_chase_equals_the_whole_chase() {
        let mut h = Harness::new(Synthetic::new(5, 4096, 11).unwrap());
        let mut f = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        h.run(&f);
        let meta = PktMeta::parse(&f);
        let start = h.state_of(&f).unwrap();
        // Stop after 0..=k+1 steps: finish must end where process ends.
        for stop in 0..8 {
            let mut cur = Cursor::default();
            let mut steps = 0;
            while steps < stop && h.nf.step(&Pkt::new(&mut f, &meta), &start, &mut cur) != Step::Ready {
                steps += 1;
            }
            let mut st = start;
            h.nf.finish(&mut Pkt::new(&mut f, &meta), &mut st, &cur, &NfContext::default());
            assert_eq!(st.idx, h.nf.walk(start.idx, 5), "stopped after {stop} steps");
        }
        // The full chase names k lines, then is ready.
        let mut cur = Cursor::default();
        let mut named = 0;
        while let Step::Prefetch(_) = h.nf.step(&Pkt::new(&mut f, &meta), &start, &mut cur) {
            named += 1;
        }
        assert_eq!(named, 5);
        // A cursor computed from another state is not trusted.
        let mut st = SyntheticState { idx: start.idx ^ 1 };
        h.nf.finish(&mut Pkt::new(&mut f, &meta), &mut st, &cur, &NfContext::default());
        assert_eq!(st.idx, h.nf.walk(start.idx ^ 1, 5));
    }

    #[test]
    fn flows_start_at_different_places() {
        let mut h = Harness::new(Synthetic::new(0, 1 << 20, 9).unwrap());
        let starts: std::collections::HashSet<u32> = (0..64u16)
            .map(|p| {
                let f = udp4([10, 0, 0, 1], [9, 9, 9, 9], p, 80);
                h.run(&f);
                h.state_of(&f).unwrap().idx
            })
            .collect();
        assert!(starts.len() > 60, "random starts collide too often: {}", starts.len());
    }

    #[test]
    fn params_bad_state_and_malformed_packets() {
        let mut p = Params::new("synthetic", vec![("k".into(), "17".into())]);
        assert!(Synthetic::from_params(&mut p).unwrap_err().0.contains("'k=17'"));
        let mut p = Params::new("synthetic", vec![("mem".into(), "4".into())]);
        assert!(Synthetic::from_params(&mut p).is_err());
        let mut p = Params::new("synthetic", vec![("k".into(), "4".into()), ("mem".into(), "64k".into())]);
        let s = Synthetic::from_params(&mut p).unwrap();
        assert_eq!(s.entries(), 16_000);
        // A state pointing outside the array (never produced, but plain data) is harmless.
        let mut h = Harness::new(s);
        let f = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        h.run(&f);
        let key = h.key_of(&f).unwrap();
        h.states.insert(key, SyntheticState { idx: u32::MAX });
        h.nf.prefetch(&SyntheticState { idx: u32::MAX });
        assert_eq!(h.run(&f).1, Action::Pass);
        assert!((h.state_of(&f).unwrap().idx as usize) < 16_000);
        for len in [0usize, 13, 33] {
            assert_eq!(h.run(&vec![0u8; len]).1, Action::Pass);
        }
    }

    /// Measurement, not a check: cycles per packet over the default 256 MiB
    /// array with and without the prefetch hook, in batches of 32 packets of
    /// distinct flows (as the batched executor drives it). Run with
    /// `cargo test --release -p flowplane-nf synthetic::tests::measure -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure() {
        let t0 = std::time::Instant::now();
        let mut nf = Synthetic::new(1, DEFAULT_MEM, 1).unwrap();
        println!("build 256 MiB: {:.2} s", t0.elapsed().as_secs_f64());
        let mut frame = udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let meta = PktMeta::parse(&frame);
        let ctx = NfContext::default();
        let mut states: Vec<SyntheticState> =
            (0..1 << 20).map(|_| nf.init(&Pkt::new(&mut frame, &meta), &ctx)).collect();
        for k in [1u32, 2, 4, 8] {
            nf.k = k;
            for ahead in [false, true] {
                let rounds = 4u64;
                let start = flowplane_packet::tsc::rdtsc();
                for _ in 0..rounds {
                    for batch in states.chunks_mut(32) {
                        if ahead {
                            for st in batch.iter() {
                                nf.prefetch(st);
                            }
                        }
                        for st in batch.iter_mut() {
                            nf.process(&mut Pkt::new(&mut frame, &meta), st, &ctx);
                        }
                    }
                }
                let cycles = flowplane_packet::tsc::rdtsc().saturating_sub(start);
                let pkts = rounds * states.len() as u64;
                println!("k={k} prefetch={ahead}: {:.1} TSC cycles/packet", cycles as f64 / pkts as f64);
            }
        }
        assert!(nf.packets > 0);
    }
}

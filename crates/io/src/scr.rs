//! The SCR sequencer (`--scale scr`): where a programmable NIC or the
//! top-of-rack switch would sit, in front of the emulated NIC queues. It
//! gives every packet of the stream a sequence number (one more than its
//! stream position, loops continuing) and a timestamp (the packet clock), keeps the
//! declared fields of the last N packets in a ring, and piggybacks that
//! ring — the last N-1 packets' records, the packet's own, and (implied by
//! the sequence number) the index of the earliest — on each packet it
//! sprays round robin over the cores (SCR Fig. 4a).
//!
//! The fields are extracted once when the trace is loaded (what the
//! sequencer's parser does per packet in hardware); at receive a queue
//! copies each packet's N records into a side array parallel to the batch
//! (the DMA of the prefixed history), preallocated: no allocation per
//! packet. Loss between the sequencer and the cores can be injected
//! (`--scr-loss`, deterministic by seed and sequence number).

use std::sync::Arc;

use flowplane_packet::MAX_BATCH;
use flowplane_wire::frame::PktMeta;
use flowplane_wire::scr::ScrRecord;

use crate::replay::ReplayTrace;

/// The sequencer of one run, shared by every queue (immutable).
pub struct Sequencer {
    recs: Box<[ScrRecord]>,
    /// Timestamps of the stream positions (ns, first loop).
    ts: Box<[u64]>,
    loop_ns: u64,
    history: usize,
    /// Loss threshold on a 64-bit hash (0: no loss).
    loss: u64,
    seed: u64,
}

/// SplitMix64 finaliser (the loss decision's hash).
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sequencer {
    /// A sequencer over a steered trace, piggybacking `history` records per
    /// packet (>= 1), losing each packet with probability `loss_rate` on
    /// its way to a core (decided by `seed` and the sequence number).
    pub fn new(trace: &ReplayTrace, history: usize, loss_rate: f64, seed: u64) -> Sequencer {
        let d = &trace.queues[0];
        let n = d.len.len();
        let mut recs = Vec::with_capacity(n);
        let mut ts = Vec::with_capacity(n);
        let mut buf = Vec::with_capacity(2048);
        for i in 0..n {
            trace.copy_frame(0, i, &mut buf);
            let m = PktMeta::parse(&buf);
            recs.push(ScrRecord::from_frame(&buf, &m));
            ts.push(d.ts_at(i));
        }
        let loss = if loss_rate <= 0.0 { 0 } else { (loss_rate.min(1.0) * u64::MAX as f64) as u64 };
        Sequencer {
            recs: recs.into_boxed_slice(),
            ts: ts.into_boxed_slice(),
            loop_ns: trace.loop_ns,
            history: history.max(1),
            loss,
            seed,
        }
    }

    /// Records per packet (N).
    pub fn history(&self) -> usize {
        self.history
    }

    /// Packets per loop.
    pub fn stream_len(&self) -> u64 {
        self.recs.len() as u64
    }

    /// The record of sequence number `seq` (>= 1), timestamp set.
    #[inline]
    pub fn record(&self, seq: u64) -> ScrRecord {
        let n = self.recs.len() as u64;
        let q = seq - 1;
        let (lp, i) = (q / n, (q % n) as usize);
        let mut r = self.recs[i];
        r.set_ts_ns(lp.saturating_mul(self.loop_ns).saturating_add(self.ts[i]));
        r
    }

    /// The packet of sequence number `seq` is lost between the sequencer and its core.
    #[inline(always)]
    pub fn lost(&self, seq: u64) -> bool {
        self.loss != 0 && mix(self.seed ^ seq.wrapping_mul(0xd6e8_feb8_6659_fd93)) < self.loss
    }

    /// Writes the history piggybacked on packet `seq` into `out` (N
    /// records): the record of sequence `s` at slot `(s - 1) % N` for
    /// `s` in `max(1, seq - N + 1) ..= seq`, as the sequencer's ring holds them.
    #[inline]
    pub fn fill(&self, seq: u64, out: &mut [ScrRecord]) {
        let nh = self.history as u64;
        let n = self.recs.len() as u64;
        let q = seq - 1;
        let (mut lp, mut i) = (q / n, q % n);
        let mut slot = (q % nh) as usize;
        let first = seq.saturating_sub(nh - 1).max(1);
        let mut s = seq;
        loop {
            let mut r = self.recs[i as usize];
            r.set_ts_ns(lp.saturating_mul(self.loop_ns).saturating_add(self.ts[i as usize]));
            out[slot] = r;
            if s == first {
                break;
            }
            s -= 1;
            slot = if slot == 0 { self.history - 1 } else { slot - 1 };
            if i == 0 {
                i = n - 1;
                lp -= 1;
            } else {
                i -= 1;
            }
        }
    }
}

/// What a queue hands the worker with each burst under SCR.
#[derive(Clone, Copy, Debug)]
pub struct ScrSide<'a> {
    /// Sequence number of each packet of the burst, in batch order.
    pub seqs: &'a [u64],
    /// Each packet's piggybacked history: N records per packet (packet k's
    /// at `k * N ..`), sequence `s` at slot `(s - 1) % N`.
    pub hist: &'a [ScrRecord],
    /// N.
    pub history: usize,
}

/// A queue's receive side of the sequencer: the side arrays parallel to the batch.
pub struct ScrTap {
    /// The sequencer.
    pub seq: Arc<Sequencer>,
    seqs: Box<[u64]>,
    hist: Box<[ScrRecord]>,
    len: usize,
    /// Packets this queue's core lost (injected).
    pub lost: u64,
    /// Cycles spent attaching histories (the sequencer's work).
    pub cycles: u64,
}

impl ScrTap {
    /// A tap on `seq`, with side arrays for one batch.
    pub fn new(seq: Arc<Sequencer>) -> ScrTap {
        let h = seq.history();
        ScrTap {
            seqs: vec![0; MAX_BATCH].into_boxed_slice(),
            hist: vec![ScrRecord::default(); MAX_BATCH * h].into_boxed_slice(),
            len: 0,
            lost: 0,
            cycles: 0,
            seq,
        }
    }

    /// A new burst starts.
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Packet `k` of the burst has sequence number `s`: attach its history.
    #[inline(always)]
    pub fn attach(&mut self, k: usize, s: u64) {
        let h = self.seq.history();
        if let Some(slot) = self.seqs.get_mut(k) {
            *slot = s;
            self.seq.fill(s, &mut self.hist[k * h..(k + 1) * h]);
            self.len = self.len.max(k + 1);
        }
    }

    /// The burst's side arrays.
    pub fn side(&self) -> ScrSide<'_> {
        let h = self.seq.history();
        ScrSide { seqs: &self.seqs[..self.len], hist: &self.hist[..self.len * h], history: h }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::ReplayBuilder;

    #[test]
    fn history_ring_holds_the_last_n_packets_across_loops() {
        let mut b = ReplayBuilder::new(1);
        for i in 0..5u64 {
            let mut f = vec![0u8; 60];
            f[0] = i as u8;
            b.push_steered(&f, 0, 10 * i, 0).unwrap();
        }
        let t = b.build();
        let s = Sequencer::new(&t, 3, 0.0, 1);
        let mut out = [ScrRecord::default(); 3];
        // Sequence 7 is loop 1, position 1; the ring holds 5, 6, 7 at slots 1, 2, 0.
        s.fill(7, &mut out);
        assert_eq!(out[0], s.record(7));
        assert_eq!(out[1], s.record(5));
        assert_eq!(out[2], s.record(6));
        assert_eq!(s.record(6).ts_ns(), t.loop_ns());
        assert!(s.record(7).ts_ns() > s.record(6).ts_ns());
        // Sequence 1: only itself.
        let mut one = [ScrRecord::default(); 3];
        s.fill(1, &mut one);
        assert_eq!(one[0], s.record(1));
        let lossy = Sequencer::new(&t, 3, 0.5, 9);
        let lost = (1..=10_000).filter(|&q| lossy.lost(q)).count();
        assert!((4_500..5_500).contains(&lost), "{lost}");
        assert!(!(1..=1000).any(|q| s.lost(q)));
    }
}

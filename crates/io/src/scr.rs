//! The SCR sequencer (`--scale scr`): where a programmable NIC or the
//! top-of-rack switch would sit, in front of the emulated NIC queues. It
//! gives every packet of the stream a sequence number (one more than its
//! stream position, loops continuing) and a timestamp (the packet clock), keeps the
//! declared fields of the last N packets in a ring, and piggybacks that
//! ring — the last N-1 packets' records, the packet's own, and (implied by
//! the sequence number) the index of the earliest — on each packet it
//! sprays round robin over the cores (SCR Fig. 4a). The side array hands
//! each packet's ring over rotated by that index, oldest record first and
//! the packet's own last (what a core's parser reads from the prefix), so a
//! core fast-forwards over one contiguous slice.
//!
//! Two ways to run it. Over a replayed trace ([`Sequencer::new`]) the
//! fields are extracted once when the trace is loaded (what the
//! sequencer's parser does per packet in hardware) and a queue attaches a
//! packet's history from the stream by its position ([`ScrTap`]). On live
//! ports ([`Sequencer::streaming`]) the records are made as packets arrive:
//! a [`Stamper`], owned by the software dispatcher core (the SCR paper's
//! software sequencer), parses each packet, gives it the next sequence
//! number and the sequencer's time, and keeps the last N records in a ring
//! from which each packet's history is one contiguous slice; when the
//! stream stops it leaves the last history with the [`Sequencer`], where
//! the replicas catch up to the stream's end. Either way a core receives
//! each packet's N records in a side array parallel to the batch (the DMA
//! of the prefixed history), preallocated: no allocation per packet. Loss
//! between the sequencer and the cores can be injected (`--scr-loss`,
//! deterministic by seed and sequence number).

use std::sync::{Arc, OnceLock};

use flowplane_packet::MAX_BATCH;
use flowplane_wire::frame::PktMeta;
use flowplane_wire::scr::ScrRecord;

use crate::replay::ReplayTrace;

/// The sequencer of one run, shared by every queue and replica (immutable,
/// but for a streaming sequencer's tail, set once when its stream stops).
pub struct Sequencer {
    /// The stream positions' records, first-loop timestamps set (empty when streaming).
    recs: Box<[ScrRecord]>,
    loop_ns: u64,
    history: usize,
    /// Loss threshold on a 64-bit hash (0: no loss).
    loss: u64,
    seed: u64,
    /// Every record's time is at or after the one before it, loops
    /// included (see [`ScrSide::monotonic`]).
    monotonic: bool,
    /// Records are made as packets arrive ([`Stamper`]), not taken from a trace.
    streaming: bool,
    /// Streaming: the last sequence number emitted and its history (N
    /// records, oldest first), left by the [`Stamper`] when the stream stops.
    tail: OnceLock<(u64, Box<[ScrRecord]>)>,
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
        let mut buf = Vec::with_capacity(2048);
        for i in 0..n {
            trace.copy_frame(0, i, &mut buf);
            let m = PktMeta::parse(&buf);
            let mut r = ScrRecord::from_frame(&buf, &m);
            r.set_ts_ns(d.ts_at(i));
            recs.push(r);
        }
        let loss = loss_threshold(loss_rate);
        // A trace's clock may jump back; a loop's first record follows the
        // last one of the loop before when the loop lasts the trace's span.
        let monotonic = recs.windows(2).all(|w| w[0].ts_ns() <= w[1].ts_ns())
            && match (recs.first(), recs.last()) {
                (Some(a), Some(z)) => z.ts_ns() <= trace.loop_ns.saturating_add(a.ts_ns()),
                _ => true,
            };
        Sequencer {
            recs: recs.into_boxed_slice(),
            loop_ns: trace.loop_ns,
            history: history.max(1),
            loss,
            seed,
            monotonic,
            streaming: false,
            tail: OnceLock::new(),
        }
    }

    /// A sequencer whose records are made as packets arrive (a live port's
    /// dispatcher core stamps them: [`Stamper`]); `history`, `loss_rate`
    /// and `seed` as in [`Sequencer::new`]. Its clock never goes back (the
    /// stamper holds it), so it is monotonic.
    pub fn streaming(history: usize, loss_rate: f64, seed: u64) -> Sequencer {
        Sequencer {
            recs: Box::default(),
            loop_ns: 0,
            history: history.max(1),
            loss: loss_threshold(loss_rate),
            seed,
            monotonic: true,
            streaming: true,
            tail: OnceLock::new(),
        }
    }

    /// Records are made as packets arrive (a port), not taken from a trace.
    pub fn is_streaming(&self) -> bool {
        self.streaming
    }

    /// Streaming: the last sequence number emitted, once the stream has
    /// stopped (None before, and for a trace: its end is the run's loops).
    pub fn end(&self) -> Option<u64> {
        self.tail.get().map(|t| t.0)
    }

    /// Every record's time is at or after the one before it ([`ScrSide::monotonic`]).
    pub fn monotonic(&self) -> bool {
        self.monotonic
    }

    /// Records per packet (N).
    pub fn history(&self) -> usize {
        self.history
    }

    /// Packets per loop (0 when streaming).
    pub fn stream_len(&self) -> u64 {
        self.recs.len() as u64
    }

    /// The record of sequence number `seq` (>= 1), timestamp set.
    /// Streaming: only the last N records are known, once the stream has
    /// stopped (any other is a default, invalid record).
    #[inline]
    pub fn record(&self, seq: u64) -> ScrRecord {
        if self.streaming {
            return match self.tail.get() {
                Some((end, h)) if seq <= *end && end - seq < h.len() as u64 => h[h.len() - 1 - (end - seq) as usize],
                _ => ScrRecord::default(),
            };
        }
        let n = self.recs.len() as u64;
        let q = seq - 1;
        let (lp, i) = (q / n, (q % n) as usize);
        self.at(lp, i)
    }

    /// The record of stream position `i` of loop `lp`.
    #[inline(always)]
    fn at(&self, lp: u64, i: usize) -> ScrRecord {
        let mut r = self.recs[i];
        if lp > 0 {
            r.set_ts_ns(lp.saturating_mul(self.loop_ns).saturating_add(r.ts_ns()));
        }
        r
    }

    /// The packet of sequence number `seq` is lost between the sequencer and its core.
    #[inline(always)]
    pub fn lost(&self, seq: u64) -> bool {
        self.loss != 0 && mix(self.seed ^ seq.wrapping_mul(0xd6e8_feb8_6659_fd93)) < self.loss
    }

    /// Writes the history piggybacked on packet `seq` into `out` (N
    /// records, oldest first): sequence `s` at `N - 1 - (seq - s)` for `s`
    /// in `max(1, seq - N + 1) ..= seq` (slots before sequence 1 are left as they are).
    /// Streaming: only for the last sequence number, once the stream has
    /// stopped (the history it left); `out` is left as it is otherwise.
    #[inline]
    pub fn fill(&self, seq: u64, out: &mut [ScrRecord]) {
        if self.streaming {
            if let Some((end, h)) = self.tail.get().filter(|t| t.0 == seq) {
                let k = out.len().min(h.len()).min(*end as usize);
                let o = out.len();
                out[o - k..].copy_from_slice(&h[h.len() - k..]);
            }
            return;
        }
        let n = self.recs.len() as u64;
        let q = seq - 1;
        self.fill_at(q / n, (q % n) as usize, out);
    }

    /// [`Sequencer::fill`] for the packet at stream position `i` of loop
    /// `lp` (no division): at most two contiguous copies of the stream's
    /// records, timestamps shifted by the loop.
    #[inline]
    pub fn fill_at(&self, lp: u64, i: usize, out: &mut [ScrRecord]) {
        let nh = out.len().min(self.history);
        let n = self.recs.len();
        if nh > n {
            // History longer than the stream (tiny traces): record by record.
            let seq = lp * n as u64 + i as u64 + 1;
            for (j, o) in out[..nh].iter_mut().rev().enumerate() {
                if (j as u64) < seq {
                    *o = self.record(seq - j as u64);
                }
            }
            return;
        }
        let cur = nh.min(i + 1);
        copy_shifted(&self.recs[i + 1 - cur..=i], &mut out[nh - cur..nh], lp.saturating_mul(self.loop_ns));
        if cur < nh && lp > 0 {
            let rest = nh - cur;
            copy_shifted(&self.recs[n - rest..], &mut out[..rest], (lp - 1).saturating_mul(self.loop_ns));
        }
    }
}

/// The loss decision's threshold on a 64-bit hash for `loss_rate` (0: no loss).
fn loss_threshold(loss_rate: f64) -> u64 {
    if loss_rate <= 0.0 {
        0
    } else {
        (loss_rate.min(1.0) * u64::MAX as f64) as u64
    }
}

/// The streaming sequencer's working state, owned by the one core that
/// sees every packet first (a live port's dispatcher): the next sequence
/// number, the sequencer's clock, and the last N records in a ring written
/// twice (slot `p` and `p + N`), so the history of every packet — the N - 1
/// records before it and its own, oldest first — is one contiguous slice.
/// Two record stores and a parse per packet; nothing allocated.
pub struct Stamper {
    seq: Arc<Sequencer>,
    /// Last sequence number given (0: none yet).
    last: u64,
    /// Ring slot of the last record (`(last - 1) % N`).
    at: usize,
    ring: Box<[ScrRecord]>,
    /// The sequencer's clock (ns): a packet's time, never before the previous one's.
    now: u64,
}

impl Stamper {
    /// A stamper for a streaming sequencer ([`Sequencer::streaming`]).
    pub fn new(seq: Arc<Sequencer>) -> Stamper {
        let n = seq.history();
        Stamper { ring: vec![ScrRecord::default(); 2 * n].into_boxed_slice(), last: 0, at: n - 1, now: 0, seq }
    }

    /// The sequencer.
    pub fn sequencer(&self) -> &Arc<Sequencer> {
        &self.seq
    }

    /// Sequence numbers given so far (the last one).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Stamps the next packet (`frame`, received at `ts_ns`): its sequence
    /// number (its history: [`Stamper::history`]).
    #[inline]
    pub fn stamp(&mut self, frame: &[u8], ts_ns: u64) -> u64 {
        let n = self.ring.len() / 2;
        let m = PktMeta::parse(frame);
        let mut r = ScrRecord::from_frame(frame, &m);
        // Receive times of several input queues interleave: the sequencer's clock holds its order.
        self.now = self.now.max(ts_ns);
        r.set_ts_ns(self.now);
        self.last += 1;
        self.at = if self.at + 1 == n { 0 } else { self.at + 1 };
        self.ring[self.at] = r;
        self.ring[self.at + n] = r;
        self.last
    }

    /// The last stamped packet's history: N records, oldest first, its own
    /// last (the slots before sequence 1 hold default records, which no replica reads).
    #[inline(always)]
    pub fn history(&self) -> &[ScrRecord] {
        let n = self.ring.len() / 2;
        &self.ring[self.at + 1..self.at + 1 + n]
    }

    /// The packet of sequence number `seq` is lost between the sequencer and its core (injected).
    #[inline(always)]
    pub fn lost(&self, seq: u64) -> bool {
        self.seq.lost(seq)
    }

    /// The stream has stopped: the last sequence number and its history go
    /// to the sequencer (the replicas catch up to it: [`Sequencer::end`]).
    /// Once; a later call changes nothing.
    pub fn close(&self) {
        let h: Box<[ScrRecord]> = self.history().into();
        let _ = self.seq.tail.set((self.last, h));
    }
}

/// Copies records, adding `shift` to their timestamps (clamped at the
/// latest a record carries, [`ScrRecord::set_ts_ns`]: a long run's times stay in order).
#[inline(always)]
fn copy_shifted(from: &[ScrRecord], to: &mut [ScrRecord], shift: u64) {
    to.copy_from_slice(from);
    if shift > 0 {
        for r in to {
            r.set_ts_ns(r.ts_ns().saturating_add(shift));
        }
    }
}

/// What a queue hands the worker with each burst under SCR.
#[derive(Clone, Copy, Debug)]
pub struct ScrSide<'a> {
    /// Sequence number of each packet of the burst, in batch order.
    pub seqs: &'a [u64],
    /// Each packet's piggybacked history: N records per packet (packet k's
    /// at `k * N ..`), oldest first, the packet's own last.
    pub hist: &'a [ScrRecord],
    /// N.
    pub history: usize,
    /// Cycles the sequencer has spent on this queue so far (stamping, history).
    pub cycles: u64,
    /// The stream's times never go back (a sequencer's clock; a replayed
    /// trace's unless it jumps back): within a history, the times at or
    /// before a bound are a prefix, and a run's earliest and latest times
    /// are its first and last.
    pub monotonic: bool,
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
        let n = self.seq.stream_len();
        self.attach_at(k, (s - 1) / n, ((s - 1) % n) as usize);
    }

    /// Packet `k` of the burst is stream position `i` of loop `lp`: attach its history.
    #[inline(always)]
    pub fn attach_at(&mut self, k: usize, lp: u64, i: usize) {
        let h = self.seq.history();
        if let Some(slot) = self.seqs.get_mut(k) {
            *slot = lp * self.seq.stream_len() + i as u64 + 1;
            self.seq.fill_at(lp, i, &mut self.hist[k * h..(k + 1) * h]);
            self.len = self.len.max(k + 1);
        }
    }

    /// The burst's side arrays.
    pub fn side(&self) -> ScrSide<'_> {
        let h = self.seq.history();
        ScrSide {
            seqs: &self.seqs[..self.len],
            hist: &self.hist[..self.len * h],
            history: h,
            cycles: self.cycles,
            monotonic: self.seq.monotonic,
        }
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
        // Sequence 7 is loop 1, position 1: 5 (loop 0), 6, 7, oldest first.
        s.fill(7, &mut out);
        assert_eq!(out, [s.record(5), s.record(6), s.record(7)]);
        assert_eq!(s.record(6).ts_ns(), t.loop_ns());
        assert!(s.record(7).ts_ns() > s.record(6).ts_ns());
        assert!(s.record(5).ts_ns() < s.record(6).ts_ns());
        // Loop 2 (shifted twice), crossing from loop 1.
        s.fill(12, &mut out);
        assert_eq!(out, [s.record(10), s.record(11), s.record(12)]);
        assert_eq!(s.record(11).ts_ns(), 2 * t.loop_ns());
        // Sequence 1: only itself, last.
        let mut one = [ScrRecord::default(); 3];
        s.fill(1, &mut one);
        assert_eq!(one[2], s.record(1));
        // A history longer than the stream.
        let long = Sequencer::new(&t, 8, 0.0, 1);
        let mut h = [ScrRecord::default(); 8];
        long.fill(9, &mut h);
        assert_eq!(h, std::array::from_fn(|j| long.record(2 + j as u64)));
        let lossy = Sequencer::new(&t, 3, 0.5, 9);
        let lost = (1..=10_000).filter(|&q| lossy.lost(q)).count();
        assert!((4_500..5_500).contains(&lost), "{lost}");
        assert!(!(1..=1000).any(|q| s.lost(q)));
    }

    /// A stamped stream gives what the trace sequencer gives the same
    /// packets (history = the last N records, oldest first), holds its
    /// clock, and leaves its last history for the replicas at the end.
    #[test]
    fn a_stamped_stream_carries_the_same_histories_as_the_trace_sequencer() {
        let frames: Vec<Vec<u8>> = (0..9u8)
            .map(|i| {
                let mut f = vec![0u8; 60];
                f[12] = 0x08;
                f[14] = 0x45;
                f[16..18].copy_from_slice(&46u16.to_be_bytes());
                f[23] = 17;
                f[26..30].copy_from_slice(&[10, 0, 0, i]);
                f
            })
            .collect();
        let mut b = ReplayBuilder::new(1);
        for (i, f) in frames.iter().enumerate() {
            b.push_steered(f, 0, 10 * i as u64, 0).unwrap();
        }
        let t = b.build();
        let trace = Sequencer::new(&t, 4, 0.0, 1);
        let seq = Arc::new(Sequencer::streaming(4, 0.0, 1));
        let mut st = Stamper::new(Arc::clone(&seq));
        assert_eq!(seq.end(), None);
        for (i, f) in frames.iter().enumerate() {
            // Packet 5 arrives with an earlier time (another input queue): the clock holds.
            let ts = if i == 5 { 1 } else { 10 * i as u64 };
            let s = st.stamp(f, ts);
            let h = st.history();
            assert_eq!(s, i as u64 + 1);
            let mut want = [ScrRecord::default(); 4];
            trace.fill(s, &mut want);
            for w in want.iter_mut().filter(|w| **w == trace.record(6)) {
                w.set_ts_ns(40);
            }
            let k = (s as usize).min(4);
            assert_eq!(&h[4 - k..], &want[4 - k..], "sequence {s}");
        }
        st.close();
        assert_eq!(seq.end(), Some(9));
        let mut h = [ScrRecord::default(); 4];
        seq.fill(9, &mut h);
        assert_eq!(h[3], trace.record(9));
        assert_eq!(seq.record(7), trace.record(7));
        assert_eq!(seq.record(6).ts_ns(), 40);
        assert_eq!(seq.record(5), ScrRecord::default(), "older than the tail: unknown");
    }
}

//! Packet trace and capture at the chain's stages (`flowplane ctl trace ...`,
//! `flowplane ctl capture ...`): what a worker records while one is armed.
//!
//! A [`Tap`] sits in a pipeline's [`crate::exec::ExecContext`] only while a
//! trace or a capture is armed (`None` otherwise: the pipeline tests it once
//! per batch, and the executors' stage loops are monomorphised with and
//! without the observation, so a run without one pays that branch only).
//! Every executor calls [`Tap::after`] for a range of packets right after a
//! stage ran them — stage-major executors once per stage and segment,
//! run-to-completion once per stage and packet — and the tap compares each
//! packet's verdict with the one it saw after the previous stage: that
//! difference is the stage's verdict (pass, output port, drop), the same
//! whatever the executor, since every executor runs a packet's stages in
//! chain order and a dropped packet is never touched again.
//!
//! - Trace: the next N packets matching a filter over every worker (a shared
//!   budget: N in total, not per worker), each with its worker, length, time,
//!   parsed 5-tuple and per-stage verdict. The records are allocated when the
//!   trace is armed (N per worker, as one worker may see them all); the data
//!   path fills them in place.
//! - Capture: packets as they enter the chain (or leave stage `at`), or only
//!   those dropped (at `at`, or at any stage), copied into a per-worker byte
//!   ring read by one writer thread (`flowplane ctl`'s): a full ring drops the
//!   copy and counts it, the worker never waits and never writes a file.
//!
//! Only the root segment of a chain graph is observed (branch NFs are not
//! stages of its executor); `ctl` refuses `--at` for a branch NF.

use std::net::IpAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{tsc, Batch, Verdict, DROP, MAX_BATCH};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::frame::PktMeta;

/// Bytes of a capture record's header in the ring: length captured (u32),
/// length on the wire (u32), packet time in ns (u64).
pub const CAPTURE_HEADER: usize = 16;
/// Longest packet copied whole into a capture (longer ones are cut).
pub const CAPTURE_SNAPLEN: usize = 2048;
/// A stage's verdict slot no packet reached (dropped earlier).
pub const NOT_REACHED: u32 = u32::MAX;

/// Which packets a trace follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFilter {
    /// Every packet.
    Any,
    /// One direction of one flow: protocol, addresses and ports.
    Flow(FiveTuple),
    /// Every packet from one source address.
    Source(IpAddr),
}

impl TraceFilter {
    /// The filter takes a packet parsed as `m` (unparsed packets only match `Any`).
    #[inline]
    pub fn matches(&self, m: &PktMeta) -> bool {
        match self {
            TraceFilter::Any => true,
            TraceFilter::Flow(k) => {
                let t = &m.tuple;
                m.valid
                    && t.proto() == k.proto()
                    && t.src_port() == k.src_port()
                    && t.dst_port() == k.dst_port()
                    && t.src_ip() == k.src_ip()
                    && t.dst_ip() == k.dst_ip()
            }
            TraceFilter::Source(a) => m.valid && m.tuple.src_ip() == *a,
        }
    }
}

/// A trace to arm on every worker: the filter and the packets left to take.
#[derive(Clone, Debug)]
pub struct TraceArm {
    /// Which packets.
    pub filter: TraceFilter,
    /// How many in total (every worker's records are sized for all of them).
    pub count: usize,
    /// Packets still to take, shared by the workers.
    pub left: Arc<AtomicU64>,
}

/// One traced packet as a worker recorded it.
#[derive(Clone, Debug)]
pub struct TraceRecord {
    /// The worker (its input queue).
    pub worker: usize,
    /// Packet time (ns, the packet clock).
    pub ts_ns: u64,
    /// Frame length.
    pub len: u16,
    /// The parsed 5-tuple (None: no flow key).
    pub tuple: Option<FiveTuple>,
    /// The verdict the packet came in with (0, or [`DROP`] when the receive side refused it).
    pub input: Verdict,
    /// Per stage of the root segment: the verdict after it ([`NOT_REACHED`] if dropped before it).
    pub stages: Vec<u32>,
}

/// Per-worker trace state: records preallocated at arming.
struct Trace {
    filter: TraceFilter,
    left: Arc<AtomicU64>,
    /// `records[..used]` are filled; the rest are preallocated.
    records: Vec<TraceRecord>,
    used: usize,
}

/// A capture to arm on every worker.
#[derive(Clone)]
pub struct CaptureArm {
    /// The stage packets are captured after (None: the chain's input).
    pub at: Option<usize>,
    /// Only packets dropped (at `at`, or at any stage when `at` is None).
    pub dropped: bool,
    /// One ring per worker, taken by the worker when it arms (index = worker).
    pub rings: Arc<Mutex<Vec<Option<rtrb::Producer<u8>>>>>,
    /// Copies a full ring refused.
    pub lost: Arc<AtomicU64>,
}

impl std::fmt::Debug for CaptureArm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureArm").field("at", &self.at).field("dropped", &self.dropped).finish()
    }
}

struct Capture {
    at: Option<usize>,
    dropped: bool,
    ring: rtrb::Producer<u8>,
    lost: Arc<AtomicU64>,
}

/// What a worker observes while a trace or a capture is armed.
pub struct Tap {
    trace: Option<Trace>,
    capture: Option<Capture>,
    profile: Option<Profile>,
    /// Per packet of the batch: its verdict after the last stage observed.
    last: [Verdict; MAX_BATCH],
    /// Per packet of the batch: 1 + its trace record, or 0.
    traced: [u16; MAX_BATCH],
    /// Some packet of the batch is traced.
    any_traced: bool,
}

impl Tap {
    fn new() -> Box<Tap> {
        Box::new(Tap {
            trace: None,
            capture: None,
            profile: None,
            last: [0; MAX_BATCH],
            traced: [0; MAX_BATCH],
            any_traced: false,
        })
    }

    /// Arms (or with None disarms) a trace; `stages` is the root segment's stage count. Returns the tap to keep
    /// (None when nothing is armed any more).
    pub fn arm_trace(tap: Option<Box<Tap>>, worker: usize, arm: Option<&TraceArm>, stages: usize) -> Option<Box<Tap>> {
        let mut t = tap.unwrap_or_else(Tap::new);
        t.trace = arm.map(|a| Trace {
            filter: a.filter,
            left: Arc::clone(&a.left),
            records: (0..a.count)
                .map(|_| TraceRecord {
                    worker,
                    ts_ns: 0,
                    len: 0,
                    tuple: None,
                    input: 0,
                    stages: vec![NOT_REACHED; stages],
                })
                .collect(),
            used: 0,
        });
        t.keep()
    }

    /// Arms (or disarms) a capture, taking this worker's ring; the previous capture's ring is dropped (its
    /// writer sees it abandoned).
    pub fn arm_capture(tap: Option<Box<Tap>>, worker: usize, arm: Option<&CaptureArm>) -> Option<Box<Tap>> {
        let mut t = tap.unwrap_or_else(Tap::new);
        t.capture = arm.and_then(|a| {
            let ring = a.rings.lock().ok()?.get_mut(worker)?.take()?;
            Some(Capture { at: a.at, dropped: a.dropped, ring, lost: Arc::clone(&a.lost) })
        });
        t.keep()
    }

    /// Starts (`true`: from zero) or stops the per-NF profile of the root segment's `stages` stages.
    pub fn arm_profile(tap: Option<Box<Tap>>, on: bool, stages: usize) -> Option<Box<Tap>> {
        let mut t = tap.unwrap_or_else(Tap::new);
        t.profile = on.then(|| Profile { last_tsc: 0, stages: vec![StageCost::default(); stages] });
        t.keep()
    }

    /// The per-NF profile so far, if one is running.
    pub fn profile(tap: Option<&Tap>) -> Option<Vec<StageCost>> {
        tap.and_then(|t| t.profile.as_ref()).map(|p| p.stages.clone())
    }

    fn keep(self: Box<Tap>) -> Option<Box<Tap>> {
        (self.trace.is_some() || self.capture.is_some() || self.profile.is_some()).then_some(self)
    }

    /// The records taken so far (control path: copied).
    pub fn records(tap: Option<&Tap>) -> Vec<TraceRecord> {
        tap.and_then(|t| t.trace.as_ref()).map_or_else(Vec::new, |tr| tr.records[..tr.used].to_vec())
    }

    /// A batch parsed into `metas` enters the chain: marks the packets the
    /// trace takes, captures the input when asked.
    pub fn begin(&mut self, batch: &Batch, metas: &[PktMeta]) {
        let n = batch.len();
        if let Some(p) = &mut self.profile {
            // The first stage's cost runs from here: the flow lookup is counted with it.
            p.last_tsc = tsc::rdtsc();
        }
        self.last[..n].copy_from_slice(batch.verdicts());
        self.any_traced = false;
        if let Some(tr) = &mut self.trace {
            self.traced[..n].fill(0);
            for (i, m) in metas[..n].iter().enumerate() {
                if tr.used == tr.records.len() || !tr.filter.matches(m) {
                    continue;
                }
                // One packet from the shared budget (N in total over the workers).
                if tr.left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1)).is_err() {
                    break;
                }
                let r = &mut tr.records[tr.used];
                r.ts_ns = batch.timestamps()[i];
                r.len = batch.lens()[i];
                r.tuple = m.valid.then_some(m.tuple);
                r.input = batch.verdicts()[i];
                r.stages.fill(NOT_REACHED);
                tr.used += 1;
                self.traced[i] = tr.used as u16;
                self.any_traced = true;
            }
        }
        if let Some(c) = &mut self.capture {
            if c.at.is_none() && !c.dropped {
                for i in 0..n {
                    if batch.verdicts()[i] != DROP {
                        push(c, batch, i);
                    }
                }
            }
        }
    }

    /// Stage `si` of the root segment has run packets `range`.
    #[inline]
    pub fn after(&mut self, si: usize, batch: &Batch, range: Range<usize>) {
        let at = self.profile.as_ref().map(|_| tsc::rdtsc());
        let v = batch.verdicts();
        if self.any_traced {
            if let Some(tr) = &mut self.trace {
                for i in range.clone() {
                    let t = self.traced[i];
                    if t != 0 && self.last[i] != DROP {
                        if let Some(s) = tr.records[usize::from(t) - 1].stages.get_mut(si) {
                            *s = u32::from(v[i]);
                        }
                    }
                }
            }
        }
        if let Some(c) = &mut self.capture {
            let here = c.at.is_none_or(|a| a == si);
            if here && (c.dropped || c.at.is_some()) {
                for i in range.clone() {
                    let (was, now) = (self.last[i], v[i]);
                    let take = if c.dropped { was != DROP && now == DROP } else { now != DROP };
                    if take {
                        push(c, batch, i);
                    }
                }
            }
        }
        // Packets that reached the stage: not dropped before it (a batched executor's range spans them too).
        let n =
            if self.profile.is_some() { self.last[range.clone()].iter().filter(|&&x| x != DROP).count() } else { 0 };
        self.last[range.clone()].copy_from_slice(&v[range]);
        if let (Some(p), Some(at)) = (&mut self.profile, at) {
            if let Some(c) = p.stages.get_mut(si) {
                // A call over packets all dropped earlier (rtc observes each packet at every stage) is no call.
                c.calls += u64::from(n > 0);
                c.packets += n as u64;
                c.cycles += at.saturating_sub(p.last_tsc);
            }
            // The tap's own work (trace, capture, this count) is left out of the next stage's cost.
            p.last_tsc = tsc::rdtsc();
        }
    }
}

/// One NF's cost while a profile runs (`flowplane ctl PATH profile start`): the
/// cycles from the previous observation point (the batch's entry into the chain
/// or the previous NF's end) to this NF's end, over the calls that ran it.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StageCost {
    /// Times the executor ran this NF (on a batch, a range of it, or one packet).
    pub calls: u64,
    /// Packets that reached it (not dropped by an earlier NF).
    pub packets: u64,
    /// TSC cycles.
    pub cycles: u64,
}

/// Per-worker profile state: the root segment's stages' costs.
struct Profile {
    last_tsc: u64,
    stages: Vec<StageCost>,
}

/// Copies packet `i` into the capture ring, or counts it lost when the ring is full.
fn push(c: &mut Capture, batch: &Batch, i: usize) {
    let data = batch.data(i);
    let cap = data.len().min(CAPTURE_SNAPLEN);
    if c.ring.slots() < CAPTURE_HEADER + cap {
        c.lost.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut h = [0u8; CAPTURE_HEADER];
    h[0..4].copy_from_slice(&(cap as u32).to_le_bytes());
    h[4..8].copy_from_slice(&(data.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&batch.timestamps()[i].to_le_bytes());
    // This worker is the ring's only producer: the room checked above stays.
    if c.ring.push_entire_slice(&h).is_err() || c.ring.push_entire_slice(&data[..cap]).is_err() {
        c.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// The writer's side of one worker's ring: the next whole record, if one is there.
pub fn pop_record(ring: &mut rtrb::Consumer<u8>, out: &mut Vec<u8>) -> Option<(u64, u32)> {
    if ring.slots() < CAPTURE_HEADER {
        return None;
    }
    let mut h = [0u8; CAPTURE_HEADER];
    {
        let chunk = ring.read_chunk(CAPTURE_HEADER).ok()?;
        let (a, b) = chunk.as_slices();
        h[..a.len()].copy_from_slice(a);
        h[a.len()..].copy_from_slice(b);
        // Not committed: the record is taken whole below, once its bytes are all there.
    }
    let cap = u32::from_le_bytes(h[0..4].try_into().ok()?) as usize;
    let orig = u32::from_le_bytes(h[4..8].try_into().ok()?);
    let ts = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let chunk = ring.read_chunk(CAPTURE_HEADER + cap).ok()?;
    let (a, b) = chunk.as_slices();
    out.clear();
    out.extend(a.iter().chain(b).skip(CAPTURE_HEADER));
    chunk.commit_all();
    Some((ts, orig))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::{PacketPool, PoolConfig};

    fn frame(dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&46u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&4000u16.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[38..40].copy_from_slice(&26u16.to_be_bytes());
        f
    }

    /// Verdicts observed stage by stage become per-stage verdicts and captures, and a capture ring
    /// hands its records to the writer whole.
    #[test]
    fn stage_verdicts_and_captures_follow_the_verdict_changes() {
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..PoolConfig::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut metas = vec![PktMeta::default(); 4];
        for (i, d) in [5001u16, 5002, 5001, 5003].into_iter().enumerate() {
            assert!(batch.push_copy(&mut pool, &frame(d), 100 + i as u64));
            metas[i].parse_into(batch.data(i));
        }
        let key = metas[0].tuple;
        let arm = TraceArm { filter: TraceFilter::Flow(key), count: 5, left: Arc::new(AtomicU64::new(5)) };
        let tap = Tap::arm_trace(None, 3, Some(&arm), 2);
        let (p, mut c) = rtrb::RingBuffer::new(4096);
        let lost = Arc::new(AtomicU64::new(0));
        let carm = CaptureArm { at: None, dropped: true, rings: Arc::new(Mutex::new(vec![None, Some(p)])), lost };
        let mut tap = Tap::arm_capture(tap, 1, Some(&carm)).unwrap();
        tap.begin(&batch, &metas);
        assert_eq!(arm.left.load(Ordering::Relaxed), 3, "two packets of the flow taken");
        // Stage 0 drops packet 2 (the flow's second), stage 1 sends packet 0 to port 1 and drops packet 3.
        batch.drop_packet(2);
        tap.after(0, &batch, 0..4);
        batch.verdicts_mut()[0] = 1;
        batch.drop_packet(3);
        tap.after(1, &batch, 0..2);
        tap.after(1, &batch, 2..4);
        let recs = Tap::records(Some(&tap));
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].ts_ns, recs[0].stages.clone()), (100, vec![0, 1]));
        assert_eq!((recs[1].ts_ns, recs[1].stages.clone()), (102, vec![u32::from(DROP), NOT_REACHED]));
        let mut out = Vec::new();
        let got: Vec<u64> = std::iter::from_fn(|| pop_record(&mut c, &mut out).map(|r| r.0)).collect();
        assert_eq!(got, [102, 103], "drops anywhere, in the order they happened");
        assert_eq!(out, frame(5003));
        assert!(Tap::arm_capture(Some(tap), 1, None).is_some(), "the trace stays armed");
        batch.free_all(&mut pool).unwrap();
    }
}

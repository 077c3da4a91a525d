//! Packet trace and capture at the chain's stages (`flowplane ctl trace ...`,
//! `flowplane ctl capture ...`): what a worker records while one is armed.
//!
//! A [`Tap`] sits in a pipeline's [`crate::exec::ExecContext`] only while a
//! trace, a capture or a profile is armed (`None` otherwise: the pipeline
//! tests it once per batch, and the executors' stage loops are
//! monomorphised with and without the observation, so a run without one pays
//! that branch only). Every executor calls [`Tap::after`] for a range of
//! packets right after a stage ran them — stage-major executors once per
//! stage and segment, run-to-completion once per stage and packet — and the
//! tap compares each packet's verdict with the one it came to the stage
//! with: that difference is the stage's verdict (pass, output port, drop),
//! the same whatever the executor, since every executor runs a packet's
//! stages in chain order and a dropped packet is never touched again.
//!
//! - Trace: the next N packets matching a filter over every worker (a shared
//!   budget: N in total, not per worker), each with its worker, length, time,
//!   parsed 5-tuple, the branch it took, and per NF its verdict and its state
//!   for the packet's flow before and after the NF ran it (the bytes are
//!   copied on the data path into buffers allocated when the trace is armed,
//!   and shown as `show flow` shows them when the trace is read). The records
//!   are allocated when the trace is armed (N per worker, as one worker may
//!   see them all); the data path fills them in place.
//! - Capture: packets as they enter the chain (or leave stage `at`), or only
//!   those dropped (at `at`, or at any stage), copied into a per-worker byte
//!   ring read by one writer thread (`flowplane ctl`'s): a full ring drops the
//!   copy and counts it, the worker never waits and never writes a file.
//!
//! Stages are numbered in the spec's flat order (a chain graph's root
//! segment, then each branch depth first, as [`crate::exec::Pipeline::stages`]).
//! The tap follows packets through the graph with a stack of frames: a frame
//! maps the positions of the batch (or sub-batch) being run to the traced
//! records and holds each packet's verdict so far. A branch point entering a
//! branch ([`Tap::enter`]) pushes the frame of its sub-batch (positions
//! remapped by the stable split, the branch's first flat stage, its segment
//! number); leaving pops it. A packet dropped and taken back by a `deny`
//! branch comes to the branch's first NF with verdict 0, so a drop there is a
//! drop of its own (a `--dropped` capture with no `--at` takes it again).
//!
//! State before and after, exactly per packet: a stage-major executor runs an
//! NF over a whole batch before the next NF, so the state read after it would
//! include later packets of the same flow. While a trace is armed, a batch
//! holding traced packets therefore runs in consecutive sub-batches, each
//! traced packet alone in its own (the pipeline's `run_chunked`): the states
//! read before its sub-batch (before the flow lookup: a new flow has none)
//! and after each NF are that packet's. Every executor gives the result of
//! packet-by-packet processing by contract, so cutting a batch changes no
//! verdict and no state. Under `--scale scr` the replica runs traced batches
//! packet by packet and reads its own tables the same way.

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
/// A stage of a branch the packet did not take (shown by [`crate::exec::Pipeline::trace_records`]).
pub const NOT_TAKEN: u32 = u32::MAX - 1;
/// Most segments (a graph's root and branches) a trace tells apart.
pub const MAX_SEGMENTS: usize = 64;

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

/// What a pipeline's tap must be sized for (see [`crate::exec::Pipeline`]).
#[derive(Clone, Debug, Default)]
pub struct TapShape {
    /// Per stage in flat order: the bytes of its state (0: keeps none).
    pub state_sizes: Vec<usize>,
    /// Frames the deepest path through the graph needs (a segment and its sub-batches, per level).
    pub frames: usize,
}

/// One NF's state for a traced packet's flow, as `show flow` prints it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateChange {
    /// Before the NF ran the packet (None: the flow had no state there).
    pub before: Option<serde_json::Value>,
    /// After (None: none, e.g. a flow the NF refused).
    pub after: Option<serde_json::Value>,
}

/// How a trace's state bytes are shown: (stage in flat order, the packet's flow, the bytes) to the row
/// `show flow` gives (None: shown as absent).
pub type StateRender<'a> = dyn Fn(usize, &FiveTuple, &[u8]) -> Option<serde_json::Value> + 'a;

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
    /// Per stage (flat order): the verdict after it ([`NOT_REACHED`] if dropped before it,
    /// [`NOT_TAKEN`] in a branch the packet did not take).
    pub stages: Vec<u32>,
    /// Per stage: the verdict the packet came to it with (a `deny` branch's NFs see 0).
    pub entered: Vec<u32>,
    /// The verdict the packet left the chain with (a graph's `port(P)` included).
    pub out: u32,
    /// Segments the packet went through (bit k: segment k, the root is 0; see [`Tap::enter`]).
    pub segments: u64,
    /// The branch it took (`allow`, `allow/x`; empty: none), filled when read.
    pub branch: String,
    /// Per stage: its state change for the packet's flow (None: the stage keeps no state or did not run
    /// the packet), filled when read.
    pub state: Vec<Option<StateChange>>,
}

/// One stage's state bytes for a traced packet (buffers sized at arming).
#[derive(Clone, Debug, Default)]
struct RawState {
    before: Vec<u8>,
    after: Vec<u8>,
    /// Bit 0: before read, bit 1: after read.
    read: u8,
    /// Bit 0: there was state before, bit 1: after.
    had: u8,
}

/// Per-worker trace state: records preallocated at arming.
struct Trace {
    filter: TraceFilter,
    left: Arc<AtomicU64>,
    /// `records[..used]` are filled; the rest are preallocated.
    records: Vec<TraceRecord>,
    /// Per record, per stage: the state bytes.
    raw: Vec<Vec<RawState>>,
    used: usize,
}

/// A capture to arm on every worker.
#[derive(Clone)]
pub struct CaptureArm {
    /// The stage (flat order) packets are captured after (None: the chain's input).
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

/// The positions of one batch or sub-batch being run: which traced record each packet is, its verdict so far.
struct Frame {
    /// Per packet: its verdict after the last stage observed.
    last: [Verdict; MAX_BATCH],
    /// Per packet: 1 + its trace record, or 0.
    traced: [u16; MAX_BATCH],
    /// Some packet is traced.
    any: bool,
    /// Flat index of the segment's first stage.
    offset: usize,
    /// The segment's number.
    seg: usize,
}

impl Frame {
    fn new() -> Frame {
        Frame { last: [0; MAX_BATCH], traced: [0; MAX_BATCH], any: false, offset: 0, seg: 0 }
    }
}

/// What a worker observes while a trace, a capture or a profile is armed.
pub struct Tap {
    trace: Option<Trace>,
    capture: Option<Capture>,
    profile: Option<Profile>,
    /// `frames[depth]` is the batch being run; deeper frames are preallocated.
    frames: Vec<Frame>,
    depth: usize,
}

impl Tap {
    fn new(frames: usize) -> Box<Tap> {
        Box::new(Tap {
            trace: None,
            capture: None,
            profile: None,
            frames: (0..frames.max(2)).map(|_| Frame::new()).collect(),
            depth: 0,
        })
    }

    fn with(tap: Option<Box<Tap>>, shape: &TapShape) -> Box<Tap> {
        let mut t = tap.unwrap_or_else(|| Tap::new(shape.frames));
        while t.frames.len() < shape.frames {
            t.frames.push(Frame::new());
        }
        t
    }

    /// Arms (or with None disarms) a trace sized for `shape`. Returns the tap to keep (None when nothing is
    /// armed any more).
    pub fn arm_trace(
        tap: Option<Box<Tap>>,
        worker: usize,
        arm: Option<&TraceArm>,
        shape: &TapShape,
    ) -> Option<Box<Tap>> {
        let mut t = Tap::with(tap, shape);
        let stages = shape.state_sizes.len();
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
                    entered: vec![0; stages],
                    out: 0,
                    segments: 0,
                    branch: String::new(),
                    state: Vec::new(),
                })
                .collect(),
            raw: (0..a.count)
                .map(|_| {
                    shape
                        .state_sizes
                        .iter()
                        .map(|&n| RawState { before: vec![0; n], after: vec![0; n], read: 0, had: 0 })
                        .collect()
                })
                .collect(),
            used: 0,
        });
        t.keep()
    }

    /// Arms (or disarms) a capture, taking this worker's ring; the previous capture's ring is dropped (its
    /// writer sees it abandoned).
    pub fn arm_capture(
        tap: Option<Box<Tap>>,
        worker: usize,
        arm: Option<&CaptureArm>,
        shape: &TapShape,
    ) -> Option<Box<Tap>> {
        let mut t = Tap::with(tap, shape);
        t.capture = arm.and_then(|a| {
            let ring = a.rings.lock().ok()?.get_mut(worker)?.take()?;
            Some(Capture { at: a.at, dropped: a.dropped, ring, lost: Arc::clone(&a.lost) })
        });
        t.keep()
    }

    /// Starts (`true`: from zero) or stops the per-NF profile of the stages `shape` counts.
    pub fn arm_profile(tap: Option<Box<Tap>>, on: bool, shape: &TapShape) -> Option<Box<Tap>> {
        let mut t = Tap::with(tap, shape);
        t.profile = on.then(|| Profile { last_tsc: 0, stages: vec![StageCost::default(); shape.state_sizes.len()] });
        t.keep()
    }

    /// The per-NF profile so far, if one is running.
    pub fn profile(tap: Option<&Tap>) -> Option<Vec<StageCost>> {
        tap.and_then(|t| t.profile.as_ref()).map(|p| p.stages.clone())
    }

    fn keep(self: Box<Tap>) -> Option<Box<Tap>> {
        (self.trace.is_some() || self.capture.is_some() || self.profile.is_some()).then_some(self)
    }

    /// The records taken so far (control path: copied), each stage's state bytes shown by `render(stage,
    /// flow, bytes)` (None: shown as absent).
    pub fn records(tap: Option<&Tap>, render: &StateRender<'_>) -> Vec<TraceRecord> {
        let Some(tr) = tap.and_then(|t| t.trace.as_ref()) else { return Vec::new() };
        tr.records[..tr.used]
            .iter()
            .zip(&tr.raw)
            .map(|(r, raw)| {
                let mut r = r.clone();
                r.state = raw
                    .iter()
                    .enumerate()
                    .map(|(si, s)| {
                        let reached = r.stages.get(si).is_some_and(|&v| v != NOT_REACHED && v != NOT_TAKEN);
                        let key = r.tuple.as_ref()?;
                        if s.read == 0 || !reached {
                            return None;
                        }
                        let show = |bit: u8, b: &[u8]| if s.had & bit != 0 { render(si, key, b) } else { None };
                        Some(StateChange { before: show(1, &s.before), after: show(2, &s.after) })
                    })
                    .collect();
                r
            })
            .collect()
    }

    /// Frames deep: 0 while the root segment's batch runs.
    #[inline]
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// A trace is armed (so batches holding traced packets run cut, see the module doc).
    #[inline]
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Some packet of the batch being run is traced.
    #[inline]
    pub fn any_traced(&self) -> bool {
        self.frames[self.depth].any
    }

    /// Packet `i` of the batch being run is traced.
    #[inline]
    pub fn is_traced(&self, i: usize) -> bool {
        self.frames[self.depth].traced[i] != 0
    }

    /// A batch parsed into `metas` enters the chain (the root segment, frame 0): marks the packets the
    /// trace takes, captures the input when asked.
    pub fn begin(&mut self, batch: &Batch, metas: &[PktMeta]) {
        let n = batch.len();
        if let Some(p) = &mut self.profile {
            // The first stage's cost runs from here: the flow lookup is counted with it.
            p.last_tsc = tsc::rdtsc();
        }
        self.depth = 0;
        let f = &mut self.frames[0];
        f.offset = 0;
        f.seg = 0;
        f.last[..n].copy_from_slice(batch.verdicts());
        f.any = false;
        if let Some(tr) = &mut self.trace {
            f.traced[..n].fill(0);
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
                r.out = u32::from(r.input);
                r.segments = 1;
                r.stages.fill(NOT_REACHED);
                for s in &mut tr.raw[tr.used] {
                    s.read = 0;
                    s.had = 0;
                }
                tr.used += 1;
                f.traced[i] = tr.used as u16;
                f.any = true;
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

    /// The sub-batch `part` of the batch being run starts: the packets whose `lanes` entry is `lane`, in
    /// order (a stable split). `offset` and `seg` are the sub-batch's first stage and segment number
    /// relative to the current segment's (0 and 0: a cut of the same segment, see the module doc).
    /// Returns false (nothing entered) when the frames run out.
    pub fn enter(&mut self, offset: usize, seg: usize, lane: u8, lanes: &[u8], part: &Batch) -> bool {
        if self.depth + 1 >= self.frames.len() {
            return false;
        }
        let (lo, hi) = self.frames.split_at_mut(self.depth + 1);
        let (parent, child) = (&lo[self.depth], &mut hi[0]);
        child.offset = parent.offset + offset;
        child.seg = parent.seg + seg;
        child.any = false;
        let mut k = 0;
        for (i, &l) in lanes.iter().enumerate() {
            if l == lane && k < MAX_BATCH {
                let t = parent.traced[i];
                child.traced[k] = t;
                if t != 0 {
                    child.any = true;
                    if let Some(tr) = &mut self.trace {
                        if child.seg < MAX_SEGMENTS {
                            tr.records[usize::from(t) - 1].segments |= 1 << child.seg;
                        }
                    }
                }
                k += 1;
            }
        }
        let n = part.len().min(k);
        child.last[..n].copy_from_slice(&part.verdicts()[..n]);
        self.depth += 1;
        if let Some(p) = &mut self.profile {
            // The split is the branch point's cost, not the next NF's.
            p.last_tsc = tsc::rdtsc();
        }
        true
    }

    /// The sub-batch [`Tap::enter`] started is done.
    pub fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    /// The batch leaves the chain (the root frame): each traced packet's final verdict.
    pub fn finish(&mut self, batch: &Batch) {
        if self.depth != 0 || !self.frames[0].any {
            return;
        }
        if let Some(tr) = &mut self.trace {
            let f = &self.frames[0];
            for (i, &v) in batch.verdicts().iter().enumerate() {
                let t = f.traced[i];
                if t != 0 {
                    tr.records[usize::from(t) - 1].out = u32::from(v);
                }
            }
        }
    }

    /// Packet `i`'s buffer for stage `si`'s (segment-relative) state before (`after` false) or after it
    /// ran, if the packet is traced and the stage keeps state; the caller copies the state in and marks
    /// with [`StateSlot::set`] whether there was any.
    #[inline]
    pub fn state_slot(&mut self, i: usize, si: usize, after: bool) -> Option<StateSlot<'_>> {
        let f = &self.frames[self.depth];
        let t = usize::from(*f.traced.get(i)?);
        let tr = self.trace.as_mut()?;
        if t == 0 {
            return None;
        }
        let flat = f.offset + si;
        if after && tr.records[t - 1].stages.get(flat).is_none_or(|&v| v == NOT_REACHED) {
            // The stage did not run the packet (dropped before it).
            return None;
        }
        let s = tr.raw[t - 1].get_mut(flat)?;
        if s.before.is_empty() {
            return None;
        }
        Some(StateSlot { s, bit: if after { 2 } else { 1 } })
    }

    /// Stage `si` of the current segment has run packets `range`.
    #[inline]
    pub fn after(&mut self, si: usize, batch: &Batch, range: Range<usize>) {
        let at = self.profile.as_ref().map(|_| tsc::rdtsc());
        let v = batch.verdicts();
        let f = &mut self.frames[self.depth];
        let flat = f.offset + si;
        if f.any {
            if let Some(tr) = &mut self.trace {
                for i in range.clone() {
                    let t = f.traced[i];
                    if t != 0 && f.last[i] != DROP {
                        let r = &mut tr.records[usize::from(t) - 1];
                        if let (Some(s), Some(e)) = (r.stages.get_mut(flat), r.entered.get_mut(flat)) {
                            *s = u32::from(v[i]);
                            *e = u32::from(f.last[i]);
                        }
                    }
                }
            }
        }
        if let Some(c) = &mut self.capture {
            let here = c.at.is_none_or(|a| a == flat);
            if here && (c.dropped || c.at.is_some()) {
                for i in range.clone() {
                    let (was, now) = (f.last[i], v[i]);
                    let take = if c.dropped { was != DROP && now == DROP } else { now != DROP };
                    if take {
                        push(c, batch, i);
                    }
                }
            }
        }
        // Packets that reached the stage: not dropped before it (a batched executor's range spans them too).
        let n = if self.profile.is_some() { f.last[range.clone()].iter().filter(|&&x| x != DROP).count() } else { 0 };
        f.last[range.clone()].copy_from_slice(&v[range]);
        if let (Some(p), Some(at)) = (&mut self.profile, at) {
            if let Some(c) = p.stages.get_mut(flat) {
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

/// Where one stage's state for a traced packet goes (see [`Tap::state_slot`]).
pub struct StateSlot<'a> {
    s: &'a mut RawState,
    bit: u8,
}

impl StateSlot<'_> {
    /// The buffer (the stage's state size) to copy the state into.
    #[inline]
    pub fn buf(&mut self) -> &mut [u8] {
        if self.bit == 1 {
            &mut self.s.before
        } else {
            &mut self.s.after
        }
    }

    /// Marks the read done: `had` whether the flow had state there (the buffer holds it).
    #[inline]
    pub fn set(self, had: bool) {
        self.s.read |= self.bit;
        if had {
            self.s.had |= self.bit;
        } else {
            self.s.had &= !self.bit;
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
        let shape = TapShape { state_sizes: vec![0, 0, 0], frames: 3 };
        let tap = Tap::arm_trace(None, 3, Some(&arm), &shape);
        let (p, mut c) = rtrb::RingBuffer::new(4096);
        let lost = Arc::new(AtomicU64::new(0));
        let carm = CaptureArm { at: None, dropped: true, rings: Arc::new(Mutex::new(vec![None, Some(p)])), lost };
        let mut tap = Tap::arm_capture(tap, 1, Some(&carm), &shape).unwrap();
        tap.begin(&batch, &metas);
        assert_eq!(arm.left.load(Ordering::Relaxed), 3, "two packets of the flow taken");
        // Stage 0 drops packet 2 (the flow's second), stage 1 sends packet 0 to port 1 and drops packet 3.
        batch.drop_packet(2);
        tap.after(0, &batch, 0..4);
        batch.verdicts_mut()[0] = 1;
        batch.drop_packet(3);
        tap.after(1, &batch, 0..2);
        tap.after(1, &batch, 2..4);
        // A branch (stage 2, segment 1) takes packets 0 and 1 (lane 1): packet 0 is its first packet.
        let lanes = [1u8, 1, 0, 0];
        let mut parts = [batch.sibling(), batch.sibling()];
        batch.split_into(&lanes, &mut parts).unwrap();
        assert!(tap.enter(2, 1, 1, &lanes, &parts[1]));
        parts[1].drop_packet(0);
        tap.after(0, &parts[1], 0..2);
        tap.leave();
        batch.join_from(&lanes, &mut parts).unwrap();
        assert!(parts.iter().all(|p| p.is_empty()));
        tap.finish(&batch);
        let recs = Tap::records(Some(&tap), &|_, _, _| None);
        assert_eq!(recs.len(), 2);
        let d = u32::from(DROP);
        assert_eq!((recs[0].ts_ns, recs[0].stages.clone()), (100, vec![0, 1, d]));
        assert_eq!((recs[0].entered.clone(), recs[0].out, recs[0].segments), (vec![0, 0, 1], d, 0b11));
        assert_eq!((recs[1].ts_ns, recs[1].stages.clone()), (102, vec![d, NOT_REACHED, NOT_REACHED]));
        assert_eq!(recs[1].segments, 1);
        let mut out = Vec::new();
        let got: Vec<u64> = std::iter::from_fn(|| pop_record(&mut c, &mut out).map(|r| r.0)).collect();
        assert_eq!(got, [102, 103, 100], "drops anywhere (a branch's too), in the order they happened");
        assert_eq!(out, frame(5001));
        assert!(Tap::arm_capture(Some(tap), 1, None, &shape).is_some(), "the trace stays armed");
        batch.free_all(&mut pool).unwrap();
    }
}

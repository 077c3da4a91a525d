//! What an NF hands the engine's IPFIX exporter: plain [`ExportRecord`]s
//! (flow records with their counts and packet-clock times, NAT events)
//! pushed into a bounded per-core queue ([`RecordTx`]). The push is one
//! ring write, no allocation, no lock, no formatting; a full queue counts the
//! record as lost and the NF goes on. Encoding and sending are the engine's
//! exporter thread's (`flowplane_engine::ipfix`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_wire::flow::FiveTuple;
pub use flowplane_wire::ipfix::{EndReason, NatEvent};
use flowplane_wire::tcp::TcpFlags;

/// A flow's counts as the NF holds them, at its end or at an active timeout.
/// Counts are the flow's totals so far: the exporter turns them into deltas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowExport {
    /// The flow.
    pub tuple: FiveTuple,
    /// Packets so far.
    pub packets: u64,
    /// Bytes so far.
    pub bytes: u64,
    /// First packet (packet clock, ns).
    pub first_ns: u64,
    /// Last packet.
    pub last_ns: u64,
    /// Why the record is sent.
    pub reason: EndReason,
    /// Where the NF sent the flow (`lb`: its backend), if it rewrote the destination.
    pub post_dst: Option<std::net::IpAddr>,
}

impl FlowExport {
    /// A flow record with its totals so far, not translated.
    pub fn new(tuple: FiveTuple, packets: u64, bytes: u64, first_ns: u64, last_ns: u64, reason: EndReason) -> Self {
        FlowExport { tuple, packets, bytes, first_ns, last_ns, reason, post_dst: None }
    }
}

/// Whether a packet ends its TCP flow (a FIN or RST in its flags): the flow's
/// record then carries [`EndReason::EndOfFlow`] instead of the reason its
/// entry went for (idle expiry, eviction, the run's end; an active-timeout
/// report of the live flow keeps its own).
#[inline]
pub fn tcp_end(pkt: &crate::pkt::Pkt<'_>) -> bool {
    // tcp_flags is None for anything but TCP with its header.
    pkt.tcp_flags().is_some_and(|f| f.0 & (TcpFlags::FIN.0 | TcpFlags::RST.0) != 0)
}

/// The reason a flow's record carries: `reason` unless the flow was seen to
/// end (`ended`: a TCP FIN or RST) and the record is its last.
#[inline]
pub fn end_reason(reason: EndReason, ended: bool) -> EndReason {
    if ended && reason != EndReason::ActiveTimeout {
        EndReason::EndOfFlow
    } else {
        reason
    }
}

/// A NAT44 event (RFC 8158) at packet-clock time `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatExport {
    /// Event.
    pub event: NatEvent,
    /// When (packet clock, ns).
    pub time_ns: u64,
    /// The inside 5-tuple (sessions; the exhausted event's is unused).
    pub inside: Option<FiveTuple>,
    /// Source address after translation.
    pub post_src: std::net::Ipv4Addr,
    /// Source port after translation.
    pub post_sport: u16,
    /// Pool id (addresses exhausted).
    pub pool: u32,
}

/// What a usage rule (a UPF URR) counted on one core since that core's
/// previous record of it (deltas: an active timeout, the rule's removal, the
/// run's end): the exporter sends one record per direction with packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageExport {
    /// The session (SEID).
    pub seid: u64,
    /// The usage rule (URR ID).
    pub urr: u32,
    /// Uplink bytes and packets since the previous record.
    pub ul: (u64, u64),
    /// Downlink bytes and packets since the previous record.
    pub dl: (u64, u64),
    /// When (packet clock, ns).
    pub time_ns: u64,
}

/// One record for the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportRecord {
    /// A flow record.
    Flow(FlowExport),
    /// A NAT event.
    Nat(NatExport),
    /// A usage rule's counts.
    Usage(UsageExport),
}

/// The producer side of one NF's per-core record queue.
pub struct RecordTx {
    ring: rtrb::Producer<ExportRecord>,
    lost: Arc<AtomicU64>,
    /// Set once the workers stopped (the run's end flush): a full queue then waits for room.
    patient: Arc<AtomicBool>,
    /// Ingress interface reported in flow records (the worker's queue).
    pub ingress: u32,
}

impl std::fmt::Debug for RecordTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordTx").field("ingress", &self.ingress).finish()
    }
}

impl RecordTx {
    /// A queue of `capacity` records; `lost` counts the pushes it refused;
    /// once `patient` is set (no worker runs any more) a full queue waits.
    pub fn new(
        capacity: usize,
        lost: Arc<AtomicU64>,
        patient: Arc<AtomicBool>,
        ingress: u32,
    ) -> (Self, rtrb::Consumer<ExportRecord>) {
        let (ring, rx) = rtrb::RingBuffer::new(capacity.max(1));
        (RecordTx { ring, lost, patient, ingress }, rx)
    }

    /// Queues a record; a full queue counts it lost (a worker never waits).
    #[inline]
    pub fn push(&mut self, r: ExportRecord) {
        if let Err(rtrb::PushError::Full(r)) = self.ring.push(r) {
            self.full(r);
        }
    }

    #[cold]
    fn full(&mut self, r: ExportRecord) {
        if self.patient.load(Ordering::Relaxed) {
            // The run's end: the exporter drains while the last records come; give up after a second without room.
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_secs(1) {
                if self.ring.push(r).is_ok() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        self.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// A queue for unit tests: the NF's side and the records it pushed.
#[cfg(test)]
pub(crate) fn test_queue() -> (RecordTx, rtrb::Consumer<ExportRecord>) {
    RecordTx::new(1024, Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)), 0)
}

/// The flow records waiting in a test queue.
#[cfg(test)]
pub(crate) fn flows(rx: &mut rtrb::Consumer<ExportRecord>) -> Vec<FlowExport> {
    let mut v = Vec::new();
    while let Ok(r) = rx.pop() {
        if let ExportRecord::Flow(f) = r {
            v.push(f);
        }
    }
    v
}

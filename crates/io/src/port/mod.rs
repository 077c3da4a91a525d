//! Real ports: one abstraction over every backend (AF_PACKET, AF_XDP where
//! libxdp was found at build time; DPDK plugs in behind the same traits), named the same way everywhere:
//! `pcap:FILE | afpacket:IFACE | afxdp:IFACE[:QUEUE] | dpdk:PORT_OR_VDEV`
//! (a bare path is a pcap file).
//!
//! A [`Port`] is opened once for N queues (one RX/TX queue pair per worker);
//! each worker opens its own [`RxQueue`] and [`TxQueue`] on its own thread.
//! [`PortSource`] makes an RX queue an [`crate::Source`]; [`PortSink`]
//! transmits a batch to the port each packet's verdict names (the chain's
//! `Action::Port`), one pass and one system call per port per batch, then
//! frees every buffer. Counters are per queue, in atomics the queue owner
//! writes once per burst, so a status line or a metrics scrape reads them
//! while the run goes on. Every packet lost is counted by reason: RX ring
//! overrun (the kernel's ring was full), pool exhaustion, TX full, no such
//! output port. A port on a Linux interface also has a [`LinkWatch`]: the
//! run's control loop polls it (interface gone, link down/up, re-created)
//! and the queues re-attach to a re-created interface by themselves.
//!
//! The system calls and the mmap'ed rings are this module's `unsafe`, each
//! block with its `// SAFETY:` argument.

pub mod afpacket;
#[cfg(fp_afxdp)]
pub mod afxdp;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod fanout_steer;
pub mod link;
pub mod netns;
pub mod peer;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_packet::{Batch, PacketPool, Verdict, DROP};

pub use link::{LinkState, LinkStats, LinkWatch};

/// Detaches the XDP programs this process attached (none without AF_XDP support): for an
/// exit that skips the ports' destructors (ports dropped after it block). Returns how many
/// were removed.
pub fn release_xdp_programs() -> usize {
    #[cfg(fp_afxdp)]
    {
        afxdp::release_programs()
    }
    #[cfg(not(fp_afxdp))]
    {
        0
    }
}

use crate::sink::SharedPcapWriter;
use crate::{Rx, RxStats, Sink, Source, TxCounters};

/// How a port is named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSpec {
    /// A pcap/pcapng file (`pcap:FILE` or a bare path).
    Pcap(PathBuf),
    /// A Linux interface through AF_PACKET (TPACKET_V3 RX ring, sendmmsg TX).
    AfPacket {
        /// Interface name.
        iface: String,
    },
    /// A Linux interface queue through AF_XDP.
    AfXdp {
        /// Interface name.
        iface: String,
        /// First queue (worker i uses queue + i).
        queue: u32,
    },
    /// A DPDK port id or vdev string.
    Dpdk(String),
}

impl PortSpec {
    /// Parses `pcap:FILE | afpacket:IFACE | afxdp:IFACE[:QUEUE] | dpdk:PORT_OR_VDEV`; anything
    /// without a known scheme is a pcap file path.
    pub fn parse(s: &str) -> Result<PortSpec, PortError> {
        let bad = |why: &str| PortError::Spec(format!("{s}: {why}"));
        let iface = |name: &str| -> Result<String, PortError> {
            if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', ':']) {
                return Err(bad("expected an interface name (1-15 characters, no '/', ':' or space)"));
            }
            Ok(name.to_string())
        };
        if let Some(rest) = s.strip_prefix("pcap:") {
            if rest.is_empty() {
                return Err(bad("expected pcap:FILE"));
            }
            return Ok(PortSpec::Pcap(PathBuf::from(rest)));
        }
        if let Some(rest) = s.strip_prefix("afpacket:") {
            return Ok(PortSpec::AfPacket { iface: iface(rest)? });
        }
        if let Some(rest) = s.strip_prefix("afxdp:") {
            let (name, q) = match rest.split_once(':') {
                Some((n, q)) => (n, q.parse::<u32>().map_err(|_| bad("queue must be a number"))?),
                None => (rest, 0),
            };
            return Ok(PortSpec::AfXdp { iface: iface(name)?, queue: q });
        }
        if let Some(rest) = s.strip_prefix("dpdk:") {
            if rest.is_empty() {
                return Err(bad("expected dpdk:PORT_ID or dpdk:VDEV"));
            }
            return Ok(PortSpec::Dpdk(rest.to_string()));
        }
        if s.is_empty() {
            return Err(bad("empty port"));
        }
        Ok(PortSpec::Pcap(PathBuf::from(s)))
    }

    /// True for a live port (not a file).
    pub fn is_live(&self) -> bool {
        !matches!(self, PortSpec::Pcap(_))
    }
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSpec::Pcap(p) => write!(f, "pcap:{}", p.display()),
            PortSpec::AfPacket { iface } => write!(f, "afpacket:{iface}"),
            PortSpec::AfXdp { iface, queue } => write!(f, "afxdp:{iface}:{queue}"),
            PortSpec::Dpdk(d) => write!(f, "dpdk:{d}"),
        }
    }
}

/// Why a port could not be opened or used.
#[derive(Debug)]
pub enum PortError {
    /// The port name is malformed.
    Spec(String),
    /// A system call failed (what was being done, the OS error).
    Os(String, std::io::Error),
    /// The backend is not built into this binary or not usable here.
    Unsupported(String),
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortError::Spec(s) => write!(f, "port {s}"),
            PortError::Os(what, e) => write!(f, "{what}: {e}"),
            PortError::Unsupported(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for PortError {}

/// Options for opening a live port.
#[derive(Clone, Copy, Debug)]
pub struct PortOptions {
    /// Put the interface in promiscuous mode while the port is open.
    pub promisc: bool,
    /// RX ring bytes per queue (AF_PACKET: blocks of `block_size`).
    pub ring_bytes: usize,
    /// Bytes per RX ring block (AF_PACKET TPACKET_V3).
    pub block_size: usize,
    /// A block is handed to user space after this many ms even if not full.
    pub block_timeout_ms: u32,
    /// Buffers per queue a device allocates itself (DPDK mbufs per queue).
    pub buffers: usize,
}

/// Defaults: an AF_PACKET RX ring of 256 blocks of 64 KiB (a block is handed
/// over when full or after 1 ms, so many small blocks ride out a worker's
/// scheduling gaps at low rates: ~256 ms at 1 ms per block).
impl Default for PortOptions {
    fn default() -> Self {
        PortOptions { promisc: false, ring_bytes: 16 << 20, block_size: 1 << 16, block_timeout_ms: 1, buffers: 8191 }
    }
}

/// One queue's counters, written by the queue's worker once per burst and
/// read by anyone (status line, metrics) at any time.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Packets received.
    pub rx_packets: AtomicU64,
    /// Bytes received.
    pub rx_bytes: AtomicU64,
    /// Packets the kernel/device dropped because the RX ring was full.
    pub rx_overrun: AtomicU64,
    /// Packets received but dropped because the pool had no buffer.
    pub rx_pool_empty: AtomicU64,
    /// Packets received too large for a buffer (dropped).
    pub rx_oversize: AtomicU64,
    /// Packets transmitted.
    pub tx_packets: AtomicU64,
    /// Bytes transmitted.
    pub tx_bytes: AtomicU64,
    /// Packets the TX ring/socket had no room for (dropped).
    pub tx_full: AtomicU64,
    /// Packets the device refused with an error (dropped).
    pub tx_errors: AtomicU64,
}

impl QueueCounters {
    /// Adds `n` to a counter (one writer per queue: a plain load + store).
    #[inline(always)]
    pub fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }

    /// A snapshot.
    pub fn snapshot(&self) -> PortStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PortStats {
            rx_packets: l(&self.rx_packets),
            rx_bytes: l(&self.rx_bytes),
            rx_overrun: l(&self.rx_overrun),
            rx_pool_empty: l(&self.rx_pool_empty),
            rx_oversize: l(&self.rx_oversize),
            tx_packets: l(&self.tx_packets),
            tx_bytes: l(&self.tx_bytes),
            tx_full: l(&self.tx_full),
            tx_errors: l(&self.tx_errors),
        }
    }
}

/// A port's (or queue's) counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Dropped by the device: RX ring full.
    pub rx_overrun: u64,
    /// Dropped at receive: packet pool empty.
    pub rx_pool_empty: u64,
    /// Dropped at receive: larger than a buffer.
    pub rx_oversize: u64,
    /// Packets transmitted.
    pub tx_packets: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Dropped at transmit: ring full.
    pub tx_full: u64,
    /// Dropped at transmit: device error.
    pub tx_errors: u64,
}

impl PortStats {
    /// Adds another queue's counters.
    pub fn merge(&mut self, o: &PortStats) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_overrun += o.rx_overrun;
        self.rx_pool_empty += o.rx_pool_empty;
        self.rx_oversize += o.rx_oversize;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_full += o.tx_full;
        self.tx_errors += o.tx_errors;
    }
}

/// A live port opened for `queues()` queue pairs.
pub trait Port: Send + Sync {
    /// The port's name (as given).
    fn name(&self) -> String;
    /// Queue pairs (one per worker).
    fn queues(&self) -> usize;
    /// Opens RX queue `q` (on the worker thread that will poll it).
    fn open_rx(&self, q: usize) -> Result<Box<dyn RxQueue>, PortError>;
    /// Opens RX queue `q` for a worker whose buffers are `pool`'s: a device
    /// that writes into the pool itself (AF_XDP's UMEM) registers its region
    /// and lends it buffers now. Default: [`Port::open_rx`] (a copying device).
    fn open_rx_into(&self, q: usize, pool: &mut PacketPool) -> Result<Box<dyn RxQueue>, PortError> {
        let _ = pool;
        self.open_rx(q)
    }
    /// Steers received frames to the RX queues in the kernel with `steer`
    /// (queue `i` = worker `i`), before any RX queue is opened. Only
    /// AF_PACKET ports can ([`fanout_steer`]); the others say why not.
    fn steer_in_kernel(&self, steer: Arc<fanout_steer::KernelSteer>) -> Result<(), PortError> {
        let _ = steer;
        Err(PortError::Spec(format!("{}: kernel steering is for AF_PACKET ports", self.name())))
    }
    /// Opens TX queue `q`.
    fn open_tx(&self, q: usize) -> Result<Box<dyn TxQueue>, PortError>;
    /// Per-queue counters (live).
    fn counters(&self) -> &[Arc<QueueCounters>];
    /// The interface's watch (a Linux interface), polled by the run's control loop.
    fn link(&self) -> Option<&LinkWatch> {
        None
    }
    /// The port's counters summed over its queues.
    fn stats(&self) -> PortStats {
        let mut s = PortStats::default();
        for q in self.counters() {
            s.merge(&q.snapshot());
        }
        s
    }
}

/// One receive queue, polled by one worker.
pub trait RxQueue: Send {
    /// Appends up to `max` received packets (copied or lent into `pool`'s
    /// buffers) to `batch`; their timestamps are receive times in ns after
    /// the port was opened.
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize;

    /// [`RxQueue::rx_burst`] given the caller's TSC reading for this burst
    /// (the worker's): a queue that stamps a burst with one time takes it
    /// from there rather than reading the clock again. Default: `rx_burst`.
    fn rx_burst_at(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now_tsc: u64) -> usize {
        let _ = now_tsc;
        self.rx_burst(pool, batch, max)
    }

    /// The queue's receive clock now, in its timestamps' units (ns after the port was
    /// opened): an idle worker advances its timers to it. None: the queue has no clock.
    fn clock_ns(&self) -> Option<u64> {
        None
    }

    /// [`RxQueue::rx_burst`] asking `gate` about each frame first (its bytes as the
    /// worker will see them, its receive time in ns since the Unix epoch): `false`
    /// leaves that frame, and what follows it, in the queue for a later burst.
    /// Default: no gate (a queue that cannot hold frames back).
    fn rx_burst_gated(
        &mut self,
        pool: &mut PacketPool,
        batch: &mut Batch,
        max: usize,
        gate: &mut dyn FnMut(&[u8], u64) -> bool,
    ) -> usize {
        let _ = gate;
        self.rx_burst(pool, batch, max)
    }
}

/// One transmit queue, fed by one worker.
pub trait TxQueue: Send {
    /// Transmits the live packets of `batch` whose verdict is `port`
    /// (the batch keeps its buffers: the caller frees them). Returns
    /// (sent, bytes, dropped for lack of room or by a device error).
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64);

    /// Transmits every live packet of `batch` in place by lending its buffers
    /// to the device (a DPDK port sending the worker's own mbufs), frees the
    /// dropped ones and empties the batch: (sent, bytes, dropped, tx full).
    /// None — and the batch untouched — when this queue cannot use `pool`'s
    /// buffers; the caller then copies through [`TxQueue::tx_batch`].
    fn tx_lend(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> Option<(u64, u64, u64, u64)> {
        let _ = (pool, batch);
        None
    }
}

/// Ties an RX queue to the worker's `Source` seam.
pub struct PortSource {
    rx: Box<dyn RxQueue>,
    counters: Arc<QueueCounters>,
}

impl PortSource {
    /// A source over `rx`, reporting through `counters`.
    pub fn new(rx: Box<dyn RxQueue>, counters: Arc<QueueCounters>) -> Self {
        PortSource { rx, counters }
    }
}

impl Source for PortSource {
    #[inline]
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now: u64) -> Rx {
        match self.rx.rx_burst_at(pool, batch, max.min(batch.room()), now) {
            0 => Rx::Idle,
            n => Rx::Packets(n),
        }
    }

    fn clock_ns(&self) -> Option<u64> {
        self.rx.clock_ns()
    }

    fn rx_stats(&self) -> RxStats {
        let s = self.counters.snapshot();
        RxStats {
            packets: s.rx_packets,
            bytes: s.rx_bytes,
            rx_ring_full: s.rx_overrun,
            pool_empty: s.rx_pool_empty,
            ..RxStats::default()
        }
    }
}

/// Transmits each packet on the output port its verdict names, then frees
/// every buffer. Verdicts beyond the last port are counted in `errors`.
pub struct PortSink {
    tx: Vec<Box<dyn TxQueue>>,
    counters: Vec<Arc<QueueCounters>>,
    /// Packets whose verdict named no port (live counter for status/metrics).
    pub no_port: Arc<AtomicU64>,
}

impl PortSink {
    /// A sink over one TX queue per output port (index = verdict).
    pub fn new(tx: Vec<Box<dyn TxQueue>>, counters: Vec<Arc<QueueCounters>>, no_port: Arc<AtomicU64>) -> Self {
        PortSink { tx, counters, no_port }
    }
}

impl Sink for PortSink {
    fn tx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> TxCounters {
        // One output port and every verdict 0 or DROP (one branch-free pass): the device may
        // take the buffers themselves, and the counting pass below is not needed.
        if self.tx.len() == 1 && !batch.verdicts().iter().fold(false, |bad, &v| bad | (v.wrapping_add(1) > 1)) {
            if let Some((sent, bytes, dropped, full)) = self.tx[0].tx_lend(pool, batch) {
                QueueCounters::add(&self.counters[0].tx_packets, sent);
                QueueCounters::add(&self.counters[0].tx_bytes, bytes);
                return TxCounters { sent, bytes, dropped, errors: full };
            }
        }
        let mut c = TxCounters::default();
        // Which ports this batch uses (bit per port; more than 64 ports: scan all).
        let mut used = 0u64;
        let mut beyond = false;
        let nports = self.tx.len();
        for &v in batch.verdicts() {
            if v == DROP {
                c.dropped += 1;
            } else if (v as usize) < nports {
                used |= 1u64 << (v as usize).min(63);
                // Ports 63 and beyond share the last bit: each of them is then visited.
            } else {
                beyond = true;
                c.errors += 1;
            }
        }
        for (p, (tx, qc)) in self.tx.iter_mut().zip(&self.counters).enumerate() {
            if used & (1u64 << p.min(63)) == 0 {
                continue;
            }
            let (sent, bytes, lost) = tx.tx_batch(batch, p as Verdict);
            c.sent += sent;
            c.bytes += bytes;
            c.errors += lost;
            QueueCounters::add(&qc.tx_packets, sent);
            QueueCounters::add(&qc.tx_bytes, bytes);
        }
        if beyond {
            let n = batch.verdicts().iter().filter(|&&v| v != DROP && v as usize >= nports).count() as u64;
            QueueCounters::add(&self.no_port, n);
        }
        if batch.free_all(pool).is_err() {
            c.errors += c.sent + c.dropped;
        }
        c
    }
}

/// A pcap file as an output port (a live input's packets written with
/// their receive times after `base_ns`).
pub struct PcapPort {
    path: String,
    writer: SharedPcapWriter,
    base_ns: u64,
    counters: Vec<Arc<QueueCounters>>,
}

impl PcapPort {
    /// An output port over `writer` for `queues` workers; packet time 0 is `base_ns` (ns since the epoch).
    pub fn new(path: &str, writer: SharedPcapWriter, base_ns: u64, queues: usize) -> Self {
        PcapPort {
            path: path.to_string(),
            writer,
            base_ns,
            counters: (0..queues).map(|_| Arc::new(QueueCounters::default())).collect(),
        }
    }
}

impl Port for PcapPort {
    fn name(&self) -> String {
        format!("pcap:{}", self.path)
    }

    fn queues(&self) -> usize {
        self.counters.len()
    }

    fn open_rx(&self, _q: usize) -> Result<Box<dyn RxQueue>, PortError> {
        Err(PortError::Unsupported(format!("pcap:{}: an output file cannot be received from", self.path)))
    }

    fn open_tx(&self, _q: usize) -> Result<Box<dyn TxQueue>, PortError> {
        Ok(Box::new(PcapTx { writer: self.writer.clone(), base_ns: self.base_ns }))
    }

    fn counters(&self) -> &[Arc<QueueCounters>] {
        &self.counters
    }
}

/// A worker's handle on a shared pcap output: one lock per batch.
struct PcapTx {
    writer: SharedPcapWriter,
    base_ns: u64,
}

impl TxQueue for PcapTx {
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
        let (mut sent, mut bytes, mut lost) = (0, 0, 0);
        let Ok(mut w) = self.writer.lock() else {
            return (0, 0, batch.verdicts().iter().filter(|&&v| v == port).count() as u64);
        };
        for (i, &v) in batch.verdicts().iter().enumerate() {
            if v != port {
                continue;
            }
            let d = batch.data(i);
            match w.write_packet(self.base_ns.saturating_add(batch.timestamps()[i]), d, d.len() as u32) {
                Ok(()) => {
                    sent += 1;
                    bytes += d.len() as u64;
                }
                Err(_) => lost += 1,
            }
        }
        (sent, bytes, lost)
    }
}

/// Opens a live port for `queues` queue pairs.
pub fn open(spec: &PortSpec, queues: usize, opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    match spec {
        PortSpec::AfPacket { iface } => Ok(Arc::new(afpacket::AfPacketPort::open(iface, queues, opts)?)),
        #[cfg(fp_afxdp)]
        PortSpec::AfXdp { iface, queue } => Ok(Arc::new(afxdp::AfXdpPort::open(iface, *queue, queues, opts)?)),
        #[cfg(not(fp_afxdp))]
        PortSpec::AfXdp { .. } => Err(PortError::Unsupported(format!(
            "{spec}: AF_XDP is not built into this binary (build with libxdp-dev and libbpf-dev installed)"
        ))),
        #[cfg(feature = "dpdk")]
        PortSpec::Dpdk(d) => Ok(Arc::new(dpdk::DpdkPort::open(d, queues, opts)?)),
        #[cfg(not(feature = "dpdk"))]
        PortSpec::Dpdk(_) => Err(PortError::Unsupported(format!(
            "{spec}: DPDK ports are not built into this binary (build with --features dpdk and libdpdk-dev)"
        ))),
        PortSpec::Pcap(p) => Err(PortError::Unsupported(format!(
            "{}: a pcap file is replayed or written, not opened as a live port",
            p.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(PortSpec::parse("t.pcap").unwrap(), PortSpec::Pcap("t.pcap".into()));
        assert_eq!(PortSpec::parse("pcap:a:b.pcap").unwrap(), PortSpec::Pcap("a:b.pcap".into()));
        assert_eq!(PortSpec::parse("afpacket:veth0").unwrap(), PortSpec::AfPacket { iface: "veth0".into() });
        assert_eq!(PortSpec::parse("afxdp:eth1:3").unwrap(), PortSpec::AfXdp { iface: "eth1".into(), queue: 3 });
        assert_eq!(PortSpec::parse("afxdp:eth1").unwrap(), PortSpec::AfXdp { iface: "eth1".into(), queue: 0 });
        assert_eq!(PortSpec::parse("dpdk:net_null0").unwrap(), PortSpec::Dpdk("net_null0".into()));
        for bad in ["afpacket:", "afpacket:a/b", "afpacket:0123456789abcdef", "afxdp:eth0:x", "dpdk:", "pcap:", ""] {
            assert!(PortSpec::parse(bad).is_err(), "{bad}");
        }
        assert!(PortSpec::parse("afpacket:lo").unwrap().is_live());
        assert!(!PortSpec::parse("x.pcap").unwrap().is_live());
        assert_eq!(PortSpec::parse("afxdp:eth1:3").unwrap().to_string(), "afxdp:eth1:3");
    }

    #[test]
    fn unknown_interface_is_an_error_not_a_panic() {
        let e = open(&PortSpec::AfPacket { iface: "fp-nosuch0".into() }, 1, PortOptions::default());
        assert!(e.is_err());
        assert!(open(&PortSpec::Dpdk("0".into()), 1, PortOptions::default()).is_err());
    }
}

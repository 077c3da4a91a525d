//! Real ports: one abstraction over every backend, named the same way
//! everywhere as `KIND:ARGS` (a bare path is a pcap file).
//!
//! The kinds are a registry, [`PORTS`]: one file (or directory) per kind in
//! this directory exporting its registration `pub const INFO: PortInfo` —
//! its syntax, how its arguments parse, its capabilities ([`PortCaps`]:
//! live or a file, kernel steering, peer, once per process, root, the run
//! options it takes, or why this binary lacks it) and its constructor — and
//! one name on the `ports!(...)` line, the same descriptor-table style as
//! the strategies, executors and NFs. Nothing else names a kind: the CLI and
//! the runner parse specs and read capabilities through the registry.
//! Kinds: `pcap:FILE`, `afpacket:IFACE`, `afxdp:IFACE[:QUEUE]` (where libxdp
//! was found at build time), `dpdk:PORT_OR_VDEV` (the `dpdk` feature);
//! `flowplane ports` lists them.
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

pub mod fanout_steer;
pub mod link;
pub mod netns;
pub mod peer;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_packet::{Batch, PacketPool, Verdict, DROP};

pub use link::{LinkState, LinkStats, LinkWatch};
pub use pcap::PcapPort;

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

use crate::{Rx, RxStats, Sink, Source, TxCounters};

/// Declares the registry: each port kind's module and its descriptor, in listing order.
macro_rules! ports {
    ($($name:ident),+ $(,)?) => {
        $(pub mod $name;)+
        /// Every port kind, by the scheme before the first ':' of its name; a
        /// name without a registered scheme is a path of the first (`pcap`).
        pub static PORTS: &[PortInfo] = &[$($name::INFO),+];
    };
}

// The registry: one file (or directory) per port kind in this directory, named here.
ports!(pcap, afpacket, afxdp, dpdk);

/// A registered port kind: how its name is written and parsed, what it can
/// do, and how it opens. The runtime and the CLI ask these, never a kind's name.
#[derive(Debug)]
pub struct PortInfo {
    /// The scheme: `NAME:ARGS`.
    pub name: &'static str,
    /// How a port of this kind is written (help texts).
    pub syntax: &'static str,
    /// One line for listings.
    pub about: &'static str,
    /// What it can do.
    pub caps: PortCaps,
    /// Checks the arguments after `NAME:` and returns them as the port is
    /// shown (the one-line reason when malformed).
    pub parse: fn(&str) -> Result<String, String>,
    /// Opens a live port of this kind for N queue pairs.
    pub open: OpenFn,
}

/// A kind's constructor: the port named by the spec, for N queue pairs.
pub type OpenFn = fn(&PortSpec, usize, PortOptions) -> Result<Arc<dyn Port>, PortError>;

/// What a port kind can do; every check and refusal about ports reads these.
#[derive(Clone, Copy, Debug)]
pub struct PortCaps {
    /// A live port (opened, polled until stopped); false: a file, replayed
    /// as input or written as output.
    pub live: bool,
    /// Its receive queues can be steered in the kernel (AF_PACKET's fanout
    /// program, [`fanout_steer`]): a table needs no dispatcher core.
    pub kernel_steering: bool,
    /// A Linux interface: it can be a sender or receiver peer, opened in a
    /// network namespace ([`peer`], `flowplane mlffr --send/--recv`).
    pub peer: bool,
    /// The device starts once per process (DPDK's EAL): opened once and kept
    /// for every trial of a search.
    pub once_per_process: bool,
    /// Opening it needs root (CAP_NET_RAW / CAP_NET_ADMIN / CAP_BPF).
    pub needs_root: bool,
    /// The port options of `flowplane run` it acts on (`--promisc`, `--eal`):
    /// one given to a run without a port that takes it is refused.
    pub options: &'static [&'static str],
    /// Not built into this binary: why (one line).
    pub missing: Option<&'static str>,
}

/// The port kind named `name` (the scheme, without ':').
pub fn kind(name: &str) -> Option<&'static PortInfo> {
    PORTS.iter().find(|k| k.name == name)
}

/// The live kinds' schemes, for messages: `afpacket:, afxdp:, dpdk:`.
pub fn live_schemes() -> String {
    PORTS.iter().filter(|k| k.caps.live).map(|k| format!("{}:", k.name)).collect::<Vec<_>>().join(", ")
}

/// The syntax of every kind, for help texts: `pcap:FILE | afpacket:IFACE | ...`.
pub fn syntaxes() -> String {
    PORTS.iter().map(|k| k.syntax).collect::<Vec<_>>().join(" | ")
}

/// An interface name argument (`afpacket:IFACE`, `afxdp:IFACE`).
pub(crate) fn iface_arg(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', ' ', ':']) {
        return Err("expected an interface name (1-15 characters, no '/', ':' or space)".into());
    }
    Ok(name.to_string())
}

/// A port as named on the command line: its kind and its arguments (as the
/// kind's `parse` wrote them back).
#[derive(Clone)]
pub struct PortSpec {
    kind: &'static PortInfo,
    arg: String,
}

impl PortSpec {
    /// Parses `KIND:ARGS` for a registered kind ([`PORTS`]); anything
    /// without a registered scheme is a pcap file path.
    pub fn parse(s: &str) -> Result<PortSpec, PortError> {
        let known = s.split_once(':').and_then(|(scheme, rest)| Some((kind(scheme)?, rest)));
        let (kind, rest) = match known {
            Some(k) => k,
            None if s.is_empty() => return Err(PortError::Spec(format!("{s}: empty port"))),
            None => return Ok(PortSpec { kind: &PORTS[0], arg: s.to_string() }),
        };
        let arg = (kind.parse)(rest).map_err(|why| PortError::Spec(format!("{s}: {why}")))?;
        Ok(PortSpec { kind, arg })
    }

    /// Its kind.
    pub fn kind(&self) -> &'static PortInfo {
        self.kind
    }

    /// Its arguments (after `KIND:`): a file path, an interface, a device.
    pub fn arg(&self) -> &str {
        &self.arg
    }

    /// True for a live port (not a file).
    pub fn is_live(&self) -> bool {
        self.kind.caps.live
    }
}

impl PartialEq for PortSpec {
    fn eq(&self, o: &Self) -> bool {
        self.kind.name == o.kind.name && self.arg == o.arg
    }
}

impl Eq for PortSpec {}

impl fmt::Debug for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PortSpec({self})")
    }
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name, self.arg)
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
    /// (queue `i` = worker `i`), before any RX queue is opened. AF_PACKET
    /// (a fanout program) and AF_XDP (an XDP program, tables without moves)
    /// can ([`fanout_steer`]); the others say why not.
    fn steer_in_kernel(&self, steer: Arc<fanout_steer::KernelSteer>) -> Result<(), PortError> {
        let _ = steer;
        Err(PortError::Spec(format!("{}: kernel steering is for AF_PACKET and AF_XDP ports", self.name())))
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

/// Opens a live port for `queues` queue pairs (its kind's constructor).
pub fn open(spec: &PortSpec, queues: usize, opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    (spec.kind.open)(spec, queues, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = |s: &str| PortSpec::parse(s).unwrap();
        let is = |s: &str, kind: &str, arg: &str| {
            let spec = p(s);
            assert_eq!((spec.kind().name, spec.arg()), (kind, arg), "{s}");
        };
        is("t.pcap", "pcap", "t.pcap");
        is("pcap:a:b.pcap", "pcap", "a:b.pcap");
        is("a:b.pcap", "pcap", "a:b.pcap");
        is("afpacket:veth0", "afpacket", "veth0");
        is("afxdp:eth1:3", "afxdp", "eth1:3");
        is("afxdp:eth1", "afxdp", "eth1:0");
        is("dpdk:net_null0", "dpdk", "net_null0");
        for bad in ["afpacket:", "afpacket:a/b", "afpacket:0123456789abcdef", "afxdp:eth0:x", "dpdk:", "pcap:", ""] {
            let e = PortSpec::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("port {bad}: ")) && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(p("afpacket:lo").is_live());
        assert!(!p("x.pcap").is_live());
        assert_eq!(p("afxdp:eth1:3").to_string(), "afxdp:eth1:3");
        assert_eq!(p("x.pcap").to_string(), "pcap:x.pcap");
        assert_eq!(p("afxdp:eth1"), p("afxdp:eth1:0"));
    }

    #[test]
    fn the_registry_names_each_kind_once_and_parses_its_own_syntax() {
        assert_eq!(PORTS.iter().map(|k| k.name).collect::<Vec<_>>(), ["pcap", "afpacket", "afxdp", "dpdk"]);
        for k in PORTS {
            assert_eq!(kind(k.name).map(|x| x.name), Some(k.name));
            assert!(k.syntax.starts_with(&format!("{}:", k.name)), "{}", k.syntax);
            assert!(!k.about.is_empty() && !k.about.contains('\n'), "{}: one-line about", k.name);
            // The syntax's placeholder, written as a value, names a port of this kind.
            let example = k.syntax.split('[').next().unwrap_or(k.syntax).replace(char::is_uppercase, "x");
            assert_eq!(PortSpec::parse(&example).unwrap().kind().name, k.name, "{example}");
            if let Some(why) = k.caps.missing {
                let e = open(&PortSpec::parse(&example).unwrap(), 1, PortOptions::default()).err().unwrap();
                assert!(e.to_string().ends_with(why), "{e}");
            }
        }
        assert_eq!(live_schemes(), "afpacket:, afxdp:, dpdk:");
        assert!(kind("nope").is_none());
    }

    #[test]
    fn unknown_interface_is_an_error_not_a_panic() {
        let e = open(&PortSpec::parse("afpacket:fp-nosuch0").unwrap(), 1, PortOptions::default());
        assert!(e.is_err());
        assert!(open(&PortSpec::parse("dpdk:0").unwrap(), 1, PortOptions::default()).is_err());
        assert!(open(&PortSpec::parse("x.pcap").unwrap(), 1, PortOptions::default()).is_err());
    }
}

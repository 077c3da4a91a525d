//! The UPF's control plane: a PFCP (N4) endpoint on UDP that SMFs drive,
//! and the versioned hand-over of rule sets to the data path ([`UpfControl`]).
//!
//! Procedures (TS 29.244): Heartbeat (§6.2.2, both ways), Association Setup
//! / Update / Release (§6.2.6, §6.2.7, §6.2.8), Session Establishment,
//! Modification, Deletion (§6.3.2-§6.3.4), Session Set Deletion,
//! Session Report Requests for URR thresholds (§6.3.5); the messages in §7.4
//! (node related, Session Set Deletion §7.4.6) and §7.5 (session related).
//!
//! Usage reporting (§5.2.2): every core counts a URR's UL/DL bytes and
//! packets on its own [`Board`]; the endpoint sums the cores' shares and
//! reports the usage since the URR's previous report (UR-SEQN counting up):
//! volume threshold (a core's nudge, then the sum decides), volume quota
//! (polled; once reached the cores drop the URR's traffic, counted),
//! Measurement Period (periodic, from the last report), Time Threshold
//! (usage since a report older than it), Query URR (in the modification
//! response) and the final report of each URR in the deletion response.
//! Session Report Requests go to the CP F-SEID's IPv4 address at the owning
//! association's port and are resent every T1 up to N1 times until
//! answered.
//!
//! Downlink data (§5.2.4.1): a buffering FAR whose Apply Action has NOCP
//! makes the cores report a session's first buffered packet; the endpoint
//! sends one Session Report Request (Report Type DLDR, a Downlink Data
//! Report with the PDR ID) and no other until the CP modifies the session.
//! The buffered packets themselves are counted and dropped (not released
//! when the FAR forwards again).
//!
//! QER rates (MBR, session AMBR, GBR) are the session's on every core: the
//! control block holds the shared buckets ([`UpfControl::meters`], see
//! [`super::qos`]).
//!
//! Trust (§6.2.6): an association is identified by the CP function's
//! Node ID and bound to the source address (IP and port) it was set up
//! from. Only Heartbeat and Association Setup are accepted from a peer
//! without one; any other request is answered "No established PFCP
//! Association" (cause 72, §8.2.1) and changes nothing, as does an
//! Association Update / Release / Session Set Deletion naming another
//! node than the one associated at that address. A session belongs to the
//! association that established it: other associations' modification and
//! deletion requests get "Session context not found" (cause 65).
//! UP SEIDs and the F-TEIDs the UPF chooses are random (non-zero, unique),
//! so a peer cannot guess others'.
//! Sessions loaded from a session file belong to no association: no PFCP
//! request changes them.
//!
//! Retransmissions (§6.4): every answered request is cached per peer
//! address and sequence number for T1 x (N1 + 1); a request arriving again
//! within that time gets the cached response's bytes and is not applied
//! again (a resent establishment creates no second session).
//!
//! Restarts and failures (§6.2.2, §6.2.6.2.2, TS 23.007 §19A): each
//! association keeps the peer's Recovery Time Stamp; a Heartbeat (request
//! or response) or Association Setup carrying a newer one means the peer
//! restarted, and its sessions are removed (kept with
//! `keep_sessions_on_restart`). A repeated Association Setup for a Node ID
//! already associated replaces the association; its sessions are kept only
//! if the request's PFCPASReq-Flags has PSREI (or the option is set). The
//! endpoint sends each associated peer a Heartbeat Request every
//! `heartbeat` interval, retransmitted every T1 up to N1 times; with no
//! answer the peer has failed: the association is released and its
//! sessions removed (kept with `keep_sessions_on_failure`), one line on
//! stderr. Every such event is counted ([`ControlStats`]).
//!
//! The Association Setup Response carries the Node ID (configurable: IPv4
//! or FQDN, [`N4Config::node_id`]), the Recovery Time Stamp, UP Function
//! Features (FTUP: the UPF allocates F-TEIDs) and User Plane IP Resource
//! Information (the N3 address). The F-SEID the UPF returns carries its N4
//! address, F-TEIDs its N3 address.
//!
//! The socket: its receive buffer is raised ([`N4Config::rcvbuf`], beyond
//! `net.core.rmem_max` when the process may), and a reader thread moves
//! datagrams to a bounded queue as they arrive, so a burst of requests does
//! not wait in the kernel while rules compile. The achieved buffer size,
//! the kernel's drop count for the socket (from `/proc/net/udp`) and the
//! queue's own drops are counted.
//!
//! Accepted changes compile a new immutable [`RuleSet`], published before
//! the responses are sent; each core's `upf` picks the new version up at
//! the start of its next batch (one atomic load per batch), so no packet
//! ever sees half of a change. The endpoint handles every request waiting
//! (up to [`BURST`]) before it compiles once for all of them: a compile
//! costs O(all rules), so under churn its cost is shared by the requests
//! that arrived meanwhile (per-session incremental rule sets would remove it).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::pfcp::{self, cause, enc, ie, msg, Header, PfcpError, Writer};
use super::rules::{ip128, RuleSet, SessionSpec};
use super::{Board, Usage, UsageReport};

/// The rule set the data path should run, with its version, and the usage
/// reports the cores raised for the endpoint to send.
#[derive(Debug)]
pub struct UpfControl {
    version: AtomicU64,
    rules: Mutex<Arc<RuleSet>>,
    reports: Mutex<Vec<UsageReport>>,
    /// Downlink data the cores buffered for a FAR that notifies the CP: (SEID, PDR ID).
    ddn: Mutex<Vec<(u64, u16)>>,
    /// GTP-U echo requests for the cores to send on N3 (peer IPv4, sequence
    /// number), with their count so a core looks without locking; and the
    /// echo responses the cores received (peer, sequence number).
    echo_out: Mutex<Vec<(u32, u16)>>,
    echo_out_n: AtomicU64,
    echo_in: Mutex<Vec<(u32, u16)>>,
    /// Every core's URR counters (each core swaps its own board in when it takes a new rule set).
    cores: Mutex<Vec<Arc<Mutex<Arc<Board>>>>>,
    /// The QERs' buckets every core shares (rates are per session, not per core).
    pub meters: Arc<super::qos::Meters>,
    /// Datagrams handled, by outcome.
    pub stats: ControlStats,
}

/// Counters of the PFCP endpoint.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Requests answered with cause "accepted".
    pub accepted: AtomicU64,
    /// Requests answered with another cause.
    pub rejected: AtomicU64,
    /// Datagrams dropped (not PFCP, unknown message type, unexpected response).
    pub discarded: AtomicU64,
    /// Requests refused because their source has no association (cause 72).
    pub no_association: AtomicU64,
    /// Retransmitted requests answered from the cache (not applied again).
    pub retransmissions: AtomicU64,
    /// Associations set up (a repeated setup counts again).
    pub associations: AtomicU64,
    /// Associations released by their peer.
    pub releases: AtomicU64,
    /// Peers seen restarting (a newer Recovery Time Stamp).
    pub peer_restarts: AtomicU64,
    /// Peers declared failed (N1 heartbeats unanswered).
    pub peer_failures: AtomicU64,
    /// Sessions removed because their peer restarted, failed, released or
    /// re-associated, or by a Session Set Deletion.
    pub sessions_removed: AtomicU64,
    /// Heartbeat Requests sent (retransmissions included).
    pub heartbeats_sent: AtomicU64,
    /// Heartbeat Responses received to them.
    pub heartbeat_responses: AtomicU64,
    /// Session Report Requests sent.
    pub reports_sent: AtomicU64,
    /// Session Report Responses received.
    pub report_responses: AtomicU64,
    /// Session Report Requests sent again (T1 passed without a response).
    pub reports_retransmitted: AtomicU64,
    /// Session Report Requests given up after N1 retransmissions.
    pub reports_unanswered: AtomicU64,
    /// Rule sets compiled and published (one per burst of changing requests).
    pub publishes: AtomicU64,
    /// The socket's receive buffer as the kernel reports it (bytes; Linux
    /// counts its bookkeeping, twice the size asked for).
    pub rcvbuf: AtomicU64,
    /// Datagrams the kernel dropped on the socket (its buffer was full).
    pub kernel_drops: AtomicU64,
    /// Datagrams dropped because the endpoint's queue was full.
    pub queue_drops: AtomicU64,
    /// Downlink Data Reports sent (a buffering FAR with NOCP got its first packet).
    pub ddn_sent: AtomicU64,
    /// GTP-U echo requests handed to the cores (retransmissions included).
    pub echo_requests: AtomicU64,
    /// GTP-U echo responses matched to an outstanding request.
    pub echo_responses: AtomicU64,
    /// GTP-U paths declared failed (echo requests unanswered), reported to the SMFs.
    pub path_failures: AtomicU64,
}

impl ControlStats {
    /// The counters as JSON (the `upf` report's `pfcp` object).
    pub fn to_json(&self) -> Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "accepted": g(&self.accepted), "rejected": g(&self.rejected), "discarded": g(&self.discarded),
            "no_association": g(&self.no_association), "retransmissions": g(&self.retransmissions),
            "associations": g(&self.associations), "releases": g(&self.releases),
            "peer_restarts": g(&self.peer_restarts), "peer_failures": g(&self.peer_failures),
            "sessions_removed": g(&self.sessions_removed),
            "heartbeats_sent": g(&self.heartbeats_sent), "heartbeat_responses": g(&self.heartbeat_responses),
            "reports_sent": g(&self.reports_sent), "report_responses": g(&self.report_responses),
            "reports_retransmitted": g(&self.reports_retransmitted), "reports_unanswered": g(&self.reports_unanswered),
            "publishes": g(&self.publishes), "rcvbuf": g(&self.rcvbuf),
            "kernel_drops": g(&self.kernel_drops), "queue_drops": g(&self.queue_drops),
            "ddn_sent": g(&self.ddn_sent),
            "echo_requests": g(&self.echo_requests), "echo_responses": g(&self.echo_responses),
            "path_failures": g(&self.path_failures),
        })
    }
}

/// Most requests handled before one compile and their responses.
pub const BURST: usize = 256;

/// Datagrams the reader thread queues for the endpoint before it drops (counted).
const QUEUE: usize = 65_536;

/// Responses kept for retransmitted requests, over all peers (oldest evicted first).
const CACHE_MAX: usize = 65_536;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl UpfControl {
    /// A control block starting with `rules` (version 1).
    pub fn new(rules: Arc<RuleSet>) -> Arc<UpfControl> {
        Arc::new(UpfControl {
            version: AtomicU64::new(1),
            rules: Mutex::new(rules),
            reports: Mutex::new(Vec::new()),
            ddn: Mutex::new(Vec::new()),
            echo_out: Mutex::new(Vec::new()),
            echo_out_n: AtomicU64::new(0),
            echo_in: Mutex::new(Vec::new()),
            cores: Mutex::new(Vec::new()),
            meters: super::qos::Meters::new(),
            stats: ControlStats::default(),
        })
    }

    /// The current version (cheap: what each batch checks).
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current rule set and its version.
    pub fn current(&self) -> (u64, Arc<RuleSet>) {
        let r = lock(&self.rules);
        (self.version.load(Ordering::Acquire), Arc::clone(&r))
    }

    /// Publishes a new rule set.
    pub fn publish(&self, rules: Arc<RuleSet>) {
        let mut r = lock(&self.rules);
        *r = rules;
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Hands usage reports over to the endpoint (emptying `from`).
    pub fn push_reports(&self, from: &mut Vec<UsageReport>) {
        lock(&self.reports).append(from);
    }

    fn take_reports(&self) -> Vec<UsageReport> {
        std::mem::take(&mut *lock(&self.reports))
    }

    /// Hands the first buffered packets of notifying FARs over (emptying `from`).
    /// Takes the GTP-U echo requests to send (peer IPv4, sequence number), if any (one load when none).
    pub fn take_echo_requests(&self, into: &mut Vec<(u32, u16)>) {
        if self.echo_out_n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut q = lock(&self.echo_out);
        self.echo_out_n.store(0, Ordering::Relaxed);
        into.append(&mut q);
    }

    /// Echo responses a core received on N3 (peer IPv4, sequence number).
    pub fn push_echo_responses(&self, from: &mut Vec<(u32, u16)>) {
        lock(&self.echo_in).append(from);
    }

    pub fn push_ddn(&self, from: &mut Vec<(u64, u16)>) {
        lock(&self.ddn).append(from);
    }

    /// Adds a core's counters to those the endpoint sums; the core keeps the
    /// returned slot and puts each new board of its own in it.
    pub fn attach(&self, board: Arc<Board>) -> Arc<Mutex<Arc<Board>>> {
        let slot = Arc::new(Mutex::new(board));
        lock(&self.cores).push(Arc::clone(&slot));
        slot
    }

    /// Cores attached.
    pub fn cores(&self) -> usize {
        lock(&self.cores).len().max(1)
    }

    /// The boards of every core now.
    fn boards(&self) -> Vec<Arc<Board>> {
        lock(&self.cores).iter().map(|s| Arc::clone(&lock(s))).collect()
    }

    /// The usage of URR `urr_id` of session `seid` summed over every core
    /// (each core's share as counted by its current rule set).
    pub fn usage(&self, seid: u64, urr_id: u32) -> Usage {
        self.boards()
            .iter()
            .filter_map(|b| b.usage_of(seid, urr_id).map(super::Cell::snapshot))
            .fold(Usage::default(), Usage::plus)
    }

    /// Marks the URR's volume quota used up on every core (its traffic is dropped).
    fn exhaust(&self, seid: u64, urr_id: u32) {
        for b in self.boards() {
            if let Some(c) = b.usage_of(seid, urr_id) {
                c.set_exhausted(true);
            }
        }
    }
}

/// The UPF's Node ID (§8.2.38).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeId {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// A fully qualified domain name.
    Fqdn(String),
}

impl NodeId {
    /// An IPv4 address or an FQDN (labels of 1-63 letters, digits, '-').
    pub fn parse(s: &str) -> Result<NodeId, String> {
        if let Ok(a) = s.parse::<Ipv4Addr>() {
            return Ok(NodeId::V4(a));
        }
        let name = s.trim_end_matches('.');
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.is_empty()
            || name.len() > 253
            || !name.split('.').all(label_ok)
            || name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        {
            return Err(format!("'{s}' is neither an IPv4 address nor an FQDN"));
        }
        Ok(NodeId::Fqdn(name.to_ascii_lowercase()))
    }

    /// The Node ID IE's value.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            NodeId::V4(a) => enc::node_id_v4(*a),
            NodeId::Fqdn(n) => enc::node_id_fqdn(n),
        }
    }
}

/// How the endpoint presents itself and watches its peers.
#[derive(Clone, Debug)]
pub struct N4Config {
    /// The UPF's Node ID.
    pub node_id: NodeId,
    /// N3 address: in F-TEIDs the UPF allocates and in the User Plane IP
    /// Resource Information.
    pub n3: Ipv4Addr,
    /// N4 address: in the F-SEIDs the UPF returns.
    pub n4: Ipv4Addr,
    /// Heartbeat Request interval per associated peer (zero: none sent).
    pub heartbeat: Duration,
    /// T1: wait for a response before retransmitting a request.
    pub t1: Duration,
    /// N1: retransmissions before the peer counts as failed.
    pub n1: u32,
    /// Keep a peer's sessions when it restarts (newer Recovery Time Stamp).
    pub keep_sessions_on_restart: bool,
    /// Keep a peer's sessions when it fails (heartbeats unanswered).
    pub keep_sessions_on_failure: bool,
    /// Socket receive buffer to ask for (bytes).
    pub rcvbuf: usize,
    /// GTP-U echo request interval per N3 peer (the FARs' outer-header
    /// addresses; zero: none). Unanswered for T1, resent up to N1 times, then
    /// the path counts as failed and every associated SMF gets a Node Report.
    pub gtpu_echo: Duration,
}

impl N4Config {
    /// Defaults: Node ID and N4 address `n3`; a heartbeat every 10 s, T1 = 3 s, N1 = 3; an 8 MB receive buffer.
    pub fn new(n3: Ipv4Addr) -> N4Config {
        N4Config {
            node_id: NodeId::V4(n3),
            n3,
            n4: n3,
            heartbeat: Duration::from_secs(10),
            t1: Duration::from_secs(3),
            n1: 3,
            keep_sessions_on_restart: false,
            keep_sessions_on_failure: false,
            rcvbuf: 8 << 20,
            gtpu_echo: Duration::from_secs(60),
        }
    }

    /// How long a response stays cached for retransmitted requests: a
    /// peer with our T1 and N1 has given up by then.
    fn cache_lifetime(&self) -> Duration {
        self.t1 * (self.n1 + 1)
    }
}

/// One PFCP session as the endpoint keeps it.
#[derive(Clone, Debug)]
struct Sess {
    cp_seid: u64,
    /// The CP F-SEID's IPv4 address: where Session Report Requests go.
    cp_addr: Option<Ipv4Addr>,
    /// Per URR ID: what was reported so far.
    urrs: HashMap<u32, UrrState>,
    /// The Node ID of the association that owns it (None: from the session file).
    owner: Option<Vec<u8>>,
    /// FQ-CSIDs named at establishment (for Session Set Deletion).
    csids: Vec<(Vec<u8>, u16)>,
    spec: SessionSpec,
    /// A Downlink Data Report was sent and no modification followed it yet
    /// (§5.2.4.1: one report until the CP acts on it).
    notified: bool,
}

/// A URR's reporting state (the endpoint's; the counters are the cores').
#[derive(Clone, Debug)]
struct UrrState {
    /// The whole session's usage at the last report.
    reported: Usage,
    /// UR-SEQN of the next report (§8.2.54).
    seqn: u32,
    /// When the last report went (or the URR was created).
    last: Instant,
    /// The volume quota was reached (reported once; traffic dropped).
    quota_hit: bool,
}

impl UrrState {
    fn new(now: Instant) -> UrrState {
        UrrState { reported: Usage::default(), seqn: 0, last: now, quota_hit: false }
    }
}

/// Usage Report Trigger (§8.2.41) octets.
mod trigger {
    pub const PERIO: [u8; 3] = [0x01, 0, 0];
    pub const VOLTH: [u8; 3] = [0x02, 0, 0];
    pub const TIMTH: [u8; 3] = [0x04, 0, 0];
    pub const IMMER: [u8; 3] = [0x80, 0, 0];
    pub const VOLQU: [u8; 3] = [0, 0x01, 0];
    pub const TERMR: [u8; 3] = [0, 0x08, 0];
}

/// A request the endpoint sent and awaits the response to.
#[derive(Debug)]
struct Pending {
    seq: u32,
    sent: Instant,
    tries: u32,
    bytes: Vec<u8>,
}

/// One association with a CP function.
#[derive(Debug)]
struct Assoc {
    node: Vec<u8>,
    recovery: u32,
    next_heartbeat: Instant,
    heartbeat: Option<Pending>,
}

/// Why a peer's sessions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    Restart,
    Failure,
    Release,
}

/// The endpoint's state: associations (by peer address), sessions (by local
/// SEID) and the responses cached for retransmissions.
#[derive(Debug)]
pub struct Endpoint {
    cfg: N4Config,
    node: Vec<u8>,
    recovery: u32,
    assocs: HashMap<SocketAddr, Assoc>,
    sessions: BTreeMap<u64, Sess>,
    seq: u32,
    /// Responses by (peer, sequence number), with the request's message type and the expiry.
    cache: HashMap<(SocketAddr, u32), (u8, Instant, Vec<u8>)>,
    cache_order: VecDeque<(Instant, SocketAddr, u32)>,
    /// Session Report Requests awaiting their response, by sequence number, with their destination.
    reports_pending: BTreeMap<u32, (SocketAddr, Pending)>,
    control: Arc<UpfControl>,
    /// Sessions changed since the last publication (while deferring).
    dirty: bool,
    /// Requests are being handled as a burst: publish once, at `flush`.
    defer: bool,
    /// GTP-U paths to the N3 peers, by IPv4 address; when the peer list was last read from the sessions.
    paths: HashMap<u32, Path>,
    paths_read: Option<Instant>,
    echo_seq: u16,
}

/// GTP-U path management towards one N3 peer (TS 29.281 §7.2.1, TS 23.527 §4.3).
#[derive(Clone, Debug)]
struct Path {
    /// Next echo request due.
    next: Instant,
    /// The outstanding request: sequence number, last sent, retransmissions.
    pending: Option<(u16, Instant, u32)>,
    /// Reported failed (until it answers again).
    failed: bool,
}

/// Seconds between 1900 (NTP era 0) and 1970.
const NTP_UNIX: u64 = 2_208_988_800;

/// `new` is later than `old` (NTP seconds, modulo 2^32).
fn newer(new: u32, old: u32) -> bool {
    (new.wrapping_sub(old) as i32) > 0
}

type Reply = Result<(u64, Vec<(u16, Vec<u8>)>), (u64, PfcpError)>;

fn refuse(cause: u8, what: &str) -> PfcpError {
    PfcpError { cause, ie: None, what: what.into() }
}

impl Endpoint {
    /// An endpoint whose Node ID, N3 and N4 address is `node` (other
    /// settings default, [`N4Config::new`]), starting from `initial` sessions
    /// (a session file; they belong to no association).
    pub fn new(node: Ipv4Addr, initial: &[SessionSpec], control: Arc<UpfControl>) -> Endpoint {
        Endpoint::with_config(N4Config::new(node), initial, control)
    }

    /// An endpoint configured by `cfg`.
    pub fn with_config(cfg: N4Config, initial: &[SessionSpec], control: Arc<UpfControl>) -> Endpoint {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let sessions: BTreeMap<u64, Sess> = initial
            .iter()
            .map(|s| {
                let sess = Sess {
                    cp_seid: s.seid,
                    cp_addr: None,
                    urrs: HashMap::new(),
                    owner: None,
                    csids: Vec::new(),
                    spec: s.clone(),
                    notified: false,
                };
                (s.seid, sess)
            })
            .collect();
        Endpoint {
            node: cfg.node_id.encode(),
            cfg,
            recovery: (now + NTP_UNIX) as u32,
            assocs: HashMap::new(),
            sessions,
            seq: 0,
            cache: HashMap::new(),
            cache_order: VecDeque::new(),
            reports_pending: BTreeMap::new(),
            control,
            dirty: false,
            defer: false,
            paths: HashMap::new(),
            paths_read: None,
            echo_seq: 0,
        }
    }

    /// Handles one datagram from `from`; returns the response to send, if
    /// any. Changes are published before it returns.
    pub fn handle(&mut self, dgram: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
        let r = self.handle_deferred(dgram, from);
        self.flush();
        r
    }

    /// [`Endpoint::handle`] without publishing: call [`Endpoint::flush`]
    /// before sending the responses of a burst.
    pub fn handle_deferred(&mut self, dgram: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
        self.defer = true;
        let r = self.handle_one(dgram, from, Instant::now());
        self.defer = false;
        r
    }

    /// [`Endpoint::handle`] as if at `now` (the retransmission cache's clock; tests).
    pub fn handle_at(&mut self, dgram: &[u8], from: SocketAddr, now: Instant) -> Option<Vec<u8>> {
        let r = self.handle_one(dgram, from, now);
        self.flush();
        r
    }

    /// Publishes the changes of the requests handled since the last flush, compiled once.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.dirty) {
            self.publish_now();
        }
    }

    fn handle_one(&mut self, dgram: &[u8], from: SocketAddr, now: Instant) -> Option<Vec<u8>> {
        let control = Arc::clone(&self.control);
        let st = &control.stats;
        let (h, body) = match pfcp::parse_header(dgram) {
            Ok(x) => x,
            Err(pfcp::HeaderError::Version(seq)) => {
                st.rejected.fetch_add(1, Ordering::Relaxed);
                return Some(Writer::message(msg::VERSION_NOT_SUPPORTED, None, seq).finish());
            }
            Err(pfcp::HeaderError::Malformed) => {
                st.discarded.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let rsp_type = match h.msg_type {
            msg::HEARTBEAT_REQ
            | msg::ASSOC_SETUP_REQ
            | msg::ASSOC_UPDATE_REQ
            | msg::ASSOC_RELEASE_REQ
            | msg::SESS_SET_DEL_REQ
            | msg::SESS_EST_REQ
            | msg::SESS_MOD_REQ
            | msg::SESS_DEL_REQ => h.msg_type + 1,
            msg::HEARTBEAT_RSP => {
                self.heartbeat_response(&h, body, from);
                return None;
            }
            msg::NODE_REPORT_RSP => {
                if self.reports_pending.remove(&h.seq).is_some() {
                    st.report_responses.fetch_add(1, Ordering::Relaxed);
                } else {
                    st.discarded.fetch_add(1, Ordering::Relaxed);
                }
                return None;
            }
            msg::SESS_REPORT_RSP => {
                if self.reports_pending.remove(&h.seq).is_some() {
                    st.report_responses.fetch_add(1, Ordering::Relaxed);
                    self.report_response(&h, body);
                } else {
                    st.discarded.fetch_add(1, Ordering::Relaxed);
                }
                return None;
            }
            _ => {
                // TS 29.244 §7.2.2.1: an unknown message type is discarded.
                st.discarded.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        // §6.4: a request seen before from this peer gets the same response, unapplied.
        self.expire_cache(now);
        // (A request of another type reusing the number is a new request.)
        if let Some((_, _, r)) = self.cache.get(&(from, h.seq)).filter(|c| c.0 == h.msg_type) {
            st.retransmissions.fetch_add(1, Ordering::Relaxed);
            return Some(r.clone());
        }
        let rsp = self.respond(&h, body, rsp_type, from);
        while self.cache.len() >= CACHE_MAX {
            let Some((t, a, s)) = self.cache_order.pop_front() else { break };
            self.uncache(t, a, s);
        }
        let expiry = now + self.cfg.cache_lifetime();
        self.cache.insert((from, h.seq), (h.msg_type, expiry, rsp.clone()));
        self.cache_order.push_back((expiry, from, h.seq));
        Some(rsp)
    }

    /// A Session Report Response's Update BAR (§7.5.9.2: DL Buffering
    /// Duration, DL Buffering Suggested Packet Count) changes the session's BAR.
    fn report_response(&mut self, h: &Header, body: &[u8]) {
        let Ok(ies) = pfcp::ies(body) else { return };
        let Some(u) = ies.iter().find(|i| i.ty == ie::UPDATE_BAR_SRR) else { return };
        let Some(s) = h.seid.and_then(|seid| self.sessions.get_mut(&seid)) else { return };
        let Ok(bar) = pfcp::decode_bar(u.value, s.spec.bar.as_ref()) else { return };
        s.spec.bar = Some(bar);
        self.publish();
    }

    fn expire_cache(&mut self, now: Instant) {
        while self.cache_order.front().is_some_and(|e| e.0 <= now) {
            if let Some((t, a, s)) = self.cache_order.pop_front() {
                self.uncache(t, a, s);
            }
        }
    }

    /// Forgets the response cached for `(a, s)` until `t` (not a newer one under the same key).
    fn uncache(&mut self, t: Instant, a: SocketAddr, s: u32) {
        if self.cache.get(&(a, s)).is_some_and(|c| c.1 == t) {
            self.cache.remove(&(a, s));
        }
    }

    fn respond(&mut self, h: &Header, body: &[u8], rsp_type: u8, from: SocketAddr) -> Vec<u8> {
        let control = Arc::clone(&self.control);
        let st = &control.stats;
        if rsp_type == msg::HEARTBEAT_RSP {
            // A heartbeat response carries only the recovery time stamp (§7.4.2.2).
            st.accepted.fetch_add(1, Ordering::Relaxed);
            if let Ok(ies) = pfcp::ies(body) {
                if let Some(r) = recovery_of(&ies) {
                    self.peer_recovery(from, r);
                }
            }
            let mut w = Writer::message(msg::HEARTBEAT_RSP, None, h.seq);
            w.ie(ie::RECOVERY_TIME_STAMP, &self.recovery.to_be_bytes());
            return w.finish();
        }
        let session_msg = rsp_type >= msg::SESS_EST_RSP;
        let result = pfcp::ies(body).map_err(|e| (0, e)).and_then(|ies| self.request(h, &ies, from));
        let mut w;
        match result {
            Ok((cp_seid, body)) => {
                st.accepted.fetch_add(1, Ordering::Relaxed);
                w = Writer::message(rsp_type, session_msg.then_some(cp_seid), h.seq);
                self.node_id(&mut w, rsp_type);
                w.ie(ie::CAUSE, &[cause::ACCEPTED]);
                for (t, v) in body {
                    w.ie(t, &v);
                }
            }
            Err((cp_seid, e)) => {
                st.rejected.fetch_add(1, Ordering::Relaxed);
                if e.cause == cause::NO_ASSOCIATION {
                    st.no_association.fetch_add(1, Ordering::Relaxed);
                }
                w = Writer::message(rsp_type, session_msg.then_some(cp_seid), h.seq);
                self.node_id(&mut w, rsp_type);
                w.ie(ie::CAUSE, &[e.cause]);
                if let Some(o) = e.ie {
                    w.ie(ie::OFFENDING_IE, &o.to_be_bytes());
                }
            }
        }
        if rsp_type == msg::ASSOC_SETUP_RSP {
            w.ie(ie::RECOVERY_TIME_STAMP, &self.recovery.to_be_bytes());
            // §8.2.25: FTUP (octet 5, bit 5): the UPF allocates F-TEIDs; nothing else claimed.
            w.ie(ie::UP_FUNCTION_FEATURES, &[0x10, 0x00]);
            // §8.2.82: V4 and the N3 address, source interface Access (ASSOSI).
            let mut ip = vec![0x41];
            ip.extend_from_slice(&self.cfg.n3.octets());
            ip.push(0);
            w.ie(ie::UP_IP_RESOURCE_INFORMATION, &ip);
        }
        w.finish()
    }

    /// Node ID leads the node-level responses and the establishment response.
    fn node_id(&self, w: &mut Writer, rsp_type: u8) {
        if matches!(
            rsp_type,
            msg::ASSOC_SETUP_RSP
                | msg::ASSOC_UPDATE_RSP
                | msg::ASSOC_RELEASE_RSP
                | msg::SESS_SET_DEL_RSP
                | msg::SESS_EST_RSP
        ) {
            w.ie(ie::NODE_ID, &self.node);
        }
    }

    /// The association at `from` if it is the one of Node ID `node` (when given).
    fn assoc_node(&self, from: SocketAddr, node: Option<&[u8]>) -> Result<Vec<u8>, PfcpError> {
        match self.assocs.get(&from) {
            Some(a) if node.is_none_or(|n| n == a.node.as_slice()) => Ok(a.node.clone()),
            _ => Err(refuse(cause::NO_ASSOCIATION, "no PFCP association with this peer")),
        }
    }

    /// The IEs of an accepted request's response (after Node ID and Cause), or the error.
    fn request(&mut self, h: &Header, ies: &[pfcp::Ie<'_>], from: SocketAddr) -> Reply {
        let find = |t: u16| ies.iter().find(|i| i.ty == t).map(|i| i.value);
        let no_seid = |e: PfcpError| (0, e);
        let node_of = || -> Result<Vec<u8>, (u64, PfcpError)> {
            pfcp::decode_node_id(find(ie::NODE_ID).ok_or_else(|| no_seid(missing(ie::NODE_ID)))?).map_err(no_seid)
        };
        match h.msg_type {
            msg::ASSOC_SETUP_REQ => {
                let node = node_of()?;
                let rts = recovery_of(ies).ok_or_else(|| no_seid(missing(ie::RECOVERY_TIME_STAMP)))?;
                // PFCPASReq-Flags bit 1: PFCP Session Retained Indication (PSREI).
                let psrei = find(ie::PFCPASREQ_FLAGS).and_then(|v| v.first()).is_some_and(|f| f & 1 != 0);
                self.associate(node, rts, psrei, from);
                Ok((0, vec![]))
            }
            msg::ASSOC_UPDATE_REQ => {
                // §6.2.7: nothing of ours to update; accepted only from the association itself.
                let node = node_of()?;
                self.assoc_node(from, Some(&node)).map_err(no_seid)?;
                Ok((0, vec![]))
            }
            msg::ASSOC_RELEASE_REQ => {
                let node = node_of()?;
                self.assoc_node(from, Some(&node)).map_err(no_seid)?;
                self.assocs.remove(&from);
                self.control.stats.releases.fetch_add(1, Ordering::Relaxed);
                // Releasing the association deletes its sessions (§6.2.8.3).
                self.drop_sessions(&node, Loss::Release);
                Ok((0, vec![]))
            }
            msg::SESS_SET_DEL_REQ => {
                // §7.4.6: the requester's sessions naming any of the FQ-CSIDs (§8.2.43) go.
                let node = node_of()?;
                self.assoc_node(from, Some(&node)).map_err(no_seid)?;
                let mut set = Vec::new();
                for i in ies.iter().filter(|i| i.ty == ie::FQ_CSID) {
                    set.extend(pfcp::decode_fq_csid(i.value).map_err(no_seid)?);
                }
                let doomed: Vec<u64> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.owner.as_deref() == Some(&node[..]) && s.csids.iter().any(|c| set.contains(c)))
                    .map(|(k, _)| *k)
                    .collect();
                for k in &doomed {
                    self.sessions.remove(k);
                }
                if !doomed.is_empty() {
                    self.control.stats.sessions_removed.fetch_add(doomed.len() as u64, Ordering::Relaxed);
                    self.publish();
                }
                Ok((0, vec![]))
            }
            msg::SESS_EST_REQ => {
                let (cp_seid, cp_addr) = match find(ie::F_SEID) {
                    Some(v) => (pfcp::decode_fseid(v).map_err(no_seid)?, fseid_v4(v)),
                    None => return Err(no_seid(missing(ie::F_SEID))),
                };
                let owner = self.assoc_node(from, None).map_err(|e| (cp_seid, e))?;
                let node = node_of().map_err(|e| (cp_seid, e.1))?;
                if node != owner {
                    return Err((cp_seid, refuse(cause::NO_ASSOCIATION, "Node ID is not the associated one")));
                }
                let mut csids = Vec::new();
                for i in ies.iter().filter(|i| i.ty == ie::FQ_CSID) {
                    csids.extend(pfcp::decode_fq_csid(i.value).map_err(|e| (cp_seid, e))?);
                }
                let seid = self.random_seid();
                let mut spec = SessionSpec { seid, ..Default::default() };
                let created = self.apply(&mut spec, ies).map_err(|e| (cp_seid, e))?;
                if spec.pdrs.is_empty() {
                    return Err((cp_seid, missing(ie::CREATE_PDR)));
                }
                self.commit(spec.clone()).map_err(|e| (cp_seid, e))?;
                let now = Instant::now();
                let urrs = spec.urrs.iter().map(|u| (u.id, UrrState::new(now))).collect();
                let sess = Sess { cp_seid, cp_addr, urrs, owner: Some(owner), csids, spec, notified: false };
                self.sessions.insert(seid, sess);
                self.publish();
                let mut out = vec![(ie::F_SEID, enc::fseid(seid, self.cfg.n4))];
                out.extend(created);
                Ok((cp_seid, out))
            }
            msg::SESS_MOD_REQ | msg::SESS_DEL_REQ => {
                let owner = self.assoc_node(from, None).map_err(no_seid)?;
                let seid = h.seid.unwrap_or(0);
                let Some(sess) = self.sessions.get(&seid).filter(|s| s.owner.as_ref() == Some(&owner)).cloned() else {
                    // Another association's session is not found either.
                    return Err(no_seid(PfcpError {
                        cause: cause::SESSION_NOT_FOUND,
                        ie: None,
                        what: format!("no session {seid}"),
                    }));
                };
                if h.msg_type == msg::SESS_DEL_REQ {
                    // §7.5.7.2: the final usage of every URR (trigger TERMR), read before the
                    // cores drop the session with the next rule set.
                    let ids: Vec<u32> = sess.spec.urrs.iter().map(|u| u.id).collect();
                    let out = ids
                        .into_iter()
                        .filter_map(|id| self.usage_report(seid, id, trigger::TERMR))
                        .map(|r| (ie::USAGE_REPORT_SDR, r))
                        .collect();
                    self.sessions.remove(&seid);
                    self.publish();
                    return Ok((sess.cp_seid, out));
                }
                let mut spec = sess.spec.clone();
                let created = self.apply(&mut spec, ies).map_err(|e| (sess.cp_seid, e))?;
                let old = self.sessions.remove(&seid);
                if let Err(e) = self.commit(spec.clone()) {
                    if let Some(o) = old {
                        self.sessions.insert(seid, o);
                    }
                    return Err((sess.cp_seid, e));
                }
                let now = Instant::now();
                let mut urrs = sess.urrs.clone();
                urrs.retain(|id, _| spec.urrs.iter().any(|u| u.id == *id));
                for u in &spec.urrs {
                    urrs.entry(u.id).or_insert_with(|| UrrState::new(now));
                }
                // The CP acted: a buffering FAR's next first packet is reported again.
                self.sessions.insert(seid, Sess { spec, urrs, notified: false, ..sess.clone() });
                self.publish();
                // §7.5.4.10, §7.5.5.2: each Query URR gets a Usage Report (trigger IMMER) in the response.
                let mut created = created;
                for q in ies.iter().filter(|i| i.ty == ie::QUERY_URR) {
                    let id = pfcp::decode_id(q.value, ie::URR_ID).map_err(|e| (sess.cp_seid, e))?;
                    if let Some(r) = self.usage_report(seid, id, trigger::IMMER) {
                        created.push((ie::USAGE_REPORT_MODR, r));
                    }
                }
                Ok((sess.cp_seid, created))
            }
            _ => Err(no_seid(PfcpError { cause: cause::NOT_SUPPORTED, ie: None, what: "unsupported".into() })),
        }
    }

    /// Association Setup from `from` for `node` (§6.2.6.2.2).
    fn associate(&mut self, node: Vec<u8>, rts: u32, psrei: bool, from: SocketAddr) {
        let ctl = Arc::clone(&self.control);
        let st = &ctl.stats;
        // Another node associated at this address before: that association ends.
        if let Some(a) = self.assocs.get(&from).filter(|a| a.node != node) {
            let other = a.node.clone();
            self.assocs.remove(&from);
            self.drop_sessions(&other, Loss::Release);
        }
        let old = self.assocs.iter().find(|(_, a)| a.node == node).map(|(k, a)| (*k, a.recovery));
        let had_sessions = self.sessions.values().any(|s| s.owner.as_ref() == Some(&node));
        let restarted = old.is_some_and(|(_, old_rts)| newer(rts, old_rts));
        if let Some((addr, _)) = old {
            self.assocs.remove(&addr);
        }
        // A repeated setup (or one after a failure with sessions kept): the
        // sessions stay with PSREI or when the option keeps them.
        let mut n = 0;
        if (old.is_some() || had_sessions) && !psrei && !self.cfg.keep_sessions_on_restart {
            n = self.drop_sessions(&node, Loss::Restart);
        }
        if restarted {
            st.peer_restarts.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "upf: PFCP peer {} at {from} restarted (Association Setup with a new Recovery Time Stamp): {n} sessions removed",
                pfcp::node_id_text(&node)
            );
        }
        st.associations.fetch_add(1, Ordering::Relaxed);
        let next_heartbeat = Instant::now() + self.cfg.heartbeat;
        self.assocs.insert(from, Assoc { node, recovery: rts, next_heartbeat, heartbeat: None });
    }

    /// A Recovery Time Stamp from `from` (heartbeat): a newer one is a restart.
    fn peer_recovery(&mut self, from: SocketAddr, rts: u32) {
        let Some(a) = self.assocs.get_mut(&from) else { return };
        if !newer(rts, a.recovery) {
            return;
        }
        a.recovery = rts;
        let node = a.node.clone();
        self.control.stats.peer_restarts.fetch_add(1, Ordering::Relaxed);
        let n = if self.cfg.keep_sessions_on_restart { 0 } else { self.drop_sessions(&node, Loss::Restart) };
        eprintln!(
            "upf: PFCP peer {} at {from} restarted (new Recovery Time Stamp): {n} sessions removed",
            pfcp::node_id_text(&node)
        );
    }

    /// Removes `node`'s sessions (unless the configuration keeps them for `why`); returns how many.
    fn drop_sessions(&mut self, node: &[u8], why: Loss) -> usize {
        if why == Loss::Failure && self.cfg.keep_sessions_on_failure {
            return 0;
        }
        let before = self.sessions.len();
        self.sessions.retain(|_, s| s.owner.as_deref() != Some(node));
        let n = before - self.sessions.len();
        if n > 0 {
            self.control.stats.sessions_removed.fetch_add(n as u64, Ordering::Relaxed);
            self.publish();
        }
        n
    }

    fn heartbeat_response(&mut self, h: &Header, body: &[u8], from: SocketAddr) {
        let st = Arc::clone(&self.control);
        let Some(a) = self.assocs.get_mut(&from) else {
            st.stats.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if a.heartbeat.as_ref().is_none_or(|p| p.seq != h.seq) {
            st.stats.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        }
        a.heartbeat = None;
        st.stats.heartbeat_responses.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = pfcp::ies(body).ok().and_then(|ies| recovery_of(&ies)) {
            self.peer_recovery(from, r);
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = (self.seq + 1) & 0x00ff_ffff;
        self.seq
    }

    /// Timers at `now`: Heartbeat Requests due (new and retransmitted), peer
    /// failures (N1 retransmissions unanswered: the association is released),
    /// expired cached responses. Returns the datagrams to send.
    pub fn tick(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        self.expire_cache(now);
        let mut out = self.retransmit_reports(now);
        out.extend(self.gtpu_paths(now));
        if self.cfg.heartbeat.is_zero() {
            return out;
        }
        let before = out.len();
        let mut failed = Vec::new();
        let addrs: Vec<SocketAddr> = self.assocs.keys().copied().collect();
        for addr in addrs {
            let seq_if_new = self.seq.wrapping_add(1) & 0x00ff_ffff;
            let Some(a) = self.assocs.get_mut(&addr) else { continue };
            match &mut a.heartbeat {
                Some(p) if now.duration_since(p.sent) >= self.cfg.t1 => {
                    if p.tries >= self.cfg.n1 {
                        failed.push(addr);
                        continue;
                    }
                    p.tries += 1;
                    p.sent = now;
                    out.push((addr, p.bytes.clone()));
                }
                Some(_) => {}
                None if now >= a.next_heartbeat => {
                    let mut w = Writer::message(msg::HEARTBEAT_REQ, None, seq_if_new);
                    w.ie(ie::RECOVERY_TIME_STAMP, &self.recovery.to_be_bytes());
                    let bytes = w.finish();
                    out.push((addr, bytes.clone()));
                    a.heartbeat = Some(Pending { seq: seq_if_new, sent: now, tries: 0, bytes });
                    a.next_heartbeat = now + self.cfg.heartbeat;
                    self.seq = seq_if_new;
                }
                None => {}
            }
        }
        let hb = (out.len() - before) as u64;
        self.control.stats.heartbeats_sent.fetch_add(hb, Ordering::Relaxed);
        for addr in failed {
            let Some(a) = self.assocs.remove(&addr) else { continue };
            self.control.stats.peer_failures.fetch_add(1, Ordering::Relaxed);
            let n = self.drop_sessions(&a.node, Loss::Failure);
            let kept = self.sessions.values().filter(|s| s.owner.as_ref() == Some(&a.node)).count();
            eprintln!(
                "upf: PFCP peer {} at {addr} failed ({} heartbeats unanswered): association released, {n} sessions removed, {kept} kept",
                pfcp::node_id_text(&a.node),
                self.cfg.n1 + 1
            );
        }
        out
    }

    /// GTP-U path management: echo requests to each N3 peer every
    /// `gtpu_echo` (handed to the cores, which send them on N3), resent after
    /// T1 up to N1 times; a path whose last request went unanswered is
    /// failed: a Node Report Request (Node Report Type UPFR, a User Plane
    /// Path Failure Report naming the Remote GTP-U Peer, §7.4.5.1) to every
    /// associated SMF, retransmitted like Session Reports.
    fn gtpu_paths(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        if self.cfg.gtpu_echo.is_zero() {
            return out;
        }
        // The peers: the FARs' outer-header addresses (read again at most once a second).
        if self.paths_read.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            self.paths_read = Some(now);
            let peers: std::collections::HashSet<u32> = self
                .sessions
                .values()
                .flat_map(|s| s.spec.fars.iter().filter_map(|f| f.ohc_addr.map(u32::from)))
                .collect();
            self.paths.retain(|a, _| peers.contains(a));
            for a in peers {
                self.paths.entry(a).or_insert(Path { next: now, pending: None, failed: false });
            }
        }
        let answered = std::mem::take(&mut *lock(&self.control.echo_in));
        let control = Arc::clone(&self.control);
        let st = &control.stats;
        for (peer, seq) in answered {
            let Some(p) = self.paths.get_mut(&peer) else { continue };
            if p.pending.is_some_and(|x| x.0 == seq) {
                p.pending = None;
                p.failed = false;
                st.echo_responses.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (mut send, mut failed) = (Vec::new(), Vec::new());
        for (&peer, p) in self.paths.iter_mut() {
            match p.pending {
                Some((seq, sent, tries)) if now.duration_since(sent) >= self.cfg.t1 => {
                    if tries >= self.cfg.n1 {
                        p.pending = None;
                        if !p.failed {
                            p.failed = true;
                            failed.push(peer);
                        }
                    } else {
                        p.pending = Some((seq, now, tries + 1));
                        send.push((peer, seq));
                    }
                }
                Some(_) => {}
                None if now >= p.next => {
                    self.echo_seq = self.echo_seq.wrapping_add(1);
                    p.pending = Some((self.echo_seq, now, 0));
                    p.next = now + self.cfg.gtpu_echo;
                    send.push((peer, self.echo_seq));
                }
                None => {}
            }
        }
        if !send.is_empty() {
            st.echo_requests.fetch_add(send.len() as u64, Ordering::Relaxed);
            let mut q = lock(&self.control.echo_out);
            q.append(&mut send);
            self.control.echo_out_n.store(q.len() as u64, Ordering::Relaxed);
        }
        for peer in failed {
            st.path_failures.fetch_add(1, Ordering::Relaxed);
            let smfs: Vec<SocketAddr> = self.assocs.keys().copied().collect();
            for to in smfs {
                let seq = self.next_seq();
                let mut w = Writer::message(msg::NODE_REPORT_REQ, None, seq);
                w.ie(ie::NODE_ID, &self.node).ie(ie::NODE_REPORT_TYPE, &[0x01]);
                let mut peer_ie = vec![0x02];
                peer_ie.extend_from_slice(&peer.to_be_bytes());
                w.group(ie::USER_PLANE_PATH_FAILURE_REPORT).ie(ie::REMOTE_GTPU_PEER, &peer_ie).end();
                let bytes = w.finish();
                self.reports_pending.insert(seq, (to, Pending { seq, sent: now, tries: 0, bytes: bytes.clone() }));
                out.push((to, bytes));
            }
        }
        out
    }

    /// A random UP SEID: non-zero, not in use.
    fn random_seid(&self) -> u64 {
        loop {
            let s = getrandom::u64().unwrap_or_else(|_| fallback_random());
            if s != 0 && !self.sessions.contains_key(&s) {
                return s;
            }
        }
    }

    /// Applies the Create/Update/Remove IEs of a request to `spec`; returns
    /// the Created PDR IEs (for F-TEIDs the UPF chose).
    fn apply(&mut self, spec: &mut SessionSpec, ies: &[pfcp::Ie<'_>]) -> Result<Vec<(u16, Vec<u8>)>, PfcpError> {
        let mut created = Vec::new();
        for i in ies {
            match i.ty {
                ie::REMOVE_PDR => {
                    let id = pfcp::decode_id(i.value, ie::PDR_ID)?;
                    spec.pdrs.retain(|p| u32::from(p.id) != id);
                }
                ie::REMOVE_FAR => {
                    let id = pfcp::decode_id(i.value, ie::FAR_ID)?;
                    spec.fars.retain(|p| p.id != id);
                }
                ie::REMOVE_QER => {
                    let id = pfcp::decode_id(i.value, ie::QER_ID)?;
                    spec.qers.retain(|p| p.id != id);
                }
                ie::REMOVE_URR => {
                    let id = pfcp::decode_id(i.value, ie::URR_ID)?;
                    spec.urrs.retain(|p| p.id != id);
                }
                ie::CREATE_FAR | ie::UPDATE_FAR => {
                    let id = pfcp::decode_id(i.value, ie::FAR_ID)?;
                    let at = spec.fars.iter().position(|f| f.id == id);
                    let upd = i.ty == ie::UPDATE_FAR;
                    let f = pfcp::decode_far(i.value, if upd { at.map(|a| &spec.fars[a]) } else { None })?;
                    replace(&mut spec.fars, at, f, upd, i.ty)?;
                }
                ie::CREATE_BAR | ie::UPDATE_BAR => {
                    // One BAR per session (§7.5.2.6): an update names it, a create replaces it.
                    let upd = i.ty == ie::UPDATE_BAR;
                    if upd && spec.bar.is_none() {
                        return Err(PfcpError { cause: cause::RULE_FAILURE, ie: Some(i.ty), what: "no BAR".into() });
                    }
                    spec.bar = Some(pfcp::decode_bar(i.value, if upd { spec.bar.as_ref() } else { None })?);
                }
                ie::REMOVE_BAR => {
                    pfcp::decode_id(i.value, ie::BAR_ID).ok();
                    spec.bar = None;
                }
                ie::CREATE_QER | ie::UPDATE_QER => {
                    let id = pfcp::decode_id(i.value, ie::QER_ID)?;
                    let at = spec.qers.iter().position(|f| f.id == id);
                    let upd = i.ty == ie::UPDATE_QER;
                    let q = pfcp::decode_qer(i.value, if upd { at.map(|a| &spec.qers[a]) } else { None })?;
                    replace(&mut spec.qers, at, q, upd, i.ty)?;
                }
                ie::CREATE_URR | ie::UPDATE_URR => {
                    let id = pfcp::decode_id(i.value, ie::URR_ID)?;
                    let at = spec.urrs.iter().position(|f| f.id == id);
                    let upd = i.ty == ie::UPDATE_URR;
                    let u = pfcp::decode_urr(i.value, if upd { at.map(|a| &spec.urrs[a]) } else { None })?;
                    replace(&mut spec.urrs, at, u, upd, i.ty)?;
                }
                _ => {}
            }
        }
        // PDRs last: they name FARs, QERs and URRs created by the same request.
        for i in ies.iter().filter(|i| matches!(i.ty, ie::CREATE_PDR | ie::UPDATE_PDR)) {
            let id = pfcp::decode_id(i.value, ie::PDR_ID)?;
            let at = spec.pdrs.iter().position(|p| u32::from(p.id) == id);
            let upd = i.ty == ie::UPDATE_PDR;
            let u = pfcp::decode_pdr(i.value, if upd { at.map(|a| &spec.pdrs[a]) } else { None })?;
            let Some(mut p) = u.pdr else { continue };
            if u.choose_teid {
                // One chosen TEID per session: PDRs asking for one share it.
                let t = spec.pdrs.iter().find_map(|q| q.teid).unwrap_or_else(|| self.alloc_teid());
                p.teid = Some(t);
                let mut w = Writer::default();
                w.ie(ie::PDR_ID, &p.id.to_be_bytes()).ie(ie::F_TEID, &enc::fteid(t, self.cfg.n3));
                created.push((ie::CREATED_PDR, w.into_ies()));
            }
            if let Some(a) = u.ue.0 {
                spec.ue_ipv4 = Some(a);
            }
            if let Some(a) = u.ue.1 {
                spec.ue_ipv6 = Some(a);
            }
            replace(&mut spec.pdrs, at, p, upd, i.ty)?;
        }
        Ok(created)
    }

    /// A UPF-chosen TEID (CHOOSE): random, like UP SEIDs (TS 33.501
    /// recommends unpredictable TEIDs: a sequence lets an attacker on N3 guess
    /// other sessions' tunnels), non-zero, not in use.
    fn alloc_teid(&mut self) -> u32 {
        loop {
            let t = getrandom::u32().unwrap_or_else(|_| fallback_random() as u32);
            if t == 0 {
                continue;
            }
            let used = self.sessions.values().any(|s| s.spec.pdrs.iter().any(|p| p.teid == Some(t)));
            if !used {
                return t;
            }
        }
    }

    /// Checks that `spec` compiles and collides with no other session's TEID or UE address.
    fn commit(&self, spec: SessionSpec) -> Result<(), PfcpError> {
        let rule_failure = |what: String| PfcpError { cause: cause::RULE_FAILURE, ie: None, what };
        RuleSet::compile(std::slice::from_ref(&spec)).map_err(rule_failure)?;
        let ue: Vec<u128> =
            spec.ue_ipv4.map(|a| ip128(a.into())).into_iter().chain(spec.ue_ipv6.map(|a| ip128(a.into()))).collect();
        for (seid, s) in &self.sessions {
            if *seid == spec.seid {
                continue;
            }
            let clash_teid =
                s.spec.pdrs.iter().filter_map(|p| p.teid).any(|t| spec.pdrs.iter().any(|q| q.teid == Some(t)));
            let theirs = [s.spec.ue_ipv4.map(|a| ip128(a.into())), s.spec.ue_ipv6.map(|a| ip128(a.into()))];
            let clash_ue = theirs.iter().flatten().any(|a| ue.contains(a));
            if clash_teid || clash_ue {
                return Err(rule_failure(format!("TEID or UE address already used by session {seid}")));
            }
        }
        Ok(())
    }

    /// The sessions changed: publish now, or at the end of the burst.
    fn publish(&mut self) {
        if self.defer {
            self.dirty = true;
        } else {
            self.publish_now();
        }
    }

    fn publish_now(&self) {
        let specs: Vec<SessionSpec> = self.sessions.values().map(|s| s.spec.clone()).collect();
        // Every session was checked on its own and against the others: this compiles.
        if let Ok(rs) = RuleSet::compile(&specs) {
            self.control.publish(Arc::new(rs));
            self.control.stats.publishes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A Usage Report's IEs (§7.5.8.2) for URR `urr_id` of session `seid`:
    /// the usage since the last report, summed over every core (UL, DL and
    /// total volumes and packet counts). None: no such session or URR.
    fn usage_report(&mut self, seid: u64, urr_id: u32, trig: [u8; 3]) -> Option<Vec<u8>> {
        let now_usage = self.control.usage(seid, urr_id);
        let st = self.sessions.get_mut(&seid)?.urrs.get_mut(&urr_id)?;
        let d = now_usage.since(st.reported);
        st.reported = now_usage;
        st.last = Instant::now();
        let seqn = st.seqn;
        st.seqn = st.seqn.wrapping_add(1);
        let mut w = Writer::default();
        w.ie(ie::URR_ID, &urr_id.to_be_bytes()).ie(ie::UR_SEQN, &seqn.to_be_bytes());
        w.ie(ie::USAGE_REPORT_TRIGGER, &trig);
        w.ie(ie::VOLUME_MEASUREMENT, &enc::volume_measurement(d.ul_bytes, d.dl_bytes, d.ul_packets, d.dl_packets));
        Some(w.into_ies())
    }

    /// Where a session's Session Report Requests go: its CP F-SEID's address
    /// (§7.5.8), at the port of the association owning it (8805 for an SMF
    /// that follows §4.2.3); the association's address when the F-SEID has
    /// no IPv4 address.
    fn report_peer(&self, s: &Sess) -> Option<SocketAddr> {
        let owner = s.owner.as_ref()?;
        let assoc = self.assocs.iter().find(|(_, a)| &a.node == owner).map(|(k, _)| *k)?;
        Some(match s.cp_addr {
            Some(ip) => SocketAddr::new(ip.into(), assoc.port()),
            None => assoc,
        })
    }

    /// A Session Report Request carrying `reports` (Usage Report IEs) for
    /// session `seid`, remembered for retransmission until answered.
    fn report_request(&mut self, seid: u64, reports: Vec<Vec<u8>>, now: Instant) -> Option<(SocketAddr, Vec<u8>)> {
        let s = self.sessions.get(&seid)?;
        let (peer, cp_seid) = (self.report_peer(s)?, s.cp_seid);
        let seq = self.next_seq();
        let mut w = Writer::message(msg::SESS_REPORT_REQ, Some(cp_seid), seq);
        w.ie(ie::REPORT_TYPE, &[0x02]);
        for r in &reports {
            w.ie(ie::USAGE_REPORT_SRR, r);
        }
        let bytes = w.finish();
        self.reports_pending.insert(seq, (peer, Pending { seq, sent: now, tries: 0, bytes: bytes.clone() }));
        self.control.stats.reports_sent.fetch_add(1, Ordering::Relaxed);
        Some((peer, bytes))
    }

    /// Session Report Requests due: for the cores' nudges (a URR's volume
    /// threshold or quota share reached on one core), reports when the whole
    /// session's usage (every core summed) reached the threshold (VOLTH) or
    /// the quota (VOLQU, after which the cores drop the URR's traffic); for
    /// the timers, periodic reports (PERIO, every Measurement Period) and
    /// time threshold reports (TIMTH: usage since the last report and the
    /// Time Threshold passed since it). Each goes to the session's CP F-SEID.
    pub fn report_requests(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        self.report_requests_at(Instant::now())
    }

    /// [`Endpoint::report_requests`] at `now` (tests).
    pub fn report_requests_at(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = self.downlink_data_reports(now);
        let mut due: BTreeMap<u64, Vec<(u32, [u8; 3])>> = BTreeMap::new();
        for r in self.control.take_reports() {
            let Some(s) = self.sessions.get(&r.seid) else { continue };
            let (Some(spec), Some(st)) = (s.spec.urrs.iter().find(|u| u.id == r.urr_id), s.urrs.get(&r.urr_id)) else {
                continue;
            };
            let total = self.control.usage(r.seid, r.urr_id);
            if spec.volume_threshold.is_some_and(|t| total.since(st.reported).bytes() >= t) {
                due.entry(r.seid).or_default().push((r.urr_id, trigger::VOLTH));
            }
        }
        // Quotas are polled (every call, about every 20 ms): the cores drop
        // a URR's traffic once the endpoint marks its quota used up.
        let mut hit = Vec::new();
        for (seid, s) in &self.sessions {
            for u in &s.spec.urrs {
                let Some(q) = u.volume_quota else { continue };
                if s.urrs.get(&u.id).is_some_and(|st| !st.quota_hit) && self.control.usage(*seid, u.id).bytes() >= q {
                    hit.push((*seid, u.id));
                }
            }
        }
        for (seid, id) in hit {
            self.control.exhaust(seid, id);
            if let Some(st) = self.sessions.get_mut(&seid).and_then(|s| s.urrs.get_mut(&id)) {
                st.quota_hit = true;
            }
            due.entry(seid).or_default().push((id, trigger::VOLQU));
        }
        for (seid, s) in &self.sessions {
            for u in &s.spec.urrs {
                let Some(st) = s.urrs.get(&u.id) else { continue };
                let age = now.saturating_duration_since(st.last);
                if u.measurement_period.is_some_and(|p| age >= Duration::from_secs(p.into())) {
                    due.entry(*seid).or_default().push((u.id, trigger::PERIO));
                } else if u.time_threshold.is_some_and(|t| age >= Duration::from_secs(t.into()))
                    && self.control.usage(*seid, u.id).since(st.reported) != Usage::default()
                {
                    due.entry(*seid).or_default().push((u.id, trigger::TIMTH));
                }
            }
        }
        for (seid, urrs) in due {
            let mut seen = Vec::new();
            let reports: Vec<Vec<u8>> = urrs
                .into_iter()
                .filter(|(id, _)| {
                    let first = !seen.contains(id);
                    seen.push(*id);
                    first
                })
                .filter_map(|(id, t)| self.usage_report(seid, id, t))
                .collect();
            if !reports.is_empty() {
                out.extend(self.report_request(seid, reports, now));
            }
        }
        out
    }

    /// Downlink Data Reports (§5.2.4.1, §7.5.8.2): a buffering FAR whose
    /// Apply Action has NOCP got a session's first packet on some core: one
    /// Session Report Request (Report Type DLDR, the PDR ID in a Downlink
    /// Data Report) until the CP modifies the session; retransmitted like
    /// usage reports.
    fn downlink_data_reports(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let events = std::mem::take(&mut *lock(&self.control.ddn));
        let mut out = Vec::new();
        for (seid, pdr) in events {
            let Some(s) = self.sessions.get_mut(&seid).filter(|s| !s.notified) else { continue };
            s.notified = true;
            let cp_seid = s.cp_seid;
            let Some(peer) = self.sessions.get(&seid).and_then(|s| self.report_peer(s)) else { continue };
            let seq = self.next_seq();
            let mut w = Writer::message(msg::SESS_REPORT_REQ, Some(cp_seid), seq);
            w.ie(ie::REPORT_TYPE, &[0x01]);
            w.group(ie::DOWNLINK_DATA_REPORT).ie(ie::PDR_ID, &pdr.to_be_bytes()).end();
            let bytes = w.finish();
            self.reports_pending.insert(seq, (peer, Pending { seq, sent: now, tries: 0, bytes: bytes.clone() }));
            self.control.stats.ddn_sent.fetch_add(1, Ordering::Relaxed);
            out.push((peer, bytes));
        }
        out
    }

    /// Session Report Requests unanswered for T1: sent again, up to N1
    /// times, then given up (counted).
    fn retransmit_reports(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        let (t1, n1) = (self.cfg.t1, self.cfg.n1);
        let st = Arc::clone(&self.control);
        self.reports_pending.retain(|_, (to, p)| {
            if now.saturating_duration_since(p.sent) < t1 {
                return true;
            }
            if p.tries >= n1 {
                st.stats.reports_unanswered.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            p.tries += 1;
            p.sent = now;
            st.stats.reports_retransmitted.fetch_add(1, Ordering::Relaxed);
            out.push((*to, p.bytes.clone()));
            true
        });
        out
    }

    /// Sessions held.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The local SEIDs of the sessions held.
    pub fn seids(&self) -> Vec<u64> {
        self.sessions.keys().copied().collect()
    }

    /// Associations held.
    pub fn associations(&self) -> usize {
        self.assocs.len()
    }
}

/// The IPv4 address of an F-SEID IE (§8.2.37), if it has one.
fn fseid_v4(v: &[u8]) -> Option<Ipv4Addr> {
    let a: [u8; 4] = v.get(9..13)?.try_into().ok()?;
    (v.first()? & 2 != 0).then(|| Ipv4Addr::from(a))
}

/// The Recovery Time Stamp IE among `ies`.
fn recovery_of(ies: &[pfcp::Ie<'_>]) -> Option<u32> {
    let v = ies.iter().find(|i| i.ty == ie::RECOVERY_TIME_STAMP)?.value;
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// Random bits when the OS source fails: SipHash of a counter under the
/// process's randomly keyed `RandomState`.
fn fallback_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static STATE: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = STATE.get_or_init(Default::default).build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

fn missing(t: u16) -> PfcpError {
    PfcpError { cause: cause::MANDATORY_IE_MISSING, ie: Some(t), what: format!("IE {t} missing") }
}

/// Creates a rule (`at` must be None) or updates one (`at` must be Some).
fn replace<T>(v: &mut Vec<T>, at: Option<usize>, x: T, update: bool, ty: u16) -> Result<(), PfcpError> {
    match (at, update) {
        (Some(a), true) => v[a] = x,
        (None, false) => v.push(x),
        (Some(_), false) => {
            return Err(PfcpError { cause: cause::RULE_FAILURE, ie: Some(ty), what: "rule ID already exists".into() })
        }
        (None, true) => {
            return Err(PfcpError { cause: cause::RULE_FAILURE, ie: Some(ty), what: "no such rule to update".into() })
        }
    }
    Ok(())
}

/// A running PFCP endpoint: its socket address. The thread ends once no
/// `upf` holds its [`UpfControl`] any more.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    /// The bound address.
    pub addr: SocketAddr,
}

/// Binds `addr` (UDP) and serves PFCP on a thread, publishing into `control`
/// (Node ID, N3 and N4 address `node`; other settings default).
pub fn spawn(addr: &str, node: Ipv4Addr, initial: &[SessionSpec], control: &Arc<UpfControl>) -> Result<Server, String> {
    spawn_with(addr, N4Config::new(node), initial, control)
}

/// Binds `addr` (UDP) and serves PFCP configured by `cfg` on a thread,
/// publishing into `control`.
pub fn spawn_with(
    addr: &str,
    cfg: N4Config,
    initial: &[SessionSpec],
    control: &Arc<UpfControl>,
) -> Result<Server, String> {
    let sock = UdpSocket::bind(addr).map_err(|e| format!("PFCP endpoint {addr}: {e}"))?;
    let local = sock.local_addr().map_err(|e| e.to_string())?;
    control.stats.rcvbuf.store(size_rcvbuf(&sock, cfg.rcvbuf) as u64, Ordering::Relaxed);
    let rx = sock.try_clone().map_err(|e| format!("PFCP endpoint {addr}: {e}"))?;
    rx.set_read_timeout(Some(Duration::from_millis(20))).map_err(|e| e.to_string())?;
    let (tx, queue) = mpsc::sync_channel(QUEUE);
    let weak = Arc::downgrade(control);
    let weak_rx = Arc::downgrade(control);
    let mut ep = Endpoint::with_config(cfg, initial, Arc::clone(control));
    std::thread::Builder::new()
        .name("pfcp-rx".into())
        .spawn(move || receive(rx, tx, weak_rx))
        .map_err(|e| format!("PFCP endpoint: {e}"))?;
    std::thread::Builder::new()
        .name("pfcp".into())
        .spawn(move || serve(sock, queue, &mut ep, weak))
        .map_err(|e| format!("PFCP endpoint: {e}"))?;
    Ok(Server { addr: local })
}

/// Asks for a `want`-byte receive buffer, past `net.core.rmem_max` when
/// the process may (CAP_NET_ADMIN); returns the size the kernel reports.
fn size_rcvbuf(sock: &UdpSocket, want: usize) -> usize {
    use rustix::net::sockopt;
    let _ = sockopt::set_socket_recv_buffer_size(sock, want);
    let got = sockopt::socket_recv_buffer_size(sock).unwrap_or(0);
    // Linux reports twice the size set (its bookkeeping); below that, rmem_max capped it.
    if got < want.saturating_mul(2) {
        let _ = sockopt::set_socket_recv_buffer_size_force(sock, want);
    }
    sockopt::socket_recv_buffer_size(sock).unwrap_or(got)
}

/// The kernel's drop count for `sock` (the `drops` column of its row in
/// /proc/net/udp or udp6, found by the socket's inode); None off Linux.
pub fn kernel_drops(sock: &UdpSocket) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let ino = std::fs::metadata(format!("/proc/self/fd/{}", sock.as_raw_fd())).ok()?.ino().to_string();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            if f.len() >= 13 && f[9] == ino {
                return f[12].parse().ok();
            }
        }
    }
    None
}

/// The reader: moves datagrams from the socket to the endpoint's queue as
/// they arrive (the endpoint may be compiling); a full queue drops, counted.
fn receive(sock: UdpSocket, tx: mpsc::SyncSender<(Vec<u8>, SocketAddr)>, weak: Weak<UpfControl>) {
    let mut buf = vec![0u8; 65536];
    loop {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => match tx.try_send((buf[..n].to_vec(), from)) {
                Ok(()) => {}
                Err(mpsc::TrySendError::Full(_)) => {
                    if let Some(c) = weak.upgrade() {
                        c.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(mpsc::TrySendError::Disconnected(_)) => return,
            },
            Err(_) if weak.strong_count() == 0 => return,
            Err(_) => {}
        }
    }
}

fn serve(sock: UdpSocket, queue: mpsc::Receiver<(Vec<u8>, SocketAddr)>, ep: &mut Endpoint, weak: Weak<UpfControl>) {
    let mut rsps: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
    let mut drops_read = Instant::now();
    loop {
        // One waiting receive (20 ms timeout), then whatever else is queued:
        // the burst's changes are compiled once, before any response goes out.
        match queue.recv_timeout(Duration::from_millis(20)) {
            Ok((d, from)) => {
                rsps.extend(ep.handle_deferred(&d, from).map(|r| (from, r)));
                for _ in 1..BURST {
                    let Ok((d, from)) = queue.try_recv() else { break };
                    rsps.extend(ep.handle_deferred(&d, from).map(|r| (from, r)));
                }
                ep.flush();
                for (to, r) in rsps.drain(..) {
                    let _ = sock.send_to(&r, to);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        for (to, m) in ep.tick(now).into_iter().chain(ep.report_requests()) {
            let _ = sock.send_to(&m, to);
        }
        if now.duration_since(drops_read) >= Duration::from_millis(100) {
            drops_read = now;
            if let Some(d) = kernel_drops(&sock) {
                ep.control.stats.kernel_drops.store(d, Ordering::Relaxed);
            }
        }
        // The endpoint holds one reference; the data path's `upf`s hold the others.
        if weak.strong_count() <= 1 {
            return;
        }
    }
}

/// Control blocks by name: PFCP endpoints by address, in-process rule sets by `@NAME`.
fn registry() -> &'static Mutex<HashMap<String, Weak<UpfControl>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<UpfControl>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Registers a control block under `name` for `upf(rules=NAME)` (embedding,
/// benchmarks: rules compiled in-process instead of read from a file). The
/// registry holds it weakly: keep the `Arc` while chains are being built.
pub fn register(name: &str, c: &Arc<UpfControl>) {
    lock(registry()).insert(format!("@{name}"), Arc::downgrade(c));
}

/// The control block registered under `name`.
pub fn named(name: &str) -> Option<Arc<UpfControl>> {
    lock(registry()).get(&format!("@{name}")).and_then(Weak::upgrade)
}

/// The control block of the endpoint at `addr`, shared by every core's
/// `upf(pfcp=ADDR)`: the first caller binds the socket and starts serving.
pub fn shared(addr: &str, cfg: N4Config, initial: &[SessionSpec]) -> Result<Arc<UpfControl>, String> {
    let mut map = lock(registry());
    if let Some(c) = map.get(addr).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let rules = RuleSet::compile(initial)?;
    let c = UpfControl::new(Arc::new(rules));
    spawn_with(addr, cfg, initial, &c)?;
    map.insert(addr.to_string(), Arc::downgrade(&c));
    Ok(c)
}

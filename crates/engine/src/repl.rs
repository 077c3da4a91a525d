//! State replication between flowplane instances (`flowplane run
//! --replicate udp:PEER:PORT --replicate-listen udp:ADDR:PORT
//! --replicate-role active|standby|both`): one background thread per run,
//! off the data path, speaking the UDP protocol of
//! [`flowplane_wire::repl`] (batched records, sequence numbers, resync
//! requests; the wire format is documented there).
//!
//! **Sending** (`active`, `both`): NFs that replicate (`nat`: a mapping
//! taken, a mapping released; `lb`: a flow's backend chosen) push records
//! into a bounded queue per core and NF ([`flowplane_nf::repl::ReplTx`]: one
//! ring write, a full queue counts the record `queue_lost` and the worker
//! goes on — the hand-off of the IPFIX exporter, `crate::ipfix`). The thread
//! drains the queues, packs records into datagrams of at most
//! [`flowplane_wire::repl::MAX_DATAGRAM`] bytes (at most a millisecond
//! after the push), numbers them and sends them to the peer; a heartbeat
//! (no records) goes out after a second without traffic. A resync request
//! from the peer, a queue that lost records, and every [`REFRESH`] make every
//! worker walk its tables between batches ([`ReplLink::serve`], a bounded
//! number of entries per pause) and push every live replicated entry again:
//! a bulk resync, and the refresh that keeps a standby's copies from idling
//! out (their idle clocks run on the standby's own packet clock from import).
//!
//! **Receiving** (`standby`, `both`): the thread reads datagrams, follows
//! the sender's session and sequence numbers (a gap: the missing datagrams
//! are counted `lost` and a resync requested; a new session not starting at
//! 1, or the run's start with a known peer: a resync requested; at most one
//! request per [`RESYNC_HOLDOFF`]), measures each record's lag (its arrival
//! minus the datagram's send time, both wall clocks) and hands the records
//! to the worker of the sender's core through a bounded ring (full: counted,
//! and a resync requested). The worker imports them between two batches
//! into its flow table (`exec::repl`, the table's insert as the hand-over
//! between cores uses it), after the NF adopted the state (nat takes the
//! port in its pool), so traffic moved to this instance finds its flows.
//!
//! Both instances run the same chain with the same parameters and `--cores`.
//! What is not replicated: NFs other than nat and lb (one-line refusal),
//! coarse state, inbound nat flows (rebuilt from the mapping by the first
//! reply), TCP close states (a standby frees a port on the sender's release
//! record, or when idle), counters.

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use flowplane_nf::repl::{Record, ReplTx};
use flowplane_wire::repl::{decode, encode, Header, Kind, FLAG_RESYNC, MAX_DATAGRAM};
use serde::Serialize;

use crate::error::EngineError;
use crate::exec::repl::{Imported, ReplWalk};
use crate::exec::Pipeline;
use crate::hist::Histogram;

/// Records per core's queue (each way) by default.
pub const DEFAULT_QUEUE: usize = 1 << 16;
/// A heartbeat goes out after this long without a datagram.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Every live entry is sent again this often (the standby's copies' idle clocks restart).
pub const REFRESH: Duration = Duration::from_secs(5);
/// At most one resync request per this long.
pub const RESYNC_HOLDOFF: Duration = Duration::from_millis(250);
/// Entries a worker's walk visits per table between two batches.
pub const WALK_CHUNK: usize = 256;
/// Records a worker imports between two batches at most.
pub const IMPORT_CHUNK: usize = 4096;

/// What an instance does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sends its NFs' updates to the peer, answers resync requests.
    Active,
    /// Imports the peer's updates, asks for resyncs.
    Standby,
    /// Both (active-active: each instance's own flows replicated to the other).
    Both,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "active" => Ok(Role::Active),
            "standby" => Ok(Role::Standby),
            "both" => Ok(Role::Both),
            _ => Err(format!("--replicate-role '{s}': expected active, standby or both")),
        }
    }
}

impl Role {
    fn sends(self) -> bool {
        self != Role::Standby
    }
    fn imports(self) -> bool {
        self != Role::Active
    }
    fn name(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
            Role::Both => "both",
        }
    }
}

/// Parses `udp:HOST:PORT` (the option's name for errors): `HOST:PORT`. Port 0 (any free port) only where
/// `any_port`.
pub fn parse_endpoint(opt: &str, s: &str, any_port: bool) -> Result<String, String> {
    let bad = || format!("{opt} '{s}': expected udp:HOST:PORT");
    let rest = s.strip_prefix("udp:").ok_or_else(bad)?;
    let (h, p) = rest.rsplit_once(':').ok_or_else(bad)?;
    if h.is_empty() || p.parse::<u16>().map_or(true, |p| p == 0 && !any_port) {
        return Err(bad());
    }
    Ok(rest.to_string())
}

/// The replication settings.
#[derive(Clone, Debug)]
pub struct ReplConfig {
    /// `--replicate`: where updates (active) or resync requests (standby) go, `HOST:PORT`.
    pub peer: Option<String>,
    /// `--replicate-listen`: the socket's address (a standby receives there; an active instance's resync
    /// requests arrive there), `HOST:PORT`.
    pub listen: Option<String>,
    /// What this instance does.
    pub role: Role,
    /// Records per core's queue.
    pub queue: usize,
    /// How often every live entry is sent again ([`REFRESH`]; zero: walk after walk, the bench's load).
    pub refresh: Duration,
}

impl ReplConfig {
    /// From the options: the role defaults to active with a peer, else standby; checked against what it
    /// needs (one-line errors).
    pub fn new(peer: Option<&str>, listen: Option<&str>, role: Option<&str>) -> Result<Self, String> {
        let peer = peer.map(|p| parse_endpoint("--replicate", p, false)).transpose()?;
        let listen = listen.map(|l| parse_endpoint("--replicate-listen", l, true)).transpose()?;
        let role = match role {
            Some(r) => r.parse()?,
            None if peer.is_some() => Role::Active,
            None => Role::Standby,
        };
        if role.sends() && peer.is_none() {
            return Err(format!(
                "--replicate-role {}: needs --replicate udp:PEER:PORT (where updates go)",
                role.name()
            ));
        }
        if role.imports() && listen.is_none() {
            return Err(format!(
                "--replicate-role {}: needs --replicate-listen udp:ADDR:PORT (where updates arrive)",
                role.name()
            ));
        }
        Ok(ReplConfig { peer, listen, role, queue: DEFAULT_QUEUE, refresh: REFRESH })
    }
}

/// What replication did (the report's `replication`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ReplReport {
    /// This instance's role.
    pub role: String,
    /// `--replicate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The socket's address.
    pub listen: String,
    /// Records sent.
    pub sent_records: u64,
    /// Datagrams sent (heartbeats included).
    pub sent_datagrams: u64,
    /// Bytes of those datagrams.
    pub sent_bytes: u64,
    /// Records a full queue refused on the sender (a resync repairs them).
    pub queue_lost: u64,
    /// Sends that failed.
    pub send_errors: u64,
    /// Resync walks started (requests served, queue losses, refreshes not counted).
    pub resyncs_served: u64,
    /// Records received.
    pub received_records: u64,
    /// Datagrams received (updates, heartbeats included).
    pub received_datagrams: u64,
    /// Datagrams missing from the sender's sequence (gaps).
    pub lost_datagrams: u64,
    /// Datagrams refused (bad magic, version, truncated).
    pub malformed: u64,
    /// Resync requests sent.
    pub resyncs_requested: u64,
    /// Sessions of the peer seen (a new one: it restarted).
    pub peer_sessions: u64,
    /// Records imported into the flow tables (upserts).
    pub imported: u64,
    /// Deletes applied.
    pub deleted: u64,
    /// Records refused by the import (another configuration, a full table, a delete of an unknown flow).
    pub refused: u64,
    /// Records a worker's full inbox refused (a resync was requested).
    pub inbox_full: u64,
    /// Lag of the records received (arrival minus the datagram's send time, wall clocks): p50, p99, max, in us.
    pub lag_p50_us: u64,
    /// p99.
    pub lag_p99_us: u64,
    /// Largest.
    pub lag_max_us: u64,
}

impl ReplReport {
    /// One line for the text report.
    pub fn line(&self) -> String {
        format!(
            "replication  {}: sent {} records in {} datagrams ({} queue-lost), received {} records in {} datagrams, {} lost, {} resyncs requested, {} served, imported {} deleted {} refused {}, lag p99 {} us",
            self.role,
            self.sent_records,
            self.sent_datagrams,
            self.queue_lost,
            self.received_records,
            self.received_datagrams,
            self.lost_datagrams,
            self.resyncs_requested,
            self.resyncs_served,
            self.imported,
            self.deleted,
            self.refused,
            self.lag_p99_us
        )
    }
}

/// Live counters (the metrics read them while the run goes on).
#[derive(Debug, Default)]
pub struct ReplStats {
    /// Records sent.
    pub sent_records: AtomicU64,
    /// Records received.
    pub received_records: AtomicU64,
    /// Datagrams lost (gaps).
    pub lost_datagrams: AtomicU64,
    /// Resync requests sent.
    pub resyncs_requested: AtomicU64,
    /// Resync walks started on request.
    pub resyncs_served: AtomicU64,
    /// Records imported.
    pub imported: AtomicU64,
    /// Deletes applied.
    pub deleted: AtomicU64,
    /// Records refused by the import.
    pub refused: AtomicU64,
    /// Lag p99 (us) of the records received so far.
    pub lag_p99_us: AtomicU64,
    /// Records a sender's full queue refused.
    pub queue_lost: AtomicU64,
}

/// A worker's side: its inbox (standby) and the walk requests (sender).
pub struct ReplLink {
    inbox: Option<rtrb::Consumer<Record>>,
    walk_epoch: Arc<AtomicU64>,
    seen: u64,
    /// A walk was asked for since the last one started.
    again: bool,
    walk: Option<(ReplWalk, Option<Instant>)>,
    stats: Arc<ReplStats>,
}

impl ReplLink {
    /// Between two batches: imports what arrived (at most [`IMPORT_CHUNK`]), and goes on with a requested
    /// walk over the tables ([`WALK_CHUNK`] entries per table, at most one step per 100 us, so a walk
    /// does not outrun the thread that drains the queues).
    pub fn serve(&mut self, exec: &mut Pipeline) {
        if let Some(rx) = &mut self.inbox {
            let n = rx.slots().min(IMPORT_CHUNK);
            if n > 0 {
                let now = exec.repl_now();
                let (mut up, mut del, mut bad) = (0, 0, 0);
                for _ in 0..n {
                    let Ok(r) = rx.pop() else { break };
                    match exec.repl_import(&r, now) {
                        Imported::Upserted => up += 1,
                        Imported::Deleted => del += 1,
                        Imported::Refused => bad += 1,
                    }
                }
                self.stats.imported.fetch_add(up, Ordering::Relaxed);
                self.stats.deleted.fetch_add(del, Ordering::Relaxed);
                self.stats.refused.fetch_add(bad, Ordering::Relaxed);
            }
        }
        let e = self.walk_epoch.load(Ordering::Relaxed);
        if e != self.seen {
            // A walk under way goes on to its end; the new one starts then.
            self.seen = e;
            self.again = true;
        }
        if self.walk.is_none() && self.again {
            self.again = false;
            let mut w = ReplWalk::default();
            exec.repl_walk_start(&mut w);
            self.walk = Some((w, None));
        }
        if let Some((w, last)) = &mut self.walk {
            if last.is_none_or(|t| t.elapsed() >= Duration::from_micros(100)) {
                *last = Some(Instant::now());
                if exec.repl_walk_step(w, WALK_CHUNK) {
                    self.walk = None;
                }
            }
        }
    }
}

/// The running replication: hands out queues and links, then is finished once the workers stopped.
pub struct Replicator {
    cfg: ReplConfig,
    rings: mpsc::Sender<rtrb::Consumer<Record>>,
    inboxes: std::sync::Mutex<Vec<Option<rtrb::Consumer<Record>>>>,
    walk_epoch: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    stats: Arc<ReplStats>,
    stop: Arc<AtomicBool>,
    local: String,
    thread: JoinHandle<ReplReport>,
}

impl Replicator {
    /// Binds the socket (a bad or busy address is an error now) and starts the thread for `cores` workers.
    pub fn start(cfg: &ReplConfig, cores: usize) -> Result<Self, EngineError> {
        let err = |what: &str, e: std::io::Error| EngineError::Config(format!("{what}: {e}"));
        let resolve = |opt: &str, a: &str| -> Result<SocketAddr, EngineError> {
            a.to_socket_addrs()
                .map_err(|e| err(&format!("{opt} udp:{a}"), e))?
                .next()
                .ok_or_else(|| EngineError::Config(format!("{opt} udp:{a}: no address")))
        };
        let peer = cfg.peer.as_deref().map(|p| resolve("--replicate", p)).transpose()?;
        let local = match (&cfg.listen, peer) {
            (Some(l), _) => resolve("--replicate-listen", l)?,
            (None, Some(p)) if p.is_ipv6() => SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0),
            _ => SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0),
        };
        let what = format!("--replicate-listen udp:{local}");
        let sock = UdpSocket::bind(local).map_err(|e| err(&what, e))?;
        sock.set_read_timeout(Some(Duration::from_millis(1))).map_err(|e| err(&what, e))?;
        let listen = sock.local_addr().map_or_else(|_| local.to_string(), |a| a.to_string());
        let (tx, rx) = mpsc::channel();
        let mut producers = Vec::new();
        let mut inboxes = Vec::new();
        for _ in 0..cores {
            if cfg.role.imports() {
                let (p, c) = rtrb::RingBuffer::new(cfg.queue.max(1));
                producers.push(Some(p));
                inboxes.push(Some(c));
            } else {
                producers.push(None);
                inboxes.push(None);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let walk_epoch = Arc::new(AtomicU64::new(0));
        let lost = Arc::new(AtomicU64::new(0));
        let stats = Arc::new(ReplStats::default());
        let report = ReplReport {
            role: cfg.role.name().into(),
            peer: cfg.peer.as_ref().map(|p| format!("udp:{p}")),
            listen: format!("udp:{listen}"),
            ..Default::default()
        };
        let mut th = Thread {
            role: cfg.role,
            refresh: cfg.refresh,
            sock,
            peer,
            report,
            session: session_id(),
            seq: 0,
            pending: Vec::new(),
            buf: Vec::with_capacity(MAX_DATAGRAM),
            last_sent: None,
            inboxes: producers,
            walk_epoch: Arc::clone(&walk_epoch),
            lost: Arc::clone(&lost),
            stats: Arc::clone(&stats),
            peer_session: None,
            expect: 0,
            want_resync: cfg.role.imports() && peer.is_some(),
            last_request: None,
            last_source: None,
            lag: Histogram::default(),
            resync_until: None,
        };
        let st = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fp-repl".into())
            .spawn(move || {
                th.run(rx, &st);
                th.report
            })
            .map_err(EngineError::Thread)?;
        Ok(Replicator {
            cfg: cfg.clone(),
            rings: tx,
            inboxes: std::sync::Mutex::new(inboxes),
            walk_epoch,
            lost,
            stats,
            stop,
            local: listen,
            thread,
        })
    }

    /// The socket's bound address (`HOST:PORT`).
    pub fn local_addr(&self) -> String {
        self.local.clone()
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<ReplStats> {
        Arc::clone(&self.stats)
    }

    /// A new queue for the `stage`-th stateful NF on worker `core` (None: this instance does not send).
    pub fn queue(&self, stage: u8, core: usize) -> Option<ReplTx> {
        if !self.cfg.role.sends() {
            return None;
        }
        let (tx, rx) = ReplTx::new(self.cfg.queue, Arc::clone(&self.lost), stage, core.min(255) as u8);
        // The thread only ends after `finish`, which takes `self`: the receiver is alive.
        let _ = self.rings.send(rx);
        Some(tx)
    }

    /// Worker `core`'s link (once per core).
    pub fn link(&self, core: usize) -> ReplLink {
        let inbox = self.inboxes.lock().ok().and_then(|mut v| v.get_mut(core).and_then(Option::take));
        ReplLink {
            inbox,
            walk_epoch: Arc::clone(&self.walk_epoch),
            seen: 0,
            again: false,
            walk: None,
            stats: Arc::clone(&self.stats),
        }
    }

    /// Sends what is queued (a final heartbeat carries the last sequence number) and stops the thread.
    pub fn finish(self) -> ReplReport {
        self.stop.store(true, Ordering::Release);
        drop(self.rings);
        let mut r = self.thread.join().unwrap_or_default();
        r.queue_lost += self.lost.load(Ordering::Relaxed);
        r.imported = self.stats.imported.load(Ordering::Relaxed);
        r.deleted = self.stats.deleted.load(Ordering::Relaxed);
        r.refused = self.stats.refused.load(Ordering::Relaxed);
        r
    }
}

/// A session id: the wall clock's nanoseconds mixed with the process id (a restarted peer differs).
fn session_id() -> u32 {
    let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let x = t ^ (u64::from(std::process::id()) << 32);
    let x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((x >> 32) as u32).max(1)
}

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

struct Thread {
    role: Role,
    refresh: Duration,
    sock: UdpSocket,
    peer: Option<SocketAddr>,
    report: ReplReport,
    session: u32,
    seq: u64,
    pending: Vec<Record>,
    buf: Vec<u8>,
    last_sent: Option<Instant>,
    inboxes: Vec<Option<rtrb::Producer<Record>>>,
    walk_epoch: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    stats: Arc<ReplStats>,
    /// The peer's session and the next sequence number expected from it.
    peer_session: Option<u32>,
    expect: u64,
    want_resync: bool,
    last_request: Option<Instant>,
    last_source: Option<SocketAddr>,
    lag: Histogram,
    /// Datagrams sent before this carry [`FLAG_RESYNC`] (a walk asked for by the peer is under way).
    resync_until: Option<Instant>,
}

impl Thread {
    fn run(&mut self, rx: mpsc::Receiver<rtrb::Consumer<Record>>, stop: &AtomicBool) {
        let mut rings: Vec<rtrb::Consumer<Record>> = Vec::new();
        let mut last_refresh = Instant::now();
        let mut lost_seen = 0;
        let mut recs = Vec::new();
        let mut rbuf = vec![0u8; 65536];
        loop {
            // Read before draining: records pushed before `stop` are then all seen by the last pass.
            let stopping = stop.load(Ordering::Acquire);
            rings.extend(rx.try_iter());
            let mut n = 0;
            for ring in &mut rings {
                // A bounded chunk per ring, so one busy core does not starve the others' queues.
                for _ in 0..4096 {
                    let Ok(r) = ring.pop() else { break };
                    self.pending.push(r);
                    n += 1;
                }
                if self.pending.len() >= 256 {
                    self.flush();
                }
            }
            self.flush();
            if self.role.sends() {
                if self.last_sent.is_none_or(|t| t.elapsed() >= HEARTBEAT) {
                    self.send(&[], 0);
                }
                // Records a full queue refused: every entry again, once the walk under way (if any) is over.
                let lost = self.lost.load(Ordering::Relaxed);
                if lost != lost_seen || last_refresh.elapsed() >= self.refresh {
                    lost_seen = lost;
                    last_refresh = Instant::now();
                    self.walk_epoch.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.queue_lost.store(lost, Ordering::Relaxed);
            }
            // Receive: one blocking read (1 ms) when there was nothing to send, then what is waiting.
            let mut got = 0;
            loop {
                if n > 0 || got > 0 {
                    let _ = self.sock.set_nonblocking(true);
                }
                let r = self.sock.recv_from(&mut rbuf);
                let _ = self.sock.set_nonblocking(false);
                match r {
                    Ok((len, from)) => {
                        got += 1;
                        self.receive(&rbuf[..len], from, &mut recs);
                        if got >= 1024 {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            if self.role.imports() && self.want_resync {
                self.request_resync();
            }
            if stopping && n == 0 {
                break;
            }
        }
        self.flush();
        if self.role.sends() {
            // The last sequence number: a receiver learns of a lost tail.
            self.send(&[], 0);
        }
        self.report.lag_p50_us = self.lag.quantile(0.5);
        self.report.lag_p99_us = self.lag.quantile(0.99);
        self.report.lag_max_us = self.lag.max();
    }

    /// Sends the pending records, as many datagrams as they take.
    fn flush(&mut self) {
        let mut at = 0;
        let pending = std::mem::take(&mut self.pending);
        while at < pending.len() {
            let flags = if self.resync_until.is_some_and(|t| Instant::now() < t) { FLAG_RESYNC } else { 0 };
            at += self.send(&pending[at..], flags);
        }
        self.pending = pending;
        self.pending.clear();
    }

    /// One datagram with as many of `recs` as fit (a heartbeat if none); returns how many went.
    fn send(&mut self, recs: &[Record], flags: u16) -> usize {
        let Some(peer) = self.peer else { return recs.len() };
        self.seq += 1;
        let h =
            Header { kind: Kind::Updates, session: self.session, seq: self.seq, sent_ns: wall_ns(), count: 0, flags };
        let n = encode(&h, recs, MAX_DATAGRAM, &mut self.buf);
        match self.sock.send_to(&self.buf, peer) {
            Ok(_) => {
                self.report.sent_datagrams += 1;
                self.report.sent_bytes += self.buf.len() as u64;
                self.report.sent_records += n as u64;
                self.stats.sent_records.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => self.report.send_errors += 1,
        }
        self.last_sent = Some(Instant::now());
        n.max(usize::from(recs.is_empty()))
    }

    fn receive(&mut self, b: &[u8], from: SocketAddr, recs: &mut Vec<Record>) {
        let h = match decode(b, recs) {
            Ok(h) => h,
            Err(_) => {
                self.report.malformed += 1;
                return;
            }
        };
        match h.kind {
            Kind::ResyncRequest => {
                if self.role.sends() {
                    self.report.resyncs_served += 1;
                    self.stats.resyncs_served.fetch_add(1, Ordering::Relaxed);
                    self.walk_epoch.fetch_add(1, Ordering::Relaxed);
                    self.resync_until = Some(Instant::now() + Duration::from_secs(1));
                }
            }
            Kind::Updates => {
                if !self.role.imports() {
                    return;
                }
                self.last_source = Some(from);
                self.report.received_datagrams += 1;
                if self.peer_session != Some(h.session) {
                    // A new sender (or a restarted one): what it sent before this datagram was missed.
                    self.peer_session = Some(h.session);
                    self.report.peer_sessions += 1;
                    if h.seq != 1 {
                        self.want_resync = true;
                    }
                    self.expect = h.seq.saturating_add(1);
                } else if h.seq >= self.expect {
                    if h.seq > self.expect {
                        self.report.lost_datagrams += h.seq - self.expect;
                        self.stats.lost_datagrams.fetch_add(h.seq - self.expect, Ordering::Relaxed);
                        self.want_resync = true;
                    }
                    self.expect = h.seq.saturating_add(1);
                }
                // (A datagram older than expected came late or twice: its records are applied all the same.)
                if recs.is_empty() {
                    return;
                }
                let lag_us = wall_ns().saturating_sub(h.sent_ns) / 1000;
                let cores = self.inboxes.len().max(1);
                for r in recs.iter() {
                    self.lag.record(lag_us);
                    let q = self.inboxes.get_mut(usize::from(r.core) % cores).and_then(Option::as_mut);
                    match q.map(|q| q.push(*r)) {
                        Some(Ok(())) => {}
                        _ => {
                            self.report.inbox_full += 1;
                            self.want_resync = true;
                        }
                    }
                }
                self.report.received_records += recs.len() as u64;
                self.stats.received_records.fetch_add(recs.len() as u64, Ordering::Relaxed);
                self.stats.lag_p99_us.store(self.lag.quantile(0.99), Ordering::Relaxed);
            }
        }
    }

    fn request_resync(&mut self) {
        if self.last_request.is_some_and(|t| t.elapsed() < RESYNC_HOLDOFF) {
            return;
        }
        let Some(to) = self.peer.or(self.last_source) else { return };
        let h = Header {
            kind: Kind::ResyncRequest,
            session: self.session,
            seq: self.expect.saturating_sub(1),
            sent_ns: wall_ns(),
            count: 0,
            flags: 0,
        };
        encode(&h, &[], MAX_DATAGRAM, &mut self.buf);
        if self.sock.send_to(&self.buf, to).is_ok() {
            self.report.resyncs_requested += 1;
            self.stats.resyncs_requested.fetch_add(1, Ordering::Relaxed);
        } else {
            self.report.send_errors += 1;
        }
        self.last_request = Some(Instant::now());
        self.want_resync = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_bad_ones_are_one_line_errors() {
        let c = ReplConfig::new(Some("udp:127.0.0.1:7000"), None, None).unwrap();
        assert_eq!((c.role, c.peer.as_deref()), (Role::Active, Some("127.0.0.1:7000")));
        let c = ReplConfig::new(None, Some("udp:[::1]:7001"), None).unwrap();
        assert_eq!((c.role, c.listen.as_deref()), (Role::Standby, Some("[::1]:7001")));
        for (p, l, r) in [
            (Some("tcp:h:1"), None, None),
            (Some("udp:h:0"), None, None),
            (None, Some("udp:h"), None),
            (None, None, Some("active")),
            (Some("udp:h:1"), None, Some("standby")),
            (Some("udp:h:1"), None, Some("both")),
            (Some("udp:h:1"), None, Some("primary")),
        ] {
            let e = ReplConfig::new(p, l, r).unwrap_err();
            assert!(!e.contains('\n') && e.starts_with("--replicate"), "{e}");
        }
    }

    fn pop_all(link: &mut ReplLink) -> Vec<Record> {
        let mut v = Vec::new();
        if let Some(rx) = link.inbox.as_mut() {
            while let Ok(r) = rx.pop() {
                v.push(r);
            }
        }
        v
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A sender and a receiver on loopback: records arrive in order in the inbox of the sender's core; a
    /// datagram from a new session that does not start at 1 makes the receiver ask its source for a
    /// resync, and a request makes the sender's workers walk.
    #[test]
    fn records_cross_loopback_gaps_ask_for_a_resync_and_requests_start_a_walk() {
        let b = Replicator::start(&ReplConfig::new(None, Some("udp:127.0.0.1:0"), None).unwrap(), 2).unwrap();
        let baddr = b.local_addr();
        let a = Replicator::start(
            &ReplConfig::new(Some(&format!("udp:{baddr}")), Some("udp:127.0.0.1:0"), None).unwrap(),
            2,
        )
        .unwrap();
        let mut q = a.queue(0, 1).unwrap();
        let key =
            |i: u16| flowplane_wire::flow::FiveTuple::new([10, 0, 0, 1].into(), [1, 1, 1, 1].into(), i, 80, 6).unwrap();
        for i in 0..100 {
            q.upsert(&key(i), &[i as u8; 16]);
        }
        q.delete(&key(7));
        let mut link = b.link(1);
        let mut got = Vec::new();
        wait_for(|| {
            got.extend(pop_all(&mut link));
            got.len() >= 101
        });
        assert_eq!(got.len(), 101);
        assert!(got[..100]
            .iter()
            .enumerate()
            .all(|(i, r)| r.key == key(i as u16) && r.state() == [i as u8; 16] && r.core == 1));
        assert_eq!(got[100].op, flowplane_nf::repl::Op::Delete);

        // A stranger's session starting at 5: the receiver asks it for a resync.
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        encode(
            &Header { kind: Kind::Updates, session: 77, seq: 5, sent_ns: wall_ns(), count: 0, flags: 0 },
            &[],
            MAX_DATAGRAM,
            &mut buf,
        );
        s.send_to(&buf, &baddr).unwrap();
        let mut r = [0u8; 2048];
        let (len, _) = s.recv_from(&mut r).unwrap();
        let h = flowplane_wire::repl::decode_header(&r[..len]).unwrap();
        assert_eq!(h.kind, Kind::ResyncRequest);

        // A request to the sender: its workers' walk epoch moves.
        let alink = a.link(0);
        let e0 = alink.walk_epoch.load(Ordering::Relaxed);
        encode(
            &Header { kind: Kind::ResyncRequest, session: 78, seq: 0, sent_ns: 0, count: 0, flags: 0 },
            &[],
            MAX_DATAGRAM,
            &mut buf,
        );
        s.send_to(&buf, a.local_addr()).unwrap();
        wait_for(|| alink.walk_epoch.load(Ordering::Relaxed) != e0);
        assert_ne!(alink.walk_epoch.load(Ordering::Relaxed), e0);

        drop(q);
        let ra = a.finish();
        let rb = b.finish();
        assert_eq!((ra.sent_records, ra.queue_lost), (101, 0));
        assert!(ra.resyncs_served >= 1, "{ra:?}");
        assert_eq!((rb.received_records, rb.lost_datagrams), (101, 0));
        assert!(rb.peer_sessions >= 2, "{rb:?}");
        assert!(rb.resyncs_requested >= 1 && rb.lag_p99_us < 5_000_000, "{rb:?}");
    }
}

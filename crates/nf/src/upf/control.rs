//! The UPF's control plane: a PFCP (N4) endpoint on UDP that an SMF drives
//! (Heartbeat, Association Setup/Release, Session Establishment,
//! Modification, Deletion; Session Report Requests for URR thresholds), and
//! the versioned hand-over of rule sets to the data path ([`UpfControl`]).
//!
//! Accepted changes compile a new immutable [`RuleSet`], published before
//! the responses are sent; each core's `upf` picks the new version up at
//! the start of its next batch (one atomic load per batch), so no packet
//! ever sees half of a change. The endpoint handles every request waiting
//! on its socket (up to [`BURST`]) before it compiles once for all of them:
//! a compile costs O(all rules), so under churn its cost is shared by the
//! requests that arrived meanwhile (per-session incremental rule sets would
//! remove it).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::pfcp::{self, cause, enc, ie, msg, Header, PfcpError, Writer};
use super::rules::{ip128, RuleSet, SessionSpec};
use super::UsageReport;

/// The rule set the data path should run, with its version, and the usage
/// reports the cores raised for the endpoint to send.
#[derive(Debug)]
pub struct UpfControl {
    version: AtomicU64,
    rules: Mutex<Arc<RuleSet>>,
    reports: Mutex<Vec<UsageReport>>,
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
    /// Datagrams dropped (not PFCP, unknown message type).
    pub discarded: AtomicU64,
    /// Session Report Requests sent.
    pub reports_sent: AtomicU64,
    /// Session Report Responses received.
    pub report_responses: AtomicU64,
    /// Rule sets compiled and published (one per burst of changing requests).
    pub publishes: AtomicU64,
}

/// Most requests handled before one compile and their responses.
pub const BURST: usize = 256;

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
}

/// One PFCP session as the endpoint keeps it.
#[derive(Clone, Debug)]
struct Sess {
    cp_seid: u64,
    spec: SessionSpec,
}

/// The endpoint's state: associations and sessions (by local SEID).
#[derive(Debug)]
pub struct Endpoint {
    node: Ipv4Addr,
    recovery: u32,
    peer: Option<SocketAddr>,
    associated: bool,
    sessions: BTreeMap<u64, Sess>,
    next_seid: u64,
    next_teid: u32,
    report_seq: u32,
    control: Arc<UpfControl>,
    /// Sessions changed since the last publication (while deferring).
    dirty: bool,
    /// Requests are being handled as a burst: publish once, at `flush`.
    defer: bool,
}

/// Seconds between 1900 (NTP era 0) and 1970.
const NTP_UNIX: u64 = 2_208_988_800;

impl Endpoint {
    /// An endpoint whose node ID and F-TEID address is `node`, starting from
    /// `initial` sessions (a session file; they count as associated).
    pub fn new(node: Ipv4Addr, initial: &[SessionSpec], control: Arc<UpfControl>) -> Endpoint {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let sessions: BTreeMap<u64, Sess> =
            initial.iter().map(|s| (s.seid, Sess { cp_seid: s.seid, spec: s.clone() })).collect();
        let next_seid = sessions.keys().next_back().map_or(1, |k| k + 1);
        Endpoint {
            node,
            recovery: (now + NTP_UNIX) as u32,
            peer: None,
            associated: !initial.is_empty(),
            sessions,
            next_seid,
            next_teid: 0x1000_0000,
            report_seq: 0,
            control,
            dirty: false,
            defer: false,
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
        let r = self.handle_one(dgram, from);
        self.defer = false;
        r
    }

    /// Publishes the changes of the requests handled since the last flush, compiled once.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.dirty) {
            self.publish_now();
        }
    }

    fn handle_one(&mut self, dgram: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
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
            msg::HEARTBEAT_REQ => msg::HEARTBEAT_RSP,
            msg::ASSOC_SETUP_REQ => msg::ASSOC_SETUP_RSP,
            msg::ASSOC_RELEASE_REQ => msg::ASSOC_RELEASE_RSP,
            msg::SESS_EST_REQ => msg::SESS_EST_RSP,
            msg::SESS_MOD_REQ => msg::SESS_MOD_RSP,
            msg::SESS_DEL_REQ => msg::SESS_DEL_RSP,
            msg::SESS_REPORT_RSP => {
                st.report_responses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            _ => {
                // TS 29.244 §7.2.2.1: an unknown message type is discarded.
                st.discarded.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        if rsp_type == msg::HEARTBEAT_RSP {
            // A heartbeat response carries only the recovery time stamp.
            st.accepted.fetch_add(1, Ordering::Relaxed);
            let mut w = Writer::message(msg::HEARTBEAT_RSP, None, h.seq);
            w.ie(ie::RECOVERY_TIME_STAMP, &self.recovery.to_be_bytes());
            return Some(w.finish());
        }
        let session_msg = rsp_type >= msg::SESS_EST_RSP;
        let result = pfcp::ies(body).map_err(|e| (0, e)).and_then(|ies| self.request(&h, &ies, from));
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
        }
        Some(w.finish())
    }

    /// Node ID leads association responses and the establishment response.
    fn node_id(&self, w: &mut Writer, rsp_type: u8) {
        if matches!(rsp_type, msg::ASSOC_SETUP_RSP | msg::ASSOC_RELEASE_RSP | msg::SESS_EST_RSP) {
            w.ie(ie::NODE_ID, &enc::node_id_v4(self.node));
        }
    }

    /// The IEs of an accepted request's response (after Node ID and Cause), or the error.
    #[allow(clippy::type_complexity)]
    fn request(
        &mut self,
        h: &Header,
        ies: &[pfcp::Ie<'_>],
        from: SocketAddr,
    ) -> Result<(u64, Vec<(u16, Vec<u8>)>), (u64, PfcpError)> {
        let find = |t: u16| ies.iter().find(|i| i.ty == t).map(|i| i.value);
        let no_seid = |e: PfcpError| (0, e);
        match h.msg_type {
            msg::HEARTBEAT_REQ => Ok((0, vec![])),
            msg::ASSOC_SETUP_REQ => {
                find(ie::NODE_ID).ok_or_else(|| no_seid(missing(ie::NODE_ID)))?;
                self.associated = true;
                self.peer = Some(from);
                Ok((0, vec![]))
            }
            msg::ASSOC_RELEASE_REQ => {
                find(ie::NODE_ID).ok_or_else(|| no_seid(missing(ie::NODE_ID)))?;
                self.associated = false;
                self.peer = None;
                // Releasing the association deletes its sessions (TS 29.244 §6.2.8.3).
                self.sessions.clear();
                self.publish();
                Ok((0, vec![]))
            }
            msg::SESS_EST_REQ => {
                let cp_seid = match find(ie::F_SEID) {
                    Some(v) => pfcp::decode_fseid(v).map_err(no_seid)?,
                    None => return Err(no_seid(missing(ie::F_SEID))),
                };
                if !self.associated {
                    return Err((
                        cp_seid,
                        PfcpError { cause: cause::NO_ASSOCIATION, ie: None, what: "no association".into() },
                    ));
                }
                find(ie::NODE_ID).ok_or((cp_seid, missing(ie::NODE_ID)))?;
                let seid = self.next_seid;
                let mut spec = SessionSpec { seid, ..Default::default() };
                let created = self.apply(&mut spec, ies).map_err(|e| (cp_seid, e))?;
                if spec.pdrs.is_empty() {
                    return Err((cp_seid, missing(ie::CREATE_PDR)));
                }
                self.commit(spec.clone()).map_err(|e| (cp_seid, e))?;
                self.next_seid += 1;
                self.sessions.insert(seid, Sess { cp_seid, spec });
                self.publish();
                let mut out = vec![(ie::F_SEID, enc::fseid(seid, self.node))];
                out.extend(created);
                Ok((cp_seid, out))
            }
            msg::SESS_MOD_REQ | msg::SESS_DEL_REQ => {
                let seid = h.seid.unwrap_or(0);
                let Some(sess) = self.sessions.get(&seid).cloned() else {
                    return Err(no_seid(PfcpError {
                        cause: cause::SESSION_NOT_FOUND,
                        ie: None,
                        what: format!("no session {seid}"),
                    }));
                };
                if h.msg_type == msg::SESS_DEL_REQ {
                    self.sessions.remove(&seid);
                    self.publish();
                    return Ok((sess.cp_seid, vec![]));
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
                self.sessions.insert(seid, Sess { cp_seid: sess.cp_seid, spec });
                self.publish();
                Ok((sess.cp_seid, created))
            }
            _ => Err(no_seid(PfcpError { cause: cause::NOT_SUPPORTED, ie: None, what: "unsupported".into() })),
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
                w.ie(ie::PDR_ID, &p.id.to_be_bytes()).ie(ie::F_TEID, &enc::fteid(t, self.node));
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

    fn alloc_teid(&mut self) -> u32 {
        loop {
            let t = self.next_teid;
            self.next_teid = self.next_teid.wrapping_add(1).max(1);
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

    /// Session Report Requests for the cores' usage reports (to the association's peer).
    pub fn report_requests(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        let reports = self.control.take_reports();
        let Some(peer) = self.peer else { return Vec::new() };
        let mut out = Vec::new();
        for r in reports {
            let Some(s) = self.sessions.get(&r.seid) else { continue };
            self.report_seq = self.report_seq.wrapping_add(1) & 0x00ff_ffff;
            let mut w = Writer::message(msg::SESS_REPORT_REQ, Some(s.cp_seid), 0x80_0000 | self.report_seq);
            w.ie(ie::REPORT_TYPE, &[0x02]);
            w.group(ie::USAGE_REPORT_SRR);
            w.ie(ie::URR_ID, &r.urr_id.to_be_bytes()).ie(ie::UR_SEQN, &self.report_seq.to_be_bytes());
            w.ie(ie::USAGE_REPORT_TRIGGER, &[0x02, 0, 0]).ie(ie::VOLUME_MEASUREMENT, &enc::total_volume(r.volume));
            w.end();
            out.push((peer, w.finish()));
        }
        self.control.stats.reports_sent.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// Sessions held.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
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

/// Binds `addr` (UDP) and serves PFCP on a thread, publishing into `control`.
pub fn spawn(addr: &str, node: Ipv4Addr, initial: &[SessionSpec], control: &Arc<UpfControl>) -> Result<Server, String> {
    let sock = UdpSocket::bind(addr).map_err(|e| format!("PFCP endpoint {addr}: {e}"))?;
    let local = sock.local_addr().map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_millis(20))).map_err(|e| e.to_string())?;
    let weak = Arc::downgrade(control);
    let mut ep = Endpoint::new(node, initial, Arc::clone(control));
    std::thread::Builder::new()
        .name("pfcp".into())
        .spawn(move || serve(sock, &mut ep, weak))
        .map_err(|e| format!("PFCP endpoint: {e}"))?;
    Ok(Server { addr: local })
}

fn serve(sock: UdpSocket, ep: &mut Endpoint, weak: Weak<UpfControl>) {
    let mut buf = vec![0u8; 65536];
    let mut rsps: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
    loop {
        // One blocking receive (20 ms timeout), then whatever else is waiting:
        // the burst's changes are compiled once, before any response goes out.
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            rsps.extend(ep.handle_deferred(&buf[..n], from).map(|r| (from, r)));
            if sock.set_nonblocking(true).is_ok() {
                for _ in 1..BURST {
                    let Ok((n, from)) = sock.recv_from(&mut buf) else { break };
                    rsps.extend(ep.handle_deferred(&buf[..n], from).map(|r| (from, r)));
                }
                let _ = sock.set_nonblocking(false);
            }
            ep.flush();
            for (to, r) in rsps.drain(..) {
                let _ = sock.send_to(&r, to);
            }
        }
        for (to, m) in ep.report_requests() {
            let _ = sock.send_to(&m, to);
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
pub fn shared(addr: &str, node: Ipv4Addr, initial: &[SessionSpec]) -> Result<Arc<UpfControl>, String> {
    let mut map = lock(registry());
    if let Some(c) = map.get(addr).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let rules = RuleSet::compile(initial)?;
    let c = UpfControl::new(Arc::new(rules));
    spawn(addr, node, initial, &c)?;
    map.insert(addr.to_string(), Arc::downgrade(&c));
    Ok(c)
}

//! `fw`: stateful firewall with TCP connection tracking (allow established and
//! related traffic, drop out-of-state packets).
//!
//! This module owns the firewall NF: its policy, its per-direction flow state
//! and the NF-private **connection table** that joins the two directions of a
//! connection. The executor keys state by the directional 5-tuple, so each
//! direction has a small [`FwState`] that points (slot + generation) into
//! the connection table, which is keyed by the canonical 5-tuple
//! ([`FiveTuple::canonical`]) and preallocated once: a
//! [`flowplane_table::FixedMap`] of `conns` connections (an open-addressing
//! index over a slab of stable slots). A full table refuses new connections
//! (dropped and counted); a connection's slot is stable while it lives, so
//! the prefetch hook can fetch a flow's connection a few packets ahead
//! (FAJITA's indirect state). A slot's generation counts the connections it
//! held before (kept in the freed slot's bytes), so a direction still bound
//! to an earlier one sees a stale binding.
//!
//! Policy (`allow_new=inside|any`, `inside=PREFIX`):
//! * **TCP**: only a plain SYN from the inside prefix (or from anyone with
//!   `any`) opens a connection (NEW -> SYN_SENT). The SYN-ACK must come from
//!   the responder and acknowledge the client's ISN + 1 (SYN_RECV); the
//!   client's ACK establishes it. Every later segment must pass a window
//!   check loosely like Linux conntrack (Rooij): its sequence number lies
//!   within what the receiver advertised, its ack within what the peer has
//!   sent (minus a bounded ack window); window scaling from the SYN options
//!   is honoured when both sides offer it. FINs move the connection to
//!   FIN_WAIT, then CLOSING; once both FINs are acknowledged it is CLOSED:
//!   the last ACK passes with `EndFlow` and the slot is freed. An in-window
//!   RST (or, in SYN_SENT, one acknowledging the SYN) passes, ends the flow
//!   and frees the slot; any other RST is dropped. Invalid flag
//!   combinations, out-of-window segments, SYNs inside an established
//!   connection and packets without a connection are dropped, each counted
//!   under its own reason.
//! * **UDP and other protocols**: a datagram from the inside (or anyone with
//!   `any`) opens a pseudo-connection; replies on the reverse tuple pass
//!   (related); unsolicited datagrams are dropped.
//! * **ICMP / ICMPv6**: an echo request from the inside opens a connection
//!   (the identifier is both ports of the key, so the reply's key is the
//!   reverse); only its echo replies pass. Errors (unreachable, time
//!   exceeded, parameter problem, packet too big) pass only when the packet
//!   they quote belongs to a known connection (related). IPv6 neighbour
//!   discovery passes (IPv6 does not work without it). Other ICMP is dropped.
//! * Non-first fragments: the engine gives a later fragment its first
//!   fragment's key (`engine::frag`); such a fragment has no transport header
//!   to track and follows its flow's connection: it passes while that
//!   connection is open (`fragments_followed`), else it is dropped
//!   (`fragment`). A later fragment without ports (its first fragment was
//!   never seen, or fw runs without the engine) cannot be checked: dropped.
//!   Packets without a flow key (non-IP, malformed: `drops.unparsed`) and
//!   packets without state because a table is full (the engine's flow table
//!   or the connection table: `drops.table_full`) are dropped: a firewall
//!   fails closed.
//!
//! Idle timeout (`timeout=S`): a connection's own last-use time is the time
//! of the last packet of either direction that found it open (a TCP segment
//! the tracker looked at, dropped out-of-window ones included; a datagram or
//! echo message of it; ICMP errors quoting it do not count). A packet
//! arriving more than S seconds after it — strictly, on the packet clock —
//! finds no connection: the connection is removed (counted as `expired`)
//! and the packet is judged as the first of a new one (only an allowed SYN,
//! an allowed datagram or echo request opens; anything else is dropped
//! under its reason, e.g. `no_conn`, `udp_unsolicited`). Exactly S passes.
//! This holds whatever the directions' per-flow states say (the engine keeps
//! each direction's state for the chain's longest timeout, and a direction
//! idle while the other is busy keeps its connection). A clock that goes
//! backwards expires nothing.
//!
//! Drops of packets that belong to no connection return `DropEndFlow`, so a
//! scan leaves no directional state behind. When one direction ends the
//! connection, the other direction's state still names the freed slot; its
//! generation no longer matches, so its next packet is looked up again
//! (a reused 5-tuple finds its new connection). Slots are reclaimed by the
//! idle check on lookup, by the last direction's `release` if the connection
//! is already idle then, and by a slow sweep on each new connection
//! (connections idle past the timeout, which also covers states the executor
//! evicted without a release). Report: `opened` = `conns_live` +
//! `closed_fin` + `closed_rst` + `released` + `swept` + `expired`. Each core
//! has its own table: under multi-core RSS both directions of a connection
//! must reach the same core (symmetric RSS).
//!
//! Each direction's state also counts what its packets carried (packets,
//! bytes, first and last seen in ms, passed or dropped): with `--ipfix` a
//! direction that was bound to a connection gets flow records (IPFIX flows
//! are one-way) at active timeouts and at its end — flowEndReason 3 when
//! the firewall ended it (close, RST) or it sent a FIN or RST that passed;
//! packets dropped for want of a connection (scans) give no record.
//! `--export fw=FILE` lists the same directions still in the flow table at
//! the run's end (5-tuple, side, packets, bytes, first and last seen).

use std::net::{IpAddr, Ipv4Addr};

use bytemuck::{Pod, Zeroable};
use flowplane_table::{FixedMap, KeyHash};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::hash::HashableKey;
use flowplane_wire::ipv4::IpProtocol;
use flowplane_wire::prefix::IpPrefix;
use flowplane_wire::tcp::{TcpFlags, TcpOption};
use serde_json::json;

use crate::ipfix::{end_reason, tcp_end, EndReason, ExportRecord, FlowExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::{
    is_idle, touched, Action, Affinity, Cursor, GlobalState, Granularity, Placement, StatefulNf, Step,
};
use crate::{NfContext, ParamError, ParamSpec, Params};

const ALLOW_NEW: ParamSpec = ParamSpec::choice("allow_new", "inside", &["inside", "any"], "who may open connections");
const INSIDE: ParamSpec = ParamSpec::text("inside", "10.0.0.0/8", "ADDR/LEN", "inside prefix, IPv4 or IPv6");
const TIMEOUT: ParamSpec = ParamSpec::uint("timeout", 300, 1, 30 * 86_400, "idle timeout in seconds");
// Per connection: its 128-byte slab entry, up to four 8-byte index words, a free-list word and a live bit.
const CONNS: ParamSpec =
    ParamSpec::uint("conns", 1 << 20, 1, MAX_CONNS, "connection table capacity per core").allocates(168);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "fw",
    about:
        "stateful firewall: TCP connection tracking (handshake, seq/ack windows, FIN/RST teardown), related UDP/ICMP",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[ALLOW_NEW, INSIDE, TIMEOUT, CONNS],
};

/// Builds `fw` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Fw::from_params(p)?))
}

/// Largest connection table (slab entries).
pub const MAX_CONNS: u64 = 1 << 26;
/// Lower bound of the ack window (Linux's MAXACKWINCONST).
const MAX_ACK_WINDOW: u32 = 66_000;
const HASH_SEED: u32 = 0x0f1e_2d3c;
/// Connections inspected by the sweep per new connection (and when full).
const SWEEP_STEP: usize = 2;
const SWEEP_FULL: usize = 64;
/// Connections inspected per timer tick of an idle port (ten ticks a second).
const SWEEP_TICK: usize = 4096;

/// TCP connection states (the `state` of a connection; NEW is "no connection yet").
pub mod tcp_state {
    /// No connection: only an allowed SYN may create one.
    pub const NEW: u8 = 0;
    /// The originator's SYN was seen.
    pub const SYN_SENT: u8 = 1;
    /// The responder's SYN-ACK was seen.
    pub const SYN_RECV: u8 = 2;
    /// The handshake completed.
    pub const ESTABLISHED: u8 = 3;
    /// One side sent a FIN.
    pub const FIN_WAIT: u8 = 4;
    /// Both sides sent a FIN, not both acknowledged yet.
    pub const CLOSING: u8 = 5;
    /// Both FINs acknowledged (the slot is freed at once).
    pub const CLOSED: u8 = 6;

    /// Name of a state, for reports.
    pub fn name(s: u8) -> &'static str {
        match s {
            NEW => "NEW",
            SYN_SENT => "SYN_SENT",
            SYN_RECV => "SYN_RECV",
            ESTABLISHED => "ESTABLISHED",
            FIN_WAIT => "FIN_WAIT",
            CLOSING => "CLOSING",
            _ => "CLOSED",
        }
    }
}

/// Connection kinds.
const K_TCP: u8 = 1;
const K_DATAGRAM: u8 = 2;
const K_ECHO: u8 = 3;

/// Per-direction state (32 bytes, the flow entry's first cache line): which
/// connection this direction belongs to, and what its packets carried
/// (passed or dropped) for its IPFIX records.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct FwState {
    /// Slab index + 1 of the connection; 0 = not bound.
    pub conn: u32,
    /// The connection slot's generation when bound.
    pub gen: u32,
    /// 0: this direction is the originator's, 1: the responder's.
    pub dir: u8,
    /// 1: this direction sent a FIN or RST that passed (with `--ipfix`).
    pub ended: u8,
    /// Padding (keeps the type free of implicit padding).
    pub _pad: [u8; 2],
    /// Packets (saturating at 2^32 - 1: u32 keeps the state in one line).
    pub packets: u32,
    /// First packet, ms of packet clock (saturating at 2^32 - 1 ms, 49 days: IPFIX times are ms anyway).
    pub first_ms: u32,
    /// Last packet, ms of packet clock.
    pub last_ms: u32,
    /// Bytes (frame lengths).
    pub bytes: u64,
}

impl FwState {
    /// Counts a packet of `len` bytes at `now_ns`; `ended`: a FIN or RST that passed.
    #[inline]
    fn count(&mut self, len: usize, now_ns: u64, ended: bool) {
        let ms = (now_ns / 1_000_000).min(u64::from(u32::MAX)) as u32;
        if self.packets == 0 || ms < self.first_ms {
            self.first_ms = ms;
        }
        self.last_ms = self.last_ms.max(ms);
        self.packets = self.packets.saturating_add(1);
        self.bytes += len as u64;
        self.ended |= u8::from(ended);
    }
}

/// One direction's TCP window tracking data (Linux's `ip_ct_tcp_state`).
#[derive(Clone, Copy, Debug, Default)]
struct Td {
    /// Highest sequence number sent + 1 (seq + len, SYN/FIN count one).
    end: u32,
    /// Highest sequence number the peer allows this side to send.
    maxend: u32,
    /// Largest window this side advertised (scaled).
    maxwin: u32,
    /// Sequence end of this side's FIN.
    fin_end: u32,
    /// Window scale shift.
    scale: u8,
    /// The SYN carried a window scale option.
    ws: bool,
    fin_seen: bool,
    fin_acked: bool,
}

/// One tracked connection's state: one cache line holding everything a
/// packet of a bound flow reads (binding check, state, windows, last use) —
/// the line the prefetch hook and the step name. The connection table's
/// entry puts the canonical 5-tuple, which only lookups and removal read, on
/// the second line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Conn {
    /// Connections this slot has held before (a direction bound to an earlier one sees a stale binding).
    gen: u32,
    /// Directional states bound to this connection.
    refs: u16,
    kind: u8,
    state: u8,
    /// The originator sent in the canonical key's direction.
    orig_fwd: bool,
    last_ns: u64,
    td: [Td; 2],
}

// The hot fields fill exactly one line.
const _: () = assert!(std::mem::size_of::<Conn>() == 64);

impl Conn {
    fn empty(gen: u32) -> Self {
        Conn { last_ns: 0, gen, refs: 0, kind: 0, state: 0, orig_fwd: true, td: [Td::default(); 2] }
    }
}

/// The connection table's hash of a canonical 5-tuple.
struct ConnHash;

impl KeyHash<FiveTuple> for ConnHash {
    #[inline(always)]
    fn hash(key: &FiveTuple) -> u32 {
        key.hash32(HASH_SEED)
    }
}

/// Preallocated connection table: canonical 5-tuple -> connection, stable slots.
type ConnTable = FixedMap<FiveTuple, Conn, ConnHash>;

/// Connection `s` of `t`, which the caller has just found live.
#[inline(always)]
fn conn(t: &mut ConnTable, s: usize) -> &mut Conn {
    t.peek_at_mut(s).expect("fw: a connection slot just found")
}

/// Which sources may open connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllowNew {
    /// Only sources in the inside prefix.
    Inside,
    /// Anyone.
    Any,
}

/// Firewall configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwConfig {
    /// Who may open connections.
    pub allow_new: AllowNew,
    /// Inside prefix (IPv4 or IPv6 network address).
    pub inside: IpAddr,
    /// Inside prefix length.
    pub inside_len: u8,
    /// Idle timeout, seconds.
    pub timeout_s: u64,
    /// Connection table capacity.
    pub conns: u64,
}

impl Default for FwConfig {
    fn default() -> Self {
        FwConfig {
            allow_new: AllowNew::Inside,
            inside: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)),
            inside_len: 8,
            timeout_s: const { TIMEOUT.uint_default() },
            conns: const { CONNS.uint_default() },
        }
    }
}

/// Counters for the report: accepted events and drops per reason.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    opened: u64,
    established: u64,
    closed_fin: u64,
    closed_rst: u64,
    released: u64,
    swept: u64,
    expired: u64,
    related: u64,
    nd_passed: u64,
    // drops
    policy: u64,
    no_conn: u64,
    unsolicited_synack: u64,
    bad_synack: u64,
    invalid_flags: u64,
    out_of_window: u64,
    out_of_state: u64,
    rst_invalid: u64,
    udp_unsolicited: u64,
    icmp_unsolicited: u64,
    icmp_unrelated: u64,
    icmp_other: u64,
    fragment: u64,
    /// Later fragments that followed their connection (their first fragment's flow).
    fragments_followed: u64,
    malformed: u64,
    unparsed: u64,
    table_full: u64,
}

/// The parts of a TCP segment the tracker uses.
#[derive(Clone, Copy, Debug)]
struct Seg {
    flags: TcpFlags,
    seq: u32,
    ack: u32,
    win: u16,
    /// Payload bytes.
    len: u32,
    /// Window scale option (SYN only).
    wscale: Option<u8>,
}

impl Seg {
    /// Sequence number after this segment (SYN and FIN count one).
    fn end(&self) -> u32 {
        let mut e = self.seq.wrapping_add(self.len);
        if self.flags.contains(TcpFlags::SYN) {
            e = e.wrapping_add(1);
        }
        if self.flags.contains(TcpFlags::FIN) {
            e = e.wrapping_add(1);
        }
        e
    }
}

#[inline]
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

#[inline]
fn after(a: u32, b: u32) -> bool {
    before(b, a)
}

/// The tracked parts of the packet's TCP segment, read through its checked
/// view; None when the header is cut or inconsistent with the IP length.
fn parse_seg(pkt: &Pkt<'_>) -> Option<Seg> {
    let t = pkt.tcp()?;
    let flags = t.flags();
    let mut wscale = None;
    if flags.contains(TcpFlags::SYN) {
        // The iterator stops at the first malformed option.
        for o in t.option_iter() {
            match o {
                Ok(TcpOption::WindowScale(s)) => wscale = Some(s.min(14)),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    Some(Seg {
        flags,
        seq: t.seq_number(),
        ack: t.ack_number(),
        win: t.window_len(),
        len: t.payload().len() as u32,
        wscale,
    })
}

/// Flag combinations a real stack sends (PSH/URG/ECN bits aside).
fn valid_flags(f: TcpFlags) -> bool {
    type F = TcpFlags;
    let f = f & (F::FIN | F::SYN | F::RST | F::ACK);
    [F::SYN, F::SYN | F::ACK, F::RST, F::RST | F::ACK, F::ACK, F::FIN | F::ACK].contains(&f)
}

/// The stateful firewall.
#[derive(Debug)]
pub struct Fw {
    cfg: FwConfig,
    /// `cfg.inside/cfg.inside_len`, for matching.
    inside: IpPrefix,
    timeout_ns: u64,
    /// Latest packet time seen (the clock `release` judges idleness by).
    now_ns: u64,
    table: ConnTable,
    c: Counters,
    /// The IPFIX record queue (`--ipfix`).
    ipfix: Option<RecordTx>,
}

impl Fw {
    /// `fw(allow_new=inside|any, inside=PREFIX, timeout=S, conns=N)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let allow_new = p.choice(&ALLOW_NEW, [AllowNew::Inside, AllowNew::Any])?;
        let ins = p.text(&INSIDE)?;
        let (inside, inside_len) = IpPrefix::parse(&ins)
            .map(|p| (p.addr(), p.len()))
            .ok_or_else(|| ParamError(format!("fw: parameter 'inside={ins}' is not an IP prefix ADDR/LEN")))?;
        let timeout_s = p.uint(&TIMEOUT)?;
        let conns = p.uint(&CONNS)?;
        Ok(Fw::new(FwConfig { allow_new, inside, inside_len, timeout_s, conns }))
    }

    /// A firewall for `cfg` (capacity clamped to `1..=MAX_CONNS`); preallocates the connection table.
    pub fn new(cfg: FwConfig) -> Self {
        let inside = IpPrefix::clamped(cfg.inside, cfg.inside_len);
        let conns = cfg.conns.clamp(1, MAX_CONNS);
        Fw {
            cfg: FwConfig { conns, ..cfg },
            inside,
            timeout_ns: cfg.timeout_s.saturating_mul(1_000_000_000),
            now_ns: 0,
            // conns is within 1..=MAX_CONNS, far below the map's limit; only memory can fail (as allocation would).
            table: ConnTable::new(conns as usize).expect("fw: cannot allocate the connection table"),
            c: Counters::default(),
            ipfix: None,
        }
    }

    /// The verdict on a packet (the policy and the connection's state machine, see the module doc).
    #[inline]
    fn judge(&mut self, pkt: &mut Pkt<'_>, st: &mut FwState, now: u64) -> Action {
        self.now_ns = self.now_ns.max(now);
        if !pkt.meta().valid {
            self.c.unparsed += 1;
            return self.drop_for(st, now);
        }
        if pkt.tuple().is_non_first_fragment() {
            self.c.fragment += 1;
            return self.drop_for(st, now);
        }
        if pkt.meta().l4 == 0 && matches!(pkt.proto(), IpProtocol::TCP | IpProtocol::UDP) {
            return self.later_fragment(pkt, st, now);
        }
        match pkt.proto() {
            IpProtocol::TCP => self.tcp(pkt, st, now),
            IpProtocol::ICMP if !pkt.meta().v6 => self.icmp(pkt, st, now),
            IpProtocol::ICMPV6 if pkt.meta().v6 => self.icmp(pkt, st, now),
            _ => self.datagram(pkt, st, now),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FwConfig {
        &self.cfg
    }

    /// Connections currently tracked.
    pub fn live_conns(&self) -> usize {
        self.table.len()
    }

    /// TCP state of the connection a packet with 5-tuple `t` belongs to (NEW if none).
    pub fn tcp_state_of(&self, t: &FiveTuple) -> u8 {
        match self.table.get(&t.canonical()) {
            Some(c) if c.kind == K_TCP => c.state,
            _ => tcp_state::NEW,
        }
    }

    fn may_open(&self, src: IpAddr) -> bool {
        self.cfg.allow_new == AllowNew::Any || self.inside.contains(src)
    }

    /// Frees up to `n` slots' connections idle at `now` ([`is_idle`]), from the sweep cursor on.
    fn sweep(&mut self, n: usize, now: u64) {
        let timeout = self.timeout_ns;
        self.c.swept += self.table.sweep(n, |_, c| !is_idle(c.last_ns, now, timeout)) as u64;
    }

    /// The live connection `st` is bound to (idle or not).
    #[inline]
    fn bound(&self, st: &FwState) -> Option<usize> {
        let s = st.conn.checked_sub(1)? as usize;
        let (_, c) = self.table.get_at(s)?;
        (c.gen == st.gen).then_some(s)
    }

    /// Whether connection `s` is still open at `now`: one idle past the
    /// timeout is gone, whatever still refers to it — it is removed here
    /// (counted as `expired`) and the packet sees no connection.
    #[inline]
    fn alive(&mut self, s: usize, now: u64) -> bool {
        if !is_idle(conn(&mut self.table, s).last_ns, now, self.timeout_ns) {
            return true;
        }
        self.table.remove_at(s);
        self.c.expired += 1;
        false
    }

    /// The connection `st` is bound to, if it is still open at `now`.
    #[inline]
    fn bound_at(&mut self, st: &FwState, now: u64) -> Option<usize> {
        let s = self.bound(st)?;
        self.alive(s, now).then_some(s)
    }

    /// The open connection of `key` (canonical) at `now`, if any.
    fn lookup_at(&mut self, key: &FiveTuple, now: u64) -> Option<usize> {
        let s = self.table.find(key)?;
        self.alive(s, now).then_some(s)
    }

    /// Binds `st` to slot `s` for a packet with tuple `t`.
    fn bind(&mut self, st: &mut FwState, s: usize, t: &FiveTuple) {
        let Some((key, c)) = self.table.get_at_mut(s) else { return };
        let fwd = t == key;
        st.conn = s as u32 + 1;
        st.gen = c.gen;
        st.dir = if fwd == c.orig_fwd { 0 } else { 1 };
        c.refs = c.refs.saturating_add(1);
    }

    /// The open connection of this packet at `now`: the bound one, else a
    /// lookup (which binds).
    fn find(&mut self, st: &mut FwState, t: &FiveTuple, now: u64) -> Option<usize> {
        if let Some(s) = self.bound_at(st, now) {
            return Some(s);
        }
        let s = self.lookup_at(&t.canonical(), now)?;
        self.bind(st, s, t);
        Some(s)
    }

    /// Creates a connection opened by a packet with tuple `t` and binds `st` as its originator.
    fn open(&mut self, st: &mut FwState, t: &FiveTuple, kind: u8, now: u64) -> Option<usize> {
        self.sweep(SWEEP_STEP, now);
        if self.table.is_full() {
            self.sweep(SWEEP_FULL, now);
        }
        let key = t.canonical();
        // A reused slot's connection is the next generation of the one it held (kept in the freed slot).
        let gen = self.table.next_slot().and_then(|s| self.table.peek_at(s)).map_or(0, |c| c.gen.wrapping_add(1));
        // Callers open only after the lookup of `key` missed.
        let Ok(s) = self.table.insert_new_hashed(ConnTable::hash(&key), key, Conn::empty(gen)) else {
            self.c.table_full += 1;
            return None;
        };
        let c = conn(&mut self.table, s);
        c.kind = kind;
        c.orig_fwd = *t == key;
        c.last_ns = touched(c.last_ns, now, self.timeout_ns);
        self.bind(st, s, t);
        self.c.opened += 1;
        Some(s)
    }

    /// Drop verdict: a packet without an open connection leaves no state behind.
    fn drop_for(&mut self, st: &FwState, now: u64) -> Action {
        if self.bound_at(st, now).is_some() {
            Action::Drop
        } else {
            Action::DropEndFlow
        }
    }

    fn tcp(&mut self, pkt: &Pkt<'_>, st: &mut FwState, now: u64) -> Action {
        let Some(seg) = parse_seg(pkt) else {
            self.c.malformed += 1;
            return self.drop_for(st, now);
        };
        if !valid_flags(seg.flags) {
            self.c.invalid_flags += 1;
            return self.drop_for(st, now);
        }
        let t = *pkt.tuple();
        let Some(s) = self.find(st, &t, now) else {
            return self.tcp_new(pkt, st, &seg, now);
        };
        self.tcp_track(s, st.dir as usize & 1, &seg, now)
    }

    /// A TCP segment of no known connection: only an allowed SYN opens one.
    fn tcp_new(&mut self, pkt: &Pkt<'_>, st: &mut FwState, seg: &Seg, now: u64) -> Action {
        const SYN: TcpFlags = TcpFlags::SYN;
        const ACK: TcpFlags = TcpFlags::ACK;
        let f = seg.flags & (SYN | ACK | TcpFlags::RST | TcpFlags::FIN);
        if f != SYN {
            if f.contains(TcpFlags::RST) {
                self.c.rst_invalid += 1;
            } else if f == SYN | ACK {
                self.c.unsolicited_synack += 1;
            } else {
                self.c.no_conn += 1;
            }
            return Action::DropEndFlow;
        }
        if !self.may_open(pkt.tuple().src_ip()) {
            self.c.policy += 1;
            return Action::DropEndFlow;
        }
        let t = *pkt.tuple();
        let Some(s) = self.open(st, &t, K_TCP, now) else { return Action::DropEndFlow };
        let c = conn(&mut self.table, s);
        c.state = tcp_state::SYN_SENT;
        c.td[0] = syn_td(seg);
        Action::Pass
    }

    /// Tracks a segment of connection `s` sent by direction `dir`.
    fn tcp_track(&mut self, s: usize, dir: usize, seg: &Seg, now: u64) -> Action {
        const SYN: TcpFlags = TcpFlags::SYN;
        const ACK: TcpFlags = TcpFlags::ACK;
        const FIN: TcpFlags = TcpFlags::FIN;
        let c = conn(&mut self.table, s);
        c.last_ns = touched(c.last_ns, now, self.timeout_ns);
        let f = seg.flags;
        if f.contains(TcpFlags::RST) {
            let ok = if c.state == tcp_state::SYN_SENT {
                // RFC 793: acceptable in SYN_SENT only when it acknowledges the SYN.
                dir == 1 && f.contains(ACK) && seg.ack == c.td[0].end
            } else {
                let (snd, rcv) = (c.td[dir], c.td[1 - dir]);
                !before(seg.seq, snd.end.wrapping_sub(rcv.maxwin.max(1))) && !after(seg.seq, snd.maxend)
            };
            if !ok {
                self.c.rst_invalid += 1;
                return Action::Drop;
            }
            self.table.remove_at(s);
            self.c.closed_rst += 1;
            return Action::EndFlow;
        }
        match c.state {
            tcp_state::SYN_SENT => {
                if dir == 0 {
                    if f & (SYN | ACK) == SYN {
                        // Retransmitted (or re-numbered) SYN: restart tracking from it.
                        c.td[0] = syn_td(seg);
                        return Action::Pass;
                    }
                    self.c.out_of_state += 1;
                    return Action::Drop;
                }
                if f & (SYN | ACK) != SYN | ACK {
                    // Simultaneous open and anything else before the SYN-ACK is not supported.
                    self.c.out_of_state += 1;
                    return Action::Drop;
                }
                if seg.ack != c.td[0].end {
                    self.c.bad_synack += 1;
                    return Action::Drop;
                }
                let mut td = syn_td(seg);
                td.maxend = td.end.wrapping_add(td.maxwin);
                if !(c.td[0].ws && td.ws) {
                    // Scaling is used only when both sides offer it.
                    c.td[0].scale = 0;
                    td.scale = 0;
                }
                c.td[1] = td;
                c.state = tcp_state::SYN_RECV;
            }
            tcp_state::SYN_RECV if f.contains(SYN) => {
                // Retransmitted SYN or SYN-ACK of the same handshake only.
                let same = if dir == 0 {
                    !f.contains(ACK) && seg.seq.wrapping_add(1) == c.td[0].end
                } else {
                    f.contains(ACK) && seg.seq.wrapping_add(1) == c.td[1].end && seg.ack == c.td[0].end
                };
                if same {
                    return Action::Pass;
                }
                self.c.out_of_state += 1;
                return Action::Drop;
            }
            _ if f.contains(SYN) => {
                self.c.out_of_state += 1;
                return Action::Drop;
            }
            _ => {}
        }
        if !in_window(c, dir, seg) {
            self.c.out_of_window += 1;
            return Action::Drop;
        }
        update_window(c, dir, seg);
        if c.state == tcp_state::SYN_RECV
            && dir == 0
            && f.contains(ACK)
            && !f.contains(SYN)
            && !before(seg.ack, c.td[1].end)
        {
            c.state = tcp_state::ESTABLISHED;
            self.c.established += 1;
        }
        if c.state < tcp_state::ESTABLISHED {
            return Action::Pass;
        }
        let (snd, rcv) = (dir, 1 - dir);
        if f.contains(FIN) && !c.td[snd].fin_seen {
            c.td[snd].fin_seen = true;
            c.td[snd].fin_end = seg.end();
        }
        if f.contains(ACK) && c.td[rcv].fin_seen && !before(seg.ack, c.td[rcv].fin_end) {
            c.td[rcv].fin_acked = true;
        }
        let (a, b) = (c.td[0], c.td[1]);
        c.state = if a.fin_acked && b.fin_acked {
            tcp_state::CLOSED
        } else if a.fin_seen && b.fin_seen {
            tcp_state::CLOSING
        } else if a.fin_seen || b.fin_seen {
            tcp_state::FIN_WAIT
        } else {
            tcp_state::ESTABLISHED
        };
        if c.state == tcp_state::CLOSED {
            self.table.remove_at(s);
            self.c.closed_fin += 1;
            return Action::EndFlow;
        }
        Action::Pass
    }

    fn icmp(&mut self, pkt: &Pkt<'_>, st: &mut FwState, now: u64) -> Action {
        let Some(msg) = pkt.icmp() else {
            self.c.malformed += 1;
            return self.drop_for(st, now);
        };
        let (req, rep) = (msg.is_echo_request(), msg.is_echo_reply());
        let t = *pkt.tuple();
        if req || rep {
            let found = self.find(st, &t, now);
            return match found {
                Some(s) if conn(&mut self.table, s).kind == K_ECHO && (st.dir == 0) == req => {
                    let c = conn(&mut self.table, s);
                    c.last_ns = touched(c.last_ns, now, self.timeout_ns);
                    Action::Pass
                }
                Some(_) => {
                    self.c.icmp_unrelated += 1;
                    Action::Drop
                }
                None if rep => {
                    self.c.icmp_unsolicited += 1;
                    Action::DropEndFlow
                }
                None if !self.may_open(t.src_ip()) => {
                    self.c.policy += 1;
                    Action::DropEndFlow
                }
                None => match self.open(st, &t, K_ECHO, now) {
                    Some(_) => Action::Pass,
                    None => Action::DropEndFlow,
                },
            };
        }
        if msg.is_error() {
            // Related: the quoted packet belongs to a tracked connection.
            if let Some(q) = msg.quoted_tuple() {
                if self.lookup_at(&q.canonical(), now).is_some() {
                    self.c.related += 1;
                    return Action::Pass;
                }
            }
            self.c.icmp_unrelated += 1;
            return self.drop_for(st, now);
        }
        // Router/neighbour solicitation and advertisement, redirect (RFC 4861).
        if msg.is_v6() && (133..=137).contains(&msg.msg_type()) {
            self.c.nd_passed += 1;
            return Action::Pass;
        }
        self.c.icmp_other += 1;
        self.drop_for(st, now)
    }

    /// A later fragment the engine gave its first fragment's key (`engine::frag`): it has no transport
    /// header to track, so it follows the connection its flow belongs to — passes while that is open (and
    /// keeps it alive), dropped otherwise (counted as `fragment`).
    fn later_fragment(&mut self, pkt: &Pkt<'_>, st: &mut FwState, now: u64) -> Action {
        let t = *pkt.tuple();
        if let Some(s) = self.find(st, &t, now) {
            let c = conn(&mut self.table, s);
            c.last_ns = touched(c.last_ns, now, self.timeout_ns);
            self.c.fragments_followed += 1;
            return Action::Pass;
        }
        self.c.fragment += 1;
        self.drop_for(st, now)
    }

    fn datagram(&mut self, pkt: &Pkt<'_>, st: &mut FwState, now: u64) -> Action {
        let t = *pkt.tuple();
        if let Some(s) = self.find(st, &t, now) {
            let c = conn(&mut self.table, s);
            c.last_ns = touched(c.last_ns, now, self.timeout_ns);
            return Action::Pass;
        }
        if !self.may_open(t.src_ip()) {
            self.c.udp_unsolicited += 1;
            return Action::DropEndFlow;
        }
        match self.open(st, &t, K_DATAGRAM, now) {
            Some(_) => Action::Pass,
            None => Action::DropEndFlow,
        }
    }
}

/// Tracking data of a SYN's sender.
fn syn_td(seg: &Seg) -> Td {
    let end = seg.end();
    let win = (seg.win as u32).max(1);
    Td { end, maxend: end, maxwin: win, scale: seg.wscale.unwrap_or(0), ws: seg.wscale.is_some(), ..Td::default() }
}

/// The window check of Linux's `tcp_in_window`, loosely: the segment lies in
/// the window the receiver advertised and its ack covers only what was sent.
fn in_window(c: &Conn, dir: usize, seg: &Seg) -> bool {
    let (snd, rcv) = (&c.td[dir], &c.td[1 - dir]);
    let ack = if seg.flags.contains(TcpFlags::ACK) { seg.ack } else { rcv.end };
    let max_ack = snd.maxwin.max(MAX_ACK_WINDOW);
    !after(seg.seq, snd.maxend)
        && !before(seg.end(), snd.end.wrapping_sub(rcv.maxwin))
        && !after(ack, rcv.end)
        && !before(ack, rcv.end.wrapping_sub(max_ack))
}

fn update_window(c: &mut Conn, dir: usize, seg: &Seg) {
    let win =
        if seg.flags.contains(TcpFlags::SYN) { seg.win as u32 } else { (seg.win as u32) << c.td[dir].scale.min(14) };
    let end = seg.end();
    let snd = &mut c.td[dir];
    snd.maxwin = snd.maxwin.max(win);
    if after(end, snd.end) {
        snd.end = end;
    }
    if seg.flags.contains(TcpFlags::ACK) {
        let rcv = &mut c.td[1 - dir];
        let lim = seg.ack.wrapping_add(win.max(1));
        if after(lim, rcv.maxend) {
            rcv.maxend = lim;
        }
    }
}

impl StatefulNf for Fw {
    type State = FwState;
    const HAS_RELEASE: bool = true;
    const ENDS_FLOWS: bool = true;
    const BOTH_DIRECTIONS: bool = true;
    const HAS_PREFETCH: bool = true;
    const STEPS: bool = true;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn placement(&self) -> Placement {
        // The connection slab is per core: flows stay where they started.
        Placement { affinity: Affinity::Connection, global: GlobalState::Private }
    }

    fn idle_timeout_ns(&self) -> Option<u64> {
        Some(self.timeout_ns)
    }

    fn tick(&mut self, now_ns: u64) {
        // An idle port's timer: connections idle past the timeout leave the table
        // (and `conns_live`) without waiting for the next new connection's sweep.
        self.now_ns = self.now_ns.max(now_ns);
        self.sweep(SWEEP_TICK, now_ns);
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> FwState {
        // Binding happens in `process`, which sees every packet (and its clock).
        FwState::zeroed()
    }

    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut FwState, ctx: &NfContext) -> Action {
        let a = self.judge(pkt, st, ctx.now_ns);
        // Only an exporter needs the end seen (the flags byte of TCP packets read again).
        let ended = self.ipfix.is_some() && matches!(a, Action::Pass | Action::EndFlow) && tcp_end(pkt);
        st.count(pkt.len(), ctx.now_ns, ended);
        a
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    /// One row per direction bound to a connection (what its IPFIX records
    /// carry; scans' unbound states give none): its 5-tuple as sent, which
    /// side it is, packets, bytes, first and last seen (ms of packet clock).
    fn export_row(&self, key: &FiveTuple, st: &FwState) -> Option<serde_json::Value> {
        (st.conn != 0 && st.packets > 0).then(|| {
            json!({
                "proto": key.proto(),
                "src": key.src_ip().to_string(),
                "dst": key.dst_ip().to_string(),
                "sport": key.src_port(),
                "dport": key.dst_port(),
                "side": if st.dir == 0 { "orig" } else { "reply" },
                "packets": st.packets,
                "bytes": st.bytes,
                "first_ms": st.first_ms,
                "last_ms": st.last_ms,
            })
        })
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.ipfix = Some(tx);
    }

    /// A connection direction's record (one that was bound to a connection:
    /// packets dropped for want of one — scans, unsolicited datagrams — give
    /// none): its counts and times; flowEndReason 3 when it sent a FIN or RST
    /// that passed or the firewall ended it, unless this is an active-timeout report.
    fn ipfix_flow(&mut self, key: &FiveTuple, st: &FwState, reason: EndReason) {
        if let (Some(tx), true) = (&mut self.ipfix, st.conn != 0 && st.packets > 0) {
            let reason = end_reason(reason, st.ended != 0);
            let (first, last) = (u64::from(st.first_ms) * 1_000_000, u64::from(st.last_ms) * 1_000_000);
            tx.push(ExportRecord::Flow(FlowExport::new(*key, st.packets.into(), st.bytes, first, last, reason)));
        }
    }

    /// The connection-table walk as steps: a bound flow names its connection;
    /// an unbound one names its index slot, then the connection that slot
    /// leads to. Only hints (the table changes as packets finish): `finish`
    /// is `process`, on lines now cached.
    fn step(&self, pkt: &Pkt<'_>, st: &FwState, cur: &mut Cursor) -> Step {
        cur.step += 1;
        let t = &self.table;
        if st.conn != 0 {
            return match (cur.step, t.peek_at(st.conn as usize - 1)) {
                (1, Some(c)) => Step::at(c),
                _ => Step::Ready,
            };
        }
        if !pkt.meta().valid {
            return Step::Ready;
        }
        match cur.step {
            1 => {
                let h = ConnTable::hash(&pkt.tuple().canonical());
                cur.input = u64::from(h);
                Step::at(t.home_word(h))
            }
            2 => t.home_slot(cur.input as u32).and_then(|s| t.peek_at(s)).map_or(Step::Ready, Step::at),
            _ => Step::Ready,
        }
    }

    fn prefetch(&self, st: &FwState) {
        if let Some(c) = st.conn.checked_sub(1).and_then(|s| self.table.peek_at(s as usize)) {
            flowplane_packet::prefetch::read(c);
        }
    }

    /// A direction's state goes (its entry expired or ended): it unbinds.
    /// The connection's life is its own idle time, not its directions'
    /// entries: the executor may release a direction while looking up a
    /// later packet before earlier packets — the other direction's among
    /// them — have run, so the last unbinding frees the connection only if
    /// it is already idle at the latest packet time this NF has seen;
    /// otherwise the idle check on lookup or the sweep frees it.
    fn release(&mut self, _key: &FiveTuple, st: &FwState) {
        let Some(s) = self.bound(st) else { return };
        let c = conn(&mut self.table, s);
        c.refs = c.refs.saturating_sub(1);
        if c.refs == 0 && is_idle(c.last_ns, self.now_ns, self.timeout_ns) {
            self.table.remove_at(s);
            self.c.released += 1;
        }
    }

    fn on_unparsed(&mut self) -> Action {
        self.c.unparsed += 1;
        Action::Drop
    }

    fn passes_without_state(&self) -> bool {
        false
    }

    fn on_no_state(&mut self) -> Action {
        self.c.table_full += 1;
        Action::Drop
    }

    fn report(&self) -> Option<serde_json::Value> {
        let c = &self.c;
        Some(json!({
            "allow_new": match self.cfg.allow_new { AllowNew::Inside => "inside", AllowNew::Any => "any" },
            "inside": format!("{}/{}", self.cfg.inside, self.cfg.inside_len),
            "timeout_s": self.cfg.timeout_s,
            "conns_capacity_per_core": self.table.capacity(),
            "conns_live": self.table.len(),
            "opened": c.opened,
            "fragments_followed": c.fragments_followed,
            "established": c.established,
            "closed_fin": c.closed_fin,
            "closed_rst": c.closed_rst,
            "released": c.released,
            "swept": c.swept,
            "expired": c.expired,
            "related_icmp": c.related,
            "nd_passed": c.nd_passed,
            "drops": {
                "policy": c.policy,
                "no_conn": c.no_conn,
                "unsolicited_synack": c.unsolicited_synack,
                "bad_synack": c.bad_synack,
                "invalid_flags": c.invalid_flags,
                "out_of_window": c.out_of_window,
                "out_of_state": c.out_of_state,
                "rst_invalid": c.rst_invalid,
                "udp_unsolicited": c.udp_unsolicited,
                "icmp_unsolicited": c.icmp_unsolicited,
                "icmp_unrelated": c.icmp_unrelated,
                "icmp_other": c.icmp_other,
                "fragment": c.fragment,
                "malformed": c.malformed,
                "unparsed": c.unparsed,
                "table_full": c.table_full,
            },
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["allow_new", "inside", "timeout_s", "conns_capacity_per_core"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const ACK: u8 = TcpFlags::ACK.bits();
    const FIN: u8 = TcpFlags::FIN.bits();
    const PSH: u8 = TcpFlags::PSH.bits();
    const RST: u8 = TcpFlags::RST.bits();
    const SYN: u8 = TcpFlags::SYN.bits();
    use crate::testutil::{ipv4_frame, tcp4, udp4, Harness};
    use flowplane_wire::flow::FiveTupleV4;

    const C: [u8; 4] = [10, 0, 0, 5];
    const S: [u8; 4] = [93, 184, 216, 34];
    const CP: u16 = 40000;
    const SP: u16 = 443;
    const CISN: u32 = 1000;
    const SISN: u32 = 900_000;

    fn fw() -> Harness<Fw> {
        Harness::new(Fw::new(FwConfig { conns: 64, ..FwConfig::default() }))
    }

    /// Client -> server segment with `len` payload bytes.
    fn c2s(flags: u8, seq: u32, ack: u32, len: usize) -> Vec<u8> {
        with_payload(tcp4(C, S, CP, SP, flags, seq, ack), len)
    }

    fn s2c(flags: u8, seq: u32, ack: u32, len: usize) -> Vec<u8> {
        with_payload(tcp4(S, C, SP, CP, flags, seq, ack), len)
    }

    /// Appends payload and fixes the IPv4 total length (checksums are not checked by the firewall).
    fn with_payload(mut f: Vec<u8>, len: usize) -> Vec<u8> {
        f.extend(std::iter::repeat_n(0xab, len));
        let tot = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&tot.to_be_bytes());
        f
    }

    fn drops(h: &Harness<Fw>, reason: &str) -> u64 {
        h.nf.report().unwrap()["drops"][reason].as_u64().unwrap()
    }

    fn stat(h: &Harness<Fw>, name: &str) -> u64 {
        h.nf.report().unwrap()[name].as_u64().unwrap()
    }

    fn state(h: &Harness<Fw>) -> u8 {
        let t = h.key_of(&c2s(ACK, 0, 0, 0)).unwrap();
        h.nf.tcp_state_of(&t)
    }

    /// Runs the three-way handshake; returns the next client and server sequence numbers.
    fn handshake(h: &mut Harness<Fw>) -> (u32, u32) {
        assert_eq!(h.run(&c2s(SYN, CISN, 0, 0)).1, Action::Pass);
        assert_eq!(state(h), tcp_state::SYN_SENT);
        assert_eq!(h.run(&s2c(SYN | ACK, SISN, CISN + 1, 0)).1, Action::Pass);
        assert_eq!(state(h), tcp_state::SYN_RECV);
        assert_eq!(h.run(&c2s(ACK, CISN + 1, SISN + 1, 0)).1, Action::Pass);
        assert_eq!(state(h), tcp_state::ESTABLISHED);
        (CISN + 1, SISN + 1)
    }

    #[test]
    fn full_connection_with_fin_teardown() {
        let mut h = fw();
        let (mut c, mut s) = handshake(&mut h);
        // Data both ways.
        assert_eq!(h.run(&c2s(ACK | PSH, c, s, 100)).1, Action::Pass);
        c += 100;
        assert_eq!(h.run(&s2c(ACK | PSH, s, c, 1000)).1, Action::Pass);
        s += 1000;
        assert_eq!(h.run(&c2s(ACK, c, s, 0)).1, Action::Pass);
        assert_eq!(h.nf.live_conns(), 1);
        // Client closes, server acks and closes, client acks the last FIN.
        assert_eq!(h.run(&c2s(FIN | ACK, c, s, 0)).1, Action::Pass);
        c += 1;
        assert_eq!(state(&h), tcp_state::FIN_WAIT);
        assert_eq!(h.run(&s2c(ACK, s, c, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(FIN | ACK, s, c, 0)).1, Action::Pass);
        s += 1;
        assert_eq!(state(&h), tcp_state::CLOSING);
        assert_eq!(h.run(&c2s(ACK, c, s, 0)).1, Action::EndFlow, "last ACK ends the flow");
        assert_eq!(state(&h), tcp_state::NEW);
        assert_eq!(h.nf.live_conns(), 0, "slot freed");
        assert_eq!(stat(&h, "closed_fin"), 1);
        assert_eq!(stat(&h, "established"), 1);
        // The server direction's state is stale: its late segment is out of state now.
        assert_eq!(h.run(&s2c(ACK, s, c, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "no_conn"), 1);
        // The same 5-tuple can open a new connection.
        assert_eq!(h.run(&c2s(SYN, 77, 0, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(SYN | ACK, 5, 78, 0)).1, Action::Pass);
        assert_eq!(h.nf.live_conns(), 1);
    }

    #[test]
    fn fin_from_server_acked_together() {
        let mut h = fw();
        let (c, s) = handshake(&mut h);
        assert_eq!(h.run(&s2c(FIN | ACK, s, c, 0)).1, Action::Pass);
        // Client's FIN also acknowledges the server's FIN.
        assert_eq!(h.run(&c2s(FIN | ACK, c, s + 1, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(ACK, s + 1, c + 1, 0)).1, Action::EndFlow);
        assert_eq!(h.nf.live_conns(), 0);
    }

    #[test]
    fn out_of_window_segments_dropped() {
        let mut h = fw();
        let (c, s) = handshake(&mut h);
        // Sequence far beyond the server's advertised window.
        assert_eq!(h.run(&c2s(ACK, c.wrapping_add(1_000_000), s, 10)).1, Action::Drop);
        // Acknowledges data the server never sent.
        assert_eq!(h.run(&c2s(ACK, c, s + 500_000, 0)).1, Action::Drop);
        // Old data far behind the window.
        assert_eq!(h.run(&s2c(ACK, s.wrapping_sub(200_000), c, 10)).1, Action::Drop);
        assert_eq!(drops(&h, "out_of_window"), 3);
        // The connection survives the garbage.
        assert_eq!(h.run(&c2s(ACK, c, s, 10)).1, Action::Pass);
        assert_eq!(state(&h), tcp_state::ESTABLISHED);
    }

    #[test]
    fn unsolicited_synack_and_data_without_handshake() {
        let mut h = fw();
        assert_eq!(h.run(&s2c(SYN | ACK, SISN, CISN + 1, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "unsolicited_synack"), 1);
        assert_eq!(h.run(&c2s(ACK | PSH, CISN, SISN, 50)).1, Action::DropEndFlow);
        assert_eq!(h.run(&s2c(ACK, SISN, CISN, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "no_conn"), 2);
        assert!(h.states.is_empty(), "no directional state left behind");
        assert_eq!(h.nf.live_conns(), 0);
    }

    #[test]
    fn handshake_violations() {
        let mut h = fw();
        assert_eq!(h.run(&c2s(SYN, CISN, 0, 0)).1, Action::Pass);
        // SYN-ACK acknowledging the wrong ISN.
        assert_eq!(h.run(&s2c(SYN | ACK, SISN, CISN + 7, 0)).1, Action::Drop);
        assert_eq!(drops(&h, "bad_synack"), 1);
        // Client data before the SYN-ACK.
        assert_eq!(h.run(&c2s(ACK, CISN + 1, 0, 10)).1, Action::Drop);
        assert_eq!(drops(&h, "out_of_state"), 1);
        assert_eq!(state(&h), tcp_state::SYN_SENT);
        assert_eq!(h.run(&s2c(SYN | ACK, SISN, CISN + 1, 0)).1, Action::Pass);
        // Retransmitted SYN-ACK passes; a different one does not.
        assert_eq!(h.run(&s2c(SYN | ACK, SISN, CISN + 1, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(SYN | ACK, SISN + 9, CISN + 1, 0)).1, Action::Drop);
        let (c, s) = (CISN + 1, SISN + 1);
        assert_eq!(h.run(&c2s(ACK, c, s, 0)).1, Action::Pass);
        // A SYN inside an established connection.
        assert_eq!(h.run(&c2s(SYN, 5, 0, 0)).1, Action::Drop);
        assert_eq!(drops(&h, "out_of_state"), 3);
        // Invalid flag combinations.
        assert_eq!(h.run(&c2s(SYN | FIN, c, s, 0)).1, Action::Drop);
        assert_eq!(h.run(&c2s(0, c, s, 0)).1, Action::Drop);
        assert_eq!(h.run(&c2s(FIN, c, s, 0)).1, Action::Drop);
        assert_eq!(drops(&h, "invalid_flags"), 3);
        assert_eq!(state(&h), tcp_state::ESTABLISHED);
    }

    #[test]
    fn rst_in_window_ends_out_of_window_dropped() {
        let mut h = fw();
        let (c, s) = handshake(&mut h);
        // Blind RST far outside the window.
        assert_eq!(h.run(&s2c(RST, s.wrapping_add(3_000_000), 0, 0)).1, Action::Drop);
        assert_eq!(drops(&h, "rst_invalid"), 1);
        assert_eq!(state(&h), tcp_state::ESTABLISHED);
        assert_eq!(h.run(&s2c(RST | ACK, s, c, 0)).1, Action::EndFlow);
        assert_eq!(h.nf.live_conns(), 0);
        assert_eq!(stat(&h, "closed_rst"), 1);
        // RST for no connection.
        assert_eq!(h.run(&c2s(RST, c, 0, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "rst_invalid"), 2);
        // In SYN_SENT a RST must acknowledge the SYN.
        assert_eq!(h.run(&c2s(SYN, CISN, 0, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(RST | ACK, 0, CISN + 5, 0)).1, Action::Drop);
        assert_eq!(h.run(&s2c(RST | ACK, 0, CISN + 1, 0)).1, Action::EndFlow);
        assert_eq!(h.nf.live_conns(), 0);
    }

    #[test]
    fn policy_inside_only_or_any() {
        let mut h = fw();
        // Outside host opening a connection inwards.
        assert_eq!(h.run(&s2c(SYN, 1, 0, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "policy"), 1);
        let mut h = Harness::new(Fw::new(FwConfig { allow_new: AllowNew::Any, conns: 8, ..FwConfig::default() }));
        assert_eq!(h.run(&s2c(SYN, 1, 0, 0)).1, Action::Pass);
        assert_eq!(h.run(&c2s(SYN | ACK, 50, 2, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(ACK, 2, 51, 0)).1, Action::Pass);
        assert_eq!(state(&h), tcp_state::ESTABLISHED);
    }

    #[test]
    fn window_scaling_honoured_when_both_offer_it() {
        // SYN with options: MSS, NOP, WS=7.
        fn syn_ws(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
            let base = tcp4(src, dst, sp, dp, flags, seq, ack);
            let mut l4 = base[34..].to_vec();
            l4[12] = 8 << 4;
            l4.extend_from_slice(&[2, 4, 0x05, 0xb4, 1, 3, 3, 7, 0, 0, 0, 0]);
            ipv4_frame(src, dst, 6, &l4)
        }
        let mut h = fw();
        assert_eq!(h.run(&syn_ws(C, S, CP, SP, SYN, CISN, 0)).1, Action::Pass);
        assert_eq!(h.run(&syn_ws(S, C, SP, CP, SYN | ACK, SISN, CISN + 1)).1, Action::Pass);
        let (c, s) = (CISN + 1, SISN + 1);
        // Client's ACK advertises 65535 << 7 bytes; the server may now send far ahead.
        assert_eq!(h.run(&c2s(ACK, c, s, 0)).1, Action::Pass);
        assert_eq!(h.run(&s2c(ACK, s + 5_000_000, c, 10)).1, Action::Pass);
        // Without scaling the same jump is out of window.
        let mut h = fw();
        handshake(&mut h);
        assert_eq!(h.run(&s2c(ACK, s + 5_000_000, c, 10)).1, Action::Drop);
    }

    #[test]
    fn udp_related_replies_only() {
        let mut h = fw();
        let out = udp4(C, S, 5353, 53);
        let back = udp4(S, C, 53, 5353);
        let unsolicited = udp4(S, C, 53, 9999);
        assert_eq!(h.run(&unsolicited).1, Action::DropEndFlow);
        assert_eq!(h.run(&back).1, Action::DropEndFlow, "reply before request");
        assert_eq!(drops(&h, "udp_unsolicited"), 2);
        assert_eq!(h.run(&out).1, Action::Pass);
        assert_eq!(h.run(&back).1, Action::Pass);
        assert_eq!(h.run(&out).1, Action::Pass);
        assert_eq!(h.run(&unsolicited).1, Action::DropEndFlow);
        // Both directions' states going while the connection is still open
        // leave it to its own idle time...
        for k in [h.key_of(&out).unwrap(), h.key_of(&back).unwrap()] {
            let st = h.states.remove(&k).unwrap();
            h.nf.release(&k, &st);
        }
        assert_eq!(h.nf.live_conns(), 1);
        assert_eq!(stat(&h, "released"), 0);
        // ...after which a reply finds none (expired on lookup) and is unsolicited again.
        h.now_ns = 300 * SEC + 1;
        assert_eq!(h.run(&back).1, Action::DropEndFlow);
        assert_eq!((h.nf.live_conns(), stat(&h, "expired")), (0, 1));
    }

    const SEC: u64 = 1_000_000_000;

    /// Issue 29: a connection idle past the timeout is gone although both
    /// directions' states still name it; one idle exactly the timeout is not.
    #[test]
    fn idle_connection_expires_at_lookup() {
        let mut h = Harness::new(Fw::new(FwConfig { conns: 64, timeout_s: 6, ..FwConfig::default() }));
        let (c, s) = handshake(&mut h);
        assert_eq!(h.run(&c2s(ACK | PSH, c, s, 100)).1, Action::Pass);
        h.now_ns = 6 * SEC;
        assert_eq!(h.run(&s2c(ACK | PSH, s, c + 100, 10)).1, Action::Pass, "idle exactly the timeout");
        h.now_ns = 12 * SEC + 1;
        assert_eq!(h.run(&s2c(ACK | PSH, s + 10, c + 100, 10)).1, Action::DropEndFlow, "idle past it");
        assert_eq!(drops(&h, "no_conn"), 1);
        assert_eq!(h.run(&c2s(ACK, c + 100, s + 10, 0)).1, Action::DropEndFlow, "the inside too");
        assert_eq!((h.nf.live_conns(), stat(&h, "expired")), (0, 1));
        // UDP: a reply past the timeout is unsolicited; the inside may open again.
        let (out, back) = (udp4(C, S, 5353, 53), udp4(S, C, 53, 5353));
        assert_eq!(h.run(&out).1, Action::Pass);
        h.now_ns += 6 * SEC + 1;
        assert_eq!(h.run(&back).1, Action::DropEndFlow);
        assert_eq!(h.run(&out).1, Action::Pass);
        assert_eq!(h.run(&back).1, Action::Pass);
        // A clock that jumps backwards expires nothing.
        h.now_ns -= 10 * SEC;
        assert_eq!(h.run(&back).1, Action::Pass);
        // Directions released after the connection idled out free it at once.
        h.now_ns += 200 * SEC;
        assert_eq!(h.run(&udp4(S, C, 1, 2)).1, Action::DropEndFlow, "advances the NF's clock");
        for k in [h.key_of(&out).unwrap(), h.key_of(&back).unwrap()] {
            let st = h.states.remove(&k).unwrap();
            h.nf.release(&k, &st);
        }
        assert_eq!((h.nf.live_conns(), stat(&h, "released")), (0, 1));
        // Every connection opened is accounted for.
        let gone = ["closed_fin", "closed_rst", "released", "swept", "expired"].map(|k| stat(&h, k));
        assert_eq!(stat(&h, "opened"), h.nf.live_conns() as u64 + gone.iter().sum::<u64>());
    }

    fn icmp4(src: [u8; 4], dst: [u8; 4], ty: u8, id: u16) -> Vec<u8> {
        let mut m = vec![ty, 0, 0, 0, 0, 0, 0, 1];
        m[4..6].copy_from_slice(&id.to_be_bytes());
        ipv4_frame(src, dst, IpProtocol::ICMP.0, &m)
    }

    #[test]
    fn icmp_echo_and_related_errors() {
        let mut h = fw();
        assert_eq!(h.run(&icmp4(S, C, 0, 7)).1, Action::DropEndFlow, "unsolicited reply");
        assert_eq!(drops(&h, "icmp_unsolicited"), 1);
        assert_eq!(h.run(&icmp4(S, C, 8, 7)).1, Action::DropEndFlow, "request from outside");
        assert_eq!(h.run(&icmp4(C, S, 8, 7)).1, Action::Pass);
        assert_eq!(h.run(&icmp4(S, C, 0, 7)).1, Action::Pass);
        assert_eq!(h.run(&icmp4(S, C, 0, 8)).1, Action::DropEndFlow, "other identifier");
        // Destination unreachable quoting the client's UDP datagram: related once the flow exists.
        let out = udp4(C, S, 5353, 53);
        let mut err = vec![3, 3, 0, 0, 0, 0, 0, 0];
        err.extend_from_slice(&out[14..14 + 28]);
        let err = ipv4_frame(S, C, IpProtocol::ICMP.0, &err);
        assert_eq!(h.run(&err).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "icmp_unrelated"), 1);
        assert_eq!(h.run(&out).1, Action::Pass);
        assert_eq!(h.run(&err).1, Action::Pass);
        assert_eq!(stat(&h, "related_icmp"), 1);
        // Truncated quote and other ICMP types.
        let short = ipv4_frame(S, C, IpProtocol::ICMP.0, &[3, 3, 0, 0, 0, 0, 0, 0, 0x45]);
        assert_eq!(h.run(&short).1, Action::DropEndFlow);
        assert_eq!(h.run(&icmp4(S, C, 13, 1)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "icmp_other"), 1);
    }

    #[test]
    fn malformed_and_truncated_frames() {
        let mut h = fw();
        let syn = c2s(SYN, CISN, 0, 0);
        // Every truncation: never panics; without a connection nothing passes.
        for n in 0..syn.len() {
            let a = h.run(&syn[..n]).1;
            assert!(matches!(a, Action::Drop | Action::DropEndFlow), "len {n}: {a:?}");
        }
        assert_eq!(h.nf.live_conns(), 0);
        // Bad data offset, IP length shorter than the TCP header, garbage.
        let mut bad = syn.clone();
        bad[34 + 12] = 2 << 4;
        assert_eq!(h.run(&bad).1, Action::DropEndFlow);
        let mut bad = syn.clone();
        bad[16..18].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(h.run(&bad).1, Action::DropEndFlow);
        assert!(drops(&h, "malformed") >= 2);
        assert_eq!(h.run(&[0u8; 60]).1, Action::Drop);
        assert!(drops(&h, "unparsed") >= 1);
        // Non-first fragment.
        let mut frag = syn.clone();
        frag[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
        assert!(matches!(h.run(&frag).1, Action::Drop | Action::DropEndFlow));
        // Established connection: truncated segments are dropped, state untouched.
        let (c, s) = handshake(&mut h);
        let data = c2s(ACK, c, s, 0);
        let mut cut = data[..40].to_vec();
        cut[16..18].copy_from_slice(&26u16.to_be_bytes());
        assert!(matches!(h.run(&cut).1, Action::Drop | Action::DropEndFlow));
        assert_eq!(state(&h), tcp_state::ESTABLISHED);
        // Random bytes behind a valid Ethernet/IPv4 header.
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut f = c2s(ACK, c, s, 8);
            for b in f[34..].iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            let _ = h.run(&f);
        }
    }

    #[test]
    fn table_full_is_counted_and_sweep_reclaims() {
        let mut h = Harness::new(Fw::new(FwConfig { conns: 2, timeout_s: 1, ..FwConfig::default() }));
        for p in 0..2u16 {
            assert_eq!(h.run(&tcp4(C, S, 1000 + p, 80, SYN, 1, 0)).1, Action::Pass);
        }
        assert_eq!(h.run(&tcp4(C, S, 2000, 80, SYN, 1, 0)).1, Action::DropEndFlow);
        assert_eq!(drops(&h, "table_full"), 1);
        // Connections idle for more than twice the timeout are reclaimed (states evicted without release).
        h.states.clear();
        h.now_ns = 3_000_000_000;
        assert_eq!(h.run(&tcp4(C, S, 2000, 80, SYN, 1, 0)).1, Action::Pass);
        assert!(stat(&h, "swept") >= 1);
        // A clock that jumps backwards neither panics nor sweeps live connections.
        h.now_ns = 0;
        assert_eq!(h.run(&tcp4(C, S, 2000, 80, SYN, 1, 0)).1, Action::Pass);
    }

    #[test]
    fn conn_table_index_survives_churn() {
        let mut t = ConnTable::new(200).unwrap();
        let key =
            |i: u32| FiveTuple::V4(FiveTupleV4::new(Ipv4Addr::from(i), Ipv4Addr::new(1, 1, 1, 1), 7, 9, 6)).canonical();
        let mut slots = Vec::new();
        for i in 0..200 {
            slots.push(t.insert(key(i), Conn::empty(0)).unwrap());
        }
        assert!(t.insert(key(999), Conn::empty(0)).is_err(), "full");
        for i in (0..200).step_by(3) {
            t.remove_at(slots[i as usize]);
        }
        for i in 0..200u32 {
            assert_eq!(t.find(&key(i)).is_some(), i % 3 != 0, "key {i}");
        }
        for i in (0..200).step_by(3) {
            slots[i as usize] = t.insert(key(i + 1000), Conn::empty(0)).unwrap();
        }
        assert_eq!(t.len(), 200);
        for i in 0..200u32 {
            let k = if i % 3 == 0 { key(i + 1000) } else { key(i) };
            assert_eq!(t.find(&k), Some(slots[i as usize]));
        }
    }

    #[test]
    fn params() {
        let mk = |pairs: &[(&str, &str)]| {
            let mut p = Params::new("fw", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
            Fw::from_params(&mut p).map(|f| *f.config())
        };
        // The declared defaults are FwConfig's defaults.
        assert_eq!(mk(&[]).unwrap(), FwConfig::default());
        let c = mk(&[("allow_new", "any"), ("inside", "192.168.0.0/16"), ("timeout", "60"), ("conns", "1k")]).unwrap();
        assert_eq!(c.allow_new, AllowNew::Any);
        assert_eq!((c.inside_len, c.timeout_s, c.conns), (16, 60, 1000));
        assert!(mk(&[("allow_new", "some")]).unwrap_err().0.contains("'allow_new=some'"));
        assert!(mk(&[("inside", "10.0.0.0/33")]).unwrap_err().0.contains("'inside=10.0.0.0/33'"));
        assert!(mk(&[("conns", "0")]).is_err());
        assert!(mk(&[("inside", "2001:db8::/32")]).is_ok());
    }
}

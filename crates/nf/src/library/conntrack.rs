//! `conntrack`: TCP connection state tracker (SCR Table 1): the full TCP
//! state machine in both directions — three-way handshake with sequence
//! and acknowledgement numbers checked, every later segment checked against
//! the acceptable windows below, FIN each way, RST (RFC 5961) — with
//! per-state idle timeouts on the packet clock. Packets that do not fit the
//! state are dropped and counted as invalid; non-TCP passes.
//!
//! The rule, per connection (keyed by the canonical 5-tuple, both directions
//! meet). A segment's *length* is `max(0, frame bytes - 54) + SYN + FIN` (the
//! frame bytes past the smallest Ethernet + IPv4 + TCP headers bound its
//! payload; the history record carries no header lengths), its *end* is
//! `seq + length`; comparisons are modulo 2^32 (RFC 1982). `W` is `window=`
//! (default 2^24 bytes), standing for every advertised window. Per direction
//! `d` the tracker keeps `end[d]` (the highest segment end `d` sent, Linux's
//! `td_end`) and `acked[d]` (the highest ack the other side sent for `d`).
//! * **No connection** (or one idle past its timeout since its last passing
//!   packet: `timeout=` when established, `min(30 s, timeout)` in every other
//!   state; a last-seen time in the future after the clock jumped back is
//!   rebased, never expired early): only a plain SYN passes; it opens the
//!   connection (SYN_SENT) with `end[init] = its end`. Anything else is
//!   invalid. (A SYN the connection table has no room for is dropped,
//!   `table_full`: the tracker fails closed; so is every packet that found no
//!   per-flow state because the engine's flow table was full.)
//! * **SYN_SENT**: the responder's SYN-ACK with `ack = ISN + 1` passes
//!   (SYN_RECV; `end[resp]` = its end, `acked[init] = ack`,
//!   `acked[resp] = its seq + 1`); a retransmitted SYN (same seq) passes. An
//!   RST passes and removes the connection only from the responder with ACK
//!   and `ack = ISN + 1`, or from the initiator with `seq = ISN + 1`.
//!   Anything else is invalid.
//! * **SYN_RECV**: the initiator's ACK (no SYN) with `ack = responder ISN + 1`
//!   that is in window establishes it; a retransmitted SYN-ACK (same seq)
//!   passes. An in-window RST removes the connection. Anything else is
//!   invalid.
//! * **Established, FIN_WAIT, CLOSING, TIME_WAIT**: a SYN is invalid (in
//!   TIME_WAIT a plain SYN starts a new connection instead). A segment from
//!   `d` is **in window** when
//!   (I) `seq <= acked[d] + W` (not past what the receiver acknowledged plus a
//!   window), (II) `end >= end[d] - W` (not ending more than a window before
//!   what `d` already sent) and, if it carries ACK and no RST,
//!   (III) `ack <= end[other]` and (IV) `ack >= end[other] - W`. A segment out
//!   of window is dropped (`out_of_window`, invalid) and changes nothing, FINs
//!   included. One in window passes and advances `end[d]` and, with ACK,
//!   `acked[other]`; a FIN marks `d` (FIN_WAIT; both marked: CLOSING); an ACK
//!   in CLOSING closes it (TIME_WAIT, `closed`).
//! * **RST** after the handshake (RFC 5961 section 3.2): checked on I and II
//!   only. Out of window: dropped, the connection stays. In window with
//!   `seq = acked[d]` exactly (the receiver's next expected sequence): passes
//!   and resets (removes) the connection. In window otherwise: passes (the
//!   receiver answers with a challenge ACK) and the connection stays
//!   (`rst_in_window`).
//!
//! Connections live in the NF's own preallocated table (a
//! [`flowplane_table::FixedMap`]) keyed by the canonical connection (both
//! directions meet; symmetric RSS under `rss`). For `conns=N` it holds
//! `7/8 x C` connections, where `C` (the reported `capacity`) is the power of
//! two at or above `8/7 x max(N, 16)`.
//! Every change is a function of the packet sequence alone (a record of
//! the packet's 5-tuple, flags, seq/ack and time), and `process` runs the
//! very same transition on the packet's record, so under `--scale scr` the
//! table is replicated exactly (`scr_transition` on history entries).
//! The engine keeps a small state per direction's flow (packets, bytes,
//! first and last seen, passed or dropped): `--export conntrack=FILE` lists
//! it, and with `--ipfix` each direction's flow gets its records (IPFIX flows
//! are one-way), with flowEndReason 3 (end of flow detected) when that
//! direction sent a FIN or RST the tracker let through.
//! `fw` is the full stateful firewall (windows scaling, ICMP errors,
//! related flows); this is the lean tracker of the SCR evaluation.

use bytemuck::{Pod, Zeroable};
use flowplane_table::{FibHash, FixedMap};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::scr::{ScrFields, ScrRecord};
use serde_json::json;

use crate::ipfix::{end_reason, EndReason, ExportRecord, FlowExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::merge_keeping;
use crate::report::Export;
use crate::stateful::{Action, Affinity, GlobalState, Granularity, Placement, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

// Per connection: up to 2.3 x 7/8 64-byte slab entries and free-list words, 2.3 x 2 8-byte index words.
const CONNS: ParamSpec =
    ParamSpec::uint("conns", 1 << 20, 16, 1 << 26, "connection table capacity per core").allocates(176);
const TIMEOUT: ParamSpec =
    ParamSpec::uint("timeout", 300, 1, 30 * 86_400, "idle timeout of an established connection in seconds");
const WINDOW: ParamSpec = ParamSpec::uint(
    "window",
    1 << 24,
    1 << 10,
    1 << 30,
    "largest receive window assumed, bytes: how far a segment may lie from the tracked sequence space",
);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "conntrack",
    about: "TCP connection tracker (SCR Table 1): handshake, seq/ack, FIN/RST state machine in both directions",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[CONNS, TIMEOUT, WINDOW],
};

/// Builds `conntrack` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    let conns = p.uint(&CONNS)? as usize;
    let timeout = p.uint(&TIMEOUT)?;
    let window = p.uint(&WINDOW)? as u32;
    Ok(sink.stateful(Conntrack::new(conns, timeout * 1_000_000_000).with_window(window)))
}

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;
#[cfg(test)]
const PSH: u8 = 0x08;

/// Idle timeout of connections not yet established or closing (ns).
const SHORT_TIMEOUT_NS: u64 = 30_000_000_000;
/// Smallest Ethernet + IPv4 + TCP headers: a frame's bytes past them bound its payload.
const MIN_HEADERS: u32 = 14 + 20 + 20;

/// Connection states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CtState {
    /// SYN seen.
    SynSent = 1,
    /// SYN-ACK seen (acknowledging the SYN).
    SynRecv = 2,
    /// Handshake completed.
    Established = 3,
    /// A FIN seen from one side.
    FinWait = 4,
    /// FINs seen from both sides.
    Closing = 5,
    /// Both FINs acknowledged.
    TimeWait = 6,
}

/// One tracked connection (with its key, one 64-byte table entry).
/// Directions: 0 is the canonical key's lower endpoint sending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Conn {
    last_ns: u64,
    isn: [u32; 2],
    /// Per direction: the end of its sequence space sent so far (highest
    /// seq + payload bound + SYN + FIN), Linux's `td_end`.
    end: [u32; 2],
    /// Per direction: the highest ack the other side sent for it (what the
    /// receiver has acknowledged, RFC 793's RCV.NXT as far as seen).
    acked: [u32; 2],
    /// `CtState` as u8.
    state: u8,
    /// Direction (0: canonical lower endpoint sent) of the initiator.
    init: u8,
    /// FIN seen per direction (bits).
    fin: u8,
}

/// Per-direction flow state the engine keeps: what the direction's packets
/// carried into the tracker, passed or dropped (its `--export` row and IPFIX
/// records; 32 bytes, the flow entry's first cache line).
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct CtFlow {
    /// Packets of this direction's flow.
    pub packets: u64,
    /// Bytes (frame lengths); bit 63 ([`CtFlow::ENDED`]) marks a direction
    /// that sent a FIN or RST the tracker let through.
    pub bytes: u64,
    /// First packet (packet clock, ns).
    pub first_ns: u64,
    /// Last packet.
    pub last_ns: u64,
}

impl CtFlow {
    /// The bit of `bytes` marking a direction seen to end its side of the connection.
    pub const ENDED: u64 = 1 << 63;

    /// Counts one packet (its record) at `now`; `pass`: the tracker let it through.
    #[inline]
    fn count(&mut self, r: &ScrRecord, now: u64, pass: bool) {
        if self.packets == 0 || now < self.first_ns {
            self.first_ns = now;
        }
        self.last_ns = self.last_ns.max(now);
        self.packets += 1;
        self.bytes += u64::from(r.len);
        if pass && r.tcp_flags().is_some_and(|f| f & (FIN | RST) != 0) {
            self.bytes |= Self::ENDED;
        }
    }

    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes & !Self::ENDED
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    new: u64,
    established: u64,
    closed: u64,
    reset: u64,
    rst_in_window: u64,
    out_of_window: u64,
    invalid: u64,
    non_tcp: u64,
    full: u64,
}

/// The tracker.
#[derive(Debug)]
pub struct Conntrack {
    /// Canonical connection key -> connection.
    table: FixedMap<u128, Conn, FibHash>,
    /// The reported capacity (the table holds 7/8 of it).
    capacity: usize,
    timeout_ns: u64,
    window: u32,
    c: Counters,
    /// The IPFIX record queue (`--ipfix`).
    ipfix: Option<RecordTx>,
}

/// Connection `i` of `t`, which the caller has just found live.
#[inline(always)]
fn conn(t: &mut FixedMap<u128, Conn, FibHash>, i: usize) -> &mut Conn {
    t.peek_at_mut(i).expect("conntrack: a connection slot just found")
}

/// Wrapping "a is after b" (sequence-number arithmetic, RFC 1982).
#[inline(always)]
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The sequence space a segment occupies past its `seq`: the payload bound
/// (frame bytes past the smallest headers, an upper bound on any frame) plus
/// one for SYN and one for FIN.
#[inline(always)]
fn seg_len(r: &ScrRecord, flags: u8) -> u32 {
    u32::from(r.len).saturating_sub(MIN_HEADERS) + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0)
}

impl Conntrack {
    /// A tracker for `conns` connections, established ones idle after `timeout_ns`.
    pub fn new(conns: usize, timeout_ns: u64) -> Self {
        let cap = (conns.clamp(16, 1 << 40) * 8 / 7).next_power_of_two();
        Conntrack {
            // The bound above keeps the capacity valid; only memory can fail (as allocation would).
            table: FixedMap::new(cap / 8 * 7).expect("conntrack: cannot allocate the connection table"),
            capacity: cap,
            timeout_ns,
            window: const { WINDOW.uint_default() } as u32,
            c: Counters::default(),
            ipfix: None,
        }
    }

    /// The same tracker with receive windows assumed up to `window` bytes.
    pub fn with_window(mut self, window: u32) -> Self {
        self.window = window.max(1);
        self
    }

    /// The window check (Linux conntrack's `tcp_in_window` with every
    /// advertised window taken as `self.window`) of a segment from `d`:
    /// not past what the receiver acknowledged plus a window (I), not ending
    /// more than a window before what `d` already sent (II), and an ack, if
    /// any, within the last window of what the other side sent (III, IV).
    /// An RST is checked on I and II only.
    fn in_window(&self, c: &Conn, d: usize, r: &ScrRecord, flags: u8) -> bool {
        let w = self.window;
        let end = r.seq.wrapping_add(seg_len(r, flags));
        let seq_ok = !after(r.seq, c.acked[d].wrapping_add(w)) && !after(c.end[d].wrapping_sub(w), end);
        let ack_ok =
            flags & (ACK | RST) != ACK || (!after(r.ack, c.end[1 - d]) && !after(c.end[1 - d].wrapping_sub(w), r.ack));
        seq_ok && ack_ok
    }

    /// Records an accepted segment from `d` in the tracked sequence spaces.
    fn advance(c: &mut Conn, d: usize, r: &ScrRecord, flags: u8) {
        let end = r.seq.wrapping_add(seg_len(r, flags));
        if after(end, c.end[d]) {
            c.end[d] = end;
        }
        if flags & ACK != 0 && after(r.ack, c.acked[1 - d]) {
            c.acked[1 - d] = r.ack;
        }
    }

    fn timeout_of(&self, c: &Conn) -> u64 {
        if c.state == CtState::Established as u8 {
            self.timeout_ns
        } else {
            SHORT_TIMEOUT_NS.min(self.timeout_ns)
        }
    }

    /// The state transition of one packet (its record); true if it passes.
    /// `process` and `scr_transition` both run exactly this.
    pub fn track(&mut self, r: &ScrRecord, now: u64) -> bool {
        let Some(flags) = r.tcp_flags() else {
            self.c.non_tcp += 1;
            return true;
        };
        let key = r.connection_key();
        // Direction: 0 when the sender is the canonical key's lower endpoint.
        let d = usize::from(
            ((u64::from(r.src) << 16) | u64::from(r.sport)) > ((u64::from(r.dst) << 16) | u64::from(r.dport)),
        );
        let mut found = self.table.find(&key);
        if let Some(i) = found {
            // A clock that went backwards rebases the connection's idle time (never expires it early).
            let c = conn(&mut self.table, i);
            c.last_ns = c.last_ns.min(now);
            let (last, c) = (c.last_ns, *c);
            if now - last > self.timeout_of(&c) {
                // Idle past its timeout: forgotten, the packet is judged as a new connection's.
                self.table.remove_at(i);
                found = None;
            }
        }
        let syn_only = flags & (SYN | ACK | RST | FIN) == SYN;
        let time_wait = found.is_some_and(|i| conn(&mut self.table, i).state == CtState::TimeWait as u8);
        let Some(i) = found.filter(|_| !(time_wait && syn_only)) else {
            if !syn_only {
                self.c.invalid += 1;
                return false;
            }
            let mut c = Conn { last_ns: now, state: CtState::SynSent as u8, init: d as u8, ..Default::default() };
            c.isn[d] = r.seq;
            c.end[d] = r.seq.wrapping_add(seg_len(r, flags));
            match found {
                // A new connection over one in TIME_WAIT: same key, same slot.
                Some(i) => *conn(&mut self.table, i) = c,
                // Fails closed: a connection it cannot track is not let in.
                None if self.table.insert(key, c).is_err() => {
                    self.c.full += 1;
                    return false;
                }
                None => {}
            }
            self.c.new += 1;
            return true;
        };
        let c = *conn(&mut self.table, i);
        let init = usize::from(c.init);
        let resp = 1 - init;
        let st = c.state;
        if flags & RST != 0 {
            let ok = if st == CtState::SynSent as u8 {
                // RFC 793: from the responder acknowledging the SYN, or the initiator's abort.
                (d == resp && flags & ACK != 0 && r.ack == c.isn[init].wrapping_add(1))
                    || (d == init && r.seq == c.isn[init].wrapping_add(1))
            } else {
                self.in_window(&c, d, r, flags)
            };
            if !ok {
                // Blind or stale reset: dropped, the connection stays.
                self.c.out_of_window += 1;
                self.c.invalid += 1;
                return false;
            }
            conn(&mut self.table, i).last_ns = now;
            if st == CtState::SynSent as u8 || st == CtState::SynRecv as u8 || r.seq == c.acked[d] {
                // RFC 5961 3.2: only a reset at exactly the receiver's next sequence resets.
                self.c.reset += 1;
                self.table.remove_at(i);
            } else {
                // In the window but not exact: the receiver answers with a challenge ACK; kept.
                self.c.rst_in_window += 1;
            }
            return true;
        }
        let ok = if st == CtState::SynSent as u8 {
            if d == resp && flags & (SYN | ACK) == SYN | ACK && r.ack == c.isn[init].wrapping_add(1) {
                let c = conn(&mut self.table, i);
                c.state = CtState::SynRecv as u8;
                c.isn[resp] = r.seq;
                c.end[resp] = r.seq.wrapping_add(seg_len(r, flags));
                c.acked[init] = r.ack;
                c.acked[resp] = r.seq.wrapping_add(1);
                true
            } else {
                // A retransmitted SYN.
                d == init && syn_only && r.seq == c.isn[init]
            }
        } else if st == CtState::SynRecv as u8 {
            if d == init && flags & (SYN | ACK) == ACK && r.ack == c.isn[resp].wrapping_add(1) {
                if self.in_window(&c, d, r, flags) {
                    let c = conn(&mut self.table, i);
                    Self::advance(c, d, r, flags);
                    c.state = CtState::Established as u8;
                    self.c.established += 1;
                    true
                } else {
                    self.c.out_of_window += 1;
                    false
                }
            } else {
                // A retransmitted SYN-ACK.
                d == resp && flags & (SYN | ACK) == SYN | ACK && r.seq == c.isn[resp]
            }
        } else if flags & SYN != 0 {
            // No SYN inside a connection (a new one may start from TIME_WAIT only, above).
            false
        } else if !self.in_window(&c, d, r, flags) {
            self.c.out_of_window += 1;
            false
        } else {
            let c = conn(&mut self.table, i);
            Self::advance(c, d, r, flags);
            if flags & FIN != 0 {
                c.fin |= 1 << d;
                c.state = if c.fin == 3 { CtState::Closing as u8 } else { CtState::FinWait as u8 };
            } else if c.state == CtState::Closing as u8 && flags & ACK != 0 {
                c.state = CtState::TimeWait as u8;
                self.c.closed += 1;
            }
            true
        };
        if ok {
            conn(&mut self.table, i).last_ns = now;
        } else {
            self.c.invalid += 1;
        }
        ok
    }

    /// Digest of the connection table (for replica comparisons).
    pub fn digest(&self) -> u64 {
        self.table
            .iter()
            .map(|(_, &key, c)| {
                let mut h = (key as u64) ^ ((key >> 64) as u64).rotate_left(21) ^ c.last_ns.rotate_left(7);
                h ^= (u64::from(c.end[0]) << 32 | u64::from(c.end[1])).rotate_left(13);
                h ^= (u64::from(c.acked[0]) << 32 | u64::from(c.acked[1])).rotate_left(29);
                h ^= u64::from(c.state) << 56 | u64::from(c.fin) << 48 | u64::from(c.init) << 40;
                h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            })
            .fold(0u64, u64::wrapping_add)
    }

    /// Connections tracked now.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// No connection tracked.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

impl StatefulNf for Conntrack {
    type State = CtFlow;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn placement(&self) -> Placement {
        // Both directions in order on one core (symmetric RSS); the table is the NF's own.
        Placement { affinity: Affinity::Connection, global: GlobalState::Private }
    }

    const BOTH_DIRECTIONS: bool = true;

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> CtFlow {
        CtFlow::default()
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut CtFlow, ctx: &NfContext) -> Action {
        let r = ScrRecord::from_frame(pkt.data(), pkt.meta());
        let pass = self.track(&r, ctx.now_ns);
        st.count(&r, ctx.now_ns, pass);
        if pass {
            Action::Pass
        } else {
            Action::Drop
        }
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(
            ScrFields::FIVE_TUPLE
                .with(ScrFields::TCP_FLAGS)
                .with(ScrFields::TCP_SEQ_ACK)
                .with(ScrFields::LEN)
                .with(ScrFields::TIME),
        )
    }

    #[inline]
    fn scr_transition(&mut self, st: &mut CtFlow, r: &ScrRecord, ctx: &NfContext) -> bool {
        let saved = self.c;
        let pass = self.track(r, ctx.now_ns);
        st.count(r, ctx.now_ns, pass);
        // Counters describe a core's own packets.
        self.c = saved;
        pass
    }

    fn scr_digest(&self) -> u64 {
        self.digest()
    }

    fn passes_without_state(&self) -> bool {
        false
    }

    fn on_no_state(&mut self) -> Action {
        self.c.full += 1;
        Action::Drop
    }

    fn report(&self) -> Option<serde_json::Value> {
        let c = &self.c;
        Some(json!({
            "capacity": self.capacity,
            "new": c.new,
            "established": c.established,
            "closed": c.closed,
            "reset": c.reset,
            "rst_in_window": c.rst_in_window,
            "out_of_window": c.out_of_window,
            "invalid": c.invalid,
            "non_tcp": c.non_tcp,
            "table_full": c.full,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        merge_keeping(into, other, &["capacity"]);
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    /// One row per direction's flow: its 5-tuple as sent, packets and bytes.
    fn export_row(&self, key: &FiveTuple, st: &CtFlow) -> Option<serde_json::Value> {
        (st.packets > 0).then(|| {
            json!({
                "proto": key.proto(),
                "src": key.src_ip().to_string(),
                "dst": key.dst_ip().to_string(),
                "sport": key.src_port(),
                "dport": key.dst_port(),
                "packets": st.packets,
                "bytes": st.bytes(),
            })
        })
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.ipfix = Some(tx);
    }

    /// A direction's flow record: its counts and times; flowEndReason 3 when
    /// it sent a FIN or RST that passed, unless this is an active-timeout report.
    fn ipfix_flow(&mut self, key: &FiveTuple, st: &CtFlow, reason: EndReason) {
        if let (Some(tx), true) = (&mut self.ipfix, st.packets > 0) {
            let reason = end_reason(reason, st.bytes & CtFlow::ENDED != 0);
            tx.push(ExportRecord::Flow(FlowExport::new(*key, st.packets, st.bytes(), st.first_ns, st.last_ns, reason)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP record; `data` payload bytes (the frame carries no padding, so the bound is exact).
    #[allow(clippy::too_many_arguments)]
    fn seg(src: u32, sport: u16, dst: u32, dport: u16, flags: u8, seq: u32, ack: u32, data: usize) -> ScrRecord {
        let mut f = vec![0u8; 54 + data];
        f[12] = 0x08;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&(40 + data as u16).to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&src.to_be_bytes());
        f[30..34].copy_from_slice(&dst.to_be_bytes());
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        f[46] = 0x50;
        f[47] = flags;
        let m = flowplane_wire::frame::PktMeta::parse(&f);
        ScrRecord::from_frame(&f, &m)
    }

    fn rec(src: u32, sport: u16, dst: u32, dport: u16, flags: u8, seq: u32, ack: u32) -> ScrRecord {
        seg(src, sport, dst, dport, flags, seq, ack, 0)
    }

    #[test]
    fn handshake_data_fin_and_invalid() {
        let mut ct = Conntrack::new(64, 300_000_000_000);
        let (c, s) = (0x0a00_0002, 0x0a00_0001);
        let cs = |flags, seq, ack, data| seg(c, 1000, s, 80, flags, seq, ack, data);
        let sc = |flags, seq, ack, data| seg(s, 80, c, 1000, flags, seq, ack, data);
        assert!(!ct.track(&cs(ACK, 5, 9, 0), 0), "no SYN: invalid");
        assert!(ct.track(&cs(SYN, 100, 0, 0), 1));
        assert!(!ct.track(&sc(SYN | ACK, 500, 7, 0), 2), "SYN-ACK acking the wrong number");
        assert!(ct.track(&sc(SYN | ACK, 500, 101, 0), 3));
        assert!(!ct.track(&cs(ACK, 101, 7, 0), 4), "bad handshake ACK");
        assert!(ct.track(&cs(ACK, 101, 501, 0), 5));
        assert!(ct.track(&cs(ACK | PSH, 101, 501, 49), 6));
        assert!(ct.track(&sc(ACK, 501, 150, 0), 7));
        assert!(!ct.track(&sc(ACK, 501u32.wrapping_add(1 << 31), 150, 0), 8), "far outside the window");
        assert!(!ct.track(&sc(ACK, 501, 151, 0), 8), "acks a byte never sent");
        assert!(ct.track(&cs(FIN | ACK, 150, 501, 0), 8));
        assert!(ct.track(&sc(FIN | ACK, 501, 151, 0), 9));
        assert!(ct.track(&cs(ACK, 151, 502, 0), 10));
        assert_eq!(ct.c.closed, 1);
        assert_eq!(ct.len(), 1);
        // A new SYN reuses the TIME_WAIT slot; the responder's RST acknowledging it removes it.
        assert!(ct.track(&cs(SYN, 9000, 0, 0), 11));
        assert!(!ct.track(&sc(RST, 0, 0, 0), 12), "an RST in SYN_SENT must acknowledge the SYN");
        assert!(ct.track(&sc(RST | ACK, 0, 9001, 0), 12));
        assert!(ct.is_empty());
        // Idle expiry: an ACK after the short timeout finds nothing.
        assert!(ct.track(&rec(c, 2000, s, 80, SYN, 1, 0), 20));
        assert!(!ct.track(&rec(c, 2000, s, 80, ACK, 2, 1), 20 + SHORT_TIMEOUT_NS + 1));
    }

    /// An established connection: client 10.0.0.2:1000 (ISN 100, then 1000 bytes sent), server
    /// 10.0.0.1:80 (ISN 0xffff_fff0: its numbers wrap; 100 bytes sent), each side acked.
    /// A segment builder for one direction: (flags, seq, ack, payload bytes).
    type Dir = fn(u8, u32, u32, usize) -> ScrRecord;

    fn established(window: u32) -> (Conntrack, Dir, Dir) {
        let cs: Dir = |flags, seq, ack, data| seg(0x0a00_0002, 1000, 0x0a00_0001, 80, flags, seq, ack, data);
        let sc: Dir = |flags, seq, ack, data| seg(0x0a00_0001, 80, 0x0a00_0002, 1000, flags, seq, ack, data);
        let mut ct = Conntrack::new(64, 300_000_000_000).with_window(window);
        let si = 0xffff_fff0u32;
        for (r, t) in [
            (cs(SYN, 100, 0, 0), 1),
            (sc(SYN | ACK, si, 101, 0), 2),
            (cs(ACK, 101, si.wrapping_add(1), 0), 3),
            (cs(ACK | PSH, 101, si.wrapping_add(1), 1000), 4),
            (sc(ACK | PSH, si.wrapping_add(1), 1101, 100), 5),
            (cs(ACK, 1101, si.wrapping_add(101), 0), 6),
        ] {
            assert!(ct.track(&r, t));
        }
        (ct, cs, sc)
    }

    #[test]
    fn sequence_and_ack_windows() {
        let w = 1u32 << 16;
        let (mut ct, cs, sc) = established(w);
        let s_end = 0xffff_fff0u32.wrapping_add(101);
        // Data: up to a window past what the server acknowledged (1101), back to a window behind.
        assert!(ct.track(&cs(ACK, 1101 + w, s_end, 0), 7), "I: seq = acked + window");
        assert!(!ct.track(&cs(ACK, 1102 + w, s_end, 0), 7), "I: one past");
        assert!(ct.track(&cs(ACK, 1101 + w - 10, s_end, 0), 7));
        // The client's end is now 1101 + w: a segment ending a window before it still passes.
        assert!(ct.track(&cs(ACK, 1101 - 5, s_end, 5), 7), "II: ends exactly end - window");
        assert!(!ct.track(&cs(ACK, 1101 - 6, s_end, 5), 7), "II: ends one before");
        // Acks: not past what the server sent, not more than a window behind it.
        assert!(!ct.track(&cs(ACK, 1101, s_end.wrapping_add(1), 0), 7), "III");
        assert!(ct.track(&cs(ACK, 1101, s_end.wrapping_sub(w), 0), 7), "IV: end - window");
        assert!(!ct.track(&cs(ACK, 1101, s_end.wrapping_sub(w + 1), 0), 7), "IV: one more");
        // No ACK flag: the ack field is not checked.
        assert!(ct.track(&cs(PSH, 1101, 7, 0), 7));
        assert_eq!(ct.c.out_of_window, 4);
        assert_eq!(ct.report().unwrap()["out_of_window"], 4);
        // Far out-of-window FINs and SYNs change nothing.
        assert!(!ct.track(&cs(FIN | ACK, 1101 + (1 << 28), s_end, 0), 8));
        assert!(!ct.track(&sc(SYN | ACK, 5, 1101, 0), 8));
        assert_eq!(ct.table.iter().next().unwrap().2.state, CtState::Established as u8);
    }

    #[test]
    fn rst_exact_resets_in_window_is_kept_out_of_window_dropped() {
        let (mut ct, cs, sc) = established(1 << 16);
        let s_end = 0xffff_fff0u32.wrapping_add(101);
        // Issue 29: a client RST 2^29 behind tore the connection down.
        assert!(!ct.track(&cs(RST, 1101u32.wrapping_sub(1 << 29), 0, 0), 7), "out of window: dropped");
        assert!(!ct.track(&sc(RST, s_end.wrapping_add(1 << 20), 0, 0), 7));
        assert_eq!(ct.len(), 1);
        // In window, not at the receiver's next sequence: passes (challenge ACK), kept.
        assert!(ct.track(&cs(RST, 1150, 0, 0), 8));
        assert!(ct.track(&sc(RST | ACK, s_end.wrapping_sub(3), 1101, 0), 8));
        assert_eq!((ct.c.rst_in_window, ct.c.reset, ct.len()), (2, 0, 1));
        assert!(ct.track(&cs(ACK, 1101, s_end, 0), 9), "still established");
        // Exactly the server's acknowledged 1101: reset.
        assert!(ct.track(&cs(RST, 1101, 0, 0), 10));
        assert_eq!((ct.c.reset, ct.len()), (1, 0));
        assert!(!ct.track(&cs(ACK, 1101, s_end, 0), 11), "no connection");
    }

    #[test]
    fn a_clock_that_goes_back_rebases_the_idle_time() {
        let (mut ct, cs, _) = established(1 << 16);
        let s_end = 0xffff_fff0u32.wrapping_add(101);
        let t = 300_000_000_000;
        assert!(ct.track(&cs(ACK, 1101, s_end, 0), 7));
        // Back in time: the connection's idle time restarts there; it lives one full timeout.
        assert!(ct.track(&cs(ACK, 1101, s_end, 0), 3));
        assert!(ct.track(&cs(ACK, 1101, s_end, 0), 3 + t));
        assert!(!ct.track(&cs(ACK, 1101, s_end, 0), 3 + 2 * t + 1), "idle past the timeout");
    }

    #[test]
    fn deletion_keeps_probe_chains() {
        let mut ct = Conntrack::new(16, 1_000_000_000_000);
        for i in 0..14u32 {
            assert!(ct.track(&rec(i + 1, 1, 100, 80, SYN, i, 0), 0));
        }
        for i in (0..14u32).step_by(2) {
            assert!(ct.track(&rec(100, 80, i + 1, 1, RST | ACK, 0, i + 1), 1));
        }
        for i in (1..14u32).step_by(2) {
            assert!(ct.track(&rec(i + 1, 1, 100, 80, SYN, i, 0), 2), "retransmitted SYN of {i} finds its entry");
        }
        assert_eq!(ct.len(), 7);
    }
}

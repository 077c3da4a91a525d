//! `amf`: an AMF-like, state-heavy NF (GuNFu §II/§VI): a 24-cache-line
//! context per UE, and five message types that each touch a different
//! subset of it, so that touching — and prefetching — only what an action
//! needs matters.
//!
//! Messages are UDP datagrams to port `port` (default 38412) whose payload
//! is (big endian):
//!
//! ```text
//! 0   u8   version = 1
//! 1   u8   type: 1 registration, 2 service request, 3 PDU session
//!          establishment, 4 handover required, 5 deregistration
//! 2   u16  body length (bytes after this 16-byte header)
//! 4   u64  UE id (SUPI as an integer, non-zero)
//! 12  u32  sequence (the UE's NAS count)
//! 16  body: registration   u32 TAC, u32 slice (S-NSSAI)
//!           service        u32 TAC
//!           PDU session    u8 session id (0..7), u8 SST, u16 0, u32 DNN hash
//!           handover       u32 target cell, u32 target gNB
//!           deregistration u8 cause
//! ```
//!
//! The context's lines: 0 identity and state; 1-4 security (K_AMF, NAS
//! counts, NH); 5-7 mobility (TAI list, timers); 8-15 one line per PDU
//! session; 16-19 RAN (gNB, cell, NGAP ids, handover history); 20-23
//! subscription (allowed slices, AMBR). Registration touches 12 lines,
//! service request 3, PDU session 3, handover 6, deregistration 10.
//! `mode=staged` (default) looks a batch's UEs up first and prefetches only
//! the lines each message's action touches; `mode=all` prefetches all 24;
//! `mode=rtc` prefetches nothing. Malformed messages, unknown UEs (other
//! than on registration), replayed sequence numbers, disallowed slices and
//! a full context table are counted drops; other packets pass untouched.
//!
//! Contexts are per core (a private table), so on several cores every
//! message of a gNB association (one 5-tuple) must reach one core and stay
//! there: `amf` declares that placement, and strategies that spray packets
//! (`shared`, `scr`) or move flows between cores (`rsspp`, `dyssect`) are
//! refused; `rss` runs it.

use flowplane_packet::{prefetch, Batch, MAX_BATCH};
use flowplane_table::{FibHash, FixedMap};
use flowplane_wire::frame::PktMeta;
use serde_json::{json, Value};

use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::{Affinity, GlobalState, Nf, NfContext, NfCounters, ParamError, ParamSpec, Params, Placement};

const PORT: ParamSpec = ParamSpec::uint("port", 38412, 1, 65535, "UDP port the AMF messages are sent to");
// Per UE: its 24-line context and its map share (an 8-byte entry, a free-list word, up to 4 index words).
const UES: ParamSpec = ParamSpec::uint("ues", 1 << 17, 1, 1 << 24, "UE contexts per core (24 cache lines each)")
    .allocates(24 * 64 + 4 + 48);
const MODE: ParamSpec = ParamSpec::choice(
    "mode",
    "staged",
    &["staged", "all", "rtc"],
    "staged: prefetch the lines each action touches; all: every line; rtc: none",
);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "amf",
    about: "AMF-like NF: 24-cache-line UE contexts, registration/service/PDU session/handover/deregistration messages over UDP",
    keyed_by: KeyedBy::Own("UE id"),
    params: &[PORT, UES, MODE],
};

/// Builds `amf` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    let port = p.uint(&PORT)? as u16;
    let ues = p.uint(&UES)? as usize;
    let mode = p.choice(&MODE, [Mode::Staged, Mode::All, Mode::Rtc])?;
    Ok(sink.stateless(Box::new(Amf::new(port, ues, mode))))
}

/// Prefetching policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Look the batch up first, prefetch the lines each action needs.
    Staged,
    /// Look the batch up first, prefetch every line of the context.
    All,
    /// Each message to completion, no prefetch.
    Rtc,
}

/// Message types.
pub mod msg {
    /// Registration request.
    pub const REGISTRATION: u8 = 1;
    /// Service request.
    pub const SERVICE: u8 = 2;
    /// PDU session establishment request.
    pub const PDU_SESSION: u8 = 3;
    /// Handover required.
    pub const HANDOVER: u8 = 4;
    /// Deregistration request.
    pub const DEREGISTRATION: u8 = 5;
}

/// Header length.
pub const HEADER_LEN: usize = 16;

/// Lines of a UE context.
pub const LINES: usize = 24;
const ID: usize = 0;
const SEC: std::ops::Range<usize> = 1..5;
const MOB: std::ops::Range<usize> = 5..8;
const PDU: std::ops::Range<usize> = 8..16;
const RAN: std::ops::Range<usize> = 16..20;
const SUB: std::ops::Range<usize> = 20..24;

/// Body bytes each message type needs.
fn body_len(t: u8) -> Option<usize> {
    match t {
        msg::REGISTRATION | msg::PDU_SESSION | msg::HANDOVER => Some(8),
        msg::SERVICE => Some(4),
        msg::DEREGISTRATION => Some(1),
        _ => None,
    }
}

/// One cache line of a context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// A UE context: 24 cache lines (see the module docs for what each holds).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
struct UeCtx {
    lines: [Line; LINES],
}

/// The lines an action on message type `t` (PDU session `sid`) touches.
fn touched(t: u8, sid: usize) -> impl Iterator<Item = usize> {
    let (a, b, c): (std::ops::Range<usize>, std::ops::Range<usize>, std::ops::Range<usize>) = match t {
        msg::REGISTRATION => (SEC, MOB, SUB),
        msg::SERVICE => (SEC.start..SEC.start + 1, MOB.start..MOB.start + 1, 0..0),
        msg::PDU_SESSION => (PDU.start + sid..PDU.start + sid + 1, SUB.start..SUB.start + 1, 0..0),
        msg::HANDOVER => (SEC.start + 1..SEC.start + 2, RAN, 0..0),
        msg::DEREGISTRATION => (MOB.start..MOB.start + 1, PDU, 0..0),
        _ => (0..0, 0..0, 0..0),
    };
    std::iter::once(ID).chain(a).chain(b).chain(c)
}

/// Counters by outcome (per core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmfCounters {
    /// Messages handled, by type (index = type - 1).
    pub handled: [u64; 5],
    /// Malformed messages (short, bad version, type or length).
    pub malformed: u64,
    /// Messages (other than registration) from UEs without a context.
    pub unknown_ue: u64,
    /// Sequence numbers not above the last one seen (replays).
    pub replayed: u64,
    /// PDU sessions for a slice the UE is not allowed.
    pub slice_denied: u64,
    /// Registrations refused because the context table was full.
    pub table_full: u64,
    /// Packets that are not AMF messages (passed on).
    pub other: u64,
}

/// A parsed message.
#[derive(Clone, Copy, Debug, Default)]
struct Msg {
    t: u8,
    ue: u64,
    seq: u32,
    a: u32,
    b: u32,
}

/// The AMF (one per core).
pub struct Amf {
    port: u16,
    mode: Mode,
    /// UE contexts, indexed by the UE's slot in `map`.
    ctx: Vec<UeCtx>,
    /// UE id -> its slot (stable while registered; freed slots are reused last-in-first-out).
    map: FixedMap<u64, (), FibHash>,
    c: AmfCounters,
    counters: NfCounters,
    msgs: Box<[Option<Msg>; MAX_BATCH]>,
    slots: Box<[Option<u32>; MAX_BATCH]>,
    meta: PktMeta,
}

impl std::fmt::Debug for Amf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amf").field("ues", &self.map.len()).field("counters", &self.c).finish()
    }
}

/// Mixes words (a stand-in for key derivation: real work over the lines it reads).
#[inline(always)]
fn mix(a: u64, b: u64) -> u64 {
    (a ^ b.rotate_left(23)).wrapping_mul(0x2545_f491_4f6c_dd1d)
}

impl Amf {
    /// An AMF for messages to UDP `port`, with room for `ues` contexts.
    pub fn new(port: u16, ues: usize, mode: Mode) -> Amf {
        // At least one context (the map's minimum), at most what a slot can name.
        let ues = ues.clamp(1, flowplane_table::FIXED_MAP_MAX);
        let ctx = vec![UeCtx::default(); ues];
        flowplane_table::huge::advise_hugepages(&ctx);
        Amf {
            port,
            mode,
            ctx,
            map: FixedMap::new(ues).expect("amf: cannot allocate the UE map"),
            c: AmfCounters::default(),
            counters: NfCounters::default(),
            msgs: Box::new([None; MAX_BATCH]),
            slots: Box::new([None; MAX_BATCH]),
            meta: PktMeta::default(),
        }
    }

    /// Counters by outcome.
    pub fn amf_counters(&self) -> AmfCounters {
        self.c
    }

    /// UEs with a context.
    pub fn ues(&self) -> usize {
        self.map.len()
    }

    /// Parses packet `i`: `None` for packets that are not AMF messages or are malformed (counted).
    fn parse(&mut self, data: &[u8]) -> Option<Msg> {
        self.meta.parse_into(data);
        let m = &self.meta;
        if !m.valid || m.proto.0 != 17 || m.l4 == 0 || m.tuple.dst_port() != self.port {
            self.c.other += 1;
            return None;
        }
        let at = m.l4 as usize + 8;
        let p = data.get(at..).unwrap_or(&[]);
        let ok = |c: &mut AmfCounters| {
            c.malformed += 1;
        };
        if p.len() < HEADER_LEN || p[0] != 1 {
            ok(&mut self.c);
            return None;
        }
        let t = p[1];
        let blen = usize::from(u16::from_be_bytes([p[2], p[3]]));
        let need = body_len(t);
        let ue = u64::from_be_bytes(p[4..12].try_into().unwrap_or([0; 8]));
        if need.is_none_or(|n| blen < n || p.len() < HEADER_LEN + blen) || ue == 0 {
            ok(&mut self.c);
            return None;
        }
        let body = &p[HEADER_LEN..];
        let w = |k: usize| body.get(k..k + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let (a, b) = match t {
            msg::PDU_SESSION => (u32::from(body[0] & 7) | (u32::from(body[1]) << 8), w(4)),
            msg::DEREGISTRATION => (u32::from(body[0]), 0),
            msg::SERVICE => (w(0), 0),
            _ => (w(0), w(4)),
        };
        let seq = u32::from_be_bytes(p[12..16].try_into().unwrap_or([0; 4]));
        Some(Msg { t, ue, seq, a, b })
    }

    fn prefetch_lines(&self, slot: u32, m: &Msg) {
        let c = &self.ctx[slot as usize];
        match self.mode {
            Mode::Rtc => {}
            Mode::All => c.lines.iter().for_each(prefetch::write),
            Mode::Staged => touched(m.t, (m.a & 7) as usize).for_each(|l| prefetch::write(&c.lines[l])),
        }
    }

    /// The action of message `m`; `true`: pass, `false`: drop (counted).
    fn act(&mut self, m: &Msg, slot: Option<u32>, now: u64) -> bool {
        let slot = match (slot, m.t) {
            (Some(s), _) => s,
            (None, msg::REGISTRATION) => match self.map.insert(m.ue, ()) {
                Ok(s) => {
                    self.ctx[s] = UeCtx::default();
                    s as u32
                }
                Err(_) => {
                    self.c.table_full += 1;
                    return false;
                }
            },
            (None, _) => {
                self.c.unknown_ue += 1;
                return false;
            }
        };
        let c = &mut self.ctx[slot as usize].lines;
        // Line 0: [ue id, state, last seen, last seq, registrations, messages, ...].
        if m.t != msg::REGISTRATION && u64::from(m.seq) <= c[ID].0[3] && c[ID].0[5] > 0 {
            self.c.replayed += 1;
            return false;
        }
        match m.t {
            msg::REGISTRATION => {
                c[ID].0[0] = m.ue;
                c[ID].0[1] = 1;
                c[ID].0[4] += 1;
                // K_AMF and NAS keys: 32 words derived from the UE id and count.
                let mut k = mix(m.ue, u64::from(m.seq));
                for l in SEC {
                    for w in 0..8 {
                        k = mix(k, (l * 8 + w) as u64);
                        c[l].0[w] = k;
                    }
                }
                for l in MOB {
                    c[l].0 = [u64::from(m.a); 8];
                    c[l].0[1] = now;
                }
                // Allowed slices: the requested one and the default (SST 1).
                for l in SUB {
                    c[l].0[0] = u64::from(m.b & 0xff);
                    c[l].0[1] = 1;
                }
            }
            msg::SERVICE => {
                c[SEC.start].0[1] = u64::from(m.seq);
                c[MOB.start].0[0] = u64::from(m.a);
                c[MOB.start].0[2] += 1;
            }
            msg::PDU_SESSION => {
                let sid = (m.a & 7) as usize;
                let sst = u64::from((m.a >> 8) & 0xff);
                if c[SUB.start].0[0] != sst && c[SUB.start].0[1] != sst {
                    self.c.slice_denied += 1;
                    return false;
                }
                let s = &mut c[PDU.start + sid].0;
                s[0] = 1;
                s[1] = sst;
                s[2] = u64::from(m.b);
                s[3] = mix(m.ue, sid as u64) as u32 as u64; // the UPF TEID for the session
                s[4] += 1;
            }
            msg::HANDOVER => {
                // Next hop key from the current one.
                let nh = &mut c[SEC.start + 1].0;
                nh[0] = mix(nh[0], u64::from(m.a));
                nh[1] += 1;
                for l in RAN {
                    c[l].0.copy_within(0..7, 1);
                    c[l].0[0] = u64::from(m.a) ^ (u64::from(m.b) << 32);
                }
            }
            _ => {
                for l in PDU {
                    c[l] = Line::default();
                }
                c[MOB.start].0[3] = now;
            }
        }
        let id = &mut c[ID].0;
        id[2] = now;
        id[3] = u64::from(m.seq);
        id[5] += 1;
        self.c.handled[usize::from(m.t - 1)] += 1;
        if m.t == msg::DEREGISTRATION {
            self.map.remove(&m.ue);
        }
        true
    }
}

impl Nf for Amf {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn process(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, _ctx: &NfContext) {
        let staged = self.mode != Mode::Rtc;
        let run = |me: &mut Amf, batch: &mut Batch, i: usize, pass: u8| {
            match pass {
                0 => {
                    me.msgs[i] = None;
                    if batch.is_dropped(i) {
                        return;
                    }
                    me.counters.packets_in += 1;
                    me.counters.bytes_in += batch.lens()[i] as u64;
                    let m = me.parse(batch.data(i));
                    if m.is_none() && me.meta.valid && me.meta.tuple.dst_port() == me.port {
                        batch.drop_packet(i);
                        me.counters.dropped += 1;
                        return;
                    }
                    me.msgs[i] = m;
                    if m.is_none() {
                        me.counters.packets_out += 1;
                        return;
                    }
                    if let Some(m) = m {
                        if staged {
                            prefetch::read(me.map.home_word(FixedMap::<u64, (), FibHash>::hash(&m.ue)));
                        }
                    }
                }
                1 => {
                    let Some(m) = me.msgs[i] else { return };
                    let s = me.map.find(&m.ue).map(|s| s as u32);
                    me.slots[i] = s;
                    if let (Some(s), true) = (s, staged) {
                        me.prefetch_lines(s, &m);
                    }
                }
                _ => {
                    let Some(m) = me.msgs[i] else { return };
                    // A registration or deregistration earlier in the batch may have changed the slot.
                    let slot = if staged { me.map.find(&m.ue).map(|s| s as u32) } else { me.slots[i] };
                    let now = batch.timestamps()[i];
                    if me.act(&m, slot, now) {
                        me.counters.packets_out += 1;
                    } else {
                        batch.drop_packet(i);
                        me.counters.dropped += 1;
                    }
                }
            }
        };
        if staged {
            for pass in 0..3 {
                for i in range.clone() {
                    run(self, batch, i, pass);
                }
            }
        } else {
            for i in range {
                for pass in 0..3 {
                    run(self, batch, i, pass);
                }
            }
        }
    }

    fn placement(&self) -> Option<Placement> {
        // A UE's messages come over its gNB's association (one 5-tuple), and its
        // context lives in this core's private table: every message of the flow
        // must reach the core that registered the UE, and flows cannot move.
        Some(Placement { affinity: Affinity::Flow, global: GlobalState::Private })
    }

    fn counters(&self) -> NfCounters {
        self.counters
    }

    fn report(&self) -> Option<Value> {
        let h = self.c.handled;
        Some(json!({
            "ues": self.ues(),
            "registration": h[0], "service": h[1], "pdu_session": h[2], "handover": h[3], "deregistration": h[4],
            "malformed": self.c.malformed, "unknown_ue": self.c.unknown_ue, "replayed": self.c.replayed,
            "slice_denied": self.c.slice_denied, "table_full": self.c.table_full, "other": self.c.other,
        }))
    }
}

/// Writes an AMF message (header and body) into `out` (at least
/// `HEADER_LEN + 8` bytes); returns its length. For generators and tests.
pub fn encode(out: &mut [u8], t: u8, ue: u64, seq: u32, a: u32, b: u32) -> Option<usize> {
    let blen = body_len(t)?;
    let o = out.get_mut(..HEADER_LEN + blen)?;
    o[0] = 1;
    o[1] = t;
    o[2..4].copy_from_slice(&(blen as u16).to_be_bytes());
    o[4..12].copy_from_slice(&ue.to_be_bytes());
    o[12..16].copy_from_slice(&seq.to_be_bytes());
    let body = &mut o[HEADER_LEN..];
    match t {
        msg::PDU_SESSION => {
            body[0] = (a & 7) as u8;
            body[1] = (a >> 8) as u8;
            body[2..4].copy_from_slice(&[0, 0]);
            body[4..8].copy_from_slice(&b.to_be_bytes());
        }
        msg::DEREGISTRATION => body[0] = a as u8,
        msg::SERVICE => body[..4].copy_from_slice(&a.to_be_bytes()),
        _ => {
            body[..4].copy_from_slice(&a.to_be_bytes());
            body[4..8].copy_from_slice(&b.to_be_bytes());
        }
    }
    Some(HEADER_LEN + blen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::ipv4_frame;
    use flowplane_packet::{PacketPool, PoolConfig};

    fn frame(t: u8, ue: u64, seq: u32, a: u32, b: u32) -> Vec<u8> {
        let mut m = [0u8; 32];
        let n = encode(&mut m, t, ue, seq, a, b).unwrap();
        let mut u = vec![0u8; 8];
        u[0..2].copy_from_slice(&40000u16.to_be_bytes());
        u[2..4].copy_from_slice(&38412u16.to_be_bytes());
        u[4..6].copy_from_slice(&((8 + n) as u16).to_be_bytes());
        u.extend_from_slice(&m[..n]);
        ipv4_frame([10, 0, 0, 1], [10, 100, 0, 1], 17, &u)
    }

    fn run(a: &mut Amf, frames: &[Vec<u8>]) -> Vec<bool> {
        let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
        let mut b = Batch::new(&pool);
        for f in frames {
            assert!(b.push_copy(&mut pool, f, 5));
        }
        let n = b.len();
        a.process(&mut b, 0..n, &NfContext::default());
        let out = (0..n).map(|i| !b.is_dropped(i)).collect();
        b.free_all(&mut pool).unwrap();
        out
    }

    #[test]
    fn context_is_24_lines_and_actions_touch_their_subsets() {
        assert_eq!(std::mem::size_of::<UeCtx>(), 24 * 64);
        let n = |t| touched(t, 3).count();
        assert_eq!((n(1), n(2), n(3), n(4), n(5)), (12, 3, 3, 6, 10));
    }

    #[test]
    fn message_flow_and_counted_drops() {
        for mode in [Mode::Staged, Mode::All, Mode::Rtc] {
            let mut a = Amf::new(38412, 2, mode);
            let out = run(
                &mut a,
                &[
                    frame(msg::SERVICE, 7, 1, 100, 0),      // unknown UE
                    frame(msg::REGISTRATION, 7, 1, 100, 2), // slice 2 allowed
                    frame(msg::SERVICE, 7, 2, 101, 0),
                    frame(msg::SERVICE, 7, 2, 101, 0),              // replay
                    frame(msg::PDU_SESSION, 7, 3, 5 | (2 << 8), 9), // SST 2: allowed
                    frame(msg::PDU_SESSION, 7, 4, 1 | (3 << 8), 9), // SST 3: denied
                    frame(msg::HANDOVER, 7, 5, 11, 12),
                    frame(msg::REGISTRATION, 8, 1, 1, 1),
                    frame(msg::REGISTRATION, 9, 1, 1, 1), // table full (2 contexts)
                    frame(msg::DEREGISTRATION, 7, 6, 0, 0),
                    frame(msg::REGISTRATION, 9, 1, 1, 1), // room again
                    frame(msg::SERVICE, 7, 7, 1, 0),      // deregistered
                    vec![0u8; 60],                        // not AMF: passes
                ],
            );
            assert_eq!(
                out,
                vec![false, true, true, false, true, false, true, true, false, true, true, false, true],
                "{mode:?}"
            );
            let c = a.amf_counters();
            assert_eq!(c.handled, [3, 1, 1, 1, 1], "{mode:?}");
            assert_eq!((c.unknown_ue, c.replayed, c.slice_denied, c.table_full, c.other), (2, 1, 1, 1, 1));
            assert_eq!(a.ues(), 2);
        }
    }

    #[test]
    fn malformed_messages_are_counted() {
        let mut a = Amf::new(38412, 4, Mode::Staged);
        let good = frame(msg::REGISTRATION, 7, 1, 1, 1);
        let mut bad_version = good.clone();
        bad_version[42] = 2;
        let mut bad_type = good.clone();
        bad_type[43] = 9;
        let mut zero_ue = good.clone();
        zero_ue[46..54].fill(0);
        let cuts: Vec<Vec<u8>> = (42..good.len()).map(|n| good[..n].to_vec()).collect();
        let out = run(&mut a, &[bad_version, bad_type, zero_ue]);
        assert!(out.iter().all(|&x| !x));
        run(&mut a, &cuts);
        assert_eq!(a.amf_counters().malformed, 3 + cuts.len() as u64);
    }

    #[test]
    fn deregistered_slots_are_reused() {
        let mut a = Amf::new(38412, 2, Mode::Staged);
        let reg = |ue| frame(msg::REGISTRATION, ue, 1, 7, 1);
        assert_eq!(run(&mut a, &[reg(1), reg(2), reg(3)]), [true, true, false]);
        assert_eq!((a.ues(), a.amf_counters().table_full), (2, 1));
        assert_eq!(run(&mut a, &[frame(msg::DEREGISTRATION, 1, 2, 0, 0), reg(3)]), [true, true]);
        assert_eq!(run(&mut a, &[frame(msg::SERVICE, 3, 2, 9, 0), frame(msg::SERVICE, 1, 3, 9, 0)]), [true, false]);
        assert_eq!((a.ues(), a.amf_counters().unknown_ue), (2, 1));
    }
}

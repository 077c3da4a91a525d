//! The stateful NF programming model.
//!
//! An NF declares what its state is keyed by ([`Granularity`]), the state
//! itself (a plain-data `State` type), the **default action** run on a table
//! miss that builds the initial state (PNA add-on-miss), and the **per-packet
//! action** that reads/updates the state in place, may rewrite headers, and
//! returns an [`Action`]. Optional hooks: a prefetch hook for state reached
//! through pointers/indices (FAJITA's customizable prefetch), an idle timeout
//! and a release callback (expiry or end of flow).
//!
//! The NF never sees tables, batches or cores: the executor owns them. The
//! same NF therefore runs under every executor (batched with aggregated
//! state, run-to-completion, per-NF tables, micro-batches) and every
//! multi-core strategy. An NF is one file of safe Rust; see
//! `docs/WRITING_AN_NF.md`.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::{CustomKey, FieldSet, FiveTuple};
pub use flowplane_wire::scr::{ScrFields, ScrRecord};

/// A run of history records of one key for [`StatefulNf::scr_run`]: the
/// records in sequence order and the extremes of their times.
#[derive(Clone, Copy, Debug)]
pub struct ScrRun<'a> {
    /// The records (at least one).
    pub recs: &'a [ScrRecord],
    /// The earliest of their times, ns.
    pub min_ns: u64,
    /// The latest of their times, ns.
    pub max_ns: u64,
}

use crate::pkt::{Pkt, PktMeta};
use crate::report::Export;
use crate::NfContext;

/// The one idle rule of every state container — the engine's flow tables,
/// the per-NF stamps in aggregated blocks and coarse entries, NF-private
/// tables (fw's connections): state last touched at `last_ns` is idle at
/// `now_ns` (both packet-clock times, [`NfContext::now_ns`]) when strictly
/// more than `timeout_ns` has passed. A last touch in the future (the clock
/// went backwards, or another core got ahead) is never idle.
#[inline(always)]
pub fn is_idle(last_ns: u64, now_ns: u64, timeout_ns: u64) -> bool {
    now_ns.saturating_sub(last_ns) > timeout_ns
}

/// The last-touched time after a touch at `now_ns`: the later of the two
/// (packets of one key processed a little out of time order — several cores
/// on one coarse entry — never make it look idle), except that a stamp more
/// than the timeout in the future means the clock went backwards: it is
/// rebased to `now_ns`, as the flow tables' sweep does, so nothing expires
/// early and nothing stays forever.
#[inline(always)]
pub fn touched(last_ns: u64, now_ns: u64, timeout_ns: u64) -> u64 {
    if last_ns > now_ns.saturating_add(timeout_ns) {
        now_ns
    } else {
        last_ns.max(now_ns)
    }
}

/// A last-touched time under the [`is_idle`] and [`touched`] rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct IdleStamp(pub u64);

impl IdleStamp {
    /// True if the state was idle at `now_ns` (the caller treats it as
    /// gone: releases it, starts afresh); the stamp then records the touch.
    #[inline(always)]
    pub fn touch(&mut self, now_ns: u64, timeout_ns: u64) -> bool {
        let idle = is_idle(self.0, now_ns, timeout_ns);
        self.0 = if idle { now_ns } else { touched(self.0, now_ns, timeout_ns) };
        idle
    }
}

/// What an NF's state is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// The 5-tuple: state aggregated with every other 5-tuple NF of the chain.
    FiveTuple,
    /// Source IP address (state shared between cores under RSS).
    SrcIp,
    /// Destination IP address.
    DstIp,
    /// Source and destination IP addresses (IPv4).
    IpPair,
    /// GTP-U tunnel endpoint identifier (GTP-U packets only).
    Teid,
    /// A user-chosen set of fields (`src_ip,dport`, ...).
    Custom(FieldSet),
}

/// Two independent keyed SipHash-1-3 instances, fixed for the process so
/// every core fingerprints a custom key alike, random per run so traffic
/// cannot aim collisions at them.
fn fingerprint(bytes: &[u8]) -> u128 {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<(RandomState, RandomState)> = std::sync::OnceLock::new();
    let (a, b) = KEYS.get_or_init(|| (RandomState::new(), RandomState::new()));
    (u128::from(a.hash_one(bytes)) << 64) | u128::from(b.hash_one(bytes))
}

impl Granularity {
    /// The key of a coarse granularity for a packet (`None`: the packet has
    /// no such key — not GTP-U for `Teid`, IPv6 for `IpPair` — or the
    /// granularity is the 5-tuple, which has its own table). Addresses are
    /// exact (IPv4 stored IPv4-mapped), a TEID is exact, a custom field set
    /// is a 128-bit keyed fingerprint of its fields.
    #[inline]
    pub fn key(self, m: &PktMeta) -> Option<u128> {
        use std::net::IpAddr;
        let ip = |a: IpAddr| match a {
            IpAddr::V4(v) => u128::from(v.to_ipv6_mapped()),
            IpAddr::V6(v) => u128::from(v),
        };
        let t = &m.tuple;
        match self {
            Granularity::FiveTuple => None,
            Granularity::SrcIp => Some(ip(t.src_ip())),
            Granularity::DstIp => Some(ip(t.dst_ip())),
            Granularity::IpPair => match (t.src_ip(), t.dst_ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    Some((1u128 << 64) | (u128::from(u32::from(s)) << 32) | u128::from(u32::from(d)))
                }
                _ => None,
            },
            Granularity::Teid => m.teid().map(|t| (2u128 << 64) | u128::from(t)),
            Granularity::Custom(fields) => {
                if fields.contains(FieldSet::TEID) && !m.has_teid {
                    return None;
                }
                let k = CustomKey::build(fields, t, m.vlan, m.teid);
                Some(fingerprint(k.as_bytes()))
            }
        }
    }

    /// Parses `src_ip`, `dst_ip`, `ip_pair`, `teid`, or a field list joined
    /// by `+` (chain specs use `,` between parameters) or `,`: `dst_ip+dport`.
    pub fn parse(s: &str) -> Result<Granularity, String> {
        match s {
            "src_ip" => Ok(Granularity::SrcIp),
            "dst_ip" => Ok(Granularity::DstIp),
            "ip_pair" => Ok(Granularity::IpPair),
            "teid" => Ok(Granularity::Teid),
            "5tuple" | "five_tuple" => Ok(Granularity::FiveTuple),
            _ => FieldSet::parse(&s.replace('+', ",")).map(Granularity::Custom).map_err(|e| e.to_string()),
        }
    }

    /// The part of `t` this granularity keys on, as a 5-tuple with the other
    /// fields zeroed (what an export row shows; the shared tables use
    /// [`Granularity::key`]). TEID and field-set keys have no such
    /// projection: the 5-tuple itself is returned.
    pub fn project(self, t: &FiveTuple) -> FiveTuple {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let zero = |a: IpAddr| match a {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let (s, d) = (t.src_ip(), t.dst_ip());
        let (s, d) = match self {
            Granularity::FiveTuple | Granularity::Teid | Granularity::Custom(_) => return *t,
            Granularity::SrcIp => (s, zero(d)),
            Granularity::DstIp => (zero(s), d),
            Granularity::IpPair => (s, d),
        };
        FiveTuple::new(s, d, 0, 0, 0).unwrap_or(*t)
    }

    /// Name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Granularity::FiveTuple => "5-tuple",
            Granularity::SrcIp => "src-ip",
            Granularity::DstIp => "dst-ip",
            Granularity::IpPair => "ip-pair",
            Granularity::Teid => "teid",
            Granularity::Custom(_) => "custom",
        }
    }
}

/// The verdict of a per-packet action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave the packet's verdict as it is (pass to the next NF).
    Pass,
    /// Send to this output port.
    Port(u16),
    /// Drop the packet.
    Drop,
    /// Pass, and end the flow: the state is released and removed after this packet (e.g. TCP FIN/RST).
    EndFlow,
    /// Drop, and end the flow.
    DropEndFlow,
    /// Drop a packet the NF refuses on its flow's first packet (a resource exhausted, filtered): the flow
    /// keeps no state, so its entry — created for this packet by the add-on-miss lookup — is removed as if
    /// never inserted (not counted as an insertion, nor as ended; release callbacks still run). The NF must
    /// hold nothing for such a flow, so executors may remove it after the batch's other packets instead of
    /// stopping there: a refusal costs what a drop costs. Only on the packet that created the state.
    Refuse,
}

/// Which packets must meet on one core, in order, for an NF to be correct
/// on several cores (the runtime steers accordingly or refuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Affinity {
    /// None: the state's updates commute (counters) or live in shared tables under locks.
    Any,
    /// The packets of one 5-tuple.
    Flow,
    /// Both directions of a connection (symmetric hash); ICMP errors with the flow they quote.
    Connection,
    /// Every packet of one source address (order-dependent per-source state).
    Source,
    /// Every packet of one destination address.
    Destination,
}

/// State kept outside the per-flow blocks and the coarse shared tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalState {
    /// None, or per-core figures that add up (statistics, round-robin cursors).
    None,
    /// A pool of external ports that per-flow state refers to (NAT): each core
    /// gets a disjoint share of `lo..=hi` (the NF's `param` parameter) and the
    /// NIC steers packets to `dst` (prefix) with a destination port in a
    /// core's share to that core.
    PortPool {
        /// Parameter holding the range (`LO-HI`).
        param: &'static str,
        /// First port.
        lo: u16,
        /// Last port.
        hi: u16,
        /// External addresses (first address, prefix length covering them).
        dst: (std::net::Ipv4Addr, u8),
    },
    /// Private per-core structures per-flow state points into (a connection
    /// slab): flows cannot move between cores nor share a table.
    Private,
    /// Per-core counts that judge a key by how many packets it sent (ddos's
    /// sketch of the sources its table cannot hold): under a strategy that
    /// sprays, each core sees about 1/cores of a key's packets, so the runtime
    /// sets the NF's parameter `param` to the number of cores and the NF
    /// scales its per-core count by it. Nothing under a steering strategy.
    SprayShare {
        /// Parameter that takes the number of cores a key's packets are sprayed over.
        param: &'static str,
    },
}

/// What an NF's state needs from a multi-core strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Packets that must meet on one core.
    pub affinity: Affinity,
    /// State outside per-flow blocks and shared tables.
    pub global: GlobalState,
}

impl Placement {
    /// The default for a granularity: 5-tuple state needs its flow on one
    /// core; coarse state is in shared tables (correct from any core when
    /// its updates commute).
    pub fn default_for(g: Granularity, both_directions: bool) -> Placement {
        let affinity = match g {
            _ if both_directions => Affinity::Connection,
            Granularity::FiveTuple => Affinity::Flow,
            _ => Affinity::Any,
        };
        Placement { affinity, global: GlobalState::None }
    }

    /// Per-flow state can move between cores with its block.
    pub fn migratable(&self) -> bool {
        matches!(self.global, GlobalState::None | GlobalState::SprayShare { .. })
    }
}

/// What one step of a resumable action asks for (see [`StatefulNf::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The next step reads the cache line holding this address: the executor
    /// prefetches it, runs other packets' steps meanwhile, and calls `step`
    /// again for this packet later. (A hint: never dereferenced by the executor.)
    Prefetch(*const u8),
    /// Nothing more to fetch: [`StatefulNf::finish`] can run.
    Ready,
}

impl Step {
    /// `Step::Prefetch` of the line holding `*r`.
    #[inline(always)]
    pub fn at<T>(r: &T) -> Step {
        Step::Prefetch(r as *const T as *const u8)
    }
}

/// Where a resumable action stands for one packet: plain data the executor
/// keeps in a reused task slot (zeroed when the packet's task starts), which
/// only the NF interprets. `step == 0` means the action has not started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Steps taken so far (0: not started).
    pub step: u32,
    /// NF-defined small value (a node, a rule, a position).
    pub pos: u32,
    /// What the results so far were computed from (a state value, a packet
    /// field): `finish` compares it with the present value and starts over
    /// on a mismatch, so a stale cursor costs time, never correctness.
    pub input: u64,
    /// NF-defined values (partial results).
    pub val: [u64; 2],
}

/// A stateful network function.
pub trait StatefulNf: Send + 'static {
    /// Per-flow state: plain data (derive `Pod`, `Zeroable`, `#[repr(C)]`,
    /// no padding), stored inline in the flow table's state block.
    type State: Pod + Zeroable + Send;

    /// Name in chain specs.
    fn name(&self) -> &'static str;

    /// What the state is keyed by (default: the 5-tuple).
    fn granularity(&self) -> Granularity {
        Granularity::FiveTuple
    }

    /// What the state needs on several cores (default: from the granularity
    /// and [`StatefulNf::BOTH_DIRECTIONS`]). The runtime checks it against
    /// the multi-core strategy: steers accordingly or refuses the chain.
    fn placement(&self) -> Placement {
        Placement::default_for(self.granularity(), Self::BOTH_DIRECTIONS)
    }

    /// Idle time after which this NF's state expires (None: the timeout of
    /// the container it lives in — the longest any 5-tuple NF of the chain
    /// declares, or for a coarse NF the longest of its group, else the run's
    /// `--idle-timeout`).
    ///
    /// The rule, enforced by the engine on the packet clock wherever the
    /// state lives: a packet that reaches this NF more than the timeout
    /// after the last packet of the same key that reached it ([`is_idle`])
    /// finds fresh state — the old state is released (`release`), then
    /// `init` runs — exactly as if the entry had expired and been inserted
    /// anew. NF-private tables apply the same rule with [`IdleStamp`].
    fn idle_timeout_ns(&self) -> Option<u64> {
        None
    }

    /// Default action on a table miss (add-on-miss): the new flow's initial state.
    /// Runs once per flow, before [`StatefulNf::process`] sees its first packet.
    ///
    /// Contract: with aggregated state (the batched executor) the default
    /// actions of all 5-tuple NFs run when the flow's block is created, i.e.
    /// when its first packet enters the chain — even if an upstream NF then
    /// drops that packet. So `init` must not take resources (ports, slots):
    /// do that in `process` on the first packet that reaches the NF (see `nat`).
    fn init(&mut self, pkt: &Pkt<'_>, ctx: &NfContext) -> Self::State;

    /// Per-packet action, with the flow's state updated in place.
    fn process(&mut self, pkt: &mut Pkt<'_>, state: &mut Self::State, ctx: &NfContext) -> Action;

    /// Takes new values of its run-time parameters between two batches,
    /// keeping every flow's state (see [`crate::Nf::reconfigure`]). Default:
    /// fixed for the run.
    fn reconfigure(&mut self, _p: &mut crate::Params) -> Result<(), crate::ParamError> {
        Err(crate::fixed_for_run(self.name()))
    }

    /// Time passed on the packet clock without a packet (see [`crate::Nf::tick`]):
    /// the NF's private timers (its own tables' sweeps, its clock for reports)
    /// advance to `now_ns`. Default: nothing.
    fn tick(&mut self, _now_ns: u64) {}

    /// Set to `true` when the NF implements [`StatefulNf::release`] (its
    /// state holds resources): the executor then refuses table policies that
    /// drop state without calling it (eviction).
    const HAS_RELEASE: bool = false;

    /// Why this NF's per-flow state must not be evicted when the table is full (`--table-full evict` is then
    /// refused in one line naming the NF and the reason), or `None`: the NF copes with losing a flow's state.
    const NO_EVICT: Option<&'static str> = None;

    /// Set to `true` when the NF must see both directions of a connection on
    /// the same core (connection tracking): multi-core runs then use the
    /// symmetric RSS key.
    const BOTH_DIRECTIONS: bool = false;

    /// Set to `true` when the NF may return [`Action::EndFlow`] or
    /// [`Action::DropEndFlow`]. Executors then make every end take effect at
    /// the packet that caused it, whatever the batching: later packets of the
    /// flow see fresh state, and resources released by the end are free for
    /// later packets (they cut a batch where that could matter). An NF that
    /// ends flows without declaring it gets its ends applied at the end of a
    /// batch instead.
    const ENDS_FLOWS: bool = false;

    /// Set to `true` when the NF implements [`StatefulNf::prefetch`]; the
    /// executor then runs the hook ahead of the action (and skips it otherwise).
    const HAS_PREFETCH: bool = false;

    /// Prefetch hook for indirect state: called a few packets ahead of
    /// `process` for the same packet, so the NF can `flowplane_packet::prefetch::read`
    /// whatever `state` points to (a backend, a rule, a bucket).
    fn prefetch(&self, _state: &Self::State) {}

    /// Set to `true` when the NF implements [`StatefulNf::step`] and
    /// [`StatefulNf::finish`] (a resumable action); otherwise the interleaved
    /// executor runs the action as one step (`process`).
    const STEPS: bool = false;

    /// Set to `true` when the resumable action names at most one line, the
    /// one [`StatefulNf::prefetch`] fetches (nat's reverse-map entry): the
    /// interleaved executor then runs the NF in its finishing pass with the
    /// hook a few packets ahead, the same overlap without a step pass (which
    /// measured 59 instructions per packet for nat with nothing to fetch on
    /// outbound flows). `step` still describes the action (and is tested).
    const ONE_STEP: bool = false;

    /// One step of the resumable action on this packet (GuNFu's granular
    /// decomposition): read what the previous step prefetched, record the
    /// progress in `cur`, and name the next line to read
    /// ([`Step::Prefetch`]) or say the action can finish ([`Step::Ready`]).
    ///
    /// Contract: a step only reads (`&self`, `&State`, `&Pkt`) and may run
    /// before earlier packets of *other* flows have finished (the executor
    /// keeps a flow's packets in order and finishes every packet in arrival
    /// order). So a step may keep in `cur` only results derived from the
    /// packet, the flow's state, and data `finish`/`process` never change
    /// (a route table, a rule set, a fixed array); anything read from
    /// mutable NF-wide structures is a prefetch hint that `finish` reads
    /// again. `cur.input` names what the results depend on.
    fn step(&self, _pkt: &Pkt<'_>, _state: &Self::State, _cur: &mut Cursor) -> Step {
        Step::Ready
    }

    /// The per-packet action resumed from `cur` after any number of steps
    /// (zero included, or a cursor whose `input` no longer matches): it must
    /// return exactly what [`StatefulNf::process`] would, and leave the same
    /// state. Default: `process`.
    fn finish(&mut self, pkt: &mut Pkt<'_>, state: &mut Self::State, _cur: &Cursor, ctx: &NfContext) -> Action {
        self.process(pkt, state, ctx)
    }

    /// Called when a flow's state is removed (expiry, end of flow): release
    /// what it holds (e.g. pins on shared state).
    fn release(&mut self, _key: &FiveTuple, _state: &Self::State) {}

    /// Called instead of [`StatefulNf::release`] when the flow table evicts
    /// the flow's entry to make room for a new flow (`--table-full evict`),
    /// before the entry is reused. Default: `release`. nat ends the
    /// translated connection the entry belongs to (frees its port).
    fn evict(&mut self, key: &FiveTuple, state: &Self::State) {
        self.release(key, state)
    }

    /// What to do with packets that have no flow key (non-IP, malformed).
    /// Default: pass them on untouched.
    fn on_unparsed(&mut self) -> Action {
        Action::Pass
    }

    /// Whether a packet that has a flow key but no state — its table (the
    /// per-core flow table, a shared table, the replica table under scr) was
    /// full — passes this NF. The library's rule: an NF that admits traffic
    /// only on what its state proves (fw, conntrack, portknock, acl, nat:
    /// access control) fails closed, `false`; one that drops only on evidence
    /// its state accumulates (ddos, psd, policer, ratelimit) or only counts
    /// fails open, `true` (the default). Pure: scr's fast-forward asks it for
    /// other cores' packets, so every replica judges them alike.
    fn passes_without_state(&self) -> bool {
        true
    }

    /// A packet that has a flow key but no state because its table was full
    /// (counted there as `table_full`): the NF counts it apart — `table_full`
    /// in its report, never `unparsed` — and returns `Pass` or `Drop` as
    /// [`StatefulNf::passes_without_state`] says (the default does exactly that, counting nothing).
    fn on_no_state(&mut self) -> Action {
        if self.passes_without_state() {
            Action::Pass
        } else {
            Action::Drop
        }
    }

    /// [`StatefulNf::on_no_state`] with the packet and its time, where the engine has them (coarse state on
    /// the executors' path; SCR replicas call `on_no_state`): an NF that must not fail open for keys its table
    /// cannot hold judges them here (`ddos`'s sketch). The default is `on_no_state`.
    fn on_no_state_pkt(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> Action {
        self.on_no_state()
    }

    /// State-compute replication (`--scale scr`, SCR Appendix C): the
    /// header fields this NF's state transition reads. `None` (the default):
    /// the NF does not opt in and `--scale scr` refuses it. An NF opting in
    /// implements [`StatefulNf::scr_transition`] (and [`StatefulNf::scr_init`]
    /// if its `init` reads the packet) and keeps no NF-wide state that its
    /// transition or verdicts depend on other than what a function of the
    /// packet sequence gives (no random choices, no per-core pools).
    fn scr_fields(&self) -> Option<ScrFields> {
        None
    }

    /// SCR: the initial state of a key first met in a history record (the
    /// default action without a packet: every core runs it for every key,
    /// also for packets it only fast-forwards). Default: `State::zeroed()`.
    fn scr_init(&mut self, _rec: &ScrRecord, _ctx: &NfContext) -> Self::State {
        Self::State::zeroed()
    }

    /// SCR: the deterministic state transition of one packet from its
    /// history record (`ctx.now_ns` is the sequencer's timestamp): exactly
    /// the state change [`StatefulNf::process`] makes for that packet, with
    /// no verdict, no output and no report counters. Returns whether the
    /// packet would pass on (false: `process` would drop it, so the NFs
    /// after this one in the chain never saw it).
    fn scr_transition(&mut self, _state: &mut Self::State, _rec: &ScrRecord, _ctx: &NfContext) -> bool {
        true
    }

    /// Set to `true` when the NF overrides [`StatefulNf::scr_run`] with a
    /// closed form; the engine then gathers a heavy key's records into runs
    /// for it (otherwise it applies them one by one in the same pass).
    const SCR_RUN: bool = false;

    /// Set to `true` when [`StatefulNf::scr_transition`] reads nothing but
    /// the state, the record's kind byte and its [`StatefulNf::scr_fields`]
    /// (the time only when they name it) and changes nothing but the state:
    /// two records equal in those take a state to the same next state. The
    /// engine then passes over, with one masked compare each, a heavy key's
    /// records that equal one the state in hand was found to be a fixed
    /// point of (portknock: a source at stage 0 sending to a port that is
    /// not the first knock, an open source whatever it sends).
    const SCR_PURE: bool = false;

    /// SCR: applies a run of history records to `state` in order — every
    /// record valid and of this state's key, none idle past the timeout (the
    /// engine guarantees both), each at its own time — exactly as
    /// [`StatefulNf::scr_transition`] on each in turn would; their pass/drop
    /// results are not needed (the chain's only stateful NF). A heavy flow
    /// brings N - 1 such records per packet: an NF whose transition has a
    /// closed form over a run (ddos: a run inside one window adds its length
    /// to the count) overrides this. Default: the transitions one by one.
    #[inline]
    fn scr_run(&mut self, state: &mut Self::State, run: &ScrRun<'_>) {
        for r in run.recs {
            self.scr_transition(state, r, &NfContext { now_tsc: 0, now_ns: r.ts_ns() });
        }
    }

    /// SCR: a digest of state the NF keeps itself (outside the engine's
    /// tables, e.g. a connection table that is a function of the packet
    /// sequence), so replicas can be compared. Default 0.
    fn scr_digest(&self) -> u64 {
        0
    }

    /// The run is over: `end_ns` is its last packet time across every core
    /// (the trace's last packet in a replay). Called once per core, after
    /// every core stopped and before `report` and the export rows, so that
    /// state an NF keeps itself (port pools, connection tables) is judged at
    /// the run's end rather than at this core's own last packet: on several
    /// cores a core's last packet may be long before the run's. Default:
    /// nothing.
    fn end_of_run(&mut self, _end_ns: u64) {}

    /// Set to `true` when the NF feeds the IPFIX exporter (`--ipfix`): the
    /// engine then hands it a per-core record queue
    /// ([`StatefulNf::attach_ipfix`]) and tells it of flow ends and active
    /// timeouts ([`StatefulNf::ipfix_flow`]).
    const IPFIX: bool = false;

    /// Takes this core's record queue for the NF (once, before the run, only
    /// with `--ipfix`). Records go through [`crate::ipfix::RecordTx::push`]:
    /// no allocation, a full queue counts them lost.
    fn attach_ipfix(&mut self, _tx: crate::ipfix::RecordTx) {}

    /// The run's random hash secret (the flow tables' too), once, before the first packet: an NF with a
    /// private hash table of keys others choose (fw's connections) keys its hash with it, so nobody can
    /// compute colliding keys offline (issue 33). Default: nothing.
    fn set_hash_secret(&mut self, _secret: u32) {}

    /// A flow's state ends — `reason`: idle timeout (expiry), end of flow (an
    /// NF ended it), forced end (the run's end) — or is reported at the
    /// active timeout ([`crate::ipfix::EndReason::ActiveTimeout`], the state
    /// stays): push its record. Called by the engine off the per-packet path
    /// (sweeps, removals), only for NFs declaring [`StatefulNf::IPFIX`].
    fn ipfix_flow(&mut self, _key: &FiveTuple, _state: &Self::State, _reason: crate::ipfix::EndReason) {}

    /// Whether the NF's per-flow state is replicated to a standby
    /// (`run --replicate`, see [`crate::repl`]): `Ok(())` if it pushes
    /// records and can adopt them, else why not (the run refuses with it).
    /// Default: refused, as state is replicated only by NFs that say how.
    const REPL: Result<(), &'static str> = Err("its state is not replicated");

    /// Takes this core's replication queue (once, before the run, only with
    /// `--replicate`): the NF pushes an upsert when a flow's replicated state
    /// is created or changes, a delete when it is released.
    fn attach_repl(&mut self, _tx: crate::repl::ReplTx) {}

    /// A replicated entry arrives (a standby, between two batches, at packet
    /// time `now_ns` of its own clock): take what the state names in the NF's
    /// own structures (nat: the port; its generation is rewritten to this
    /// instance's) and return true to import it into the flow table; false:
    /// refused (not imported, counted).
    fn repl_adopt(&mut self, _key: &FiveTuple, _state: &mut Self::State, _now_ns: u64) -> bool {
        true
    }

    /// A replicated delete of a flow whose imported state is `state` (the
    /// entry is removed from the flow table after this).
    fn repl_forget(&mut self, _key: &FiveTuple, _state: &Self::State) {}

    /// A bulk resync's walk over the flow table: push `key`'s upsert if its
    /// state is replicated and live (called off the per-packet path, between
    /// batches).
    fn repl_entry(&mut self, _key: &FiveTuple, _state: &Self::State) {}

    /// NF-specific results for the report (JSON), if any.
    fn report(&self) -> Option<serde_json::Value> {
        None
    }

    /// Merges another core's `report()` into `into`. Default: numbers add,
    /// objects merge key by key, arrays concatenate, equal values are kept
    /// ([`crate::report::merge_default`]); override it for configuration
    /// echoes ([`crate::report::merge_keeping`]) and ranked lists.
    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        crate::report::merge_default(into, other)
    }

    /// What `--export` writes for this NF (default [`Export::None`]: the run
    /// refuses the export). NFs implementing `export_row` return
    /// [`Export::State`].
    fn export_kind(&self) -> Export {
        Export::None
    }

    /// One row of this NF's state for `--export` (JSON object), if the NF exports state.
    fn export_row(&self, _key: &FiveTuple, _state: &Self::State) -> Option<serde_json::Value> {
        None
    }

    /// An export row for a coarse key without a 5-tuple projection (TEID,
    /// field set): `key` is [`Granularity::key`]'s value (a TEID is its low
    /// 32 bits; a field set's is a fingerprint, so keep the fields in the
    /// state if the row should show them).
    fn export_raw_row(&self, _key: u128, _state: &Self::State) -> Option<serde_json::Value> {
        None
    }

    /// Export rows derived from the report merged over every core (for
    /// [`Export::Report`]).
    fn export_report_rows(&self, _merged: &serde_json::Value) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_rule_strictly_past_the_timeout_never_backwards() {
        assert!(!is_idle(10, 15, 5), "exactly the timeout is not idle");
        assert!(is_idle(10, 16, 5));
        assert!(!is_idle(100, 3, 5), "a stamp in the future is not idle");
        // A touch keeps the later time, unless the clock went back past a timeout.
        assert_eq!(touched(100, 97, 5), 100);
        assert_eq!(touched(100, 90, 5), 90);
        assert_eq!(touched(100, 120, 5), 120);
        assert_eq!(touched(u64::MAX, 0, u64::MAX), u64::MAX);
        let mut s = IdleStamp(10);
        assert!(!s.touch(15, 5) && s.0 == 15);
        assert!(s.touch(21, 5) && s.0 == 21);
        assert!(!s.touch(0, 5) && s.0 == 0, "rebased after a jump back");
    }
}

//! `lb`: stateful load balancer (FAJITA A.1). The first packet of a flow
//! picks a backend of its family's pool from the flow's 5-tuple (a keyed
//! hash of the tuple as received, modulo the pool size); every later packet
//! of the flow is sent to the same backend (sticky per 5-tuple). The
//! destination address is rewritten with incremental checksum updates.
//!
//! The choice is a function of the flow alone, not of which core saw it
//! first or how many flows came before (round robin was, issue 29): the
//! same backend under every executor, core count and strategy — `shared`,
//! which sprays a flow's first packets over cores, included.
//!
//! IPv4 flows use the pool `base`, `base+1`, ... (`backends` addresses); IPv6
//! flows use their own pool `base6`, `base6+1`, ... (`backends6` addresses,
//! default `backends`). Without `base6` (the default) IPv6 flows are not
//! balanced: they pass untouched and are counted (`ipv6_unbalanced_flows`
//! and `_packets` in the report).
//!
//! At run time (`flowplane ctl set lb backends N`, `reload`) the pool sizes
//! may change, the first addresses (`base`, `base6`) may not: backend i is
//! `base+i` before and after, so a flow keeps its backend while that backend
//! stays in the pool, and only flows of removed backends (i >= the new size)
//! move, at their next packet, to the backend their hash picks in the new
//! pool (counted as `moved_flows`). New flows spread over the new pool.
//!
//! The report gives the flows assigned to each backend (merged over cores),
//! `--export lb=FILE` one row per live flow: its 5-tuple as received and the
//! backend it was sent to (with its packets and bytes). With `--ipfix` each
//! flow's records (at an active timeout and at its end) carry its 5-tuple as
//! received, its counts and times, and the backend as
//! postNATDestinationIPv4Address (IANA IE 226; IPv6: IE 282,
//! postNATDestinationIPv6Address) — templates 260/261, the flow fields plus
//! that one. An unbalanced IPv6 flow's records are plain flow records.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::hash::HashableKey;
use serde_json::{json, Value};

use crate::ipfix::{EndReason, ExportRecord, FlowExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::Granularity;
use crate::stateful::{Action, Affinity, GlobalState, Placement, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const BACKENDS: ParamSpec = ParamSpec::uint("backends", 16, 1, 65_536, "IPv4 backend pool size").live();
const BASE: ParamSpec = ParamSpec::text("base", "10.10.0.1", "IPv4", "first backend (the pool is base, base+1, ...)");
const BASE6: ParamSpec = ParamSpec::text(
    "base6",
    "",
    "IPv6",
    "first IPv6 backend (pool base6, base6+1, ...); empty: IPv6 flows pass unbalanced (counted)",
);
const BACKENDS6: ParamSpec =
    ParamSpec::uint_like("backends6", &BACKENDS, 1, 65_536, "IPv6 backend pool size (default: backends)").live();

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "lb",
    about: "stateful load balancer: rewrites the destination to a backend picked from the 5-tuple's hash (IPv4 pool, optional IPv6 pool), sticky per 5-tuple",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[BACKENDS, BASE, BASE6, BACKENDS6],
};

/// Builds `lb` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Lb::from_params(p)?))
}

/// `LbState::backend` of an IPv6 flow that has no pool: passed untouched.
pub const UNBALANCED: u32 = u32::MAX;
/// A flow not yet balanced: its first packet has not reached lb (a drop upstream in the chain
/// must not move the round-robin cursor, or backends would depend on the executor).
pub const PENDING: u32 = u32::MAX - 1;

/// Per-flow state: the chosen backend, and the flow's counts and times
/// for its IPFIX records (32 bytes: the flow entry's first cache line).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct LbState {
    /// Index into the flow's family's pool ([`UNBALANCED`]: none).
    pub backend: u32,
    /// Packets (saturating at 2^32 - 1: a u32 keeps the state in one line).
    pub packets: u32,
    /// Bytes (frame lengths as received).
    pub bytes: u64,
    /// First packet (packet clock, ns).
    pub first_ns: u64,
    /// Last packet.
    pub last_ns: u64,
}

/// Seed of the backend hash (apart from the flow tables' and the NIC's, so backends do not follow buckets or cores).
const PICK_SEED: u32 = 0x6c62_5f31;

/// A flow's backend among `n`: its tuple's keyed hash, scaled to `0..n` (multiply-shift: no division).
pub fn backend_for(key: &FiveTuple, n: usize) -> u32 {
    let h = key.hash64(PICK_SEED);
    ((u128::from(h) * n as u128) >> 64) as u32
}

/// One address family's pool with its per-backend flow counts.
#[derive(Debug)]
struct Pool<A> {
    addrs: Vec<A>,
    assigned: Vec<u64>,
}

impl<A> Pool<A> {
    fn new(addrs: Vec<A>) -> Self {
        let assigned = vec![0; addrs.len()];
        Pool { addrs, assigned }
    }

    /// The pool `base`, ..., `base+n-1` of the same base: counts of kept backends kept.
    fn resize(&mut self, addrs: Vec<A>) {
        self.assigned.resize(addrs.len(), 0);
        self.addrs = addrs;
    }

    fn pick(&mut self, key: &FiveTuple) -> u32 {
        if self.addrs.is_empty() {
            return UNBALANCED;
        }
        let b = backend_for(key, self.addrs.len());
        self.assigned[b as usize] += 1;
        b
    }
}

/// The load balancer.
#[derive(Debug)]
pub struct Lb {
    v4: Pool<Ipv4Addr>,
    v6: Pool<Ipv6Addr>,
    unbalanced_flows: u64,
    unbalanced_packets: u64,
    /// Flows moved off a backend removed at run time.
    moved_flows: u64,
    table_full: u64,
    /// The IPFIX record queue (`--ipfix`).
    ipfix: Option<RecordTx>,
}

impl Lb {
    /// `lb(backends=N, base=A.B.C.D, base6=X:Y::Z, backends6=M)`: backends `base`, `base+1`, ...
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let n = p.uint(&BACKENDS)? as usize;
        let base_s = p.text(&BASE)?;
        let base: Ipv4Addr =
            base_s.parse().map_err(|_| ParamError(format!("lb: parameter 'base={base_s}' is not an IPv4 address")))?;
        let b = u32::from(base);
        if (b as u64) + n as u64 > u32::MAX as u64 {
            return Err(ParamError(format!("lb: {n} backends from {base} overflow the address space")));
        }
        let base6_s = p.text(&BASE6)?;
        let n6 = p.uint(&BACKENDS6)? as usize;
        let v6 = if base6_s.is_empty() {
            Vec::new()
        } else {
            let base6: Ipv6Addr = base6_s
                .parse()
                .map_err(|_| ParamError(format!("lb: parameter 'base6={base6_s}' is not an IPv6 address")))?;
            let b6 = u128::from(base6);
            if b6.checked_add(n6 as u128 - 1).is_none() {
                return Err(ParamError(format!("lb: {n6} backends from {base6} overflow the address space")));
            }
            (0..n6 as u128).map(|i| Ipv6Addr::from(b6 + i)).collect()
        };
        let mut lb = Lb::new((0..n as u32).map(|i| Ipv4Addr::from(b + i)).collect());
        lb.v6 = Pool::new(v6);
        Ok(lb)
    }

    /// A balancer over IPv4 `backends` (at least one), without an IPv6 pool.
    pub fn new(backends: Vec<Ipv4Addr>) -> Self {
        let backends = if backends.is_empty() { vec![Ipv4Addr::new(10, 10, 0, 1)] } else { backends };
        Lb {
            v4: Pool::new(backends),
            v6: Pool::new(Vec::new()),
            unbalanced_flows: 0,
            unbalanced_packets: 0,
            moved_flows: 0,
            table_full: 0,
            ipfix: None,
        }
    }

    /// Adds an IPv6 pool.
    pub fn with_v6(mut self, backends: Vec<Ipv6Addr>) -> Self {
        self.v6 = Pool::new(backends);
        self
    }

    /// The backend a flow's state names, in its family.
    pub fn backend_of(&self, key: &FiveTuple, st: &LbState) -> Option<IpAddr> {
        let b = st.backend as usize;
        match key {
            FiveTuple::V4(_) => self.v4.addrs.get(b).map(|&a| IpAddr::V4(a)),
            FiveTuple::V6(_) => self.v6.addrs.get(b).map(|&a| IpAddr::V6(a)),
        }
    }

    #[inline(never)]
    fn assign(&mut self, pkt: &Pkt<'_>, st: &mut LbState) {
        let key = pkt.meta().tuple;
        st.backend = if pkt.meta().v6 {
            let b = self.v6.pick(&key);
            self.unbalanced_flows += u64::from(b == UNBALANCED);
            b
        } else {
            self.v4.pick(&key)
        };
    }

    /// A flow whose backend was removed at run time: its hash's backend in the pool now.
    #[cold]
    fn moved(&mut self, pkt: &Pkt<'_>, st: &mut LbState) -> Option<IpAddr> {
        let key = pkt.meta().tuple;
        let (b, addr) = if pkt.meta().v6 {
            let b = self.v6.pick(&key);
            (b, self.v6.addrs.get(b as usize).map(|&a| IpAddr::V6(a)))
        } else {
            let b = self.v4.pick(&key);
            (b, self.v4.addrs.get(b as usize).map(|&a| IpAddr::V4(a)))
        };
        st.backend = b;
        self.moved_flows += 1;
        addr
    }

    #[inline(never)]
    fn process_v6(&mut self, pkt: &mut Pkt<'_>, st: &mut LbState) -> Action {
        match self.v6.addrs.get(st.backend as usize) {
            Some(&ip) => {
                pkt.set_ipv6_dst(ip);
                Action::Pass
            }
            None if st.backend == UNBALANCED => {
                self.unbalanced_packets += 1;
                Action::Pass
            }
            None => match self.moved(pkt, st) {
                Some(IpAddr::V6(ip)) => {
                    pkt.set_ipv6_dst(ip);
                    Action::Pass
                }
                _ => Action::Drop,
            },
        }
    }
}

/// Per-backend flow counts as a report object: pool size, total, min, max, each backend's count.
fn pool_report<A>(p: &Pool<A>) -> Value {
    json!({
        "backends": p.addrs.len(),
        "flows": p.assigned.iter().sum::<u64>(),
        "flows_min_per_backend": p.assigned.iter().copied().min().unwrap_or(0),
        "flows_max_per_backend": p.assigned.iter().copied().max().unwrap_or(0),
        "flows_per_backend": p.assigned,
    })
}

/// Adds another core's per-backend counts into `into` and recomputes the totals.
fn merge_pool(into: &mut Value, other: &Value) {
    let counts = |v: &Value| -> Vec<u64> {
        v["flows_per_backend"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
            .unwrap_or_default()
    };
    let mut sum = counts(into);
    for (i, c) in counts(other).into_iter().enumerate() {
        match sum.get_mut(i) {
            Some(s) => *s += c,
            None => sum.push(c),
        }
    }
    if let Value::Object(m) = into {
        m.insert("flows".into(), json!(sum.iter().sum::<u64>()));
        m.insert("flows_min_per_backend".into(), json!(sum.iter().copied().min().unwrap_or(0)));
        m.insert("flows_max_per_backend".into(), json!(sum.iter().copied().max().unwrap_or(0)));
        m.insert("flows_per_backend".into(), json!(sum));
    }
}

impl StatefulNf for Lb {
    type State = LbState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// Per-flow state whose updates commute (the backend, a function of the flow, is picked once per flow under the
    /// state's lock; counters add up): correct from any core, so `shared` may spray a flow's packets over cores (its
    /// state then lives in a shared table, updated under the entry's lock) with the same results as `rss`.
    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Any, global: GlobalState::None }
    }

    /// The backend is picked by the flow's first packet that reaches lb (see [`PENDING`]).
    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> LbState {
        LbState { backend: PENDING, ..LbState::zeroed() }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut LbState, ctx: &NfContext) -> Action {
        // First and last seen as extremes (`shared` may bring a flow's packets out of order).
        let now = ctx.now_ns;
        if st.packets == 0 || now < st.first_ns {
            st.first_ns = now;
        }
        if now > st.last_ns {
            st.last_ns = now;
        }
        st.packets = st.packets.saturating_add(1);
        st.bytes += pkt.len() as u64;
        if st.backend == PENDING {
            self.assign(pkt, st);
        }
        if pkt.meta().v6 {
            return self.process_v6(pkt, st);
        }
        match self.v4.addrs.get(st.backend as usize) {
            Some(&ip) => {
                pkt.set_ipv4_dst(ip);
                Action::Pass
            }
            None => match self.moved(pkt, st) {
                Some(IpAddr::V4(ip)) => {
                    pkt.set_ipv4_dst(ip);
                    Action::Pass
                }
                _ => Action::Drop,
            },
        }
    }

    /// New pool sizes between two batches (see the module doc): the bases are fixed for the run.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Lb::from_params(p)?;
        if new.v4.addrs.first() != self.v4.addrs.first() || new.v6.addrs.first() != self.v6.addrs.first() {
            return Err(ParamError(
                "lb: base and base6 name every backend (backend i is base+i): a restart changes them; backends and backends6 may change".into(),
            ));
        }
        self.v4.resize(new.v4.addrs);
        self.v6.resize(new.v6.addrs);
        Ok(())
    }

    /// Fails open: the packet passes unbalanced, counted as `table_full`.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<Value> {
        Some(json!({
            "ipv4": pool_report(&self.v4),
            "ipv6": pool_report(&self.v6),
            "ipv6_unbalanced_flows": self.unbalanced_flows,
            "ipv6_unbalanced_packets": self.unbalanced_packets,
            "moved_flows": self.moved_flows,
            "table_full": self.table_full,
        }))
    }

    /// Per-backend counts add up backend by backend; the pool sizes are the same on every core.
    fn merge_report(&self, into: &mut Value, other: &Value) {
        merge_keeping(into, other, &["ipv4", "ipv6"]);
        for fam in ["ipv4", "ipv6"] {
            if let (Some(mine), Some(theirs)) = (into.get_mut(fam), other.get(fam)) {
                merge_pool(mine, theirs);
            }
        }
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.ipfix = Some(tx);
    }

    /// The flow as received, its counts, and the backend it was sent to (postNATDestinationIPv4/IPv6Address;
    /// an unbalanced IPv6 flow's record has no such field).
    fn ipfix_flow(&mut self, key: &FiveTuple, st: &LbState, reason: EndReason) {
        if st.backend == PENDING || st.packets == 0 {
            return;
        }
        let to = self.backend_of(key, st);
        if let Some(tx) = &mut self.ipfix {
            let mut r = FlowExport::new(*key, u64::from(st.packets), st.bytes, st.first_ns, st.last_ns, reason);
            r.post_dst = to;
            tx.push(ExportRecord::Flow(r));
        }
    }

    /// The flow as received (destination = the service address) and its backend; flows none of whose
    /// packets reached lb (dropped upstream) have no backend and no row.
    fn export_row(&self, key: &FiveTuple, st: &LbState) -> Option<Value> {
        if st.backend == PENDING {
            return None;
        }
        Some(json!({
            "proto": key.proto(),
            "src": key.src_ip().to_string(),
            "dst": key.dst_ip().to_string(),
            "sport": key.src_port(),
            "dport": key.dst_port(),
            "backend": self.backend_of(key, st).map_or_else(|| "unbalanced".to_string(), |a| a.to_string()),
            "packets": st.packets,
            "bytes": st.bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};
    use flowplane_wire::frame::PktMeta;

    /// The backend of a frame's flow by the documented rule: the tuple's hash scaled to the pool.
    fn expected(frame: &[u8], n: usize) -> usize {
        backend_for(&PktMeta::parse(frame).tuple, n) as usize
    }

    #[test]
    fn picks_by_the_flow_and_sticks() {
        let pool = [[1, 1, 1, 1], [2, 2, 2, 2]];
        let mut h = Harness::new(Lb::new(pool.iter().map(|&a| Ipv4Addr::from(a)).collect()));
        let mut per = [0u64; 2];
        for i in 0..1000u16 {
            let f = udp4([10, 0, (i >> 8) as u8, i as u8], [9, 9, 9, 9], 1000 + i, 80);
            let (out, act) = h.run(&f);
            assert_eq!(act, Action::Pass);
            let b = expected(&f, 2);
            assert_eq!(&out[30..34], &pool[b]);
            per[b] += 1;
            if i % 100 == 0 {
                let (again, _) = h.run(&f);
                assert_eq!(&again[30..34], &pool[b], "sticky");
                crate::testutil::assert_ipv4_checksums(&again);
            }
        }
        // A hash spreads 1000 flows about evenly (a binomial's 5 sigma is 80).
        assert!(per.iter().all(|&n| (420..=580).contains(&n)), "{per:?}");
        assert_eq!(h.nf.report().unwrap()["ipv4"]["flows_per_backend"], json!(per));
    }

    #[test]
    fn params() {
        let mut p = Params::new("lb", vec![("backends".into(), "0".into())]);
        assert!(Lb::from_params(&mut p).is_err());
        let mut p = Params::new("lb", vec![("base".into(), "300.1.1.1".into())]);
        assert!(Lb::from_params(&mut p).unwrap_err().0.contains("'base=300.1.1.1'"));
        let mut p = Params::new("lb", vec![("base".into(), "255.255.255.250".into())]);
        assert!(Lb::from_params(&mut p).is_err());
    }

    #[test]
    fn ipv6_flows_use_their_own_pool_with_valid_checksums() {
        use crate::testutil::{assert_ipv6_checksums, tcp6, udp6};
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let mut p = Params::new(
            "lb",
            vec![
                ("backends".into(), "2".into()),
                ("base6".into(), "2001:db8::10".into()),
                ("backends6".into(), "3".into()),
            ],
        );
        let mut h = Harness::new(Lb::from_params(&mut p).unwrap());
        let vip = v6("2001:db8:ffff::1");
        let flows: Vec<Vec<u8>> = (0..4u16)
            .map(|i| {
                if i % 2 == 0 {
                    udp6(v6("2001:db8:1::1"), vip, 1000 + i, 80)
                } else {
                    tcp6(v6("2001:db8:1::2"), vip, 1000 + i, 80, 0x02)
                }
            })
            .collect();
        let dst = |f: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
        let mut got = Vec::new();
        for f in &flows {
            let (out, act) = h.run(f);
            assert_eq!(act, Action::Pass);
            assert_ipv6_checksums(&out);
            got.push(dst(&out));
        }
        // The 3 IPv6 backends, by each flow's hash, independent of the IPv4 pool.
        let pool6 = [v6("2001:db8::10"), v6("2001:db8::11"), v6("2001:db8::12")];
        let want: Vec<Ipv6Addr> = flows.iter().map(|f| pool6[expected(f, 3)]).collect();
        assert_eq!(got, want);
        let (again, _) = h.run(&flows[1]);
        assert_eq!(dst(&again), want[1], "sticky");
        let f4 = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1, 80);
        let (out4, _) = h.run(&f4);
        assert_eq!(out4[30..34], [10, 10, 0, 1 + expected(&f4, 2) as u8], "the IPv4 pool is its own");
        let r = h.nf.report().unwrap();
        let mut per6 = [0u64; 3];
        flows.iter().for_each(|f| per6[expected(f, 3)] += 1);
        assert_eq!(r["ipv6"]["flows_per_backend"], json!(per6));
        assert_eq!(r["ipv4"]["flows"], 1);
        assert_eq!(r["ipv6_unbalanced_flows"], 0);
        let key = h.key_of(&flows[2]).unwrap();
        let row = h.nf.export_row(&key, &h.state_of(&flows[2]).unwrap()).unwrap();
        let b = want[2].to_string();
        assert_eq!((row["dst"].as_str(), row["backend"].as_str()), (Some("2001:db8:ffff::1"), Some(b.as_str())));
    }

    #[test]
    fn ipv6_without_a_pool_passes_untouched_and_is_counted() {
        use crate::testutil::udp6;
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let mut h = Harness::new(Lb::new(vec![Ipv4Addr::new(1, 1, 1, 1)]));
        let f = udp6(v6("2001:db8::1"), v6("2001:db8::2"), 5, 6);
        for _ in 0..3 {
            assert_eq!(h.run(&f), (f.clone(), Action::Pass));
        }
        let r = h.nf.report().unwrap();
        assert_eq!((r["ipv6_unbalanced_flows"].as_u64(), r["ipv6_unbalanced_packets"].as_u64()), (Some(1), Some(3)));
        assert_eq!(r["ipv4"]["flows"], 0, "the IPv6 flow took no IPv4 backend");
        let row = h.nf.export_row(&h.key_of(&f).unwrap(), &h.state_of(&f).unwrap()).unwrap();
        assert_eq!(row["backend"], "unbalanced");
        let mut p = Params::new("lb", vec![("base6".into(), "1.2.3.4".into())]);
        assert!(Lb::from_params(&mut p).unwrap_err().0.contains("'base6=1.2.3.4'"));
        let mut p = Params::new("lb", vec![("base6".into(), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe".into())]);
        assert!(Lb::from_params(&mut p).unwrap_err().0.contains("overflow"));
    }

    #[test]
    fn reports_merge_backend_by_backend() {
        let pool = vec![Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2), Ipv4Addr::new(3, 3, 3, 3)];
        let (mut a, mut b) = (Harness::new(Lb::new(pool.clone())), Harness::new(Lb::new(pool)));
        let mut per = [0u64; 3];
        for i in 0..40u16 {
            let f = udp4([10, 0, 0, 1], [9, 9, 9, 9], i, 80);
            per[expected(&f, 3)] += 1;
            a.run(&f);
        }
        let f = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1, 80);
        per[expected(&f, 3)] += 1;
        b.run(&f);
        let mut r = a.nf.report().unwrap();
        a.nf.merge_report(&mut r, &b.nf.report().unwrap());
        assert_eq!(r["ipv4"]["flows_per_backend"], json!(per));
        assert_eq!(r["ipv4"]["backends"], 3, "the pool size is not summed");
        assert_eq!(r["ipv4"]["flows"], 41);
        assert_eq!(r["ipv4"]["flows_min_per_backend"], per.iter().min().copied().unwrap());
        assert_eq!(r["ipv4"]["flows_max_per_backend"], per.iter().max().copied().unwrap());
    }

    #[test]
    fn malformed_packets_pass_untouched() {
        let mut h = Harness::new(Lb::new(vec![Ipv4Addr::new(1, 1, 1, 1)]));
        for len in [0usize, 10, 20, 33] {
            let f = vec![0u8; len];
            let (out, act) = h.run(&f);
            assert_eq!(act, Action::Pass);
            assert_eq!(out, f);
        }
    }

    #[test]
    fn reconfigure_moves_only_the_flows_of_removed_backends() {
        let params = |pairs: &[(&str, &str)]| {
            Params::new("lb", pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        let mut h = Harness::new(Lb::from_params(&mut params(&[("backends", "8"), ("base", "10.10.0.1")])).unwrap());
        let flows: Vec<Vec<u8>> =
            (0..300u16).map(|i| udp4([10, 0, (i >> 8) as u8, i as u8], [9, 9, 9, 9], 1000 + i, 80)).collect();
        let addr =
            |out: &[u8]| u32::from_be_bytes(out[30..34].try_into().unwrap()) - u32::from(Ipv4Addr::new(10, 10, 0, 1));
        let before: Vec<u32> = flows.iter().map(|f| addr(&h.run(f).0)).collect();
        h.nf.reconfigure(&mut params(&[("backends", "4")])).unwrap();
        let mut moved = 0;
        for (f, &b) in flows.iter().zip(&before) {
            let now = addr(&h.run(f).0);
            if b < 4 {
                assert_eq!(now, b, "a flow of a kept backend stays");
            } else {
                // The documented rule: the flow's hash in the new pool.
                assert_eq!(now as usize, expected(f, 4), "a moved flow");
                moved += 1;
            }
            assert_eq!(addr(&h.run(f).0), now, "sticky after the move");
        }
        assert!(moved > 50, "{moved}");
        assert_eq!(h.nf.report().unwrap()["moved_flows"], moved);
        // Growing the pool moves nobody; new flows spread over it.
        h.nf.reconfigure(&mut params(&[("backends", "16")])).unwrap();
        let kept: Vec<u32> = flows.iter().map(|f| addr(&h.run(f).0)).collect();
        assert!(kept.iter().all(|&b| b < 4));
        let new = udp4([10, 1, 0, 1], [9, 9, 9, 9], 5, 80);
        assert_eq!(addr(&h.run(&new).0) as usize, expected(&new, 16));
        assert_eq!(h.nf.report().unwrap()["moved_flows"], moved);
        let e = h.nf.reconfigure(&mut params(&[("base", "10.20.0.1")])).unwrap_err();
        assert!(e.0.contains("restart"), "{e}");
        assert_eq!(h.nf.report().unwrap()["ipv4"]["backends"], 16, "a refused change changes nothing");
    }

    /// Issue 34: a flow's record carries its tuple as received, its counts and times, and its backend.
    #[test]
    fn ipfix_records_name_the_backend() {
        use crate::ipfix::{flows, test_queue};
        let pool = [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]];
        let mut h = Harness::new(Lb::new(pool.iter().map(|&a| Ipv4Addr::from(a)).collect()));
        let (tx, mut rx) = test_queue();
        h.nf.attach_ipfix(tx);
        let f = udp4([10, 0, 0, 7], [9, 9, 9, 9], 1234, 80);
        for t in [100, 300] {
            h.now_ns = t;
            h.run(&f);
        }
        let (k, st) = (h.key_of(&f).unwrap(), h.state_of(&f).unwrap());
        h.nf.ipfix_flow(&k, &st, EndReason::ForcedEnd);
        let r = flows(&mut rx);
        assert_eq!(r.len(), 1);
        let want = Ipv4Addr::from(pool[expected(&f, 3)]);
        assert_eq!(r[0].tuple.dst_ip(), IpAddr::from([9, 9, 9, 9]), "the tuple as received");
        assert_eq!((r[0].packets, r[0].bytes, r[0].first_ns, r[0].last_ns), (2, 2 * f.len() as u64, 100, 300));
        assert_eq!(r[0].post_dst, Some(IpAddr::V4(want)));
    }
}

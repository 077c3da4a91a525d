//! `lb`: stateful round-robin load balancer (FAJITA A.1). The first packet
//! of a flow picks the next backend of the pool; every later packet of the
//! flow is sent to the same backend (sticky per 5-tuple). The destination
//! IPv4 address is rewritten with incremental checksum updates.

use std::net::Ipv4Addr;

use bytemuck::{Pod, Zeroable};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfDescriptor, NfSink};
use crate::stateful::Granularity;
use crate::stateful::{Action, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const BACKENDS: ParamSpec = ParamSpec::uint("backends", 16, 1, 65_536, "backend pool size");
const BASE: ParamSpec = ParamSpec::text("base", "10.10.0.1", "IPv4", "first backend (the pool is base, base+1, ...)");

/// Registration (see `crates/nf/build.rs`).
pub const NF: NfDescriptor = NfDescriptor {
    name: "lb",
    about: "stateful round-robin load balancer: rewrites the destination, sticky per 5-tuple",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[BACKENDS, BASE],
};

/// Builds `lb` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Lb::from_params(p)?))
}

/// Per-flow state: the chosen backend.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct LbState {
    /// Index into the backend pool.
    pub backend: u32,
}

/// The load balancer.
#[derive(Debug)]
pub struct Lb {
    backends: Vec<Ipv4Addr>,
    next: usize,
    /// Flows assigned per backend.
    assigned: Vec<u64>,
}

impl Lb {
    /// `lb(backends=N, base=A.B.C.D)`: backends `base`, `base+1`, ...
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let n = p.uint(&BACKENDS)? as usize;
        let base_s = p.text(&BASE)?;
        let base: Ipv4Addr =
            base_s.parse().map_err(|_| ParamError(format!("lb: parameter 'base={base_s}' is not an IPv4 address")))?;
        let b = u32::from(base);
        if (b as u64) + n as u64 > u32::MAX as u64 {
            return Err(ParamError(format!("lb: {n} backends from {base} overflow the address space")));
        }
        Ok(Lb::new((0..n as u32).map(|i| Ipv4Addr::from(b + i)).collect()))
    }

    /// A balancer over `backends` (at least one).
    pub fn new(backends: Vec<Ipv4Addr>) -> Self {
        let backends = if backends.is_empty() { vec![Ipv4Addr::new(10, 10, 0, 1)] } else { backends };
        let assigned = vec![0; backends.len()];
        Lb { backends, next: 0, assigned }
    }
}

impl StatefulNf for Lb {
    type State = LbState;

    fn name(&self) -> &'static str {
        NF.name
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> LbState {
        let b = self.next;
        self.next = if b + 1 == self.backends.len() { 0 } else { b + 1 };
        self.assigned[b] += 1;
        LbState { backend: b as u32 }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut LbState, _ctx: &NfContext) -> Action {
        match self.backends.get(st.backend as usize) {
            // IPv6 flows keep their destination (the pool is IPv4): still sticky, still counted.
            Some(&ip) => {
                pkt.set_ipv4_dst(ip);
                Action::Pass
            }
            None => Action::Drop,
        }
    }

    fn report(&self) -> Option<serde_json::Value> {
        let max = self.assigned.iter().copied().max().unwrap_or(0);
        let min = self.assigned.iter().copied().min().unwrap_or(0);
        Some(json!({ "backends": self.backends.len(), "flows_min_per_backend": min, "flows_max_per_backend": max }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};

    #[test]
    fn round_robin_and_sticky() {
        let mut h = Harness::new(Lb::new(vec![Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2)]));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let b = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80);
        let (out_a, act) = h.run(&a);
        assert_eq!(act, Action::Pass);
        assert_eq!(&out_a[30..34], &[1, 1, 1, 1]);
        let (out_b, _) = h.run(&b);
        assert_eq!(&out_b[30..34], &[2, 2, 2, 2]);
        let (again, _) = h.run(&a);
        assert_eq!(&again[30..34], &[1, 1, 1, 1], "sticky");
        crate::testutil::assert_ipv4_checksums(&again);
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
    fn malformed_packets_pass_untouched() {
        let mut h = Harness::new(Lb::new(vec![Ipv4Addr::new(1, 1, 1, 1)]));
        for len in [0usize, 10, 20, 33] {
            let f = vec![0u8; len];
            let (out, act) = h.run(&f);
            assert_eq!(act, Action::Pass);
            assert_eq!(out, f);
        }
    }
}

//! `policer`: per-destination-IP token bucket (FAJITA A.1) restricting the
//! download rate of each server. The state is keyed by the destination
//! address, so every flow towards one server draws from one bucket, which
//! starts full at the server's first packet. The NF declares destination
//! affinity: rss, rsspp, dyssect and virtual cores steer a server's packets
//! to one core, so verdicts equal a one-core run's; `--scale shared` sprays
//! them over cores and lists policer in `order_not_guaranteed`.
//!
//! Units: by default `rate` is in bytes per second and `burst` in bytes, and
//! a packet costs its frame length (Ethernet header included, FCS excluded),
//! like a single-rate policer; with `pps=true` both count packets and every
//! packet costs one. A packet that finds fewer tokens than its cost is
//! dropped and takes nothing (so a frame larger than `burst` never passes).
//!
//! The bucket is [`crate::ratelimit::Bucket`] with tokens scaled by 1e9 to stay
//! integral. Clocks: a small backward step (cores sharing a bucket read
//! slightly different clocks) adds no tokens; a jump back by more than
//! [`CLOCK_RESET_NS`] (a restarted clock) re-anchors the bucket at the new time
//! so it is not starved until the clock catches up.
//!
//! Table full: a policer drops only on what a bucket holds, so it fails open —
//! a packet whose server found no room in the (shared) table passes,
//! unlimited, counted as `table_full` (packets without an address: `unparsed`).

use serde_json::json;

use crate::pkt::Pkt;
use crate::ratelimit::Bucket;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::merge_keeping;
use crate::stateful::{Action, Affinity, GlobalState, Granularity, Placement, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const RATE: ParamSpec = ParamSpec::uint(
    "rate",
    125_000_000,
    1,
    MAX_RATE,
    "bytes/s per destination (125M = 1 Gbit/s), packets/s with pps=true",
)
.live();
const BURST: ParamSpec = ParamSpec::uint_like(
    "burst",
    &RATE,
    1,
    MAX_BURST,
    "bucket depth in bytes (packets with pps=true); default one second's worth",
)
.live();
const PPS: ParamSpec = ParamSpec::bool("pps", false, "count packets instead of bytes");

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "policer",
    about: "policer: token bucket per destination IP limiting each server's download rate",
    keyed_by: KeyedBy::Fixed(Granularity::DstIp),
    params: &[RATE, BURST, PPS],
};

/// Builds `policer` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Policer::from_params(p)?))
}

/// Token scale: one byte (or packet) is `SCALE` nano-tokens.
const SCALE: u64 = 1_000_000_000;

/// A backward clock jump larger than this re-anchors the bucket.
pub const CLOCK_RESET_NS: u64 = 1_000_000_000;

/// Largest `rate` accepted (1 TB/s).
const MAX_RATE: u64 = 1_000_000_000_000;
/// Largest `burst` accepted (10 GB): keeps `burst * SCALE` within u64.
const MAX_BURST: u64 = 10_000_000_000;

/// Refills `b` at `rate` units/s up to `burst` units, then takes `cost` units
/// if they are all there. Returns whether the packet conforms.
#[inline]
pub fn take_cost(b: &mut Bucket, rate: u64, burst: u64, cost: u64, now: u64) -> bool {
    let cap = burst.saturating_mul(SCALE);
    if now < b.last_ns {
        if b.last_ns - now > CLOCK_RESET_NS {
            b.last_ns = now;
        }
    } else {
        let elapsed = now - b.last_ns;
        b.last_ns = now;
        // elapsed_ns * units/s = nano-units: exactly the token scale.
        b.tokens = b.tokens.saturating_add(elapsed.saturating_mul(rate)).min(cap);
    }
    let need = cost.saturating_mul(SCALE);
    if b.tokens >= need {
        b.tokens -= need;
        true
    } else {
        false
    }
}

/// The destination-IP policer.
#[derive(Debug)]
pub struct Policer {
    rate: u64,
    burst: u64,
    pps: bool,
    passed: u64,
    dropped: u64,
    dropped_bytes: u64,
    servers: u64,
    unparsed: u64,
    table_full: u64,
}

impl Policer {
    /// `policer(rate=R, burst=B, pps=false)`: `rate` bytes/s and `burst`
    /// bytes (default `rate`, one second's worth, at most 10 GB); with
    /// `pps=true` both are in packets.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let pps = p.flag(&PPS)?;
        let rate = p.uint(&RATE)?;
        let burst = p.uint(&BURST)?;
        Ok(Policer::new(rate, burst, pps))
    }

    /// A policer of `rate` units/s with depth `burst` units (bytes, or packets if `pps`).
    pub fn new(rate: u64, burst: u64, pps: bool) -> Self {
        Policer {
            rate: rate.clamp(1, MAX_RATE),
            burst: burst.clamp(1, MAX_BURST),
            pps,
            passed: 0,
            dropped: 0,
            dropped_bytes: 0,
            servers: 0,
            unparsed: 0,
            table_full: 0,
        }
    }
}

impl StatefulNf for Policer {
    type State = Bucket;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// A new rate or depth between two batches (buckets keep their tokens);
    /// `pps` (what a token is) is fixed for the run: the buckets hold that unit.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Policer::from_params(p)?;
        if new.pps != self.pps {
            return Err(ParamError("policer: 'pps' is fixed for the run (the buckets hold its unit)".into()));
        }
        (self.rate, self.burst) = (new.rate, new.burst);
        Ok(())
    }

    fn granularity(&self) -> Granularity {
        Granularity::DstIp
    }

    fn placement(&self) -> Placement {
        // Verdicts depend on the order of one key's packets: all of them on one core.
        Placement { affinity: Affinity::Destination, global: GlobalState::None }
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> Bucket {
        self.servers += 1;
        Bucket { tokens: self.burst.saturating_mul(SCALE), last_ns: ctx.now_ns }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, b: &mut Bucket, ctx: &NfContext) -> Action {
        let len = pkt.len() as u64;
        let cost = if self.pps { 1 } else { len };
        if take_cost(b, self.rate, self.burst, cost, ctx.now_ns) {
            self.passed += 1;
            Action::Pass
        } else {
            self.dropped += 1;
            self.dropped_bytes += len;
            Action::Drop
        }
    }

    fn on_unparsed(&mut self) -> Action {
        self.unparsed += 1;
        Action::Pass
    }

    /// Fails open: a server without a bucket is not limited (counted as `table_full`).
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({
            "rate": self.rate,
            "burst": self.burst,
            "unit": if self.pps { "packets" } else { "bytes" },
            "servers_seen": self.servers,
            "passed": self.passed,
            "dropped": self.dropped,
            "dropped_bytes": self.dropped_bytes,
            "unparsed": self.unparsed,
            "table_full": self.table_full,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["rate", "burst", "unit"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tcp4, udp4, Harness};
    use flowplane_wire::tcp::TcpFlags;

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params::new("policer", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn bytes_bucket_is_shared_by_flows_to_one_server() {
        // 60-byte frames, 1000 B/s, 200 B deep: three frames fit.
        let mut h = Harness::new(Policer::new(1000, 200, false));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let b = udp4([10, 0, 0, 2], [9, 9, 9, 9], 3000, 80);
        let c = udp4([10, 0, 0, 3], [9, 9, 9, 9], 4000, 443);
        let other = udp4([10, 0, 0, 1], [7, 7, 7, 7], 1000, 80);
        assert_eq!(a.len(), 60);
        let acts: Vec<Action> = [&a, &b, &c, &a].iter().map(|f| h.run(f).1).collect();
        assert_eq!(acts, vec![Action::Pass, Action::Pass, Action::Pass, Action::Drop]);
        assert_eq!(h.run(&other).1, Action::Pass, "another server has its own bucket");
        assert_eq!(h.states.len(), 2);
        // 40 ms later: 20 + 40 = 60 bytes available, exactly one frame.
        h.now_ns = 40_000_000;
        assert_eq!(h.run(&b).1, Action::Pass);
        assert_eq!(h.run(&c).1, Action::Drop);
        let r = h.nf.report().unwrap();
        assert_eq!((r["passed"].as_u64(), r["dropped"].as_u64()), (Some(5), Some(2)));
        assert_eq!(r["dropped_bytes"], 120);
        assert_eq!(r["servers_seen"], 2);
    }

    #[test]
    fn packet_mode_counts_packets() {
        let mut p = params(&[("rate", "10"), ("burst", "2"), ("pps", "true")]);
        let mut h = Harness::new(Policer::from_params(&mut p).unwrap());
        assert!(p.finish().is_ok());
        let big = tcp4([10, 0, 0, 1], [9, 9, 9, 9], 1, 80, TcpFlags::ACK.bits(), 0, 0);
        let acts: Vec<Action> = (0..3).map(|_| h.run(&big).1).collect();
        assert_eq!(acts, vec![Action::Pass, Action::Pass, Action::Drop]);
        h.now_ns = 100_000_000;
        assert_eq!(h.run(&big).1, Action::Pass, "one packet per 100 ms at 10 pps");
        assert_eq!(h.nf.report().unwrap()["unit"], "packets");
    }

    #[test]
    fn frame_larger_than_burst_never_passes() {
        let mut h = Harness::new(Policer::new(1_000_000, 59, false));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 10_000_000_000;
        assert_eq!(h.run(&a).1, Action::Drop);
    }

    #[test]
    fn clock_backwards() {
        let mut b = Bucket { tokens: 0, last_ns: 10_000_000_000 };
        // Small step back (another core's clock): no refill, not re-anchored.
        assert!(!take_cost(&mut b, 1000, 100, 1, 9_999_999_000));
        assert_eq!(b.last_ns, 10_000_000_000);
        // Big jump back (clock restarted): re-anchored, then refills from there.
        assert!(!take_cost(&mut b, 1000, 100, 1, 0));
        assert_eq!(b.last_ns, 0);
        assert!(take_cost(&mut b, 1000, 100, 1, 1_000_000));
        // Huge gap and rate: capped at burst, no overflow.
        let mut b = Bucket { tokens: 0, last_ns: 0 };
        assert!(take_cost(&mut b, MAX_RATE, MAX_BURST, 1, u64::MAX));
        assert_eq!(b.tokens, (MAX_BURST - 1) * SCALE);
        // Huge cost: refused, no overflow.
        assert!(!take_cost(&mut b, 1, 1, u64::MAX, u64::MAX));
    }

    #[test]
    fn parameters_are_checked() {
        let p = Policer::from_params(&mut params(&[])).unwrap();
        assert_eq!((p.rate, p.burst, p.pps), (125_000_000, 125_000_000, false));
        let e = Policer::from_params(&mut params(&[("rate", "0")])).unwrap_err();
        assert!(e.0.contains("'rate=0'"), "{e}");
        let e = Policer::from_params(&mut params(&[("pps", "maybe")])).unwrap_err();
        assert!(e.0.contains("'pps=maybe'"), "{e}");
        let e = Policer::from_params(&mut params(&[("burst", "2000T")])).unwrap_err();
        assert!(e.0.contains("burst"), "{e}");
    }

    #[test]
    fn malformed_and_truncated_pass_without_state() {
        let mut h = Harness::new(Policer::new(1, 1, true));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        for cut in [0, 5, 14, 30, 34, 37] {
            assert_eq!(h.run(&a[..cut]).1, Action::Pass, "cut at {cut}");
        }
        let mut bad = a.clone();
        bad[14] = 0x46; // IHL 6 with no room for the options
        bad.truncate(38);
        assert_eq!(h.run(&bad).1, Action::Pass);
        assert!(h.states.is_empty());
        assert_eq!(h.nf.report().unwrap()["unparsed"], 7);
    }
}

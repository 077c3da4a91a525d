//! `ratelimit`: flow rate limiter — a token bucket per 5-tuple (FAJITA's
//! third chain NF). A flow's bucket starts full (`burst` tokens) at its first
//! packet; tokens accrue at `pps` per second up to `burst` (exactly: one
//! nano-token per ns per unit of `pps`); a packet that finds at least one
//! token passes and takes one, one that finds less is dropped. Time is the
//! packet's own clock (README, "What NFs see"); a clock that jumps backwards
//! adds no tokens (and never panics). A limiter drops only on what a bucket
//! holds, so it fails open: a packet whose flow found no room (the flow table
//! full) passes, unlimited, counted as `table_full`.
//!
//! This is SCR's token-bucket policer (Table 1, `tbf`): per 5-tuple, last
//! packet time and tokens; under `--scale scr` time is the sequencer's.

use bytemuck::{Pod, Zeroable};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::merge_keeping;
use crate::stateful::Granularity;
use crate::stateful::{Action, ScrFields, ScrRecord, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const PPS: ParamSpec = ParamSpec::uint("pps", 1000, 1, 1_000_000_000, "tokens (packets) per second per flow").live();
const BURST: ParamSpec = ParamSpec::uint_like("burst", &PPS, 1, 1_000_000_000, "bucket depth in packets").live();

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "ratelimit",
    about: "flow rate limiter: token bucket per 5-tuple",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[PPS, BURST],
};

/// Builds `ratelimit` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(RateLimit::from_params(p)?))
}

/// One token, in nano-tokens (tokens are kept scaled by 1e9 to stay integral).
const TOKEN: u64 = 1_000_000_000;

/// A token bucket.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Bucket {
    /// Nano-tokens available.
    pub tokens: u64,
    /// Last refill, ns.
    pub last_ns: u64,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(burst: u64, now: u64) -> Self {
        Bucket { tokens: burst.saturating_mul(TOKEN), last_ns: now }
    }

    /// Refills at `pps` tokens/s up to `burst`, then takes one token if it can.
    #[inline]
    pub fn take(&mut self, pps: u64, burst: u64, now: u64) -> bool {
        let cap = burst.saturating_mul(TOKEN);
        let elapsed = now.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now);
        self.tokens = self.tokens.saturating_add(elapsed.saturating_mul(pps)).min(cap);
        if self.tokens >= TOKEN {
            self.tokens -= TOKEN;
            true
        } else {
            false
        }
    }
}

/// The flow rate limiter.
#[derive(Debug)]
pub struct RateLimit {
    pps: u64,
    burst: u64,
    dropped: u64,
    table_full: u64,
}

impl RateLimit {
    /// `ratelimit(pps=N, burst=B)`; burst defaults to `pps` (one second's worth).
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let pps = p.uint(&PPS)?;
        let burst = p.uint(&BURST)?;
        Ok(RateLimit { pps, burst, dropped: 0, table_full: 0 })
    }

    /// A limiter of `pps` packets/s per flow with bucket depth `burst`.
    pub fn new(pps: u64, burst: u64) -> Self {
        RateLimit { pps: pps.max(1), burst: burst.max(1), dropped: 0, table_full: 0 }
    }
}

impl StatefulNf for RateLimit {
    type State = Bucket;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// A new rate or depth between two batches: buckets keep their tokens
    /// (capped at the new depth when next refilled).
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = RateLimit::from_params(p)?;
        (self.pps, self.burst) = (new.pps, new.burst);
        Ok(())
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> Bucket {
        Bucket::full(self.burst, ctx.now_ns)
    }

    #[inline]
    fn process(&mut self, _pkt: &mut Pkt<'_>, b: &mut Bucket, ctx: &NfContext) -> Action {
        if b.take(self.pps, self.burst, ctx.now_ns) {
            Action::Pass
        } else {
            self.dropped += 1;
            Action::Drop
        }
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(ScrFields::FIVE_TUPLE.with(ScrFields::TIME))
    }

    fn scr_init(&mut self, rec: &ScrRecord, _ctx: &NfContext) -> Bucket {
        Bucket::full(self.burst, rec.ts_ns())
    }

    #[inline]
    fn scr_transition(&mut self, b: &mut Bucket, _rec: &ScrRecord, ctx: &NfContext) -> bool {
        b.take(self.pps, self.burst, ctx.now_ns)
    }

    /// Fails open: a flow without a bucket is not limited (counted as `table_full`).
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "pps": self.pps, "burst": self.burst, "dropped": self.dropped, "table_full": self.table_full }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["pps", "burst"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};

    #[test]
    fn bucket_math() {
        let mut b = Bucket::full(2, 0);
        assert!(b.take(10, 2, 0));
        assert!(b.take(10, 2, 0));
        assert!(!b.take(10, 2, 0));
        assert!(b.take(10, 2, 100_000_000), "one token after 100 ms at 10 pps");
        assert!(!b.take(10, 2, 100_000_000));
        // Clock jumps backwards: no refill, no panic, no underflow.
        assert!(!b.take(10, 2, 5));
        assert!(b.take(10, 2, 300_000_000));
        // Huge gap: capped at burst.
        let mut b = Bucket { tokens: 0, last_ns: 0 };
        assert!(b.take(u32::MAX as u64, 3, u64::MAX));
        assert_eq!(b.tokens, 2 * TOKEN);
    }

    #[test]
    fn limits_each_flow_separately() {
        let mut h = Harness::new(RateLimit::new(1, 2));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let b = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80);
        let acts: Vec<Action> = (0..3).map(|_| h.run(&a).1).collect();
        assert_eq!(acts, vec![Action::Pass, Action::Pass, Action::Drop]);
        assert_eq!(h.run(&b).1, Action::Pass);
    }
}

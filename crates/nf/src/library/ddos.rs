//! `ddos`: DDoS mitigator (SCR Table 1): counts packets per source IP (state
//! shared between cores under RSS) over a tumbling window; once a source has
//! sent more than `threshold` packets in the current window, the rest of
//! its packets in that window are dropped. The next window starts from
//! zero, so a persistent attacker gets at most `threshold` packets per
//! window through.
//!
//! Windows are anchored at the source's first packet after the previous
//! window ended. Dropped packets are counted too (they are still load). A
//! clock stepping back a little (cores sharing the state) changes nothing;
//! a jump back by more than a window (a restarted clock) re-anchors the
//! window at the new time, keeping its count, so a blocked source stays
//! blocked for at most one more window instead of until the clock catches up.
//!
//! Packets without a flow key pass (fail-open: ARP and other non-IP
//! traffic) and are counted as `unparsed` in the report.
//!
//! **Table full: never fail open** (issue 33). A source the shared table
//! cannot hold (a spoofed-source flood fills it) is counted in a bounded
//! count-min sketch instead: [`SKETCH_ROWS`] rows of [`SKETCH_WIDTH`] 32-bit
//! counters per core, indexed by the exact source address under a per-core
//! random salt (a keyed multiply-shift per row), over one tumbling window
//! per core anchored at the first such packet after the previous window
//! ended (the window parameter; a clock jumping back by more than a window
//! restarts it). The packet is counted first, and dropped when the
//! source's estimate (the smallest of its counters) exceeds the threshold.
//! A count-min estimate never undercounts, so such a source gets at most
//! `threshold` packets per window through, as a tracked one does; sources
//! sharing all their counters with heavy ones may be dropped early (the
//! price of bounded memory). The NF steers by source (`Affinity::Source`),
//! so one core sees all of a source's packets; under `--scale shared`, which
//! sprays a source's packets round robin over the cores, each core's sketch
//! sees about 1/cores of them, so the runtime sets `spray=CORES`
//! (`GlobalState::SprayShare`) and the estimate is multiplied by it before
//! the threshold judges it (without that, untracked sources got threshold x
//! cores through). Such packets count as
//! `table_full` and, when dropped, `sketch_dropped`. SCR replicas judge
//! a source without state by `on_no_state` (pass), not by the sketch.
//!
//! **Management prefix**: `admit=PREFIX` (default `none`) is always passed,
//! tracked or not, and counted as `admitted`.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::prefix::IpPrefix;
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::{
    Action, Affinity, GlobalState, Granularity, Placement, ScrFields, ScrRecord, ScrRun, StatefulNf,
};
use crate::{NfContext, ParamError, ParamSpec, Params};

const WINDOW: ParamSpec = ParamSpec::float("window", 1.0, 0.001, 86_400.0, "window in seconds").live();
const THRESHOLD: ParamSpec =
    ParamSpec::uint("threshold", 10_000, 1, 1_000_000_000_000, "packets allowed per source per window").live();
const ADMIT: ParamSpec =
    ParamSpec::text("admit", "none", "ADDR/LEN|none", "sources always passed (a management prefix)").live();
const SPRAY: ParamSpec = ParamSpec::uint(
    "spray",
    1,
    1,
    4096,
    "cores a source's packets are sprayed over (set by --scale shared): the sketch's per-core count is scaled by it",
);

/// Rows of the sketch for sources without a table entry.
pub const SKETCH_ROWS: usize = 4;
/// Counters per row (a power of two).
pub const SKETCH_WIDTH: usize = 16384;

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "ddos",
    about: "DDoS mitigator: packets per source IP per window, drop the source over the threshold; sources the \
            table cannot hold are counted in a count-min sketch (4 x 16384 per core, per window) and dropped over the \
            same threshold (never fails open); admit=PREFIX always passes",
    keyed_by: KeyedBy::Fixed(Granularity::SrcIp),
    params: &[WINDOW, THRESHOLD, ADMIT, SPRAY],
};

/// Builds `ddos` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Ddos::from_params(p)?))
}

/// Per-source counters.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DdosState {
    /// Start of the current window, ns.
    pub window_start_ns: u64,
    /// Packets in the current window (saturating).
    pub count: u64,
    /// Windows in which this source was blocked.
    pub blocked_windows: u32,
    /// 1 while the source is blocked (until its window ends).
    pub blocked: u32,
}

/// The DDoS mitigator.
#[derive(Debug)]
pub struct Ddos {
    window_ns: u64,
    threshold: u64,
    /// Always passed (None: no management prefix).
    admit: Option<IpPrefix>,
    /// Cores a source's packets are sprayed over (1: steered by source): scales the sketch's estimate.
    spray: u64,
    sources: u64,
    blocked_sources: u64,
    dropped: u64,
    unparsed: u64,
    table_full: u64,
    admitted: u64,
    sketch_dropped: u64,
    sketch: Sketch,
}

/// Count-min sketch of the sources without a table entry, over one tumbling window.
#[derive(Debug)]
struct Sketch {
    counts: Box<[u32]>,
    salt: [u64; SKETCH_ROWS],
    window_start_ns: u64,
    /// A packet was counted since the last clear.
    used: bool,
}

impl Sketch {
    fn new() -> Self {
        let mut salt = [0u64; SKETCH_ROWS];
        for (r, s) in salt.iter_mut().enumerate() {
            // Unpredictable per core (an attacker cannot aim sources at one counter); a constant where the OS
            // gives no randomness.
            *s = getrandom::u64().unwrap_or(0x9E37_79B9_7F4A_7C15 ^ r as u64) | 1;
        }
        Sketch { counts: vec![0; SKETCH_ROWS * SKETCH_WIDTH].into_boxed_slice(), salt, window_start_ns: 0, used: false }
    }

    /// Counts one packet of `src` at `now` (window `window_ns`); returns the source's estimate.
    fn add(&mut self, src: u128, now: u64, window_ns: u64) -> u64 {
        let expired = match now.checked_sub(self.window_start_ns) {
            Some(d) => d >= window_ns,
            // A clock that jumped back by more than a window restarts it.
            None => self.window_start_ns - now > window_ns,
        };
        if !self.used || expired {
            self.counts.fill(0);
            self.window_start_ns = now;
            self.used = true;
        }
        let k = (src as u64) ^ ((src >> 64) as u64).rotate_left(31);
        let mut est = u32::MAX;
        for (r, &salt) in self.salt.iter().enumerate() {
            let h = ((k ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15 ^ salt.rotate_left(17)) >> 52) as usize;
            let c = &mut self.counts[r * SKETCH_WIDTH + (h & (SKETCH_WIDTH - 1))];
            *c = c.saturating_add(1);
            est = est.min(*c);
        }
        u64::from(est)
    }
}

fn admitted(admit: &Option<IpPrefix>, pkt: &Pkt<'_>) -> bool {
    admit.as_ref().is_some_and(|p| p.contains(pkt.meta().tuple.src_ip()))
}

fn parse_admit(p: &mut Params) -> Result<Option<IpPrefix>, ParamError> {
    let s = p.text(&ADMIT)?;
    if s == "none" {
        return Ok(None);
    }
    IpPrefix::parse(&s)
        .map(Some)
        .ok_or_else(|| ParamError(format!("ddos: parameter 'admit={s}' is not an IP prefix ADDR/LEN (or none)")))
}

impl Ddos {
    /// `ddos(window=S, threshold=N)`: window in seconds (fractions allowed),
    /// packets allowed per source per window.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let window = p.float(&WINDOW)?;
        let threshold = p.uint(&THRESHOLD)?;
        let admit = parse_admit(p)?;
        let spray = p.uint(&SPRAY)?;
        Ok(Ddos { admit, spray, ..Ddos::new((window * 1e9).round() as u64, threshold) })
    }

    /// The state transition of one packet at `now`: (passes, blocked the source now).
    #[inline]
    fn step(&self, st: &mut DdosState, now: u64) -> (bool, bool) {
        if now >= st.window_start_ns {
            if now - st.window_start_ns >= self.window_ns {
                st.window_start_ns = now;
                st.count = 0;
                st.blocked = 0;
            }
        } else if st.window_start_ns - now > self.window_ns {
            st.window_start_ns = now;
        }
        st.count = st.count.saturating_add(1);
        if st.count > self.threshold {
            let newly = st.blocked == 0;
            if newly {
                st.blocked = 1;
                st.blocked_windows = st.blocked_windows.saturating_add(1);
            }
            return (false, newly);
        }
        (true, false)
    }

    /// A mitigator allowing `threshold` packets per source per `window_ns`.
    pub fn new(window_ns: u64, threshold: u64) -> Self {
        Ddos {
            window_ns: window_ns.max(1),
            threshold: threshold.max(1),
            sources: 0,
            blocked_sources: 0,
            dropped: 0,
            unparsed: 0,
            table_full: 0,
            admit: None,
            spray: 1,
            admitted: 0,
            sketch_dropped: 0,
            sketch: Sketch::new(),
        }
    }
}

impl StatefulNf for Ddos {
    type State = DdosState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// A new window or threshold between two batches: sources keep their
    /// windows and counts; the new threshold judges their next packet.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Ddos::from_params(p)?;
        (self.window_ns, self.threshold, self.admit) = (new.window_ns, new.threshold, new.admit);
        Ok(())
    }

    fn granularity(&self) -> Granularity {
        Granularity::SrcIp
    }

    fn placement(&self) -> Placement {
        // Verdicts depend on the order of one key's packets: all of them on one core.
        Placement { affinity: Affinity::Source, global: GlobalState::SprayShare { param: SPRAY.name } }
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> DdosState {
        self.sources += 1;
        DdosState { window_start_ns: ctx.now_ns, count: 0, blocked_windows: 0, blocked: 0 }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut DdosState, ctx: &NfContext) -> Action {
        if self.admit.is_some() && admitted(&self.admit, pkt) {
            self.admitted += 1;
            return Action::Pass;
        }
        let (pass, newly_blocked) = self.step(st, ctx.now_ns);
        if pass {
            return Action::Pass;
        }
        self.blocked_sources += u64::from(newly_blocked);
        self.dropped += 1;
        Action::Drop
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(ScrFields::SRC_IP.with(ScrFields::TIME))
    }

    fn scr_init(&mut self, rec: &ScrRecord, _ctx: &NfContext) -> DdosState {
        DdosState { window_start_ns: rec.ts_ns(), count: 0, blocked_windows: 0, blocked: 0 }
    }

    #[inline]
    fn scr_transition(&mut self, st: &mut DdosState, _rec: &ScrRecord, ctx: &NfContext) -> bool {
        self.step(st, ctx.now_ns).0
    }

    const SCR_RUN: bool = true;

    /// A run whose times all fall in the state's current window neither
    /// rolls the window over nor moves it back: each record adds one to the
    /// count, and the source is blocked (once per window) as soon as the
    /// count passes the threshold, which is where it ends. Otherwise record by record.
    #[inline]
    fn scr_run(&mut self, st: &mut DdosState, run: &ScrRun<'_>) {
        if run.recs.is_empty() {
            return;
        }
        if run.min_ns >= st.window_start_ns && run.max_ns - st.window_start_ns < self.window_ns {
            st.count = st.count.saturating_add(run.recs.len() as u64);
            if st.count > self.threshold && st.blocked == 0 {
                st.blocked = 1;
                st.blocked_windows = st.blocked_windows.saturating_add(1);
            }
            return;
        }
        for r in run.recs {
            self.step(st, r.ts_ns());
        }
    }

    fn on_unparsed(&mut self) -> Action {
        self.unparsed += 1;
        Action::Pass
    }

    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn on_no_state_pkt(&mut self, pkt: &Pkt<'_>, ctx: &NfContext) -> Action {
        self.table_full += 1;
        if admitted(&self.admit, pkt) {
            self.admitted += 1;
            return Action::Pass;
        }
        let src = match pkt.meta().tuple.src_ip() {
            std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
            std::net::IpAddr::V6(a) => u128::from(a),
        };
        if self.sketch.add(src, ctx.now_ns, self.window_ns).saturating_mul(self.spray) > self.threshold {
            self.sketch_dropped += 1;
            self.dropped += 1;
            return Action::Drop;
        }
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({
            "window_ns": self.window_ns,
            "threshold": self.threshold,
            "sources_seen": self.sources,
            "blocked_sources": self.blocked_sources,
            "dropped": self.dropped,
            "unparsed": self.unparsed,
            "table_full": self.table_full,
            "admitted": self.admitted,
            "sketch_dropped": self.sketch_dropped,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["window_ns", "threshold"]);
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    fn export_row(&self, key: &FiveTuple, st: &DdosState) -> Option<serde_json::Value> {
        Some(json!({
            "src": key.src_ip().to_string(),
            "window_start_ns": st.window_start_ns,
            "window_packets": st.count,
            "blocked": st.blocked != 0,
            "blocked_windows": st.blocked_windows,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tcp4, udp4, Harness};
    use flowplane_wire::tcp::TcpFlags;

    const S: u64 = 1_000_000_000;

    proptest::proptest! {
        /// `scr_run` (the closed form over a run inside one window) leaves
        /// the state `scr_transition` record by record leaves: runs inside
        /// and across windows, times going back, counts near the threshold
        /// and near saturation.
        #[test]
        fn scr_run_equals_the_transitions_one_by_one(
            window in 1u64..1_000,
            threshold in 1u64..20,
            start in 0u64..5_000,
            count in proptest::prop_oneof![0u64..30, (u64::MAX - 30)..=u64::MAX],
            blocked in 0u32..2,
            steps in proptest::collection::vec(-300i64..600, 1..24),
        ) {
            let mut nf = Ddos::new(window, threshold);
            let st0 = DdosState { window_start_ns: start, count, blocked_windows: 7, blocked };
            let mut t = start as i64;
            let recs: Vec<ScrRecord> = steps
                .iter()
                .map(|d| {
                    t = (t + d).max(0);
                    let mut r = ScrRecord::default();
                    r.set_ts_ns(t as u64);
                    r
                })
                .collect();
            let (lo, hi) = (recs.iter().map(|r| r.ts_ns()).min().unwrap(), recs.iter().map(|r| r.ts_ns()).max().unwrap());
            let mut a = st0;
            nf.scr_run(&mut a, &ScrRun { recs: &recs, min_ns: lo, max_ns: hi });
            let mut b = st0;
            for r in &recs {
                nf.scr_transition(&mut b, r, &NfContext { now_tsc: 0, now_ns: r.ts_ns() });
            }
            proptest::prop_assert_eq!(a, b);
        }
    }

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params::new("ddos", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn flows_of_one_source_share_the_count() {
        let mut h = Harness::new(Ddos::new(S, 3));
        let frames = [
            udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80),
            udp4([10, 0, 0, 1], [9, 9, 9, 8], 1001, 53),
            tcp4([10, 0, 0, 1], [9, 9, 9, 7], 1002, 443, TcpFlags::SYN.bits(), 0, 0),
        ];
        for f in &frames {
            assert_eq!(h.run(f).1, Action::Pass);
        }
        assert_eq!(h.run(&frames[1]).1, Action::Drop, "4th packet of the source");
        assert_eq!(h.run(&frames[2]).1, Action::Drop);
        let other = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80);
        assert_eq!(h.run(&other).1, Action::Pass);
        assert_eq!(h.states.len(), 2);
        let r = h.nf.report().unwrap();
        assert_eq!((r["blocked_sources"].as_u64(), r["dropped"].as_u64()), (Some(1), Some(2)));
        let st = h.state_of(&frames[0]).unwrap();
        assert_eq!((st.count, st.blocked, st.blocked_windows), (5, 1, 1));
        let row = h.nf.export_row(&h.key_of(&frames[0]).unwrap(), &st).unwrap();
        assert_eq!(row["src"], "10.0.0.1");
        assert_eq!(row["blocked"], true);
    }

    #[test]
    fn window_rollover_unblocks() {
        let mut h = Harness::new(Ddos::new(S, 2));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 10;
        let acts: Vec<Action> = (0..3).map(|_| h.run(&a).1).collect();
        assert_eq!(acts, vec![Action::Pass, Action::Pass, Action::Drop]);
        h.now_ns = 10 + S - 1;
        assert_eq!(h.run(&a).1, Action::Drop, "still inside the window");
        h.now_ns = 10 + S;
        let acts: Vec<Action> = (0..3).map(|_| h.run(&a).1).collect();
        assert_eq!(acts, vec![Action::Pass, Action::Pass, Action::Drop]);
        assert_eq!(h.state_of(&a).unwrap().blocked_windows, 2);
        assert_eq!(h.nf.report().unwrap()["blocked_sources"], 2);
    }

    #[test]
    fn clock_backwards() {
        let mut h = Harness::new(Ddos::new(S, 1));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 100 * S;
        assert_eq!(h.run(&a).1, Action::Pass);
        // A small step back: same window, still counted.
        h.now_ns = 100 * S - 5;
        assert_eq!(h.run(&a).1, Action::Drop);
        assert_eq!(h.state_of(&a).unwrap().window_start_ns, 100 * S);
        // A restarted clock: re-anchored, still blocked until that window ends.
        h.now_ns = 0;
        assert_eq!(h.run(&a).1, Action::Drop);
        assert_eq!(h.state_of(&a).unwrap().window_start_ns, 0);
        h.now_ns = S;
        assert_eq!(h.run(&a).1, Action::Pass);
    }

    #[test]
    fn count_saturates() {
        let mut nf = Ddos::new(u64::MAX, u64::MAX);
        let mut st = DdosState { window_start_ns: 0, count: u64::MAX - 1, blocked_windows: 0, blocked: 0 };
        let mut f = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let m = crate::PktMeta::parse(&f);
        let ctx = NfContext::default();
        assert_eq!(nf.process(&mut Pkt::new(&mut f, &m), &mut st, &ctx), Action::Pass);
        assert_eq!(nf.process(&mut Pkt::new(&mut f, &m), &mut st, &ctx), Action::Pass);
        assert_eq!(st.count, u64::MAX);
    }

    #[test]
    fn malformed_and_truncated_pass_and_are_counted() {
        let mut h = Harness::new(Ddos::new(S, 1));
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        for cut in [0, 12, 14, 20, 33, 36] {
            assert_eq!(h.run(&a[..cut]).1, Action::Pass, "cut at {cut}");
        }
        let mut v6ish = a.clone();
        v6ish[14] = 0x65; // version 6 in an IPv4 ethertype
        assert_eq!(h.run(&v6ish).1, Action::Pass);
        assert!(h.states.is_empty());
        assert_eq!(h.nf.report().unwrap()["unparsed"], 7);
    }

    #[test]
    fn parameters_are_checked() {
        let d = Ddos::from_params(&mut params(&[])).unwrap();
        assert_eq!((d.window_ns, d.threshold), (S, 10_000));
        let d = Ddos::from_params(&mut params(&[("window", "5"), ("threshold", "2k")])).unwrap();
        assert_eq!((d.window_ns, d.threshold), (5 * S, 2000));
        let e = Ddos::from_params(&mut params(&[("threshold", "0")])).unwrap_err();
        assert!(e.0.contains("'threshold=0'"), "{e}");
        let e = Ddos::from_params(&mut params(&[("window", "-1")])).unwrap_err();
        assert!(e.0.contains("'window=-1'"), "{e}");
    }
}

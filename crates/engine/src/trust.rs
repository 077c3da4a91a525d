//! Whether a measured figure can be trusted (issue 35, item 1): every
//! `run` report and every `bench` row carries a [`Trust`] — the time and the
//! packets the figure rests on, and the reasons (flags) it should not be
//! quoted as it stands. A flagged figure is still printed (it is what was
//! measured), but never as a plain number: tables mark it with `!` and the
//! reasons, JSON carries `trust.flags`, plots draw it hollow.
//!
//! The rules, for a newcomer:
//! - **short**: the figure's time basis — the busiest worker's own work
//!   (busy cycles, without the NIC emulation's) — is under [`MIN_BUSY_MS`].
//!   A scheduler tick, a page fault or one preemption is then a few percent
//!   or more of the figure; at a few ms the figure is noise (issue 35's
//!   `bench dyssect --seconds 0.5` printed 2281 Mpps).
//! - **few packets**: under [`MIN_PACKETS`] measured packets, the cold
//!   start (table inserts, cache misses of the first batches) dominates.
//!   The microbenchmarks (`bench table`, `bench parse`) time many short
//!   slices and report the median (or least disturbed) slice: they apply
//!   this rule to their operations, not the busy-time rule ([`Trust::of_ops`]).
//! - **no figure**: the run moved packets but has no rate (a zero figure).
//! - **noisy**: with `--reps N` (N >= 2), the spread (max - min) over the
//!   median exceeds [`MAX_SPREAD`].
//! - **ratios**: a speed-up against a flagged one-core figure is flagged;
//!   so is a speed-up below [`MIN_SPEEDUP`] on more cores (more cores
//!   slower than one: overhead or noise — repeat with `--reps`) and one above
//!   [`MAX_SUPERLINEAR`] x the cores (no run scales that far past linear).

use serde::{Deserialize, Serialize};

/// The least busy time (ms) a figure may rest on.
pub const MIN_BUSY_MS: f64 = 100.0;
/// The fewest measured packets a figure may rest on.
pub const MIN_PACKETS: u64 = 100_000;
/// The most (max - min) / median across repetitions.
pub const MAX_SPREAD: f64 = 0.10;
/// A speed-up on more than one core below this is flagged.
pub const MIN_SPEEDUP: f64 = 0.9;
/// A speed-up above this many times the cores is flagged.
pub const MAX_SUPERLINEAR: f64 = 1.25;

/// One figure over repetitions: the median is the middle value (the lower
/// of the two middle ones for an even count, so it is a measured value).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Repetitions.
    pub reps: usize,
    /// Smallest.
    pub min: f64,
    /// Middle.
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `xs` (None when empty or any is not finite).
    pub fn of(xs: &[f64]) -> Option<Spread> {
        if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        Some(Spread { reps: v.len(), min: v[0], median: v[(v.len() - 1) / 2], max: v[v.len() - 1] })
    }

    /// (max - min) / median (0 with one repetition or a zero median).
    pub fn relative(&self) -> f64 {
        if self.reps < 2 || self.median <= 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }

    /// `min-max` for a table cell (`-` with one repetition).
    pub fn cell(&self, decimals: usize) -> String {
        if self.reps < 2 {
            "-".to_string()
        } else {
            format!("{:.d$}-{:.d$}", self.min, self.max, d = decimals)
        }
    }
}

/// What a figure rests on and why it should not be quoted (empty: trusted).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trust {
    /// The figure's time basis, ms (the busiest worker's own work; 0 for a microbenchmark timed in slices).
    pub busy_ms: f64,
    /// Measured packets (or operations) behind the figure.
    pub packets: u64,
    /// Reasons not to trust it; empty when it passed every rule.
    pub flags: Vec<String>,
}

impl Trust {
    /// A figure of `value` resting on `busy_ms` of work and `packets`
    /// packets (`unit` names what `packets` counts in the flags).
    pub fn of(value: f64, busy_ms: f64, packets: u64, unit: &str) -> Trust {
        let mut t = Trust { busy_ms, packets, flags: Vec::new() };
        if packets > 0 && !(value.is_finite() && value > 0.0) {
            t.flags.push("no figure: packets moved but no rate measured".to_string());
        }
        if busy_ms < MIN_BUSY_MS {
            t.flags.push(format!("short: rests on {busy_ms:.1} ms of work (< {MIN_BUSY_MS:.0} ms)"));
        }
        if packets < MIN_PACKETS {
            t.flags.push(format!("few {unit}: {packets} measured (< {MIN_PACKETS})"));
        }
        t
    }

    /// A microbenchmark's figure of `value` over `ops` operations timed in
    /// slices (the rules for operations and a missing figure only).
    pub fn of_ops(value: f64, ops: u64, unit: &str) -> Trust {
        let mut t = Trust::of(value, MIN_BUSY_MS, ops, unit);
        t.busy_ms = 0.0;
        t
    }

    /// A run's figure: its throughput over the busiest worker's own work
    /// (`scale.work_ms` when the runtime measured it, else its busy cycles).
    pub fn of_report(r: &crate::Report) -> Trust {
        let (value, busy_ms) = match &r.scale {
            Some(sc) if !sc.work_ms.is_empty() => {
                (sc.projected_mpps.unwrap_or(sc.busy_mpps), sc.work_ms.iter().copied().fold(0.0, f64::max))
            }
            _ => (r.mpps, if r.mpps > 0.0 { r.packets as f64 / (r.mpps * 1e6) * 1e3 } else { 0.0 }),
        };
        Trust::of(value, busy_ms, r.packets, "packets")
    }

    /// Adds the noise rule for `s`.
    pub fn spread(&mut self, s: &Spread) {
        if s.relative() > MAX_SPREAD {
            self.flags.push(format!(
                "noisy: {}-{} spreads {:.0}% of the median over {} reps (> {:.0}%)",
                fmt3(s.min),
                fmt3(s.max),
                s.relative() * 100.0,
                s.reps,
                MAX_SPREAD * 100.0
            ));
        }
    }

    /// Adds the rules for a speed-up `ratio` on `cores` cores against a
    /// one-core figure (`base_ok`: that figure is trusted).
    pub fn speedup(&mut self, ratio: Option<f64>, cores: usize, base_ok: bool) {
        let Some(x) = ratio else { return };
        if !base_ok {
            self.flags.push("ratio against a flagged 1-core figure".to_string());
        } else if cores > 1 && x < MIN_SPEEDUP {
            self.flags
                .push(format!("slower than 1 core (x{x:.2} < {MIN_SPEEDUP}): overhead or noise, repeat with --reps"));
        } else if x > MAX_SUPERLINEAR * cores as f64 {
            self.flags.push(format!("x{x:.2} on {cores} core(s) is beyond linear (> {MAX_SUPERLINEAR} x cores)"));
        }
    }

    /// Adds a flag of the caller's own.
    pub fn flag(&mut self, why: impl Into<String>) {
        self.flags.push(why.into());
    }

    /// Passed every rule.
    pub fn ok(&self) -> bool {
        self.flags.is_empty()
    }

    /// A table's last cell: empty when trusted, else `! reason; reason`.
    pub fn cell(&self) -> String {
        if self.ok() {
            String::new()
        } else {
            format!("  ! {}", self.flags.join("; "))
        }
    }
}

/// The line under a table with flagged rows (None when every row is trusted).
pub fn footnote<'a>(rows: impl IntoIterator<Item = &'a Trust>) -> Option<String> {
    let n = rows.into_iter().filter(|t| !t.ok()).count();
    (n > 0).then(|| {
        format!(
            "(! {n} row(s) NOT TO BE QUOTED as they stand: each rule is at least {MIN_BUSY_MS:.0} ms of work and {MIN_PACKETS} packets per figure, a spread of at most {:.0}% over --reps; run longer (--seconds) or repeat (--reps))",
            MAX_SPREAD * 100.0
        )
    })
}

fn fmt3(x: f64) -> String {
    format!("{x:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_a_measured_value_and_spread_is_relative_to_it() {
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.reps, s.min, s.median, s.max), (4, 1.0, 2.0, 10.0));
        assert!((s.relative() - 4.5).abs() < 1e-12);
        assert_eq!(Spread::of(&[5.0]).unwrap().relative(), 0.0);
        assert!(Spread::of(&[]).is_none() && Spread::of(&[1.0, f64::NAN]).is_none());
        assert_eq!(Spread::of(&[1.0, 1.25]).unwrap().cell(2), "1.00-1.25");
    }

    #[test]
    fn short_few_and_missing_figures_are_flagged() {
        // Issue 35's `bench dyssect --seconds 0.5`: 2281 Mpps resting on about 1 ms of work.
        let t = Trust::of(2281.88, 1.2, 2_700_000, "packets");
        assert!(!t.ok() && t.flags[0].starts_with("short"), "{t:?}");
        // ... and dyssect's 0.00 Mpps of the same run: no figure.
        let t = Trust::of(0.0, 0.0, 300_000, "packets");
        assert!(t.flags.iter().any(|f| f.starts_with("no figure")), "{t:?}");
        let t = Trust::of(5.0, 500.0, 1_000, "packets");
        assert_eq!(t.flags.len(), 1, "{t:?}");
        assert!(t.flags[0].starts_with("few packets"));
        let ok = Trust::of(5.0, MIN_BUSY_MS, MIN_PACKETS, "packets");
        assert!(ok.ok() && ok.cell().is_empty());
        assert!(footnote([&ok]).is_none() && footnote([&ok, &t]).unwrap().contains("1 row(s)"));
    }

    #[test]
    fn noise_and_implausible_speedups_are_flagged() {
        let mut t = Trust::of(5.0, 500.0, 1_000_000, "packets");
        t.spread(&Spread::of(&[5.0, 5.2, 5.4]).unwrap());
        assert!(t.ok(), "8% is within the rule: {t:?}");
        t.spread(&Spread::of(&[4.0, 5.0, 6.0]).unwrap());
        assert!(t.flags[0].starts_with("noisy"), "{t:?}");
        // Issue 35's `bench scaling`: fw on 8 projected cores at 0.82x one core.
        let mut t = Trust::default();
        t.speedup(Some(0.82), 8, true);
        assert!(t.flags[0].starts_with("slower than 1 core"), "{t:?}");
        // Issue 35's `bench scr`: 0.17x on 2 cores against 476.81 Mpps on one (itself short).
        let mut t = Trust::default();
        t.speedup(Some(0.17), 2, false);
        assert!(t.flags[0].contains("flagged 1-core"), "{t:?}");
        let mut t = Trust::default();
        t.speedup(Some(11.0), 4, true);
        assert!(t.flags[0].contains("beyond linear"), "{t:?}");
        let mut t = Trust::default();
        t.speedup(Some(1.0), 1, true);
        t.speedup(Some(3.7), 4, true);
        assert!(t.ok());
    }
}

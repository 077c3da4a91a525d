//! NIC profiles: how long the emulated NIC takes to apply a change to its
//! steering — a RETA update (one write of the indirection table, whatever
//! entries it changes) and a flow-rule operation (installing an exact-match
//! rule, or changing the queue of one: a rule's slot moving).
//!
//! The named profiles are the RETA update times the Dyssect paper measured
//! (Carvalho et al., §IV-A: "We evaluated the NICs BCM57416 NetXtreme-E
//! Dual-Media (10G), Netronome NFP-4000 (40G), and Mellanox ConnectX-4
//! (100G) and obtained the following update times: 228.05 µs, 1073.67 µs,
//! and 359,226.71 µs"; the ConnectX-4 restarts the port on every update).
//! The paper measures no flow-rule insertion time, so the named profiles
//! leave it at 0; a custom profile (`reta=DUR:rule=DUR`) sets both.
//! `ideal` (every update at once) is the default and the emulated NIC's
//! behaviour before profiles existed.
//!
//! How [`crate::steer::Steering`] applies a profile: see its update queue.

use std::time::Duration;

/// Update latencies of one NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicProfile {
    /// Name (`ideal`, a NIC, or `custom`).
    pub name: String,
    /// One RETA update (a table write).
    pub reta_update: Duration,
    /// One flow-rule operation (insert, or re-target a rule's queue).
    pub rule_insert: Duration,
}

impl Default for NicProfile {
    fn default() -> Self {
        NicProfile::ideal()
    }
}

/// The named profiles: (name, NIC, RETA update time in ns).
pub const PROFILES: &[(&str, &str, u64)] = &[
    ("ideal", "every update applied at once", 0),
    ("bcm57416", "Broadcom BCM57416 NetXtreme-E 10G", 228_050),
    ("nfp4000", "Netronome NFP-4000 40G", 1_073_670),
    ("connectx4", "Mellanox ConnectX-4 100G", 359_226_710),
];

impl NicProfile {
    /// Every update applied at once.
    pub fn ideal() -> Self {
        NicProfile { name: "ideal".into(), reta_update: Duration::ZERO, rule_insert: Duration::ZERO }
    }

    /// True when no update waits (the NIC before profiles).
    pub fn is_ideal(&self) -> bool {
        self.reta_update.is_zero() && self.rule_insert.is_zero()
    }

    /// The names `parse` accepts, for messages.
    pub fn names() -> String {
        let n: Vec<&str> = PROFILES.iter().map(|p| p.0).collect();
        n.join(", ")
    }

    /// A named profile, or `reta=DUR[:rule=DUR]` (DUR: a number with `ns`,
    /// `us`, `ms` or `s`). Errors are one line naming what is accepted.
    pub fn parse(s: &str) -> Result<NicProfile, String> {
        let s = s.trim();
        if let Some(&(name, _, ns)) = PROFILES.iter().find(|p| p.0.eq_ignore_ascii_case(s)) {
            return Ok(NicProfile {
                name: name.to_string(),
                reta_update: Duration::from_nanos(ns),
                rule_insert: Duration::ZERO,
            });
        }
        if s.contains('=') {
            let mut p = NicProfile { name: "custom".into(), ..NicProfile::ideal() };
            for part in s.split(':') {
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                let d = duration(v).ok_or_else(|| {
                    format!("--nic-profile {s}: '{v}' is not a duration (a number with ns, us, ms or s, at most 60 s)")
                })?;
                match k.trim() {
                    "reta" => p.reta_update = d,
                    "rule" => p.rule_insert = d,
                    k => {
                        return Err(format!("--nic-profile {s}: unknown field '{k}' (custom form: reta=DUR:rule=DUR)"))
                    }
                }
            }
            return Ok(p);
        }
        Err(format!("--nic-profile {s}: unknown NIC profile (known: {}; or reta=DUR:rule=DUR)", Self::names()))
    }

    /// One line: the name and both latencies.
    pub fn describe(&self) -> String {
        format!("{} (RETA update {}, flow rule {})", self.name, fmt(self.reta_update), fmt(self.rule_insert))
    }
}

/// A duration as the profiles are written: µs below a millisecond, else ms.
pub fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.2} us")
    } else {
        format!("{:.2} ms", us / 1e3)
    }
}

/// `250us`, `1.5ms`, `2s`, `100ns` (at most 60 s).
fn duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = v.split_at(split);
    let x: f64 = num.trim().parse().ok()?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    let secs = x * scale;
    (secs.is_finite() && (0.0..=60.0).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_profiles_are_the_papers_measurements() {
        assert_eq!(NicProfile::default(), NicProfile::ideal());
        assert!(NicProfile::parse("ideal").unwrap().is_ideal());
        assert_eq!(NicProfile::parse("bcm57416").unwrap().reta_update, Duration::from_nanos(228_050));
        assert_eq!(NicProfile::parse("NFP4000").unwrap().reta_update, Duration::from_nanos(1_073_670));
        let cx = NicProfile::parse("connectx4").unwrap();
        assert_eq!((cx.reta_update.as_millis(), cx.rule_insert), (359, Duration::ZERO));
        assert_eq!(cx.describe(), "connectx4 (RETA update 359.23 ms, flow rule 0.00 us)");
    }

    #[test]
    fn custom_profiles_and_one_line_errors() {
        let p = NicProfile::parse("reta=2ms:rule=50us").unwrap();
        assert_eq!(
            (p.name.as_str(), p.reta_update, p.rule_insert),
            ("custom", Duration::from_millis(2), Duration::from_micros(50))
        );
        let e = NicProfile::parse("e810").unwrap_err();
        assert!(e.contains("ideal, bcm57416, nfp4000, connectx4") && !e.contains('\n'), "{e}");
        for bad in ["reta=fast", "reta=-1ms", "reta=90s", "reta=1ms:foo=1us", "reta=1h"] {
            let e = NicProfile::parse(bad).unwrap_err();
            assert!(e.starts_with("--nic-profile") && !e.contains('\n'), "{bad}: {e}");
        }
    }
}

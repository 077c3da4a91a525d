//! Kingman's formula (G/G/1 mean wait, Kingman 1961) as Dyssect uses it to
//! size cores for an SLO (Eq. 12, 13): the mean queueing delay of a core at
//! utilisation `u` is `u / (1 - u) * (ca^2 + cs^2) / 2 * t`, with `ca`, `cs`
//! the coefficients of variation of interarrival and service times and `t`
//! the mean service time. The controller turns an SLO into the largest
//! utilisation that meets it, a linear cap on the core's load.

/// Mean queueing delay (same unit as `t`) at utilisation `u` (infinite at or beyond 1).
pub fn wait(u: f64, ca: f64, cs: f64, t: f64) -> f64 {
    if u >= 1.0 {
        return f64::INFINITY;
    }
    u / (1.0 - u) * (ca * ca + cs * cs) / 2.0 * t
}

/// The largest utilisation whose Kingman wait is at most `slo` (same unit as `t`), in [0, 1).
pub fn max_utilisation(slo: f64, ca: f64, cs: f64, t: f64) -> f64 {
    let k = (ca * ca + cs * cs) / 2.0 * t;
    if k <= 0.0 {
        return 1.0 - 1e-9;
    }
    if slo <= 0.0 {
        return 0.0;
    }
    // u / (1 - u) * k <= slo  <=>  u <= x / (1 + x), x = slo / k.
    let x = slo / k;
    (x / (1.0 + x)).min(1.0 - 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_meets_the_slo_exactly() {
        // M/M/1 (ca = cs = 1): wait = u / (1 - u) * t.
        assert!((wait(0.5, 1.0, 1.0, 2.0) - 2.0).abs() < 1e-12);
        for slo in [0.5, 1.0, 10.0, 100.0] {
            let u = max_utilisation(slo, 1.0, 0.5, 1.0);
            assert!((wait(u, 1.0, 0.5, 1.0) - slo).abs() < 1e-9 * slo.max(1.0), "{slo} {u}");
            assert!(wait(u + 1e-3, 1.0, 0.5, 1.0) > slo);
        }
        assert_eq!(max_utilisation(0.0, 1.0, 1.0, 1.0), 0.0);
        assert!(wait(1.0, 1.0, 1.0, 1.0).is_infinite());
    }
}

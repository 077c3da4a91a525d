//! Time-stamp counter: cycle counts for benchmarks and batch latency.
//!
//! This machine has no hardware performance counters, so cycles/packet
//! comes from the invariant TSC, calibrated once against the monotonic clock.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Reads the TSC (serialising neither before nor after: use around loops of
/// many operations, not single instructions).
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: `rdtsc` has no memory effects and is available on every x86_64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    // Miri cannot execute `rdtsc`: it takes the portable path, so code that reads the clock runs under it.
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    {
        // Portable fallback: nanoseconds since the first call (1 "cycle" = 1 ns).
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// TSC ticks per second, measured once per process (~20 ms of calibration).
pub fn hz() -> f64 {
    static HZ: OnceLock<f64> = OnceLock::new();
    *HZ.get_or_init(|| calibrate(Duration::from_millis(20)))
}

/// Measures the TSC rate over `window` against `Instant`.
pub fn calibrate(window: Duration) -> f64 {
    let t0 = Instant::now();
    let c0 = rdtsc();
    while t0.elapsed() < window {
        std::hint::spin_loop();
    }
    let c1 = rdtsc();
    let dt = t0.elapsed().as_secs_f64();
    (c1.wrapping_sub(c0)) as f64 / dt
}

/// Converts a cycle count to seconds.
pub fn cycles_to_secs(cycles: u64) -> f64 {
    cycles as f64 / hz()
}

/// Converts a cycle count to nanoseconds.
pub fn cycles_to_ns(cycles: u64) -> f64 {
    cycles as f64 * 1e9 / hz()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_advances_and_calibrates() {
        let a = rdtsc();
        let b = rdtsc();
        assert!(b >= a);
        let f = hz();
        // Any real machine: between 100 MHz and 10 GHz.
        assert!(f > 1e8 && f < 1e10, "tsc hz {f}");
        assert!((cycles_to_secs(f as u64) - 1.0).abs() < 1e-6);
    }
}

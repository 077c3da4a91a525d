//! Pinning threads to CPU cores.

/// Number of CPUs this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Pins the calling thread to `core` (modulo the available cores). Returns
/// `false` if the OS refused (e.g. a restricted cpuset); workers still run.
pub fn pin_current_thread(core: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        let n = available_cores().max(1);
        // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it,
        // and sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(core % n, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = core;
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pin_to_core_zero() {
        assert!(super::available_cores() >= 1);
        std::thread::spawn(|| assert!(super::pin_current_thread(0))).join().unwrap();
    }
}

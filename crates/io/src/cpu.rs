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

/// CPU time the calling thread has run, in ns (`CLOCK_THREAD_CPUTIME_ID`:
/// exact, unlike `/proc`'s figures, which move at scheduler events); None if
/// the clock is unavailable.
pub fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pin_to_core_zero() {
        assert!(super::available_cores() >= 1);
        std::thread::spawn(|| assert!(super::pin_current_thread(0))).join().unwrap();
    }
}

/// How a polling loop waits when its queues are empty: spin a while (a packet
/// may be a few hundred ns away), then nap 50 µs per poll, so an idle port
/// does not burn a core another thread shares.
#[derive(Debug, Default)]
pub struct IdleBackoff {
    idle: u32,
}

impl IdleBackoff {
    /// Idle polls in a row before the loop naps.
    pub const SPINS: u32 = 2048;

    /// The poll found work: spin again next time.
    #[inline]
    pub fn busy(&mut self) {
        self.idle = 0;
    }

    /// The poll found nothing: spin, or nap once the queue has been idle long enough.
    #[inline]
    pub fn idle(&mut self) {
        self.idle = self.idle.saturating_add(1);
        if self.idle >= Self::SPINS {
            std::thread::sleep(std::time::Duration::from_micros(50));
        } else {
            std::hint::spin_loop();
        }
    }
}

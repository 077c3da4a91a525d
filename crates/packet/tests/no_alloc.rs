//! Steady state allocates nothing: a counting global allocator watches a
//! receive -> touch -> free loop over many batches.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use flowplane_packet::{Batch, Line, PacketPool, PoolConfig, MAX_BATCH};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Only the measuring thread counts: the test harness allocates on its own threads.
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_allocates_nothing() {
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..PoolConfig::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let frame = [Line([0x5a; 64])];
    COUNTING.with(|c| c.set(true));
    let before = ALLOCS.load(Ordering::Relaxed);
    let mut bytes = 0u64;
    for round in 0..10_000u64 {
        if round % 3 == 0 {
            assert_eq!(batch.rx_burst_lines(&mut pool, MAX_BATCH, |_| (&frame[..], 60, 1, round)), MAX_BATCH);
        } else {
            for _ in 0..MAX_BATCH {
                assert!(batch.push_lines(&mut pool, &frame, 60, round as u32, round));
            }
        }
        for i in 0..batch.len() {
            batch.data_mut(i)[0] ^= 1;
            bytes += batch.data(i).len() as u64;
        }
        if round % 2 == 0 {
            batch.drop_packet(3);
            batch.compact(&mut pool).unwrap();
        }
        batch.free_all(&mut pool).unwrap();
    }
    let after = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(false));
    assert_eq!(after - before, 0, "allocations in steady state");
    assert!(bytes > 0);
    assert_eq!(pool.stats().free, 1024);
}

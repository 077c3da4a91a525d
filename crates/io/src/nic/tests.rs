//! The NIC queue's modes against hand-made streams.

use super::*;
use crate::replay::ReplayBuilder;
use flowplane_packet::{tsc, PoolConfig};
use flowplane_scale::steer::{Classifier, HashOn};

fn setup(keys: &[u16]) -> (Arc<ReplayTrace>, Arc<Steering>) {
    let mut b = ReplayBuilder::new(1);
    for (i, &k) in keys.iter().enumerate() {
        b.push_steered(&[i as u8; 60], k as u32, 10 * i as u64, k).unwrap();
    }
    let c = Classifier::new(4, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    (b.build(), Arc::new(Steering::new(2, &c, &[0, 1, 0, 1]).unwrap()))
}

fn drain(q: &mut NicQueue, pool: &mut PacketPool) -> Vec<u8> {
    let mut batch = Batch::new(pool);
    let mut out = Vec::new();
    while let Rx::Packets(n) = q.rx_burst(pool, &mut batch, 8, 0) {
        out.extend((0..n).map(|i| batch.data(i)[0]));
        batch.free_all(pool).unwrap();
    }
    out
}

#[test]
fn queues_take_their_keys_in_order() {
    let keys: Vec<u16> = (0..40).map(|i| (i * 7 % 4) as u16).collect();
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(1), ..Default::default() };
    let a = drain(&mut NicQueue::new(t.clone(), s.clone(), 0, cfg), &mut pool);
    let b = drain(&mut NicQueue::new(t, s, 1, cfg), &mut pool);
    let want_a: Vec<u8> = (0..40u8).filter(|&i| keys[i as usize].is_multiple_of(2)).collect();
    let want_b: Vec<u8> = (0..40u8).filter(|&i| keys[i as usize] % 2 == 1).collect();
    assert_eq!((a, b), (want_a, want_b));
}

#[test]
fn paced_overload_drops_at_the_ring() {
    let keys = vec![0u16; 5000];
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(1), rate_pps: Some(1e6), tsc_hz: 1e6, ring: 1024, ..Default::default() };
    let mut q = NicQueue::new(t, s, 0, cfg);
    let mut batch = Batch::new(&pool);
    // 4 ms at 1 Mpps: 4001 packets due (0..=4 ms), a 1024-entry ring, 8 taken.
    assert_eq!(q.rx_burst(&mut pool, &mut batch, 8, 4000), Rx::Packets(8));
    let st = q.rx_stats();
    assert_eq!(st.scanned, 4001);
    assert_eq!(st.rx_ring_full, 4001 - 1024);
    batch.free_all(&mut pool).unwrap();
}

#[test]
fn spray_deals_positions_round_robin() {
    let keys = vec![0u16; 11];
    let (t, s0) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(2), spray: true, ..Default::default() };
    let a = drain(&mut NicQueue::new(t.clone(), s0.clone(), 0, cfg), &mut pool);
    let b = drain(&mut NicQueue::new(t, s0, 1, cfg), &mut pool);
    assert_eq!(a, vec![0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9]);
    assert_eq!(b, vec![1, 3, 5, 7, 9, 0, 2, 4, 6, 8, 10]);
}

/// Queues that divide the loop deliver from their own copies (the
/// descriptors point into them): the same packets, times and lengths
/// as the shared stream's.
#[test]
fn spray_over_queues_dividing_the_loop_reads_own_copies() {
    let keys = vec![0u16; 12];
    let (t, s0) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(3), spray: true, ..Default::default() };
    let loop_ns = t.loop_ns();
    for me in 0..2u16 {
        let mut q = NicQueue::new(t.clone(), s0.clone(), me, cfg);
        assert!(matches!(&q.mode, Mode::Spray(s) if s.sprayed.is_some()));
        let mut batch = Batch::new(&pool);
        let mut got = Vec::new();
        while let Rx::Packets(n) = q.rx_burst(&mut pool, &mut batch, 5, 0) {
            got.extend((0..n).map(|i| (batch.data(i)[0], batch.data(i).len(), batch.timestamps()[i])));
            batch.free_all(&mut pool).unwrap();
        }
        let want: Vec<(u8, usize, u64)> = (0..3u64)
            .flat_map(|lp| (u64::from(me)..12).step_by(2).map(move |i| (i as u8, 60, lp * loop_ns + 10 * i)))
            .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn a_move_switches_owner_without_loss_or_duplicates() {
    // Walking from the start (bounded drift), and from the queues' own lists until the table changes.
    for bounded in [true, false] {
        move_once(bounded);
    }
}

fn move_once(bounded: bool) {
    // 40000 packets over 4 keys; queue 0 owns keys 0 and 2, queue 1 keys 1 and 3.
    let keys: Vec<u16> = (0..40_000u32).map(|i| (i % 4) as u16).collect();
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(1), bounded_drift: bounded, ..Default::default() };
    let mut q0 = NicQueue::new(t.clone(), s.clone(), 0, cfg);
    let mut q1 = NicQueue::new(t, s.clone(), 1, cfg);
    let mut batch = Batch::new(&pool);
    let (mut got0, mut got1) = (Vec::new(), Vec::new());
    let mut moved = false;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut active = false;
        for (q, got) in [(&mut q0, &mut got0), (&mut q1, &mut got1)] {
            match q.rx_burst(&mut pool, &mut batch, 16, 0) {
                Rx::Packets(n) => {
                    active = true;
                    got.extend(
                        (0..n).map(|i| u32::from(batch.rss_hashes()[i] as u16) | u32::from(batch.data(i)[0]) << 16),
                    );
                    batch.free_all(&mut pool).unwrap();
                }
                Rx::Idle => active = true,
                Rx::Done => {}
            }
            if let Some(mv) = q.take_due() {
                // The hand-over: here the state is just a marker.
                s.hand_over(mv, Vec::new());
                let mut mail = Vec::new();
                s.take_mail(mv.to as usize, &mut mail);
                s.imported(mail[0].mv);
            }
        }
        if rounds == 10 && !moved {
            s.start_move(2, 1).unwrap();
            moved = true;
        }
        if !active || rounds > 100_000 {
            break;
        }
    }
    assert_eq!(s.moves_done(), 1, "bounded {bounded}");
    // Every packet once; key 2 first on queue 0, then (from the switch point) on queue 1.
    assert_eq!(got0.len() + got1.len(), 40_000);
    let k2_0 = got0.iter().filter(|&&x| x & 0xffff == 2).count();
    let k2_1 = got1.iter().filter(|&&x| x & 0xffff == 2).count();
    assert_eq!(k2_0 + k2_1, 10_000);
    assert!(k2_0 > 0 && k2_1 > 0, "{k2_0} {k2_1}");
}

/// Receives one burst of `q` into `got` as (key, stream index); false when done.
fn burst(q: &mut NicQueue, pool: &mut PacketPool, batch: &mut Batch, got: &mut Vec<(u16, u64)>) -> bool {
    match q.rx_burst(pool, batch, 16, 0) {
        Rx::Packets(n) => {
            got.extend((0..n).map(|i| (batch.rss_hashes()[i] as u16, batch.timestamps()[i] / 10)));
            batch.free_all(pool).unwrap();
            true
        }
        Rx::Idle => true,
        Rx::Done => false,
    }
}

#[test]
fn a_move_takes_effect_within_a_burst_and_the_new_owner_goes_on_meanwhile() {
    // 40000 packets over 4 keys; queue 0 owns keys 0 and 2, queue 1 keys 1 and 3.
    let keys: Vec<u16> = (0..40_000u32).map(|i| (i % 4) as u16).collect();
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let cfg = NicConfig { loops: Some(1), bounded_drift: true, ..Default::default() };
    let mut q0 = NicQueue::new(t.clone(), s.clone(), 0, cfg);
    let mut q1 = NicQueue::new(t, s.clone(), 1, cfg);
    let mut batch = Batch::new(&pool);
    let (mut got0, mut got1) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        burst(&mut q0, &mut pool, &mut batch, &mut got0);
        burst(&mut q1, &mut pool, &mut batch, &mut got1);
    }
    let furthest = s.queue_scan().into_iter().max().unwrap();
    let mv = s.start_move(2, 1).unwrap();
    // The switch is at the end of the span a queue is walking: within one burst (16 packets of
    // a queue, its prefetch distance, over 2 queues), not a fixed 8192 positions ahead.
    assert!(mv.at <= furthest + 256, "switch at {} with queues at {furthest}", mv.at);
    // The old owner reaches the switch point and owes the state; it is held back for now.
    let due = loop {
        assert!(burst(&mut q0, &mut pool, &mut batch, &mut got0));
        if let Some(m) = q0.take_due() {
            break m;
        }
    };
    // Meanwhile the new owner goes on with its other keys past the switch point.
    for _ in 0..200 {
        burst(&mut q1, &mut pool, &mut batch, &mut got1);
    }
    let st = q1.rx_stats();
    assert_eq!(st.stalls, 0);
    assert!(st.parked > 0);
    assert!(got1.iter().any(|&(k, i)| k != 2 && i > mv.at + 1000), "no progress past {}", mv.at);
    assert!(!got1.iter().any(|&(k, _)| k == 2));
    // The state arrives: key 2's packets follow from the switch point, in order.
    s.hand_over(due, Vec::new());
    let mut mail = Vec::new();
    s.take_mail(1, &mut mail);
    s.imported(mail[0].mv);
    while burst(&mut q0, &mut pool, &mut batch, &mut got0) | burst(&mut q1, &mut pool, &mut batch, &mut got1) {}
    assert_eq!(got0.len() + got1.len(), 40_000);
    let k2: Vec<u64> = got1.iter().filter(|p| p.0 == 2).map(|p| p.1).collect();
    assert!(k2.windows(2).all(|w| w[0] < w[1]) && k2.first().is_some_and(|&i| i >= mv.at));
    assert!(got0.iter().filter(|p| p.0 == 2).all(|p| p.1 < mv.at));
    assert_eq!(k2.len() + got0.iter().filter(|p| p.0 == 2).count(), 10_000);
    assert_eq!(s.moves_done(), 1);
}

/// A queue whose packets sit at the start of the stream and whose next
/// loop is further than one burst's bound ahead (a long run of the other
/// queue's packets at the end): each loop's packets once, at full speed
/// and paced.
#[test]
fn own_packets_far_apart_across_loops_come_once_per_loop() {
    let keys: Vec<u16> = (0..20_100u32).map(|i| u16::from(i >= 100)).collect();
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    for rate in [None, Some(1e8)] {
        let cfg = NicConfig { loops: Some(3), rate_pps: rate, tsc_hz: 1e9, ring: 1 << 16, ..Default::default() };
        let mut q = NicQueue::new(t.clone(), s.clone(), 0, cfg);
        let mut batch = Batch::new(&pool);
        let mut got = Vec::new();
        let mut now = 0;
        for _ in 0..1_000_000 {
            now += 1000;
            match q.rx_burst(&mut pool, &mut batch, 16, now) {
                Rx::Packets(n) => {
                    got.extend((0..n).map(|i| batch.timestamps()[i] / 10));
                    batch.free_all(&mut pool).unwrap();
                }
                Rx::Idle => {}
                Rx::Done => break,
            }
        }
        // Trace time 10 ns per position; loop k's packets at k * loop_ns.
        let loop_pos = t.loop_ns / 10;
        let want: Vec<u64> = (0..3).flat_map(|k| (0..100).map(move |i| k * loop_pos + i)).collect();
        let first_wrong = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(got == want, "rate {rate:?}: {} packets, first wrong at {first_wrong:?}", got.len());
    }
}

/// Paced with the table as it started, each queue takes only its own
/// due packets (a full ring drops the newest arrivals, counted); when
/// the table changes with packets in the ring, those are delivered
/// (described from the stream, not the private copy) and the walk goes
/// on from there: every packet delivered or counted as dropped once.
#[test]
fn paced_static_queues_take_their_due_packets_and_hand_over_to_the_walk() {
    // 40000 packets 10 ns apart; queue 0 owns keys 0 and 2 (even positions).
    let keys: Vec<u16> = (0..40_000u32).map(|i| (i % 4) as u16).collect();
    let (t, s) = setup(&keys);
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    // 1e8 packets/s on a 1 GHz clock: the trace time due is the clock in ns.
    let cfg = NicConfig { loops: Some(1), rate_pps: Some(1e8), tsc_hz: 1e9, ring: 1024, ..Default::default() };
    let mut q0 = NicQueue::new(t.clone(), s.clone(), 0, cfg);
    let mut q1 = NicQueue::new(t, s.clone(), 1, cfg);
    assert!(matches!(&q0.mode, Mode::Static(s) if s.mine.is_some()));
    let mut batch = Batch::new(&pool);
    let mut got = [Vec::new(), Vec::new()];
    let take = |q: &mut NicQueue, pool: &mut PacketPool, batch: &mut Batch, now: u64, got: &mut Vec<u64>| {
        let r = q.rx_burst(pool, batch, 16, now);
        if let Rx::Packets(n) = r {
            for i in 0..n {
                let pos = batch.timestamps()[i] / 10;
                // The bytes are the packet's own (a descriptor read from the right copy).
                assert_eq!(batch.data(i)[0], pos as u8);
                got.push(pos);
            }
            batch.free_all(pool).unwrap();
        }
        r
    };
    // At 1 us: positions 0..=100 due, 51 of them queue 0's; 16 taken, 35 left in the ring.
    assert_eq!(take(&mut q0, &mut pool, &mut batch, 1000, &mut got[0]), Rx::Packets(16));
    assert_eq!(got[0], (0..32).step_by(2).collect::<Vec<u64>>());
    assert!(matches!(&q0.mode, Mode::Static(s) if s.held == 35));
    // At 100 us: 5001 own packets due; 4950 new arrivals, room for 989, the rest dropped.
    assert_eq!(take(&mut q0, &mut pool, &mut batch, 100_000, &mut got[0]), Rx::Packets(16));
    assert_eq!(q0.rx_stats().rx_ring_full, 4950 - 989);
    assert_eq!(got[0][16..], (32..64).step_by(2).collect::<Vec<u64>>()[..]);
    // The table changes with 1008 packets in queue 0's ring.
    s.start_move(2, 1).unwrap();
    let mut now = 100_000;
    for _ in 0..100_000 {
        now += 100;
        let mut active = false;
        for (me, q) in [&mut q0, &mut q1].into_iter().enumerate() {
            active |= take(q, &mut pool, &mut batch, now, &mut got[me]) != Rx::Done;
            if let Some(mv) = q.take_due() {
                s.hand_over(mv, Vec::new());
                let mut mail = Vec::new();
                s.take_mail(mv.to as usize, &mut mail);
                s.imported(mail[0].mv);
            }
        }
        if !active {
            break;
        }
    }
    assert_eq!(s.moves_done(), 1);
    let dropped = q0.rx_stats().rx_ring_full + q1.rx_stats().rx_ring_full;
    assert_eq!(got[0].len() + got[1].len() + dropped as usize, 40_000);
    for key in 0..4 {
        // Each key's packets in stream order, each once: on queue 0, then (key 2, moved) on queue 1.
        let k: Vec<u64> = got.iter().flatten().copied().filter(|&p| p % 4 == key).collect();
        assert!(k.windows(2).all(|w| w[0] < w[1]), "key {key}: {:?}", k.windows(2).find(|w| w[0] >= w[1]));
    }
    let k2_1 = got[1].iter().filter(|&&p| p % 4 == 2).count();
    assert!(k2_1 > 0 && got[0].iter().all(|&p| p % 2 == 0));
    batch.free_all(&mut pool).unwrap();
}

/// Walk cost per stream position (run with --ignored --nocapture; a figure, not a check).
#[test]
#[ignore]
fn walk_cost() {
    let n = 1 << 22;
    let mut b = ReplayBuilder::new(1);
    let mut x = 1u32;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b.push_steered(&[0u8; 60], x, i as u64, (x % 512) as u16).unwrap();
    }
    let t = b.build();
    let c = Classifier::new(512, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
    let s = Arc::new(Steering::new(2, &c, &[]).unwrap());
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    for _ in 0..5 {
        let mut q = NicQueue::new(t.clone(), s.clone(), 0, NicConfig { loops: Some(1), ..Default::default() });
        let t0 = tsc::rdtsc();
        while let Rx::Packets(_) = q.rx_burst(&mut pool, &mut batch, 64, 0) {
            batch.free_all(&mut pool).unwrap();
        }
        let all = tsc::rdtsc() - t0;
        let st = q.rx_stats();
        eprintln!(
            "walk {:.2} cycles/position, {:.2} cycles/packet all in",
            st.nic_cycles as f64 / st.scanned as f64,
            all as f64 / st.packets as f64
        );
    }
}

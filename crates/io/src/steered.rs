//! A worker's source on a queue the kernel steers by flowplane's table
//! ([`crate::port::fanout_steer`]), with RETA moves and their state hand-over.
//!
//! The protocol (the kernel's counterpart of the dispatcher's markers):
//! 1. The control loop applies a landed move to the program's table (one map
//!    write), waits for an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`:
//!    every frame the program steered with the old owner is then in the old
//!    owner's ring), reads the real-time clock as the move's *switch time* `T`
//!    and publishes it ([`SwitchTimes`]).
//! 2. The old owner hands the key over once it has received every frame the
//!    program gave it before the switch: when it reaches a frame received after
//!    `T` (taken or held: that frame was steered after the map write, so every
//!    frame ahead of it in the ring, the key's included, is in this or an earlier
//!    burst), or when its ring has been empty past `T` plus the ring's block
//!    timeout and a margin (a ring hands a block to user space at the latest
//!    when that timeout retires it).
//! 3. The new owner holds the key's frames (and what follows them in its ring)
//!    until the key's state is imported: it classifies each frame with the
//!    run's classifier while a move to it is open, and leaves a held frame in
//!    the kernel's ring (no copy, no loss).
//!
//! The control loop never starts a move into a queue that still owes a hand-over,
//! nor out of a queue still waiting for one (`engine/src/kernel_moves.rs`): a
//! queue holding frames never has to reach past them to hand a key over.
//!
//! The switch time compares with the kernel's receive timestamps (real-time
//! clock): a clock step during a move can make the old owner hand over early
//! or late; the bounded wait in 2. still ends every move.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{Batch, PacketPool};
use flowplane_scale::steer::{Classifier, FlowRule, Move, Steering};

use crate::port::{QueueCounters, RxQueue};
use crate::{Rx, RxStats, Source};

/// Switch times of moves the control loop has applied in the kernel.
#[derive(Debug, Default)]
pub struct SwitchTimes {
    version: AtomicU64,
    times: Mutex<Vec<(u64, u64)>>,
}

impl SwitchTimes {
    /// Move `id` steers to its new owner for every frame received after `t_ns` (real time).
    pub fn publish(&self, id: u64, t_ns: u64) {
        if let Ok(mut t) = self.times.lock() {
            t.push((id, t_ns));
        }
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Forgets a finished move.
    pub fn forget(&self, id: u64) {
        if let Ok(mut t) = self.times.lock() {
            t.retain(|&(i, _)| i != id);
        }
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Changes so far (one relaxed load per burst tells a source to look again).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The switch time of move `id`, once published.
    pub fn get(&self, id: u64) -> Option<u64> {
        self.times.lock().ok().and_then(|t| t.iter().find(|&&(i, _)| i == id).map(|&(_, t)| t))
    }
}

/// Real time in ns since the Unix epoch (the clock of the kernel's receive timestamps).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A move this queue is the old owner of, until it is handed over.
#[derive(Clone, Copy)]
struct Draining {
    mv: Move,
    switch: Option<u64>,
}

/// A worker's source on a kernel-steered queue (see the module docs).
pub struct KernelSource {
    rx: Box<dyn RxQueue>,
    counters: Arc<QueueCounters>,
    me: u16,
    steering: Arc<Steering>,
    classifier: Classifier,
    switch: Arc<SwitchTimes>,
    /// Longest a frame can sit in the ring unseen (the block timeout and a margin), ns.
    drain_ns: u64,
    generation: u64,
    switch_version: u64,
    owner: Vec<u16>,
    moves: Vec<Move>,
    rules: Vec<(u16, FlowRule)>,
    draining: Vec<Draining>,
    /// Ids already reported due.
    reported: Vec<u64>,
    /// Keys held: moves to this queue whose state has not arrived.
    holding: Vec<(u16, u64)>,
    due: VecDeque<Move>,
    stalls: u64,
    /// Each frame's hash is the classifier's (the kernel's own `tp_rxhash` is not): a
    /// strategy with flow rules (Dyssect) names a sampled flow's RETA entry by it.
    rehash: bool,
}

/// The steering key of `frame`, as the program computes it (and the dispatcher).
fn key_of(c: &Classifier, rules: &[(u16, FlowRule)], frame: &[u8]) -> u16 {
    let key = c.classify(frame).map_or(0, |(k, _)| k);
    if (key as usize) < c.reta_size() {
        if let Some((slot, _)) = rules.iter().find(|(_, r)| r.entry == key && r.matches_frame(frame)) {
            return *slot;
        }
    }
    key
}

impl KernelSource {
    /// Worker `me`'s source over `rx` (its queue of the steered port).
    pub fn new(
        rx: Box<dyn RxQueue>,
        counters: Arc<QueueCounters>,
        me: u16,
        steering: Arc<Steering>,
        classifier: Classifier,
        switch: Arc<SwitchTimes>,
        drain_ns: u64,
    ) -> Self {
        let keys = steering.keys();
        let classifier_keys = classifier.reta_size();
        KernelSource {
            rx,
            counters,
            me,
            steering,
            classifier,
            switch,
            drain_ns,
            generation: u64::MAX,
            switch_version: u64::MAX,
            owner: vec![0; keys],
            moves: Vec::new(),
            rules: Vec::new(),
            draining: Vec::new(),
            reported: Vec::new(),
            holding: Vec::new(),
            due: VecDeque::new(),
            stalls: 0,
            rehash: keys > classifier_keys,
        }
    }

    /// Re-reads the moves after a change of the table or of the switch times.
    fn refresh(&mut self) {
        let g = self.steering.generation();
        let v = self.switch.version();
        if g == self.generation && v == self.switch_version {
            return;
        }
        self.switch_version = v;
        self.generation = self.steering.snapshot_rules(self.me, &mut self.owner, &mut self.moves, &mut self.rules);
        for mv in &self.moves {
            if mv.from == self.me && !self.reported.contains(&mv.id) {
                match self.draining.iter_mut().find(|d| d.mv.id == mv.id) {
                    Some(d) => d.switch = d.switch.or(self.switch.get(mv.id)),
                    None => self.draining.push(Draining { mv: *mv, switch: self.switch.get(mv.id) }),
                }
            }
        }
        // Moves no longer active were retired: nothing to remember.
        let active = &self.moves;
        self.reported.retain(|id| active.iter().any(|m| m.id == *id));
    }

    fn report(&mut self, i: usize) {
        let d = self.draining.swap_remove(i);
        self.reported.push(d.mv.id);
        self.due.push_back(d.mv);
    }
}

impl Source for KernelSource {
    fn clock_ns(&self) -> Option<u64> {
        self.rx.clock_ns()
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, _now: u64) -> Rx {
        self.refresh();
        let max = max.min(batch.room());
        let first = batch.len();
        let (me, st) = (self.me, &self.steering);
        self.holding.clear();
        self.holding
            .extend(self.moves.iter().filter(|m| m.to == me && !st.is_ready(m.key, m.id)).map(|m| (m.key, m.id)));
        let n = if self.holding.is_empty() && self.draining.is_empty() {
            self.rx.rx_burst(pool, batch, max)
        } else {
            let mut latest = 0u64;
            let mut stalled = false;
            let KernelSource { rx, holding, classifier, rules, steering, .. } = self;
            let mut gate = |f: &[u8], ts: u64| {
                // A held key's frame waits (and what is behind it) until the key's state is here.
                // Every frame ahead of this one in the ring has been taken: its receive time
                // closes a move's stream here whether it is taken or held.
                latest = latest.max(ts);
                if !holding.is_empty() {
                    let k = key_of(classifier, rules, f);
                    if holding.iter().any(|&(key, id)| key == k && !steering.is_ready(key, id)) {
                        stalled = true;
                        return false;
                    }
                }
                true
            };
            let n = rx.rx_burst_gated(pool, batch, max, &mut gate);
            self.stalls += u64::from(stalled && n == 0);
            // Old owner: a frame received after a switch time closes that move's stream here.
            let now = realtime_ns();
            let mut i = 0;
            while i < self.draining.len() {
                let d = self.draining[i];
                let done = d.switch.is_some_and(|t| latest > t || (n == 0 && !stalled && now > t + self.drain_ns));
                if done {
                    self.report(i);
                } else {
                    i += 1;
                }
            }
            n
        };
        if self.rehash {
            for i in first..first + n {
                let h = self.classifier.classify(batch.data(i)).map_or(0, |(_, h)| h);
                batch.rss_hashes_mut()[i] = h;
            }
        }
        if n > 0 {
            Rx::Packets(n)
        } else {
            Rx::Idle
        }
    }

    fn rx_stats(&self) -> RxStats {
        let s = self.counters.snapshot();
        RxStats {
            packets: s.rx_packets,
            bytes: s.rx_bytes,
            rx_ring_full: s.rx_overrun,
            pool_empty: s.rx_pool_empty,
            stalls: self.stalls,
            ..RxStats::default()
        }
    }

    fn take_due(&mut self) -> Option<Move> {
        self.due.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::PoolConfig;
    use flowplane_scale::steer::HashOn;

    /// A queue of (frame, receive time) that honours the gate.
    struct FakeRx(VecDeque<(Vec<u8>, u64)>);

    impl RxQueue for FakeRx {
        fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
            self.rx_burst_gated(pool, batch, max, &mut |_, _| true)
        }

        fn rx_burst_gated(
            &mut self,
            pool: &mut PacketPool,
            batch: &mut Batch,
            max: usize,
            gate: &mut dyn FnMut(&[u8], u64) -> bool,
        ) -> usize {
            let mut n = 0;
            while n < max {
                let Some((f, ts)) = self.0.front() else { break };
                if !gate(f, *ts) {
                    break;
                }
                assert!(batch.push_copy(pool, f, 0));
                self.0.pop_front();
                n += 1;
            }
            n
        }
    }

    fn udp(src: u8, sport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, src]);
        f[30..34].copy_from_slice(&[10, 9, 9, 9]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f
    }

    #[test]
    fn the_old_owner_hands_over_at_the_first_frame_past_the_switch_and_the_new_owner_holds_until_then() {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let st = Arc::new(Steering::new(2, &c, &[]).unwrap());
        // Two flows on different entries, both owned by queue 0 (round robin over 8 entries: even entries).
        let (a, b) = {
            let mut even = (1..=250u8).map(|s| udp(s, 1000)).filter(|f| c.classify(f).unwrap().0.is_multiple_of(2));
            let a = even.next().unwrap();
            let ka = c.classify(&a).unwrap().0;
            let b = even.find(|f| c.classify(f).unwrap().0 != ka).unwrap();
            (a, b)
        };
        let key = c.classify(&a).unwrap().0;
        let switch = Arc::new(SwitchTimes::default());
        let t = 1_000_000u64;
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let counters = Arc::new(QueueCounters::default());
        // Old owner: a's frame before the switch, b's after; new owner: a's frame after the switch, then b's.
        let old = FakeRx(VecDeque::from([(a.clone(), t - 5), (b.clone(), t + 5)]));
        let new = FakeRx(VecDeque::from([(a.clone(), t + 7), (b.clone(), t + 8)]));
        let mut q0 = KernelSource::new(Box::new(old), counters.clone(), 0, st.clone(), c.clone(), switch.clone(), 10);
        let mut q1 = KernelSource::new(Box::new(new), counters, 1, st.clone(), c, switch.clone(), 10);
        let mv = st.start_move(key, 1).unwrap();
        // Landed, not yet in the kernel: nobody reports, the new owner already holds the key.
        assert_eq!(q1.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Idle, "a's frame held");
        assert!(q0.take_due().is_none());
        switch.publish(mv.id, t);
        assert_eq!(q0.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(2));
        assert_eq!(q0.take_due(), Some(mv), "b's frame came after the switch: a's stream is complete");
        batch.free_all(&mut pool).unwrap();
        assert_eq!(q1.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Idle, "still held: no state yet");
        assert!(q1.rx_stats().stalls > 0);
        st.hand_over(mv, Vec::new());
        st.imported(mv);
        assert_eq!(q1.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Packets(2), "the state is in: a's frame, then b's");
        assert_eq!(batch.data(0), &a[..]);
        batch.free_all(&mut pool).unwrap();
    }

    #[test]
    fn an_idle_old_owner_hands_over_once_its_ring_could_hold_nothing_older() {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let st = Arc::new(Steering::new(2, &c, &[]).unwrap());
        let switch = Arc::new(SwitchTimes::default());
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let mut q0 = KernelSource::new(
            Box::new(FakeRx(VecDeque::new())),
            Arc::new(QueueCounters::default()),
            0,
            st.clone(),
            c,
            switch.clone(),
            50_000_000,
        );
        let mv = st.start_move(0, 1).unwrap();
        let now = realtime_ns();
        switch.publish(mv.id, now);
        assert_eq!(q0.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Idle);
        assert!(q0.take_due().is_none(), "a block may still be open in the ring");
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(q0.rx_burst(&mut pool, &mut batch, 32, 0), Rx::Idle);
        assert_eq!(q0.take_due(), Some(mv));
    }
}

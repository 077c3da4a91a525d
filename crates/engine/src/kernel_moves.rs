//! RETA moves under kernel steering: the control loop's half of the protocol in
//! [`flowplane_io::steered`]. Each control period it publishes the program's
//! per-(worker, key) frame counts to the steering table as the dispatcher does
//! (so RSS++ and Dyssect see their loads); whenever moves have landed it writes
//! the table into the program, waits for a grace period and publishes the
//! moves' switch time; a move whose state the new owner imported is retired.
//! A new flow rule's slot is first written with its entry's owner (a slot
//! keeps, in the program, the queue its last rule was moved to). Runs on the
//! runtime's control loop ([`crate::runtime`]), which wakes every
//! millisecond while a move is under way.

use std::sync::Arc;
use std::time::Duration;

use flowplane_io::port::fanout_steer::KernelSteer;
use flowplane_io::steered::SwitchTimes;
use flowplane_scale::steer::{FlowRule, Steering, PENDING};

/// Longest a frame steered before a move can sit unseen in its old owner's ring: the
/// ring's block timeout (1 ms by default), its timer's jiffies, and a margin.
pub(crate) const KERNEL_DRAIN: Duration = Duration::from_millis(25);

/// The control loop's side of kernel-steered moves.
pub(crate) struct KernelMover {
    k: Arc<KernelSteer>,
    switch: Arc<SwitchTimes>,
    /// Moves written into the program (their switch time published).
    applied: Vec<u64>,
    generation: u64,
    counts: Vec<u64>,
    /// The owner of every key as written in the program (RETA entries, then flow slots).
    owners: Vec<u16>,
    /// The flow rules written in the program.
    rules: Vec<(u16, FlowRule)>,
}

impl KernelMover {
    /// The mover of program `k`, loaded with `st`'s table.
    pub(crate) fn new(k: Arc<KernelSteer>, st: &Steering) -> Self {
        let switch = Arc::new(SwitchTimes::default());
        let (owners, rules) = (st.owners(), st.flow_rules());
        KernelMover { k, switch, applied: Vec::new(), generation: u64::MAX, counts: Vec::new(), owners, rules }
    }

    /// The switch times this mover publishes (the workers' sources read them).
    pub(crate) fn switch_times(&self) -> Arc<SwitchTimes> {
        Arc::clone(&self.switch)
    }

    /// Publishes the program's counts as every worker's progress and per-key loads:
    /// the stream position is every frame steered so far.
    pub(crate) fn publish(&mut self, st: &Steering) {
        self.k.counts(&mut self.counts);
        let keys = self.k.keys();
        if keys == 0 || self.counts.len() < keys * st.queues() {
            return;
        }
        let pos: u64 = self.counts.iter().sum();
        for q in 0..st.queues() {
            let c = &self.counts[q * keys..(q + 1) * keys];
            st.publish_loads(q, c, pos);
            st.publish_progress(q, pos, c.iter().sum());
        }
    }

    /// Writes landed changes into the program (moves get their switch time) and retires
    /// the moves whose state has been imported. Errors are the program's (one line).
    ///
    /// A move starts only while neither end has a move the other way under way: a queue
    /// that holds a key's frames for an incoming move must not also owe a hand-over, or
    /// two queues could each hold the frame the other's hand-over waits behind.
    pub(crate) fn apply(&mut self, st: &Steering) -> Result<(), String> {
        let moves = st.moves();
        let busy: Vec<(u16, u16)> =
            moves.iter().filter(|m| self.applied.contains(&m.id)).map(|m| (m.from, m.to)).collect();
        let mut chosen: Vec<(u64, u16, u16, u16)> = Vec::new();
        for m in moves.iter().filter(|m| m.at != PENDING && !self.applied.contains(&m.id)) {
            let clash = busy
                .iter()
                .copied()
                .chain(chosen.iter().map(|&(_, _, f, t)| (f, t)))
                .any(|(f, t)| t == m.from || f == m.to);
            if !clash {
                chosen.push((m.id, m.key, m.from, m.to));
            }
        }
        let g = st.generation();
        if chosen.is_empty() && g == self.generation {
            return self.retire(st);
        }
        self.generation = g;
        // A new rule's slot steers to its entry's owner (no frame changes queue until the slot
        // moves): a slot used before may still name the queue its last rule was moved to.
        let rules = st.flow_rules();
        for (slot, r) in &rules {
            if !self.rules.iter().any(|(s, h)| s == slot && h == r) {
                let q = self.owners.get(r.entry as usize).copied().unwrap_or(0);
                self.set_owner(*slot, q)?;
            }
        }
        // Then the moves (a new rule's slot may move at once), then the rules themselves.
        for &(_, key, _, to) in &chosen {
            self.set_owner(key, to)?;
        }
        self.k.sync_rules(st).map_err(|e| e.to_string())?;
        self.rules = rules;
        if !chosen.is_empty() {
            let t = self.k.grace_period();
            for &(id, ..) in &chosen {
                self.switch.publish(id, t);
                self.applied.push(id);
            }
        }
        self.retire(st)
    }

    /// Writes key `key`'s owner into the program.
    fn set_owner(&mut self, key: u16, q: u16) -> Result<(), String> {
        self.k.set_entry(key, q).map_err(|e| e.to_string())?;
        if let Some(o) = self.owners.get_mut(key as usize) {
            *o = q;
        }
        Ok(())
    }

    /// Moves are in the program whose state has not been imported yet (the loop looks again soon).
    pub(crate) fn in_flight(&self) -> bool {
        !self.applied.is_empty()
    }

    /// Retires the applied moves whose state the new owner has imported.
    fn retire(&mut self, st: &Steering) -> Result<(), String> {
        for m in st.moves() {
            if self.applied.contains(&m.id) && st.is_ready(m.key, m.id) {
                st.retired(m.id);
                self.switch.forget(m.id);
                self.applied.retain(|&id| id != m.id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_io::port::fanout_steer;
    use flowplane_scale::steer::{Classifier, HashOn};
    use flowplane_wire::flow::{extract_five_tuple, FiveTuple};

    fn udp(src: u8) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, src]);
        f[30..34].copy_from_slice(&[10, 9, 9, 9]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        f
    }

    fn rule(c: &Classifier, f: &[u8]) -> FlowRule {
        let (entry, hash) = c.classify(f).unwrap();
        let Ok(FiveTuple::V4(tuple)) = extract_five_tuple(f) else { panic!("an IPv4 frame") };
        FlowRule { entry, hash, tuple }
    }

    /// Starts a move, lands it, writes it into the program, hands over and retires it.
    fn complete(st: &Steering, m: &mut KernelMover, key: u16, to: u16) {
        let mv = st.start_move(key, to).unwrap();
        st.pump(std::time::Instant::now());
        m.apply(st).unwrap();
        assert!(m.switch.get(mv.id).is_some(), "the move has its switch time");
        st.hand_over(mv, Vec::new());
        st.imported(mv);
        m.apply(st).unwrap();
        assert!(!m.in_flight(), "retired once imported");
    }

    /// Regression: a flow slot whose last rule had been moved to another queue kept that
    /// queue in the program when a new rule took the slot; the new flow then left its
    /// entry's owner without a hand-over (its state split over two queues).
    #[test]
    fn a_reused_flow_slot_steers_to_its_new_entrys_owner() {
        assert!(fanout_steer::available(), "built without clang: apt-get install clang (scripts/test.sh does)");
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let st = Steering::with_flow_slots(2, &c, &[], 1).unwrap();
        let k = match KernelSteer::for_steering(&c, &st) {
            Ok(k) => Arc::new(k),
            // Loading needs CAP_BPF (the root tests run it).
            Err(e) if unprivileged() => return eprintln!("skipped: {e}"),
            Err(e) => panic!("{e}"),
        };
        let mut m = KernelMover::new(Arc::clone(&k), &st);
        // Two flows on different entries of queue 0 (round robin: even entries).
        let mut even = (1..=250u8).map(udp).filter(|f| c.classify(f).unwrap().0.is_multiple_of(2));
        let a = even.next().unwrap();
        let b = even.find(|f| c.classify(f).unwrap().0 != c.classify(&a).unwrap().0).unwrap();
        let (ra, rb) = (rule(&c, &a), rule(&c, &b));
        // a's rule takes the slot; the slot moves to queue 1, then a's entry follows it.
        let slot = st.install_flow_rule(ra).unwrap();
        st.pump(std::time::Instant::now());
        m.apply(&st).unwrap();
        assert_eq!(k.run_once(&a).unwrap(), 0, "a new rule changes no queue");
        complete(&st, &mut m, slot, 1);
        assert_eq!(k.run_once(&a).unwrap(), 1, "the slot moved");
        complete(&st, &mut m, ra.entry, 1);
        st.remove_flow_rule(slot).unwrap();
        m.apply(&st).unwrap();
        assert_eq!(k.run_once(&a).unwrap(), 1, "by its entry now");
        // b's rule reuses the slot: b stays on its entry's owner, queue 0.
        assert_eq!(st.install_flow_rule(rb).unwrap(), slot);
        st.pump(std::time::Instant::now());
        m.apply(&st).unwrap();
        assert_eq!(k.run_once(&b).unwrap(), 0, "the reused slot steers to b's entry's owner");
    }

    /// Not root: the program cannot load here.
    fn unprivileged() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1).is_none_or(|u| u != "0")))
            .unwrap_or(false)
    }
}

//! RETA moves under kernel steering: the control loop's half of the protocol in
//! [`flowplane_io::steered`]. Each control period it publishes the program's
//! per-(worker, key) frame counts to the steering table as the dispatcher does
//! (so RSS++ and Dyssect see their loads); whenever moves have landed it writes
//! the table into the program, waits for a grace period and publishes the
//! moves' switch time; a move whose state the new owner imported is retired.

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

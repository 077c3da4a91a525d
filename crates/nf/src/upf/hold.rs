//! Downlink packets a core holds for buffering FARs (TS 29.244 §5.2.4:
//! BUFF), and the queue of held packets to send again once their FAR
//! forwards.
//!
//! Packets are copied into one arena of fixed 2 KiB slots, taken at the
//! first packet held (one allocation per run, none per packet); slots link
//! into one list per FAR (arrival order) and one release queue. When a new
//! rule set comes in, [`Held::remap`] follows each FAR by (SEID, FAR ID):
//! a FAR still buffering keeps its list, one that forwards has its list
//! appended to the release queue, one that drops (or is gone) has its
//! packets discarded. Per session of the rule set in use the store counts
//! packets held and, of them, queued: a session with queued packets holds
//! its new downlink packets behind them (order kept across the switch).

use std::collections::HashMap;

use super::rules::{FarAction, RuleSet, NONE};

/// Bytes a slot keeps (a longer frame is not held).
pub const SLOT: usize = 2048;

/// A list of slots (head, tail, length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    /// First slot ([`NONE`]: empty).
    pub head: u32,
    /// Last slot.
    pub tail: u32,
    /// Slots in the list.
    pub n: u32,
}

impl Default for List {
    fn default() -> Self {
        List { head: NONE, tail: NONE, n: 0 }
    }
}

/// One core's held packets.
#[derive(Debug, Default)]
pub struct Held {
    arena: Vec<u8>,
    len: Vec<u16>,
    /// Each slot's packet time (when it was held).
    pub ts: Vec<u64>,
    next: Vec<u32>,
    /// Each slot's session: index in the rule set in use, and its SEID (to follow it).
    session: Vec<u32>,
    seid: Vec<u64>,
    free: Vec<u32>,
    /// Packets to send again, oldest first.
    pub queue: List,
    /// Per session of the rule set in use: packets held (lists and queue), and of them queued.
    held: Vec<u32>,
    queued: Vec<u32>,
    /// Per FAR of the rule set in use: its held packets.
    pub fars: Vec<List>,
}

impl Held {
    /// Packets session `s` holds.
    #[inline]
    pub fn held_of(&self, s: u32) -> u32 {
        self.held.get(s as usize).copied().unwrap_or(0)
    }

    /// Packets of session `s` in the release queue.
    #[inline]
    pub fn queued_of(&self, s: u32) -> u32 {
        self.queued.get(s as usize).copied().unwrap_or(0)
    }

    /// The slot after `k` in its list ([`NONE`]: the last).
    pub fn next_of(&self, k: u32) -> u32 {
        self.next[k as usize]
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.len.len() - self.free.len()
    }

    /// Copies `frame` (time `ts`, session `(index, SEID)`, FAR `far`) into a
    /// free slot, at the end of the FAR's list (or of the release queue when
    /// `queue`). False: too long, or no slot free among `total`.
    pub fn put(&mut self, frame: &[u8], ts: u64, (s, seid): (u32, u64), far: usize, queue: bool, total: u64) -> bool {
        if frame.len() > SLOT || far >= self.fars.len() || s as usize >= self.held.len() {
            return false;
        }
        if self.len.is_empty() && total > 0 {
            // The store, once per run (calloc'd: pages are touched as slots are used).
            let n = total as usize;
            self.arena = vec![0; n * SLOT];
            self.len = vec![0; n];
            self.ts = vec![0; n];
            self.next = vec![NONE; n];
            self.session = vec![0; n];
            self.seid = vec![0; n];
            self.free = (0..n as u32).rev().collect();
        }
        let Some(k) = self.free.pop() else { return false };
        let at = k as usize;
        self.arena[at * SLOT..at * SLOT + frame.len()].copy_from_slice(frame);
        (self.len[at], self.ts[at], self.session[at], self.seid[at]) = (frame.len() as u16, ts, s, seid);
        self.held[s as usize] += 1;
        if queue {
            self.queued[s as usize] += 1;
            push(&mut self.queue, &mut self.next, k);
        } else {
            push(&mut self.fars[far], &mut self.next, k);
        }
        true
    }

    /// The frame held in `slot`.
    pub fn frame(&self, slot: usize) -> &[u8] {
        &self.arena[slot * SLOT..slot * SLOT + usize::from(self.len[slot])]
    }

    /// The release queue's oldest slot and its session.
    pub fn front(&self) -> Option<(usize, u32)> {
        let k = self.queue.head;
        (k != NONE).then(|| (k as usize, self.session[k as usize]))
    }

    /// Frees the release queue's oldest slot.
    pub fn pop_front(&mut self) {
        if let Some(k) = pop(&mut self.queue, &self.next) {
            let s = self.session[k as usize] as usize;
            self.queued[s] = self.queued[s].saturating_sub(1);
            self.release(k);
        }
    }

    /// Frees FAR `far`'s packets held longer than `dur_ns` at `now`; how many.
    pub fn expire_far(&mut self, far: usize, now: u64, dur_ns: u64) -> u64 {
        let mut n = 0;
        while let Some(l) = self.fars.get(far).filter(|l| l.n > 0) {
            if now.saturating_sub(self.ts[l.head as usize]) <= dur_ns {
                break;
            }
            if let Some(k) = pop(&mut self.fars[far], &self.next) {
                self.release(k);
                n += 1;
            }
        }
        n
    }

    fn release(&mut self, k: u32) {
        let s = self.session[k as usize] as usize;
        if let Some(h) = self.held.get_mut(s) {
            *h = h.saturating_sub(1);
        }
        self.free.push(k);
    }

    /// Follows the held packets from rule set `old` to `new` (see the
    /// module doc); returns how many were discarded.
    pub fn remap(&mut self, old: &RuleSet, new: &RuleSet) -> u64 {
        let mut fars = vec![List::default(); new.fars.len()];
        let (mut held, mut queued) = (vec![0u32; new.sessions.len()], vec![0u32; new.sessions.len()]);
        if self.in_use() == 0 {
            (self.fars, self.held, self.queued) = (fars, held, queued);
            return 0;
        }
        let key = |rs: &RuleSet, i: usize| (rs.sessions[rs.fars[i].session as usize].seid, rs.fars[i].id);
        let new_far: HashMap<(u64, u32), usize> = (0..new.fars.len()).map(|i| (key(new, i), i)).collect();
        let new_session: HashMap<u64, u32> = new.sessions.iter().enumerate().map(|(i, s)| (s.seid, i as u32)).collect();
        let mut discarded = 0;
        let mut gone = Vec::new();
        // The queue first (its packets are older than any a FAR holds now), then each FAR's.
        let mut queue = List::default();
        let mut order = Vec::new();
        drain(self.queue, &self.next, &mut order);
        for k in order.drain(..) {
            match new_session.get(&self.seid[k as usize]) {
                Some(&s) => {
                    self.session[k as usize] = s;
                    (held[s as usize], queued[s as usize]) = (held[s as usize] + 1, queued[s as usize] + 1);
                    push(&mut queue, &mut self.next, k);
                }
                None => gone.push(k),
            }
        }
        for i in 0..self.fars.len().min(old.fars.len()) {
            let l = self.fars[i];
            if l.n == 0 {
                continue;
            }
            drain(l, &self.next, &mut order);
            let to = new_far.get(&key(old, i)).copied();
            let action = to.map(|j| new.fars[j].action);
            for k in order.drain(..) {
                let (Some(j), Some(&s)) = (to, new_session.get(&self.seid[k as usize])) else {
                    gone.push(k);
                    continue;
                };
                self.session[k as usize] = s;
                match action {
                    Some(FarAction::Buffer) => {
                        held[s as usize] += 1;
                        push(&mut fars[j], &mut self.next, k);
                    }
                    Some(FarAction::Forward) => {
                        (held[s as usize], queued[s as usize]) = (held[s as usize] + 1, queued[s as usize] + 1);
                        push(&mut queue, &mut self.next, k);
                    }
                    _ => gone.push(k),
                }
            }
        }
        for k in gone {
            self.free.push(k);
            discarded += 1;
        }
        (self.fars, self.held, self.queued, self.queue) = (fars, held, queued, queue);
        discarded
    }
}

/// The slots of `l` in order, into `out`.
fn drain(mut l: List, next: &[u32], out: &mut Vec<u32>) {
    while let Some(k) = pop(&mut l, next) {
        out.push(k);
    }
}

fn push(l: &mut List, next: &mut [u32], k: u32) {
    next[k as usize] = NONE;
    if l.n == 0 {
        l.head = k;
    } else {
        next[l.tail as usize] = k;
    }
    l.tail = k;
    l.n += 1;
}

fn pop(l: &mut List, next: &[u32]) -> Option<u32> {
    if l.n == 0 {
        return None;
    }
    let k = l.head;
    l.head = next[k as usize];
    l.n -= 1;
    if l.n == 0 {
        (l.head, l.tail) = (NONE, NONE);
    }
    Some(k)
}

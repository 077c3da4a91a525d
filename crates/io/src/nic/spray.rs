//! [`super::Mode::Spray`] and [`super::Mode::Sequenced`]: packets go round
//! robin by stream position (this queue's positions are `me`, `me + nq`,
//! ...), no table. Sequenced, the SCR sequencer sits in front: a packet
//! may be lost on its way to the core, and each delivered packet gets its
//! sequence number and history ([`ScrTap`]).

use flowplane_packet::{tsc, Batch, Line, PacketPool};
use flowplane_scale::steer::MAX_SCAN;

use super::{Desc, Ring, MAX_GATHER_LINES};
use crate::replay::QueueData;
use crate::scr::{ScrTap, Sequencer};
use crate::Rx;

/// The spray's state.
pub(super) struct Spray {
    /// Over queues that divide the loop: this queue's positions are the
    /// same in every loop, their packets copied contiguously (the ring's
    /// descriptors point into the copy).
    pub(super) sprayed: Option<QueueData>,
}

impl Spray {
    /// The spray of queue `r.me`, its packets copied when the queues divide the loop.
    pub(super) fn new(r: &Ring) -> Spray {
        let (n, nq) = (r.n, r.nq);
        let mut sprayed = None;
        if n > 0 && n % nq == 0 {
            let d = &r.trace.queues[0];
            let idx: Vec<u32> = (u64::from(r.me)..n).step_by(nq as usize).map(|i| i as u32).collect();
            let lines: usize = idx.iter().map(|&i| Line::count_for(d.len[i as usize] as usize)).sum();
            if lines <= MAX_GATHER_LINES {
                sprayed = d.gather(&idx);
            }
        }
        Spray { sprayed }
    }

    /// One burst: the due positions of this queue into the ring (through
    /// the sequencer's loss when `tap` is there), then the burst from its
    /// head (with the sequencer's histories).
    #[inline]
    pub(super) fn burst(
        &mut self,
        r: &mut Ring,
        pool: &mut PacketPool,
        batch: &mut Batch,
        want: usize,
        now: u64,
        mut tap: Option<&mut ScrTap>,
    ) -> Rx {
        let t0 = tsc::rdtsc();
        let tail0 = r.tail;
        let end = r.end.unwrap_or(u64::MAX).min(r.scan.saturating_add(MAX_SCAN));
        match tap.as_deref_mut() {
            Some(t) => t.lost += spray_to::<true>(r, Some(&t.seq), want, now, end),
            None => {
                spray_to::<false>(r, None, want, now, end);
            }
        }
        write_back(r, tail0, self.sprayed.as_ref());
        r.stats.nic_cycles += tsc::rdtsc().saturating_sub(t0);
        r.count_burst();
        let take = want.min((r.tail - r.head) as usize);
        if take == 0 {
            return r.empty(true);
        }
        let got = r.deliver(pool, batch, take, self.sprayed.as_ref());
        if let Some(tap) = tap {
            // The sequencer's work (stamping, prefixing the history): the
            // NIC's or the switch's, counted with the NIC's cycles.
            let t0 = tsc::rdtsc();
            let mask = r.entries.len() as u64 - 1;
            tap.clear();
            for k in 0..got {
                let e = r.entries[((r.head + k as u64) & mask) as usize];
                tap.attach_at(k, e >> 32, (e & 0xffff_ffff) as usize);
            }
            let c = tsc::rdtsc().saturating_sub(t0);
            tap.cycles += c;
            r.stats.nic_cycles += c;
        }
        r.advance(got)
    }
}

/// Walks this queue's positions from `scan` up to `claim` into the ring
/// (`SEQ`: each through `seq`'s loss): the packets lost on the way.
#[inline(always)]
fn spray_to<const SEQ: bool>(r: &mut Ring, seq: Option<&Sequencer>, want: usize, now: u64, claim: u64) -> u64 {
    let s = r.span(want, now, claim);
    let (paced, limit, target, due_ns) = (s.paced, s.limit, s.target, s.due_ns);
    let cap = r.entries.len() as u64;
    let mut pos = r.scan;
    let mut drops = 0u64;
    let mut lost = 0u64;
    let (n, nq) = (r.n, r.nq);
    while pos < limit && (paced || r.tail - r.head < target) {
        let loop_k = pos / n;
        let i0 = pos - loop_k * n;
        // Round robin by position: this queue's positions are me, me + nq, ...
        let (room, mask) = (cap - (r.tail - r.head), cap - 1);
        let mut k = 0;
        let mut i = i0;
        while i < n && pos + (i - i0) < limit && (paced || r.tail - r.head < target) {
            if due_ns != u64::MAX
                && loop_k.saturating_mul(r.trace.loop_ns).saturating_add(r.trace.queues[0].ts_at(i as usize)) > due_ns
            {
                break;
            }
            if SEQ && seq.is_some_and(|s| s.lost(loop_k * n + i + 1)) {
                // Lost between the sequencer and this core (injected).
                lost += 1;
                i += nq;
                continue;
            }
            if k < room {
                r.entries[(r.tail & mask) as usize] = (loop_k << 32) | i;
                r.tail += 1;
            } else {
                drops += 1;
            }
            k += 1;
            i += nq;
        }
        let stopped_early = i < n && pos + (i - i0) < limit;
        // Past the loop's end the next position continues in the next loop, same residue.
        pos += i - i0;
        if stopped_early {
            break;
        }
    }
    r.walked(pos, drops);
    lost
}

/// Writes the descriptors of the ring entries from `from` to the tail: a
/// position's packet in the own copy `sprayed` (every position of this
/// queue is `me` modulo the queues), the stream as the fallback. Once per
/// burst, out of line.
#[inline(never)]
fn write_back(r: &mut Ring, from: u64, sprayed: Option<&QueueData>) {
    let d = &r.trace.queues[0];
    let mask = r.entries.len() as u64 - 1;
    let (me, nq) = (u64::from(r.me), r.nq);
    // i / nq for 32-bit i as a multiply (Lemire's fastdiv: exact below 2^32).
    let magic = u128::from(u64::MAX / nq.max(1)) + 1;
    for t in from..r.tail {
        let at = (t & mask) as usize;
        let i = r.entries[at] & 0xffff_ffff;
        let j = ((magic * u128::from(i.wrapping_sub(me) & 0xffff_ffff)) >> 64) as u64;
        let own = sprayed.filter(|_| i >= me && j * nq == i - me).and_then(|m| {
            let j = j as usize;
            let (first_line, hash, len) = (*m.first_line.get(j)?, *m.hash.get(j)?, *m.len.get(j)?);
            Some(Desc { ts: m.ts_at(j), first_line, hash, len, own: true })
        });
        let i = i as usize;
        let shared = || {
            let (first_line, hash, len) = (*d.first_line.get(i)?, *d.hash.get(i)?, *d.len.get(i)?);
            Some(Desc { ts: d.ts_at(i), first_line, hash, len, own: false })
        };
        if let Some(w) = own.or_else(shared) {
            r.desc[at] = w;
        }
    }
}

//! Idle expiry (PNA's expiry timer) for the per-core table.
//!
//! Design: an **incremental sweep** over the slab, not a timer wheel. Each
//! entry already carries its last-seen time in the cache line that the lookup
//! fetches to verify the key, so touching a flow costs one store and no extra
//! cache miss; a timer wheel would relink the entry on every touch (extra lines
//! written per packet). The sweep walks the live bitmap from a cursor and looks
//! at no more than `budget` slab indices per call, so the work per batch is
//! bounded; an idle entry expires within `timeout + capacity/budget` calls'
//! worth of time after its last packet.
//!
//! Clocks that jump backwards: an entry whose last-seen time is in the future
//! (`last_seen > now`) is not expired; the sweep rebases its last-seen to `now`,
//! so after a backwards jump every entry gets a full timeout from the moment the
//! sweep sees it — nothing expires early, nothing stays forever, nothing panics
//! (all time arithmetic is saturating). A forwards jump expires every entry
//! idle longer than the timeout, as it should.

use crate::flow_table::{FlowTable, Handle};
use crate::key::FlowKey;

impl<K: FlowKey> FlowTable<K> {
    /// Examines at most `budget` slab indices (capped at the capacity) from the sweep cursor and removes every
    /// live entry idle for more than the table's timeout, calling `on_expire(handle, key, state)` first (e.g. to
    /// release a NAT port). Returns the number of entries expired; 0 when the table has no timeout.
    ///
    /// The budget is in entries of the table's capacity: the inline layout, which has about twice as many
    /// positions as its capacity, examines `budget x positions / capacity` of them, so that a full sweep still
    /// takes `capacity / budget` calls in either layout (an idle flow's expiry bound does not depend on it).
    pub fn expire(&mut self, now_ns: u64, budget: usize, mut on_expire: impl FnMut(Handle, &K, &[u8])) -> usize {
        let Some(timeout) = self.idle_timeout_ns else {
            return 0;
        };
        let cap = self.slab.capacity();
        let budget = if self.homes != 0 {
            (budget as u128 * u128::from(cap) / u128::from(self.max_len.max(1))).min(u128::from(cap)) as usize
        } else {
            budget
        };
        let mut remaining = budget.min(cap as usize) as u32;
        let mut cur = self.sweep_cursor;
        let mut expired = 0;
        while remaining > 0 {
            if cur >= cap {
                cur = 0;
            }
            let end = cur.saturating_add(remaining).min(cap);
            let Some(h) = self.slab.next_live(cur, end) else {
                remaining -= end - cur;
                cur = end;
                continue;
            };
            remaining -= h + 1 - cur;
            cur = h + 1;
            let seen = self.slab.last_seen(h);
            if seen > now_ns {
                // Clock went backwards: restart this entry's idle time instead of trusting either clock.
                self.slab.set_last_seen(h, now_ns);
            } else if now_ns - seen > timeout {
                // SAFETY: next_live returned h, so it is live.
                on_expire(h, unsafe { self.slab.key_unchecked(h) }, self.slab.state(h));
                if self.unlink(h) {
                    self.stats.expiries += 1;
                    expired += 1;
                }
            }
        }
        self.sweep_cursor = cur;
        expired
    }

    /// The table's idle timeout.
    pub fn idle_timeout_ns(&self) -> Option<u64> {
        self.idle_timeout_ns
    }
}

//! The batch: up to [`MAX_BATCH`] packets and their annotations, struct-of-arrays.
//!
//! Beside the buffers, a batch carries what the receive side delivers with
//! each packet — the RSS hash (as a NIC's `mbuf.hash.rss`) and the receive
//! timestamp — and the verdict (output port or [`DROP`]). What an executor
//! derives per packet (parsed headers, flow entries, shared-state handles)
//! lives in the executor's own scratch arrays, not here.
//! Dropping a packet only sets its verdict: the batch stays whole through the
//! chain (FAJITA's principle), and sinks free dropped buffers.

use std::sync::Arc;

use crate::pool::{PacketPool, PoolError, PoolMem};

/// One cache line of packet bytes: the unit of the replay arena and of RX copies.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

impl Line {
    /// A zeroed line.
    pub const ZERO: Line = Line([0; 64]);

    /// Number of lines needed for `len` bytes.
    #[inline(always)]
    pub fn count_for(len: usize) -> usize {
        len.div_ceil(64)
    }
}

/// Largest batch.
pub const MAX_BATCH: usize = 256;

/// Output port number or [`DROP`].
pub type Verdict = u16;

/// Verdict of a dropped packet.
pub const DROP: Verdict = u16::MAX;

/// Packet times of a receive burst that follow a rule (see [`Batch::rx_burst_lines_timed`]).
#[derive(Clone, Copy, Debug)]
pub enum RxTimes<'a> {
    /// Every packet at one time (a port's receive time).
    At(u64),
    /// Packet `k` at `first + k * step` (an evenly spaced replay).
    Even {
        /// Time of the burst's first packet.
        first: u64,
        /// Spacing.
        step: u64,
    },
    /// Packet `k` at `shift + ts[k]` (a replayed capture's own times, shifted by its loops).
    Shifted {
        /// Added to every time.
        shift: u64,
        /// One time per packet of the burst.
        ts: &'a [u64],
    },
}

/// A packet time the copy loop stores (`u64`) or leaves to a later pass (`NoTime`).
trait RxTime {
    fn store(self, slot: &mut u64);
}

impl RxTime for u64 {
    #[inline(always)]
    fn store(self, slot: &mut u64) {
        *slot = self;
    }
}

/// Times written after the copies.
struct NoTime;

impl RxTime for NoTime {
    #[inline(always)]
    fn store(self, _slot: &mut u64) {}
}

/// A batch of packets owned by one core.
pub struct Batch {
    mem: Arc<PoolMem>,
    len: usize,
    buf: [u32; MAX_BATCH],
    off: [u16; MAX_BATCH],
    pkt_len: [u16; MAX_BATCH],
    rss_hash: [u32; MAX_BATCH],
    verdict: [Verdict; MAX_BATCH],
    ts: [u64; MAX_BATCH],
    /// The largest of `ts[..ts_hint_len]`, kept by the receive paths that
    /// know it for free; [`Batch::max_timestamp`] uses it when `ts_hint_len`
    /// equals `len` (any other change to the times sets it to `usize::MAX`).
    ts_max: u64,
    ts_hint_len: usize,
}

/// A [`Batch`] split for a pass over its packets ([`Batch::lanes_mut`]):
/// the packets' data one at a time, beside their verdicts, lengths and times.
pub struct Lanes<'a> {
    mem: &'a PoolMem,
    buf: &'a [u32],
    off: &'a [u16],
    /// Packet lengths.
    pub lens: &'a [u16],
    /// Packet times (as [`Batch::timestamps`]).
    pub times: &'a [u64],
    /// Verdicts: output port or [`DROP`].
    pub verdicts: &'a mut [Verdict],
}

impl Lanes<'_> {
    /// Number of packets.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True if there is no packet.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Mutable data of packet `i` (panics if `i >= len()`, like slice indexing).
    #[inline(always)]
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        let (b, off, len) = (self.buf[i], self.off[i], self.lens[i]);
        // SAFETY: as in `Batch::data_mut`: position i < len of the batch these
        // parts were split from holds a buffer index from the pool's free list
        // (< count), owned by that batch, with off + len inside the buffer; the
        // batch is borrowed mutably for `'a` and `&mut self` makes this the only
        // reference into its buffers while the result lives.
        unsafe { std::slice::from_raw_parts_mut(self.mem.buf_ptr(b).add(off as usize), len as usize) }
    }
}

impl Batch {
    /// An empty batch bound to `pool`'s memory. Allocate once per worker, reuse forever.
    pub fn new(pool: &PacketPool) -> Box<Batch> {
        Batch::over(Arc::clone(&pool.mem))
    }

    /// An empty batch over `mem`.
    fn over(mem: Arc<PoolMem>) -> Box<Batch> {
        Box::new(Batch {
            mem,
            len: 0,
            buf: [0; MAX_BATCH],
            off: [0; MAX_BATCH],
            pkt_len: [0; MAX_BATCH],
            rss_hash: [0; MAX_BATCH],
            verdict: [0; MAX_BATCH],
            ts: [0; MAX_BATCH],
            ts_max: 0,
            ts_hint_len: 0,
        })
    }

    /// Number of packets (dropped ones included until [`Batch::compact`] or a sink).
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the batch holds no packet.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Packets that still fit.
    #[inline(always)]
    pub fn room(&self) -> usize {
        MAX_BATCH - self.len
    }

    /// Appends a fresh buffer from `pool` holding a copy of `frame` (with the
    /// pool's headroom in front), verdict 0, hash 0. Returns `false` — and
    /// leaves the batch unchanged — if the batch is full, the pool is empty
    /// or the frame does not fit the buffer; callers count that as a drop.
    #[inline(always)]
    pub fn push_copy(&mut self, pool: &mut PacketPool, frame: &[u8], ts: u64) -> bool {
        if self.len == MAX_BATCH || frame.len() > pool.data_room() || !pool.same_pool(&self.mem) {
            return false;
        }
        let Some(idx) = pool.pop() else { return false };
        let head = self.mem.headroom;
        // SAFETY: idx came off the free list, so idx < count (buf_ptr's contract)
        // and this batch now owns the buffer exclusively; head + frame.len() <=
        // buf_size was checked above.
        unsafe {
            let dst = self.mem.buf_ptr(idx).add(head);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len());
        }
        let i = self.len;
        self.buf[i] = idx;
        self.off[i] = head as u16;
        self.pkt_len[i] = frame.len() as u16;
        self.rss_hash[i] = 0;
        self.verdict[i] = 0;
        self.ts[i] = ts;
        self.len = i + 1;
        self.ts_hint_len = usize::MAX;
        true
    }

    /// Replay/NIC fast path: appends a buffer and copies the packet in whole
    /// cache lines. `lines` covers the packet (`pkt_len <= 64 * lines.len()`),
    /// as the replay arena stores it; fixed-size line copies avoid a `memcpy`
    /// call per packet. `hash` is the flow hash a NIC would deliver (RSS).
    #[inline(always)]
    pub fn push_lines(&mut self, pool: &mut PacketPool, lines: &[Line], pkt_len: u16, hash: u32, ts: u64) -> bool {
        let bytes = lines.len() * 64;
        if self.len == MAX_BATCH || pkt_len as usize > bytes || bytes > pool.data_room() || !pool.same_pool(&self.mem) {
            return false;
        }
        let Some(idx) = pool.pop() else { return false };
        let head = self.mem.headroom;
        // SAFETY: as in `push_copy`: idx < count and exclusively owned (it came
        // off the free list), and head + 64 * lines.len() <= buf_size was checked above.
        unsafe {
            let dst = self.mem.buf_ptr(idx).add(head) as *mut Line;
            for (k, l) in lines.iter().enumerate() {
                dst.add(k).write_unaligned(*l);
            }
        }
        let i = self.len;
        self.buf[i] = idx;
        self.off[i] = head as u16;
        self.pkt_len[i] = pkt_len;
        self.rss_hash[i] = hash;
        self.verdict[i] = 0;
        self.ts[i] = ts;
        self.len = i + 1;
        self.ts_hint_len = usize::MAX;
        true
    }

    /// Receive fast path (a NIC's RX burst): appends `n` packets at once.
    /// `fill(k)` returns packet `k`'s lines, length, flow hash and packet
    /// time. Buffers come from `pool` in one bulk take.
    /// Returns how many were appended: `n`, clipped to the batch's room and
    /// to the buffers the pool has (a shortfall is counted by the pool).
    /// A packet whose length exceeds its lines or the buffer is replaced by
    /// an empty, dropped packet rather than copied out of bounds.
    #[inline]
    pub fn rx_burst_lines<'l>(
        &mut self,
        pool: &mut PacketPool,
        n: usize,
        fill: impl FnMut(usize) -> (&'l [Line], u16, u32, u64),
    ) -> usize {
        self.rx_lines(pool, n, fill).1
    }

    /// [`Batch::rx_burst_lines`] for a run of packets whose times follow a
    /// rule ([`RxTimes`]): `fill(k)` returns lines, length and hash, and the
    /// times are written in one pass after the copies (a loop the compiler
    /// vectorises, instead of a time computed beside every copy).
    #[inline]
    pub fn rx_burst_lines_timed<'l>(
        &mut self,
        pool: &mut PacketPool,
        n: usize,
        times: RxTimes<'_>,
        fill: impl FnMut(usize) -> (&'l [Line], u16, u32),
    ) -> usize {
        let mut fill = fill;
        let hinted = self.ts_hint_len == self.len;
        let (start, n) = self.rx_lines(pool, n, |k| {
            let (lines, len, hash) = fill(k);
            (lines, len, hash, NoTime)
        });
        if n == 0 {
            if hinted {
                self.ts_hint_len = self.len;
            }
            return 0;
        }
        let dst = &mut self.ts[start..start + n];
        let max = match times {
            RxTimes::At(t) => {
                dst.fill(t);
                t
            }
            RxTimes::Even { first, step } => {
                for (k, t) in dst.iter_mut().enumerate() {
                    *t = first.saturating_add(k as u64 * step);
                }
                first.saturating_add((n as u64 - 1) * step)
            }
            RxTimes::Shifted { shift, ts } => {
                // A short slice (a caller's bug) leaves the rest at `shift`, never reads past it.
                for (t, &s) in dst.iter_mut().zip(ts) {
                    *t = shift.saturating_add(s);
                }
                if let Some(rest) = dst.get_mut(ts.len()..) {
                    rest.fill(shift);
                }
                dst.iter().fold(0, |a, &t| a.max(t))
            }
        };
        if hinted {
            self.ts_max = self.ts_max.max(max);
            self.ts_hint_len = self.len;
        }
        n
    }

    /// The copy loop of both receive paths; returns where the new packets start and how many.
    #[inline(always)]
    fn rx_lines<'l, T: RxTime>(
        &mut self,
        pool: &mut PacketPool,
        n: usize,
        mut fill: impl FnMut(usize) -> (&'l [Line], u16, u32, T),
    ) -> (usize, usize) {
        let mut n = n.min(MAX_BATCH - self.len);
        let start = self.len;
        if !pool.same_pool(&self.mem) {
            return (start, 0);
        }
        if pool.available() < n {
            pool.note_shortfall();
            n = pool.available();
        }
        if n == 0 || !pool.pop_bulk(&mut self.buf[start..start + n]) {
            return (start, 0);
        }
        let head = self.mem.headroom;
        let max_lines = (self.mem.ceil - head) / 64;
        for k in 0..n {
            let i = start + k;
            let (lines, len, hash, ts) = fill(k);
            let ok = lines.len() <= max_lines && len as usize <= lines.len() * 64;
            if ok {
                // SAFETY: buf[i] was just taken from the free list, so it is < count
                // and this batch owns it exclusively; head + 64 * lines.len() <= buf_size.
                unsafe {
                    let dst = self.mem.buf_ptr(self.buf[i]).add(head) as *mut Line;
                    for (j, l) in lines.iter().enumerate() {
                        dst.add(j).write_unaligned(*l);
                    }
                }
            }
            self.off[i] = head as u16;
            self.pkt_len[i] = if ok { len } else { 0 };
            self.rss_hash[i] = hash;
            self.verdict[i] = if ok { 0 } else { DROP };
            ts.store(&mut self.ts[i]);
        }
        self.len = start + n;
        self.ts_hint_len = usize::MAX;
        (start, n)
    }

    /// Receive from a device that wrote into a lent buffer (AF_XDP RX ring):
    /// buffer `idx` holds the packet at `off..off + len`. The buffer must be
    /// lent (checked: it leaves the "in device" state and this batch owns it).
    /// Returns false — and the buffer stays as it was — if the batch is full,
    /// `idx` was not lent or the packet does not fit the buffer; a caller
    /// that gets false for a lent buffer should reclaim it and count a drop.
    #[inline(always)]
    pub fn push_from_device(
        &mut self,
        pool: &mut PacketPool,
        idx: u32,
        off: u16,
        len: u16,
        hash: u32,
        ts: u64,
    ) -> bool {
        if self.len == MAX_BATCH
            || (off as usize) < self.mem.floor
            || off as usize + len as usize > self.mem.ceil
            || !pool.same_pool(&self.mem)
            || !pool.take_lent(idx)
        {
            return false;
        }
        let i = self.len;
        self.buf[i] = idx;
        self.off[i] = off;
        self.pkt_len[i] = len;
        self.rss_hash[i] = hash;
        self.verdict[i] = 0;
        self.ts[i] = ts;
        self.len = i + 1;
        self.ts_hint_len = usize::MAX;
        true
    }

    /// Transmit by lending (AF_XDP TX ring): offers every live packet, in
    /// order, as `give(verdict, region_offset_of_data, len)`; a packet the
    /// device took (`true`) becomes "in device" until the device completes it
    /// ([`PacketPool::reclaim`]); one it refused and every dropped packet are
    /// freed. Empties the batch; returns (lent, refused, dropped).
    pub fn lend_to_device(
        &mut self,
        pool: &mut PacketPool,
        mut give: impl FnMut(Verdict, u64, u16) -> bool,
    ) -> Result<(usize, usize, usize), PoolError> {
        if !pool.same_pool(&self.mem) {
            return Err(PoolError::ForeignBatch);
        }
        let (mut lent, mut refused, mut dropped) = (0, 0, 0);
        for i in 0..self.len {
            let idx = self.buf[i];
            if self.verdict[i] == DROP {
                dropped += 1;
                pool.push(idx);
                continue;
            }
            let addr = idx as u64 * self.mem.buf_size as u64 + self.off[i] as u64;
            if give(self.verdict[i], addr, self.pkt_len[i]) {
                lent += 1;
                pool.mark_lent(idx);
            } else {
                refused += 1;
                pool.push(idx);
            }
        }
        self.empty();
        Ok((lent, refused, dropped))
    }

    /// Bulk receive from a device that wrote into lent buffers (a DPDK RX
    /// burst), without a per-packet call: `fill` writes up to `max` packets
    /// straight into the batch's free slots — buffer index, data offset in
    /// the buffer, length, flow hash; each slice is as long as the room it
    /// may use — and returns how many it wrote. Each is then checked as
    /// [`Batch::push_from_device`] checks one (lent, data within the
    /// buffer's floor..ceil): one that fails is left out, order kept, and
    /// its index handed to `reject` (a lent one is still lent: the caller
    /// reclaims it and counts a drop). Appended packets get verdict 0 and
    /// time `ts`. Returns how many were appended (0, `fill` not called, for
    /// a foreign pool).
    #[inline]
    pub fn rx_from_device(
        &mut self,
        pool: &mut PacketPool,
        max: usize,
        ts: u64,
        fill: impl FnOnce(&mut [u32], &mut [u16], &mut [u16], &mut [u32]) -> usize,
        mut reject: impl FnMut(u32),
    ) -> usize {
        if !pool.same_pool(&self.mem) {
            return 0;
        }
        let start = self.len;
        let end = start + max.min(MAX_BATCH - start);
        let n = fill(
            &mut self.buf[start..end],
            &mut self.off[start..end],
            &mut self.pkt_len[start..end],
            &mut self.rss_hash[start..end],
        )
        .min(end - start);
        let (floor, ceil) = (self.mem.floor, self.mem.ceil);
        let mut w = start;
        for r in start..start + n {
            let (idx, off, len) = (self.buf[r], self.off[r], self.pkt_len[r]);
            if (off as usize) < floor || off as usize + len as usize > ceil || !pool.clear_lent(idx) {
                reject(idx);
                continue;
            }
            if w != r {
                self.buf[w] = idx;
                self.off[w] = off;
                self.pkt_len[w] = len;
                self.rss_hash[w] = self.rss_hash[r];
            }
            w += 1;
        }
        pool.note_taken(w - start);
        self.verdict[start..w].fill(0);
        self.ts[start..w].fill(ts);
        self.len = w;
        self.ts_hint_len = usize::MAX;
        w - start
    }

    /// Bulk transmit in place (a DPDK TX burst): frees the dropped packets'
    /// buffers, marks every live one lent to the device and hands `give`
    /// their buffer indices, data offsets and lengths, in order. The device
    /// owns them all from then on: what it cannot send it keeps on its own
    /// free list (a mempool) until it hands them out again
    /// ([`Batch::rx_from_device`]). Empties the batch; returns `give`'s
    /// result and how many dropped packets were freed.
    #[inline]
    pub fn lend_all_to_device<R>(
        &mut self,
        pool: &mut PacketPool,
        give: impl FnOnce(&[u32], &[u16], &[u16]) -> R,
    ) -> Result<(R, usize), PoolError> {
        if !pool.same_pool(&self.mem) {
            return Err(PoolError::ForeignBatch);
        }
        // One branch-free pass finds drops (none on a forward's path).
        let dropped = if self.verdicts().iter().fold(false, |d, &v| d | (v == DROP)) { self.compact(pool)? } else { 0 };
        let n = self.len;
        pool.mark_lent_bulk(&self.buf[..n]);
        let r = give(&self.buf[..n], &self.off[..n], &self.pkt_len[..n]);
        self.empty();
        Ok((r, dropped))
    }

    /// Packet data of packet `i` (panics if `i >= len()`, like slice indexing).
    #[inline(always)]
    pub fn data(&self, i: usize) -> &[u8] {
        assert!(i < self.len);
        // SAFETY: position i < len holds a buffer index from the pool's free list
        // (< count), owned by this batch; off + len stays within the buffer
        // (maintained by every mutator).
        unsafe {
            std::slice::from_raw_parts(
                self.mem.buf_ptr(self.buf[i]).add(self.off[i] as usize),
                self.pkt_len[i] as usize,
            )
        }
    }

    /// Mutable packet data of packet `i`.
    #[inline(always)]
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.len);
        // SAFETY: as in `data`; `&mut self` guarantees no other reference
        // into this batch's buffers is alive.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem.buf_ptr(self.buf[i]).add(self.off[i] as usize),
                self.pkt_len[i] as usize,
            )
        }
    }

    /// The batch split for one pass over its packets: each packet's data
    /// (mutable, one packet at a time), the verdicts (mutable), the lengths
    /// and the times (read-only), every part exactly `len()` long. An NF
    /// stage's loop reads a packet's time and writes its verdict around the
    /// action without going back through `&mut Batch` (one bounds check per
    /// part instead of one per access).
    #[inline(always)]
    pub fn lanes_mut(&mut self) -> Lanes<'_> {
        let n = self.len;
        Lanes {
            mem: &self.mem,
            buf: &self.buf[..n],
            off: &self.off[..n],
            lens: &self.pkt_len[..n],
            times: &self.ts[..n],
            verdicts: &mut self.verdict[..n],
        }
    }

    /// Prepends `n` bytes of headroom to packet `i` (e.g. an encapsulation
    /// header) and returns the new data. `None` if the headroom is too small.
    pub fn prepend(&mut self, i: usize, n: usize) -> Option<&mut [u8]> {
        assert!(i < self.len);
        if n + self.mem.floor > self.off[i] as usize {
            return None;
        }
        self.off[i] -= n as u16;
        self.pkt_len[i] += n as u16;
        Some(self.data_mut(i))
    }

    /// Strips `n` bytes from the front of packet `i` (decapsulation).
    /// Returns `false` if the packet is shorter than `n`.
    pub fn adj(&mut self, i: usize, n: usize) -> bool {
        assert!(i < self.len);
        if n > self.pkt_len[i] as usize {
            return false;
        }
        self.off[i] += n as u16;
        self.pkt_len[i] -= n as u16;
        true
    }

    /// Sets the length of packet `i` (trim or grow into the tailroom).
    /// Returns `false` if it would exceed the buffer.
    pub fn set_len(&mut self, i: usize, len: usize) -> bool {
        assert!(i < self.len);
        if self.off[i] as usize + len > self.mem.ceil {
            return false;
        }
        self.pkt_len[i] = len as u16;
        true
    }

    /// Packet lengths.
    #[inline(always)]
    pub fn lens(&self) -> &[u16] {
        &self.pkt_len[..self.len]
    }

    /// RSS hashes the receive side delivered (one per packet; 0 when it gave none).
    #[inline(always)]
    pub fn rss_hashes(&self) -> &[u32] {
        &self.rss_hash[..self.len]
    }

    /// Mutable RSS hashes (for sources that compute them in software).
    #[inline(always)]
    pub fn rss_hashes_mut(&mut self) -> &mut [u32] {
        &mut self.rss_hash[..self.len]
    }

    /// Verdicts: output port or [`DROP`].
    #[inline(always)]
    pub fn verdicts(&self) -> &[Verdict] {
        &self.verdict[..self.len]
    }

    /// Mutable verdicts.
    #[inline(always)]
    pub fn verdicts_mut(&mut self) -> &mut [Verdict] {
        &mut self.verdict[..self.len]
    }

    /// Packet times in ns, as the source sets them: a replayed capture's own
    /// timestamps (after its first packet), or the receive time on a port.
    /// NFs run on this clock.
    #[inline(always)]
    pub fn timestamps(&self) -> &[u64] {
        &self.ts[..self.len]
    }

    /// Mutable timestamps.
    #[inline(always)]
    pub fn timestamps_mut(&mut self) -> &mut [u64] {
        self.ts_hint_len = usize::MAX;
        &mut self.ts[..self.len]
    }

    /// The latest packet time in the batch (0 when empty): a receive path
    /// that knows it (an evenly spaced replay) saves the pass over the times.
    #[inline]
    pub fn max_timestamp(&self) -> u64 {
        if self.ts_hint_len == self.len {
            debug_assert_eq!(self.ts_max, self.timestamps().iter().fold(0, |a, &t| a.max(t)));
            return self.ts_max;
        }
        self.timestamps().iter().fold(0, |a, &t| a.max(t))
    }

    /// No packets (their buffers already handed on); the times' hint restarts.
    #[inline(always)]
    fn empty(&mut self) {
        self.len = 0;
        self.ts_max = 0;
        self.ts_hint_len = 0;
    }

    /// Marks packet `i` dropped.
    #[inline(always)]
    pub fn drop_packet(&mut self, i: usize) {
        self.verdict[..self.len][i] = DROP;
    }

    /// True if packet `i` is dropped.
    #[inline(always)]
    pub fn is_dropped(&self, i: usize) -> bool {
        self.verdict[..self.len][i] == DROP
    }

    /// Number of packets not dropped.
    pub fn live(&self) -> usize {
        self.verdicts().iter().filter(|&&v| v != DROP).count()
    }

    /// Frees dropped packets' buffers and closes the gaps, keeping order.
    /// Returns how many were removed.
    pub fn compact(&mut self, pool: &mut PacketPool) -> Result<usize, PoolError> {
        if !pool.same_pool(&self.mem) {
            return Err(PoolError::ForeignBatch);
        }
        let mut w = 0;
        for r in 0..self.len {
            if self.verdict[r] == DROP {
                pool.push(self.buf[r]);
                continue;
            }
            if w != r {
                self.buf[w] = self.buf[r];
                self.off[w] = self.off[r];
                self.pkt_len[w] = self.pkt_len[r];
                self.rss_hash[w] = self.rss_hash[r];
                self.verdict[w] = self.verdict[r];
                self.ts[w] = self.ts[r];
            }
            w += 1;
        }
        let removed = self.len - w;
        if removed > 0 {
            self.len = w;
            self.ts_hint_len = usize::MAX;
        }
        Ok(removed)
    }

    /// Returns every buffer to `pool` and empties the batch.
    #[inline]
    pub fn free_all(&mut self, pool: &mut PacketPool) -> Result<(), PoolError> {
        if !pool.same_pool(&self.mem) {
            return Err(PoolError::ForeignBatch);
        }
        pool.push_bulk(&self.buf[..self.len]);
        self.empty();
        Ok(())
    }
}

/// Why [`Batch::split_into`] or [`Batch::join_from`] refused (nothing moved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitError {
    /// A part is bound to another pool's memory.
    ForeignPart,
    /// A part was not empty before a split.
    PartNotEmpty,
    /// A lane number names no part, or fewer lanes than packets were given.
    BadLane,
    /// A join found a part's packet count different from its lanes' (or the batch not empty).
    Mismatch,
}

impl Batch {
    /// An empty batch bound to the same pool memory as `self` (a part for
    /// [`Batch::split_into`]). Allocates: create parts once, reuse them.
    pub fn sibling(&self) -> Box<Batch> {
        Batch::over(Arc::clone(&self.mem))
    }

    /// True if `other` holds buffers of the same pool memory.
    #[inline]
    pub fn same_memory(&self, other: &Batch) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }

    /// Moves packet `i` (buffer ownership with its annotations) to the part
    /// `parts[lane[i]]`, in order, leaving this batch empty: a branch point's
    /// sub-batches (VPP's `nexts[]`). Every packet stays owned by exactly one
    /// batch. Undo with [`Batch::join_from`] and the same lanes. Nothing
    /// allocates; on an error nothing moved.
    pub fn split_into(&mut self, lane: &[u8], parts: &mut [Box<Batch>]) -> Result<(), SplitError> {
        let n = self.len;
        if lane.len() < n || lane[..n].iter().any(|&l| l as usize >= parts.len()) {
            return Err(SplitError::BadLane);
        }
        for p in parts.iter() {
            if !self.same_memory(p) {
                return Err(SplitError::ForeignPart);
            }
            if p.len != 0 {
                return Err(SplitError::PartNotEmpty);
            }
        }
        for (i, &l) in lane[..n].iter().enumerate() {
            let p = &mut parts[l as usize];
            let k = p.len;
            p.buf[k] = self.buf[i];
            p.off[k] = self.off[i];
            p.pkt_len[k] = self.pkt_len[i];
            p.rss_hash[k] = self.rss_hash[i];
            p.verdict[k] = self.verdict[i];
            p.ts[k] = self.ts[i];
            p.len = k + 1;
        }
        for p in parts.iter_mut() {
            p.ts_hint_len = usize::MAX;
        }
        self.empty();
        Ok(())
    }

    /// Takes the packets [`Batch::split_into`] spread over `parts` back in
    /// their original order (`lane` as given to the split), with whatever
    /// their parts changed (verdicts, lengths, times), leaving the parts
    /// empty. This batch must be empty. On an error nothing moved.
    pub fn join_from(&mut self, lane: &[u8], parts: &mut [Box<Batch>]) -> Result<(), SplitError> {
        let total: usize = parts.iter().map(|p| p.len).sum();
        if self.len != 0 || lane.len() < total {
            return Err(SplitError::Mismatch);
        }
        let mut counts = [0usize; 256];
        for &l in &lane[..total] {
            if l as usize >= parts.len() {
                return Err(SplitError::BadLane);
            }
            counts[l as usize] += 1;
        }
        for (k, p) in parts.iter().enumerate() {
            if !self.same_memory(p) {
                return Err(SplitError::ForeignPart);
            }
            if counts[k] != p.len {
                return Err(SplitError::Mismatch);
            }
        }
        let mut at = [0usize; 256];
        for (i, &l) in lane[..total].iter().enumerate() {
            let p = &parts[l as usize];
            let k = at[l as usize];
            at[l as usize] = k + 1;
            self.buf[i] = p.buf[k];
            self.off[i] = p.off[k];
            self.pkt_len[i] = p.pkt_len[k];
            self.rss_hash[i] = p.rss_hash[k];
            self.verdict[i] = p.verdict[k];
            self.ts[i] = p.ts[k];
        }
        self.len = total;
        self.ts_hint_len = usize::MAX;
        for p in parts.iter_mut() {
            p.empty();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolConfig;

    #[test]
    fn split_and_join_keep_order_and_ownership() {
        let mut pool = PacketPool::new(PoolConfig { buffers: 16, ..Default::default() }).unwrap();
        let mut b = Batch::new(&pool);
        for k in 0..6u8 {
            assert!(b.push_copy(&mut pool, &[k; 60], u64::from(k)));
        }
        let lane = [1u8, 0, 1, 2, 0, 1];
        let mut parts = vec![b.sibling(), b.sibling(), b.sibling()];
        b.split_into(&lane, &mut parts).unwrap();
        assert!(b.is_empty());
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![2, 3, 1]);
        // Per-lane order is the original order.
        assert_eq!(parts[1].timestamps(), &[0, 2, 5]);
        assert_eq!(parts[1].data(2)[0], 5);
        parts[1].drop_packet(1);
        parts[2].verdicts_mut()[0] = 7;
        b.join_from(&lane, &mut parts).unwrap();
        assert!(parts.iter().all(|p| p.is_empty()));
        assert_eq!(b.timestamps(), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(b.verdicts(), &[0, 0, DROP, 7, 0, 0]);
        assert!((0..6).all(|k| b.data(k)[0] == k as u8));
        // Errors move nothing.
        let mut bad = vec![b.sibling()];
        assert_eq!(b.split_into(&lane, &mut bad), Err(SplitError::BadLane));
        assert_eq!(b.len(), 6);
        let other = PacketPool::new(PoolConfig { buffers: 4, ..Default::default() }).unwrap();
        let mut foreign = vec![Batch::new(&other), b.sibling(), b.sibling()];
        assert_eq!(b.split_into(&lane, &mut foreign), Err(SplitError::ForeignPart));
        b.free_all(&mut pool).unwrap();
        assert_eq!(pool.stats().free, 16);
    }

    fn pool(n: usize) -> PacketPool {
        PacketPool::new(PoolConfig { buffers: n, ..PoolConfig::default() }).unwrap()
    }

    #[test]
    fn push_read_free() {
        let mut p = pool(8);
        let mut b = Batch::new(&p);
        assert!(b.push_copy(&mut p, &[1, 2, 3], 7));
        assert!(b.push_copy(&mut p, &[4; 100], 8));
        assert_eq!(b.len(), 2);
        assert_eq!(b.data(0), &[1, 2, 3]);
        assert_eq!(b.data(1), &[4; 100][..]);
        assert_eq!(b.timestamps(), &[7, 8]);
        b.data_mut(0)[0] = 9;
        assert_eq!(b.data(0)[0], 9);
        assert_eq!(p.stats().free, 6);
        b.free_all(&mut p).unwrap();
        assert_eq!(p.stats().free, 8);
        assert!(b.is_empty());
    }

    #[test]
    fn lanes_reach_the_same_packets_and_verdicts() {
        let mut p = pool(8);
        let mut b = Batch::new(&p);
        assert!(b.push_copy(&mut p, &[1, 2, 3], 7));
        assert!(b.push_copy(&mut p, &[4; 100], 8));
        assert!(b.adj(1, 10), "an offset other than the headroom");
        {
            let mut l = b.lanes_mut();
            assert_eq!((l.len(), l.is_empty()), (2, false));
            assert_eq!(l.lens, &[3, 90]);
            assert_eq!(l.times, &[7, 8]);
            assert_eq!(l.data_mut(0), &[1, 2, 3]);
            assert_eq!(l.data_mut(1), &[4; 90][..]);
            l.data_mut(1)[0] = 5;
            l.verdicts[0] = DROP;
            l.verdicts[1] = 3;
        }
        assert_eq!(b.data(1)[0], 5);
        assert!(b.is_dropped(0));
        assert_eq!(b.verdicts(), &[DROP, 3]);
        b.free_all(&mut p).unwrap();
        assert!(b.lanes_mut().is_empty());
    }

    #[test]
    fn pool_exhaustion_is_counted_not_fatal() {
        let mut p = pool(2);
        let mut b = Batch::new(&p);
        assert!(b.push_copy(&mut p, &[0; 64], 0));
        assert!(b.push_copy(&mut p, &[0; 64], 0));
        assert!(!b.push_copy(&mut p, &[0; 64], 0));
        assert_eq!(p.stats().alloc_failures, 1);
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn oversized_frame_refused() {
        let mut p = pool(2);
        let mut b = Batch::new(&p);
        let big = vec![0u8; p.data_room() + 1];
        assert!(!b.push_copy(&mut p, &big, 0));
        let room = p.data_room();
        assert!(b.push_copy(&mut p, &big[..room], 0));
    }

    #[test]
    fn batch_full() {
        let mut p = pool(MAX_BATCH + 4);
        let mut b = Batch::new(&p);
        for _ in 0..MAX_BATCH {
            assert!(b.push_copy(&mut p, &[1], 0));
        }
        assert!(!b.push_copy(&mut p, &[1], 0));
        assert_eq!(b.room(), 0);
    }

    #[test]
    fn foreign_pool_rejected() {
        let mut p1 = pool(4);
        let mut p2 = pool(4);
        let mut b = Batch::new(&p1);
        assert!(b.push_copy(&mut p1, &[1], 0));
        assert!(!b.push_copy(&mut p2, &[1], 0));
        assert_eq!(b.free_all(&mut p2), Err(PoolError::ForeignBatch));
        assert_eq!(b.compact(&mut p2), Err(PoolError::ForeignBatch));
        b.free_all(&mut p1).unwrap();
    }

    #[test]
    fn drop_and_compact_keep_order() {
        let mut p = pool(8);
        let mut b = Batch::new(&p);
        for i in 0..5u8 {
            assert!(b.push_copy(&mut p, &[i], i as u64));
        }
        b.drop_packet(1);
        b.drop_packet(3);
        assert_eq!(b.live(), 3);
        assert_eq!(b.compact(&mut p).unwrap(), 2);
        let firsts: Vec<u8> = (0..b.len()).map(|i| b.data(i)[0]).collect();
        assert_eq!(firsts, vec![0, 2, 4]);
        assert_eq!(b.timestamps(), &[0, 2, 4]);
        assert_eq!(p.stats().free, 5);
    }

    #[test]
    fn headroom_prepend_and_adj() {
        let mut p = pool(2);
        let mut b = Batch::new(&p);
        assert!(b.push_copy(&mut p, &[1, 2, 3, 4], 0));
        let d = b.prepend(0, 8).unwrap();
        assert_eq!(d.len(), 12);
        d[..8].copy_from_slice(&[9; 8]);
        assert_eq!(&b.data(0)[8..], &[1, 2, 3, 4]);
        assert!(b.prepend(0, crate::DEFAULT_HEADROOM).is_none());
        assert!(b.adj(0, 8));
        assert_eq!(b.data(0), &[1, 2, 3, 4]);
        assert!(!b.adj(0, 5));
        assert!(b.set_len(0, 2));
        assert_eq!(b.data(0), &[1, 2]);
        assert!(!b.set_len(0, 4096));
    }

    #[test]
    fn block_copy() {
        let mut p = pool(2);
        let mut b = Batch::new(&p);
        let mut lines = [Line::ZERO; 2];
        for i in 0..128 {
            lines[i / 64].0[i % 64] = i as u8;
        }
        assert!(b.push_lines(&mut p, &lines, 100, 0xabcd, 5));
        let expect: Vec<u8> = (0..100).collect();
        assert_eq!(b.data(0), &expect[..]);
        assert_eq!(b.rss_hashes(), &[0xabcd]);
        assert!(!b.push_lines(&mut p, &lines[..1], 65, 0, 0), "pkt_len beyond the lines");
        assert_eq!(Line::count_for(64), 1);
        assert_eq!(Line::count_for(65), 2);
    }

    #[test]
    fn rx_burst_lines_bulk() {
        let mut p = pool(40);
        let mut b = Batch::new(&p);
        let lines = [Line([7; 64]), Line([8; 64])];
        let n = b.rx_burst_lines(&mut p, 30, |k| (&lines[..1 + k % 2], 60 + k as u16, k as u32, 9));
        assert_eq!(n, 30);
        assert_eq!(p.available(), 10);
        assert_eq!(b.data(1).len(), 61);
        assert_eq!(b.data(1), &[7; 61][..]);
        assert_eq!(b.data(0), &[7; 60][..]);
        assert_eq!(b.rss_hashes()[5], 5);
        assert_eq!(b.timestamps()[29], 9);
        // A length beyond its lines becomes an empty dropped packet, not an overread.
        assert_eq!(b.rx_burst_lines(&mut p, 1, |_| (&lines[..1], 200, 0, 0)), 1);
        assert!(b.is_dropped(30));
        assert_eq!(b.data(30).len(), 0);
        // Not enough buffers: what the pool has, shortfall counted.
        assert_eq!(b.rx_burst_lines(&mut p, 20, |_| (&lines[..1], 60, 0, 0)), 9);
        assert_eq!(p.stats().alloc_failures, 1);
        assert_eq!(b.rx_burst_lines(&mut p, 20, |_| (&lines[..1], 60, 0, 0)), 0);
        b.free_all(&mut p).unwrap();
        assert_eq!(p.available(), 40);
    }

    #[test]
    fn device_lend_and_reclaim() {
        let mut p = pool(8);
        let mut b = Batch::new(&p);
        let mut fill = [0u32; 4];
        assert_eq!(p.lend(&mut fill), 4);
        assert_eq!(p.stats().in_device, 4);
        assert_eq!(p.stats().free, 4);
        assert_eq!(p.region().0 as usize % crate::pool::REGION_ALIGN, 0);
        // The device filled fill[0]: it comes back into the batch, owned.
        let a = p.addr_of(fill[0]).unwrap();
        assert_eq!(p.index_of(a + 200), Some(fill[0]));
        assert!(b.push_from_device(&mut p, fill[0], 256, 60, 7, 9));
        assert_eq!(b.data(0).len(), 60);
        // Not lent (any more, or never): refused, nothing changes.
        assert!(!b.push_from_device(&mut p, fill[0], 256, 60, 7, 9));
        assert!(!b.push_from_device(&mut p, 7, 0, 60, 0, 0));
        assert!(!b.push_from_device(&mut p, 9999, 0, 60, 0, 0));
        assert!(!p.reclaim(9999));
        assert_eq!(p.stats().in_device, 3);
        // TX by lending: the live packet goes to the device, a dropped one is freed.
        assert!(b.push_from_device(&mut p, fill[1], 128, 64, 0, 0));
        b.drop_packet(1);
        let mut sent = Vec::new();
        let r = b.lend_to_device(&mut p, |v, addr, len| {
            sent.push((v, addr, len));
            true
        });
        assert_eq!(r, Ok((1, 0, 1)));
        assert_eq!(sent, vec![(0, a + 256, 60)]);
        assert!(b.is_empty());
        // Completion: the TX buffer and the unused fill buffers come back.
        assert!(p.reclaim(fill[0]));
        assert!(!p.reclaim(fill[0]), "double completion refused");
        assert!(p.reclaim(fill[2]) && p.reclaim(fill[3]));
        assert_eq!(p.stats().in_device, 0);
        assert_eq!(p.stats().free, 8);
    }

    #[test]
    fn device_bulk_receive_checks_each_and_bulk_transmit_lends_all() {
        // A "device" region: 6 buffers of 256 bytes, data within 64..192, all in device.
        let mut region = vec![Line::ZERO; 6 * 4];
        let base = std::ptr::NonNull::new(region.as_mut_ptr() as *mut u8).unwrap();
        // SAFETY: the region outlives the pool and batch below and is only touched through them.
        let mut p = unsafe { PacketPool::from_device_region(base, 6, 256, 64, 192) }.unwrap();
        let mut b = Batch::new(&p);
        let mut rejected = Vec::new();
        // Five "received": 1 ok, 2 before the floor, 3 ok, 3 again (no longer lent), 9 not a buffer.
        let got = b.rx_from_device(
            &mut p,
            8,
            77,
            |idx, off, len, hash| {
                assert_eq!(idx.len(), 8);
                let pk = [(1, 100, 60, 11), (2, 10, 60, 22), (3, 64, 128, 33), (3, 64, 60, 44), (9, 64, 60, 55)];
                for (k, &(i, o, l, h)) in pk.iter().enumerate() {
                    (idx[k], off[k], len[k], hash[k]) = (i, o, l, h);
                }
                pk.len()
            },
            |i| rejected.push(i),
        );
        assert_eq!(got, 2);
        assert_eq!(rejected, [2, 3, 9]);
        assert_eq!(
            (b.lens(), b.rss_hashes(), b.timestamps(), b.verdicts()),
            (&[60, 128][..], &[11, 33][..], &[77, 77][..], &[0, 0][..])
        );
        assert_eq!(p.stats().in_device, 4, "2 still lent: the caller reclaims it");
        assert!(p.reclaim(2) && !p.reclaim(9));
        b.data_mut(1)[127] = 5;
        assert_eq!(region[3 * 4 + 2].0[63], 5, "buffer 3, data at 64, last byte at 191");
        // `fill` is offered only the batch's room.
        let room = |idx: &mut [u32], _: &mut [u16], _: &mut [u16], _: &mut [u32]| {
            assert_eq!(idx.len(), MAX_BATCH - 2);
            0
        };
        assert_eq!(b.rx_from_device(&mut p, 300, 0, room, |_| ()), 0);
        // Transmit: the dropped packet is freed, the live one lent in place.
        b.drop_packet(0);
        let ((seen, offs, lens), dropped) =
            b.lend_all_to_device(&mut p, |idx, off, len| (idx.to_vec(), off.to_vec(), len.to_vec())).unwrap();
        assert_eq!((seen, offs, lens, dropped), (vec![3], vec![64], vec![128], 1));
        assert!(b.is_empty());
        assert_eq!((p.stats().free, p.stats().in_device), (2, 4), "1 and 2 free; 3 back in device");
        // A batch of another pool is refused.
        let mut q = pool(4);
        assert_eq!(b.rx_from_device(&mut q, 4, 0, |_, _, _, _| unreachable!(), |_| ()), 0);
        assert!(b.lend_all_to_device(&mut q, |_, _, _| ()).is_err());
    }

    #[test]
    fn device_region_pool_starts_in_device() {
        // A "device" region: 5 buffers of 256 bytes, owned by the test.
        let mut region = vec![Line::ZERO; 5 * 4];
        let base = std::ptr::NonNull::new(region.as_mut_ptr() as *mut u8).unwrap();
        // SAFETY: the region outlives the pool and batch below and is only touched through them.
        let mut p = unsafe { PacketPool::from_device_region(base, 5, 256, 64, 192) }.unwrap();
        assert_eq!((p.stats().free, p.stats().in_device), (0, 5));
        let mut b = Batch::new(&p);
        assert!(!b.push_copy(&mut p, &[1], 0), "nothing free: all in device");
        assert!(!b.push_from_device(&mut p, 4, 10, 50, 0, 0), "data before the floor");
        assert!(!b.push_from_device(&mut p, 4, 100, 93, 0, 0), "data past the ceiling");
        assert!(b.push_from_device(&mut p, 4, 100, 50, 0, 0));
        assert!(b.prepend(0, 37).is_none(), "would cross the device's header");
        assert!(b.prepend(0, 36).is_some() && b.adj(0, 36));
        assert!(!b.set_len(0, 93) && b.set_len(0, 92));
        b.data_mut(0)[0] = 7;
        b.free_all(&mut p).unwrap();
        // Freed buffers go back to the device with `lend`.
        let mut out = [0u32; 8];
        assert_eq!(p.lend(&mut out), 1);
        assert_eq!(out[0], 4);
        assert_eq!(region[4 * 4 + 1].0[100 - 64], 7);
        // SAFETY: as above (the region must not be freed before the pool).
        assert!(unsafe { PacketPool::from_device_region(base, 5, 100, 0, 100) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { PacketPool::from_device_region(base, 5, 256, 64, 300) }.is_err());
    }

    #[test]
    fn rx_burst_lines_timed_rules() {
        let mut p = pool(40);
        let mut b = Batch::new(&p);
        let lines = [Line([7; 64])];
        let f = |k: usize| (&lines[..], 60 + k as u16, k as u32);
        assert_eq!(b.rx_burst_lines_timed(&mut p, 3, RxTimes::Even { first: 100, step: 10 }, f), 3);
        assert_eq!(b.timestamps(), &[100, 110, 120]);
        assert_eq!(b.rx_burst_lines_timed(&mut p, 2, RxTimes::Shifted { shift: 5, ts: &[1, 2] }, f), 2);
        assert_eq!(b.rx_burst_lines_timed(&mut p, 2, RxTimes::At(9), f), 2);
        assert_eq!(&b.timestamps()[3..], &[6, 7, 9, 9]);
        // A times slice shorter than the burst: the rest at the shift, no read past it.
        assert_eq!(b.rx_burst_lines_timed(&mut p, 3, RxTimes::Shifted { shift: u64::MAX - 1, ts: &[4] }, f), 3);
        assert_eq!(&b.timestamps()[7..], &[u64::MAX, u64::MAX - 1, u64::MAX - 1]);
        assert_eq!(b.data(8).len(), 61);
        assert_eq!(b.rss_hashes()[8], 1);
        // Same copies and checks as the per-packet form: a length past its lines is a dropped empty packet.
        assert_eq!(b.rx_burst_lines_timed(&mut p, 1, RxTimes::At(0), |_| (&lines[..], 200, 0)), 1);
        assert!(b.is_dropped(10));
        b.free_all(&mut p).unwrap();
        assert_eq!(p.available(), 40);
    }

    #[test]
    fn bad_configs() {
        assert_eq!(PacketPool::new(PoolConfig { buffers: 0, ..Default::default() }).err(), Some(PoolError::BadConfig));
        assert_eq!(
            PacketPool::new(PoolConfig { buf_size: 100, ..Default::default() }).err(),
            Some(PoolError::BadConfig)
        );
        assert_eq!(
            PacketPool::new(PoolConfig { headroom: 2048, ..Default::default() }).err(),
            Some(PoolError::BadConfig)
        );
    }
}

//! The replica tables: one NF's private state per key, keyed from the
//! history record so every core keys alike (linear probing over
//! preallocated arrays, deterministic idle expiry and sweep), and the key
//! patterns the fast-forward loops match records with.

use flowplane_nf::stateful::{ScrFields, ScrRecord};
use flowplane_wire::hash::crc32c_u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyOf {
    /// Source address.
    Src,
    /// Destination address.
    Dst,
    /// The 5-tuple.
    Flow,
    /// The 5-tuple, either direction.
    Connection,
}

impl KeyOf {
    #[inline(always)]
    pub fn key(self, r: &ScrRecord) -> u128 {
        let v6 = u128::from(r.kind() & flowplane_wire::scr::kind::V6);
        match self {
            KeyOf::Src => (u128::from(r.src) << 8) | v6,
            KeyOf::Dst => (u128::from(r.dst) << 8) | v6,
            KeyOf::Flow => r.five_tuple_key(),
            KeyOf::Connection => r.connection_key(),
        }
    }
}

impl KeyOf {
    /// The record bits a key is made of, with the kind's VALID bit, as a
    /// mask over [`ScrRecord::to_words`] (None: either direction, not a
    /// field match). A record matches a [`KeyPattern`] taken from a valid
    /// record of key `k` exactly when it is valid and its key is `k`.
    #[inline(always)]
    pub(crate) fn mask(self) -> Option<[u64; 4]> {
        use flowplane_wire::scr::kind::{V6, VALID};
        let fields = match self {
            KeyOf::Src => ScrFields::SRC_IP,
            KeyOf::Dst => ScrFields::DST_IP,
            KeyOf::Flow => ScrFields::FIVE_TUPLE,
            KeyOf::Connection => return None,
        };
        let w = fields_mask(fields);
        Some([u64::from(VALID | V6) << 56, w[1], w[2], w[3]])
    }

    /// The mask of a record's key (as [`KeyOf::mask`]), its whole kind byte
    /// and the fields `f` names: what a pure transition
    /// ([`StatefulNf::SCR_PURE`](flowplane_nf::StatefulNf::SCR_PURE)) reads.
    /// Two records equal under it take a state to the same next state. None
    /// when the transition reads the time (every record's differs) or the
    /// key kind has no mask.
    pub(crate) fn still_mask(self, f: ScrFields) -> Option<[u64; 4]> {
        if f.0 & ScrFields::TIME.0 != 0 {
            return None;
        }
        let (key, w) = (self.mask()?, fields_mask(f));
        Some([key[0] | u64::from(u8::MAX) << 56, key[1] | w[1], key[2] | w[2], key[3] | w[3]])
    }
}

/// The bits of [`ScrRecord::to_words`] the header fields `f` occupy (the
/// time and kind word left out): built from a record with those fields set,
/// so it follows the record's layout.
#[inline(always)]
fn fields_mask(f: ScrFields) -> [u64; 4] {
    type Set = fn(&mut ScrRecord);
    const SET: [(ScrFields, Set); 7] = [
        (ScrFields::SRC_IP, |r| r.src = u32::MAX),
        (ScrFields::DST_IP, |r| r.dst = u32::MAX),
        (ScrFields::PORTS, |r| (r.sport, r.dport) = (u16::MAX, u16::MAX)),
        (ScrFields::PROTO, |r| r.proto = u8::MAX),
        (ScrFields::LEN, |r| r.len = u16::MAX),
        (ScrFields::TCP_FLAGS, |r| r.flags = u8::MAX),
        (ScrFields::TCP_SEQ_ACK, |r| (r.seq, r.ack) = (u32::MAX, u32::MAX)),
    ];
    let mut r = ScrRecord::default();
    for (x, set) in SET {
        if f.0 & x.0 != 0 {
            set(&mut r);
        }
    }
    let w = r.to_words();
    [0, w[1], w[2], w[3]]
}

/// A key as a masked comparison of a record's words (one vector compare
/// per four records, see [`KeyPattern::four_match`]), where computing the
/// key of every record of a run would build and compare 128-bit keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyPattern {
    mask: [u64; 4],
    want: [u64; 4],
}

impl KeyPattern {
    /// The pattern of valid record `r`'s key under `mask` ([`KeyOf::mask`]).
    #[inline(always)]
    pub(crate) fn of(mask: [u64; 4], r: &ScrRecord) -> KeyPattern {
        let w = r.to_words();
        KeyPattern { mask, want: std::array::from_fn(|i| w[i] & mask[i]) }
    }

    /// `r` is valid and has the pattern's key.
    #[inline(always)]
    pub(crate) fn matches(&self, r: &ScrRecord) -> bool {
        self.four_match(&[*r; 4])
    }

    /// How many leading records of `recs` match: a heavy key's N - 1
    /// records per packet, so four at a time ([`KeyPattern::four_match`]),
    /// then one by one from the first group of four with a mismatch.
    #[inline(always)]
    pub(crate) fn leading(&self, recs: &[ScrRecord]) -> usize {
        let (fours, _) = recs.as_chunks::<4>();
        let n = 4 * fours.iter().take_while(|f| self.four_match(f)).count();
        n + recs[n..].iter().take_while(|r| self.matches(r)).count()
    }

    /// Every record of `recs` matches: four at a time, the last four
    /// overlapping the ones before where the count is not a multiple of four
    /// (7 records: two tests); fewer than four one by one.
    #[inline(always)]
    pub(crate) fn all_match(&self, recs: &[ScrRecord]) -> bool {
        let (fours, rest) = recs.as_chunks::<4>();
        match recs.last_chunk::<4>() {
            None => rest.iter().all(|r| self.matches(r)),
            Some(last) => fours.iter().all(|f| self.four_match(f)) && (rest.is_empty() || self.four_match(last)),
        }
    }

    /// All four records match: their differences from the pattern or-ed
    /// (one 256-bit xor and or per record), then one test against the mask
    /// (`vptest`). A record is exactly one AVX2 register.
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    #[inline(always)]
    fn four_match(&self, four: &[ScrRecord; 4]) -> bool {
        use safe_arch::{bitor_m256i, bitxor_m256i, m256i, testz_m256i};
        let want = m256i::from(self.want);
        let d =
            four.iter().fold(m256i::default(), |d, r| bitor_m256i(d, bitxor_m256i(m256i::from(r.to_words()), want)));
        testz_m256i(d, m256i::from(self.mask)) == 1
    }

    /// All four records match (without AVX2: the same or-ed differences, word by word).
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    #[inline(always)]
    fn four_match(&self, four: &[ScrRecord; 4]) -> bool {
        let d = four.iter().fold([0u64; 4], |d, r| {
            let w = r.to_words();
            std::array::from_fn(|i| d[i] | (w[i] ^ self.want[i]))
        });
        (d[0] & self.mask[0]) | (d[1] & self.mask[1]) | (d[2] & self.mask[2]) | (d[3] & self.mask[3]) == 0
    }
}

#[inline(always)]
fn hash128(k: u128) -> u64 {
    let a = crc32c_u64(0x5bd1_e995, k as u64);
    let b = crc32c_u64(a, (k >> 64) as u64);
    (u64::from(a) << 32) | u64::from(b)
}

/// A replica slot's header: key, last-seen time, occupancy (half a line).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
pub(super) struct Hdr {
    pub(super) key: u128,
    pub(super) last: u64,
    pub(super) used: u64,
}

/// One NF's private replica: linear probing over preallocated arrays, and
/// a one-entry cache of the last key (a heavy flow's records hit it).
pub struct ReplicaTable {
    pub(crate) key_of: KeyOf,
    pub(super) hdr: Box<[Hdr]>,
    /// States, `stride` words each (8-byte aligned for the NF's `Pod` state).
    pub(super) states: Box<[u64]>,
    pub(super) stride: usize,
    pub(super) size: usize,
    pub(super) len: usize,
    timeout_ns: u64,
    pub(super) sweeps: u64,
    pub(super) full: u64,
    /// The last key looked up and its slot (usize::MAX: none).
    hot_key: u128,
    hot_at: usize,
}

/// A slot found for a record: its index and whether its state is new.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) at: usize,
    pub(crate) fresh: bool,
}

impl ReplicaTable {
    pub(super) fn new(key_of: KeyOf, capacity: usize, state_size: usize, timeout_ns: u64) -> ReplicaTable {
        let cap = (capacity.max(64) * 8 / 7).next_power_of_two();
        let stride = state_size.div_ceil(8).max(1);
        ReplicaTable {
            key_of,
            hdr: vec![Hdr::default(); cap].into_boxed_slice(),
            states: vec![0; cap * stride].into_boxed_slice(),
            stride,
            size: state_size,
            len: 0,
            timeout_ns: timeout_ns.max(1),
            sweeps: 0,
            full: 0,
            hot_key: 0,
            hot_at: usize::MAX,
        }
    }

    #[inline(always)]
    pub(crate) fn state(&mut self, at: usize) -> &mut [u8] {
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        &mut bytemuck::cast_slice_mut::<u64, u8>(w)[..self.size]
    }

    /// The slot of `key` when it is the key looked up last (a run of it needs no lookup).
    #[inline(always)]
    pub(crate) fn cached(&self, key: u128) -> Option<usize> {
        (key == self.hot_key && self.hot_at != usize::MAX).then_some(self.hot_at)
    }

    /// Slot `at`'s state (`S` the NF's state: `size` bytes, alignment <= 8).
    #[inline(always)]
    pub(crate) fn state_of<S: bytemuck::Pod>(&mut self, at: usize) -> &mut S {
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        bytemuck::from_bytes_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(w)[..std::mem::size_of::<S>()])
    }

    /// The idle timeout.
    #[inline(always)]
    pub(crate) fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// Slot `at`'s last-seen time and state (`S` the NF's state: `size` bytes, alignment <= 8).
    #[inline(always)]
    pub(crate) fn read_slot<S: bytemuck::Pod>(&self, at: usize) -> (u64, S) {
        let w = &self.states[at * self.stride..(at + 1) * self.stride];
        (self.hdr[at].last, *bytemuck::from_bytes(&bytemuck::cast_slice::<u64, u8>(w)[..std::mem::size_of::<S>()]))
    }

    /// Writes slot `at`'s last-seen time and state (a run of records of one
    /// key kept them in hand: see [`ff`]).
    #[inline(always)]
    pub(crate) fn write_slot<S: bytemuck::Pod>(&mut self, at: usize, last: u64, st: &S) {
        self.hdr[at].last = last;
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        *bytemuck::from_bytes_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(w)[..std::mem::size_of::<S>()]) = *st;
    }

    /// Touches slot `at` at `now`: whether the state starts over (idle past the timeout).
    #[inline(always)]
    fn touch(&mut self, at: usize, now: u64) -> Slot {
        let h = &mut self.hdr[at];
        // Idle past the timeout: the flow starts over (as a conntrack lookup does).
        let fresh = now.saturating_sub(h.last) > self.timeout_ns;
        h.last = if fresh { now } else { h.last.max(now) };
        Slot { at, fresh }
    }

    /// Finds or inserts the key at time `now` (None: full even after a sweep).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, key: u128, now: u64) -> Option<Slot> {
        if key == self.hot_key && self.hot_at != usize::MAX {
            return Some(self.touch(self.hot_at, now));
        }
        self.lookup_slow(key, now)
    }

    #[inline(never)]
    fn lookup_slow(&mut self, key: u128, now: u64) -> Option<Slot> {
        let mask = self.hdr.len() - 1;
        let mut i = (hash128(key) as usize) & mask;
        loop {
            let h = &self.hdr[i];
            if h.used == 0 {
                break;
            }
            if h.key == key {
                self.hot_key = key;
                self.hot_at = i;
                return Some(self.touch(i, now));
            }
            i = (i + 1) & mask;
        }
        if (self.len + 1) * 8 > self.hdr.len() * 7 {
            self.sweep(now);
            if (self.len + 1) * 8 > self.hdr.len() * 7 {
                self.full += 1;
                return None;
            }
            return self.lookup_slow(key, now);
        }
        self.hdr[i] = Hdr { key, last: now, used: 1 };
        self.len += 1;
        self.hot_key = key;
        self.hot_at = i;
        Some(Slot { at: i, fresh: true })
    }

    /// Drops every entry idle past the timeout at `now` and re-inserts the
    /// rest (linear probing has no tombstone-free delete). Deterministic: it
    /// runs at the same record on every core.
    #[cold]
    fn sweep(&mut self, now: u64) {
        self.sweeps += 1;
        self.hot_at = usize::MAX;
        let mask = self.hdr.len() - 1;
        let mut live: Vec<(Hdr, Vec<u64>)> = Vec::new();
        for i in 0..self.hdr.len() {
            let h = self.hdr[i];
            if h.used != 0 && now.saturating_sub(h.last) <= self.timeout_ns {
                live.push((h, self.states[i * self.stride..(i + 1) * self.stride].to_vec()));
            }
        }
        self.hdr.iter_mut().for_each(|h| h.used = 0);
        self.len = 0;
        // Re-insert in key order so the layout is a function of the live set alone.
        live.sort_unstable_by_key(|e| e.0.key);
        for (h, st) in live {
            let mut i = (hash128(h.key) as usize) & mask;
            while self.hdr[i].used != 0 {
                i = (i + 1) & mask;
            }
            self.hdr[i] = h;
            self.states[i * self.stride..(i + 1) * self.stride].copy_from_slice(&st);
            self.len += 1;
        }
    }

    /// Order-independent digest of the keys, their last-seen times and states.
    pub(super) fn digest(&self) -> u64 {
        let mut d = 0u64;
        for (i, h) in self.hdr.iter().enumerate() {
            if h.used != 0 {
                let mut x = hash128(h.key) ^ h.last.rotate_left(17);
                for &w in &self.states[i * self.stride..(i + 1) * self.stride] {
                    x = hash128(u128::from(x) << 64 | u128::from(w)) ^ x.rotate_left(29);
                }
                d = d.wrapping_add(x.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            }
        }
        d
    }
}

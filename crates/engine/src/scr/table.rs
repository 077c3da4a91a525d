//! The replica tables: one NF's private state per key, keyed from the
//! history record so every core keys alike (the project's fixed-capacity
//! map, [`FixedMap`], with the states beside it by slot; deterministic idle
//! expiry), and the key patterns the fast-forward loops match records with.

use flowplane_nf::stateful::{ScrFields, ScrRecord};
use flowplane_table::{FixedMap, KeyHash};
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

/// The replica tables' hash of a key (CRC32C over both halves: every bit mixed).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KeyCrc;

impl KeyHash<u128> for KeyCrc {
    #[inline(always)]
    fn hash(key: &u128) -> u32 {
        hash128(*key) as u32
    }

    /// Keyed: each half XOR-ed with the secret's spread and multiplied before the CRC (CRC32C alone is
    /// linear: a seed moves no collision).
    #[inline(always)]
    fn hash_keyed(key: &u128, secret: u32) -> u32 {
        if secret == 0 {
            return Self::hash(key);
        }
        let spread = (u64::from(secret) << 32 | u64::from(secret)) ^ 0x9E37_79B9_7F4A_7C15;
        let mix = |w: u64| (w ^ spread).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        let a = crc32c_u64(secret, mix(*key as u64));
        crc32c_u64(a, mix((*key >> 64) as u64))
    }
}

/// A replica entry's value in the map: its last-seen time (its state lives
/// in the side array, at its slot).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Seen {
    pub(super) last: u64,
}

/// One NF's private replica: the project's fixed-capacity map
/// ([`FixedMap`]) from the record's key to the last-seen time, the NF's
/// states in a side array by slot (stable while the entry lives; states are
/// `stride` words, sized per NF at run time), and a one-entry cache of the
/// last key (a heavy flow's records hit it).
///
/// It holds exactly `capacity` keys (`--flows`). A new key that finds it
/// full first removes every entry idle past the timeout at the record's time
/// (one pass in slot order, skipped while no entry can be idle yet), then is
/// refused. Every replica makes the same calls in the same order (the
/// records' sequence), and the map is deterministic, so every replica holds
/// the same keys in the same slots and refuses the same records.
///
/// Counters (per replica, the meaning the flow tables give them): `insertions`
/// (a new key, or a key idle past the timeout started over by a lookup),
/// `expiries` (removed idle, or started over), `refused` (own packets of
/// the core whose key found no room: the run's `table_full` is their sum
/// over cores, a packet counted once as under rss). `len + expiries ==
/// insertions` always (nothing else removes an entry).
pub struct ReplicaTable {
    pub(crate) key_of: KeyOf,
    pub(super) map: FixedMap<u128, Seen, KeyCrc>,
    /// States, `stride` words each by slot (8-byte aligned for the NF's `Pod` state).
    pub(super) states: Box<[u64]>,
    pub(super) stride: usize,
    pub(super) size: usize,
    timeout_ns: u64,
    /// No entry is idle before this time (the earliest `last + timeout`
    /// the last pass over a full table saw): a full table is not swept again before.
    idle_from: u64,
    pub(super) sweeps: u64,
    pub(super) insertions: u64,
    pub(super) expiries: u64,
    pub(super) refused: u64,
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
    /// A table of exactly `capacity` keys (at least 1), all memory taken now.
    pub(super) fn new(
        key_of: KeyOf,
        capacity: usize,
        state_size: usize,
        timeout_ns: u64,
    ) -> Result<ReplicaTable, flowplane_table::TableError> {
        let capacity = capacity.max(1);
        let stride = state_size.div_ceil(8).max(1);
        let words =
            capacity.checked_mul(stride).ok_or(flowplane_table::TableError::OutOfMemory { bytes: usize::MAX })?;
        let map = FixedMap::new(capacity)?;
        Ok(ReplicaTable {
            key_of,
            map,
            // Zeroed words come from calloc: pages are touched only when a slot is first used.
            states: vec![0; words].into_boxed_slice(),
            stride,
            size: state_size,
            timeout_ns: timeout_ns.max(1),
            idle_from: 0,
            sweeps: 0,
            insertions: 0,
            expiries: 0,
            refused: 0,
            hot_key: 0,
            hot_at: usize::MAX,
        })
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The most keys the table holds.
    pub(crate) fn capacity(&self) -> usize {
        self.map.capacity()
    }

    /// Counts one own packet whose key found no room (see the type's doc).
    #[inline(always)]
    pub(crate) fn refuse(&mut self) {
        self.refused += 1;
    }

    #[inline(always)]
    pub(crate) fn state(&mut self, at: usize) -> &mut [u8] {
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        &mut bytemuck::cast_slice_mut::<u64, u8>(w)[..self.size]
    }

    /// Slot `at`'s state bytes, read only.
    #[inline(always)]
    pub(super) fn state_bytes(&self, at: usize) -> &[u8] {
        let w = &self.states[at * self.stride..(at + 1) * self.stride];
        &bytemuck::cast_slice::<u64, u8>(w)[..self.size]
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

    /// Slot `at`'s last-seen time (a live slot: found by a lookup).
    #[inline(always)]
    fn last(&self, at: usize) -> u64 {
        self.map.peek_at(at).map_or(0, |s| s.last)
    }

    /// Slot `at`'s last-seen time and state (`S` the NF's state: `size` bytes, alignment <= 8).
    #[inline(always)]
    pub(crate) fn read_slot<S: bytemuck::Pod>(&self, at: usize) -> (u64, S) {
        let w = &self.states[at * self.stride..(at + 1) * self.stride];
        (self.last(at), *bytemuck::from_bytes(&bytemuck::cast_slice::<u64, u8>(w)[..std::mem::size_of::<S>()]))
    }

    /// Writes slot `at`'s last-seen time and state (a run of records of one
    /// key kept them in hand: see [`ff`]).
    #[inline(always)]
    pub(crate) fn write_slot<S: bytemuck::Pod>(&mut self, at: usize, last: u64, st: &S) {
        if let Some(s) = self.map.peek_at_mut(at) {
            s.last = last;
        }
        let w = &mut self.states[at * self.stride..(at + 1) * self.stride];
        *bytemuck::from_bytes_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(w)[..std::mem::size_of::<S>()]) = *st;
    }

    /// Touches slot `at` at `now`: whether the state starts over (idle past the timeout).
    #[inline(always)]
    fn touch(&mut self, at: usize, now: u64) -> Slot {
        let timeout = self.timeout_ns;
        let Some(s) = self.map.peek_at_mut(at) else { return Slot { at, fresh: true } };
        // Idle past the timeout: the flow starts over (as a conntrack lookup does).
        let fresh = now.saturating_sub(s.last) > timeout;
        s.last = if fresh { now } else { s.last.max(now) };
        if fresh {
            // The idle entry expired and the key came back: as a flow table counts it.
            self.expiries += 1;
            self.insertions += 1;
        }
        Slot { at, fresh }
    }

    /// Finds or inserts the key at time `now` (None: full even after removing idle entries).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, key: u128, now: u64) -> Option<Slot> {
        if key == self.hot_key && self.hot_at != usize::MAX {
            return Some(self.touch(self.hot_at, now));
        }
        self.lookup_slow(key, now)
    }

    #[inline(never)]
    fn lookup_slow(&mut self, key: u128, now: u64) -> Option<Slot> {
        let h = self.map.hash_of(&key);
        if let Some(at) = self.map.find_hashed(h, &key) {
            self.hot_key = key;
            self.hot_at = at;
            return Some(self.touch(at, now));
        }
        if self.map.is_full() {
            if now <= self.idle_from {
                return None;
            }
            self.sweep(now);
            if self.map.is_full() {
                return None;
            }
        }
        let at = self.map.insert_new_hashed(h, key, Seen { last: now }).ok()?;
        self.insertions += 1;
        // (Record times may go back: the new key may be the first to be idle.)
        self.idle_from = self.idle_from.min(now.saturating_add(self.timeout_ns));
        self.hot_key = key;
        self.hot_at = at;
        Some(Slot { at, fresh: true })
    }

    /// Removes every entry idle past the timeout at `now` (one pass over
    /// the used slots, in slot order) and notes when the earliest survivor
    /// can be idle. Deterministic: it runs at the same record on every
    /// core, over the same entries.
    #[cold]
    fn sweep(&mut self, now: u64) {
        self.sweeps += 1;
        self.hot_at = usize::MAX;
        let timeout = self.timeout_ns;
        let mut idle_from = u64::MAX;
        let slots = self.map.high_water();
        let removed = self.map.sweep(slots, |_, s| {
            let keep = now.saturating_sub(s.last) <= timeout;
            if keep {
                idle_from = idle_from.min(s.last.saturating_add(timeout));
            }
            keep
        });
        self.expiries += removed as u64;
        self.idle_from = idle_from;
    }

    /// Live entries: `(slot, key, last-seen time)`.
    pub(super) fn entries(&self) -> impl Iterator<Item = (usize, u128, u64)> + '_ {
        self.map.iter().map(|(at, k, s)| (at, *k, s.last))
    }

    /// Order-independent digest of the keys, their last-seen times and states.
    pub(super) fn digest(&self) -> u64 {
        let mut d = 0u64;
        for (i, key, last) in self.entries() {
            let mut x = hash128(key) ^ last.rotate_left(17);
            for &w in &self.states[i * self.stride..(i + 1) * self.stride] {
                x = hash128(u128::from(x) << 64 | u128::from(w)) ^ x.rotate_left(29);
            }
            d = d.wrapping_add(x.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        d
    }
}

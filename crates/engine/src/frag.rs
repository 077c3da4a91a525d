//! IPv4 fragments without reassembly (issue 33 item 5): a per-core, bounded
//! table that lets a datagram's later fragments follow its first one.
//!
//! Only the first fragment of a datagram carries the transport header, so
//! the parser keys a later fragment by its addresses and protocol with the
//! ports unknown ([`flowplane_wire::flow::FLAG_NON_FIRST_FRAGMENT`]): a key
//! no NF can judge (fw and nat dropped such fragments, fsc and the tables
//! counted a flow per source). At parse time, before any lookup, each IPv4
//! fragment is judged here by its datagram — (source, destination,
//! protocol, identification):
//!
//! * a **first fragment** (offset 0, more fragments) records the ports of its
//!   key and where its payload ends, and goes on as any packet of its flow;
//! * a **later fragment** of a recorded datagram takes the first fragment's
//!   key (ports included, flag cleared): it is looked up in the same flow
//!   entry and every NF judges it by that flow's state, so it follows the
//!   first fragment's decision (an acl's cached verdict, fw's connection,
//!   nat's mapping: nat rewrites its address, its transport checksum lives in
//!   the first fragment). Its `PktMeta::l4` stays 0: it has no transport header;
//! * a later fragment whose datagram is not in the table (`orphans`: its
//!   first fragment was never seen, came later, was pushed out, or went to
//!   another core) keeps its port-less key, counted: NFs judge it as before
//!   (fw, nat and portknock's protected port drop it, an acl matches it by its
//!   rules without ports, counters count it apart);
//! * dropped and counted: a later fragment that starts inside the first
//!   fragment's payload (`overlaps`: it would overwrite the transport header
//!   the decision was made on), a second first fragment naming other ports
//!   (`overlaps`), and fragments of one datagram past [`MAX_FRAGMENTS`]
//!   (`too_many`).
//!
//! Several cores: the NIC steers a later fragment by its port-less key, so
//! under `rss` it usually reaches another core than its first fragment and is
//! an orphan there (the same as without this table); one core, or a
//! strategy that steers by addresses only, attributes every fragment.
//!
//! Bounded: [`FRAG_ENTRIES`] datagrams per core in 4-way sets indexed by a
//! hash keyed with the run's secret (no one can aim datagrams at one set);
//! an entry lives [`FRAG_TIMEOUT_NS`] of packet time after its first
//! fragment; a new datagram takes an expired way or pushes out its set's
//! oldest (`evicted`: a flood of first fragments costs the oldest datagrams
//! their later fragments, never memory). IPv6 fragments (the fragment
//! extension header) are not tracked: their later fragments keep the
//! port-less key.

use flowplane_wire::flow::FiveTupleV4;
use serde::Serialize;

/// Datagrams tracked per core.
pub const FRAG_ENTRIES: usize = 4096;
const WAYS: usize = 4;
/// How long a datagram's entry lives after its first fragment, ns of packet time.
pub const FRAG_TIMEOUT_NS: u64 = 2_000_000_000;
/// Later fragments of one datagram that are followed; more are dropped.
pub const MAX_FRAGMENTS: u16 = 64;

#[derive(Clone, Copy, Default)]
struct Entry {
    src: u32,
    dst: u32,
    at_ns: u64,
    id: u16,
    sport: u16,
    dport: u16,
    /// Where the first fragment's IP payload ends (bytes).
    first_end: u16,
    /// Later fragments followed.
    frags: u16,
    proto: u8,
    live: bool,
}

impl Entry {
    #[inline]
    fn fresh(&self, now: u64) -> bool {
        self.live && now.saturating_sub(self.at_ns) <= FRAG_TIMEOUT_NS
    }
}

/// Fragment counters (per core; summed in the report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FragStats {
    /// First fragments recorded (a datagram's first fragment seen again starts it over, and counts again).
    pub first: u64,
    /// Later fragments that took their first fragment's key.
    pub followed: u64,
    /// Later fragments without a first fragment in the table (kept with their port-less key).
    pub orphans: u64,
    /// Fragments dropped for overlapping the first fragment (or a first fragment naming other ports).
    pub overlaps: u64,
    /// Fragments dropped past [`MAX_FRAGMENTS`] of one datagram.
    pub too_many: u64,
    /// Datagrams pushed out of a full set before their time.
    pub evicted: u64,
}

impl FragStats {
    /// Adds another core's counters.
    pub fn merge(&mut self, o: &FragStats) {
        self.first += o.first;
        self.followed += o.followed;
        self.orphans += o.orphans;
        self.overlaps += o.overlaps;
        self.too_many += o.too_many;
        self.evicted += o.evicted;
    }

    /// Fragments dropped, all reasons.
    pub fn dropped(&self) -> u64 {
        self.overlaps + self.too_many
    }
}

/// What becomes of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// Not a fragment, or a first fragment: its own key.
    Keep,
    /// A later fragment: the first fragment's key.
    Follow(FiveTupleV4),
    /// Dropped (counted).
    Drop,
}

/// The per-core fragment table.
pub struct FragTable {
    e: Box<[Entry]>,
    sets_mask: usize,
    seed: u64,
    /// Counters.
    pub stats: FragStats,
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl FragTable {
    /// An empty table whose set index is keyed by `seed` (the run's hash secret).
    pub fn new(seed: u32) -> Self {
        FragTable {
            e: vec![Entry::default(); FRAG_ENTRIES].into_boxed_slice(),
            sets_mask: FRAG_ENTRIES / WAYS - 1,
            seed: (u64::from(seed) | 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            stats: FragStats::default(),
        }
    }

    /// Judges the IPv4 packet `frame` (header at `l3`, parsed key `key`) at packet time `now`. Costs one
    /// header word and a branch for a packet that is not a fragment.
    #[inline]
    pub fn judge(&mut self, frame: &[u8], l3: usize, key: &FiveTupleV4, now: u64) -> Judged {
        let Some(h) = frame.get(l3..l3 + 20) else { return Judged::Keep };
        let frag = be16(h, 6);
        if frag & 0x3fff == 0 {
            return Judged::Keep;
        }
        self.fragment(h, frag, key, now)
    }

    #[cold]
    fn fragment(&mut self, h: &[u8], frag: u16, key: &FiveTupleV4, now: u64) -> Judged {
        let (src, dst, id, proto) = (be32(h, 12), be32(h, 16), be16(h, 4), h[9]);
        let offset = usize::from(frag & 0x1fff) * 8;
        let x = (u64::from(src) << 32 | u64::from(dst)) ^ self.seed;
        let x = x.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ (u64::from(id) << 8 | u64::from(proto)).wrapping_add(self.seed);
        let set = ((x ^ (x >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB) >> 40) as usize & self.sets_mask;
        let FragTable { e, stats, .. } = self;
        let ways = &mut e[set * WAYS..set * WAYS + WAYS];
        let found =
            ways.iter().position(|w| w.fresh(now) && w.src == src && w.dst == dst && w.id == id && w.proto == proto);
        if offset == 0 {
            // A first fragment: it carries the ports.
            let ihl = usize::from(h[0] & 0x0f) * 4;
            let first_end = usize::from(be16(h, 2)).saturating_sub(ihl) as u16;
            let (sport, dport) = (key.src_port(), key.dst_port());
            if let Some(w) = found {
                let e = &mut ways[w];
                if (e.sport, e.dport) != (sport, dport) {
                    // Would send the datagram's later fragments to another flow.
                    stats.overlaps += 1;
                    return Judged::Drop;
                }
                // The datagram sent again (or its id reused by the same flow): it starts over.
                (e.first_end, e.frags, e.at_ns) = (first_end, 0, now);
                stats.first += 1;
                return Judged::Keep;
            }
            // An expired (or never used) way, else the set's oldest.
            let w = (0..WAYS).min_by_key(|&w| (ways[w].fresh(now), ways[w].at_ns)).unwrap_or(0);
            stats.evicted += u64::from(ways[w].fresh(now));
            ways[w] = Entry { src, dst, at_ns: now, id, sport, dport, first_end, frags: 0, proto, live: true };
            stats.first += 1;
            return Judged::Keep;
        }
        let Some(w) = found else {
            stats.orphans += 1;
            return Judged::Keep;
        };
        let e = &mut ways[w];
        if offset < usize::from(e.first_end) {
            stats.overlaps += 1;
            return Judged::Drop;
        }
        e.frags = e.frags.saturating_add(1);
        if e.frags > MAX_FRAGMENTS {
            stats.too_many += 1;
            return Judged::Drop;
        }
        stats.followed += 1;
        Judged::Follow(FiveTupleV4::new(src.into(), dst.into(), e.sport, e.dport, proto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 header (+ 14 bytes of Ethernet before it) of a fragment.
    fn frame(src: u32, id: u16, frag: u16, payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + payload];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let h = &mut f[14..34];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
        h[4..6].copy_from_slice(&id.to_be_bytes());
        h[6..8].copy_from_slice(&frag.to_be_bytes());
        h[9] = 17;
        h[12..16].copy_from_slice(&src.to_be_bytes());
        h[16..20].copy_from_slice(&0xac10_0001u32.to_be_bytes());
        f
    }

    fn key(src: u32, sport: u16, dport: u16) -> FiveTupleV4 {
        FiveTupleV4::new(src.into(), 0xac10_0001u32.into(), sport, dport, 17)
    }

    /// A later fragment's key as parsed: no ports, the flag set.
    fn later(src: u32) -> FiveTupleV4 {
        key(src, 0, 0).with_flags(1)
    }

    #[test]
    fn later_fragments_take_the_first_ones_key() {
        let mut t = FragTable::new(7);
        let first = frame(1, 9, 0x2000, 16);
        assert_eq!(t.judge(&first, 14, &key(1, 1000, 53), 0), Judged::Keep);
        let second = frame(1, 9, 0x2000 | 2, 16);
        assert_eq!(t.judge(&second, 14, &later(1), 10), Judged::Follow(key(1, 1000, 53)));
        let last = frame(1, 9, 4, 16);
        assert_eq!(t.judge(&last, 14, &later(1), 20), Judged::Follow(key(1, 1000, 53)));
        // Not a fragment (DF set): untouched.
        let plain = frame(1, 9, 0x4000, 16);
        assert_eq!(t.judge(&plain, 14, &key(1, 1000, 53), 20), Judged::Keep);
        assert_eq!((t.stats.first, t.stats.followed, t.stats.dropped()), (1, 2, 0));
    }

    #[test]
    fn orphans_keep_their_key_overlaps_and_too_many_are_dropped() {
        let mut t = FragTable::new(7);
        // No first fragment: judged by its port-less key, as without the table.
        assert_eq!(t.judge(&frame(2, 1, 4, 16), 14, &later(2), 0), Judged::Keep);
        assert_eq!(t.stats.orphans, 1);
        t.judge(&frame(2, 1, 0x2000, 16), 14, &key(2, 7, 8), 0);
        // Starts inside the first fragment's 16 bytes (offset 8).
        assert_eq!(t.judge(&frame(2, 1, 0x2000 | 1, 16), 14, &later(2), 0), Judged::Drop);
        // A second first fragment naming other ports.
        assert_eq!(t.judge(&frame(2, 1, 0x2000, 16), 14, &key(2, 7, 9), 0), Judged::Drop);
        assert_eq!(t.stats.overlaps, 2);
        for k in 0..MAX_FRAGMENTS {
            assert!(matches!(t.judge(&frame(2, 1, 0x2000 | (2 + k), 8), 14, &later(2), 0), Judged::Follow(_)));
        }
        assert_eq!(t.judge(&frame(2, 1, 0x2000 | 200, 8), 14, &later(2), 0), Judged::Drop);
        assert_eq!(t.stats.too_many, 1);
        // Past its time the datagram is gone.
        assert_eq!(t.judge(&frame(2, 1, 300, 8), 14, &later(2), FRAG_TIMEOUT_NS + 1), Judged::Keep);
        assert_eq!(t.stats.orphans, 2);
    }

    /// A flood of first fragments pushes out the oldest datagrams, never more than the table holds.
    #[test]
    fn a_flood_of_first_fragments_stays_bounded() {
        let mut t = FragTable::new(3);
        let n = 4 * FRAG_ENTRIES as u32;
        for s in 0..n {
            t.judge(&frame(s, 1, 0x2000, 16), 14, &key(s, 1, 2), u64::from(s));
        }
        assert_eq!(t.stats.first, u64::from(n));
        assert!(t.stats.evicted >= u64::from(n) - FRAG_ENTRIES as u64, "{:?}", t.stats);
        // The newest datagrams are still followed.
        let last = n - 1;
        assert!(matches!(t.judge(&frame(last, 1, 4, 8), 14, &later(last), u64::from(n)), Judged::Follow(_)));
    }
}

//! IP fragments without reassembly (issue 33 item 5): a per-core, bounded
//! table that lets a datagram's later fragments follow its first one, IPv4
//! and IPv6 (a Fragment extension header, also behind hop-by-hop, routing,
//! destination-options or AH headers).
//!
//! Only the first fragment of a datagram carries the transport header, so
//! the parser keys a later fragment by its addresses and protocol with the
//! ports unknown ([`flowplane_wire::flow::FLAG_NON_FIRST_FRAGMENT`]): a key
//! no NF can judge (fw and nat dropped such fragments, fsc and the tables
//! counted a flow per source). At parse time, before any lookup, each
//! fragment is judged here by its datagram — (family, source, destination,
//! protocol, identification; IPv6's identification is 32 bits), kept as a
//! 64-bit digest keyed with the run's secret:
//!
//! * a **first fragment** (offset 0, more fragments; an IPv6 atomic fragment,
//!   offset 0 without M, is a whole datagram) records the ports of its
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
//! Several cores: the receive side steers a later fragment where its
//! datagram's first fragment went (`flowplane_scale::fragsteer`: the
//! replay's loader, the live dispatcher and the kernel steering programs
//! remember each first fragment's steering key), so it meets its first
//! fragment's entry here (`rss`, a symmetric key, flow-director rules; not
//! when its key moves to another core between the fragments: the fragment
//! table is not handed over); a later fragment that arrives before
//! its first one is steered by its addresses and is an orphan wherever it
//! lands. Spraying strategies (`shared`, `scr`) give no such guarantee.
//!
//! Bounded: [`FRAG_ENTRIES`] datagrams per core in 4-way sets indexed by a
//! hash keyed with the run's secret (no one can aim datagrams at one set);
//! an entry lives [`FRAG_TIMEOUT_NS`] of packet time after its first
//! fragment; a new datagram takes an expired way or pushes out its set's
//! oldest (`evicted`: a flood of first fragments costs the oldest datagrams
//! their later fragments, never memory). `v6` counts the IPv6 fragments
//! among all those judged.

use flowplane_wire::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};
use flowplane_wire::frame::{fragment_of, Fragment};
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
    /// Keyed 64-bit digest of the datagram (family, addresses, identification, protocol).
    tag: u64,
    at_ns: u64,
    /// Where the first fragment's data ends in the datagram (bytes).
    first_end: u32,
    sport: u16,
    dport: u16,
    /// Later fragments followed.
    frags: u16,
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
    /// Of the fragments above, IPv6 ones (a Fragment extension header).
    pub v6: u64,
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
        self.v6 += o.v6;
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
    Follow(FiveTuple),
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

/// IPv6 next headers that may precede a Fragment header (or be it).
#[inline(always)]
fn v6_ext(nh: u8) -> bool {
    matches!(nh, 0 | 43 | 44 | 51 | 60)
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

    /// Judges the packet `frame` (IP header at `l3`, parsed key `key`) at packet time `now`. Costs one
    /// header word (IPv4) or byte (IPv6: its first next header) and a branch for a packet that is not a
    /// fragment.
    #[inline]
    pub fn judge(&mut self, frame: &[u8], l3: usize, key: &FiveTuple, now: u64) -> Judged {
        let l3 = l3 + 6;
        let maybe = match key {
            FiveTuple::V4(_) => frame.get(l3..l3 + 2).is_some_and(|b| u16::from_be_bytes([b[0], b[1]]) & 0x3fff != 0),
            FiveTuple::V6(_) => frame.get(l3).is_some_and(|&nh| v6_ext(nh)),
        };
        if !maybe {
            return Judged::Keep;
        }
        self.fragment(frame, key, now)
    }

    /// The datagram's keyed digest: a multiply-xorshift chain over the addresses started from the secret,
    /// then the identification and protocol (no input difference cancels without the secret).
    fn digest(&self, f: &Fragment) -> u64 {
        let mut x = self.seed;
        let words = f.src.chunks_exact(8).chain(f.dst.chunks_exact(8));
        for w in words.take(if f.v6 { 4 } else { 2 }) {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            x = (x ^ u64::from_le_bytes(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 29;
        }
        x = (x ^ (u64::from(f.id) << 16 | u64::from(f.proto) << 8 | u64::from(f.v6)))
            .wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        (x ^ (x >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB) | 1
    }

    #[cold]
    fn fragment(&mut self, frame: &[u8], key: &FiveTuple, now: u64) -> Judged {
        let Some(f) = fragment_of(frame) else { return Judged::Keep };
        let tag = self.digest(&f);
        let set = (tag >> 40) as usize & self.sets_mask;
        let FragTable { e, stats, .. } = self;
        stats.v6 += u64::from(f.v6);
        let ways = &mut e[set * WAYS..set * WAYS + WAYS];
        let found = ways.iter().position(|w| w.fresh(now) && w.tag == tag);
        if f.is_first() {
            // A first fragment: it carries the ports.
            let (sport, dport) = (key.src_port(), key.dst_port());
            if let Some(w) = found {
                let e = &mut ways[w];
                if (e.sport, e.dport) != (sport, dport) {
                    // Would send the datagram's later fragments to another flow.
                    stats.overlaps += 1;
                    return Judged::Drop;
                }
                // The datagram sent again (or its id reused by the same flow): it starts over.
                (e.first_end, e.frags, e.at_ns) = (f.len, 0, now);
                stats.first += 1;
                return Judged::Keep;
            }
            // An expired (or never used) way, else the set's oldest.
            let w = (0..WAYS).min_by_key(|&w| (ways[w].fresh(now), ways[w].at_ns)).unwrap_or(0);
            stats.evicted += u64::from(ways[w].fresh(now));
            ways[w] = Entry { tag, at_ns: now, first_end: f.len, sport, dport, frags: 0, live: true };
            stats.first += 1;
            return Judged::Keep;
        }
        let Some(w) = found else {
            stats.orphans += 1;
            return Judged::Keep;
        };
        let e = &mut ways[w];
        if f.offset < e.first_end {
            stats.overlaps += 1;
            return Judged::Drop;
        }
        e.frags = e.frags.saturating_add(1);
        if e.frags > MAX_FRAGMENTS {
            stats.too_many += 1;
            return Judged::Drop;
        }
        stats.followed += 1;
        // The later fragment's own key holds the datagram's addresses and protocol; the first's ports join them.
        Judged::Follow(match key {
            FiveTuple::V4(k) => FiveTuple::V4(FiveTupleV4::new(k.src(), k.dst(), e.sport, e.dport, k.proto())),
            FiveTuple::V6(k) => FiveTuple::V6(FiveTupleV6::new(k.src(), k.dst(), e.sport, e.dport, k.proto())),
        })
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

    fn key(src: u32, sport: u16, dport: u16) -> FiveTuple {
        FiveTuple::V4(FiveTupleV4::new(src.into(), 0xac10_0001u32.into(), sport, dport, 17))
    }

    /// A later fragment's key as parsed: no ports, the flag set.
    fn later(src: u32) -> FiveTuple {
        FiveTuple::V4(FiveTupleV4::new(src.into(), 0xac10_0001u32.into(), 0, 0, 17).with_flags(1))
    }

    /// An IPv6 frame: a hop-by-hop header, then a Fragment header (offset in 8-byte units, M, id), then
    /// `payload` bytes (the first fragment's start with the UDP header).
    fn frame6(id: u32, offset: u16, more: bool, payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8 + 8 + payload];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&((16 + payload) as u16).to_be_bytes());
        f[20] = 0;
        f[22..38].copy_from_slice(&[0xfd; 16]);
        f[38..54].copy_from_slice(&[0xfe; 16]);
        f[54] = 44;
        f[62] = 17;
        f[64..66].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        f[66..70].copy_from_slice(&id.to_be_bytes());
        f
    }

    fn key6(sport: u16, dport: u16, flags: u8) -> FiveTuple {
        FiveTuple::V6(FiveTupleV6::new([0xfd; 16].into(), [0xfe; 16].into(), sport, dport, 17).with_flags(flags))
    }

    /// IPv6 fragments (a Fragment extension header behind a hop-by-hop one) follow their first as IPv4's
    /// do; an atomic fragment (offset 0, no M) is a whole datagram; overlaps are dropped.
    #[test]
    fn ipv6_later_fragments_take_the_first_ones_key() {
        let mut t = FragTable::new(7);
        assert_eq!(t.judge(&frame6(5, 0, false, 16), 14, &key6(1, 2, 0), 0), Judged::Keep);
        assert_eq!(t.stats, FragStats::default(), "an atomic fragment is no fragment");
        assert_eq!(t.judge(&frame6(5, 0, true, 16), 14, &key6(1000, 53, 0), 0), Judged::Keep);
        assert_eq!(t.judge(&frame6(5, 2, true, 16), 14, &key6(0, 0, 1), 1), Judged::Follow(key6(1000, 53, 0)));
        assert_eq!(t.judge(&frame6(5, 4, false, 16), 14, &key6(0, 0, 1), 2), Judged::Follow(key6(1000, 53, 0)));
        // Another id: an orphan; a fragment starting inside the first's 16 bytes: dropped.
        assert_eq!(t.judge(&frame6(6, 2, false, 16), 14, &key6(0, 0, 1), 3), Judged::Keep);
        assert_eq!(t.judge(&frame6(5, 1, false, 16), 14, &key6(0, 0, 1), 3), Judged::Drop);
        let s = t.stats;
        assert_eq!((s.first, s.followed, s.orphans, s.overlaps, s.v6), (1, 2, 1, 1, 5));
        // An IPv4 datagram with the same identification and other addresses is another datagram.
        assert_eq!(t.judge(&frame(1, 5, 4, 16), 14, &later(1), 4), Judged::Keep);
        assert_eq!(t.stats.orphans, 2);
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

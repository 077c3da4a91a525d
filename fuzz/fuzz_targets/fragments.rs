//! The fragment path (issue 33 items 3 and 5): `engine::frag::FragTable::judge` on arbitrary frames (as
//! `flowplane_fuzz::for_each_record` reads them; every raw frame a candidate fragment, IPv4 or IPv6 with any
//! extension headers before a Fragment header), parsed as the executors parse them, with a clock the gap
//! bytes move forward or back; and the receive side's `scale::fragsteer::FragSteer` on the same frames.
//! Checks: no panic; a later fragment given a key gets its own family, addresses and protocol with its
//! datagram's first-fragment ports and no flag; a packet that is not a fragment (`wire::frame::fragment_of`)
//! is never judged nor re-steered; the counters add up to the fragments seen.
#![no_main]

use flowplane_engine::frag::{FragTable, Judged};
use flowplane_nf::PktMeta;
use flowplane_scale::fragsteer::FragSteer;
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::frame::fragment_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, data)) = data.split_first() else { return };
    let mut t = FragTable::new(u32::from(seed));
    let mut steer = FragSteer::new();
    let mut now: u64 = 1_000_000_000;
    let (mut fragments, mut v6) = (0u64, 0u64);
    flowplane_fuzz::for_each_record(data, 4096, |frame, gap| {
        // Forward by the gap's seconds, or back by one when its top bit is set (a clock that steps back).
        now = if gap.0 & 0x80 != 0 { now.saturating_sub(1_000_000_000) } else { now + gap.seconds() * 1_000_000_000 };
        let frag = fragment_of(frame);
        let kh = (u16::from(gap.0), u32::from(seed));
        let steered = steer.follow(frame, kh);
        if frag.is_none_or(|f| f.is_first()) {
            assert_eq!(steered, kh, "only later fragments are re-steered");
        }
        let m = PktMeta::parse(frame);
        if !m.valid {
            return;
        }
        let k = m.tuple;
        let before = t.stats;
        let j = t.judge(frame, usize::from(m.l3), &k, now);
        let Some(f) = frag else {
            assert_eq!(j, Judged::Keep, "not a fragment");
            assert_eq!(t.stats, before, "not counted");
            return;
        };
        fragments += 1;
        v6 += u64::from(f.v6);
        if let Judged::Follow(g) = j {
            assert!(k.is_non_first_fragment() && !g.is_non_first_fragment(), "{k:?} -> {g:?}");
            assert!(matches!((k, g), (FiveTuple::V4(_), FiveTuple::V4(_)) | (FiveTuple::V6(_), FiveTuple::V6(_))));
            assert_eq!((g.src_ip(), g.dst_ip(), g.proto()), (k.src_ip(), k.dst_ip(), k.proto()));
        }
        let s = t.stats;
        assert_eq!(s.first + s.followed + s.orphans + s.overlaps + s.too_many, fragments, "{s:?}");
        assert_eq!(s.v6, v6, "{s:?}");
    });
});

//! The compiled PDR classifier of one session and direction: the PDRs'
//! match fields flattened, in precedence order, into [`Entry`]s that answer
//! IPv4 packets with plain 32-bit arithmetic — one entry per SDF filter of a
//! PDR (a PDR with none gets one "any packet" entry), each carrying its PDR's
//! rank in the session's precedence-sorted list and the PDR-level fields
//! (QFI, UE address match). The first entry that matches names the PDR:
//! exactly the PDR [`super::rules::RuleSet::classify`] picks (a PDR matches
//! if any of its filters does; lower rank first). The data path reads them
//! as [`Block`]s: eight entries field by field in six cache lines, matched
//! without a branch per entry (the compiler vectorises the eight lanes), the
//! first match found from a bit mask — a scan whose branches do not depend
//! on which PDR the packet matches.
//!
//! The entries hold nothing session-specific (ranks are relative, the UE
//! address and the local F-TEID are checked against the index slot that found
//! the session), so the sessions whose PDRs have the same match fields share
//! one interned classifier: with operator-provisioned filter templates, a few
//! hot lines serve every session. IPv6 packets, and sessions the entries
//! cannot express (several local F-TEIDs, an IPv4-mapped UE IPv6 address),
//! take the general path over [`super::rules::Pdr`]s and [`super::rules::Sdf`]s.

use super::rules::{Pdr, Prefix, Sdf, ANY_QFI};

/// A packet QFI that no PDR names (the packet has no PDU Session Container).
pub const NO_QFI: u8 = 0xfe;

/// One SDF filter of one PDR, for IPv4 packets (32 bytes, line-aligned in pairs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C, align(32))]
pub struct Entry {
    /// Remote IPv4 prefix (masked address; [`NEVER`] when the prefix excludes IPv4).
    pub remote: u32,
    /// Remote mask (0: any).
    pub remote_mask: u32,
    /// UE-end IPv4 prefix, unless [`Entry::ASSIGNED`].
    pub ue: u32,
    /// UE-end mask.
    pub ue_mask: u32,
    /// Remote ports, inclusive.
    pub remote_ports: [u16; 2],
    /// UE ports, inclusive.
    pub ue_ports: [u16; 2],
    /// The PDR's rank: its index among the session's PDRs of the direction.
    pub rank: u16,
    /// IP protocol (unless [`Entry::ANY_PROTO`]).
    pub proto: u8,
    /// QFI the packet must carry, or [`ANY_QFI`].
    pub qfi: u8,
    /// [`Entry::ANY_PROTO`], [`Entry::UE_IP`], [`Entry::ASSIGNED`].
    pub flags: u8,
}

/// A prefix no IPv4 address lies in: `a & 0 == 1` never holds.
pub const NEVER: (u32, u32) = (1, 0);

/// The classification fields of an IPv4 packet seen from the UE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pkt {
    /// IP protocol.
    pub proto: u8,
    /// The packet's QFI, or [`NO_QFI`].
    pub qfi: u8,
    /// UE-end address.
    pub ue: u32,
    /// Remote address.
    pub remote: u32,
    /// UE port.
    pub ue_port: u16,
    /// Remote port.
    pub remote_port: u16,
    /// The UE end is the session's UE address.
    pub ue_ok: bool,
}

impl Entry {
    /// Flag: any IP protocol.
    pub const ANY_PROTO: u8 = 1;
    /// Flag: the PDR matches the UE address.
    pub const UE_IP: u8 = 2;
    /// Flag: the filter's UE end is `assigned` (the session's UE address).
    pub const ASSIGNED: u8 = 4;

    /// Whether the packet matches the PDR's fields and this filter.
    #[inline(always)]
    pub fn matches(&self, p: &Pkt) -> bool {
        let ue_end = if self.flags & Self::ASSIGNED != 0 { p.ue_ok } else { p.ue & self.ue_mask == self.ue };
        (self.qfi == ANY_QFI || self.qfi == p.qfi)
            && (self.flags & Self::UE_IP == 0 || p.ue_ok)
            && (self.flags & Self::ANY_PROTO != 0 || self.proto == p.proto)
            && p.remote & self.remote_mask == self.remote
            && ue_end
            && p.remote_port.wrapping_sub(self.remote_ports[0]) <= self.remote_ports[1] - self.remote_ports[0]
            && p.ue_port.wrapping_sub(self.ue_ports[0]) <= self.ue_ports[1] - self.ue_ports[0]
    }
}

/// What acting on an uplink PDR needs, its FAR and URR relative to the
/// session's first (which the TEID index slot holds): so the usual uplink
/// packet reads no per-PDR line at all. In [`super::rules::RuleSet::tacts`],
/// parallel to the classifier's blocks: rank r of the classifier at block b
/// is at `b * LANES + r` (a direction has no more PDRs than entries).
/// [`TAct::SLOW`]: read [`super::rules::Act`] instead (downlink, an MBR, an
/// outer header to create, several URRs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C, align(8))]
pub struct TAct {
    /// FAR index - the session's first.
    pub far: u16,
    /// URR index - the session's first, or `u16::MAX` for none.
    pub urr: u16,
    /// [`TAct::SLOW`], the FAR's action and destination ([`TAct::DROP`], ...).
    pub bits: u8,
    /// The PDR's flags ([`super::rules::Pdr::OHR`], ...).
    pub flags: u8,
    /// QER gates.
    pub gate: u8,
    /// Downlink QFI mark.
    pub mark_qfi: u8,
}

impl TAct {
    /// Not expressible here: read the PDR's [`super::rules::Act`].
    pub const SLOW: u8 = 1;
    /// The FAR drops.
    pub const DROP: u8 = 2;
    /// The FAR buffers.
    pub const BUFFER: u8 = 4;
    /// The FAR's destination is the access side.
    pub const TO_ACCESS: u8 = 8;
    /// A [`TAct`] that says "read the Act".
    pub const SLOW_ACT: TAct = TAct { far: 0, urr: 0, bits: TAct::SLOW, flags: 0, gate: 0, mark_qfi: 0 };
}

/// Entries per [`Block`].
pub const LANES: usize = 8;

/// Eight [`Entry`]s, field by field, every field widened to 32 bits (six
/// cache lines): one lane per entry, so matching a block is the same few
/// 8 x 32-bit vector operations for every field and one OR reduction to a
/// bit mask (mixed 8/16/32-bit lanes vectorised poorly: ~170 instructions a
/// block, against ~40). Unused lanes never match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Block {
    /// Remote prefixes.
    pub remote: [u32; LANES],
    /// Remote masks.
    pub remote_mask: [u32; LANES],
    /// UE-end prefixes (`assigned`: any here, with the UE bit of `meta_mask`).
    pub ue: [u32; LANES],
    /// UE-end masks.
    pub ue_mask: [u32; LANES],
    /// Remote ports: first.
    pub remote_lo: [u32; LANES],
    /// Remote ports: last - first.
    pub remote_span: [u32; LANES],
    /// UE ports: first.
    pub ue_lo: [u32; LANES],
    /// UE ports: last - first.
    pub ue_span: [u32; LANES],
    /// What the packet's [`Block::meta_word`] must hold under `meta_mask`:
    /// the protocol (bits 0-7), the QFI (8-15), 0 in bit 16.
    pub meta: [u32; LANES],
    /// Bits 0-7 set unless any protocol; 8-15 unless [`ANY_QFI`]; bit 16
    /// when the UE end must be the session's UE address (the PDR's UE
    /// address match, or an `assigned` filter).
    pub meta_mask: [u32; LANES],
    /// PDR ranks.
    pub rank: [u16; LANES],
}

impl Block {
    const NEVER: Block = Block {
        remote: [NEVER.0; LANES],
        remote_mask: [NEVER.1; LANES],
        ue: [0; LANES],
        ue_mask: [0; LANES],
        remote_lo: [0; LANES],
        remote_span: [0; LANES],
        ue_lo: [0; LANES],
        ue_span: [0; LANES],
        meta: [0; LANES],
        meta_mask: [0; LANES],
        rank: [0; LANES],
    };

    /// The packet's protocol, QFI and "UE end is not the session's UE" bit as [`Block::meta`] reads them.
    #[inline(always)]
    pub fn meta_word(p: &Pkt) -> u32 {
        u32::from(p.proto) | u32::from(p.qfi) << 8 | u32::from(!p.ue_ok) << 16
    }

    /// Entries in blocks of [`LANES`].
    pub fn pack(entries: &[Entry]) -> Vec<Block> {
        entries
            .chunks(LANES)
            .map(|c| {
                let mut b = Block::NEVER;
                for (k, e) in c.iter().enumerate() {
                    let assigned = e.flags & Entry::ASSIGNED != 0;
                    b.remote[k] = e.remote;
                    b.remote_mask[k] = e.remote_mask;
                    (b.ue[k], b.ue_mask[k]) = if assigned { (0, 0) } else { (e.ue, e.ue_mask) };
                    b.remote_lo[k] = u32::from(e.remote_ports[0]);
                    b.remote_span[k] = u32::from(e.remote_ports[1].wrapping_sub(e.remote_ports[0]));
                    b.ue_lo[k] = u32::from(e.ue_ports[0]);
                    b.ue_span[k] = u32::from(e.ue_ports[1].wrapping_sub(e.ue_ports[0]));
                    let any_proto = e.flags & Entry::ANY_PROTO != 0;
                    let (proto, proto_mask) = if any_proto { (0, 0) } else { (u32::from(e.proto), 0xff) };
                    let (qfi, qfi_mask) = if e.qfi == ANY_QFI { (0, 0) } else { (u32::from(e.qfi), 0xff) };
                    let need_ue = assigned || e.flags & Entry::UE_IP != 0;
                    b.meta[k] = proto | qfi << 8;
                    b.meta_mask[k] = proto_mask | qfi_mask << 8 | u32::from(need_ue) << 16;
                    b.rank[k] = e.rank;
                    if e.remote_ports[0] > e.remote_ports[1] || e.ue_ports[0] > e.ue_ports[1] {
                        // An empty port range matches nothing (as `Sdf::matches`).
                        (b.remote[k], b.remote_mask[k]) = NEVER;
                    }
                }
                b
            })
            .collect()
    }

    /// Bit k: lane k matches. Every lane is computed (no branch per lane)
    /// with 32-bit integer operations only, which the compiler turns into
    /// 8-wide vector operations: a lane's mismatches OR into a word that is
    /// zero exactly when it matches. A port range test `d = port - lo <=
    /// span` is "no bit above 15 in `d | (span - d)`": ports and spans are
    /// 16-bit, so `d` or `span - d` wraps exactly when the port is out of range.
    #[inline(always)]
    pub fn mask(&self, p: &Pkt) -> u32 {
        let w = Block::meta_word(p);
        let (rp, up) = (u32::from(p.remote_port), u32::from(p.ue_port));
        let mut miss = [0u32; LANES];
        for (k, x) in miss.iter_mut().enumerate() {
            let d1 = rp.wrapping_sub(self.remote_lo[k]);
            let d2 = up.wrapping_sub(self.ue_lo[k]);
            *x = ((p.remote & self.remote_mask[k]) ^ self.remote[k])
                | ((p.ue & self.ue_mask[k]) ^ self.ue[k])
                | ((w & self.meta_mask[k]) ^ self.meta[k])
                | ((d1 | self.remote_span[k].wrapping_sub(d1)) & 0xffff_0000)
                | ((d2 | self.ue_span[k].wrapping_sub(d2)) & 0xffff_0000);
        }
        flowplane_table::simd::zero_lanes_u32x8(&miss)
    }
}

/// The rank of the first PDR whose entries match (one branch per block of eight).
#[inline(always)]
pub fn first(blocks: &[Block], p: &Pkt) -> Option<u16> {
    for b in blocks {
        let m = b.mask(p);
        if m != 0 {
            return Some(b.rank[m.trailing_zeros() as usize]);
        }
    }
    None
}

/// A prefix over IPv4-mapped addresses as a 32-bit (address, mask) that
/// IPv4 packets match alike: the upper 96 bits of a mapped address are
/// fixed, so they either always or never agree with the prefix's.
pub fn v4_prefix(p: &Prefix) -> (u32, u32) {
    const MAPPED: u128 = 0xffff_0000_0000;
    if MAPPED & p.mask == p.addr & !0xffff_ffffu128 {
        (p.addr as u32, p.mask as u32)
    } else {
        NEVER
    }
}

/// The entries of one direction's PDRs (by precedence); `uplink` PDRs
/// match QFIs, downlink ones never do (as in the general path). `None`
/// when they cannot be expressed (more than 65,535 PDRs or entries).
pub fn compile(pdrs: &[Pdr], sdfs: &[Sdf], uplink: bool) -> Option<Vec<Entry>> {
    let mut out = Vec::with_capacity(pdrs.len());
    for (rank, p) in pdrs.iter().enumerate() {
        let rank = u16::try_from(rank).ok()?;
        let qfi = if uplink { p.qfi } else { ANY_QFI };
        let ue_ip = if p.ue_ip() { Entry::UE_IP } else { 0 };
        if p.sdf_len == 0 {
            out.push(Entry {
                remote_ports: [0, u16::MAX],
                ue_ports: [0, u16::MAX],
                rank,
                qfi,
                flags: ue_ip | Entry::ANY_PROTO,
                ..Entry::default()
            });
            continue;
        }
        let at = p.sdf_start as usize;
        for d in sdfs.get(at..at + usize::from(p.sdf_len))? {
            let (remote, remote_mask) = v4_prefix(&d.remote);
            let (ue, ue_mask) = if d.ue.assigned { (0, 0) } else { v4_prefix(&d.ue) };
            let any_proto = d.proto > 0xff;
            out.push(Entry {
                remote,
                remote_mask,
                ue,
                ue_mask,
                remote_ports: [d.remote_ports.0, d.remote_ports.1],
                ue_ports: [d.ue_ports.0, d.ue_ports.1],
                rank,
                proto: if any_proto { 0 } else { d.proto as u8 },
                qfi,
                flags: ue_ip
                    | if any_proto { Entry::ANY_PROTO } else { 0 }
                    | if d.ue.assigned { Entry::ASSIGNED } else { 0 },
            });
        }
    }
    (out.len() <= usize::from(u16::MAX)).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn blocks_are_six_lines() {
        assert_eq!(std::mem::size_of::<Block>(), 384);
        assert_eq!(std::mem::align_of::<Block>(), 64);
    }

    #[test]
    fn blocks_match_as_their_entries() {
        let e = |rank, proto, qfi, flags, remote: (u32, u32), rp: [u16; 2]| Entry {
            remote: remote.0,
            remote_mask: remote.1,
            ue: 0x0a00_0000,
            ue_mask: 0xff00_0000,
            remote_ports: rp,
            ue_ports: [0, u16::MAX],
            rank,
            proto,
            qfi,
            flags,
        };
        let entries: Vec<Entry> = (0..19u16)
            .map(|k| {
                let flags = [0, Entry::ANY_PROTO, Entry::UE_IP, Entry::ASSIGNED][usize::from(k % 4)];
                let remote = if k % 5 == 0 { NEVER } else { (0xcb00_7100 & !(u32::from(k % 3) * 0xff), 0xffff_ff00) };
                let qfi = if k % 3 == 0 { ANY_QFI } else { (k % 3) as u8 };
                e(k, [6, 17][usize::from(k % 2)], qfi, flags, remote, [k * 3, k * 3 + 4])
            })
            .collect();
        let blocks = Block::pack(&entries);
        assert_eq!(blocks.len(), 3);
        for proto in [6, 17] {
            for qfi in [NO_QFI, 1, 2] {
                for ue_ok in [false, true] {
                    for ue in [0x0a01_0203, 0x0b00_0001] {
                        for remote in [0xcb00_7105, 0xcb00_0005] {
                            for port in 0..60 {
                                let p = Pkt { proto, qfi, ue, remote, ue_port: 9, remote_port: port, ue_ok };
                                let want = entries.iter().find(|e| e.matches(&p)).map(|e| e.rank);
                                assert_eq!(first(&blocks, &p), want, "{p:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn v4_prefixes_of_mapped_and_ipv6_prefixes() {
        let p = |s: &str, len| Prefix::new(s.parse::<IpAddr>().unwrap(), len).unwrap();
        assert_eq!(v4_prefix(&p("10.1.0.0", 16)), (0x0a01_0000, 0xffff_0000));
        assert_eq!(v4_prefix(&Prefix::ANY), (0, 0));
        assert_eq!(v4_prefix(&p("2001:db8::", 32)), NEVER);
        // ::/8 holds every IPv4-mapped address; ::ffff:0:0/96 too; 1::/16 none.
        assert_eq!(v4_prefix(&p("::", 8)), (0, 0));
        assert_eq!(v4_prefix(&p("::ffff:0:0", 96)), (0, 0));
        assert_eq!(v4_prefix(&p("1::", 16)), NEVER);
        // A /120 inside the mapped range.
        assert_eq!(v4_prefix(&p("::ffff:10.0.0.0", 120)), (0x0a00_0000, 0xffff_ff00));
    }
}

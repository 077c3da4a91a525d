//! The compiled PDR classifier of one session and direction: the PDRs'
//! match fields flattened, in precedence order, into 32-byte [`Entry`]s (two
//! per cache line) that answer IPv4 packets with plain 32-bit arithmetic —
//! one entry per SDF filter of a PDR (a PDR with none gets one "any packet"
//! entry), each carrying its PDR's rank in the session's precedence-sorted
//! list and the PDR-level fields (QFI, UE address match). The first entry
//! that matches names the PDR: exactly the PDR [`super::rules::RuleSet::classify`]
//! picks (a PDR matches if any of its filters does; lower rank first).
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

/// The rank of the first PDR whose entries match.
#[inline(always)]
pub fn first(entries: &[Entry], p: &Pkt) -> Option<u16> {
    entries.iter().find(|e| e.matches(p)).map(|e| e.rank)
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
    fn entries_are_half_a_line() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        assert_eq!(std::mem::align_of::<Entry>(), 32);
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

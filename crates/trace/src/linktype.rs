//! Link-layer types of trace files and their conversion to Ethernet.
//!
//! Owns [`LinkType`] (the link types flowplane accepts: Ethernet, raw IP, raw IPv4/IPv6, Linux cooked capture v1 and
//! v2, BSD and OpenBSD loopback, PPP, PPP in HDLC framing, Cisco HDLC), the mapping from/to the numeric DLT values
//! stored in pcap/pcapng files, names for common unsupported DLTs (for error messages), and [`to_ethernet`], which
//! presents any supported packet as an Ethernet II frame so the rest of the pipeline only ever parses Ethernet.
//! Packets that have no Ethernet form (an unknown IP version, PPP LCP, ...) are errors whose
//! [`TraceErrorKind::unparsed_reason`] says how to count them; they never end a run.

use std::fmt;

use crate::error::{TraceError, TraceErrorKind};
use crate::reader::PacketRef;

/// A supported link-layer header type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// DLT 1: Ethernet II (and 802.3) frames without FCS.
    Ethernet,
    /// DLT 101 (`LINKTYPE_RAW`), also 12 and 14 (BSD `DLT_RAW`): an IP packet with no link-layer header; the version
    /// nibble tells v4 from v6.
    RawIp,
    /// DLT 228 (`LINKTYPE_IPV4`): raw IPv4 (like Wireshark, a version-6 packet is read as IPv6).
    RawIpv4,
    /// DLT 229 (`LINKTYPE_IPV6`): raw IPv6.
    RawIpv6,
    /// DLT 113: Linux cooked capture v1 (16-byte header).
    LinuxSll,
    /// DLT 276: Linux cooked capture v2 (20-byte header).
    LinuxSll2,
    /// DLT 0 (`DLT_NULL`): BSD loopback, a 4-byte address family in the capturing host's byte order (either order is
    /// accepted, as Wireshark does). AF_INET is 2; AF_INET6 is 24 (NetBSD, OpenBSD), 28 (FreeBSD) or 30 (macOS).
    Null,
    /// DLT 108 (`LINKTYPE_LOOP`): OpenBSD loopback, the same address family in network byte order.
    Loop,
    /// DLT 9: PPP (RFC 1661), optionally with the RFC 1662 `ff 03` address and control bytes; the protocol field may
    /// be compressed to one byte.
    Ppp,
    /// DLT 50: PPP in HDLC-like framing (RFC 1662), or Cisco HDLC framing when the first byte is 0x0f or 0x8f.
    PppHdlc,
    /// DLT 104: Cisco HDLC: address, control, and an EtherType.
    CiscoHdlc,
}

/// Numeric DLT / LINKTYPE values.
pub mod dlt {
    /// `LINKTYPE_NULL`: BSD loopback.
    pub const NULL: u32 = 0;
    /// `LINKTYPE_ETHERNET`.
    pub const ETHERNET: u32 = 1;
    /// `LINKTYPE_PPP`.
    pub const PPP: u32 = 9;
    /// `DLT_RAW` on OpenBSD.
    pub const RAW_OPENBSD: u32 = 12;
    /// `DLT_RAW` on BSD/OS.
    pub const RAW_BSDOS: u32 = 14;
    /// `LINKTYPE_PPP_HDLC`.
    pub const PPP_HDLC: u32 = 50;
    /// `LINKTYPE_RAW`.
    pub const RAW: u32 = 101;
    /// `LINKTYPE_C_HDLC`: Cisco HDLC.
    pub const C_HDLC: u32 = 104;
    /// `LINKTYPE_LOOP`: OpenBSD loopback.
    pub const LOOP: u32 = 108;
    /// `LINKTYPE_LINUX_SLL`.
    pub const LINUX_SLL: u32 = 113;
    /// `LINKTYPE_IPV4`.
    pub const IPV4: u32 = 228;
    /// `LINKTYPE_IPV6`.
    pub const IPV6: u32 = 229;
    /// `LINKTYPE_LINUX_SLL2`.
    pub const LINUX_SLL2: u32 = 276;
}

impl LinkType {
    /// Every supported link type.
    pub const ALL: [LinkType; 11] = [
        LinkType::Ethernet,
        LinkType::RawIp,
        LinkType::RawIpv4,
        LinkType::RawIpv6,
        LinkType::LinuxSll,
        LinkType::LinuxSll2,
        LinkType::Null,
        LinkType::Loop,
        LinkType::Ppp,
        LinkType::PppHdlc,
        LinkType::CiscoHdlc,
    ];

    /// Maps a DLT value from a file header to a supported link type.
    pub fn from_dlt(dlt: u32) -> Result<Self, TraceError> {
        match dlt {
            dlt::ETHERNET => Ok(LinkType::Ethernet),
            dlt::RAW | dlt::RAW_OPENBSD | dlt::RAW_BSDOS => Ok(LinkType::RawIp),
            dlt::IPV4 => Ok(LinkType::RawIpv4),
            dlt::IPV6 => Ok(LinkType::RawIpv6),
            dlt::LINUX_SLL => Ok(LinkType::LinuxSll),
            dlt::LINUX_SLL2 => Ok(LinkType::LinuxSll2),
            dlt::NULL => Ok(LinkType::Null),
            dlt::LOOP => Ok(LinkType::Loop),
            dlt::PPP => Ok(LinkType::Ppp),
            dlt::PPP_HDLC => Ok(LinkType::PppHdlc),
            dlt::C_HDLC => Ok(LinkType::CiscoHdlc),
            other => Err(TraceErrorKind::UnsupportedLinkType(other).into()),
        }
    }

    /// The canonical DLT value written to files.
    pub fn dlt(self) -> u32 {
        match self {
            LinkType::Ethernet => dlt::ETHERNET,
            LinkType::RawIp => dlt::RAW,
            LinkType::RawIpv4 => dlt::IPV4,
            LinkType::RawIpv6 => dlt::IPV6,
            LinkType::LinuxSll => dlt::LINUX_SLL,
            LinkType::LinuxSll2 => dlt::LINUX_SLL2,
            LinkType::Null => dlt::NULL,
            LinkType::Loop => dlt::LOOP,
            LinkType::Ppp => dlt::PPP,
            LinkType::PppHdlc => dlt::PPP_HDLC,
            LinkType::CiscoHdlc => dlt::C_HDLC,
        }
    }

    /// Human-readable name.
    pub fn name(self) -> &'static str {
        match self {
            LinkType::Ethernet => "Ethernet",
            LinkType::RawIp => "raw IP",
            LinkType::RawIpv4 => "raw IPv4",
            LinkType::RawIpv6 => "raw IPv6",
            LinkType::LinuxSll => "Linux cooked capture v1",
            LinkType::LinuxSll2 => "Linux cooked capture v2",
            LinkType::Null => "BSD loopback",
            LinkType::Loop => "OpenBSD loopback",
            LinkType::Ppp => "PPP",
            LinkType::PppHdlc => "PPP in HDLC framing",
            LinkType::CiscoHdlc => "Cisco HDLC",
        }
    }
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of a DLT value (supported or not) for error messages; `None` when unknown.
pub fn dlt_name(dlt: u32) -> Option<&'static str> {
    Some(match dlt {
        0 => "BSD loopback",
        1 => "Ethernet",
        6 => "IEEE 802.5 Token Ring",
        8 => "SLIP",
        9 => "PPP",
        10 => "FDDI",
        12 | 14 | 101 => "raw IP",
        50 => "PPP in HDLC framing",
        51 => "PPPoE",
        104 => "Cisco HDLC",
        105 => "IEEE 802.11",
        107 => "Frame Relay",
        108 => "OpenBSD loopback",
        113 => "Linux cooked capture v1",
        119 => "Prism header",
        127 => "IEEE 802.11 radiotap",
        138 => "IP over Fibre Channel",
        143 => "DOCSIS",
        147..=162 => "user-defined",
        163 => "IEEE 802.11 AVS",
        187 => "Bluetooth HCI H4",
        189 => "Linux USB",
        192 => "PPI",
        195 => "IEEE 802.15.4",
        197 => "Endace ERF",
        201 => "Bluetooth HCI H4 with direction",
        220 => "Linux USB memory-mapped",
        227 => "SocketCAN",
        228 => "raw IPv4",
        229 => "raw IPv6",
        239 => "Linux netfilter log",
        249 => "Linux netlink",
        251 => "Bluetooth LE link layer",
        252 => "Wireshark upper PDU",
        253 => "Linux netlink",
        264 => "IPMI",
        274 => "Ethernet with FCS",
        276 => "Linux cooked capture v2",
        _ => return None,
    })
}

/// Length of the synthesized Ethernet header.
const ETH_HDR: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const SLL_HDR: u8 = 16;
const SLL2_HDR: u8 = 20;
/// Synthesized frames use locally administered MACs so nothing mistakes them for real stations.
const SYNTH_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const SYNTH_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// PPP protocol numbers of IPv4 and IPv6 (RFC 1332, RFC 5072).
const PPP_IPV4: u16 = 0x0021;
const PPP_IPV6: u16 = 0x0057;
/// Loopback address families: AF_INET everywhere, AF_INET6 on NetBSD/OpenBSD, FreeBSD and macOS.
const AF_INET: u32 = 2;
const AF_INET6: [u32; 3] = [24, 28, 30];

/// How to present a packet as Ethernet: the EtherType of the synthesized header, where the network-layer payload
/// starts and where in the packet the source MAC is (0: none, use the synthetic one). Holds no borrow, so a reader
/// can decide before it lends out the packet; four bytes, so it travels in a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    ethertype: u16,
    payload: u8,
    src_at: u8,
}

/// Decides how to present `data` of link type `link` as Ethernet: `Ok(None)` when it already is Ethernet.
/// Ethernet and raw IP, the common cases, are decided inline.
#[inline(always)]
pub(crate) fn layout(link: LinkType, data: &[u8]) -> Result<Option<Layout>, TraceErrorKind> {
    match link {
        LinkType::Ethernet => Ok(None),
        LinkType::RawIp => raw_ip(data).map(Some),
        _ => layout_other(link, data),
    }
}

/// A raw IP packet: the version nibble gives the EtherType.
#[inline(always)]
fn raw_ip(data: &[u8]) -> Result<Layout, TraceErrorKind> {
    let Some(&first) = data.first() else {
        return Err(TraceErrorKind::PacketTooShort { link_type: LinkType::RawIp.name(), len: 0 });
    };
    let ethertype = match first >> 4 {
        4 => ETHERTYPE_IPV4,
        6 => ETHERTYPE_IPV6,
        v => return Err(TraceErrorKind::UnknownIpVersion(v)),
    };
    Ok(Layout { ethertype, payload: 0, src_at: 0 })
}

/// [`layout`] out of line, for the link types with a header to decode.
fn layout_other(link: LinkType, data: &[u8]) -> Result<Option<Layout>, TraceErrorKind> {
    let too_short = || TraceErrorKind::PacketTooShort { link_type: link.name(), len: data.len() };
    let ip = |ethertype: u16, payload: u8| Layout { ethertype, payload, src_at: 0 };
    let mut l = match link {
        LinkType::Ethernet => return Ok(None),
        LinkType::RawIp => return raw_ip(data).map(Some),
        LinkType::RawIpv4 | LinkType::RawIpv6 => {
            if data.is_empty() {
                return Err(too_short());
            }
            ip(if link == LinkType::RawIpv4 { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 }, 0)
        }
        LinkType::LinuxSll => {
            if data.len() < usize::from(SLL_HDR) {
                return Err(too_short());
            }
            // packet type(2) ARPHRD(2) addr len(2) addr(8) protocol(2)
            let addr_len = u16::from_be_bytes([data[4], data[5]]);
            let proto = u16::from_be_bytes([data[14], data[15]]);
            Layout { ethertype: sll_ethertype(proto)?, payload: SLL_HDR, src_at: if addr_len == 6 { 6 } else { 0 } }
        }
        LinkType::LinuxSll2 => {
            if data.len() < usize::from(SLL2_HDR) {
                return Err(too_short());
            }
            // protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1) addr len(1) addr(8)
            let proto = u16::from_be_bytes([data[0], data[1]]);
            Layout { ethertype: sll_ethertype(proto)?, payload: SLL2_HDR, src_at: if data[11] == 6 { 12 } else { 0 } }
        }
        LinkType::Null | LinkType::Loop => {
            let Some(h) = data.get(..4) else { return Err(too_short()) };
            let h = [h[0], h[1], h[2], h[3]];
            let af = if link == LinkType::Loop {
                u32::from_be_bytes(h)
            } else {
                // Host byte order of the capturing machine: a family fits 16 bits, so set high bits mean swapped.
                let v = u32::from_le_bytes(h);
                if v & 0xffff_0000 != 0 {
                    v.swap_bytes()
                } else {
                    v
                }
            };
            match af {
                AF_INET => ip(ETHERTYPE_IPV4, 4),
                v if AF_INET6.contains(&v) => ip(ETHERTYPE_IPV6, 4),
                protocol => return Err(TraceErrorKind::NoEthernetForm { link_type: link.name(), protocol }),
            }
        }
        LinkType::Ppp => ppp(data, link)?,
        LinkType::PppHdlc => match data.first() {
            Some(0x0f | 0x8f) => cisco_hdlc(data, link)?,
            _ => ppp(data, link)?,
        },
        LinkType::CiscoHdlc => cisco_hdlc(data, link)?,
    };
    // Like Wireshark's IPv4 dissector: a header that announces IPv4 over a version-6 packet carries IPv6.
    if l.ethertype == ETHERTYPE_IPV4 && data.get(usize::from(l.payload)).is_some_and(|b| b >> 4 == 6) {
        l.ethertype = ETHERTYPE_IPV6;
    }
    Ok(Some(l))
}

/// A PPP packet: optional `ff 03` (address, control), then a 1- or 2-byte protocol field (odd first byte: the
/// compressed 1-byte form, RFC 1661 section 6.5).
fn ppp(data: &[u8], link: LinkType) -> Result<Layout, TraceErrorKind> {
    let too_short = || TraceErrorKind::PacketTooShort { link_type: link.name(), len: data.len() };
    let at: u8 = if data.starts_with(&[0xff, 0x03]) { 2 } else { 0 };
    let first = *data.get(usize::from(at)).ok_or_else(too_short)?;
    let (proto, payload) = if first & 1 == 1 {
        (u16::from(first), at + 1)
    } else {
        let second = *data.get(usize::from(at) + 1).ok_or_else(too_short)?;
        (u16::from_be_bytes([first, second]), at + 2)
    };
    let ethertype = match proto {
        PPP_IPV4 => ETHERTYPE_IPV4,
        PPP_IPV6 => ETHERTYPE_IPV6,
        p => return Err(TraceErrorKind::NoEthernetForm { link_type: link.name(), protocol: u32::from(p) }),
    };
    Ok(Layout { ethertype, payload, src_at: 0 })
}

/// A Cisco HDLC packet: address(1) control(1) protocol(2), the protocol being an EtherType.
fn cisco_hdlc(data: &[u8], link: LinkType) -> Result<Layout, TraceErrorKind> {
    let Some(h) = data.get(..4) else {
        return Err(TraceErrorKind::PacketTooShort { link_type: link.name(), len: data.len() });
    };
    let proto = u16::from_be_bytes([h[2], h[3]]);
    if proto < 0x0600 {
        return Err(TraceErrorKind::NoEthernetForm { link_type: link.name(), protocol: u32::from(proto) });
    }
    Ok(Layout { ethertype: proto, payload: 4, src_at: 0 })
}

/// Writes the Ethernet form of `data` (laid out by [`layout`]) into `scratch` and returns it.
#[inline(always)]
pub(crate) fn build<'a>(l: Layout, data: &[u8], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    let payload = data.get(usize::from(l.payload)..).unwrap_or(&[]);
    // A fixed-size array, so the copies below are plain stores rather than calls.
    let src: [u8; 6] = match l.src_at {
        0 => SYNTH_SRC_MAC,
        at => data.get(usize::from(at)..usize::from(at) + 6).and_then(|m| m.try_into().ok()).unwrap_or(SYNTH_SRC_MAC),
    };
    scratch.clear();
    scratch.reserve(ETH_HDR + payload.len());
    scratch.extend_from_slice(&SYNTH_DST_MAC);
    scratch.extend_from_slice(&src);
    scratch.extend_from_slice(&l.ethertype.to_be_bytes());
    scratch.extend_from_slice(payload);
    scratch.as_slice()
}

/// Present any supported link type as an Ethernet II frame.
///
/// Ethernet packets are returned as they are (no copy). Other packets get a 14-byte Ethernet header (EtherType from
/// the link header or the IP version nibble; source MAC from the SLL address when it is 6 bytes long, otherwise a
/// fixed locally administered one) followed by the network-layer payload, built in `scratch`, which is reused: after
/// it has grown to the largest packet no further allocation happens. An error means this packet has no Ethernet form
/// ([`TraceErrorKind::unparsed_reason`] gives the reason to count); the next packet may well have one.
pub fn to_ethernet<'a>(pkt: &PacketRef<'a>, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], TraceError> {
    match layout(pkt.link_type, pkt.data)? {
        None => Ok(pkt.data),
        Some(l) => Ok(build(l, pkt.data, scratch)),
    }
}

/// The wire length of a converted packet: the link header bytes added or removed by the conversion change it too.
pub(crate) fn converted_wire_len(orig_len: u32, captured: usize, converted: usize) -> u32 {
    let v = i64::from(orig_len) + converted as i64 - captured as i64;
    v.clamp(converted as i64, i64::from(u32::MAX)) as u32
}

/// SLL protocol values below 0x0600 are Linux pseudo-protocols (802.2 LLC, CAN, ...) with no Ethernet II form.
#[inline]
fn sll_ethertype(proto: u16) -> Result<u16, TraceErrorKind> {
    if proto >= 0x0600 {
        Ok(proto)
    } else {
        Err(TraceErrorKind::UnsupportedSllProtocol(proto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlt_round_trip() {
        for lt in LinkType::ALL {
            assert_eq!(LinkType::from_dlt(lt.dlt()).unwrap(), lt);
            assert_eq!(dlt_name(lt.dlt()).map(|n| n.to_lowercase()), Some(lt.name().to_lowercase()), "{lt}");
        }
        for raw in [12, 14, 101] {
            assert_eq!(LinkType::from_dlt(raw).unwrap(), LinkType::RawIp);
        }
    }

    #[test]
    fn unsupported_dlt_is_named() {
        let e = LinkType::from_dlt(105).unwrap_err();
        assert_eq!(e.to_string(), "unsupported link type 105 (IEEE 802.11)");
        let e = LinkType::from_dlt(60000).unwrap_err();
        assert_eq!(e.to_string(), "unsupported link type 60000");
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    fn eth(link: LinkType, data: &[u8]) -> Result<Vec<u8>, TraceErrorKind> {
        let mut scratch = Vec::new();
        Ok(match layout(link, data)? {
            None => data.to_vec(),
            Some(l) => build(l, data, &mut scratch).to_vec(),
        })
    }

    fn ethertype(f: &[u8]) -> u16 {
        u16::from_be_bytes([f[12], f[13]])
    }

    const V4: [u8; 4] = [0x45, 0, 0, 20];
    const V6: [u8; 4] = [0x60, 0, 0, 0];

    #[test]
    fn loopback_families_in_both_byte_orders() {
        for (hdr, et) in [
            (2u32.to_le_bytes(), 0x0800),
            (2u32.to_be_bytes(), 0x0800),
            (24u32.to_le_bytes(), 0x86dd),
            (28u32.to_be_bytes(), 0x86dd),
            (30u32.to_le_bytes(), 0x86dd),
        ] {
            let pkt = [&hdr[..], if et == 0x0800 { &V4 } else { &V6 }].concat();
            let f = eth(LinkType::Null, &pkt).unwrap();
            assert_eq!((ethertype(&f), &f[14..]), (et, &pkt[4..]));
        }
        // OpenBSD loopback is network order only, as in Wireshark.
        let be = [&2u32.to_be_bytes()[..], &V4].concat();
        assert_eq!(ethertype(&eth(LinkType::Loop, &be).unwrap()), 0x0800);
        let le = [&2u32.to_le_bytes()[..], &V4].concat();
        assert!(matches!(eth(LinkType::Loop, &le), Err(TraceErrorKind::NoEthernetForm { protocol: 0x0200_0000, .. })));
        assert!(matches!(eth(LinkType::Null, &[7, 0, 0, 0]), Err(TraceErrorKind::NoEthernetForm { protocol: 7, .. })));
        assert!(matches!(eth(LinkType::Null, &[2, 0]), Err(TraceErrorKind::PacketTooShort { len: 2, .. })));
    }

    #[test]
    fn ppp_framings_and_compressed_protocol() {
        for (hdr, et) in [
            (&[0x00, 0x21][..], 0x0800),
            (&[0x00, 0x57], 0x86dd),
            (&[0x21], 0x0800),
            (&[0x57], 0x86dd),
            (&[0xff, 0x03, 0x00, 0x21], 0x0800),
            (&[0xff, 0x03, 0x57], 0x86dd),
        ] {
            let body = if et == 0x0800 { V4 } else { V6 };
            let pkt = [hdr, &body].concat();
            for link in [LinkType::Ppp, LinkType::PppHdlc] {
                let f = eth(link, &pkt).unwrap();
                assert_eq!((ethertype(&f), &f[14..]), (et, &body[..]), "{link} {hdr:02x?}");
            }
        }
        let lcp = [0xc0, 0x21, 1, 1, 0, 4];
        assert!(matches!(eth(LinkType::Ppp, &lcp), Err(TraceErrorKind::NoEthernetForm { protocol: 0xc021, .. })));
        assert!(matches!(eth(LinkType::Ppp, &[0x00]), Err(TraceErrorKind::PacketTooShort { .. })));
        assert!(matches!(eth(LinkType::Ppp, &[0xff, 0x03]), Err(TraceErrorKind::PacketTooShort { .. })));
    }

    #[test]
    fn cisco_hdlc_and_its_ppp_hdlc_form() {
        let pkt = [&[0x0f, 0x00, 0x08, 0x00][..], &V4].concat();
        for link in [LinkType::CiscoHdlc, LinkType::PppHdlc] {
            assert_eq!(ethertype(&eth(link, &pkt).unwrap()), 0x0800);
        }
        let slarp = [0x8f, 0x00, 0x80, 0x35, 0, 0, 0, 0];
        assert_eq!(ethertype(&eth(LinkType::CiscoHdlc, &slarp).unwrap()), 0x8035);
        assert!(eth(LinkType::CiscoHdlc, &[0x0f, 0, 0x00, 0x04]).is_err());
        assert!(eth(LinkType::CiscoHdlc, &[0x0f, 0]).is_err());
    }

    #[test]
    fn ipv4_announced_version_6_is_ipv6_like_wireshark() {
        assert_eq!(ethertype(&eth(LinkType::RawIpv4, &V6).unwrap()), 0x86dd);
        assert_eq!(ethertype(&eth(LinkType::RawIpv6, &V4).unwrap()), 0x86dd);
        assert!(matches!(eth(LinkType::RawIp, &[0x30]), Err(TraceErrorKind::UnknownIpVersion(3))));
        assert!(matches!(eth(LinkType::RawIpv6, &[]), Err(TraceErrorKind::PacketTooShort { len: 0, .. })));
    }
}

//! Link-layer types of trace files and their conversion to Ethernet.
//!
//! Owns [`LinkType`] (the four link types flowplane accepts: Ethernet, raw IP, Linux cooked capture v1 and v2),
//! the mapping from/to the numeric DLT values stored in pcap/pcapng files, names for common unsupported DLTs (for
//! error messages), and [`to_ethernet`], which presents any supported packet as an Ethernet II frame so the rest of the
//! pipeline only ever parses Ethernet.

use std::fmt;

use crate::error::{TraceError, TraceErrorKind};
use crate::reader::PacketRef;

/// A supported link-layer header type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// DLT 1: Ethernet II (and 802.3) frames without FCS.
    Ethernet,
    /// DLT 101 (`LINKTYPE_RAW`), also 12 and 14 (BSD `DLT_RAW`), 228 (raw IPv4) and 229 (raw IPv6): an IP packet
    /// with no link-layer header; the version nibble tells v4 from v6.
    RawIp,
    /// DLT 113: Linux cooked capture v1 (16-byte header).
    LinuxSll,
    /// DLT 276: Linux cooked capture v2 (20-byte header).
    LinuxSll2,
}

/// Numeric DLT / LINKTYPE values.
pub mod dlt {
    /// `LINKTYPE_ETHERNET`.
    pub const ETHERNET: u32 = 1;
    /// `DLT_RAW` on OpenBSD.
    pub const RAW_OPENBSD: u32 = 12;
    /// `DLT_RAW` on BSD/OS.
    pub const RAW_BSDOS: u32 = 14;
    /// `LINKTYPE_RAW`.
    pub const RAW: u32 = 101;
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
    /// Maps a DLT value from a file header to a supported link type.
    pub fn from_dlt(dlt: u32) -> Result<Self, TraceError> {
        match dlt {
            dlt::ETHERNET => Ok(LinkType::Ethernet),
            dlt::RAW | dlt::RAW_OPENBSD | dlt::RAW_BSDOS | dlt::IPV4 | dlt::IPV6 => Ok(LinkType::RawIp),
            dlt::LINUX_SLL => Ok(LinkType::LinuxSll),
            dlt::LINUX_SLL2 => Ok(LinkType::LinuxSll2),
            other => Err(TraceErrorKind::UnsupportedLinkType(other).into()),
        }
    }

    /// The canonical DLT value written to files.
    pub fn dlt(self) -> u32 {
        match self {
            LinkType::Ethernet => dlt::ETHERNET,
            LinkType::RawIp => dlt::RAW,
            LinkType::LinuxSll => dlt::LINUX_SLL,
            LinkType::LinuxSll2 => dlt::LINUX_SLL2,
        }
    }

    /// Human-readable name.
    pub fn name(self) -> &'static str {
        match self {
            LinkType::Ethernet => "Ethernet",
            LinkType::RawIp => "raw IP",
            LinkType::LinuxSll => "Linux cooked capture v1",
            LinkType::LinuxSll2 => "Linux cooked capture v2",
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
const SLL_HDR: usize = 16;
const SLL2_HDR: usize = 20;
/// Synthesized frames use locally administered MACs so nothing mistakes them for real stations.
const SYNTH_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const SYNTH_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// Present any supported link type as an Ethernet II frame.
///
/// Ethernet packets are returned as they are (no copy). Raw IP, SLL and SLL2 packets get a 14-byte Ethernet header
/// (EtherType from the IP version nibble or the SLL protocol field; source MAC from the SLL address when it is 6 bytes
/// long, otherwise a fixed locally administered one) followed by the payload, built in `scratch`, which is reused:
/// after it has grown to the largest packet no further allocation happens.
pub fn to_ethernet<'a>(pkt: &PacketRef<'a>, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], TraceError> {
    let data = pkt.data;
    let (ethertype, src, payload) = match pkt.link_type {
        LinkType::Ethernet => return Ok(data),
        LinkType::RawIp => {
            let Some(&first) = data.first() else {
                return Err(TraceErrorKind::PacketTooShort { link_type: "raw IP", len: 0 }.into());
            };
            let ethertype = match first >> 4 {
                4 => ETHERTYPE_IPV4,
                6 => ETHERTYPE_IPV6,
                v => return Err(TraceErrorKind::UnknownIpVersion(v).into()),
            };
            (ethertype, SYNTH_SRC_MAC, data)
        }
        LinkType::LinuxSll => {
            if data.len() < SLL_HDR {
                return Err(
                    TraceErrorKind::PacketTooShort { link_type: "Linux cooked capture v1", len: data.len() }.into()
                );
            }
            // packet type(2) ARPHRD(2) addr len(2) addr(8) protocol(2)
            let addr_len = u16::from_be_bytes([data[4], data[5]]);
            let proto = u16::from_be_bytes([data[14], data[15]]);
            (sll_ethertype(proto)?, sll_src_mac(addr_len, &data[6..14]), &data[SLL_HDR..])
        }
        LinkType::LinuxSll2 => {
            if data.len() < SLL2_HDR {
                return Err(
                    TraceErrorKind::PacketTooShort { link_type: "Linux cooked capture v2", len: data.len() }.into()
                );
            }
            // protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1) addr len(1) addr(8)
            let proto = u16::from_be_bytes([data[0], data[1]]);
            (sll_ethertype(proto)?, sll_src_mac(u16::from(data[11]), &data[12..20]), &data[SLL2_HDR..])
        }
    };
    scratch.clear();
    scratch.reserve(ETH_HDR + payload.len());
    scratch.extend_from_slice(&SYNTH_DST_MAC);
    scratch.extend_from_slice(&src);
    scratch.extend_from_slice(&ethertype.to_be_bytes());
    scratch.extend_from_slice(payload);
    Ok(scratch.as_slice())
}

/// SLL protocol values below 0x0600 are Linux pseudo-protocols (802.2 LLC, CAN, ...) with no Ethernet II form.
fn sll_ethertype(proto: u16) -> Result<u16, TraceError> {
    if proto >= 0x0600 {
        Ok(proto)
    } else {
        Err(TraceErrorKind::UnsupportedSllProtocol(proto).into())
    }
}

fn sll_src_mac(addr_len: u16, addr: &[u8]) -> [u8; 6] {
    match (addr_len, addr.get(..6)) {
        (6, Some(mac)) => {
            let mut out = [0u8; 6];
            out.copy_from_slice(mac);
            out
        }
        _ => SYNTH_SRC_MAC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlt_round_trip() {
        for lt in [LinkType::Ethernet, LinkType::RawIp, LinkType::LinuxSll, LinkType::LinuxSll2] {
            assert_eq!(LinkType::from_dlt(lt.dlt()).unwrap(), lt);
        }
        for raw in [12, 14, 101, 228, 229] {
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

//! The UPF's rules in the shape of TS 29.244: what a session file (TOML or
//! JSON) or the PFCP endpoint provisions ([`SessionSpec`] with its PDRs,
//! FARs, QERs and URRs), and the immutable, compiled [`RuleSet`] the data
//! path reads: sessions in a dense array with their uplink and downlink PDRs
//! sorted by precedence, SDF filters compiled to masks and port ranges, and
//! open-addressing indexes TEID -> session and UE address -> session.
//!
//! SDF filters are written as TS 29.244 §5.2.1A flow descriptions
//! (`permit out 17 from 198.51.100.0/24 5000-5999 to assigned 80`): `from` is
//! the remote (data network) end and `to` the UE, so the same filter matches
//! the uplink (UE -> remote) and downlink (remote -> UE) directions.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flowplane_table::{FixedMap, KeyHash};
use serde::{Deserialize, Serialize};

use super::cls;

/// "None" in the compiled rules' u32 references.
pub const NONE: u32 = u32::MAX;
/// A PDR's QER or URR reference with this bit set starts a list in
/// [`RuleSet::lists`] (its length, then the indices); without it, the one index.
pub const LIST: u32 = 1 << 31;
/// "Any QFI".
pub const ANY_QFI: u8 = 0xff;
/// Largest MBR, kbit/s (1 Tbit/s): keeps the token arithmetic in 64 bits.
pub const MAX_MBR_KBPS: u64 = 1_000_000_000;

/// A source or destination interface (TS 29.244 §8.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Iface {
    /// N3: the RAN side, GTP-U (uplink PDRs match here).
    Access,
    /// N6: the data network side, plain IP (downlink PDRs match here).
    Core,
}

/// A FAR's action (TS 29.244 §8.2.26: FORW, DROP, BUFF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FarAction {
    /// Forward (with outer-header creation when it has one).
    Forward,
    /// Drop.
    Drop,
    /// Buffer (bounded per FAR, counted).
    Buffer,
}

/// A QER gate (TS 29.244 §8.2.7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gate {
    /// Packets pass.
    #[default]
    Open,
    /// Packets are dropped.
    Closed,
}

/// A session file: `[[sessions]]` tables (TOML) or `{"sessions": [...]}` (JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsFile {
    /// The sessions.
    #[serde(default)]
    pub sessions: Vec<SessionSpec>,
}

/// One PFCP session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Session endpoint identifier (the UPF's local SEID).
    pub seid: u64,
    /// The UE's IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ue_ipv4: Option<Ipv4Addr>,
    /// The UE's IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ue_ipv6: Option<Ipv6Addr>,
    /// Packet detection rules.
    #[serde(default)]
    pub pdrs: Vec<PdrSpec>,
    /// Forwarding action rules.
    #[serde(default)]
    pub fars: Vec<FarSpec>,
    /// QoS enforcement rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qers: Vec<QerSpec>,
    /// Usage reporting rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urrs: Vec<UrrSpec>,
    /// The session's buffering action rule (at most one per session, TS 29.244 §7.5.2.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bar: Option<BarSpec>,
}

/// A buffering action rule: how many downlink packets the session's
/// buffering FARs may hold, and for how long.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarSpec {
    /// Rule ID.
    pub id: u8,
    /// Packets held per core (Suggested Buffering Packets Count, or DL
    /// Buffering Suggested Packet Count; default: the `upf` `buffer=` parameter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u32>,
    /// How long a packet may be held, milliseconds (DL Buffering Duration;
    /// default: no limit); older packets are discarded, counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

/// A packet detection rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PdrSpec {
    /// Rule ID (unique in its session).
    pub id: u16,
    /// Precedence: the lowest value matches first.
    pub precedence: u32,
    /// Where matching packets arrive: `access` (uplink) or `core` (downlink).
    pub source: Iface,
    /// Local F-TEID (uplink): the packet's TEID must equal it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teid: Option<u32>,
    /// Match the UE address (source uplink, destination downlink).
    #[serde(default = "yes")]
    pub ue_ip: bool,
    /// QFI: uplink, the PDU Session Container's QFI must equal it; downlink,
    /// the QFI written in the container (unless the QER sets one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qfi: Option<u8>,
    /// SDF filters (flow descriptions); a packet matches if any matches (none: any packet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sdf: Vec<String>,
    /// Remove the GTP-U/UDP/IP outer header (uplink).
    #[serde(default)]
    pub outer_header_removal: bool,
    /// The FAR's ID.
    pub far: u32,
    /// The QERs' IDs (TS 29.244 allows several: e.g. a session AMBR and a
    /// flow MBR; a packet passes if every gate is open and every MBR
    /// conforms). `qer = 3` or `qers = [3, 4]`.
    #[serde(default, alias = "qer", deserialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub qers: Vec<u32>,
    /// The URRs' IDs (each counts the packet). `urr = 3` or `urrs = [3, 4]`.
    #[serde(default, alias = "urr", deserialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub urrs: Vec<u32>,
}

/// A rule-ID list written as one ID or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(x) => vec![x],
        OneOrMany::Many(v) => v,
    })
}

/// A forwarding action rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FarSpec {
    /// Rule ID (unique in its session).
    pub id: u32,
    /// Forward, drop or buffer.
    pub action: FarAction,
    /// Destination interface (default: the opposite of the PDR's source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<Iface>,
    /// Outer header creation: the peer's TEID (GTP-U/UDP/IPv4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ohc_teid: Option<u32>,
    /// Outer header creation: the peer's IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ohc_addr: Option<Ipv4Addr>,
    /// Transport level marking (TS 29.244 §8.2.12): the ToS / traffic class
    /// byte of the outer IP header it creates (DSCP << 2), as the SMF
    /// chooses it for the QoS flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tos: Option<u8>,
    /// With `buffer`: the first packet buffered reports to the CP (NOCP: a
    /// Downlink Data Report; PFCP sessions only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_cp: bool,
}

/// A QoS enforcement rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QerSpec {
    /// Rule ID (unique in its session).
    pub id: u32,
    /// Uplink gate.
    #[serde(default)]
    pub gate_ul: Gate,
    /// Downlink gate.
    #[serde(default)]
    pub gate_dl: Gate,
    /// Uplink maximum bit rate, kbit/s (IP packet bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbr_ul_kbps: Option<u64>,
    /// Downlink maximum bit rate, kbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbr_dl_kbps: Option<u64>,
    /// QFI written into downlink PDU Session Containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qfi: Option<u8>,
    /// Uplink guaranteed bit rate, kbit/s: bytes within it are counted as
    /// guaranteed, the rest as above it (nothing is dropped for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbr_ul_kbps: Option<u64>,
    /// Downlink guaranteed bit rate, kbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbr_dl_kbps: Option<u64>,
}

/// A usage reporting rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrrSpec {
    /// Rule ID (unique in its session).
    pub id: u32,
    /// Total volume (uplink + downlink IP bytes) that raises a usage report;
    /// counting then starts over towards the next report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_threshold: Option<u64>,
    /// Total volume after which the URR's traffic is dropped (reported once, trigger VOLQU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_quota: Option<u64>,
    /// Seconds between periodic reports (Measurement Period; PFCP sessions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement_period: Option<u32>,
    /// Seconds after which a report is sent when there was usage since the last one (Time Threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_threshold: Option<u32>,
}

impl SessionsFile {
    /// Parses a session file: JSON if it starts with `{`, else TOML.
    pub fn parse(text: &str) -> Result<SessionsFile, String> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("bad JSON session file: {e}"))
        } else {
            toml::from_str(text).map_err(|e| format!("bad TOML session file: {}", e.message()))
        }
    }

    /// Reads and parses a session file.
    pub fn load(path: &str) -> Result<SessionsFile, String> {
        let text = crate::read_text_file(path).map_err(|e| format!("cannot read session file {e}"))?;
        Self::parse(&text).map_err(|e| format!("{path}: {e}"))
    }

    /// The file as TOML.
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }
}

/// An address prefix over IPv4-mapped 128-bit addresses (mask 0: any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Prefix {
    /// Address bits (masked).
    pub addr: u128,
    /// Mask.
    pub mask: u128,
    /// Matches the session's UE address (`assigned`; `addr`/`mask` unused),
    /// so identical filters of different sessions are stored once.
    pub assigned: bool,
}

impl Prefix {
    /// Any address.
    pub const ANY: Prefix = Prefix { addr: 0, mask: 0, assigned: false };

    /// Exactly `a`.
    pub fn host(a: IpAddr) -> Prefix {
        Prefix { addr: ip128(a), mask: u128::MAX, assigned: false }
    }

    /// `a/len` (IPv4 lengths count within the mapped address's low 32 bits).
    pub fn new(a: IpAddr, len: u8) -> Option<Prefix> {
        let (bits, max) = match a {
            IpAddr::V4(_) => (u32::from(len) + 96, 32),
            IpAddr::V6(_) => (u32::from(len), 128),
        };
        if len > max {
            return None;
        }
        let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
        Some(Prefix { addr: ip128(a) & mask, mask, assigned: false })
    }

    /// Whether `a` (IPv4-mapped) lies in the prefix.
    #[inline(always)]
    pub fn contains(&self, a: u128) -> bool {
        a & self.mask == self.addr
    }
}

/// An IP address as 128 bits, IPv4 mapped (`::ffff:a.b.c.d`).
#[inline]
pub fn ip128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(v.to_ipv6_mapped()),
        IpAddr::V6(v) => u128::from(v),
    }
}

/// An IPv4 address as 128 bits, mapped.
#[inline(always)]
pub fn v4_128(a: u32) -> u128 {
    0xffff_0000_0000 | u128::from(a)
}

/// A compiled SDF filter (the packet's fields seen as UE end and remote end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sdf {
    /// IP protocol, or 0x100 for any.
    pub proto: u16,
    /// The remote end's prefix.
    pub remote: Prefix,
    /// The UE end's prefix.
    pub ue: Prefix,
    /// Remote ports, inclusive.
    pub remote_ports: (u16, u16),
    /// UE ports, inclusive.
    pub ue_ports: (u16, u16),
}

/// The fields a PDR classifies on: the inner packet seen from the UE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// IP protocol.
    pub proto: u8,
    /// UE address (IPv4-mapped).
    pub ue: u128,
    /// Remote address (IPv4-mapped).
    pub remote: u128,
    /// UE port (0 without ports).
    pub ue_port: u16,
    /// Remote port.
    pub remote_port: u16,
}

impl Sdf {
    /// Whether the packet's fields match (`ue_is_assigned`: the UE end is
    /// the session's UE address, for `assigned`).
    #[inline(always)]
    pub fn matches(&self, f: &Fields, ue_is_assigned: bool) -> bool {
        (self.proto == 0x100 || self.proto == u16::from(f.proto))
            && self.remote.contains(f.remote)
            && if self.ue.assigned { ue_is_assigned } else { self.ue.contains(f.ue) }
            && (self.remote_ports.0..=self.remote_ports.1).contains(&f.remote_port)
            && (self.ue_ports.0..=self.ue_ports.1).contains(&f.ue_port)
    }

    /// Parses a flow description: `permit out PROTO from SRC [PORTS] to DST [PORTS]`,
    /// PROTO a number, `ip` (any), `tcp`, `udp`, `icmp` or `icmpv6`; SRC/DST `any`,
    /// `assigned` (the UE address), `ADDR` or `ADDR/LEN`; PORTS `P` or `LO-HI`.
    /// `out` reads `from` as the remote end (TS 29.244 §5.2.1A); `in` the other way.
    pub fn parse(s: &str) -> Result<Sdf, String> {
        let bad = |what: &str| format!("flow description '{s}': {what}");
        let w: Vec<&str> = s.split_whitespace().collect();
        let mut i = 0;
        let mut next = |what: &str| {
            let t = w.get(i).copied().ok_or_else(|| bad(&format!("missing {what}")));
            i += 1;
            t
        };
        if next("'permit'")? != "permit" {
            return Err(bad("must start with 'permit'"));
        }
        let out = match next("direction")? {
            "out" => true,
            "in" => false,
            _ => return Err(bad("direction must be 'out' or 'in'")),
        };
        let proto = match next("protocol")? {
            "ip" => 0x100,
            "tcp" => 6,
            "udp" => 17,
            "icmp" => 1,
            "icmpv6" => 58,
            p => p.parse::<u8>().map(u16::from).map_err(|_| bad(&format!("bad protocol '{p}'")))?,
        };
        if next("'from'")? != "from" {
            return Err(bad("expected 'from'"));
        }
        let src = addr(next("source")?).map_err(|e| bad(&e))?;
        let mut t = next("'to'")?;
        let mut sports = (0, u16::MAX);
        if t != "to" {
            sports = ports(t).map_err(|e| bad(&e))?;
            t = next("'to'")?;
            if t != "to" {
                return Err(bad("expected 'to'"));
            }
        }
        let dst = addr(next("destination")?).map_err(|e| bad(&e))?;
        let dports = match w.get(i) {
            Some(t) => {
                i += 1;
                ports(t).map_err(|e| bad(&e))?
            }
            None => (0, u16::MAX),
        };
        if i < w.len() {
            return Err(bad(&format!("unexpected '{}'", w[i])));
        }
        Ok(if out {
            Sdf { proto, remote: src, remote_ports: sports, ue: dst, ue_ports: dports }
        } else {
            Sdf { proto, ue: src, ue_ports: sports, remote: dst, remote_ports: dports }
        })
    }
}

fn addr(t: &str) -> Result<Prefix, String> {
    match t {
        "any" => Ok(Prefix::ANY),
        "assigned" => Ok(Prefix { assigned: true, ..Prefix::ANY }),
        _ => {
            let (a, len) = match t.split_once('/') {
                Some((a, l)) => (a, Some(l.parse::<u8>().map_err(|_| format!("bad prefix length in '{t}'"))?)),
                None => (t, None),
            };
            let a: IpAddr = a.parse().map_err(|_| format!("bad address '{t}'"))?;
            let len = len.unwrap_or(if a.is_ipv4() { 32 } else { 128 });
            Prefix::new(a, len).ok_or_else(|| format!("prefix length out of range in '{t}'"))
        }
    }
}

fn ports(t: &str) -> Result<(u16, u16), String> {
    let p = |s: &str| s.parse::<u16>().map_err(|_| format!("bad port '{s}'"));
    let (lo, hi) = match t.split_once('-') {
        Some((a, b)) => (p(a)?, p(b)?),
        None => (p(t)?, p(t)?),
    };
    if lo > hi {
        return Err(format!("empty port range '{t}'"));
    }
    Ok((lo, hi))
}

/// A compiled PDR (hot: read per packet in precedence order, two per
/// cache line). The QER's gates, whether it limits a rate and the QFI it
/// marks are copied in, so packets of PDRs without an MBR never touch the
/// QER arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(align(32))]
pub struct Pdr {
    /// Local F-TEID to match (uplink), if [`Pdr::has_teid`].
    pub teid: u32,
    /// First SDF filter in [`RuleSet::sdfs`].
    pub sdf_start: u32,
    /// FAR index in [`RuleSet::fars`].
    pub far: u32,
    /// QER index, [`LIST`] | list start, or [`NONE`] (see [`RuleSet::refs`]).
    pub qer: u32,
    /// URR index, [`LIST`] | list start, or [`NONE`] (see [`RuleSet::refs`]).
    pub urr: u32,
    /// Number of SDF filters (0: any packet).
    pub sdf_len: u16,
    /// Rule ID.
    pub id: u16,
    /// QFI to match (uplink), or [`ANY_QFI`].
    pub qfi: u8,
    /// [`Pdr::HAS_TEID`], [`Pdr::UE_IP`], [`Pdr::OHR`].
    pub flags: u8,
    /// QER gates open: bit 0 uplink, bit 1 downlink (both without a QER).
    pub gate: u8,
    /// The QER has a rate (MBR or GBR): bit 0 uplink, bit 1 downlink.
    pub mbr: u8,
    /// QFI for the downlink PDU Session Container (the QER's, else the PDR's), or [`ANY_QFI`].
    pub mark_qfi: u8,
}

impl Pdr {
    /// Flag: match the local F-TEID.
    pub const HAS_TEID: u8 = 1;
    /// Flag: match the UE address.
    pub const UE_IP: u8 = 2;
    /// Flag: remove the outer header.
    pub const OHR: u8 = 4;

    /// Matches the local F-TEID.
    #[inline(always)]
    pub fn has_teid(&self) -> bool {
        self.flags & Self::HAS_TEID != 0
    }

    /// Matches the UE address.
    #[inline(always)]
    pub fn ue_ip(&self) -> bool {
        self.flags & Self::UE_IP != 0
    }

    /// Removes the outer header.
    #[inline(always)]
    pub fn outer_header_removal(&self) -> bool {
        self.flags & Self::OHR != 0
    }
}

/// A compiled FAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Far {
    /// What to do.
    pub action: FarAction,
    /// Destination interface.
    pub destination: Iface,
    /// Create a GTP-U/UDP/IPv4 outer header.
    pub ohc: bool,
    /// Peer TEID.
    pub ohc_teid: u32,
    /// Peer IPv4 address.
    pub ohc_addr: u32,
    /// ToS / traffic class of the outer header (0: none).
    pub tos: u8,
    /// Buffering notifies the CP (NOCP).
    pub notify: bool,
    /// Rule ID.
    pub id: u32,
    /// Session index.
    pub session: u32,
}

/// What acting on a matched PDR reads: the PDR's rule references, gates
/// and marks with its FAR's action and outer header copied in — half a
/// cache line per PDR, parallel to [`RuleSet::pdrs`], so a matched packet
/// touches one line of rules (the classifier lines are shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(32))]
pub struct Act {
    /// FAR index in [`RuleSet::fars`] (buffer counts).
    pub far: u32,
    /// QER reference (see [`RuleSet::refs`]).
    pub qer: u32,
    /// URR reference (see [`RuleSet::refs`]).
    pub urr: u32,
    /// The FAR's peer TEID.
    pub ohc_teid: u32,
    /// The FAR's peer IPv4 address.
    pub ohc_addr: u32,
    /// The FAR's action.
    pub action: FarAction,
    /// The FAR's destination interface.
    pub destination: Iface,
    /// The FAR creates an outer header.
    pub ohc: bool,
    /// The PDR's flags ([`Pdr::OHR`], ...).
    pub flags: u8,
    /// QER gates (as [`Pdr::gate`]).
    pub gate: u8,
    /// MBR flags (as [`Pdr::mbr`]).
    pub mbr: u8,
    /// Downlink QFI mark (as [`Pdr::mark_qfi`]).
    pub mark_qfi: u8,
    /// The FAR's outer ToS byte.
    pub tos: u8,
}

impl Act {
    fn new(p: &Pdr, f: &Far) -> Act {
        Act {
            far: p.far,
            qer: p.qer,
            urr: p.urr,
            ohc_teid: f.ohc_teid,
            ohc_addr: f.ohc_addr,
            action: f.action,
            destination: f.destination,
            ohc: f.ohc,
            flags: p.flags,
            gate: p.gate,
            mbr: p.mbr,
            mark_qfi: p.mark_qfi,
            tos: f.tos,
        }
    }

    /// Removes the outer header.
    #[inline(always)]
    pub fn outer_header_removal(&self) -> bool {
        self.flags & Pdr::OHR != 0
    }
}

/// A compiled QER.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qer {
    /// Gates open (uplink, downlink).
    pub open: [bool; 2],
    /// MBR per direction, kbit/s (0: none).
    pub mbr_kbps: [u64; 2],
    /// GBR per direction, kbit/s (0: none).
    pub gbr_kbps: [u64; 2],
    /// Index among the QERs with a rate (per-core bucket state is kept for
    /// those only), or [`NONE`].
    pub rated: u32,
    /// QFI to mark downlink, or [`ANY_QFI`].
    pub qfi: u8,
    /// Rule ID.
    pub id: u32,
    /// Session index.
    pub session: u32,
}

/// A compiled URR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Urr {
    /// Volume threshold in bytes (0: none).
    pub threshold: u64,
    /// Volume quota in bytes (0: none).
    pub quota: u64,
    /// Rule ID.
    pub id: u32,
    /// Session index.
    pub session: u32,
}

/// A compiled session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    /// SEID.
    pub seid: u64,
    /// UE IPv4 (mapped) if `has_ue4`, UE IPv6 if `has_ue6`.
    pub ue4: u128,
    /// UE IPv6.
    pub ue6: u128,
    /// Has an IPv4 address.
    pub has_ue4: bool,
    /// Has an IPv6 address.
    pub has_ue6: bool,
    /// Uplink PDRs: `pdrs[ul.0..ul.0 + ul.1]`, by precedence.
    pub ul: (u32, u32),
    /// Downlink PDRs, by precedence.
    pub dl: (u32, u32),
}

/// What the data path needs of a session in one direction, kept in the
/// index entry that finds the session (so finding it touches no other line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Hot {
    /// Session index ([`NONE`] in an empty slot).
    pub session: u32,
    /// First PDR of the direction in [`RuleSet::pdrs`]: compiled ranks count from it.
    pub pdrs: u32,
    /// First block of the direction's compiled classifier in [`RuleSet::cls`].
    pub cls: u32,
    /// Its number of blocks.
    pub cls_len: u16,
    /// [`Hot::FAST`], [`Hot::HAS_UE4`].
    pub flags: u8,
    _pad: u8,
}

impl Hot {
    /// The compiled classifier answers the direction's IPv4 packets.
    pub const FAST: u8 = 1;
    /// The session has a UE IPv4 address.
    pub const HAS_UE4: u8 = 2;
    /// An empty slot's: no session.
    pub const EMPTY: Hot = Hot { session: NONE, pdrs: 0, cls: 0, cls_len: 0, flags: 0, _pad: 0 };
}

/// What a local TEID finds: the session's UE IPv4 address and its uplink
/// [`Hot`]. 28 bytes: with the TEID (the key) an index entry is 32 bytes,
/// half a cache line of the line-aligned slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct TeidSlot {
    /// The session's UE IPv4 address, if [`Hot::HAS_UE4`].
    pub ue4: u32,
    /// Uplink.
    pub hot: Hot,
    /// The session's first FAR (what [`cls::TAct`]s count from).
    pub far_base: u32,
    /// The session's first URR.
    pub urr_base: u32,
}

/// What a UE address finds: the session's downlink [`Hot`] (with the
/// 16-byte address, a 32-byte entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct UeSlot {
    /// Downlink.
    pub hot: Hot,
}

/// The index's hash: Fibonacci hashing (the key times 2^64 / golden
/// ratio) with the product's top 32 bits reversed, so the low bits the map
/// takes a key's home position from are the product's top bits. Keys
/// allocated in sequence (TEIDs, UE addresses from a pool) then land on
/// distinct, evenly spread homes (the product's top bits of consecutive keys
/// are the golden-ratio sequence): with [`flowplane_table::FibHash`], whose
/// low bits are the product's bits 32 and up, 12% of 20,000 sequential TEIDs
/// sat off their home index line; byte-swapped, 4.9% of 130,000; reversed,
/// 0.08% (a bit reversal is a few ALU operations, a line off home a miss).
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqHash;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl KeyHash<u32> for SeqHash {
    #[inline(always)]
    fn hash(k: &u32) -> u32 {
        ((u64::from(*k).wrapping_mul(GOLDEN) >> 32) as u32).reverse_bits()
    }
}

impl KeyHash<u128> for SeqHash {
    #[inline(always)]
    fn hash(k: &u128) -> u32 {
        let x = (*k as u64) ^ ((*k >> 64) as u64).rotate_left(29);
        ((x.wrapping_mul(GOLDEN) >> 32) as u32).reverse_bits()
    }
}

/// A session index: the project's fixed-capacity map
/// ([`flowplane_table::FixedMap`]), built once per rule set with exactly
/// its entries' capacity (nothing allocates after the build; the rule set is
/// immutable). A lookup reads one index line (8 words of hash bits and slot)
/// and one entry line; the staged walk prefetches the first from the key's
/// hash ([`Index::home`]), the second one pass later from the index alone
/// ([`Index::hint`]). Fibonacci hashing of the key: keys allocated in
/// sequence (TEIDs, UE addresses from a pool) spread over the index.
#[derive(Clone, Debug)]
pub struct Index<K: Copy + Eq, V: Copy>(FixedMap<K, V, SeqHash>)
where
    SeqHash: KeyHash<K>;

impl<K: Copy + Eq, V: Copy> Default for Index<K, V>
where
    SeqHash: KeyHash<K>,
{
    fn default() -> Self {
        Index::build(&[]).expect("a one-entry map")
    }
}

impl<K: Copy + Eq, V: Copy> Index<K, V>
where
    SeqHash: KeyHash<K>,
{
    /// The index of `entries` (keys distinct: the compiler checks them).
    fn build(entries: &[(K, V)]) -> Result<Self, String> {
        let err = |e| format!("cannot allocate a session index of {} entries: {e}", entries.len());
        let mut m = FixedMap::new(entries.len().max(1)).map_err(err)?;
        for &(k, v) in entries {
            m.insert(k, v).map_err(err)?;
        }
        Ok(Index(m))
    }

    /// The hash of `k` (what [`Index::home`], [`Index::hint`] and [`Index::get_hashed`] take).
    #[inline(always)]
    pub fn hash(k: &K) -> u32 {
        FixedMap::<K, V, SeqHash>::hash(k)
    }

    /// The index word a lookup of hash `h` reads first (prefetch it).
    #[inline(always)]
    pub fn home(&self, h: u32) -> &u64 {
        self.0.home_word(h)
    }

    /// The entry a lookup of hash `h` most likely ends on, from the index alone (prefetch it once
    /// [`Index::home`] is in cache).
    #[inline(always)]
    pub fn hint(&self, h: u32) -> Option<&V> {
        self.0.peek_at(self.0.probe_hint(h)?)
    }

    /// The value of `k`, whose hash `h` is.
    #[inline(always)]
    pub fn get_hashed(&self, h: u32, k: &K) -> Option<&V> {
        self.0.peek_at(self.0.find_hashed(h, k)?)
    }

    /// The value of `k`.
    #[inline]
    pub fn get(&self, k: K) -> Option<&V> {
        self.get_hashed(Self::hash(&k), &k)
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The map itself (tests look at slots and the index).
    pub fn map(&self) -> &FixedMap<K, V, SeqHash> {
        &self.0
    }
}

/// The compiled, immutable rules of every session: what the data path reads.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    /// Sessions.
    pub sessions: Vec<Session>,
    /// PDRs, grouped by session and direction, by precedence.
    pub pdrs: Vec<Pdr>,
    /// SDF filters.
    pub sdfs: Vec<Sdf>,
    /// FARs.
    pub fars: Vec<Far>,
    /// QERs.
    pub qers: Vec<Qer>,
    /// QERs with a rate (MBR or GBR).
    pub rated: u32,
    /// URRs.
    pub urrs: Vec<Urr>,
    /// PDRs' lists of several QERs or URRs: a length, then the indices.
    pub lists: Vec<u32>,
    /// Per PDR, what acting on it reads (parallel to `pdrs`).
    pub acts: Vec<Act>,
    /// Compiled classifiers' blocks (interned: sessions with the same match fields share them).
    pub cls: Vec<cls::Block>,
    /// Uplink PDR actions relative to the session, [`cls::LANES`] per block of `cls`.
    pub tacts: Vec<cls::TAct>,
    /// Local TEID -> session and its uplink [`Hot`].
    pub teids: Index<u32, TeidSlot>,
    /// UE address (IPv4-mapped or IPv6) -> session and its downlink [`Hot`].
    pub ues: Index<u128, UeSlot>,
    /// Per session (parallel to `sessions`): its BAR's buffering bounds.
    pub bars: Vec<Bar>,
}

/// A session's buffering bounds, compiled from its [`BarSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Packets held per core ([`NONE`]: the `buffer=` parameter).
    pub packets: u32,
    /// Longest hold, ns (`u64::MAX`: no limit).
    pub duration_ns: u64,
}

impl Default for Bar {
    fn default() -> Self {
        Bar { packets: NONE, duration_ns: u64::MAX }
    }
}

impl RuleSet {
    /// The QER or URR indices a PDR's reference `r` names (none, one, or a list).
    #[inline]
    pub fn refs<'a>(&'a self, r: &'a u32) -> &'a [u32] {
        if *r == NONE {
            &[]
        } else if *r & LIST == 0 {
            std::slice::from_ref(r)
        } else {
            let at = (*r & !LIST) as usize;
            let n = self.lists.get(at).map_or(0, |&n| n as usize);
            self.lists.get(at + 1..at + 1 + n).unwrap_or(&[])
        }
    }

    /// The (SEID, rule ID) of every rule of one kind, in index order.
    pub fn keys<'a, T>(
        &'a self,
        rules: &'a [T],
        f: impl Fn(&T) -> (u32, u32) + 'a,
    ) -> impl Iterator<Item = (u64, u32)> + 'a {
        rules.iter().map(move |r| {
            let (session, id) = f(r);
            (self.sessions[session as usize].seid, id)
        })
    }

    /// Compiles sessions; errors name the session and rule.
    pub fn compile(specs: &[SessionSpec]) -> Result<RuleSet, String> {
        let mut rs = RuleSet::default();
        let mut teids = Vec::new();
        let mut ues = Vec::new();
        let mut seen_teid: HashMap<u32, u64> = HashMap::new();
        let mut seen_ue: HashMap<u128, u64> = HashMap::new();
        let mut seen_seid: HashMap<u64, ()> = HashMap::new();
        let mut interned: HashMap<Vec<Sdf>, u32> = HashMap::new();
        #[allow(clippy::type_complexity)]
        let mut templates: HashMap<(Vec<cls::Entry>, Vec<cls::TAct>), (u32, u16)> = HashMap::new();
        for s in specs {
            let si = rs.sessions.len() as u32;
            let e = |m: String| format!("session {}: {m}", s.seid);
            if seen_seid.insert(s.seid, ()).is_some() {
                return Err(e("duplicate SEID".into()));
            }
            let ue4 = s.ue_ipv4.map(|a| ip128(a.into()));
            let ue6 = s.ue_ipv6.map(|a| ip128(a.into()));
            for u in [ue4, ue6].into_iter().flatten() {
                if let Some(o) = seen_ue.insert(u, s.seid) {
                    return Err(e(format!("UE address already used by session {o}")));
                }
            }
            let far_base = rs.fars.len();
            for f in &s.fars {
                if s.fars.iter().filter(|g| g.id == f.id).count() > 1 {
                    return Err(e(format!("duplicate FAR {}", f.id)));
                }
                let ohc = f.ohc_teid.is_some() || f.ohc_addr.is_some();
                if ohc && (f.ohc_teid.is_none() || f.ohc_addr.is_none()) {
                    return Err(e(format!("FAR {}: outer header creation needs ohc_teid and ohc_addr", f.id)));
                }
                rs.fars.push(Far {
                    action: f.action,
                    destination: f.destination.unwrap_or(if ohc { Iface::Access } else { Iface::Core }),
                    ohc,
                    ohc_teid: f.ohc_teid.unwrap_or(0),
                    ohc_addr: f.ohc_addr.map_or(0, u32::from),
                    tos: f.tos.unwrap_or(0),
                    notify: f.notify_cp,
                    id: f.id,
                    session: si,
                });
            }
            let qer_base = rs.qers.len();
            for q in &s.qers {
                if s.qers.iter().filter(|g| g.id == q.id).count() > 1 {
                    return Err(e(format!("duplicate QER {}", q.id)));
                }
                let mbr = |m: Option<u64>| -> Result<u64, String> {
                    match m {
                        Some(k) if k > MAX_MBR_KBPS => Err(e(format!("QER {}: MBR above {MAX_MBR_KBPS} kbit/s", q.id))),
                        m => Ok(m.unwrap_or(0)),
                    }
                };
                let (mbr_kbps, gbr_kbps) =
                    ([mbr(q.mbr_ul_kbps)?, mbr(q.mbr_dl_kbps)?], [mbr(q.gbr_ul_kbps)?, mbr(q.gbr_dl_kbps)?]);
                for d in 0..2 {
                    // TS 23.501 §5.7.2.5: a GBR flow's MBR is at least its GBR.
                    if mbr_kbps[d] > 0 && gbr_kbps[d] > mbr_kbps[d] {
                        return Err(e(format!("QER {}: GBR above MBR", q.id)));
                    }
                }
                let rated = if mbr_kbps == [0, 0] && gbr_kbps == [0, 0] {
                    NONE
                } else {
                    rs.rated += 1;
                    rs.rated - 1
                };
                rs.qers.push(Qer {
                    open: [q.gate_ul == Gate::Open, q.gate_dl == Gate::Open],
                    mbr_kbps,
                    gbr_kbps,
                    rated,
                    qfi: qfi(q.qfi).map_err(&e)?,
                    id: q.id,
                    session: si,
                });
            }
            let urr_base = rs.urrs.len();
            for u in &s.urrs {
                if s.urrs.iter().filter(|g| g.id == u.id).count() > 1 {
                    return Err(e(format!("duplicate URR {}", u.id)));
                }
                rs.urrs.push(Urr {
                    threshold: u.volume_threshold.unwrap_or(0),
                    quota: u.volume_quota.unwrap_or(0),
                    id: u.id,
                    session: si,
                });
            }
            fn find(mut ids: impl Iterator<Item = u32>, id: u32) -> Option<usize> {
                ids.position(|x| x == id)
            }
            let mut ul = Vec::new();
            let mut dl = Vec::new();
            let mut own_teids = Vec::new();
            for p in &s.pdrs {
                if s.pdrs.iter().filter(|g| g.id == p.id).count() > 1 {
                    return Err(e(format!("duplicate PDR {}", p.id)));
                }
                let pe = |m: &str| e(format!("PDR {}: {m}", p.id));
                let far = find(s.fars.iter().map(|f| f.id), p.far).ok_or_else(|| pe("unknown FAR"))?;
                let mut resolve = |ids: &[u32], what: &str, base: usize, known: &mut dyn Iterator<Item = u32>| {
                    let known: Vec<u32> = known.collect();
                    let mut idx = Vec::with_capacity(ids.len());
                    for &id in ids {
                        if idx.iter().any(|&i: &u32| known[i as usize - base] == id) {
                            return Err(pe(&format!("{what} {id} listed twice")));
                        }
                        let at = find(known.iter().copied(), id).ok_or_else(|| pe(&format!("unknown {what}")))?;
                        idx.push((base + at) as u32);
                    }
                    Ok(match idx.as_slice() {
                        [] => NONE,
                        [one] => *one,
                        more => {
                            let at = rs.lists.len() as u32;
                            rs.lists.push(more.len() as u32);
                            rs.lists.extend_from_slice(more);
                            LIST | at
                        }
                    })
                };
                let qer = resolve(&p.qers, "QER", qer_base, &mut s.qers.iter().map(|q| q.id))?;
                let urr = resolve(&p.urrs, "URR", urr_base, &mut s.urrs.iter().map(|u| u.id))?;
                if p.ue_ip && ue4.is_none() && ue6.is_none() {
                    return Err(pe("matches the UE address but the session has none"));
                }
                let mut list = Vec::with_capacity(p.sdf.len());
                for d in &p.sdf {
                    let f = Sdf::parse(d).map_err(|m| pe(&m))?;
                    if f.ue.assigned && ue4.is_none() && ue6.is_none() {
                        return Err(pe("'assigned' but the session has no UE address"));
                    }
                    if f.remote.assigned {
                        return Err(pe("'assigned' names the UE end only"));
                    }
                    list.push(f);
                }
                // Identical filter lists (the same flow descriptions in many sessions) are stored once.
                let sdf_start = match interned.get(&list) {
                    Some(&at) => at,
                    None => {
                        let at = rs.sdfs.len() as u32;
                        rs.sdfs.extend_from_slice(&list);
                        interned.insert(list, at);
                        at
                    }
                };
                if p.sdf.len() > usize::from(u16::MAX) {
                    return Err(pe("too many SDF filters"));
                }
                if let Some(t) = p.teid {
                    if p.source != Iface::Access {
                        return Err(pe("a local F-TEID needs source 'access'"));
                    }
                    match seen_teid.get(&t) {
                        Some(&o) if o != s.seid => return Err(pe(&format!("TEID {t} already used by session {o}"))),
                        Some(_) => {}
                        None => {
                            seen_teid.insert(t, s.seid);
                            own_teids.push(t);
                        }
                    }
                }
                // Gates and MBR flags merged over the PDR's QERs; the first QER that marks a QFI marks it.
                let (mut gate, mut mbr, mut mark) = (3u8, 0u8, ANY_QFI);
                for &q in rs.refs(&qer) {
                    let q = &rs.qers[q as usize];
                    gate &= u8::from(q.open[0]) | (u8::from(q.open[1]) << 1);
                    // A rate of either kind sends the packet through the QER's buckets.
                    let has_rate = |d: usize| u8::from(q.mbr_kbps[d] > 0 || q.gbr_kbps[d] > 0);
                    mbr |= has_rate(0) | (has_rate(1) << 1);
                    if mark == ANY_QFI {
                        mark = q.qfi;
                    }
                }
                let pdr_qfi = qfi(p.qfi).map_err(|m| pe(&m))?;
                let flags = if p.teid.is_some() { Pdr::HAS_TEID } else { 0 }
                    | if p.ue_ip { Pdr::UE_IP } else { 0 }
                    | if p.outer_header_removal { Pdr::OHR } else { 0 };
                let c = (
                    p.precedence,
                    Pdr {
                        teid: p.teid.unwrap_or(0),
                        sdf_start,
                        far: (far_base + far) as u32,
                        qer,
                        urr,
                        sdf_len: p.sdf.len() as u16,
                        id: p.id,
                        qfi: pdr_qfi,
                        flags,
                        gate,
                        mbr,
                        mark_qfi: if mark != ANY_QFI { mark } else { pdr_qfi },
                    },
                );
                match p.source {
                    Iface::Access => ul.push(c),
                    Iface::Core => dl.push(c),
                }
            }
            // Stable: equal precedences keep the provisioning order.
            ul.sort_by_key(|p| p.0);
            dl.sort_by_key(|p| p.0);
            let ul_r = (rs.pdrs.len() as u32, ul.len() as u32);
            rs.pdrs.extend(ul.into_iter().map(|p| p.1));
            let dl_r = (rs.pdrs.len() as u32, dl.len() as u32);
            rs.pdrs.extend(dl.into_iter().map(|p| p.1));
            rs.sessions.push(Session {
                seid: s.seid,
                ue4: ue4.unwrap_or(0),
                ue6: ue6.unwrap_or(0),
                has_ue4: ue4.is_some(),
                has_ue6: ue6.is_some(),
                ul: ul_r,
                dl: dl_r,
            });
            rs.bars.push(s.bar.as_ref().map_or(Bar::default(), |b| Bar {
                packets: b.packets.unwrap_or(NONE),
                duration_ns: b.duration_ms.map_or(u64::MAX, |ms| ms.saturating_mul(1_000_000)),
            }));
            // The compiled classifiers. Uplink: the packet's TEID found the
            // session, so with one local F-TEID every PDR's F-TEID check holds;
            // the UE check compares the IPv4 address only, so an IPv4-mapped
            // IPv6 UE address takes the general path.
            let mapped6 = ue6.is_some_and(|a| a >> 32 == 0xffff);
            let ue_flag = if ue4.is_some() { Hot::HAS_UE4 } else { 0 };
            let mut hot = |(start, len): (u32, u32), uplink: bool, fast: bool| {
                let pdrs = &rs.pdrs[start as usize..(start + len) as usize];
                let compiled = cls::compile(pdrs, &rs.sdfs, uplink).filter(|_| fast);
                // Uplink actions relative to the session's rules (none downlink: its FARs create headers).
                let tacts: Vec<cls::TAct> = if uplink {
                    pdrs.iter().map(|p| tact(p, &rs.fars[p.far as usize], far_base, urr_base)).collect()
                } else {
                    Vec::new()
                };
                let (at, n, fast) = match compiled {
                    Some(list) => {
                        let (at, n) = *templates.entry((list, tacts)).or_insert_with_key(|(list, tacts)| {
                            let blocks = cls::Block::pack(list);
                            let at = rs.cls.len() as u32;
                            rs.cls.extend_from_slice(&blocks);
                            let mut t = vec![cls::TAct::SLOW_ACT; blocks.len() * cls::LANES];
                            t[..tacts.len()].copy_from_slice(tacts);
                            rs.tacts.extend_from_slice(&t);
                            (at, blocks.len() as u16)
                        });
                        (at, n, Hot::FAST)
                    }
                    None => (0, 0, 0),
                };
                Hot { session: si, pdrs: start, cls: at, cls_len: n, flags: fast | ue_flag, _pad: 0 }
            };
            let ul_hot = hot(ul_r, true, own_teids.len() <= 1 && !mapped6);
            let dl_hot = hot(dl_r, false, true);
            let ue4_32 = ue4.map_or(0, |a| a as u32);
            let (far_base, urr_base) = (far_base as u32, urr_base as u32);
            teids.extend(
                own_teids.iter().map(|&teid| (teid, TeidSlot { ue4: ue4_32, hot: ul_hot, far_base, urr_base })),
            );
            ues.extend([ue4, ue6].into_iter().flatten().map(|ue| (ue, UeSlot { hot: dl_hot })));
        }
        rs.acts = rs.pdrs.iter().map(|p| Act::new(p, &rs.fars[p.far as usize])).collect();
        rs.teids = Index::build(&teids)?;
        rs.ues = Index::build(&ues)?;
        rs.advise_hugepages();
        Ok(rs)
    }

    /// Hugepage hints for the arrays the data path indexes at random.
    fn advise_hugepages(&self) {
        use flowplane_table::huge::advise_hugepages as advise;
        advise(&self.sessions);
        advise(&self.pdrs);
        advise(&self.sdfs);
        advise(&self.acts);
        advise(&self.cls);
        advise(&self.tacts);
        advise(&self.fars);
        advise(&self.qers);
        advise(&self.urrs);
    }

    /// The session holding local TEID `teid`.
    #[inline]
    pub fn session_by_teid(&self, teid: u32) -> Option<u32> {
        self.teids.get(teid).map(|e| e.hot.session)
    }

    /// The session whose UE has address `a` (IPv4-mapped or IPv6).
    #[inline]
    pub fn session_by_ue(&self, a: u128) -> Option<u32> {
        self.ues.get(a).map(|e| e.hot.session)
    }

    /// The first PDR (index into `pdrs`) of session `s` in the direction
    /// (`uplink`: its access PDRs, else its core PDRs) matching the packet:
    /// the local F-TEID and QFI (uplink), the UE address, any SDF filter.
    #[inline]
    pub fn classify(&self, s: &Session, uplink: bool, teid: u32, qfi: Option<u8>, f: &Fields) -> Option<u32> {
        let (start, len) = if uplink { s.ul } else { s.dl };
        let (start, len) = (start as usize, len as usize);
        let ue_ok = (s.has_ue4 && s.ue4 == f.ue) || (s.has_ue6 && s.ue6 == f.ue);
        for (k, p) in self.pdrs.get(start..start + len)?.iter().enumerate() {
            if uplink && ((p.has_teid() && p.teid != teid) || (p.qfi != ANY_QFI && Some(p.qfi) != qfi)) {
                continue;
            }
            if p.ue_ip() && !ue_ok {
                continue;
            }
            if p.sdf_len > 0 {
                let a = p.sdf_start as usize;
                let Some(sdfs) = self.sdfs.get(a..a + p.sdf_len as usize) else { continue };
                if !sdfs.iter().any(|d| d.matches(f, ue_ok)) {
                    continue;
                }
            }
            return Some((start + k) as u32);
        }
        None
    }

    /// [`RuleSet::classify`] for the session and direction an index slot
    /// found (`hot`; uplink: `ue4` its UE IPv4 address, `teid` the key that
    /// found it): the compiled classifier for IPv4 packets, else the general path.
    #[inline]
    pub fn classify_hot(
        &self,
        hot: &Hot,
        ue4: u32,
        uplink: bool,
        teid: u32,
        qfi: Option<u8>,
        f: &Fields,
    ) -> Option<u32> {
        const MAPPED: u128 = 0xffff;
        if hot.flags & Hot::FAST != 0 && f.ue >> 32 == MAPPED && f.remote >> 32 == MAPPED {
            // Downlink: the destination found the session, so it is the UE's address.
            let ue_ok = !uplink || (hot.flags & Hot::HAS_UE4 != 0 && ue4 == f.ue as u32);
            let p = cls::Pkt {
                proto: f.proto,
                qfi: qfi.unwrap_or(cls::NO_QFI),
                ue: f.ue as u32,
                remote: f.remote as u32,
                ue_port: f.ue_port,
                remote_port: f.remote_port,
                ue_ok,
            };
            return self.classify_v4(hot, &p);
        }
        self.classify(self.sessions.get(hot.session as usize)?, uplink, teid, qfi, f)
    }

    /// The compiled classifier of `hot` (which must be [`Hot::FAST`]) on an IPv4 packet.
    #[inline(always)]
    pub fn classify_v4(&self, hot: &Hot, p: &cls::Pkt) -> Option<u32> {
        let at = hot.cls as usize;
        let blocks = self.cls.get(at..at + usize::from(hot.cls_len))?;
        cls::first(blocks, p).map(|r| hot.pdrs + u32::from(r))
    }
}

/// A PDR's uplink action relative to its session's first FAR and URR.
fn tact(p: &Pdr, f: &Far, far_base: usize, urr_base: usize) -> cls::TAct {
    let far = u16::try_from(p.far as usize - far_base).ok();
    let urr = if p.urr == NONE {
        Some(u16::MAX)
    } else if p.urr & LIST != 0 {
        None
    } else {
        u16::try_from(p.urr as usize - urr_base).ok().filter(|&u| u != u16::MAX)
    };
    let (Some(far), Some(urr)) = (far, urr) else { return cls::TAct::SLOW_ACT };
    if f.ohc || p.mbr & 1 != 0 {
        return cls::TAct::SLOW_ACT;
    }
    let action = match f.action {
        FarAction::Forward => 0,
        FarAction::Drop => cls::TAct::DROP,
        FarAction::Buffer => cls::TAct::BUFFER,
    };
    let to = if f.destination == Iface::Access { cls::TAct::TO_ACCESS } else { 0 };
    cls::TAct { far, urr, bits: action | to, flags: p.flags, gate: p.gate, mark_qfi: p.mark_qfi }
}

impl cls::TAct {
    /// The [`Act`] of a non-[`cls::TAct::SLOW`] uplink action in the session of `slot`.
    #[inline(always)]
    pub fn act(&self, slot_far_base: u32, slot_urr_base: u32) -> Act {
        let action = if self.bits & cls::TAct::DROP != 0 {
            FarAction::Drop
        } else if self.bits & cls::TAct::BUFFER != 0 {
            FarAction::Buffer
        } else {
            FarAction::Forward
        };
        Act {
            far: slot_far_base + u32::from(self.far),
            qer: NONE,
            urr: if self.urr == u16::MAX { NONE } else { slot_urr_base + u32::from(self.urr) },
            ohc_teid: 0,
            ohc_addr: 0,
            action,
            destination: if self.bits & cls::TAct::TO_ACCESS != 0 { Iface::Access } else { Iface::Core },
            ohc: false,
            flags: self.flags,
            gate: self.gate,
            mbr: 0,
            mark_qfi: self.mark_qfi,
            // No outer header on this path (an OHC FAR is SLOW).
            tos: 0,
        }
    }
}

fn qfi(q: Option<u8>) -> Result<u8, String> {
    match q {
        Some(q) if q > 63 => Err(format!("QFI {q} above 63")),
        Some(q) => Ok(q),
        None => Ok(ANY_QFI),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequentially allocated TEIDs (as the PFCP endpoint hands them out)
    /// are found, almost all with the index word on the line of their
    /// home word (which the data path prefetches) and named by the index
    /// alone (the hint the data path prefetches the entry from); random
    /// ones are all found too.
    #[test]
    fn index_keeps_sequential_keys_on_their_home_line() {
        let slot =
            |teid: u32| (teid, TeidSlot { ue4: 0, hot: Hot { session: teid, ..Hot::EMPTY }, far_base: 0, urr_base: 0 });
        assert_eq!(std::mem::size_of::<TeidSlot>() + 4, 32, "an entry is half a line");
        let seq: Vec<(u32, TeidSlot)> = (1..=130_000).map(slot).collect();
        let ix = Index::build(&seq).unwrap();
        let (mut off_line, mut missed_hint) = (0, 0);
        for (k, _) in &seq {
            let h = Index::<u32, TeidSlot>::hash(k);
            let found = ix.get_hashed(h, k).expect("found");
            assert_eq!(found.hot.session, *k);
            missed_hint += usize::from(!ix.hint(h).is_some_and(|v| std::ptr::eq(v, found)));
            // Where the key's index word sits: probe from home until it names the key's slot.
            let m = ix.map();
            let base = m.home_word(0) as *const u64 as usize;
            let home = m.home_word(h) as *const u64 as usize;
            let slot = m.find(k).unwrap() as u64 + 1;
            let mut at = home;
            let words = (m.capacity() * 2).next_power_of_two().max(16);
            loop {
                let w = *m.home_word(((at - base) / 8) as u32);
                if w & 0xffff_ffff == slot {
                    break;
                }
                at = base + ((at - base) / 8 + 1) % words * 8;
            }
            off_line += usize::from(at / 64 != home / 64);
        }
        assert!(off_line * 100 < seq.len(), "{off_line} of {} off their home line", seq.len());
        assert!(missed_hint * 100 < seq.len(), "{missed_hint} of {} not named by the hint", seq.len());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let random: Vec<(u32, TeidSlot)> = (0..5_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                slot((x as u32) | 1)
            })
            .collect();
        let ix = Index::build(&random).unwrap();
        for (k, v) in &random {
            assert!(ix.get(*k).is_some_and(|f| f == v));
        }
        assert!(ix.get(0).is_none());
        assert!(Index::<u128, UeSlot>::default().get(7).is_none());
    }
}

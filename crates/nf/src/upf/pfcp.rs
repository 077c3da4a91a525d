//! PFCP (TS 29.244) wire format: the message header, type-length-value IEs
//! (grouped IEs nest), the IEs the UPF understands decoded into the rule
//! specs of [`super::rules`], and an encoder for the messages it sends.
//! Decoding never panics: bad input is a [`PfcpError`] carrying the cause
//! code to answer with and the offending IE.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::rules::{BarSpec, FarAction, FarSpec, Gate, Iface, PdrSpec, QerSpec, UrrSpec};

/// PFCP message types (TS 29.244 §7.3).
pub mod msg {
    /// Heartbeat Request.
    pub const HEARTBEAT_REQ: u8 = 1;
    /// Heartbeat Response.
    pub const HEARTBEAT_RSP: u8 = 2;
    /// Association Setup Request.
    pub const ASSOC_SETUP_REQ: u8 = 5;
    /// Association Setup Response.
    pub const ASSOC_SETUP_RSP: u8 = 6;
    /// Association Update Request.
    pub const ASSOC_UPDATE_REQ: u8 = 7;
    /// Association Update Response.
    pub const ASSOC_UPDATE_RSP: u8 = 8;
    /// Association Release Request.
    pub const ASSOC_RELEASE_REQ: u8 = 9;
    /// Association Release Response.
    pub const ASSOC_RELEASE_RSP: u8 = 10;
    /// Version Not Supported Response.
    pub const VERSION_NOT_SUPPORTED: u8 = 11;
    /// Node Report Request.
    pub const NODE_REPORT_REQ: u8 = 12;
    /// Node Report Response.
    pub const NODE_REPORT_RSP: u8 = 13;
    /// Session Set Deletion Request.
    pub const SESS_SET_DEL_REQ: u8 = 14;
    /// Session Set Deletion Response.
    pub const SESS_SET_DEL_RSP: u8 = 15;
    /// Session Establishment Request.
    pub const SESS_EST_REQ: u8 = 50;
    /// Session Establishment Response.
    pub const SESS_EST_RSP: u8 = 51;
    /// Session Modification Request.
    pub const SESS_MOD_REQ: u8 = 52;
    /// Session Modification Response.
    pub const SESS_MOD_RSP: u8 = 53;
    /// Session Deletion Request.
    pub const SESS_DEL_REQ: u8 = 54;
    /// Session Deletion Response.
    pub const SESS_DEL_RSP: u8 = 55;
    /// Session Report Request.
    pub const SESS_REPORT_REQ: u8 = 56;
    /// Session Report Response.
    pub const SESS_REPORT_RSP: u8 = 57;
}

/// IE types (TS 29.244 Table 8.1.2-1).
pub mod ie {
    #![allow(missing_docs)]
    pub const CREATE_PDR: u16 = 1;
    pub const PDI: u16 = 2;
    pub const CREATE_FAR: u16 = 3;
    pub const FORWARDING_PARAMETERS: u16 = 4;
    pub const CREATE_URR: u16 = 6;
    pub const CREATE_QER: u16 = 7;
    pub const CREATED_PDR: u16 = 8;
    pub const UPDATE_PDR: u16 = 9;
    pub const UPDATE_FAR: u16 = 10;
    pub const UPDATE_FORWARDING_PARAMETERS: u16 = 11;
    pub const UPDATE_BAR_SRR: u16 = 12;
    pub const UPDATE_URR: u16 = 13;
    pub const UPDATE_QER: u16 = 14;
    pub const REMOVE_PDR: u16 = 15;
    pub const REMOVE_FAR: u16 = 16;
    pub const REMOVE_URR: u16 = 17;
    pub const REMOVE_QER: u16 = 18;
    pub const CAUSE: u16 = 19;
    pub const SOURCE_INTERFACE: u16 = 20;
    pub const F_TEID: u16 = 21;
    pub const NETWORK_INSTANCE: u16 = 22;
    pub const SDF_FILTER: u16 = 23;
    pub const GATE_STATUS: u16 = 25;
    pub const MBR: u16 = 26;
    pub const GBR: u16 = 27;
    pub const PRECEDENCE: u16 = 29;
    pub const TRANSPORT_LEVEL_MARKING: u16 = 30;
    pub const VOLUME_THRESHOLD: u16 = 31;
    pub const TIME_THRESHOLD: u16 = 32;
    pub const REPORTING_TRIGGERS: u16 = 37;
    pub const REPORT_TYPE: u16 = 39;
    pub const DOWNLINK_DATA_REPORT: u16 = 83;
    pub const DL_DATA_NOTIFICATION_DELAY: u16 = 46;
    pub const DL_BUFFERING_DURATION: u16 = 47;
    pub const DL_BUFFERING_PACKET_COUNT: u16 = 48;
    pub const CREATE_BAR: u16 = 85;
    pub const UPDATE_BAR: u16 = 86;
    pub const REMOVE_BAR: u16 = 87;
    pub const BAR_ID: u16 = 88;
    pub const SUGGESTED_BUFFERING_PACKETS: u16 = 140;
    pub const OFFENDING_IE: u16 = 40;
    pub const DESTINATION_INTERFACE: u16 = 42;
    pub const UP_FUNCTION_FEATURES: u16 = 43;
    pub const APPLY_ACTION: u16 = 44;
    pub const PDR_ID: u16 = 56;
    pub const F_SEID: u16 = 57;
    pub const NODE_ID: u16 = 60;
    pub const FQ_CSID: u16 = 65;
    pub const MEASUREMENT_METHOD: u16 = 62;
    pub const MEASUREMENT_PERIOD: u16 = 64;
    pub const USAGE_REPORT_TRIGGER: u16 = 63;
    pub const VOLUME_MEASUREMENT: u16 = 66;
    pub const VOLUME_QUOTA: u16 = 73;
    pub const QUERY_URR: u16 = 77;
    pub const USAGE_REPORT_MODR: u16 = 78;
    pub const USAGE_REPORT_SDR: u16 = 79;
    pub const USAGE_REPORT_SRR: u16 = 80;
    pub const URR_ID: u16 = 81;
    pub const OUTER_HEADER_CREATION: u16 = 84;
    pub const UE_IP_ADDRESS: u16 = 93;
    pub const OUTER_HEADER_REMOVAL: u16 = 95;
    pub const RECOVERY_TIME_STAMP: u16 = 96;
    pub const NODE_REPORT_TYPE: u16 = 101;
    pub const USER_PLANE_PATH_FAILURE_REPORT: u16 = 102;
    pub const REMOTE_GTPU_PEER: u16 = 103;
    pub const UR_SEQN: u16 = 104;
    pub const FAR_ID: u16 = 108;
    pub const QER_ID: u16 = 109;
    pub const UP_IP_RESOURCE_INFORMATION: u16 = 116;
    pub const QFI: u16 = 124;
    pub const PFCPASREQ_FLAGS: u16 = 259;
}

/// Cause values (TS 29.244 §8.2.1).
pub mod cause {
    #![allow(missing_docs)]
    pub const ACCEPTED: u8 = 1;
    pub const REJECTED: u8 = 64;
    pub const SESSION_NOT_FOUND: u8 = 65;
    pub const MANDATORY_IE_MISSING: u8 = 66;
    pub const CONDITIONAL_IE_MISSING: u8 = 67;
    pub const INVALID_LENGTH: u8 = 68;
    pub const MANDATORY_IE_INCORRECT: u8 = 69;
    pub const NO_ASSOCIATION: u8 = 72;
    pub const RULE_FAILURE: u8 = 73;
    pub const NO_RESOURCES: u8 = 75;
    pub const NOT_SUPPORTED: u8 = 76;
}

/// A request that cannot be applied: the cause to answer with and the offending IE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PfcpError {
    /// Cause code.
    pub cause: u8,
    /// Offending IE type, if one is to blame.
    pub ie: Option<u16>,
    /// What went wrong (for logs and tests).
    pub what: String,
}

impl PfcpError {
    fn new(cause: u8, ie: Option<u16>, what: impl Into<String>) -> PfcpError {
        PfcpError { cause, ie, what: what.into() }
    }
}

impl std::fmt::Display for PfcpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cause {}: {}", self.cause, self.what)
    }
}

fn bad_len(ie: u16) -> PfcpError {
    PfcpError::new(cause::INVALID_LENGTH, Some(ie), format!("IE {ie}: too short"))
}

fn missing(ie: u16, ctx: &str) -> PfcpError {
    PfcpError::new(cause::MANDATORY_IE_MISSING, Some(ie), format!("{ctx}: IE {ie} missing"))
}

fn incorrect(ie: u16, what: &str) -> PfcpError {
    PfcpError::new(cause::MANDATORY_IE_INCORRECT, Some(ie), format!("IE {ie}: {what}"))
}

/// A PFCP message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Message type.
    pub msg_type: u8,
    /// SEID (session messages).
    pub seid: Option<u64>,
    /// Sequence number (24 bits).
    pub seq: u32,
}

/// Why a datagram is not a PFCP message one can answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Too short for a header, or the length field disagrees with the datagram.
    Malformed,
    /// Version other than 1 (answer: Version Not Supported Response).
    Version(u32),
}

/// Parses the header of one datagram: the header and the IEs' bytes.
pub fn parse_header(b: &[u8]) -> Result<(Header, &[u8]), HeaderError> {
    if b.len() < 8 {
        return Err(HeaderError::Malformed);
    }
    let s = b[0] & 0x01 != 0;
    let len = usize::from(u16::from_be_bytes([b[2], b[3]])) + 4;
    if len > b.len() || len < if s { 16 } else { 8 } {
        return Err(HeaderError::Malformed);
    }
    let (seid, at) = if s { (Some(u64::from_be_bytes(b[4..12].try_into().unwrap_or([0; 8]))), 12) } else { (None, 4) };
    let seq = u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]]);
    if b[0] >> 5 != 1 {
        return Err(HeaderError::Version(seq));
    }
    Ok((Header { msg_type: b[1], seid, seq }, &b[at + 4..len]))
}

/// One IE: its type and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ie<'a> {
    /// Type (enterprise IEs, bit 15 set, carry their enterprise ID in `value`).
    pub ty: u16,
    /// Value.
    pub value: &'a [u8],
}

/// Splits `b` into IEs; a truncated IE is an invalid-length error.
pub fn ies(mut b: &[u8]) -> Result<Vec<Ie<'_>>, PfcpError> {
    let mut v = Vec::new();
    while !b.is_empty() {
        if b.len() < 4 {
            return Err(PfcpError::new(cause::INVALID_LENGTH, None, "truncated IE header"));
        }
        let ty = u16::from_be_bytes([b[0], b[1]]);
        let len = usize::from(u16::from_be_bytes([b[2], b[3]]));
        let value = b.get(4..4 + len).ok_or_else(|| bad_len(ty))?;
        v.push(Ie { ty, value });
        b = &b[4 + len..];
    }
    Ok(v)
}

fn find<'a>(list: &[Ie<'a>], ty: u16) -> Option<&'a [u8]> {
    list.iter().find(|i| i.ty == ty).map(|i| i.value)
}

fn need<'a>(list: &[Ie<'a>], ty: u16, ctx: &str) -> Result<&'a [u8], PfcpError> {
    find(list, ty).ok_or_else(|| missing(ty, ctx))
}

fn all<'a>(list: &'a [Ie<'a>], ty: u16) -> impl Iterator<Item = &'a [u8]> + 'a {
    list.iter().filter(move |i| i.ty == ty).map(|i| i.value)
}

fn u16_of(v: &[u8], ty: u16) -> Result<u16, PfcpError> {
    Ok(u16::from_be_bytes(v.get(..2).ok_or_else(|| bad_len(ty))?.try_into().unwrap_or([0; 2])))
}

fn u32_of(v: &[u8], ty: u16) -> Result<u32, PfcpError> {
    Ok(u32::from_be_bytes(v.get(..4).ok_or_else(|| bad_len(ty))?.try_into().unwrap_or([0; 4])))
}

fn u8_of(v: &[u8], ty: u16) -> Result<u8, PfcpError> {
    v.first().copied().ok_or_else(|| bad_len(ty))
}

fn u64_of(v: &[u8], ty: u16) -> Result<u64, PfcpError> {
    Ok(u64::from_be_bytes(v.get(..8).ok_or_else(|| bad_len(ty))?.try_into().unwrap_or([0; 8])))
}

fn v4_of(v: &[u8], ty: u16) -> Result<Ipv4Addr, PfcpError> {
    let b: [u8; 4] = v.get(..4).ok_or_else(|| bad_len(ty))?.try_into().unwrap_or([0; 4]);
    Ok(Ipv4Addr::from(b))
}

fn v6_of(v: &[u8], ty: u16) -> Result<Ipv6Addr, PfcpError> {
    let b: [u8; 16] = v.get(..16).ok_or_else(|| bad_len(ty))?.try_into().unwrap_or([0; 16]);
    Ok(Ipv6Addr::from(b))
}

/// An F-TEID: a TEID with its address, or "choose" (the UPF allocates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FTeid {
    /// This TEID.
    Teid(u32),
    /// CH: the UPF picks one and returns it in a Created PDR.
    Choose,
}

/// F-TEID (§8.2.3): flags V4, V6, CH, CHID; TEID and addresses unless CH.
pub fn decode_fteid(v: &[u8]) -> Result<FTeid, PfcpError> {
    let flags = u8_of(v, ie::F_TEID)?;
    if flags & 0x04 != 0 {
        return Ok(FTeid::Choose);
    }
    let need = 5 + if flags & 1 != 0 { 4 } else { 0 } + if flags & 2 != 0 { 16 } else { 0 };
    if v.len() < need {
        return Err(bad_len(ie::F_TEID));
    }
    Ok(FTeid::Teid(u32_of(&v[1..], ie::F_TEID)?))
}

/// The UE IP Address IE (§8.2.62): IPv4 and/or IPv6 (flags V6 = 1, V4 = 2).
pub fn decode_ue_ip(v: &[u8]) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), PfcpError> {
    let flags = u8_of(v, ie::UE_IP_ADDRESS)?;
    let mut at = 1;
    let mut v4 = None;
    let mut v6 = None;
    if flags & 0x02 != 0 {
        v4 = Some(v4_of(v.get(at..).unwrap_or(&[]), ie::UE_IP_ADDRESS)?);
        at += 4;
    }
    if flags & 0x01 != 0 {
        v6 = Some(v6_of(v.get(at..).unwrap_or(&[]), ie::UE_IP_ADDRESS)?);
    }
    Ok((v4, v6))
}

/// SDF Filter (§8.2.5): the flow description, if the FD flag is set.
pub fn decode_sdf(v: &[u8]) -> Result<Option<String>, PfcpError> {
    let flags = u8_of(v, ie::SDF_FILTER)?;
    if flags & 0x01 == 0 {
        return Ok(None);
    }
    let len = usize::from(u16_of(v.get(2..).unwrap_or(&[]), ie::SDF_FILTER)?);
    let fd = v.get(4..4 + len).ok_or_else(|| bad_len(ie::SDF_FILTER))?;
    let s = std::str::from_utf8(fd).map_err(|_| incorrect(ie::SDF_FILTER, "flow description not text"))?;
    Ok(Some(s.to_string()))
}

fn iface(v: &[u8], ty: u16) -> Result<Iface, PfcpError> {
    match u8_of(v, ty)? & 0x0f {
        0 => Ok(Iface::Access),
        1 | 2 => Ok(Iface::Core),
        x => Err(PfcpError::new(cause::NOT_SUPPORTED, Some(ty), format!("interface value {x} not supported"))),
    }
}

/// What a PDI and its PDR say about the session's UE address.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PdrUpdate {
    /// The PDR as specified (fields absent from an Update PDR keep the old value).
    pub pdr: Option<PdrSpec>,
    /// The PDR's local F-TEID asked the UPF to choose.
    pub choose_teid: bool,
    /// UE addresses named in the PDI.
    pub ue: (Option<Ipv4Addr>, Option<Ipv6Addr>),
}

/// Decodes a Create PDR (or, with `old`, an Update PDR applied to `old`).
pub fn decode_pdr(v: &[u8], old: Option<&PdrSpec>) -> Result<PdrUpdate, PfcpError> {
    let g = ies(v)?;
    let id = u16_of(need(&g, ie::PDR_ID, "PDR")?, ie::PDR_ID)?;
    let ctx = format!("PDR {id}");
    let mut p = match old {
        Some(o) => o.clone(),
        None => PdrSpec {
            id,
            precedence: u32_of(need(&g, ie::PRECEDENCE, &ctx)?, ie::PRECEDENCE)?,
            source: Iface::Access,
            teid: None,
            ue_ip: false,
            qfi: None,
            sdf: Vec::new(),
            outer_header_removal: false,
            far: u32_of(need(&g, ie::FAR_ID, &ctx)?, ie::FAR_ID)?,
            qers: Vec::new(),
            urrs: Vec::new(),
        },
    };
    let mut out = PdrUpdate::default();
    if let Some(x) = find(&g, ie::PRECEDENCE) {
        p.precedence = u32_of(x, ie::PRECEDENCE)?;
    }
    if let Some(x) = find(&g, ie::FAR_ID) {
        p.far = u32_of(x, ie::FAR_ID)?;
    }
    // Every associated QER and URR is listed (in an update too: the list replaces the old one).
    if find(&g, ie::QER_ID).is_some() {
        p.qers = all(&g, ie::QER_ID).map(|x| u32_of(x, ie::QER_ID)).collect::<Result<_, _>>()?;
    }
    if find(&g, ie::URR_ID).is_some() {
        p.urrs = all(&g, ie::URR_ID).map(|x| u32_of(x, ie::URR_ID)).collect::<Result<_, _>>()?;
    }
    if let Some(x) = find(&g, ie::OUTER_HEADER_REMOVAL) {
        // 0: GTP-U/UDP/IPv4, 1: GTP-U/UDP/IPv6, 6: GTP-U/UDP/IP.
        match u8_of(x, ie::OUTER_HEADER_REMOVAL)? {
            0 | 1 | 6 => p.outer_header_removal = true,
            d => {
                return Err(PfcpError::new(
                    cause::NOT_SUPPORTED,
                    Some(ie::OUTER_HEADER_REMOVAL),
                    format!("removal {d}"),
                ))
            }
        }
    }
    match (find(&g, ie::PDI), old) {
        (Some(pdi), _) => {
            let d = ies(pdi)?;
            p.source = iface(need(&d, ie::SOURCE_INTERFACE, "PDI")?, ie::SOURCE_INTERFACE)?;
            p.teid = None;
            if let Some(f) = find(&d, ie::F_TEID) {
                match decode_fteid(f)? {
                    FTeid::Teid(t) => p.teid = Some(t),
                    FTeid::Choose => out.choose_teid = true,
                }
            }
            p.ue_ip = false;
            if let Some(u) = find(&d, ie::UE_IP_ADDRESS) {
                out.ue = decode_ue_ip(u)?;
                p.ue_ip = true;
            }
            p.qfi = match find(&d, ie::QFI) {
                Some(q) => Some(u8_of(q, ie::QFI)? & 0x3f),
                None => None,
            };
            p.sdf = Vec::new();
            for s in all(&d, ie::SDF_FILTER) {
                if let Some(fd) = decode_sdf(s)? {
                    p.sdf.push(fd);
                }
            }
        }
        (None, None) => return Err(missing(ie::PDI, &ctx)),
        (None, Some(_)) => {}
    }
    out.pdr = Some(p);
    Ok(out)
}

/// Decodes a Create FAR (or an Update FAR applied to `old`).
pub fn decode_far(v: &[u8], old: Option<&FarSpec>) -> Result<FarSpec, PfcpError> {
    let g = ies(v)?;
    let id = u32_of(need(&g, ie::FAR_ID, "FAR")?, ie::FAR_ID)?;
    let mut f = match old {
        Some(o) => o.clone(),
        None => {
            need(&g, ie::APPLY_ACTION, &format!("FAR {id}"))?;
            FarSpec {
                id,
                action: FarAction::Drop,
                destination: None,
                ohc_teid: None,
                ohc_addr: None,
                tos: None,
                notify_cp: false,
            }
        }
    };
    if let Some(a) = find(&g, ie::APPLY_ACTION) {
        let a = u8_of(a, ie::APPLY_ACTION)?;
        // NOCP (§8.2.26): with BUFF, the first buffered packet is reported (Downlink Data Report).
        f.notify_cp = a & 0x08 != 0;
        f.action = if a & 0x01 != 0 {
            FarAction::Drop
        } else if a & 0x04 != 0 {
            FarAction::Buffer
        } else if a & 0x02 != 0 {
            FarAction::Forward
        } else {
            return Err(incorrect(ie::APPLY_ACTION, "no DROP, FORW or BUFF"));
        };
    }
    let fp = find(&g, ie::FORWARDING_PARAMETERS).or_else(|| find(&g, ie::UPDATE_FORWARDING_PARAMETERS));
    if let Some(fp) = fp {
        let d = ies(fp)?;
        if let Some(x) = find(&d, ie::DESTINATION_INTERFACE) {
            f.destination = Some(iface(x, ie::DESTINATION_INTERFACE)?);
        }
        if let Some(o) = find(&d, ie::OUTER_HEADER_CREATION) {
            let desc = u16_of(o, ie::OUTER_HEADER_CREATION)?;
            if desc & 0x0100 == 0 {
                return Err(PfcpError::new(
                    cause::NOT_SUPPORTED,
                    Some(ie::OUTER_HEADER_CREATION),
                    "only GTP-U/UDP/IPv4 outer headers",
                ));
            }
            f.ohc_teid = Some(u32_of(o.get(2..).unwrap_or(&[]), ie::OUTER_HEADER_CREATION)?);
            f.ohc_addr = Some(v4_of(o.get(6..).unwrap_or(&[]), ie::OUTER_HEADER_CREATION)?);
        }
        // §8.2.12: ToS/Traffic Class value, then its mask (the outer header is new: the value masked).
        if let Some(t) = find(&d, ie::TRANSPORT_LEVEL_MARKING) {
            if t.len() < 2 {
                return Err(bad_len(ie::TRANSPORT_LEVEL_MARKING));
            }
            f.tos = Some(t[0] & t[1]);
        }
    }
    Ok(f)
}

/// Decodes a Create BAR, an Update BAR (Session Modification Request) or an
/// Update BAR (Session Report Response) applied to `old` (§7.5.2.6,
/// §7.5.4.11, §7.5.9.2): the BAR ID, the Suggested Buffering Packets Count
/// (or DL Buffering Suggested Packet Count, §8.2.45: one or two octets), the
/// DL Buffering Duration (§8.2.44: timer unit in bits 8-6 — 2 s, 1 min,
/// 10 min, 1 h, 10 h, other values 1 min; 7 infinite — and the value in bits 5-1).
pub fn decode_bar(v: &[u8], old: Option<&BarSpec>) -> Result<BarSpec, PfcpError> {
    let g = ies(v)?;
    let mut b = match (old, find(&g, ie::BAR_ID)) {
        (_, Some(id)) => BarSpec { id: u8_of(id, ie::BAR_ID)?, ..old.cloned().unwrap_or_default() },
        (Some(o), None) => o.clone(),
        (None, None) => return Err(missing(ie::BAR_ID, "BAR")),
    };
    if let Some(x) = find(&g, ie::SUGGESTED_BUFFERING_PACKETS) {
        b.packets = Some(u32::from(u8_of(x, ie::SUGGESTED_BUFFERING_PACKETS)?));
    }
    if let Some(x) = find(&g, ie::DL_BUFFERING_PACKET_COUNT) {
        b.packets = Some(match x.len() {
            1 => u32::from(x[0]),
            2.. => u32::from(u16::from_be_bytes([x[0], x[1]])),
            _ => return Err(bad_len(ie::DL_BUFFERING_PACKET_COUNT)),
        });
    }
    if let Some(x) = find(&g, ie::DL_BUFFERING_DURATION) {
        let t = u8_of(x, ie::DL_BUFFERING_DURATION)?;
        let unit_s: u64 = match t >> 5 {
            0 => 2,
            2 => 600,
            3 => 3_600,
            4 => 36_000,
            7 => 0,
            _ => 60,
        };
        b.duration_ms = (unit_s > 0).then(|| unit_s * u64::from(t & 0x1f) * 1_000);
    }
    Ok(b)
}

/// Decodes a Create QER (or an Update QER applied to `old`).
pub fn decode_qer(v: &[u8], old: Option<&QerSpec>) -> Result<QerSpec, PfcpError> {
    let g = ies(v)?;
    let id = u32_of(need(&g, ie::QER_ID, "QER")?, ie::QER_ID)?;
    let mut q = match old {
        Some(o) => o.clone(),
        None => {
            need(&g, ie::GATE_STATUS, &format!("QER {id}"))?;
            QerSpec { id, ..Default::default() }
        }
    };
    if let Some(s) = find(&g, ie::GATE_STATUS) {
        let s = u8_of(s, ie::GATE_STATUS)?;
        let gate = |b: u8| if b & 0x03 == 0 { Gate::Open } else { Gate::Closed };
        q.gate_ul = gate(s >> 2);
        q.gate_dl = gate(s);
    }
    // §8.2.8, §8.2.9: UL then DL, five octets each, kbit/s (0: none).
    type UlDl = (Option<u64>, Option<u64>);
    let rates = |ty: u16| -> Result<Option<UlDl>, PfcpError> {
        let Some(m) = find(&g, ty) else { return Ok(None) };
        if m.len() < 10 {
            return Err(bad_len(ty));
        }
        let five = |b: &[u8]| b.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x));
        let (ul, dl) = (five(&m[0..5]), five(&m[5..10]));
        Ok(Some(((ul > 0).then_some(ul), (dl > 0).then_some(dl))))
    };
    if let Some((ul, dl)) = rates(ie::MBR)? {
        (q.mbr_ul_kbps, q.mbr_dl_kbps) = (ul, dl);
    }
    if let Some((ul, dl)) = rates(ie::GBR)? {
        (q.gbr_ul_kbps, q.gbr_dl_kbps) = (ul, dl);
    }
    if let Some(x) = find(&g, ie::QFI) {
        q.qfi = Some(u8_of(x, ie::QFI)? & 0x3f);
    }
    Ok(q)
}

/// Decodes a Create URR (or an Update URR applied to `old`): its volume threshold (total).
pub fn decode_urr(v: &[u8], old: Option<&UrrSpec>) -> Result<UrrSpec, PfcpError> {
    let g = ies(v)?;
    let id = u32_of(need(&g, ie::URR_ID, "URR")?, ie::URR_ID)?;
    let mut u = old.cloned().unwrap_or(UrrSpec { id, ..Default::default() });
    // TOVOL first when present (then ULVOL, DLVOL): the UPF enforces the total.
    let total = |t: &[u8], ty: u16| -> Result<Option<u64>, PfcpError> {
        Ok(if u8_of(t, ty)? & 0x01 != 0 { Some(u64_of(&t[1..], ty)?) } else { None })
    };
    if let Some(t) = find(&g, ie::VOLUME_THRESHOLD) {
        u.volume_threshold = total(t, ie::VOLUME_THRESHOLD)?;
    }
    if let Some(t) = find(&g, ie::VOLUME_QUOTA) {
        u.volume_quota = total(t, ie::VOLUME_QUOTA)?;
    }
    // §8.2.32, §8.2.33: seconds (0: none).
    if let Some(t) = find(&g, ie::MEASUREMENT_PERIOD) {
        u.measurement_period = Some(u32_of(t, ie::MEASUREMENT_PERIOD)?).filter(|&x| x > 0);
    }
    if let Some(t) = find(&g, ie::TIME_THRESHOLD) {
        u.time_threshold = Some(u32_of(t, ie::TIME_THRESHOLD)?).filter(|&x| x > 0);
    }
    Ok(u)
}

/// The rule ID inside a Remove PDR/FAR/QER/URR (or any grouped IE naming one).
pub fn decode_id(v: &[u8], id_ie: u16) -> Result<u32, PfcpError> {
    let g = ies(v)?;
    let x = need(&g, id_ie, "remove")?;
    if id_ie == ie::PDR_ID {
        u16_of(x, id_ie).map(u32::from)
    } else {
        u32_of(x, id_ie)
    }
}

/// The F-SEID IE (§8.2.37): SEID (flags V4 = 2, V6 = 1, addresses follow).
pub fn decode_fseid(v: &[u8]) -> Result<u64, PfcpError> {
    let flags = u8_of(v, ie::F_SEID)?;
    let need = 9 + if flags & 2 != 0 { 4 } else { 0 } + if flags & 1 != 0 { 16 } else { 0 };
    if v.len() < need {
        return Err(bad_len(ie::F_SEID));
    }
    u64_of(&v[1..], ie::F_SEID)
}

/// The Node ID IE (§8.2.38), checked and normalised (spare bits cleared):
/// type 0 IPv4 (4 octets), 1 IPv6 (16), 2 FQDN (DNS labels, no trailing zero).
/// Two Node IDs are the same node when these bytes are equal.
pub fn decode_node_id(v: &[u8]) -> Result<Vec<u8>, PfcpError> {
    let t = u8_of(v, ie::NODE_ID)? & 0x0f;
    let ok = match t {
        0 => v.len() >= 5,
        1 => v.len() >= 17,
        2 => v.len() >= 2,
        _ => return Err(incorrect(ie::NODE_ID, "unknown Node ID type")),
    };
    if !ok {
        return Err(bad_len(ie::NODE_ID));
    }
    let n = match t {
        0 => 5,
        1 => 17,
        _ => v.len(),
    };
    let mut out = v[..n].to_vec();
    out[0] = t;
    if t == 2 {
        // FQDNs compare case-insensitively.
        out[1..].make_ascii_lowercase();
    }
    Ok(out)
}

/// A Node ID for humans: an address or a dotted FQDN.
pub fn node_id_text(v: &[u8]) -> String {
    match (v.first().map(|t| t & 0x0f), v.len()) {
        (Some(0), 5..) => Ipv4Addr::new(v[1], v[2], v[3], v[4]).to_string(),
        (Some(1), 17..) => v6_of(&v[1..], 0).map(|a| a.to_string()).unwrap_or_default(),
        (Some(2), _) => {
            let mut labels = Vec::new();
            let mut b = &v[1..];
            while let Some((&n, rest)) = b.split_first() {
                let n = usize::from(n).min(rest.len());
                labels.push(String::from_utf8_lossy(&rest[..n]).into_owned());
                b = &rest[n..];
            }
            labels.join(".")
        }
        _ => "?".into(),
    }
}

/// The (node address, CSID) pairs of an FQ-CSID IE (§8.2.43).
pub fn decode_fq_csid(v: &[u8]) -> Result<Vec<(Vec<u8>, u16)>, PfcpError> {
    let b = u8_of(v, ie::FQ_CSID)?;
    let alen = match b >> 4 {
        0 | 2 => 4,
        1 => 16,
        _ => return Err(incorrect(ie::FQ_CSID, "unknown node address type")),
    };
    let n = usize::from(b & 0x0f);
    if v.len() < 1 + alen + 2 * n {
        return Err(bad_len(ie::FQ_CSID));
    }
    let node = v[..1 + alen].to_vec();
    let mut node = node;
    node[0] >>= 4;
    Ok((0..n).map(|k| (node.clone(), u16::from_be_bytes([v[1 + alen + 2 * k], v[2 + alen + 2 * k]]))).collect())
}

/// Builds PFCP messages.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    open: Vec<usize>,
}

impl Writer {
    /// Starts a message (version 1; `seid` for session messages).
    pub fn message(msg_type: u8, seid: Option<u64>, seq: u32) -> Writer {
        let mut w = Writer::default();
        w.buf.push(0x20 | u8::from(seid.is_some()));
        w.buf.push(msg_type);
        w.buf.extend_from_slice(&[0, 0]);
        if let Some(s) = seid {
            w.buf.extend_from_slice(&s.to_be_bytes());
        }
        w.buf.extend_from_slice(&seq.to_be_bytes()[1..]);
        w.buf.push(0);
        w
    }

    /// An IE with value `v`.
    pub fn ie(&mut self, ty: u16, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(&ty.to_be_bytes());
        self.buf.extend_from_slice(&(v.len() as u16).to_be_bytes());
        self.buf.extend_from_slice(v);
        self
    }

    /// Opens a grouped IE (close it with [`Writer::end`]).
    pub fn group(&mut self, ty: u16) -> &mut Self {
        self.buf.extend_from_slice(&ty.to_be_bytes());
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self
    }

    /// Closes the innermost grouped IE.
    pub fn end(&mut self) -> &mut Self {
        if let Some(at) = self.open.pop() {
            let len = (self.buf.len() - at - 2) as u16;
            self.buf[at..at + 2].copy_from_slice(&len.to_be_bytes());
        }
        self
    }

    /// The IEs written (a grouped IE's content, from [`Writer::default`]).
    pub fn into_ies(mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end();
        }
        self.buf
    }

    /// The finished message (from [`Writer::message`]).
    pub fn finish(mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end();
        }
        let len = (self.buf.len() - 4) as u16;
        self.buf[2..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

/// IE value encoders for the messages the UPF sends and tests (an SMF) send.
pub mod enc {
    use super::*;

    /// Node ID: IPv4.
    pub fn node_id_v4(a: Ipv4Addr) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&a.octets());
        v
    }

    /// Node ID: an FQDN, as DNS labels without the trailing zero (§8.2.38).
    pub fn node_id_fqdn(name: &str) -> Vec<u8> {
        let mut v = vec![2];
        for l in name.trim_end_matches('.').split('.') {
            v.push(l.len() as u8);
            v.extend_from_slice(l.as_bytes());
        }
        v
    }

    /// FQ-CSID with an IPv4 node address.
    pub fn fq_csid_v4(node: Ipv4Addr, csids: &[u16]) -> Vec<u8> {
        let mut v = vec![csids.len().min(15) as u8];
        v.extend_from_slice(&node.octets());
        for c in csids.iter().take(15) {
            v.extend_from_slice(&c.to_be_bytes());
        }
        v
    }

    /// F-SEID with an IPv4 address.
    pub fn fseid(seid: u64, a: Ipv4Addr) -> Vec<u8> {
        let mut v = vec![0x02];
        v.extend_from_slice(&seid.to_be_bytes());
        v.extend_from_slice(&a.octets());
        v
    }

    /// F-TEID with an IPv4 address.
    pub fn fteid(teid: u32, a: Ipv4Addr) -> Vec<u8> {
        let mut v = vec![0x01];
        v.extend_from_slice(&teid.to_be_bytes());
        v.extend_from_slice(&a.octets());
        v
    }

    /// UE IP address (IPv4).
    pub fn ue_ip_v4(a: Ipv4Addr) -> Vec<u8> {
        let mut v = vec![0x02];
        v.extend_from_slice(&a.octets());
        v
    }

    /// SDF filter with a flow description.
    pub fn sdf(fd: &str) -> Vec<u8> {
        let mut v = vec![0x01, 0];
        v.extend_from_slice(&(fd.len() as u16).to_be_bytes());
        v.extend_from_slice(fd.as_bytes());
        v
    }

    /// Outer header creation: GTP-U/UDP/IPv4.
    pub fn ohc_gtpu_v4(teid: u32, a: Ipv4Addr) -> Vec<u8> {
        let mut v = vec![0x01, 0x00];
        v.extend_from_slice(&teid.to_be_bytes());
        v.extend_from_slice(&a.octets());
        v
    }

    /// Volume Measurement (§8.2.44) with total, uplink and downlink volumes
    /// and packet counts (TOVOL, ULVOL, DLVOL, TONOP, ULNOP, DLNOP).
    pub fn volume_measurement(ul_bytes: u64, dl_bytes: u64, ul_packets: u64, dl_packets: u64) -> Vec<u8> {
        let mut v = vec![0x3f];
        for x in [ul_bytes + dl_bytes, ul_bytes, dl_bytes, ul_packets + dl_packets, ul_packets, dl_packets] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        v
    }

    /// Volume measurement / threshold with the total volume only.
    pub fn total_volume(bytes: u64) -> Vec<u8> {
        let mut v = vec![0x01];
        v.extend_from_slice(&bytes.to_be_bytes());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdr_ie(id: u16, teid: Option<u32>, sdf: &str) -> Vec<u8> {
        let mut w = Writer::default();
        w.ie(ie::PDR_ID, &id.to_be_bytes()).ie(ie::PRECEDENCE, &100u32.to_be_bytes());
        w.group(ie::PDI).ie(ie::SOURCE_INTERFACE, &[0]);
        if let Some(t) = teid {
            w.ie(ie::F_TEID, &enc::fteid(t, Ipv4Addr::new(192, 0, 2, 1)));
        }
        w.ie(ie::UE_IP_ADDRESS, &enc::ue_ip_v4(Ipv4Addr::new(10, 45, 0, 1))).ie(ie::SDF_FILTER, &enc::sdf(sdf)).end();
        w.ie(ie::OUTER_HEADER_REMOVAL, &[0]).ie(ie::FAR_ID, &1u32.to_be_bytes()).ie(ie::URR_ID, &3u32.to_be_bytes());
        w.buf
    }

    #[test]
    fn header_round_trip_and_errors() {
        let m = Writer::message(msg::SESS_EST_REQ, Some(0x1122), 0xabcdef).finish();
        let (h, body) = parse_header(&m).unwrap();
        assert_eq!((h.msg_type, h.seid, h.seq, body.len()), (50, Some(0x1122), 0xabcdef, 0));
        let m = Writer::message(msg::HEARTBEAT_REQ, None, 7).finish();
        assert_eq!(parse_header(&m).unwrap().0, Header { msg_type: 1, seid: None, seq: 7 });
        assert_eq!(parse_header(&m[..7]), Err(HeaderError::Malformed));
        let mut v2 = m.clone();
        v2[0] = 0x40;
        assert_eq!(parse_header(&v2), Err(HeaderError::Version(7)));
        let mut long = m.clone();
        long[3] = 200;
        assert_eq!(parse_header(&long), Err(HeaderError::Malformed));
    }

    #[test]
    fn create_pdr_decodes_into_a_spec() {
        let v = pdr_ie(5, Some(77), "permit out 17 from any to assigned 53");
        let u = decode_pdr(&v, None).unwrap();
        let p = u.pdr.unwrap();
        assert_eq!(
            (p.id, p.precedence, p.source, p.teid, p.far, p.urrs.clone()),
            (5, 100, Iface::Access, Some(77), 1, vec![3])
        );
        assert!(p.outer_header_removal && p.ue_ip);
        assert_eq!(p.sdf, vec!["permit out 17 from any to assigned 53".to_string()]);
        assert_eq!(u.ue.0, Some(Ipv4Addr::new(10, 45, 0, 1)));
        // Every truncation is an error with a cause, never a panic.
        for n in 0..v.len() {
            if let Err(e) = decode_pdr(&v[..n], None) {
                assert!(e.cause >= 64, "{e}");
            }
        }
        let mut w = Writer::default();
        w.ie(ie::PDR_ID, &[0, 1]);
        assert_eq!(decode_pdr(&w.buf, None).unwrap_err().ie, Some(ie::PRECEDENCE));
        // Several QER IDs and URR IDs: all kept; an update's list replaces the old one.
        let mut w = Writer::default();
        w.ie(ie::PDR_ID, &[0, 5]).ie(ie::QER_ID, &1u32.to_be_bytes()).ie(ie::QER_ID, &2u32.to_be_bytes());
        w.ie(ie::URR_ID, &4u32.to_be_bytes()).ie(ie::URR_ID, &5u32.to_be_bytes());
        let upd = decode_pdr(&w.buf, Some(&p)).unwrap().pdr.unwrap();
        assert_eq!((upd.qers, upd.urrs, upd.teid), (vec![1, 2], vec![4, 5], Some(77)));
    }

    #[test]
    fn far_qer_urr_decode() {
        let mut w = Writer::default();
        w.ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]);
        w.group(ie::FORWARDING_PARAMETERS).ie(ie::DESTINATION_INTERFACE, &[0]);
        w.ie(ie::OUTER_HEADER_CREATION, &enc::ohc_gtpu_v4(0x55, Ipv4Addr::new(198, 51, 100, 1)));
        w.ie(ie::TRANSPORT_LEVEL_MARKING, &[0xb8, 0xfc]).end();
        let f = decode_far(&w.buf, None).unwrap();
        assert_eq!((f.action, f.ohc_teid, f.destination), (FarAction::Forward, Some(0x55), Some(Iface::Access)));
        assert_eq!(f.tos, Some(0xb8), "DSCP 46 (EF)");
        let mut w = Writer::default();
        w.ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x01]);
        assert_eq!(decode_far(&w.buf, Some(&f)).unwrap().action, FarAction::Drop);
        let mut w = Writer::default();
        w.ie(ie::QER_ID, &1u32.to_be_bytes()).ie(ie::GATE_STATUS, &[0x04]).ie(ie::QFI, &[9]);
        w.ie(ie::MBR, &[0, 0, 0, 3, 0xe8, 0, 0, 0, 0, 0]);
        let q = decode_qer(&w.buf, None).unwrap();
        assert_eq!(
            (q.gate_ul, q.gate_dl, q.mbr_ul_kbps, q.mbr_dl_kbps, q.qfi),
            (Gate::Closed, Gate::Open, Some(1000), None, Some(9))
        );
        // An update with a GBR keeps the MBR; a short GBR is an invalid length.
        let mut w = Writer::default();
        w.ie(ie::QER_ID, &1u32.to_be_bytes()).ie(ie::GBR, &[0, 0, 0, 1, 0xf4, 0, 0, 0, 0, 0x64]);
        let u = decode_qer(&w.buf, Some(&q)).unwrap();
        assert_eq!((u.mbr_ul_kbps, u.gbr_ul_kbps, u.gbr_dl_kbps), (Some(1000), Some(500), Some(100)));
        let mut w = Writer::default();
        w.ie(ie::QER_ID, &1u32.to_be_bytes()).ie(ie::GBR, &[0, 0, 0, 1]);
        assert_eq!(decode_qer(&w.buf, Some(&q)).unwrap_err().cause, cause::INVALID_LENGTH);
        let mut w = Writer::default();
        w.ie(ie::URR_ID, &4u32.to_be_bytes()).ie(ie::VOLUME_THRESHOLD, &enc::total_volume(5000));
        assert_eq!(decode_urr(&w.buf, None).unwrap().volume_threshold, Some(5000));
    }
}

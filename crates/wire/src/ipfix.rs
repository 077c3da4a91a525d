//! IPFIX messages (RFC 7011) with the information elements of RFC 7012 and
//! the NAT event elements of RFC 8158: the [`Message`] view (header, then an
//! iterator over its sets), template records ([`TemplateRepr`]) parsed from
//! and emitted into template sets, the [`MessageBuilder`] that writes one
//! message (header, template set, data sets) into a buffer, the typed
//! records flowplane exports ([`FlowRecord`], [`NatRecord`]) with their
//! fixed templates, and a [`Decoder`] that keeps templates per observation
//! domain and turns data sets back into field lists (`flowplane ipfix read`,
//! tests).
//!
//! Every length comes from the input and is checked before it is used: a
//! malformed message gives a [`WireError`], never a panic.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Result, WireError};
use crate::flow::FiveTuple;

/// The version number of IPFIX.
pub const VERSION: u16 = 10;
/// Length of the message header.
pub const HEADER_LEN: usize = 16;
/// Length of a set header.
pub const SET_HEADER_LEN: usize = 4;
/// Set id of a template set.
pub const TEMPLATE_SET_ID: u16 = 2;
/// Set id of an options template set.
pub const OPTIONS_TEMPLATE_SET_ID: u16 = 3;
/// Smallest set id (and template id) of data.
pub const MIN_DATA_SET_ID: u16 = 256;
/// A field length meaning "variable length" (RFC 7011 §7).
pub const VARLEN: u16 = 65535;

/// Byte ranges of the headers.
mod field {
    pub type Field = core::ops::Range<usize>;
    pub const VERSION: Field = 0..2;
    pub const LENGTH: Field = 2..4;
    pub const EXPORT_TIME: Field = 4..8;
    pub const SEQUENCE: Field = 8..12;
    pub const DOMAIN: Field = 12..16;
    pub const SET_ID: Field = 0..2;
    pub const SET_LENGTH: Field = 2..4;
}

/// IANA information element ids used here (RFC 7012, RFC 8158; the IANA "IPFIX Information Elements" registry).
pub mod ie {
    /// octetDeltaCount (unsigned64).
    pub const OCTET_DELTA_COUNT: u16 = 1;
    /// packetDeltaCount (unsigned64).
    pub const PACKET_DELTA_COUNT: u16 = 2;
    /// protocolIdentifier (unsigned8).
    pub const PROTOCOL_IDENTIFIER: u16 = 4;
    /// sourceTransportPort (unsigned16).
    pub const SOURCE_TRANSPORT_PORT: u16 = 7;
    /// sourceIPv4Address.
    pub const SOURCE_IPV4_ADDRESS: u16 = 8;
    /// ingressInterface (unsigned32).
    pub const INGRESS_INTERFACE: u16 = 10;
    /// flowDirection (unsigned8: 0 ingress, 1 egress).
    pub const FLOW_DIRECTION: u16 = 61;
    /// destinationTransportPort (unsigned16).
    pub const DESTINATION_TRANSPORT_PORT: u16 = 11;
    /// destinationIPv4Address.
    pub const DESTINATION_IPV4_ADDRESS: u16 = 12;
    /// sourceIPv6Address.
    pub const SOURCE_IPV6_ADDRESS: u16 = 27;
    /// destinationIPv6Address.
    pub const DESTINATION_IPV6_ADDRESS: u16 = 28;
    /// flowId (unsigned64).
    pub const FLOW_ID: u16 = 148;
    /// flowEndReason (unsigned8, [`super::EndReason`]).
    pub const FLOW_END_REASON: u16 = 136;
    /// flowStartMilliseconds (dateTimeMilliseconds).
    pub const FLOW_START_MILLISECONDS: u16 = 152;
    /// flowEndMilliseconds (dateTimeMilliseconds).
    pub const FLOW_END_MILLISECONDS: u16 = 153;
    /// postNATSourceIPv4Address.
    pub const POST_NAT_SOURCE_IPV4_ADDRESS: u16 = 225;
    /// postNATDestinationIPv4Address.
    pub const POST_NAT_DESTINATION_IPV4_ADDRESS: u16 = 226;
    /// postNAPTSourceTransportPort.
    pub const POST_NAPT_SOURCE_TRANSPORT_PORT: u16 = 227;
    /// postNAPTDestinationTransportPort.
    pub const POST_NAPT_DESTINATION_TRANSPORT_PORT: u16 = 228;
    /// natEvent (unsigned8, [`super::NatEvent`]).
    pub const NAT_EVENT: u16 = 230;
    /// postNATDestinationIPv6Address.
    pub const POST_NAT_DESTINATION_IPV6_ADDRESS: u16 = 282;
    /// ingressVRFID (unsigned32).
    pub const INGRESS_VRFID: u16 = 234;
    /// natPoolID (unsigned32).
    pub const NAT_POOL_ID: u16 = 283;
    /// observationTimeMilliseconds (dateTimeMilliseconds).
    pub const OBSERVATION_TIME_MILLISECONDS: u16 = 323;

    /// The element's IANA name, for the ones above.
    pub fn name(id: u16) -> Option<&'static str> {
        Some(match id {
            OCTET_DELTA_COUNT => "octetDeltaCount",
            PACKET_DELTA_COUNT => "packetDeltaCount",
            PROTOCOL_IDENTIFIER => "protocolIdentifier",
            SOURCE_TRANSPORT_PORT => "sourceTransportPort",
            SOURCE_IPV4_ADDRESS => "sourceIPv4Address",
            INGRESS_INTERFACE => "ingressInterface",
            FLOW_DIRECTION => "flowDirection",
            FLOW_ID => "flowId",
            DESTINATION_TRANSPORT_PORT => "destinationTransportPort",
            DESTINATION_IPV4_ADDRESS => "destinationIPv4Address",
            SOURCE_IPV6_ADDRESS => "sourceIPv6Address",
            DESTINATION_IPV6_ADDRESS => "destinationIPv6Address",
            FLOW_END_REASON => "flowEndReason",
            FLOW_START_MILLISECONDS => "flowStartMilliseconds",
            FLOW_END_MILLISECONDS => "flowEndMilliseconds",
            POST_NAT_SOURCE_IPV4_ADDRESS => "postNATSourceIPv4Address",
            POST_NAT_DESTINATION_IPV4_ADDRESS => "postNATDestinationIPv4Address",
            POST_NAPT_SOURCE_TRANSPORT_PORT => "postNAPTSourceTransportPort",
            POST_NAPT_DESTINATION_TRANSPORT_PORT => "postNAPTDestinationTransportPort",
            NAT_EVENT => "natEvent",
            POST_NAT_DESTINATION_IPV6_ADDRESS => "postNATDestinationIPv6Address",
            INGRESS_VRFID => "ingressVRFID",
            NAT_POOL_ID => "natPoolID",
            OBSERVATION_TIME_MILLISECONDS => "observationTimeMilliseconds",
            _ => return None,
        })
    }
}

/// flowEndReason values (IANA registry of IE 136).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndReason {
    /// No packet for the idle timeout.
    IdleTimeout = 1,
    /// The flow has been live for the active timeout (it goes on).
    ActiveTimeout = 2,
    /// The end of the flow was seen (TCP FIN/RST, an NF ending it).
    EndOfFlow = 3,
    /// Forced end (the run ended).
    ForcedEnd = 4,
    /// Lack of resources (evicted from a full table).
    LackOfResources = 5,
}

/// natEvent values (RFC 8158 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NatEvent {
    /// NAT Addresses exhausted.
    AddressesExhausted = 3,
    /// NAT44 session create.
    Nat44SessionCreate = 4,
    /// NAT44 session delete.
    Nat44SessionDelete = 5,
}

/// One field specifier of a template: element id, length, enterprise number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// Information element id (without the enterprise bit).
    pub id: u16,
    /// Length in the data records ([`VARLEN`]: variable).
    pub len: u16,
    /// Enterprise number (None: an IANA element).
    pub enterprise: Option<u32>,
}

impl FieldSpec {
    /// An IANA element of fixed length.
    pub const fn iana(id: u16, len: u16) -> Self {
        FieldSpec { id, len, enterprise: None }
    }
}

/// A template record: its id (≥ 256) and its fields in order. No fields: a withdrawal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRepr {
    /// Template id (the data sets' set id).
    pub id: u16,
    /// The fields.
    pub fields: Vec<FieldSpec>,
}

impl TemplateRepr {
    /// Bytes of one data record, None if a field is variable-length.
    pub fn record_len(&self) -> Option<usize> {
        self.fields.iter().try_fold(0usize, |a, f| (f.len != VARLEN).then_some(a + f.len as usize))
    }

    /// Bytes the template record takes in a template set.
    pub fn wire_len(&self) -> usize {
        4 + self.fields.iter().map(|f| if f.enterprise.is_some() { 8 } else { 4 }).sum::<usize>()
    }

    /// Writes the template record at the start of `out` (at least [`Self::wire_len`] bytes).
    pub fn emit(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.id.to_be_bytes());
        out[2..4].copy_from_slice(&(self.fields.len() as u16).to_be_bytes());
        let mut o = 4;
        for f in &self.fields {
            let id = f.id & 0x7fff | if f.enterprise.is_some() { 0x8000 } else { 0 };
            out[o..o + 2].copy_from_slice(&id.to_be_bytes());
            out[o + 2..o + 4].copy_from_slice(&f.len.to_be_bytes());
            o += 4;
            if let Some(e) = f.enterprise {
                out[o..o + 4].copy_from_slice(&e.to_be_bytes());
                o += 4;
            }
        }
    }

    /// Parses the template records of a template set's body (after the set header).
    pub fn parse_set(body: &[u8]) -> Result<Vec<TemplateRepr>> {
        let mut out = Vec::new();
        let mut b = body;
        // Fewer than a template header's bytes left: padding (RFC 7011 §3.3.1).
        while b.len() >= 4 {
            let id = be16(&b[0..2]);
            let count = be16(&b[2..4]) as usize;
            if id < MIN_DATA_SET_ID {
                return Err(WireError::Malformed);
            }
            b = &b[4..];
            let mut fields = Vec::with_capacity(count.min(b.len() / 4));
            for _ in 0..count {
                if b.len() < 4 {
                    return Err(WireError::Truncated);
                }
                let raw = be16(&b[0..2]);
                let len = be16(&b[2..4]);
                b = &b[4..];
                let enterprise = if raw & 0x8000 != 0 {
                    if b.len() < 4 {
                        return Err(WireError::Truncated);
                    }
                    let e = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    b = &b[4..];
                    Some(e)
                } else {
                    None
                };
                if len == 0 {
                    return Err(WireError::BadLength);
                }
                fields.push(FieldSpec { id: raw & 0x7fff, len, enterprise });
            }
            out.push(TemplateRepr { id, fields });
        }
        Ok(out)
    }
}

#[inline]
fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

#[inline]
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A view of one IPFIX message.
#[derive(Debug, Clone)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        Message { buffer }
    }

    /// Wraps a buffer after [`Self::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let m = Self::new_unchecked(buffer);
        m.check_len()?;
        Ok(m)
    }

    /// Ensures no accessor panics: a whole header, version 10, a length
    /// field of at least the header and within the buffer.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != VERSION {
            return Err(WireError::BadVersion);
        }
        let l = self.length() as usize;
        if l < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if l > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Version (10).
    pub fn version(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::VERSION])
    }

    /// Length of the message, header included.
    pub fn length(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::LENGTH])
    }

    /// Export time (seconds since the epoch).
    pub fn export_time(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::EXPORT_TIME])
    }

    /// Sequence number: data records sent in this domain before this message.
    pub fn sequence(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::SEQUENCE])
    }

    /// Observation domain id.
    pub fn domain(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::DOMAIN])
    }

    /// The message's sets, in order.
    pub fn sets(&self) -> Sets<'_> {
        let len = self.length() as usize;
        Sets { rest: &self.buffer.as_ref()[HEADER_LEN..len] }
    }
}

/// One set of a message: its id and its body (after the set header).
#[derive(Debug, Clone, Copy)]
pub struct Set<'a> {
    /// Set id (2: templates, 3: options templates, ≥ 256: data of that template).
    pub id: u16,
    /// The records.
    pub body: &'a [u8],
}

/// Iterator over a message's sets; a malformed set header ends it with an error.
#[derive(Debug, Clone)]
pub struct Sets<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Sets<'a> {
    type Item = Result<Set<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = self.rest;
        if r.len() < SET_HEADER_LEN {
            self.rest = &[];
            return Some(Err(WireError::Truncated));
        }
        let id = be16(&r[field::SET_ID]);
        let len = be16(&r[field::SET_LENGTH]) as usize;
        if len < SET_HEADER_LEN || len > r.len() {
            self.rest = &[];
            return Some(Err(WireError::BadLength));
        }
        if id != TEMPLATE_SET_ID && id != OPTIONS_TEMPLATE_SET_ID && id < MIN_DATA_SET_ID {
            self.rest = &[];
            return Some(Err(WireError::Malformed));
        }
        self.rest = &r[len..];
        Some(Ok(Set { id, body: &r[SET_HEADER_LEN..len] }))
    }
}

/// The message header's fields (the length is the builder's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRepr {
    /// Export time (seconds since the epoch).
    pub export_time: u32,
    /// Sequence number.
    pub sequence: u32,
    /// Observation domain id.
    pub domain: u32,
}

impl HeaderRepr {
    /// Parses a checked message's header.
    pub fn parse<T: AsRef<[u8]>>(m: &Message<T>) -> Self {
        HeaderRepr { export_time: m.export_time(), sequence: m.sequence(), domain: m.domain() }
    }

    /// Writes the header with message length `len` into `out[..16]`.
    pub fn emit(&self, out: &mut [u8], len: u16) {
        out[field::VERSION].copy_from_slice(&VERSION.to_be_bytes());
        out[field::LENGTH].copy_from_slice(&len.to_be_bytes());
        out[field::EXPORT_TIME].copy_from_slice(&self.export_time.to_be_bytes());
        out[field::SEQUENCE].copy_from_slice(&self.sequence.to_be_bytes());
        out[field::DOMAIN].copy_from_slice(&self.domain.to_be_bytes());
    }
}

/// Writes one message into a buffer: the header, then sets; the header's
/// length and each set's length are filled in when it is closed. Bounded by
/// `max_len` (a datagram's payload): callers ask [`Self::room`] first.
#[derive(Debug)]
pub struct MessageBuilder<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
    max_len: usize,
    set_start: Option<usize>,
    records: u32,
}

impl<'a> MessageBuilder<'a> {
    /// Starts a message at the end of `buf` (at most `max_len` bytes, ≤ 65535).
    pub fn new(buf: &'a mut Vec<u8>, hdr: HeaderRepr, max_len: usize) -> Self {
        let start = buf.len();
        buf.resize(start + HEADER_LEN, 0);
        hdr.emit(&mut buf[start..], 0);
        MessageBuilder { buf, start, max_len: max_len.min(65535), set_start: None, records: 0 }
    }

    /// Bytes left in the message.
    pub fn room(&self) -> usize {
        self.max_len.saturating_sub(self.buf.len() - self.start)
    }

    /// Data records written so far (what the next message's sequence number adds).
    pub fn records(&self) -> u32 {
        self.records
    }

    /// Writes a template set with `templates` (false if it does not fit).
    pub fn template_set(&mut self, templates: &[TemplateRepr]) -> bool {
        self.end_set();
        let len = SET_HEADER_LEN + templates.iter().map(TemplateRepr::wire_len).sum::<usize>();
        if len > self.room() {
            return false;
        }
        let o = self.buf.len();
        self.buf.resize(o + len, 0);
        self.buf[o..o + 2].copy_from_slice(&TEMPLATE_SET_ID.to_be_bytes());
        self.buf[o + 2..o + 4].copy_from_slice(&(len as u16).to_be_bytes());
        let mut p = o + SET_HEADER_LEN;
        for t in templates {
            t.emit(&mut self.buf[p..]);
            p += t.wire_len();
        }
        true
    }

    /// Adds one data record of template `id` (`len` bytes written by `fill`),
    /// opening a data set when the current one is of another template. False
    /// (nothing written) if it does not fit.
    pub fn record(&mut self, id: u16, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let same = self.set_start.is_some_and(|s| be16(&self.buf[s..s + 2]) == id);
        let need = len + if same { 0 } else { SET_HEADER_LEN };
        if need > self.room() {
            return false;
        }
        if !same {
            self.end_set();
            let o = self.buf.len();
            self.buf.extend_from_slice(&id.to_be_bytes());
            self.buf.extend_from_slice(&[0, 0]);
            self.set_start = Some(o);
        }
        let o = self.buf.len();
        self.buf.resize(o + len, 0);
        fill(&mut self.buf[o..o + len]);
        self.records += 1;
        true
    }

    fn end_set(&mut self) {
        if let Some(s) = self.set_start.take() {
            let len = (self.buf.len() - s) as u16;
            self.buf[s + 2..s + 4].copy_from_slice(&len.to_be_bytes());
        }
    }

    /// Closes the message; returns its length.
    pub fn finish(mut self) -> usize {
        self.end_set();
        let len = self.buf.len() - self.start;
        self.buf[self.start + 2..self.start + 4].copy_from_slice(&(len as u16).to_be_bytes());
        len
    }
}

// ---- flowplane's records and templates ----

/// Template id of IPv4 flow records.
pub const TEMPLATE_FLOW4: u16 = 256;
/// Template id of IPv6 flow records.
pub const TEMPLATE_FLOW6: u16 = 257;
/// Template id of NAT44 session create/delete events (RFC 8158 §4.4.1's fields).
pub const TEMPLATE_NAT44_SESSION: u16 = 258;
/// Template id of NAT addresses exhausted events (RFC 8158 §4.4.3's fields).
pub const TEMPLATE_NAT_EXHAUSTED: u16 = 259;
/// Template id of IPv4 flow records with the address the flow was sent to
/// (`lb`'s backend): the flow fields, then postNATDestinationIPv4Address.
pub const TEMPLATE_FLOW4_DNAT: u16 = 260;
/// Template id of IPv6 flow records with the address the flow was sent to:
/// the flow fields, then postNATDestinationIPv6Address.
pub const TEMPLATE_FLOW6_DNAT: u16 = 261;
/// Template id of usage records (`upf`'s URRs, [`UsageRecord`]).
pub const TEMPLATE_USAGE: u16 = 262;
/// flowplane has no Private Enterprise Number of its own: the URR ID of a
/// usage record travels as element [`URR_ID_ELEMENT`] of RFC 5612's
/// documentation number until one is registered.
pub const USAGE_PEN: u32 = 32473;
/// The enterprise-specific element carrying a URR ID (unsigned32) under [`USAGE_PEN`].
pub const URR_ID_ELEMENT: u16 = 1;
/// Bytes of a usage record.
pub const USAGE_LEN: usize = 8 + 4 + 1 + 8 + 8 + 8;

const FLOW_TAIL: [FieldSpec; 9] = [
    FieldSpec::iana(ie::SOURCE_TRANSPORT_PORT, 2),
    FieldSpec::iana(ie::DESTINATION_TRANSPORT_PORT, 2),
    FieldSpec::iana(ie::PROTOCOL_IDENTIFIER, 1),
    FieldSpec::iana(ie::PACKET_DELTA_COUNT, 8),
    FieldSpec::iana(ie::OCTET_DELTA_COUNT, 8),
    FieldSpec::iana(ie::FLOW_START_MILLISECONDS, 8),
    FieldSpec::iana(ie::FLOW_END_MILLISECONDS, 8),
    FieldSpec::iana(ie::FLOW_END_REASON, 1),
    FieldSpec::iana(ie::INGRESS_INTERFACE, 4),
];

/// Bytes after the addresses in a flow record (as [`FLOW_TAIL`] says).
const FLOW_TAIL_LEN: usize = 2 + 2 + 1 + 8 + 8 + 8 + 8 + 1 + 4;
/// Bytes of an IPv4 flow record.
pub const FLOW4_LEN: usize = 8 + FLOW_TAIL_LEN;
/// Bytes of an IPv6 flow record.
pub const FLOW6_LEN: usize = 32 + FLOW_TAIL_LEN;
/// Bytes of an IPv4 flow record with its destination after translation.
pub const FLOW4_DNAT_LEN: usize = FLOW4_LEN + 4;
/// Bytes of an IPv6 flow record with its destination after translation.
pub const FLOW6_DNAT_LEN: usize = FLOW6_LEN + 16;
/// Bytes of a NAT44 session event record.
pub const NAT44_SESSION_LEN: usize = 8 + 4 + 4 + 4 + 1 + 2 + 2 + 4 + 4 + 2 + 2 + 1;
/// Bytes of a NAT addresses exhausted record.
pub const NAT_EXHAUSTED_LEN: usize = 8 + 1 + 4;

/// flowplane's templates, in template id order.
pub fn templates() -> Vec<TemplateRepr> {
    let flow = |a: u16, b: u16, l: u16| {
        let mut f = vec![FieldSpec::iana(a, l), FieldSpec::iana(b, l)];
        f.extend_from_slice(&FLOW_TAIL);
        f
    };
    let dnat = |mut f: Vec<FieldSpec>, l: u16| {
        let id = if l == 4 { ie::POST_NAT_DESTINATION_IPV4_ADDRESS } else { ie::POST_NAT_DESTINATION_IPV6_ADDRESS };
        f.push(FieldSpec::iana(id, l));
        f
    };
    vec![
        TemplateRepr { id: TEMPLATE_FLOW4, fields: flow(ie::SOURCE_IPV4_ADDRESS, ie::DESTINATION_IPV4_ADDRESS, 4) },
        TemplateRepr { id: TEMPLATE_FLOW6, fields: flow(ie::SOURCE_IPV6_ADDRESS, ie::DESTINATION_IPV6_ADDRESS, 16) },
        TemplateRepr {
            id: TEMPLATE_NAT44_SESSION,
            fields: vec![
                FieldSpec::iana(ie::OBSERVATION_TIME_MILLISECONDS, 8),
                FieldSpec::iana(ie::INGRESS_VRFID, 4),
                FieldSpec::iana(ie::SOURCE_IPV4_ADDRESS, 4),
                FieldSpec::iana(ie::POST_NAT_SOURCE_IPV4_ADDRESS, 4),
                FieldSpec::iana(ie::PROTOCOL_IDENTIFIER, 1),
                FieldSpec::iana(ie::SOURCE_TRANSPORT_PORT, 2),
                FieldSpec::iana(ie::POST_NAPT_SOURCE_TRANSPORT_PORT, 2),
                FieldSpec::iana(ie::DESTINATION_IPV4_ADDRESS, 4),
                FieldSpec::iana(ie::POST_NAT_DESTINATION_IPV4_ADDRESS, 4),
                FieldSpec::iana(ie::DESTINATION_TRANSPORT_PORT, 2),
                FieldSpec::iana(ie::POST_NAPT_DESTINATION_TRANSPORT_PORT, 2),
                FieldSpec::iana(ie::NAT_EVENT, 1),
            ],
        },
        TemplateRepr {
            id: TEMPLATE_NAT_EXHAUSTED,
            fields: vec![
                FieldSpec::iana(ie::OBSERVATION_TIME_MILLISECONDS, 8),
                FieldSpec::iana(ie::NAT_EVENT, 1),
                FieldSpec::iana(ie::NAT_POOL_ID, 4),
            ],
        },
        TemplateRepr {
            id: TEMPLATE_FLOW4_DNAT,
            fields: dnat(flow(ie::SOURCE_IPV4_ADDRESS, ie::DESTINATION_IPV4_ADDRESS, 4), 4),
        },
        TemplateRepr {
            id: TEMPLATE_FLOW6_DNAT,
            fields: dnat(flow(ie::SOURCE_IPV6_ADDRESS, ie::DESTINATION_IPV6_ADDRESS, 16), 16),
        },
        TemplateRepr {
            id: TEMPLATE_USAGE,
            fields: vec![
                FieldSpec::iana(ie::FLOW_ID, 8),
                FieldSpec { id: URR_ID_ELEMENT, len: 4, enterprise: Some(USAGE_PEN) },
                FieldSpec::iana(ie::FLOW_DIRECTION, 1),
                FieldSpec::iana(ie::OCTET_DELTA_COUNT, 8),
                FieldSpec::iana(ie::PACKET_DELTA_COUNT, 8),
                FieldSpec::iana(ie::OBSERVATION_TIME_MILLISECONDS, 8),
            ],
        },
    ]
}

/// One flow record (a flow's counts since its previous record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRecord {
    /// Protocol, addresses and ports.
    pub tuple: FiveTuple,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// First packet (ms since the epoch).
    pub start_ms: u64,
    /// Last packet.
    pub end_ms: u64,
    /// flowEndReason ([`EndReason`] as a number).
    pub reason: u8,
    /// ingressInterface.
    pub ingress: u32,
    /// Where the flow was sent (postNATDestinationIPv4/IPv6Address: `lb`'s
    /// backend, of the tuple's family); None: no such field.
    pub post_dst: Option<IpAddr>,
}

impl FlowRecord {
    /// Its template and record length.
    pub fn template(&self) -> (u16, usize) {
        match (self.tuple, self.post_dst.is_some()) {
            (FiveTuple::V4(_), false) => (TEMPLATE_FLOW4, FLOW4_LEN),
            (FiveTuple::V6(_), false) => (TEMPLATE_FLOW6, FLOW6_LEN),
            (FiveTuple::V4(_), true) => (TEMPLATE_FLOW4_DNAT, FLOW4_DNAT_LEN),
            (FiveTuple::V6(_), true) => (TEMPLATE_FLOW6_DNAT, FLOW6_DNAT_LEN),
        }
    }

    /// Writes the record (`out` is [`Self::template`]'s length).
    pub fn emit(&self, out: &mut [u8]) {
        let t = &self.tuple;
        let mut o = match (t.src_ip(), t.dst_ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                out[0..4].copy_from_slice(&s.octets());
                out[4..8].copy_from_slice(&d.octets());
                8
            }
            (s, d) => {
                out[0..16].copy_from_slice(&v6(s).octets());
                out[16..32].copy_from_slice(&v6(d).octets());
                32
            }
        };
        let mut put = |b: &[u8]| {
            out[o..o + b.len()].copy_from_slice(b);
            o += b.len();
        };
        put(&t.src_port().to_be_bytes());
        put(&t.dst_port().to_be_bytes());
        put(&[t.proto()]);
        put(&self.packets.to_be_bytes());
        put(&self.bytes.to_be_bytes());
        put(&self.start_ms.to_be_bytes());
        put(&self.end_ms.to_be_bytes());
        put(&[self.reason]);
        put(&self.ingress.to_be_bytes());
        match (self.post_dst, &self.tuple) {
            (Some(IpAddr::V4(a)), FiveTuple::V4(_)) => put(&a.octets()),
            (Some(a), FiveTuple::V4(_)) => put(&v6(a).to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED).octets()),
            (Some(a), FiveTuple::V6(_)) => put(&v6(a).octets()),
            (None, _) => {}
        }
    }

    /// Parses a decoded record of [`TEMPLATE_FLOW4`] / [`TEMPLATE_FLOW6`] (None: another template or shape).
    pub fn from_fields(r: &DataRecord) -> Option<Self> {
        let ip = |id4: u16, id6: u16| r.get(id4).or_else(|| r.get(id6)).and_then(as_ip);
        let (src, dst) = (
            ip(ie::SOURCE_IPV4_ADDRESS, ie::SOURCE_IPV6_ADDRESS)?,
            ip(ie::DESTINATION_IPV4_ADDRESS, ie::DESTINATION_IPV6_ADDRESS)?,
        );
        let n = |id| r.get(id).and_then(as_uint);
        let tuple = FiveTuple::new(
            src,
            dst,
            n(ie::SOURCE_TRANSPORT_PORT)? as u16,
            n(ie::DESTINATION_TRANSPORT_PORT)? as u16,
            n(ie::PROTOCOL_IDENTIFIER)? as u8,
        )?;
        Some(FlowRecord {
            tuple,
            packets: n(ie::PACKET_DELTA_COUNT)?,
            bytes: n(ie::OCTET_DELTA_COUNT)?,
            start_ms: n(ie::FLOW_START_MILLISECONDS)?,
            end_ms: n(ie::FLOW_END_MILLISECONDS)?,
            reason: n(ie::FLOW_END_REASON)? as u8,
            ingress: n(ie::INGRESS_INTERFACE).unwrap_or(0) as u32,
            // Of the tuple's family only (what `emit` can write back).
            post_dst: match tuple {
                FiveTuple::V4(_) => {
                    r.get(ie::POST_NAT_DESTINATION_IPV4_ADDRESS).and_then(as_ip).filter(IpAddr::is_ipv4)
                }
                FiveTuple::V6(_) => {
                    r.get(ie::POST_NAT_DESTINATION_IPV6_ADDRESS).and_then(as_ip).filter(IpAddr::is_ipv6)
                }
            },
        })
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// One NAT event (RFC 8158): a NAT44 session created or deleted, or the pool's addresses exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatRecord {
    /// natEvent ([`NatEvent`] as a number).
    pub event: u8,
    /// observationTimeMilliseconds.
    pub time_ms: u64,
    /// Protocol (sessions).
    pub proto: u8,
    /// Inside source address and port (sessions).
    pub src: Ipv4Addr,
    /// Inside source port.
    pub sport: u16,
    /// Destination address and port (sessions).
    pub dst: Ipv4Addr,
    /// Destination port.
    pub dport: u16,
    /// Source address after translation.
    pub post_src: Ipv4Addr,
    /// Source port after translation.
    pub post_sport: u16,
    /// natPoolID (addresses exhausted).
    pub pool: u32,
}

impl NatRecord {
    /// Its template and record length.
    pub fn template(&self) -> (u16, usize) {
        if self.event == NatEvent::AddressesExhausted as u8 {
            (TEMPLATE_NAT_EXHAUSTED, NAT_EXHAUSTED_LEN)
        } else {
            (TEMPLATE_NAT44_SESSION, NAT44_SESSION_LEN)
        }
    }

    /// Writes the record (`out` is [`Self::template`]'s length).
    pub fn emit(&self, out: &mut [u8]) {
        let mut o = 0;
        let mut put = |b: &[u8]| {
            out[o..o + b.len()].copy_from_slice(b);
            o += b.len();
        };
        put(&self.time_ms.to_be_bytes());
        if self.event == NatEvent::AddressesExhausted as u8 {
            put(&[self.event]);
            put(&self.pool.to_be_bytes());
            return;
        }
        put(&0u32.to_be_bytes());
        put(&self.src.octets());
        put(&self.post_src.octets());
        put(&[self.proto]);
        put(&self.sport.to_be_bytes());
        put(&self.post_sport.to_be_bytes());
        put(&self.dst.octets());
        // Only the source is translated (NAPT): the destination stays.
        put(&self.dst.octets());
        put(&self.dport.to_be_bytes());
        put(&self.dport.to_be_bytes());
        put(&[self.event]);
    }

    /// Parses a decoded NAT event record (None: not one).
    pub fn from_fields(r: &DataRecord) -> Option<Self> {
        let n = |id| r.get(id).and_then(as_uint);
        let a = |id| match r.get(id).and_then(as_ip) {
            Some(IpAddr::V4(a)) => Some(a),
            _ => None,
        };
        let event = n(ie::NAT_EVENT)? as u8;
        let time_ms = n(ie::OBSERVATION_TIME_MILLISECONDS)?;
        let z = Ipv4Addr::UNSPECIFIED;
        Some(NatRecord {
            event,
            time_ms,
            proto: n(ie::PROTOCOL_IDENTIFIER).unwrap_or(0) as u8,
            src: a(ie::SOURCE_IPV4_ADDRESS).unwrap_or(z),
            sport: n(ie::SOURCE_TRANSPORT_PORT).unwrap_or(0) as u16,
            dst: a(ie::DESTINATION_IPV4_ADDRESS).unwrap_or(z),
            dport: n(ie::DESTINATION_TRANSPORT_PORT).unwrap_or(0) as u16,
            post_src: a(ie::POST_NAT_SOURCE_IPV4_ADDRESS).unwrap_or(z),
            post_sport: n(ie::POST_NAPT_SOURCE_TRANSPORT_PORT).unwrap_or(0) as u16,
            pool: n(ie::NAT_POOL_ID).unwrap_or(0) as u32,
        })
    }
}

/// One direction of a usage rule's counts (a UPF URR): the session (its
/// SEID as flowId, IE 148), the URR ID (enterprise element
/// [`URR_ID_ELEMENT`] of [`USAGE_PEN`]), the direction (flowDirection, IE 61:
/// 0 ingress = uplink, 1 egress = downlink), octets and packets
/// (octetDeltaCount, packetDeltaCount: since the rule's previous record) and
/// when (observationTimeMilliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageRecord {
    /// The session (SEID).
    pub seid: u64,
    /// The usage rule (URR ID).
    pub urr: u32,
    /// 0: uplink (ingress), 1: downlink (egress).
    pub direction: u8,
    /// Bytes.
    pub bytes: u64,
    /// Packets.
    pub packets: u64,
    /// observationTimeMilliseconds.
    pub time_ms: u64,
}

impl UsageRecord {
    /// Its template and record length.
    pub fn template(&self) -> (u16, usize) {
        (TEMPLATE_USAGE, USAGE_LEN)
    }

    /// Writes the record (`out` is [`USAGE_LEN`] bytes).
    pub fn emit(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.seid.to_be_bytes());
        out[8..12].copy_from_slice(&self.urr.to_be_bytes());
        out[12] = self.direction;
        out[13..21].copy_from_slice(&self.bytes.to_be_bytes());
        out[21..29].copy_from_slice(&self.packets.to_be_bytes());
        out[29..37].copy_from_slice(&self.time_ms.to_be_bytes());
    }

    /// Parses a decoded usage record (None: another template or shape).
    pub fn from_fields(r: &DataRecord) -> Option<Self> {
        let n = |id| r.get(id).and_then(as_uint);
        let urr = r
            .fields
            .iter()
            .find(|(f, _)| f.id == URR_ID_ELEMENT && f.enterprise == Some(USAGE_PEN))
            .and_then(|(_, v)| as_uint(v))?;
        Some(UsageRecord {
            seid: n(ie::FLOW_ID)?,
            urr: urr as u32,
            direction: n(ie::FLOW_DIRECTION)? as u8,
            bytes: n(ie::OCTET_DELTA_COUNT)?,
            packets: n(ie::PACKET_DELTA_COUNT)?,
            time_ms: n(ie::OBSERVATION_TIME_MILLISECONDS)?,
        })
    }
}

// ---- Decoding ----

/// A decoded data record: the message's domain and sequence number, its template, and each field's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataRecord {
    /// Observation domain.
    pub domain: u32,
    /// The message's sequence number.
    pub sequence: u32,
    /// The message's export time.
    pub export_time: u32,
    /// Template id.
    pub template: u16,
    /// (field, value bytes), in template order.
    pub fields: Vec<(FieldSpec, Vec<u8>)>,
}

impl DataRecord {
    /// The value of the first IANA field `id`.
    pub fn get(&self, id: u16) -> Option<&[u8]> {
        self.fields.iter().find(|(f, _)| f.id == id && f.enterprise.is_none()).map(|(_, v)| v.as_slice())
    }
}

/// An unsigned integer field (1..=8 bytes, reduced-size encoding allowed).
pub fn as_uint(v: &[u8]) -> Option<u64> {
    (1..=8).contains(&v.len()).then(|| v.iter().fold(0u64, |a, &b| a << 8 | u64::from(b)))
}

/// An address field (4 or 16 bytes).
pub fn as_ip(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3]))),
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(v);
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// A collector's side: templates per (domain, template id), data sets decoded with them.
#[derive(Debug, Default)]
pub struct Decoder {
    templates: HashMap<(u32, u16), TemplateRepr>,
    /// Data sets skipped for want of their template.
    pub unknown_sets: u64,
    /// Data records seen per domain: with the messages' sequence numbers, what was lost.
    pub next_sequence: HashMap<u32, u32>,
    /// Records missing by the sequence numbers (a message whose number is past the expected one).
    pub missing: u64,
}

impl Decoder {
    /// A decoder with no templates.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one message: templates are learnt, data records returned.
    pub fn decode(&mut self, msg: &[u8]) -> Result<Vec<DataRecord>> {
        let m = Message::new_checked(msg)?;
        let h = HeaderRepr::parse(&m);
        if let Some(&want) = self.next_sequence.get(&h.domain) {
            self.missing += u64::from(h.sequence.wrapping_sub(want)).min(u64::from(u32::MAX / 2));
        }
        let mut out = Vec::new();
        for set in m.sets() {
            let set = set?;
            match set.id {
                TEMPLATE_SET_ID => {
                    for t in TemplateRepr::parse_set(set.body)? {
                        if t.fields.is_empty() {
                            self.templates.remove(&(h.domain, t.id));
                        } else {
                            self.templates.insert((h.domain, t.id), t);
                        }
                    }
                }
                OPTIONS_TEMPLATE_SET_ID => {}
                id => {
                    let Some(t) = self.templates.get(&(h.domain, id)) else {
                        self.unknown_sets += 1;
                        continue;
                    };
                    decode_data(t, set.body, &h, &mut out)?;
                }
            }
        }
        let seen = out.len() as u32;
        self.next_sequence.insert(h.domain, h.sequence.wrapping_add(seen));
        Ok(out)
    }
}

fn decode_data(t: &TemplateRepr, body: &[u8], h: &HeaderRepr, out: &mut Vec<DataRecord>) -> Result<()> {
    // A record takes at least one byte per field (a variable-length one its length octet).
    let min = t.fields.iter().map(|f| if f.len == VARLEN { 1 } else { f.len as usize }).sum::<usize>().max(1);
    let mut b = body;
    while b.len() >= min {
        let mut fields = Vec::with_capacity(t.fields.len());
        for f in &t.fields {
            let len = if f.len == VARLEN {
                let (&l, rest) = b.split_first().ok_or(WireError::Truncated)?;
                b = rest;
                if l == 255 {
                    if b.len() < 2 {
                        return Err(WireError::Truncated);
                    }
                    let l = be16(&b[0..2]) as usize;
                    b = &b[2..];
                    l
                } else {
                    l as usize
                }
            } else {
                f.len as usize
            };
            if b.len() < len {
                return Err(WireError::Truncated);
            }
            fields.push((*f, b[..len].to_vec()));
            b = &b[len..];
        }
        out.push(DataRecord {
            domain: h.domain,
            sequence: h.sequence,
            export_time: h.export_time,
            template: t.id,
            fields,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(s: [u8; 4], d: [u8; 4], sp: u16, dp: u16, p: u8) -> FiveTuple {
        FiveTuple::new(IpAddr::from(s), IpAddr::from(d), sp, dp, p).unwrap()
    }

    fn one_message(recs: &[FlowRecord], nats: &[NatRecord], seq: u32) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut b = MessageBuilder::new(&mut buf, HeaderRepr { export_time: 7, sequence: seq, domain: 3 }, 65535);
        assert!(b.template_set(&templates()));
        for r in recs {
            let (id, len) = r.template();
            assert!(b.record(id, len, |o| r.emit(o)));
        }
        for r in nats {
            let (id, len) = r.template();
            assert!(b.record(id, len, |o| r.emit(o)));
        }
        b.finish();
        buf
    }

    #[test]
    fn header_and_template_set_bytes_follow_rfc7011() {
        let buf = one_message(&[], &[], 5);
        // Version 10, length, export time 7, sequence 5, domain 3.
        assert_eq!(&buf[0..2], &[0, 10]);
        assert_eq!(be16(&buf[2..4]) as usize, buf.len());
        assert_eq!(&buf[4..16], &[0, 0, 0, 7, 0, 0, 0, 5, 0, 0, 0, 3]);
        // A template set (id 2), first template 256 with 11 fields: sourceIPv4Address (8), 4 bytes.
        assert_eq!(be16(&buf[16..18]), 2);
        assert_eq!(be16(&buf[20..22]), 256);
        assert_eq!(be16(&buf[22..24]), 11);
        assert_eq!(&buf[24..28], &[0, 8, 0, 4]);
        let ts: Vec<_> = templates();
        assert_eq!(ts[0].record_len(), Some(FLOW4_LEN));
        assert_eq!(ts[1].record_len(), Some(FLOW6_LEN));
        assert_eq!(ts[2].record_len(), Some(NAT44_SESSION_LEN));
        assert_eq!(ts[3].record_len(), Some(NAT_EXHAUSTED_LEN));
        assert_eq!(ts[4].record_len(), Some(FLOW4_DNAT_LEN));
        assert_eq!(ts[5].record_len(), Some(FLOW6_DNAT_LEN));
        // The backend is the last field: postNATDestinationIPv4Address (226), 4 bytes.
        assert_eq!(ts[4].fields.last(), Some(&FieldSpec::iana(226, 4)));
        assert_eq!(ts[5].fields.last(), Some(&FieldSpec::iana(282, 16)));
        assert_eq!(ts[6].record_len(), Some(USAGE_LEN));
    }

    #[test]
    fn usage_records_round_trip_with_their_enterprise_field() {
        let u = UsageRecord { seid: 7, urr: 3, direction: 1, bytes: 1500, packets: 2, time_ms: 99 };
        let mut buf = Vec::new();
        let mut b = MessageBuilder::new(&mut buf, HeaderRepr { export_time: 0, sequence: 0, domain: 1 }, 1500);
        assert!(b.template_set(&templates()));
        let (id, len) = u.template();
        assert!(b.record(id, len, |o| u.emit(o)));
        b.finish();
        let recs = Decoder::new().decode(&buf).unwrap();
        assert_eq!(recs.len(), 1);
        // The URR ID's field is enterprise-specific (bit 15 of its id set on the wire, then the PEN).
        assert_eq!(recs[0].fields[1].0, FieldSpec { id: 1, len: 4, enterprise: Some(32473) });
        assert_eq!(UsageRecord::from_fields(&recs[0]), Some(u));
        assert_eq!(FlowRecord::from_fields(&recs[0]), None);
        assert_eq!(NatRecord::from_fields(&recs[0]), None);
    }

    #[test]
    fn data_before_its_template_is_skipped_and_counted() {
        let r = FlowRecord {
            tuple: v4([1, 2, 3, 4], [5, 6, 7, 8], 1, 2, 17),
            packets: 1,
            bytes: 60,
            start_ms: 1,
            end_ms: 2,
            reason: 1,
            ingress: 0,
            post_dst: None,
        };
        let mut buf = Vec::new();
        let mut b = MessageBuilder::new(&mut buf, HeaderRepr { export_time: 0, sequence: 0, domain: 1 }, 1500);
        assert!(b.record(TEMPLATE_FLOW4, FLOW4_LEN, |o| r.emit(o)));
        b.finish();
        let mut d = Decoder::new();
        assert_eq!(d.decode(&buf).unwrap(), vec![]);
        assert_eq!(d.unknown_sets, 1);
    }

    #[test]
    fn builder_refuses_what_does_not_fit() {
        let mut buf = Vec::new();
        let mut b =
            MessageBuilder::new(&mut buf, HeaderRepr { export_time: 0, sequence: 0, domain: 1 }, 16 + 4 + FLOW4_LEN);
        assert!(b.record(TEMPLATE_FLOW4, FLOW4_LEN, |_| {}));
        assert!(!b.record(TEMPLATE_FLOW4, FLOW4_LEN, |_| {}));
        assert_eq!(b.finish(), 16 + 4 + FLOW4_LEN);
    }

    #[test]
    fn malformed_messages_are_errors() {
        let good = one_message(&[], &[], 0);
        let mut d = Decoder::new();
        assert_eq!(d.decode(&good[..10]).unwrap_err(), WireError::Truncated);
        let mut bad = good.clone();
        bad[1] = 9;
        assert_eq!(d.decode(&bad).unwrap_err(), WireError::BadVersion);
        let mut bad = good.clone();
        bad[18..20].copy_from_slice(&2u16.to_be_bytes()); // set length < 4
        assert_eq!(d.decode(&bad).unwrap_err(), WireError::BadLength);
        let mut bad = good;
        bad[22..24].copy_from_slice(&200u16.to_be_bytes()); // more fields than the set holds
        assert_eq!(d.decode(&bad).unwrap_err(), WireError::Truncated);
    }

    #[test]
    fn sequence_numbers_count_data_records_per_domain() {
        let r = FlowRecord {
            tuple: v4([1, 2, 3, 4], [5, 6, 7, 8], 1, 2, 6),
            packets: 1,
            bytes: 1,
            start_ms: 1,
            end_ms: 1,
            reason: 4,
            ingress: 1,
            post_dst: None,
        };
        let mut d = Decoder::new();
        assert_eq!(d.decode(&one_message(&[r, r], &[], 0)).unwrap().len(), 2);
        assert_eq!(d.decode(&one_message(&[r], &[], 2)).unwrap().len(), 1);
        assert_eq!(d.missing, 0);
        d.decode(&one_message(&[r], &[], 10)).unwrap();
        assert_eq!(d.missing, 7);
    }

    fn arb_tuple() -> impl Strategy<Value = FiveTuple> {
        (
            any::<bool>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u16>(),
            any::<u16>(),
            prop_oneof![Just(6u8), Just(17u8)],
        )
            .prop_map(|(is6, s, d, sp, dp, p)| {
                let (s, d) = if is6 {
                    (IpAddr::from(s), IpAddr::from(d))
                } else {
                    (IpAddr::from([s[0], s[1], s[2], s[3]]), IpAddr::from([d[0], d[1], d[2], d[3]]))
                };
                FiveTuple::new(s, d, sp, dp, p).unwrap()
            })
    }

    fn arb_flow() -> impl Strategy<Value = FlowRecord> {
        (
            arb_tuple(),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            1u8..=5,
            any::<u32>(),
            proptest::option::of(any::<[u8; 16]>()),
        )
            .prop_map(|(tuple, (packets, bytes, start_ms, end_ms), reason, ingress, to)| FlowRecord {
                tuple,
                packets,
                bytes,
                start_ms,
                end_ms,
                reason,
                ingress,
                // A backend of the tuple's family.
                post_dst: to.map(|b| match tuple {
                    FiveTuple::V4(_) => IpAddr::from([b[0], b[1], b[2], b[3]]),
                    FiveTuple::V6(_) => IpAddr::from(b),
                }),
            })
    }

    fn arb_nat() -> impl Strategy<Value = NatRecord> {
        (prop_oneof![Just(3u8), Just(4), Just(5)], any::<u64>(), any::<[u32; 3]>(), any::<[u16; 3]>(), any::<u32>())
            .prop_map(|(event, time_ms, a, p, pool)| {
                let ex = event == 3;
                let z = |v: u32| if ex { Ipv4Addr::UNSPECIFIED } else { Ipv4Addr::from(v) };
                let zp = |v: u16| if ex { 0 } else { v };
                NatRecord {
                    event,
                    time_ms,
                    proto: if ex { 0 } else { 17 },
                    src: z(a[0]),
                    sport: zp(p[0]),
                    dst: z(a[1]),
                    dport: zp(p[1]),
                    post_src: z(a[2]),
                    post_sport: zp(p[2]),
                    pool: if ex { pool } else { 0 },
                }
            })
    }

    proptest! {
        #[test]
        fn records_round_trip(flows in proptest::collection::vec(arb_flow(), 0..20),
                              nats in proptest::collection::vec(arb_nat(), 0..10), seq in any::<u32>()) {
            let buf = one_message(&flows, &nats, seq);
            let m = Message::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(HeaderRepr::parse(&m), HeaderRepr { export_time: 7, sequence: seq, domain: 3 });
            let mut d = Decoder::new();
            let recs = d.decode(&buf).unwrap();
            prop_assert_eq!(recs.len(), flows.len() + nats.len());
            let got_f: Vec<_> = recs.iter().filter_map(FlowRecord::from_fields).collect();
            let got_n: Vec<_> = recs.iter().filter(|r| r.template >= TEMPLATE_NAT44_SESSION).filter_map(NatRecord::from_fields).collect();
            prop_assert_eq!(got_f, flows);
            prop_assert_eq!(got_n, nats);
        }

        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut d = Decoder::new();
            let _ = d.decode(&bytes);
            // And with a valid header in front.
            let mut m = one_message(&[], &[], 0);
            m.extend_from_slice(&bytes);
            let l = m.len().min(65535) as u16;
            m[2..4].copy_from_slice(&l.to_be_bytes());
            let _ = d.decode(&m);
        }
    }
}

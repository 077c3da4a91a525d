//! GTP-U (3GPP TS 29.281 §5): the [`GtpuPacket`] view, its bounded
//! extension-header chain ([`GtpuExtensions`]), the PDU Session Container
//! (type 0x85, TS 38.415 §5.5.2) with its QFI, the T-PDU payload, and the
//! plain [`GtpuRepr`] whose `emit` builds a G-PDU with an optional container.
//!
//! Layout: flags (version 1, PT 1, E/S/PN), message type, length (bytes after
//! the mandatory 8), TEID; when any of E/S/PN is set, sequence number, N-PDU
//! number and next-extension type follow; each extension is a length in
//! 4-octet units (0 is an error), content, and the next extension type.

use crate::error::{Result, WireError};

/// Length of the mandatory header.
pub const HEADER_LEN: usize = 8;

/// Length of the optional sequence / N-PDU / next-extension block.
pub const OPTIONAL_LEN: usize = 4;

/// Most extension headers walked before the packet is refused.
pub const MAX_EXTENSIONS: usize = 8;

const FLAG_PT: u8 = 0x10;
const FLAG_E: u8 = 0x04;
const FLAG_S: u8 = 0x02;
const FLAG_PN: u8 = 0x01;

/// GTP-U message types.
pub mod msg_type {
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 1;
    /// Echo response.
    pub const ECHO_RESPONSE: u8 = 2;
    /// Error indication.
    pub const ERROR_INDICATION: u8 = 26;
    /// Supported extension headers notification.
    pub const SUPPORTED_EXT_HEADERS: u8 = 31;
    /// End marker.
    pub const END_MARKER: u8 = 254;
    /// G-PDU: carries a user packet (T-PDU).
    pub const G_PDU: u8 = 255;
}

/// Extension header types.
pub mod ext_type {
    /// No more extension headers.
    pub const NONE: u8 = 0x00;
    /// UDP port (error indication).
    pub const UDP_PORT: u8 = 0x40;
    /// PDCP PDU number.
    pub const PDCP_PDU_NUMBER: u8 = 0xc0;
    /// NR RAN container.
    pub const NR_RAN_CONTAINER: u8 = 0x84;
    /// PDU Session Container.
    pub const PDU_SESSION_CONTAINER: u8 = 0x85;
}

/// PDU type of a PDU Session Container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PduType {
    /// DL PDU SESSION INFORMATION (type 0).
    Downlink,
    /// UL PDU SESSION INFORMATION (type 1).
    Uplink,
}

/// The fields of a PDU Session Container flowplane uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PduSessionInfo {
    /// Downlink or uplink.
    pub pdu_type: PduType,
    /// QoS flow identifier (0..=63).
    pub qfi: u8,
    /// Paging policy presence (DL only).
    pub ppp: bool,
    /// Reflective QoS indicator (DL only).
    pub rqi: bool,
    /// Paging policy indicator (DL with PPP only, 0..=7).
    pub ppi: Option<u8>,
}

impl PduSessionInfo {
    /// Parses the container content (between the length and next-type octets).
    pub fn parse(content: &[u8]) -> Result<PduSessionInfo> {
        let (o1, o2) = match content {
            [a, b, ..] => (*a, *b),
            _ => return Err(WireError::Truncated),
        };
        let qfi = o2 & 0x3f;
        match o1 >> 4 {
            0 => {
                let ppp = o2 & 0x80 != 0;
                let ppi = if ppp { Some(content.get(2).ok_or(WireError::Truncated)? >> 5) } else { None };
                Ok(PduSessionInfo { pdu_type: PduType::Downlink, qfi, ppp, rqi: o2 & 0x40 != 0, ppi })
            }
            1 => Ok(PduSessionInfo { pdu_type: PduType::Uplink, qfi, ppp: false, rqi: false, ppi: None }),
            _ => Err(WireError::Unsupported),
        }
    }

    /// Bytes of the whole extension header (length, content, padding, next type).
    #[inline]
    pub const fn ext_len(&self) -> usize {
        if self.ppi.is_some() {
            8
        } else {
            4
        }
    }

    /// Writes the whole extension header into `buf` (at least [`Self::ext_len`]
    /// bytes) with next-extension type `next`.
    pub fn emit(&self, buf: &mut [u8], next: u8) -> Result<()> {
        let n = self.ext_len();
        let b = buf.get_mut(..n).ok_or(WireError::Truncated)?;
        if self.qfi > 63 || matches!(self.ppi, Some(p) if p > 7) {
            return Err(WireError::Malformed);
        }
        if self.pdu_type == PduType::Uplink && (self.ppp || self.rqi || self.ppi.is_some()) {
            return Err(WireError::Malformed);
        }
        if self.ppi.is_some() != self.ppp {
            return Err(WireError::Malformed);
        }
        b.fill(0);
        b[0] = (n / 4) as u8;
        b[1] = match self.pdu_type {
            PduType::Downlink => 0x00,
            PduType::Uplink => 0x10,
        };
        b[2] = if self.ppp { 0x80 } else { 0 } | if self.rqi { 0x40 } else { 0 } | self.qfi;
        if let Some(ppi) = self.ppi {
            b[3] = ppi << 5;
        }
        b[n - 1] = next;
        Ok(())
    }
}

/// One extension header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GtpuExtension<'a> {
    /// Type of this extension (from the previous next-type field).
    pub ext_type: u8,
    /// Content between the length octet and the next-type octet.
    pub content: &'a [u8],
}

/// Iterator over an extension chain. Stops after [`MAX_EXTENSIONS`] items
/// (yielding `Err(TooManyHeaders)`) or at the first error.
#[derive(Debug, Clone)]
pub struct GtpuExtensions<'a> {
    data: &'a [u8],
    next: u8,
    count: usize,
    done: bool,
}

impl<'a> GtpuExtensions<'a> {
    /// Iterates over `data` (the bytes after the optional block, up to the end
    /// of the GTP-U message) starting with extension type `first`.
    #[inline]
    pub fn new(data: &'a [u8], first: u8) -> Self {
        GtpuExtensions { data, next: first, count: 0, done: first == ext_type::NONE }
    }

    /// Bytes not yet consumed (after the chain is exhausted: the T-PDU).
    #[inline]
    pub fn remaining(&self) -> &'a [u8] {
        self.data
    }

    fn fail(&mut self, e: WireError) -> Option<Result<GtpuExtension<'a>>> {
        self.done = true;
        Some(Err(e))
    }
}

impl<'a> Iterator for GtpuExtensions<'a> {
    type Item = Result<GtpuExtension<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.count == MAX_EXTENSIONS {
            return self.fail(WireError::TooManyHeaders);
        }
        let len = match self.data.first() {
            None => return self.fail(WireError::Truncated),
            Some(0) => return self.fail(WireError::Malformed),
            Some(&l) => l as usize * 4,
        };
        if len > self.data.len() {
            return self.fail(WireError::Truncated);
        }
        let ext = GtpuExtension { ext_type: self.next, content: &self.data[1..len - 1] };
        self.next = self.data[len - 1];
        self.data = &self.data[len..];
        self.count += 1;
        self.done = self.next == ext_type::NONE;
        Some(Ok(ext))
    }
}

/// Offsets and facts of a validated GTP-U header (see [`GtpuPacket::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GtpuLayout {
    /// Header length: mandatory part, optional block and extensions.
    pub header_len: usize,
    /// End of the message (8 + length field); the T-PDU is `header_len..end`.
    pub end: usize,
    /// The PDU Session Container, if present and recognised.
    pub pdu_session: Option<PduSessionInfo>,
}

/// A view of a GTP-U message.
#[derive(Debug, Clone)]
pub struct GtpuPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> GtpuPacket<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        GtpuPacket { buffer }
    }

    /// Wraps a buffer after validating flags, length and the extension chain.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the whole header (see [`GtpuPacket::layout`]).
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        self.layout().map(|_| ())
    }

    /// Validates and measures the header: version 1 (else `BadVersion`),
    /// PT 1 (GTP' is `Unsupported`), length within the buffer, the optional
    /// block within the length, and every extension (length 0 is `Malformed`,
    /// a PDU Session Container with an unknown PDU type is `Unsupported`).
    pub fn layout(&self) -> Result<GtpuLayout> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] >> 5 != 1 {
            return Err(WireError::BadVersion);
        }
        if b[0] & FLAG_PT == 0 {
            return Err(WireError::Unsupported);
        }
        let end = HEADER_LEN + self.length() as usize;
        if end > b.len() {
            return Err(WireError::Truncated);
        }
        let mut layout = GtpuLayout { header_len: HEADER_LEN, end, pdu_session: None };
        if b[0] & (FLAG_E | FLAG_S | FLAG_PN) == 0 {
            return Ok(layout);
        }
        if end < HEADER_LEN + OPTIONAL_LEN {
            return Err(WireError::BadLength);
        }
        layout.header_len = HEADER_LEN + OPTIONAL_LEN;
        if b[0] & FLAG_E == 0 {
            return Ok(layout);
        }
        let mut it = GtpuExtensions::new(&b[layout.header_len..end], b[11]);
        for ext in &mut it {
            let ext = ext?;
            if ext.ext_type == ext_type::PDU_SESSION_CONTAINER {
                layout.pdu_session = Some(PduSessionInfo::parse(ext.content)?);
            }
        }
        layout.header_len = end - it.remaining().len();
        Ok(layout)
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn flags(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// Version (1 for GTPv1-U).
    #[inline]
    pub fn version(&self) -> u8 {
        self.flags() >> 5
    }

    /// Protocol type bit (1 = GTP, 0 = GTP').
    #[inline]
    pub fn protocol_type(&self) -> bool {
        self.flags() & FLAG_PT != 0
    }

    /// E flag: an extension chain follows the optional block.
    #[inline]
    pub fn ext_flag(&self) -> bool {
        self.flags() & FLAG_E != 0
    }

    /// S flag: the sequence number is meaningful.
    #[inline]
    pub fn seq_flag(&self) -> bool {
        self.flags() & FLAG_S != 0
    }

    /// PN flag: the N-PDU number is meaningful.
    #[inline]
    pub fn npdu_flag(&self) -> bool {
        self.flags() & FLAG_PN != 0
    }

    /// True if the optional 4-byte block is present (any of E/S/PN).
    #[inline]
    pub fn has_optional(&self) -> bool {
        self.flags() & (FLAG_E | FLAG_S | FLAG_PN) != 0
    }

    /// Message type.
    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// Length field: bytes after the mandatory 8-byte header.
    #[inline]
    pub fn length(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }

    /// Tunnel endpoint identifier.
    #[inline]
    pub fn teid(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([b[4], b[5], b[6], b[7]])
    }

    /// Sequence number, if the S flag is set.
    #[inline]
    pub fn seq_number(&self) -> Option<u16> {
        let b = self.buffer.as_ref();
        if self.seq_flag() {
            Some(u16::from_be_bytes([*b.get(8)?, *b.get(9)?]))
        } else {
            None
        }
    }

    /// N-PDU number, if the PN flag is set.
    #[inline]
    pub fn npdu_number(&self) -> Option<u8> {
        if self.npdu_flag() {
            self.buffer.as_ref().get(10).copied()
        } else {
            None
        }
    }

    /// First extension type, if the E flag is set.
    #[inline]
    pub fn next_ext_type(&self) -> Option<u8> {
        if self.ext_flag() {
            self.buffer.as_ref().get(11).copied()
        } else {
            None
        }
    }

    /// Iterator over the extension chain (empty without the E flag or on a short buffer).
    pub fn extensions(&self) -> GtpuExtensions<'_> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN + OPTIONAL_LEN {
            return GtpuExtensions::new(&[], ext_type::NONE);
        }
        let end = (HEADER_LEN + self.length() as usize).min(b.len());
        match self.next_ext_type() {
            Some(first) => GtpuExtensions::new(b.get(HEADER_LEN + OPTIONAL_LEN..end).unwrap_or(&[]), first),
            None => GtpuExtensions::new(&[], ext_type::NONE),
        }
    }

    /// The PDU Session Container, if present.
    #[inline]
    pub fn pdu_session(&self) -> Result<Option<PduSessionInfo>> {
        Ok(self.layout()?.pdu_session)
    }

    /// QFI from the PDU Session Container, if present and valid.
    #[inline]
    pub fn qfi(&self) -> Option<u8> {
        self.pdu_session().ok().flatten().map(|p| p.qfi)
    }

    /// Header length (mandatory + optional + extensions); 8 if the header is invalid.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.layout().map_or(HEADER_LEN, |l| l.header_len)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> GtpuPacket<&'a T> {
    /// The T-PDU (inner packet of a G-PDU, or the IEs of other messages);
    /// empty if the header is invalid.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        match self.layout() {
            Ok(l) => &b[l.header_len..l.end],
            Err(_) => &[],
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> GtpuPacket<T> {
    /// Sets the flags octet (version 1 and PT 1 are forced).
    #[inline]
    pub fn set_flags(&mut self, e: bool, s: bool, pn: bool) {
        self.buffer.as_mut()[0] =
            0x20 | FLAG_PT | if e { FLAG_E } else { 0 } | if s { FLAG_S } else { 0 } | if pn { FLAG_PN } else { 0 };
    }

    /// Sets the message type.
    #[inline]
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }

    /// Sets the length field.
    #[inline]
    pub fn set_length(&mut self, v: u16) {
        self.buffer.as_mut()[2..4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the TEID.
    #[inline]
    pub fn set_teid(&mut self, v: u32) {
        self.buffer.as_mut()[4..8].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the optional block (sequence number, N-PDU number, next extension type).
    #[inline]
    pub fn set_optional(&mut self, seq: u16, npdu: u8, next_ext: u8) {
        let b = &mut self.buffer.as_mut()[8..12];
        b[..2].copy_from_slice(&seq.to_be_bytes());
        b[2] = npdu;
        b[3] = next_ext;
    }

    /// Mutable T-PDU; empty if the header is invalid.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match self.layout() {
            Ok(l) => &mut self.buffer.as_mut()[l.header_len..l.end],
            Err(_) => &mut [],
        }
    }
}

/// A parsed GTP-U header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GtpuRepr {
    /// Message type.
    pub msg_type: u8,
    /// TEID.
    pub teid: u32,
    /// Sequence number (S flag).
    pub seq_number: Option<u16>,
    /// N-PDU number (PN flag).
    pub npdu_number: Option<u8>,
    /// PDU Session Container (E flag); other extensions are skipped on parse.
    pub pdu_session: Option<PduSessionInfo>,
    /// T-PDU length.
    pub payload_len: usize,
}

impl GtpuRepr {
    /// A G-PDU header for a T-PDU of `payload_len` bytes.
    pub const fn g_pdu(teid: u32, pdu_session: Option<PduSessionInfo>, payload_len: usize) -> Self {
        GtpuRepr { msg_type: msg_type::G_PDU, teid, seq_number: None, npdu_number: None, pdu_session, payload_len }
    }

    /// Parses and validates a header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &GtpuPacket<&T>) -> Result<GtpuRepr> {
        let l = p.layout()?;
        Ok(GtpuRepr {
            msg_type: p.msg_type(),
            teid: p.teid(),
            seq_number: p.seq_number(),
            npdu_number: p.npdu_number(),
            pdu_session: l.pdu_session,
            payload_len: l.end - l.header_len,
        })
    }

    #[inline]
    fn has_optional(&self) -> bool {
        self.seq_number.is_some() || self.npdu_number.is_some() || self.pdu_session.is_some()
    }

    /// Bytes [`GtpuRepr::emit`] writes: the header (mandatory, optional block, container).
    #[inline]
    pub fn buffer_len(&self) -> usize {
        let opt = if self.has_optional() { OPTIONAL_LEN } else { 0 };
        HEADER_LEN + opt + self.pdu_session.map_or(0, |p| p.ext_len())
    }

    /// Writes the header; the T-PDU is the caller's (at `buffer_len()`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut GtpuPacket<&mut T>) -> Result<()> {
        let hl = self.buffer_len();
        if p.buffer.as_ref().len() < hl {
            return Err(WireError::Truncated);
        }
        let length = u16::try_from(hl - HEADER_LEN + self.payload_len).map_err(|_| WireError::BadLength)?;
        if let Some(psc) = self.pdu_session {
            psc.emit(&mut p.buffer.as_mut()[HEADER_LEN + OPTIONAL_LEN..hl], ext_type::NONE)?;
        }
        p.set_flags(self.pdu_session.is_some(), self.seq_number.is_some(), self.npdu_number.is_some());
        p.set_msg_type(self.msg_type);
        p.set_length(length);
        p.set_teid(self.teid);
        if self.has_optional() {
            let next = if self.pdu_session.is_some() { ext_type::PDU_SESSION_CONTAINER } else { ext_type::NONE };
            p.set_optional(self.seq_number.unwrap_or(0), self.npdu_number.unwrap_or(0), next);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An uplink G-PDU as sent by a gNB: E flag, PDU Session Container (UL, QFI 9),
    // TEID 0x00000001, carrying a 28-byte IPv4/ICMP echo request.
    const GPDU: [u8; 44] = [
        0x34, 0xff, 0x00, 0x24, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x85, 0x01, 0x10, 0x09, 0x00, // GTP-U
        0x45, 0x00, 0x00, 0x1c, 0x00, 0x01, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 0x0a, 0x2d, 0x00, 0x01, 0x08, 0x08,
        0x08, 0x08, 0x08, 0x00, 0xf7, 0xfe, 0x00, 0x01, 0x00, 0x00,
    ];

    #[test]
    fn parse_gpdu_with_container() {
        let p = GtpuPacket::new_checked(&GPDU[..]).unwrap();
        assert_eq!(p.version(), 1);
        assert!(p.protocol_type() && p.ext_flag() && !p.seq_flag() && !p.npdu_flag());
        assert_eq!(p.msg_type(), msg_type::G_PDU);
        assert_eq!(p.teid(), 1);
        assert_eq!(p.header_len(), 16);
        assert_eq!(p.qfi(), Some(9));
        let psc = p.pdu_session().unwrap().unwrap();
        assert_eq!(psc.pdu_type, PduType::Uplink);
        assert_eq!(p.payload(), &GPDU[16..]);
        let exts: Vec<_> = p.extensions().collect::<Result<_>>().unwrap();
        assert_eq!(exts, vec![GtpuExtension { ext_type: 0x85, content: &[0x10, 0x09] }]);
        let r = GtpuRepr::parse(&p).unwrap();
        assert_eq!(r, GtpuRepr::g_pdu(1, Some(psc), 28));
        let mut out = [0u8; 44];
        out[16..].copy_from_slice(&GPDU[16..]);
        r.emit(&mut GtpuPacket::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, GPDU);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..GPDU.len() {
            assert!(GtpuPacket::new_checked(&GPDU[..n]).is_err(), "len {n}");
            let p = GtpuPacket::new_unchecked(&GPDU[..n]);
            // Accessors that walk never panic, even unchecked.
            let _ = (p.payload(), p.header_len(), p.qfi(), p.extensions().count());
        }
    }

    #[test]
    fn bad_headers() {
        let mut b = GPDU;
        b[0] = 0x54; // version 2
        assert_eq!(GtpuPacket::new_checked(&b[..]).unwrap_err(), WireError::BadVersion);
        b[0] = 0x24; // GTP'
        assert_eq!(GtpuPacket::new_checked(&b[..]).unwrap_err(), WireError::Unsupported);
        let mut z = GPDU;
        z[12] = 0; // extension length 0
        assert_eq!(GtpuPacket::new_checked(&z[..]).unwrap_err(), WireError::Malformed);
        let mut short = GPDU;
        short[3] = 2; // length cannot hold the optional block
        assert_eq!(GtpuPacket::new_checked(&short[..]).unwrap_err(), WireError::BadLength);
        let mut long = GPDU;
        long[12] = 200; // extension runs past the message
        assert_eq!(GtpuPacket::new_checked(&long[..]).unwrap_err(), WireError::Truncated);
        let mut pdu = GPDU;
        pdu[13] = 0x70; // PDU type 7
        assert_eq!(GtpuPacket::new_checked(&pdu[..]).unwrap_err(), WireError::Unsupported);
        // A chain of 9 unknown 4-byte extensions is refused.
        let mut chain = vec![0x34, 0xff, 0, 40, 0, 0, 0, 9, 0, 0, 0, 0x40];
        for i in 0..9 {
            chain.extend_from_slice(&[1, 0, 0, if i == 8 { 0 } else { 0x40 }]);
        }
        assert_eq!(GtpuPacket::new_checked(&chain[..]).unwrap_err(), WireError::TooManyHeaders);
    }

    #[test]
    fn downlink_with_ppi_seq_and_npdu() {
        let psc = PduSessionInfo { pdu_type: PduType::Downlink, qfi: 63, ppp: true, rqi: true, ppi: Some(5) };
        let r = GtpuRepr {
            msg_type: msg_type::G_PDU,
            teid: 0xdeadbeef,
            seq_number: Some(77),
            npdu_number: Some(3),
            pdu_session: Some(psc),
            payload_len: 4,
        };
        assert_eq!(r.buffer_len(), 20);
        let mut b = [0u8; 24];
        r.emit(&mut GtpuPacket::new_unchecked(&mut b[..])).unwrap();
        let p = GtpuPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.seq_number(), Some(77));
        assert_eq!(p.npdu_number(), Some(3));
        assert_eq!(GtpuRepr::parse(&p).unwrap(), r);
        let echo = GtpuRepr { msg_type: msg_type::ECHO_REQUEST, seq_number: Some(1), ..GtpuRepr::g_pdu(0, None, 0) };
        let mut e = [0u8; 12];
        echo.emit(&mut GtpuPacket::new_unchecked(&mut e[..])).unwrap();
        assert_eq!(e, [0x32, 1, 0, 4, 0, 0, 0, 0, 0, 1, 0, 0]);
        let bad = PduSessionInfo { ppi: None, ..psc };
        assert_eq!(bad.emit(&mut [0u8; 8], 0), Err(WireError::Malformed));
    }
}

//! TCP (RFC 9293): the [`TcpPacket`] view with a validated data offset,
//! [`TcpFlags`], a bounded option iterator ([`TcpOptions`]) that never loops
//! or over-reads, checksums over either IP family's pseudo-header, incremental
//! port/address rewrites, and the plain [`TcpRepr`].

use core::ops::{BitAnd, BitOr, BitOrAssign, Not};

use crate::checksum;
use crate::error::{Result, WireError};
use crate::ipv4::{IpProtocol, PseudoHeader};

/// Length of the TCP header without options.
pub const HEADER_LEN: usize = 20;

/// Largest header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

/// TCP control flags (the eight bits of header byte 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No more data.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// Synchronize sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// Reset.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// Push.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// Acknowledgement field significant.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// Urgent pointer significant.
    pub const URG: TcpFlags = TcpFlags(0x20);
    /// ECN echo.
    pub const ECE: TcpFlags = TcpFlags(0x40);
    /// Congestion window reduced.
    pub const CWR: TcpFlags = TcpFlags(0x80);

    /// No flag set.
    #[inline]
    pub const fn empty() -> TcpFlags {
        TcpFlags(0)
    }

    /// Raw bits.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// True if every flag of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if any flag of `other` is set in `self`.
    #[inline]
    pub const fn intersects(self, other: TcpFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// True if no flag is set.
    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for TcpFlags {
    type Output = TcpFlags;
    #[inline]
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for TcpFlags {
    #[inline]
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for TcpFlags {
    type Output = TcpFlags;
    #[inline]
    fn bitand(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 & rhs.0)
    }
}

impl Not for TcpFlags {
    type Output = TcpFlags;
    #[inline]
    fn not(self) -> TcpFlags {
        TcpFlags(!self.0)
    }
}

/// Option kinds recognised by [`TcpOptions`].
pub mod option_kind {
    /// End of option list.
    pub const EOL: u8 = 0;
    /// No operation (padding).
    pub const NOP: u8 = 1;
    /// Maximum segment size.
    pub const MSS: u8 = 2;
    /// Window scale.
    pub const WINDOW_SCALE: u8 = 3;
    /// SACK permitted.
    pub const SACK_PERMITTED: u8 = 4;
    /// SACK blocks.
    pub const SACK: u8 = 5;
    /// Timestamps.
    pub const TIMESTAMPS: u8 = 8;
}

/// One TCP option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    /// End of list; the iterator stops after it.
    EndOfList,
    /// Padding.
    NoOperation,
    /// Maximum segment size.
    MaxSegmentSize(u16),
    /// Window scale shift count.
    WindowScale(u8),
    /// SACK permitted.
    SackPermitted,
    /// SACK blocks, 8 bytes (left, right edge) each; `len() % 8 == 0`.
    Sack(&'a [u8]),
    /// Timestamp value and echo reply.
    Timestamps {
        /// TSval.
        tsval: u32,
        /// TSecr.
        tsecr: u32,
    },
    /// Any other kind, skipped by its length.
    Unknown {
        /// Option kind.
        kind: u8,
        /// Option data (after kind and length).
        data: &'a [u8],
    },
}

/// Iterator over a TCP options area. Each step consumes at least one byte, so
/// it ends after at most 40 items; it yields one `Err(BadOption)` and stops on
/// a bad length (below 2, past the area, or wrong for a known kind).
#[derive(Debug, Clone)]
pub struct TcpOptions<'a> {
    data: &'a [u8],
    done: bool,
}

impl<'a> TcpOptions<'a> {
    /// Iterates over `data`, an options area (the bytes between the fixed header and the payload).
    #[inline]
    pub fn new(data: &'a [u8]) -> Self {
        TcpOptions { data, done: false }
    }
}

impl<'a> Iterator for TcpOptions<'a> {
    type Item = Result<TcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let (&kind, rest) = match self.data.split_first() {
            Some(x) => x,
            None => {
                self.done = true;
                return None;
            }
        };
        match kind {
            option_kind::EOL => {
                self.done = true;
                return Some(Ok(TcpOption::EndOfList));
            }
            option_kind::NOP => {
                self.data = rest;
                return Some(Ok(TcpOption::NoOperation));
            }
            _ => {}
        }
        let len = match rest.first() {
            Some(&l) if l >= 2 && l as usize <= self.data.len() => l as usize,
            _ => {
                self.done = true;
                return Some(Err(WireError::BadOption));
            }
        };
        let body = &self.data[2..len];
        self.data = &self.data[len..];
        let opt = match (kind, len) {
            (option_kind::MSS, 4) => TcpOption::MaxSegmentSize(u16::from_be_bytes([body[0], body[1]])),
            (option_kind::WINDOW_SCALE, 3) => TcpOption::WindowScale(body[0]),
            (option_kind::SACK_PERMITTED, 2) => TcpOption::SackPermitted,
            (option_kind::SACK, l) if l >= 10 && (l - 2) % 8 == 0 => TcpOption::Sack(body),
            (option_kind::TIMESTAMPS, 10) => TcpOption::Timestamps {
                tsval: u32::from_be_bytes([body[0], body[1], body[2], body[3]]),
                tsecr: u32::from_be_bytes([body[4], body[5], body[6], body[7]]),
            },
            (
                option_kind::MSS
                | option_kind::WINDOW_SCALE
                | option_kind::SACK_PERMITTED
                | option_kind::SACK
                | option_kind::TIMESTAMPS,
                _,
            ) => {
                self.done = true;
                return Some(Err(WireError::BadOption));
            }
            (kind, _) => TcpOption::Unknown { kind, data: body },
        };
        Some(Ok(opt))
    }
}

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps a buffer after validating the data offset.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates: whole fixed header, data offset >= 5 and within the buffer.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::BadHeaderLen);
        }
        if hl > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn u16_at(&self, i: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[i], b[i + 1]])
    }

    #[inline]
    fn u32_at(&self, i: usize) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        self.u32_at(field::SEQ)
    }

    /// Acknowledgement number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        self.u32_at(field::ACK)
    }

    /// Header length in bytes (data offset * 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::OFF] >> 4) as usize) * 4
    }

    /// Control flags.
    #[inline]
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.buffer.as_ref()[field::FLAGS])
    }

    /// Receive window.
    #[inline]
    pub fn window_len(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }

    /// Checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Urgent pointer.
    #[inline]
    pub fn urgent_at(&self) -> u16 {
        self.u16_at(field::URGENT)
    }

    /// The options area (clamped to the buffer).
    #[inline]
    pub fn options(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        b.get(HEADER_LEN..self.header_len().min(b.len())).unwrap_or(&[])
    }

    /// Iterator over the options.
    #[inline]
    pub fn option_iter(&self) -> TcpOptions<'_> {
        TcpOptions::new(self.options())
    }

    /// Verifies the checksum over the whole buffer (header + payload) with
    /// the pseudo-header of `src`/`dst` (IPv4 or IPv6 addresses). The buffer
    /// must end where the segment ends (slice it with the IP payload length).
    #[inline]
    pub fn verify_checksum<A: PseudoHeader>(&self, src: A, dst: A) -> bool {
        let b = self.buffer.as_ref();
        let ph = A::pseudo_sum(src, dst, IpProtocol::TCP, b.len());
        checksum::combine(ph, checksum::sum(b)) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> TcpPacket<&'a T> {
    /// Segment data after the header (clamped to the buffer).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        b.get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    #[inline]
    fn set_u16_at(&mut self, i: usize, v: u16) {
        self.buffer.as_mut()[i..i + 2].copy_from_slice(&v.to_be_bytes());
    }

    #[inline]
    fn set_u32_at(&mut self, i: usize, v: u32) {
        self.buffer.as_mut()[i..i + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source port (checksum not updated).
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16_at(field::SRC_PORT, v)
    }

    /// Sets the destination port (checksum not updated).
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16_at(field::DST_PORT, v)
    }

    /// Sets the sequence number.
    #[inline]
    pub fn set_seq_number(&mut self, v: u32) {
        self.set_u32_at(field::SEQ, v)
    }

    /// Sets the acknowledgement number.
    #[inline]
    pub fn set_ack_number(&mut self, v: u32) {
        self.set_u32_at(field::ACK, v)
    }

    /// Sets the header length in bytes (rounded down to 4, capped at 60); clears reserved bits.
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[field::OFF] = ((len.min(MAX_HEADER_LEN) / 4) as u8) << 4;
    }

    /// Sets the control flags.
    #[inline]
    pub fn set_flags(&mut self, f: TcpFlags) {
        self.buffer.as_mut()[field::FLAGS] = f.0;
    }

    /// Sets the window.
    #[inline]
    pub fn set_window_len(&mut self, v: u16) {
        self.set_u16_at(field::WINDOW, v)
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v)
    }

    /// Sets the urgent pointer.
    #[inline]
    pub fn set_urgent_at(&mut self, v: u16) {
        self.set_u16_at(field::URGENT, v)
    }

    /// Computes and stores the checksum over the whole buffer with the
    /// pseudo-header of `src`/`dst`.
    #[inline]
    pub fn fill_checksum<A: PseudoHeader>(&mut self, src: A, dst: A) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let ph = A::pseudo_sum(src, dst, IpProtocol::TCP, b.len());
        let c = checksum::finish(checksum::combine(ph, checksum::sum(b)));
        self.set_checksum(c);
    }

    /// Sets the source port, updating the checksum incrementally.
    #[inline]
    pub fn set_src_port_incremental(&mut self, v: u16) {
        let c = checksum::update16(self.checksum(), self.src_port(), v);
        self.set_src_port(v);
        self.set_checksum(c);
    }

    /// Sets the destination port, updating the checksum incrementally.
    #[inline]
    pub fn set_dst_port_incremental(&mut self, v: u16) {
        let c = checksum::update16(self.checksum(), self.dst_port(), v);
        self.set_dst_port(v);
        self.set_checksum(c);
    }

    /// Updates the checksum for an IPv4 address in the pseudo-header changing
    /// from `old` to `new` (the IP header itself is the caller's).
    #[inline]
    pub fn update_pseudo_addr_v4(&mut self, old: [u8; 4], new: [u8; 4]) {
        let c = checksum::update32(self.checksum(), u32::from_be_bytes(old), u32::from_be_bytes(new));
        self.set_checksum(c);
    }

    /// Updates the checksum for an IPv6 address in the pseudo-header changing from `old` to `new`.
    #[inline]
    pub fn update_pseudo_addr_v6(&mut self, old: [u8; 16], new: [u8; 16]) {
        let c = checksum::update_bytes(self.checksum(), &old, &new);
        self.set_checksum(c);
    }

    /// Mutable segment data.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        self.buffer.as_mut().get_mut(hl..).unwrap_or(&mut [])
    }

    /// Mutable options area.
    #[inline]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        let end = hl.min(b.len());
        b.get_mut(HEADER_LEN..end).unwrap_or(&mut [])
    }
}

/// A parsed TCP header with the options flowplane cares about. SACK blocks
/// and unknown options are skipped on parse and not emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq_number: u32,
    /// Acknowledgement number.
    pub ack_number: u32,
    /// Control flags.
    pub flags: TcpFlags,
    /// Window.
    pub window_len: u16,
    /// Urgent pointer.
    pub urgent_at: u16,
    /// MSS option.
    pub max_seg_size: Option<u16>,
    /// Window scale option.
    pub window_scale: Option<u8>,
    /// SACK-permitted option.
    pub sack_permitted: bool,
    /// Timestamps option (TSval, TSecr).
    pub timestamps: Option<(u32, u32)>,
}

impl TcpRepr {
    /// Parses the header and its options (the checksum is not verified here:
    /// it needs the IP addresses, see [`TcpPacket::verify_checksum`]).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &TcpPacket<&T>) -> Result<TcpRepr> {
        p.check_len()?;
        let mut r = TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window_len: p.window_len(),
            urgent_at: p.urgent_at(),
            max_seg_size: None,
            window_scale: None,
            sack_permitted: false,
            timestamps: None,
        };
        for opt in p.option_iter() {
            match opt? {
                TcpOption::MaxSegmentSize(v) => r.max_seg_size = Some(v),
                TcpOption::WindowScale(v) => r.window_scale = Some(v),
                TcpOption::SackPermitted => r.sack_permitted = true,
                TcpOption::Timestamps { tsval, tsecr } => r.timestamps = Some((tsval, tsecr)),
                _ => {}
            }
        }
        Ok(r)
    }

    fn options_len(&self) -> usize {
        let raw: usize = self.max_seg_size.map_or(0, |_| 4)
            + self.window_scale.map_or(0, |_| 3)
            + if self.sack_permitted { 2 } else { 0 }
            + self.timestamps.map_or(0, |_| 10);
        raw.div_ceil(4) * 4
    }

    /// Bytes [`TcpRepr::emit`] writes: the header with options, padded to 4.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.options_len()
    }

    /// Writes the header and options (NOP-padded); the checksum is left 0 for
    /// [`TcpPacket::fill_checksum`] once the payload is in place.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut TcpPacket<&mut T>) -> Result<()> {
        let hl = self.buffer_len();
        if p.buffer.as_ref().len() < hl {
            return Err(WireError::Truncated);
        }
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq_number);
        p.set_ack_number(self.ack_number);
        p.set_header_len(hl);
        p.set_flags(self.flags);
        p.set_window_len(self.window_len);
        p.set_checksum(0);
        p.set_urgent_at(self.urgent_at);
        let opts = &mut p.buffer.as_mut()[HEADER_LEN..hl];
        opts.fill(option_kind::NOP);
        let mut i = 0;
        if let Some(mss) = self.max_seg_size {
            opts[i..i + 2].copy_from_slice(&[option_kind::MSS, 4]);
            opts[i + 2..i + 4].copy_from_slice(&mss.to_be_bytes());
            i += 4;
        }
        if let Some(ws) = self.window_scale {
            opts[i..i + 3].copy_from_slice(&[option_kind::WINDOW_SCALE, 3, ws]);
            i += 3;
        }
        if self.sack_permitted {
            opts[i..i + 2].copy_from_slice(&[option_kind::SACK_PERMITTED, 2]);
            i += 2;
        }
        if let Some((tsval, tsecr)) = self.timestamps {
            opts[i..i + 2].copy_from_slice(&[option_kind::TIMESTAMPS, 10]);
            opts[i + 2..i + 6].copy_from_slice(&tsval.to_be_bytes());
            opts[i + 6..i + 10].copy_from_slice(&tsecr.to_be_bytes());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The TCP part of the captured SYN in ipv4::tests (http.cap, packet 1).
    const SRC: [u8; 4] = [145, 254, 160, 237];
    const DST: [u8; 4] = [65, 208, 228, 223];
    const SYN: [u8; 28] = [
        0x0d, 0x2c, 0x00, 0x50, 0x38, 0xaf, 0xfe, 0x13, 0x00, 0x00, 0x00, 0x00, 0x70, 0x02, 0x22, 0x38, 0xc3, 0x0c,
        0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x01, 0x01, 0x04, 0x02,
    ];

    #[test]
    fn captured_syn() {
        let p = TcpPacket::new_checked(&SYN[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (3372, 80));
        assert_eq!(p.seq_number(), 0x38affe13);
        assert_eq!(p.header_len(), 28);
        assert_eq!(p.flags(), TcpFlags::SYN);
        assert_eq!(p.window_len(), 8760);
        assert!(p.verify_checksum(SRC, DST));
        let opts: Vec<_> = p.option_iter().collect::<Result<_>>().unwrap();
        assert_eq!(
            opts,
            vec![
                TcpOption::MaxSegmentSize(1460),
                TcpOption::NoOperation,
                TcpOption::NoOperation,
                TcpOption::SackPermitted
            ]
        );
        let r = TcpRepr::parse(&p).unwrap();
        assert_eq!(r.max_seg_size, Some(1460));
        assert!(r.sack_permitted);
        let mut out = [0u8; 28];
        r.emit(&mut TcpPacket::new_unchecked(&mut out[..])).unwrap();
        let mut q = TcpPacket::new_unchecked(&mut out[..]);
        q.fill_checksum(SRC, DST);
        assert!(q.verify_checksum(SRC, DST));
        assert!(TcpPacket::new_checked(&out[..]).unwrap().verify_checksum(SRC, DST));
        assert_eq!(TcpRepr::parse(&TcpPacket::new_checked(&out[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn truncation_and_bad_offset() {
        for n in 0..28 {
            assert!(TcpPacket::new_checked(&SYN[..n]).is_err(), "len {n}");
        }
        let mut b = SYN;
        b[12] = 0x40;
        assert_eq!(TcpPacket::new_checked(&b[..]).unwrap_err(), WireError::BadHeaderLen);
        b[12] = 0xf0;
        assert_eq!(TcpPacket::new_checked(&b[..]).unwrap_err(), WireError::Truncated);
    }

    #[test]
    fn option_iterator_edge_cases() {
        let bad: [&[u8]; 7] = [
            &[2, 4, 5],       // MSS past the end
            &[2, 1],          // length below 2
            &[2, 5, 0, 0, 0], // MSS wrong length
            &[8, 9, 0, 0, 0, 0, 0, 0, 0],
            &[5, 6, 0, 0, 0, 0], // SACK not a multiple of 8
            &[3, 0],
            &[99],
        ];
        for b in bad {
            let v: Vec<_> = TcpOptions::new(b).collect();
            assert_eq!(v.last(), Some(&Err(WireError::BadOption)), "{b:?}");
        }
        let good = [1, 99, 3, 0xaa, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2, 0, 7, 7];
        let v: Vec<_> = TcpOptions::new(&good).collect::<Result<_>>().unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(v[1], TcpOption::Unknown { kind: 99, data: &[0xaa] });
        assert_eq!(v[2], TcpOption::Timestamps { tsval: 1, tsecr: 2 });
        assert_eq!(v[4], TcpOption::EndOfList);
        assert_eq!(TcpOptions::new(&[1u8; 40]).count(), 40);
    }

    #[test]
    fn incremental_rewrites_keep_checksum_valid() {
        let mut b = SYN;
        let mut p = TcpPacket::new_unchecked(&mut b[..]);
        p.set_dst_port_incremental(8080);
        p.set_src_port_incremental(40000);
        p.update_pseudo_addr_v4(DST, [10, 0, 0, 1]);
        assert!(p.verify_checksum(SRC, [10u8, 0, 0, 1]));
        let s6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let d6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        p.fill_checksum(s6, d6);
        assert!(p.verify_checksum(s6, d6));
        let n6 = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd, 0, 9];
        p.update_pseudo_addr_v6(d6, n6);
        assert!(p.verify_checksum(s6, n6));
        assert!(!p.verify_checksum(s6, d6));
    }

    #[test]
    fn flags_ops() {
        let f = TcpFlags::SYN | TcpFlags::ACK;
        assert!(f.contains(TcpFlags::SYN) && f.contains(TcpFlags::ACK) && !f.contains(TcpFlags::FIN));
        assert!(f.intersects(TcpFlags::ACK | TcpFlags::RST));
        assert_eq!((f & !TcpFlags::SYN), TcpFlags::ACK);
        assert!(TcpFlags::empty().is_empty());
    }
}

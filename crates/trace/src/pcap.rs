//! The classic pcap format (libpcap 2.4): byte layout of the 24-byte global header and the 16-byte record header.
//!
//! Owns the magics, the encoding and decoding of both headers and the per-record sanity limits; the streaming state
//! machines live in [`crate::reader`] and [`crate::writer`]. All decoding works on fixed-size arrays, so it cannot
//! index out of bounds whatever the input.

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::LinkType;

/// Global header length.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Per-record header length.
pub const RECORD_HEADER_LEN: usize = 16;
/// Magic of microsecond files, as written in the file's byte order.
pub const MAGIC_US: u32 = 0xa1b2_c3d4;
/// Magic of nanosecond files.
pub const MAGIC_NS: u32 = 0xa1b2_3c4d;
/// Largest captured length accepted in a record (libpcap's own limit is 256 KiB as well).
pub const MAX_CAPLEN: u32 = 256 * 1024;

/// Byte order of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endian {
    Little,
    Big,
}

impl Endian {
    #[inline]
    pub(crate) fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        }
    }

    #[inline]
    pub(crate) fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }

    #[inline]
    pub(crate) fn put_u16(self, v: u16) -> [u8; 2] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }

    #[inline]
    pub(crate) fn put_u32(self, v: u32) -> [u8; 4] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
}

/// Reads a `u32` at `at` from an array-backed slice known to be long enough; returns 0 otherwise (never panics).
#[inline]
pub(crate) fn read_u32(e: Endian, b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(s) => e.u32([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

/// Reads a `u16` at `at`; returns 0 when out of bounds (callers check lengths first).
#[inline]
pub(crate) fn read_u16(e: Endian, b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(s) => e.u16([s[0], s[1]]),
        None => 0,
    }
}

/// The decoded global header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GlobalHeader {
    pub endian: Endian,
    pub nanosecond: bool,
    pub snaplen: u32,
    pub link_type: LinkType,
}

/// Recognises the first four bytes of a pcap file: `(endian, nanosecond)`.
pub(crate) fn detect_magic(b: [u8; 4]) -> Option<(Endian, bool)> {
    match (u32::from_le_bytes(b), u32::from_be_bytes(b)) {
        (MAGIC_US, _) => Some((Endian::Little, false)),
        (MAGIC_NS, _) => Some((Endian::Little, true)),
        (_, MAGIC_US) => Some((Endian::Big, false)),
        (_, MAGIC_NS) => Some((Endian::Big, true)),
        _ => None,
    }
}

/// Decodes a global header whose magic [`detect_magic`] accepted.
pub(crate) fn parse_global_header(h: &[u8; GLOBAL_HEADER_LEN]) -> Result<GlobalHeader, TraceError> {
    let (endian, nanosecond) = detect_magic([h[0], h[1], h[2], h[3]])
        .ok_or(TraceErrorKind::BadMagic(u32::from_be_bytes([h[0], h[1], h[2], h[3]])))?;
    let major = read_u16(endian, h, 4);
    let minor = read_u16(endian, h, 6);
    if major != 2 {
        return Err(TraceErrorKind::UnsupportedPcapVersion { major, minor }.into());
    }
    let snaplen = read_u32(endian, h, 16);
    // The upper 16 bits carry FCS-length flags (pcap-savefile(5)); the link type is the low 16 bits.
    let dlt = read_u32(endian, h, 20) & 0xffff;
    let link_type = LinkType::from_dlt(dlt)?;
    Ok(GlobalHeader { endian, nanosecond, snaplen, link_type })
}

/// Encodes a global header.
pub(crate) fn encode_global_header(e: Endian, nanosecond: bool, snaplen: u32, dlt: u32) -> [u8; GLOBAL_HEADER_LEN] {
    let mut h = [0u8; GLOBAL_HEADER_LEN];
    h[0..4].copy_from_slice(&e.put_u32(if nanosecond { MAGIC_NS } else { MAGIC_US }));
    h[4..6].copy_from_slice(&e.put_u16(2));
    h[6..8].copy_from_slice(&e.put_u16(4));
    // thiszone (8..12) and sigfigs (12..16) stay 0 as every modern writer does.
    h[16..20].copy_from_slice(&e.put_u32(snaplen));
    h[20..24].copy_from_slice(&e.put_u32(dlt));
    h
}

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub ts_ns: u64,
    pub caplen: u32,
    pub orig_len: u32,
}

/// Decodes a record header. Cannot overflow: 2^32 s * 10^9 + 2^32 * 1000 < 2^64.
#[inline]
pub(crate) fn parse_record_header(e: Endian, nanosecond: bool, h: &[u8; RECORD_HEADER_LEN]) -> RecordHeader {
    let sec = u64::from(read_u32(e, h, 0));
    let frac = u64::from(read_u32(e, h, 4));
    let ts_ns = sec * 1_000_000_000 + if nanosecond { frac } else { frac * 1000 };
    RecordHeader { ts_ns, caplen: read_u32(e, h, 8), orig_len: read_u32(e, h, 12) }
}

/// Encodes a record header; `None` when the seconds do not fit 32 bits.
#[inline]
pub(crate) fn encode_record_header(
    e: Endian,
    nanosecond: bool,
    ts_ns: u64,
    caplen: u32,
    orig_len: u32,
) -> Option<[u8; RECORD_HEADER_LEN]> {
    let sec = u32::try_from(ts_ns / 1_000_000_000).ok()?;
    let sub = (ts_ns % 1_000_000_000) as u32;
    let frac = if nanosecond { sub } else { sub / 1000 };
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..4].copy_from_slice(&e.put_u32(sec));
    h[4..8].copy_from_slice(&e.put_u32(frac));
    h[8..12].copy_from_slice(&e.put_u32(caplen));
    h[12..16].copy_from_slice(&e.put_u32(orig_len));
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_all_four() {
        assert_eq!(detect_magic([0xd4, 0xc3, 0xb2, 0xa1]), Some((Endian::Little, false)));
        assert_eq!(detect_magic([0x4d, 0x3c, 0xb2, 0xa1]), Some((Endian::Little, true)));
        assert_eq!(detect_magic([0xa1, 0xb2, 0xc3, 0xd4]), Some((Endian::Big, false)));
        assert_eq!(detect_magic([0xa1, 0xb2, 0x3c, 0x4d]), Some((Endian::Big, true)));
        assert_eq!(detect_magic([0x0a, 0x0d, 0x0d, 0x0a]), None);
    }

    #[test]
    fn header_round_trip_and_fcs_bits_ignored() {
        for e in [Endian::Little, Endian::Big] {
            for ns in [false, true] {
                let mut h = encode_global_header(e, ns, 1500, 113);
                let g = parse_global_header(&h).unwrap();
                assert_eq!(g, GlobalHeader { endian: e, nanosecond: ns, snaplen: 1500, link_type: LinkType::LinuxSll });
                // FCS flag bits in the upper half of the link-type word.
                h[20..24].copy_from_slice(&e.put_u32(0x1400_0001));
                assert_eq!(parse_global_header(&h).unwrap().link_type, LinkType::Ethernet);
            }
        }
    }

    #[test]
    fn record_header_resolution() {
        let h = encode_record_header(Endian::Big, false, 1_700_000_000_123_456_789, 60, 60).unwrap();
        assert_eq!(parse_record_header(Endian::Big, false, &h).ts_ns, 1_700_000_000_123_456_000);
        let h = encode_record_header(Endian::Little, true, 1_700_000_000_123_456_789, 60, 61).unwrap();
        let r = parse_record_header(Endian::Little, true, &h);
        assert_eq!(r, RecordHeader { ts_ns: 1_700_000_000_123_456_789, caplen: 60, orig_len: 61 });
        assert!(encode_record_header(Endian::Little, true, u64::MAX, 1, 1).is_none());
    }
}

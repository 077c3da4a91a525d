//! The pcapng format (draft-ietf-opsawg-pcapng): block layout, sections, interfaces and timestamp resolution.
//!
//! Owns the decoding of a complete block already in memory: Section Header Blocks (either byte order), Interface
//! Description Blocks (link type, `if_tsresol` as a power of 10 or of 2, `if_tsoffset`), Enhanced, Simple and
//! obsolete Packet Blocks. Framing (reading blocks, validating the total length and skipping unknown blocks) is done
//! by [`crate::reader`]. Every field access is bounds-checked against the block, so hostile files produce errors.
//! A block whose framing was sound but whose contents are bad is skipped and counted (`Unparsed`); an interface
//! whose description is bad is remembered as such, so the numbering of later interfaces stays right.

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::LinkType;
use crate::pcap::{read_u16, read_u32, Endian, MAX_CAPLEN};
use crate::reader::{unreadable, Fault};
use crate::unparsed::Unparsed;

/// Section Header Block type; a palindrome, so it reads the same in both byte orders.
pub const BT_SHB: u32 = 0x0a0d_0d0a;
/// Interface Description Block type.
pub const BT_IDB: u32 = 1;
/// Obsolete Packet Block type.
pub const BT_OPB: u32 = 2;
/// Simple Packet Block type.
pub const BT_SPB: u32 = 3;
/// Enhanced Packet Block type.
pub const BT_EPB: u32 = 6;
/// Byte-order magic of the Section Header Block.
pub const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
/// Smallest block: type, total length, trailing total length.
pub const MIN_BLOCK_LEN: u32 = 12;
/// Largest block the reader decodes in memory (packet blocks carry at most 256 KiB of data plus options); larger
/// unknown blocks are skipped by streaming, larger known ones are corrupt.
pub const MAX_DECODED_BLOCK: u32 = 512 * 1024;
/// Interfaces accepted per section, to keep memory bounded on hostile files.
pub const MAX_INTERFACES: usize = 4096;

const OPT_ENDOFOPT: u16 = 0;
const IF_TSRESOL: u16 = 9;
const IF_TSOFFSET: u16 = 14;

/// True for the block types the reader decodes (everything else is skipped by length).
pub(crate) fn is_decoded(block_type: u32) -> bool {
    matches!(block_type, BT_SHB | BT_IDB | BT_OPB | BT_SPB | BT_EPB)
}

/// Conversion of an interface's timestamp units to nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TsUnit {
    /// Units of 10^-v s with v <= 9: multiply.
    Mul(u64),
    /// Units of 10^-v s with 9 < v <= 28: divide.
    Div(u128),
    /// Units of 2^-v s.
    Pow2(u8),
}

impl TsUnit {
    fn from_tsresol(r: u8) -> Self {
        let v = r & 0x7f;
        if r & 0x80 != 0 {
            TsUnit::Pow2(v)
        } else if v <= 9 {
            TsUnit::Mul(10u64.pow(9 - u32::from(v)))
        } else {
            // 10^(v-9) for v up to 127 overflows even u128 past v = 47; anything past 10^38 makes every u64 zero,
            // as does the cap.
            TsUnit::Div(10u128.pow(u32::from(v - 9).min(38)))
        }
    }

    #[inline]
    fn to_ns(self, ts: u64) -> u64 {
        match self {
            TsUnit::Mul(m) => ts.saturating_mul(m),
            TsUnit::Div(d) => (u128::from(ts) / d) as u64,
            TsUnit::Pow2(v) => {
                let ns = (u128::from(ts) * 1_000_000_000) >> v.min(127);
                u64::try_from(ns).unwrap_or(u64::MAX)
            }
        }
    }
}

/// Why an interface's packets cannot be read.
#[derive(Clone, Copy, Debug)]
enum BadInterface {
    /// Its DLT, to name in the error when a packet uses the interface.
    Unsupported(u32),
    /// Its description block was corrupt: its packets are counted as corrupt records.
    Corrupt,
}

/// One Interface Description Block's worth of state.
#[derive(Clone, Copy, Debug)]
struct Interface {
    link: Result<LinkType, BadInterface>,
    snaplen: u32,
    unit: TsUnit,
    offset_s: i64,
}

/// A packet found in a block: where its bytes are (relative to the block start) and its metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PacketInfo {
    pub data_off: usize,
    pub caplen: usize,
    pub ts_ns: u64,
    pub orig_len: u32,
    pub link_type: LinkType,
    /// The captured length exceeds the interface's snapshot length (read all the same, as Wireshark does).
    pub over_snaplen: bool,
}

/// State of the current section: its byte order and the interfaces defined so far.
#[derive(Debug)]
pub(crate) struct Section {
    pub endian: Endian,
    interfaces: Vec<Interface>,
}

impl Section {
    pub(crate) fn new() -> Self {
        Section { endian: Endian::Little, interfaces: Vec::new() }
    }

    /// Byte order of a block starting with `BT_SHB`, from its byte-order magic (bytes 8..12).
    pub(crate) fn shb_endian(magic: [u8; 4], offset: u64) -> Result<Endian, TraceError> {
        if u32::from_le_bytes(magic) == BYTE_ORDER_MAGIC {
            Ok(Endian::Little)
        } else if u32::from_be_bytes(magic) == BYTE_ORDER_MAGIC {
            Ok(Endian::Big)
        } else {
            Err(TraceError::corrupt_block(offset, "bad byte-order magic in section header"))
        }
    }

    /// Decodes one complete, length-validated block of a decoded type (see [`is_decoded`]). `block` spans the whole
    /// block including both length fields; `offset` is its position in the file for error messages. A bad section
    /// header stops reading (what follows cannot be interpreted); any other bad block is skipped.
    pub(crate) fn decode(&mut self, block: &[u8], offset: u64) -> Result<Option<PacketInfo>, Fault> {
        let e = self.endian;
        let block_type = read_u32(e, block, 0);
        // Options and packet data end where the trailing length starts.
        let body_end = block.len().saturating_sub(4);
        let skip = |why| Err(Fault::Skip(why));
        match block_type {
            BT_SHB => {
                let stop = |err: TraceError| Err(unreadable(err));
                if block.len() < 28 {
                    return stop(TraceError::corrupt_block(offset, "block too short for its type"));
                }
                let endian = match Self::shb_endian([block[8], block[9], block[10], block[11]], offset) {
                    Ok(endian) => endian,
                    Err(err) => return stop(err),
                };
                let major = read_u16(endian, block, 12);
                let minor = read_u16(endian, block, 14);
                if major != 1 {
                    return stop(TraceErrorKind::UnsupportedPcapngVersion { major, minor }.into());
                }
                // A new section starts afresh: interfaces are numbered per section.
                self.endian = endian;
                self.interfaces.clear();
                // The section's options carry nothing the reader needs: bad ones cost only the block itself.
                if for_each_option(endian, &block[24..body_end], offset, |_, _| Ok(())).is_err() {
                    return skip(Unparsed::CorruptRecord);
                }
                Ok(None)
            }
            BT_IDB => {
                if self.interfaces.len() >= MAX_INTERFACES {
                    // Packets on interfaces past the limit then count as undefined ones.
                    return skip(Unparsed::CorruptRecord);
                }
                let corrupt =
                    Interface { link: Err(BadInterface::Corrupt), snaplen: 0, unit: TsUnit::Mul(1), offset_s: 0 };
                if block.len() < 20 {
                    self.interfaces.push(corrupt);
                    return skip(Unparsed::CorruptRecord);
                }
                let dlt = u32::from(read_u16(e, block, 8));
                let snaplen = read_u32(e, block, 12);
                let mut unit = TsUnit::Mul(1000); // default: microseconds
                let mut offset_s = 0i64;
                let opts = for_each_option(e, &block[16..body_end], offset, |code, value| {
                    match code {
                        IF_TSRESOL => match value.first() {
                            Some(&r) => unit = TsUnit::from_tsresol(r),
                            None => return Err(TraceError::corrupt_block(offset, "empty if_tsresol option")),
                        },
                        IF_TSOFFSET => match value.get(..8) {
                            Some(v) => {
                                let b = [v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]];
                                offset_s = match e {
                                    Endian::Little => i64::from_le_bytes(b),
                                    Endian::Big => i64::from_be_bytes(b),
                                };
                            }
                            None => return Err(TraceError::corrupt_block(offset, "short if_tsoffset option")),
                        },
                        _ => {}
                    }
                    Ok(())
                });
                if opts.is_err() {
                    // Its timestamps cannot be trusted: its packets are counted, not read.
                    self.interfaces.push(corrupt);
                    return skip(Unparsed::CorruptRecord);
                }
                let link = LinkType::from_dlt(dlt).map_err(|_| BadInterface::Unsupported(dlt));
                self.interfaces.push(Interface { link, snaplen, unit, offset_s });
                Ok(None)
            }
            BT_EPB | BT_OPB => {
                if block.len() < 32 {
                    return skip(Unparsed::CorruptRecord);
                }
                let interface =
                    if block_type == BT_EPB { read_u32(e, block, 8) } else { u32::from(read_u16(e, block, 8)) };
                let ts = (u64::from(read_u32(e, block, 12)) << 32) | u64::from(read_u32(e, block, 16));
                let caplen = read_u32(e, block, 20);
                let orig_len = read_u32(e, block, 24);
                if caplen > MAX_CAPLEN {
                    return skip(Unparsed::CorruptRecord);
                }
                let caplen = caplen as usize;
                if 28 + caplen.next_multiple_of(4) > body_end {
                    return skip(Unparsed::CorruptRecord);
                }
                let ifc = self.interface(interface)?;
                let link_type = ifc.link_type()?;
                let ts_ns = apply_offset(ifc.unit.to_ns(ts), ifc.offset_s);
                let over_snaplen = ifc.snaplen != 0 && caplen > ifc.snaplen as usize;
                Ok(Some(PacketInfo { data_off: 28, caplen, ts_ns, orig_len, link_type, over_snaplen }))
            }
            BT_SPB => {
                if block.len() < 16 {
                    return skip(Unparsed::CorruptRecord);
                }
                let orig_len = read_u32(e, block, 8);
                let ifc = self.interface(0)?;
                let link_type = ifc.link_type()?;
                // The captured length is implicit: the packet, cut at the snaplen, padded to the block end.
                let room = body_end - 12;
                let mut caplen = (orig_len as usize).min(room).min(MAX_CAPLEN as usize);
                if ifc.snaplen != 0 {
                    caplen = caplen.min(ifc.snaplen as usize);
                }
                Ok(Some(PacketInfo { data_off: 12, caplen, ts_ns: 0, orig_len, link_type, over_snaplen: false }))
            }
            _ => Ok(None),
        }
    }

    fn interface(&self, id: u32) -> Result<Interface, Fault> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.interfaces.get(i))
            .copied()
            .ok_or(Fault::Skip(Unparsed::UnknownInterface))
    }
}

impl Interface {
    /// The link type of the interface's packets: unsupported ones are an error for the caller (the clear
    /// "unsupported link type" message), corrupt ones a skipped record.
    fn link_type(&self) -> Result<LinkType, Fault> {
        match self.link {
            Ok(l) => Ok(l),
            Err(BadInterface::Unsupported(dlt)) => {
                Err(TraceError::from(TraceErrorKind::UnsupportedLinkType(dlt)).into())
            }
            Err(BadInterface::Corrupt) => Err(Fault::Skip(Unparsed::CorruptRecord)),
        }
    }
}

fn apply_offset(ns: u64, offset_s: i64) -> u64 {
    if offset_s == 0 {
        return ns;
    }
    let t = i128::from(ns) + i128::from(offset_s) * 1_000_000_000;
    t.clamp(0, i128::from(u64::MAX)) as u64
}

/// Walks the options of a block body, calling `f(code, value)` for each until `opt_endofopt` or the end.
fn for_each_option(
    e: Endian,
    mut opts: &[u8],
    offset: u64,
    mut f: impl FnMut(u16, &[u8]) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    while !opts.is_empty() {
        if opts.len() < 4 {
            return Err(TraceError::corrupt_block(offset, "option header overruns block"));
        }
        let code = read_u16(e, opts, 0);
        let len = usize::from(read_u16(e, opts, 2));
        if code == OPT_ENDOFOPT {
            return Ok(());
        }
        let padded = len.next_multiple_of(4);
        let Some(value) = opts.get(4..4 + len) else {
            return Err(TraceError::corrupt_block(offset, "option value overruns block"));
        };
        f(code, value)?;
        opts = opts.get(4 + padded..).unwrap_or(&[]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsresol_units() {
        assert_eq!(TsUnit::from_tsresol(6).to_ns(1_500_000), 1_500_000_000);
        assert_eq!(TsUnit::from_tsresol(9).to_ns(7), 7);
        assert_eq!(TsUnit::from_tsresol(0).to_ns(2), 2_000_000_000);
        assert_eq!(TsUnit::from_tsresol(12).to_ns(5_000), 5);
        assert_eq!(TsUnit::from_tsresol(127).to_ns(u64::MAX), 0);
        // 2^-10 s units: 1024 units are one second.
        assert_eq!(TsUnit::from_tsresol(0x80 | 10).to_ns(1024), 1_000_000_000);
        assert_eq!(TsUnit::from_tsresol(0x80 | 127).to_ns(u64::MAX), 0);
        assert_eq!(TsUnit::from_tsresol(0x80).to_ns(u64::MAX), u64::MAX);
        assert_eq!(TsUnit::from_tsresol(0).to_ns(u64::MAX), u64::MAX);
    }

    #[test]
    fn offset_clamps() {
        assert_eq!(apply_offset(5, -1), 0);
        assert_eq!(apply_offset(5, 1), 1_000_000_005);
        assert_eq!(apply_offset(u64::MAX, i64::MAX), u64::MAX);
    }

    #[test]
    fn options_walk_rejects_overrun() {
        let e = Endian::Little;
        let mut seen = Vec::new();
        let opts = [9, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0];
        for_each_option(e, &opts, 0, |c, v| {
            seen.push((c, v.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(9, vec![6])]);
        assert!(for_each_option(e, &[9, 0, 8, 0, 1], 0, |_, _| Ok(())).is_err());
        assert!(for_each_option(e, &[9, 0], 0, |_, _| Ok(())).is_err());
    }
}

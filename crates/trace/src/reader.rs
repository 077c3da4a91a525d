//! Streaming trace reader: pcap (all four magics) and pcapng, auto-detected.
//!
//! Owns [`TraceReader`], [`PacketRef`], [`TraceFormat`] and [`fuzz_read_all`]. The reader keeps one internal buffer
//! that it refills with large reads and hands out packets as slices of it, so reading needs no per-packet allocation
//! and constant memory whatever the file size (the buffer grows at most to the largest record or decoded block,
//! bounded by the format limits; larger unknown pcapng blocks are skipped by streaming). Every malformed input ends in
//! a one-line [`TraceError`]; a file that ends exactly at a record boundary ends cleanly.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::{to_ethernet, LinkType};
use crate::pcap::{self, Endian, GLOBAL_HEADER_LEN, RECORD_HEADER_LEN};
use crate::pcapng::{self, Section, BT_SHB, MAX_DECODED_BLOCK, MIN_BLOCK_LEN};

/// The container format of a trace, as detected from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// Classic pcap; `nanosecond` for the 0xa1b23c4d magic.
    Pcap { nanosecond: bool, big_endian: bool },
    /// pcapng (byte order may change per section).
    PcapNg,
}

impl std::fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceFormat::Pcap { nanosecond, big_endian } => write!(
                f,
                "pcap ({}, {})",
                if *nanosecond { "nanosecond" } else { "microsecond" },
                if *big_endian { "big-endian" } else { "little-endian" }
            ),
            TraceFormat::PcapNg => f.write_str("pcapng"),
        }
    }
}

/// One packet as read from a trace, borrowing the reader's buffer until the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketRef<'a> {
    /// Timestamp in nanoseconds since the Unix epoch (0 for pcapng Simple Packet Blocks, which carry none).
    pub ts_ns: u64,
    /// Length of the packet on the wire (may exceed `data.len()` when the capture was truncated).
    pub orig_len: u32,
    /// Link-layer type of `data`.
    pub link_type: LinkType,
    /// Captured bytes.
    pub data: &'a [u8],
}

/// Initial buffer size: large enough that refills are rare system calls.
const INITIAL_BUF: usize = 128 * 1024;

enum State {
    Pcap { endian: Endian, nanosecond: bool, link_type: LinkType, caplen_limit: u32, snaplen: u32 },
    PcapNg(Section),
}

/// Where the next packet lies in the buffer, once its record has been consumed.
struct Found {
    start: usize,
    len: usize,
    ts_ns: u64,
    orig_len: u32,
    link_type: LinkType,
}

/// Outcome of reading one pcapng block.
enum Step {
    End,
    Packet(Found),
    Other,
}

/// A streaming reader of pcap and pcapng traces. See the module documentation.
pub struct TraceReader<R: Read> {
    inner: R,
    /// Always fully initialised; valid data is `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[start]`.
    offset: u64,
    /// The inner reader returned 0.
    eof: bool,
    /// After the end or an error every call returns `Ok(None)`, so loops always terminate.
    done: bool,
    state: State,
    format: TraceFormat,
    packets: u64,
    path: Option<Box<str>>,
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file; errors name the file.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|e| TraceError::new(TraceErrorKind::Open(e)).with_path(path))?;
        let mut r = Self::new(BufReader::new(file)).map_err(|e| e.with_path(path))?;
        r.path = Some(path.display().to_string().into_boxed_str());
        Ok(r)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads the file header (pcap global header or first pcapng section header) and detects the format.
    pub fn new(inner: R) -> Result<Self, TraceError> {
        let mut r = TraceReader {
            inner,
            buf: vec![0; INITIAL_BUF],
            start: 0,
            end: 0,
            offset: 0,
            eof: false,
            done: false,
            state: State::PcapNg(Section::new()),
            format: TraceFormat::PcapNg,
            packets: 0,
            path: None,
        };
        if !r.ensure(4)? {
            return Err(match r.available() {
                0 => TraceErrorKind::Empty.into(),
                _ => TraceErrorKind::TruncatedHeader { offset: 0 }.into(),
            });
        }
        let magic = [r.buf[r.start], r.buf[r.start + 1], r.buf[r.start + 2], r.buf[r.start + 3]];
        if pcap::detect_magic(magic).is_some() {
            if !r.ensure(GLOBAL_HEADER_LEN)? {
                return Err(TraceErrorKind::TruncatedHeader { offset: 0 }.into());
            }
            let mut h = [0u8; GLOBAL_HEADER_LEN];
            h.copy_from_slice(&r.buf[r.start..r.start + GLOBAL_HEADER_LEN]);
            let g = pcap::parse_global_header(&h)?;
            r.consume(GLOBAL_HEADER_LEN);
            r.format = TraceFormat::Pcap { nanosecond: g.nanosecond, big_endian: g.endian == Endian::Big };
            r.state = State::Pcap {
                endian: g.endian,
                nanosecond: g.nanosecond,
                link_type: g.link_type,
                caplen_limit: pcap::caplen_limit(g.snaplen),
                snaplen: g.snaplen,
            };
        } else if u32::from_le_bytes(magic) == BT_SHB {
            // Decode the first section header now so a broken one fails at open time.
            if !r.ensure(MIN_BLOCK_LEN as usize)? {
                return Err(TraceErrorKind::TruncatedHeader { offset: 0 }.into());
            }
            // The first block is a section header: it carries no packet.
            r.pcapng_block()?;
        } else {
            return Err(TraceErrorKind::BadMagic(u32::from_be_bytes(magic)).into());
        }
        Ok(r)
    }

    /// The detected container format.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The file-wide link type of a pcap file; `None` for pcapng, where each interface has its own.
    pub fn link_type(&self) -> Option<LinkType> {
        match &self.state {
            State::Pcap { link_type, .. } => Some(*link_type),
            State::PcapNg(_) => None,
        }
    }

    /// The snapshot length of a pcap file; `None` for pcapng.
    pub fn snaplen(&self) -> Option<u32> {
        match &self.state {
            State::Pcap { snaplen, .. } => Some(*snaplen),
            State::PcapNg(_) => None,
        }
    }

    /// Packets returned so far.
    pub fn packets_read(&self) -> u64 {
        self.packets
    }

    /// Current size of the internal buffer in bytes (it only grows for records larger than it; diagnostics).
    pub fn buffer_len(&self) -> usize {
        self.buf.len()
    }

    /// File offset just past the last record returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next packet, `Ok(None)` at a clean end of file. The packet borrows the reader's buffer. After an error
    /// or the end, every further call returns `Ok(None)`.
    pub fn next_packet(&mut self) -> Result<Option<PacketRef<'_>>, TraceError> {
        if self.done {
            return Ok(None);
        }
        let found = match self.state {
            State::Pcap { .. } => self.next_pcap(),
            State::PcapNg(_) => self.next_pcapng(),
        };
        match found {
            Ok(Some(f)) => {
                self.packets += 1;
                // `Found` ranges were checked against the buffer when the record was validated; `get` keeps the
                // no-panic promise even so.
                let data = self.buf.get(f.start..f.start + f.len).unwrap_or(&[]);
                Ok(Some(PacketRef { ts_ns: f.ts_ns, orig_len: f.orig_len, link_type: f.link_type, data }))
            }
            Ok(None) => {
                self.done = true;
                Ok(None)
            }
            Err(e) => {
                self.done = true;
                Err(e.with_path_str(self.path.as_deref()))
            }
        }
    }

    fn next_pcap(&mut self) -> Result<Option<Found>, TraceError> {
        let State::Pcap { endian, nanosecond, link_type, caplen_limit, .. } = self.state else {
            return Ok(None);
        };
        let rec_off = self.offset;
        if !self.ensure(RECORD_HEADER_LEN)? {
            self.end_or_truncated(rec_off)?;
            return Ok(None);
        }
        let mut h = [0u8; RECORD_HEADER_LEN];
        h.copy_from_slice(&self.buf[self.start..self.start + RECORD_HEADER_LEN]);
        let rec = pcap::parse_record_header(endian, nanosecond, &h);
        if rec.caplen > caplen_limit {
            return Err(
                TraceErrorKind::CorruptRecord { offset: rec_off, caplen: rec.caplen, limit: caplen_limit }.into()
            );
        }
        let total = RECORD_HEADER_LEN + rec.caplen as usize;
        if !self.ensure(total)? {
            return Err(TraceErrorKind::TruncatedRecord { offset: rec_off }.into());
        }
        let start = self.start + RECORD_HEADER_LEN;
        self.consume(total);
        Ok(Some(Found { start, len: rec.caplen as usize, ts_ns: rec.ts_ns, orig_len: rec.orig_len, link_type }))
    }

    /// Reads pcapng blocks until one carries a packet.
    fn next_pcapng(&mut self) -> Result<Option<Found>, TraceError> {
        loop {
            match self.pcapng_block()? {
                Step::End => return Ok(None),
                Step::Packet(f) => return Ok(Some(f)),
                Step::Other => {}
            }
        }
    }

    /// Reads one pcapng block.
    fn pcapng_block(&mut self) -> Result<Step, TraceError> {
        let blk_off = self.offset;
        if !self.ensure(8)? {
            self.end_or_truncated(blk_off)?;
            return Ok(Step::End);
        }
        let s = self.start;
        let type_bytes = [self.buf[s], self.buf[s + 1], self.buf[s + 2], self.buf[s + 3]];
        let len_bytes = [self.buf[s + 4], self.buf[s + 5], self.buf[s + 6], self.buf[s + 7]];
        let endian = if u32::from_le_bytes(type_bytes) == BT_SHB {
            // A section header announces its own byte order, which also governs its length field.
            if !self.ensure(12)? {
                return Err(TraceErrorKind::TruncatedRecord { offset: blk_off }.into());
            }
            let s = self.start;
            Section::shb_endian([self.buf[s + 8], self.buf[s + 9], self.buf[s + 10], self.buf[s + 11]], blk_off)?
        } else {
            match &self.state {
                State::PcapNg(section) => section.endian,
                State::Pcap { .. } => return Ok(Step::End),
            }
        };
        let block_type = endian.u32(type_bytes);
        let total = endian.u32(len_bytes);
        if total < MIN_BLOCK_LEN || total % 4 != 0 {
            return Err(TraceError::corrupt_block(blk_off, "block length not a multiple of 4 of at least 12"));
        }
        if !pcapng::is_decoded(block_type) {
            self.skip_block(blk_off, total, endian)?;
            return Ok(Step::Other);
        }
        if total > MAX_DECODED_BLOCK {
            return Err(TraceError::corrupt_block(blk_off, "block larger than 512 KiB"));
        }
        let total = total as usize;
        if !self.ensure(total)? {
            return Err(TraceErrorKind::TruncatedRecord { offset: blk_off }.into());
        }
        let start = self.start;
        let block = &self.buf[start..start + total];
        if pcap::read_u32(endian, block, total - 4) != total as u32 {
            return Err(TraceError::corrupt_block(blk_off, "trailing block length differs from leading one"));
        }
        let State::PcapNg(section) = &mut self.state else {
            return Ok(Step::End);
        };
        let info = section.decode(block, blk_off)?;
        self.consume(total);
        Ok(match info {
            Some(p) => Step::Packet(Found {
                start: start + p.data_off,
                len: p.caplen,
                ts_ns: p.ts_ns,
                orig_len: p.orig_len,
                link_type: p.link_type,
            }),
            None => Step::Other,
        })
    }

    /// Skips a block that is not decoded, without holding it in memory, and checks its trailing length.
    fn skip_block(&mut self, blk_off: u64, total: u32, endian: Endian) -> Result<(), TraceError> {
        let truncated = || TraceError::from(TraceErrorKind::TruncatedRecord { offset: blk_off });
        let mut left = u64::from(total) - 4;
        while left > 0 {
            if !self.ensure(1)? {
                return Err(truncated());
            }
            let k = self.available().min(usize::try_from(left).unwrap_or(usize::MAX));
            self.consume(k);
            left -= k as u64;
        }
        if !self.ensure(4)? {
            return Err(truncated());
        }
        let trailer = pcap::read_u32(endian, &self.buf[self.start..self.start + 4], 0);
        if trailer != total {
            return Err(TraceError::corrupt_block(blk_off, "trailing block length differs from leading one"));
        }
        self.consume(4);
        Ok(())
    }

    /// A clean end when no byte of the next record exists, otherwise a truncation error.
    fn end_or_truncated(&self, offset: u64) -> Result<(), TraceError> {
        if self.available() == 0 {
            Ok(())
        } else {
            Err(TraceErrorKind::TruncatedRecord { offset }.into())
        }
    }

    #[inline]
    fn available(&self) -> usize {
        self.end - self.start
    }

    #[inline]
    fn consume(&mut self, n: usize) {
        let n = n.min(self.available());
        self.start += n;
        self.offset += n as u64;
    }

    /// Makes at least `n` bytes available in `buf[start..]`; `Ok(false)` when the input ends first.
    #[inline]
    fn ensure(&mut self, n: usize) -> Result<bool, TraceError> {
        if self.available() >= n {
            return Ok(true);
        }
        self.refill(n)
    }

    /// The slow path of [`Self::ensure`]: compact and read, once per buffer's worth of records.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, n: usize) -> Result<bool, TraceError> {
        if self.eof {
            return Ok(false);
        }
        // Move the partial record to the front: at most one record is copied per refill.
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < n {
            self.buf.resize(n.next_power_of_two(), 0);
        }
        while self.available() < n {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                // A misbehaving reader could claim more than it was given; never trust it past the buffer.
                Ok(k) => self.end = (self.end + k).min(self.buf.len()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(TraceError::io(self.offset + self.available() as u64, e)),
            }
        }
        Ok(true)
    }
}

/// Reads every packet of an in-memory trace (and converts each to Ethernet), ignoring errors: the body of a fuzz
/// target. Must never panic or loop forever, whatever `data` is.
pub fn fuzz_read_all(data: &[u8]) {
    let Ok(mut reader) = TraceReader::new(data) else {
        return;
    };
    let mut scratch = Vec::new();
    while let Ok(Some(pkt)) = reader.next_packet() {
        let _ = to_ethernet(&pkt, &mut scratch).map(<[u8]>::len);
    }
}

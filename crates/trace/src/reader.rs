//! Streaming trace reader: pcap (all four magics) and pcapng, auto-detected.
//!
//! Owns [`TraceReader`], [`PacketRef`], [`TraceFormat`] and [`fuzz_read_all`]. The reader keeps one internal buffer
//! that it refills with large reads and hands out packets as slices of it, so reading needs no per-packet allocation
//! and constant memory whatever the file size (the buffer grows at most to the largest record or decoded block,
//! bounded by the format limits; larger unknown pcapng blocks are skipped by streaming).
//!
//! Hostile input: a file that is not a capture at all (bad magic, unsupported version or link type, broken first
//! header) fails at open with a one-line [`TraceError`]. After that, a bad record never ends the reading when the next
//! record can still be located: it is counted ([`TraceReader::unparsed`]) and skipped. When the next record cannot be
//! located (the file ends inside a record, or a record length is beyond any sane value) the reader counts that, keeps
//! the reason ([`TraceReader::stopped_early`]) and ends as at a clean end of file. A pcapng block whose framing is
//! corrupt (a length that is no multiple of 4, a trailing length that differs) is skipped and counted when a sound
//! block follows within 1 MiB (a decoded block type, a valid length repeated at its end), as tshark steps over it. `next_packet` only fails for I/O
//! errors and for packets of an unsupported link type (pcapng interfaces).

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::{self, to_ethernet, LinkType};
use crate::pcap::{self, Endian, GLOBAL_HEADER_LEN, MAX_CAPLEN, RECORD_HEADER_LEN};
use crate::pcapng::{self, Section, BT_SHB, MAX_DECODED_BLOCK, MIN_BLOCK_LEN};
use crate::unparsed::{Unparsed, UnparsedCounts};

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

/// How far past a pcapng block with corrupt framing the reader looks for the next sound block.
const RESYNC_WINDOW: usize = 2 * MAX_DECODED_BLOCK as usize;

enum State {
    Pcap { endian: Endian, nanosecond: bool, link_type: LinkType, snaplen: u32 },
    PcapNg(Section),
}

/// A problem with one record, by what the reader can do next. Errors are boxed (built on the failure path only) so
/// that the per-record result stays small.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The record was consumed and the next one can be read: count it and go on.
    Skip(Unparsed),
    /// The next record cannot be located: count, remember the error and end.
    Stop(Unparsed, Box<TraceError>),
    /// Not about one record (I/O, a packet of an unsupported link type): the caller's error.
    Fatal(Box<TraceError>),
}

impl From<TraceError> for Fault {
    #[cold]
    fn from(e: TraceError) -> Self {
        Fault::Fatal(Box::new(e))
    }
}

/// A stop at a record that the file ends inside.
#[cold]
fn truncated(offset: u64) -> Fault {
    unreadable_as(Unparsed::TruncatedRecord, TraceErrorKind::TruncatedRecord { offset }.into())
}

/// A stop at a record whose length cannot be trusted.
#[cold]
pub(crate) fn unreadable(err: TraceError) -> Fault {
    unreadable_as(Unparsed::UnreadableRest, err)
}

#[cold]
fn unreadable_as(why: Unparsed, err: TraceError) -> Fault {
    Fault::Stop(why, Box::new(err))
}

/// Where the current packet lies in the buffer, once its record has been consumed. Kept in the reader rather than
/// returned through the layers of results, which costs a store-forwarding stall per packet.
#[derive(Clone, Copy)]
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
    /// A packet, now in `TraceReader::found`.
    Packet,
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
    /// The packet the last successful read found.
    found: Found,
    unparsed: UnparsedCounts,
    over_snaplen: u64,
    stopped: Option<TraceError>,
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
            found: Found { start: 0, len: 0, ts_ns: 0, orig_len: 0, link_type: LinkType::Ethernet },
            unparsed: UnparsedCounts::default(),
            over_snaplen: 0,
            stopped: None,
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
            r.state =
                State::Pcap { endian: g.endian, nanosecond: g.nanosecond, link_type: g.link_type, snaplen: g.snaplen };
        } else if u32::from_le_bytes(magic) == BT_SHB {
            // Decode the first section header now so a broken one fails at open time.
            if !r.ensure(MIN_BLOCK_LEN as usize)? {
                return Err(TraceErrorKind::TruncatedHeader { offset: 0 }.into());
            }
            // The first block is a section header: it carries no packet. If it is broken the file is no capture.
            match r.pcapng_block() {
                Ok(_) => {}
                Err(Fault::Skip(why)) => r.unparsed.add(why),
                Err(Fault::Stop(_, e) | Fault::Fatal(e)) => return Err(*e),
            }
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

    /// Packets returned so far (by [`Self::next_packet`], or read by [`Self::next_frame`] whether or not they had an
    /// Ethernet form).
    pub fn packets_read(&self) -> u64 {
        self.packets
    }

    /// Records skipped so far, by reason; [`Self::next_frame`] adds the packets it could not present as Ethernet.
    pub fn unparsed(&self) -> &UnparsedCounts {
        &self.unparsed
    }

    /// Records whose captured length exceeds the snapshot length of their file or interface. They are read in full,
    /// as Wireshark does (some capture tools write a snaplen smaller than what they capture).
    pub fn over_snaplen(&self) -> u64 {
        self.over_snaplen
    }

    /// Why reading ended before the end of the file, when it did (a truncated or corrupt record; counted in
    /// [`Self::unparsed`] as well). The message names the file and the byte offset.
    pub fn stopped_early(&self) -> Option<&TraceError> {
        self.stopped.as_ref()
    }

    /// Current size of the internal buffer in bytes (it only grows for records larger than it; diagnostics).
    pub fn buffer_len(&self) -> usize {
        self.buf.len()
    }

    /// File offset just past the last record returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next packet, `Ok(None)` at the end of the file or of what could be read (see [`Self::stopped_early`]).
    /// The packet borrows the reader's buffer. After an error or the end, every further call returns `Ok(None)`.
    #[inline]
    pub fn next_packet(&mut self) -> Result<Option<PacketRef<'_>>, TraceError> {
        if !self.next_found()? {
            return Ok(None);
        }
        let f = self.found;
        Ok(Some(PacketRef { ts_ns: f.ts_ns, orig_len: f.orig_len, link_type: f.link_type, data: self.data(&f) }))
    }

    /// The next packet that has an Ethernet form, presented as Ethernet ([`to_ethernet`], built in `scratch` unless
    /// it already is Ethernet): `link_type` is [`LinkType::Ethernet`] and `orig_len` accounts for the link header
    /// bytes the conversion added or removed. Packets with no Ethernet form are counted in [`Self::unparsed`] and
    /// skipped. Errors and the end are as for [`Self::next_packet`].
    #[inline]
    pub fn next_frame<'a>(&'a mut self, scratch: &'a mut Vec<u8>) -> Result<Option<PacketRef<'a>>, TraceError> {
        loop {
            if !self.next_found()? {
                return Ok(None);
            }
            let f = self.found;
            // Decide first (no borrow is kept), so a skipped packet does not hold the buffer across iterations.
            match linktype::layout(f.link_type, self.data(&f)) {
                Err(kind) => self.unparsed.add(kind.unparsed_reason().unwrap_or(Unparsed::CorruptRecord)),
                Ok(layout) => {
                    let data = self.buf.get(f.start..f.start + f.len).unwrap_or(&[]);
                    let frame = match layout {
                        None => data,
                        Some(l) => linktype::build(l, data, scratch),
                    };
                    let orig_len = linktype::converted_wire_len(f.orig_len, data.len(), frame.len());
                    return Ok(Some(PacketRef {
                        ts_ns: f.ts_ns,
                        orig_len,
                        link_type: LinkType::Ethernet,
                        data: frame,
                    }));
                }
            }
        }
    }

    /// The captured bytes of a found packet. `Found` ranges were checked against the buffer when the record was
    /// validated; `get` keeps the no-panic promise even so.
    #[inline]
    fn data(&self, f: &Found) -> &[u8] {
        self.buf.get(f.start..f.start + f.len).unwrap_or(&[])
    }

    /// Reads records until one carries a packet (then in `self.found`: `Ok(true)`), counting and skipping bad ones.
    #[inline]
    fn next_found(&mut self) -> Result<bool, TraceError> {
        while !self.done {
            let found = match self.state {
                State::Pcap { .. } => self.next_pcap(),
                State::PcapNg(_) => self.next_pcapng(),
            };
            match found {
                Ok(true) => {
                    self.packets += 1;
                    return Ok(true);
                }
                Ok(false) => self.done = true,
                Err(fault) => self.on_fault(fault)?,
            }
        }
        Ok(false)
    }

    /// Counts a bad record; ends the reading when the next record cannot be located.
    #[cold]
    #[inline(never)]
    fn on_fault(&mut self, fault: Fault) -> Result<(), TraceError> {
        match fault {
            Fault::Skip(why) => self.unparsed.add(why),
            Fault::Stop(why, e) => {
                self.unparsed.add(why);
                self.stopped = Some((*e).with_path_str(self.path.as_deref()));
                self.done = true;
            }
            Fault::Fatal(e) => {
                self.done = true;
                return Err((*e).with_path_str(self.path.as_deref()));
            }
        }
        Ok(())
    }

    /// Reads one pcap record into `self.found`: `Ok(false)` at the end.
    #[inline]
    fn next_pcap(&mut self) -> Result<bool, Fault> {
        let State::Pcap { endian, nanosecond, link_type, snaplen } = self.state else {
            return Ok(false);
        };
        let rec_off = self.offset;
        if !self.ensure(RECORD_HEADER_LEN)? {
            self.end_or_truncated(rec_off)?;
            return Ok(false);
        }
        let mut h = [0u8; RECORD_HEADER_LEN];
        h.copy_from_slice(&self.buf[self.start..self.start + RECORD_HEADER_LEN]);
        let rec = pcap::parse_record_header(endian, nanosecond, &h);
        // pcap has no resynchronisation marker: past an insane length nothing further can be found.
        if rec.caplen > MAX_CAPLEN {
            let kind = TraceErrorKind::CorruptRecord { offset: rec_off, caplen: rec.caplen, limit: MAX_CAPLEN };
            return Err(unreadable(kind.into()));
        }
        let total = RECORD_HEADER_LEN + rec.caplen as usize;
        if !self.ensure(total)? {
            return Err(truncated(rec_off));
        }
        if snaplen != 0 && rec.caplen > snaplen {
            self.over_snaplen += 1;
        }
        let start = self.start + RECORD_HEADER_LEN;
        self.consume(total);
        self.found = Found { start, len: rec.caplen as usize, ts_ns: rec.ts_ns, orig_len: rec.orig_len, link_type };
        Ok(true)
    }

    /// Reads pcapng blocks until one carries a packet, into `self.found`: `Ok(false)` at the end.
    fn next_pcapng(&mut self) -> Result<bool, Fault> {
        loop {
            match self.pcapng_block()? {
                Step::End => return Ok(false),
                Step::Packet => return Ok(true),
                Step::Other => {}
            }
        }
    }

    /// Reads one pcapng block.
    fn pcapng_block(&mut self) -> Result<Step, Fault> {
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
                return Err(truncated(blk_off));
            }
            let s = self.start;
            let magic = [self.buf[s + 8], self.buf[s + 9], self.buf[s + 10], self.buf[s + 11]];
            Section::shb_endian(magic, blk_off).map_err(unreadable)?
        } else {
            match &self.state {
                State::PcapNg(section) => section.endian,
                State::Pcap { .. } => return Ok(Step::End),
            }
        };
        let block_type = endian.u32(type_bytes);
        let total = endian.u32(len_bytes);
        if block_type == BT_SHB && self.byte_order_contradicts(endian, total)? {
            // A swapped or damaged byte-order magic reads the length in the wrong order: name the magic, not the
            // "truncated record" that length would lead to.
            return Err(unreadable(TraceError::corrupt_block(
                blk_off,
                "section header's byte-order magic contradicts its block length (a corrupt byte-order magic)",
            )));
        }
        if total < MIN_BLOCK_LEN || total % 4 != 0 {
            let err = TraceError::corrupt_block(blk_off, "block length not a multiple of 4 of at least 12");
            return Err(self.resync(blk_off, 4, unreadable(err))?);
        }
        if !pcapng::is_decoded(block_type) {
            self.skip_block(blk_off, total, endian)?;
            return Ok(Step::Other);
        }
        if total > MAX_DECODED_BLOCK {
            // Too large for any packet block, yet its framing may well be sound: step over it like an unknown block.
            self.skip_block(blk_off, total, endian)?;
            return Err(Fault::Skip(Unparsed::CorruptRecord));
        }
        let total = total as usize;
        if !self.ensure(total)? {
            // The file ends inside the block — or its length is corrupt and a sound block follows.
            return Err(self.resync(blk_off, 4, truncated(blk_off))?);
        }
        let start = self.start;
        let block = &self.buf[start..start + total];
        if pcap::read_u32(endian, block, total - 4) != total as u32 {
            let err = TraceError::corrupt_block(blk_off, "trailing block length differs from leading one");
            return Err(self.resync(blk_off, 4, unreadable(err))?);
        }
        let State::PcapNg(section) = &mut self.state else {
            return Ok(Step::End);
        };
        let info = section.decode(block, blk_off);
        // Consumed whatever the verdict: a skipped block must not be read again.
        self.consume(total);
        Ok(match info? {
            Some(p) => {
                self.over_snaplen += u64::from(p.over_snaplen);
                self.found = Found {
                    start: start + p.data_off,
                    len: p.caplen,
                    ts_ns: p.ts_ns,
                    orig_len: p.orig_len,
                    link_type: p.link_type,
                };
                Step::Packet
            }
            None => Step::Other,
        })
    }

    /// Skips a block that is not decoded, without holding it in memory, and checks its trailing length.
    fn skip_block(&mut self, blk_off: u64, total: u32, endian: Endian) -> Result<(), Fault> {
        let mut left = u64::from(total) - 4;
        while left > 0 {
            if !self.ensure(1)? {
                return Err(truncated(blk_off));
            }
            let k = self.available().min(usize::try_from(left).unwrap_or(usize::MAX));
            self.consume(k);
            left -= k as u64;
        }
        if !self.ensure(4)? {
            return Err(truncated(blk_off));
        }
        let trailer = pcap::read_u32(endian, &self.buf[self.start..self.start + 4], 0);
        if trailer != total {
            let err = TraceError::corrupt_block(blk_off, "trailing block length differs from leading one");
            return Err(self.resync(blk_off, 4, unreadable(err))?);
        }
        self.consume(4);
        Ok(())
    }

    /// A section header whose length is unusable in the byte order its magic names, yet is a sound block in the
    /// other order: the magic is what is corrupt.
    #[cold]
    fn byte_order_contradicts(&mut self, endian: Endian, total: u32) -> Result<bool, TraceError> {
        let sound = |r: &mut Self, e: Endian, t: u32| -> Result<bool, TraceError> {
            if t < 28 || !t.is_multiple_of(4) || t > MAX_DECODED_BLOCK || !r.ensure(t as usize)? {
                return Ok(false);
            }
            Ok(pcap::read_u32(e, &r.buf[r.start..r.start + t as usize], t as usize - 4) == t)
        };
        if sound(self, endian, total)? {
            return Ok(false);
        }
        let other = match endian {
            Endian::Little => Endian::Big,
            Endian::Big => Endian::Little,
        };
        let s = self.start;
        let alt = other.u32([self.buf[s + 4], self.buf[s + 5], self.buf[s + 6], self.buf[s + 7]]);
        sound(self, other, alt)
    }

    /// After a block whose framing is corrupt (at `blk_off`): the next sound block, searched from `from`
    /// bytes past the buffer's start in steps of 4 (blocks are 4-byte aligned) within [`RESYNC_WINDOW`] bytes — a
    /// block of a decoded type (see [`pcapng::is_decoded`]) in the section's byte order (a section header in its
    /// own), of a valid length, whose trailing length repeats the leading one. Found: everything before it is
    /// consumed and the corrupt block counted (`Fault::Skip`), as tshark steps over a damaged block; not found, or
    /// in the file's first block (no section to read the rest in): `fallback`, the fault without a way on.
    #[cold]
    #[inline(never)]
    fn resync(&mut self, blk_off: u64, from: usize, fallback: Fault) -> Result<Fault, TraceError> {
        let endian = match &self.state {
            State::PcapNg(section) if blk_off > 0 => section.endian,
            _ => return Ok(fallback),
        };
        let mut k = from;
        while k <= RESYNC_WINDOW {
            if !self.ensure(k + 8)? {
                break;
            }
            let s = self.start + k;
            let word = |at: usize, b: &[u8]| [b[at], b[at + 1], b[at + 2], b[at + 3]];
            let t = word(s, &self.buf);
            let e = if u32::from_le_bytes(t) == BT_SHB {
                if !self.ensure(k + 12)? {
                    break;
                }
                match Section::shb_endian(word(s + 8, &self.buf), 0) {
                    Ok(e) => e,
                    Err(_) => {
                        k += 4;
                        continue;
                    }
                }
            } else {
                endian
            };
            let total = e.u32(word(s + 4, &self.buf));
            let plausible = pcapng::is_decoded(e.u32(t))
                && total >= MIN_BLOCK_LEN
                && total.is_multiple_of(4)
                && total <= MAX_DECODED_BLOCK;
            if plausible && self.ensure(k + total as usize)? {
                let s = self.start + k;
                if e.u32(word(s + total as usize - 4, &self.buf)) == total {
                    self.consume(k);
                    return Ok(Fault::Skip(Unparsed::CorruptRecord));
                }
            }
            k += 4;
        }
        Ok(fallback)
    }

    /// A clean end when no byte of the next record exists, otherwise a truncated record.
    fn end_or_truncated(&self, offset: u64) -> Result<(), Fault> {
        if self.available() == 0 {
            Ok(())
        } else {
            Err(truncated(offset))
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

/// Reads every packet of an in-memory trace twice, with [`TraceReader::next_packet`] plus [`to_ethernet`] and with
/// [`TraceReader::next_frame`], ignoring errors: the body of a fuzz target. Must never panic or loop forever,
/// whatever `data` is; panics only if the two passes disagree (a reader bug, which is what a fuzzer should find).
pub fn fuzz_read_all(data: &[u8]) {
    let Ok(mut reader) = TraceReader::new(data) else {
        return;
    };
    let mut scratch = Vec::new();
    let (mut packets, mut frames, mut no_form) = (0u64, 0u64, UnparsedCounts::default());
    let first_error = loop {
        match reader.next_packet() {
            Ok(Some(pkt)) => {
                packets += 1;
                match to_ethernet(&pkt, &mut scratch) {
                    Ok(_) => frames += 1,
                    Err(e) => no_form.add(e.kind().unparsed_reason().unwrap_or(Unparsed::CorruptRecord)),
                }
            }
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert_eq!(reader.packets_read(), packets);
    let records = *reader.unparsed();
    let Ok(mut again) = TraceReader::new(data) else {
        panic!("a trace that opened once failed to open again");
    };
    let mut frames2 = 0u64;
    let second_error = loop {
        match again.next_frame(&mut scratch) {
            Ok(Some(f)) => {
                assert_eq!(f.link_type, LinkType::Ethernet);
                assert!(f.orig_len as usize >= f.data.len());
                frames2 += 1;
            }
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert_eq!(first_error, second_error);
    assert_eq!(again.packets_read(), packets);
    assert_eq!(frames2, frames);
    let mut want = records;
    want.merge(&no_form);
    assert_eq!(*again.unparsed(), want);
    assert_eq!(again.stopped_early().map(ToString::to_string), reader.stopped_early().map(ToString::to_string));
}

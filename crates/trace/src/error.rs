//! Errors of trace file I/O.
//!
//! Owns [`TraceError`]: one value for every way reading or writing a trace can fail. Its `Display` is a single line
//! naming the file (when known) and the problem, e.g. `in.pcap: truncated packet record at byte 4096`, suitable for a
//! command-line tool to print before exiting with status 2. Errors are only built on the failure path, so they may
//! allocate.

use std::fmt;
use std::io;
use std::path::Path;

use crate::linktype::dlt_name;
use crate::unparsed::Unparsed;

/// What went wrong; [`TraceError`] adds the file name.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The underlying reader or writer failed. `offset` is the file offset of the operation (reads) or the number
    /// of bytes written so far (writes).
    Io { offset: u64, source: io::Error },
    /// The file could not be opened for reading.
    Open(io::Error),
    /// The file could not be created for writing.
    Create(io::Error),
    /// The file has no bytes at all.
    Empty,
    /// The first four bytes are neither a pcap magic nor a pcapng Section Header Block.
    BadMagic(u32),
    /// The file ends inside the pcap global header or the first pcapng block header.
    TruncatedHeader { offset: u64 },
    /// A pcap file with a major version other than 2.
    UnsupportedPcapVersion { major: u16, minor: u16 },
    /// A pcapng section with a major version other than 1.
    UnsupportedPcapngVersion { major: u16, minor: u16 },
    /// A link type (DLT) the reader cannot present as Ethernet (see [`crate::LinkType`] for the supported ones).
    UnsupportedLinkType(u32),
    /// The file ends inside a packet record or block that starts at `offset`.
    TruncatedRecord { offset: u64 },
    /// A record whose captured length exceeds the 256 KiB sanity limit.
    CorruptRecord { offset: u64, caplen: u32, limit: u32 },
    /// A pcapng block that violates the format (bad length, fields overrunning the block, ...).
    CorruptBlock { offset: u64, reason: &'static str },
    /// A pcapng packet references an interface that no Interface Description Block defined.
    UnknownInterface { offset: u64, interface: u32 },
    /// More Interface Description Blocks in one section than the reader accepts (bounded memory).
    TooManyInterfaces { offset: u64 },
    /// A packet is too short for the headers of its link type.
    PacketTooShort { link_type: &'static str, len: usize },
    /// A raw IP packet whose version nibble is neither 4 nor 6.
    UnknownIpVersion(u8),
    /// A Linux cooked-capture packet whose protocol field is not an EtherType.
    UnsupportedSllProtocol(u16),
    /// A packet whose link header names a protocol with no Ethernet II form: a loopback address family other than
    /// IPv4/IPv6, a PPP protocol other than IPv4/IPv6, a Cisco HDLC protocol below 0x0600.
    NoEthernetForm { link_type: &'static str, protocol: u32 },
    /// A writer option that cannot be encoded.
    InvalidOption(&'static str),
    /// A timestamp beyond what pcap's 32-bit seconds field can hold (after 2106-02-07).
    TimestampOutOfRange(u64),
    /// A writer that an earlier failed write stopped: nothing more is written.
    Stopped,
    /// A writer's earlier failure, as text (names the file already).
    WriteFailed(Box<str>),
}

/// An error from reading or writing a trace: the kind plus, when known, the file it concerns.
#[derive(Debug)]
pub struct TraceError {
    path: Option<Box<str>>,
    kind: TraceErrorKind,
}

impl TraceError {
    /// An error without a file name.
    pub fn new(kind: TraceErrorKind) -> Self {
        TraceError { path: None, kind }
    }

    /// Attaches (or replaces) the file name shown in front of the message.
    pub fn with_path(mut self, path: &Path) -> Self {
        self.path = Some(path.display().to_string().into_boxed_str());
        self
    }

    pub(crate) fn with_path_str(mut self, path: Option<&str>) -> Self {
        if let Some(p) = path {
            self.path = Some(p.into());
        }
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> &TraceErrorKind {
        &self.kind
    }

    /// The file name the error concerns, if known.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    pub(crate) fn io(offset: u64, source: io::Error) -> Self {
        Self::new(TraceErrorKind::Io { offset, source })
    }

    pub(crate) fn corrupt_block(offset: u64, reason: &'static str) -> Self {
        Self::new(TraceErrorKind::CorruptBlock { offset, reason })
    }
}

impl TraceErrorKind {
    /// The reason to count when this error concerns one packet's contents rather than the file: such packets are
    /// counted and skipped, never the end of a run.
    pub fn unparsed_reason(&self) -> Option<Unparsed> {
        match self {
            TraceErrorKind::PacketTooShort { .. } => Some(Unparsed::TooShort),
            TraceErrorKind::UnknownIpVersion(_) => Some(Unparsed::UnknownIpVersion),
            TraceErrorKind::UnsupportedSllProtocol(_) | TraceErrorKind::NoEthernetForm { .. } => {
                Some(Unparsed::NoEthernetForm)
            }
            _ => None,
        }
    }
}

impl From<TraceErrorKind> for TraceError {
    fn from(kind: TraceErrorKind) -> Self {
        TraceError::new(kind)
    }
}

impl fmt::Display for TraceErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TraceErrorKind::*;
        match self {
            Io { offset, source } => write!(f, "I/O error at byte {offset}: {source}"),
            Open(e) => write!(f, "cannot open: {e}"),
            Create(e) => write!(f, "cannot create: {e}"),
            Empty => f.write_str("empty file (not a pcap or pcapng file)"),
            BadMagic(m) => write!(f, "not a pcap or pcapng file (magic 0x{m:08x})"),
            TruncatedHeader { offset } => write!(f, "truncated file header at byte {offset}"),
            UnsupportedPcapVersion { major, minor } => write!(f, "unsupported pcap version {major}.{minor}"),
            UnsupportedPcapngVersion { major, minor } => write!(f, "unsupported pcapng version {major}.{minor}"),
            UnsupportedLinkType(dlt) => match dlt_name(*dlt) {
                Some(name) => write!(f, "unsupported link type {dlt} ({name})"),
                None => write!(f, "unsupported link type {dlt}"),
            },
            TruncatedRecord { offset } => write!(f, "truncated packet record at byte {offset}"),
            CorruptRecord { offset, caplen, limit } => {
                write!(f, "corrupt record at byte {offset}: captured length {caplen} exceeds {limit}")
            }
            CorruptBlock { offset, reason } => write!(f, "corrupt pcapng block at byte {offset}: {reason}"),
            UnknownInterface { offset, interface } => {
                write!(f, "corrupt pcapng block at byte {offset}: packet references undefined interface {interface}")
            }
            TooManyInterfaces { offset } => {
                write!(f, "corrupt pcapng block at byte {offset}: too many interfaces in one section")
            }
            PacketTooShort { link_type, len } => write!(f, "packet too short for link type {link_type} ({len} bytes)"),
            UnknownIpVersion(v) => write!(f, "raw IP packet with unknown IP version {v}"),
            UnsupportedSllProtocol(p) => write!(f, "Linux cooked capture with non-EtherType protocol 0x{p:04x}"),
            NoEthernetForm { link_type, protocol } => {
                write!(f, "{link_type} packet with protocol 0x{protocol:04x}, which has no Ethernet form")
            }
            InvalidOption(what) => write!(f, "invalid writer option: {what}"),
            TimestampOutOfRange(ns) => write!(f, "timestamp {ns} ns does not fit the pcap 32-bit seconds field"),
            Stopped => f.write_str("writer stopped by an earlier failed write"),
            WriteFailed(cause) => f.write_str(cause),
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match &self.path {
            Some(p) => format!("{p}: {}", self.kind),
            None => self.kind.to_string(),
        };
        // One line is the contract: file names and OS error texts could in theory carry newlines.
        if text.contains(['\n', '\r']) {
            f.write_str(&text.replace(['\n', '\r'], " "))
        } else {
            f.write_str(&text)
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TraceErrorKind::Io { source, .. } | TraceErrorKind::Open(source) | TraceErrorKind::Create(source) => {
                Some(source)
            }
            _ => None,
        }
    }
}

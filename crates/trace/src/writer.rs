//! pcap writer.
//!
//! Owns [`PcapWriter`] and [`WriterOptions`]: writes the global header on creation and one 16-byte record header plus
//! the (snaplen-truncated) bytes per packet, in any of the four pcap variants (micro/nanosecond, little/big endian).
//! Records are encoded on the stack; the only allocation is the caller's `Write` buffer.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::LinkType;
use crate::pcap::{self, Endian, MAX_CAPLEN};

/// Options of a new pcap file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Nanosecond timestamps (magic 0xa1b23c4d) instead of microseconds.
    pub nanosecond: bool,
    /// Big-endian headers instead of little-endian.
    pub big_endian: bool,
    /// Snapshot length: longer packets are truncated to it. 1..=262144.
    pub snaplen: u32,
    /// Link type of every packet written.
    pub link_type: LinkType,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions { nanosecond: false, big_endian: false, snaplen: 65535, link_type: LinkType::Ethernet }
    }
}

/// Writes packets to a pcap stream.
pub struct PcapWriter<W: Write> {
    inner: W,
    endian: Endian,
    nanosecond: bool,
    snaplen: u32,
    packets: u64,
    bytes: u64,
    path: Option<Box<str>>,
}

impl PcapWriter<BufWriter<File>> {
    /// Creates (truncating) a pcap file; errors name the file.
    pub fn create(path: &Path, opts: WriterOptions) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|e| TraceError::new(TraceErrorKind::Create(e)).with_path(path))?;
        let mut w = Self::new(BufWriter::with_capacity(256 * 1024, file), opts).map_err(|e| e.with_path(path))?;
        w.path = Some(path.display().to_string().into_boxed_str());
        Ok(w)
    }
}

impl<W: Write> PcapWriter<W> {
    /// Validates the options and writes the global header.
    pub fn new(mut inner: W, opts: WriterOptions) -> Result<Self, TraceError> {
        if opts.snaplen == 0 || opts.snaplen > MAX_CAPLEN {
            return Err(TraceErrorKind::InvalidOption("snaplen must be between 1 and 262144").into());
        }
        let endian = if opts.big_endian { Endian::Big } else { Endian::Little };
        let header = pcap::encode_global_header(endian, opts.nanosecond, opts.snaplen, opts.link_type.dlt());
        inner.write_all(&header).map_err(|e| TraceError::io(0, e))?;
        Ok(PcapWriter {
            inner,
            endian,
            nanosecond: opts.nanosecond,
            snaplen: opts.snaplen,
            packets: 0,
            bytes: header.len() as u64,
            path: None,
        })
    }

    /// Appends one packet captured at `ts_ns` (nanoseconds since the Unix epoch; microsecond files keep whole
    /// microseconds). Bytes beyond the snaplen are dropped; the recorded original length is at least `data.len()`.
    pub fn write_packet(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> Result<(), TraceError> {
        let caplen = data.len().min(self.snaplen as usize);
        let orig_len = orig_len.max(u32::try_from(data.len()).unwrap_or(u32::MAX));
        let Some(header) = pcap::encode_record_header(self.endian, self.nanosecond, ts_ns, caplen as u32, orig_len)
        else {
            return Err(self.err(TraceErrorKind::TimestampOutOfRange(ts_ns).into()));
        };
        let res = self.inner.write_all(&header).and_then(|()| self.inner.write_all(&data[..caplen]));
        if let Err(e) = res {
            return Err(self.err(TraceError::io(self.bytes, e)));
        }
        self.bytes += (header.len() + caplen) as u64;
        self.packets += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn packets_written(&self) -> u64 {
        self.packets
    }

    /// Bytes written so far, global header included.
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// Flushes and returns the inner writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        if let Err(e) = self.inner.flush() {
            return Err(self.err(TraceError::io(self.bytes, e)));
        }
        Ok(self.inner)
    }

    fn err(&self, e: TraceError) -> TraceError {
        e.with_path_str(self.path.as_deref())
    }
}

//! pcap writer.
//!
//! Owns [`PcapWriter`] and [`WriterOptions`]: writes the global header on creation and one 16-byte record header plus
//! the (snaplen-truncated) bytes per packet, in any of the four pcap variants (micro/nanosecond, little/big endian).
//! Records are encoded on the stack into the writer's own buffer, which only ever holds whole records and is
//! allocated once.
//!
//! A failed write stops the writer for good: nothing is written after it, a file is cut back to its last whole
//! record (so it stays a valid pcap up to the loss), the error goes once to the hook set with
//! [`PcapWriter::on_error`], and every packet not written from then on is counted ([`PcapWriter::close`] reports
//! them). A disk that fills and frees again therefore never leaves a valid-looking file with a hole in it.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{TraceError, TraceErrorKind};
use crate::linktype::LinkType;
use crate::pcap::{self, Endian, MAX_CAPLEN};

/// Bytes buffered before they are handed to the underlying writer.
const BUFFER: usize = 256 * 1024;

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

/// Called once with the error that stopped a writer.
pub type ErrorHook = Box<dyn FnMut(&TraceError) + Send>;

/// What became of the packets given to a writer (see [`PcapWriter::close`]).
#[derive(Debug)]
pub struct WriteOutcome {
    /// Packets in the file (or stream), whole.
    pub written: u64,
    /// Packets given to the writer that are not in it.
    pub lost: u64,
    /// The error that stopped the writer (one line, naming the file), if one did.
    pub error: Option<String>,
}

/// Writes packets to a pcap stream.
pub struct PcapWriter<W: Write> {
    inner: W,
    /// Whole records not yet handed to `inner`.
    buf: Vec<u8>,
    /// Records in `buf`.
    buffered: u64,
    endian: Endian,
    nanosecond: bool,
    snaplen: u32,
    /// Records handed to `inner`, and their bytes (global header included).
    packets: u64,
    bytes: u64,
    /// Packets given but not written (after a failure, or unencodable).
    lost: u64,
    /// The error that stopped the writer, as text (the error itself went to the hook).
    failed: Option<Box<str>>,
    on_error: Option<ErrorHook>,
    /// The file behind `inner`, to cut back to the last whole record after a failed write.
    file: Option<File>,
    path: Option<Box<str>>,
}

impl PcapWriter<File> {
    /// Creates (truncating) a pcap file; errors name the file.
    pub fn create(path: &Path, opts: WriterOptions) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|e| TraceError::new(TraceErrorKind::Create(e)).with_path(path))?;
        let handle = file.try_clone().ok();
        let mut w = Self::new(file, opts).map_err(|e| e.with_path(path))?;
        w.path = Some(path.display().to_string().into_boxed_str());
        // Only a regular file can be cut back (a FIFO or /dev/stdout cannot).
        w.file = handle.filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        // The global header is on disk now: a file that cannot take 24 bytes is refused before any packet.
        w.flush_buf().map_err(|e| e.with_path(path))?;
        Ok(w)
    }
}

impl<W: Write> PcapWriter<W> {
    /// Validates the options and writes (buffers) the global header.
    pub fn new(inner: W, opts: WriterOptions) -> Result<Self, TraceError> {
        if opts.snaplen == 0 || opts.snaplen > MAX_CAPLEN {
            return Err(TraceErrorKind::InvalidOption("snaplen must be between 1 and 262144").into());
        }
        let endian = if opts.big_endian { Endian::Big } else { Endian::Little };
        let header = pcap::encode_global_header(endian, opts.nanosecond, opts.snaplen, opts.link_type.dlt());
        let mut buf = Vec::with_capacity(BUFFER);
        buf.extend_from_slice(&header);
        Ok(PcapWriter {
            inner,
            buf,
            buffered: 0,
            endian,
            nanosecond: opts.nanosecond,
            snaplen: opts.snaplen,
            packets: 0,
            bytes: 0,
            lost: 0,
            failed: None,
            on_error: None,
            file: None,
            path: None,
        })
    }

    /// Calls `hook` once, with the error that stops the writer (e.g. to report it at once, mid-run).
    pub fn on_error(&mut self, hook: ErrorHook) {
        self.on_error = Some(hook);
    }

    /// Appends one packet captured at `ts_ns` (nanoseconds since the Unix epoch; microsecond files keep whole
    /// microseconds). Bytes beyond the snaplen are dropped; the recorded original length is at least `data.len()`.
    /// After a failed write every call fails (the packet is counted lost) without writing anything.
    pub fn write_packet(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> Result<(), TraceError> {
        if self.failed.is_some() {
            // No path attached: this is the per-packet path of a stopped writer, it must not allocate.
            self.lost += 1;
            return Err(TraceErrorKind::Stopped.into());
        }
        let caplen = data.len().min(self.snaplen as usize);
        let orig_len = orig_len.max(u32::try_from(data.len()).unwrap_or(u32::MAX));
        let Some(header) = pcap::encode_record_header(self.endian, self.nanosecond, ts_ns, caplen as u32, orig_len)
        else {
            self.lost += 1;
            return Err(self.err(TraceErrorKind::TimestampOutOfRange(ts_ns).into()));
        };
        if self.buf.len() + header.len() + caplen > BUFFER.max(self.buf.capacity()) {
            if let Err(e) = self.flush_buf() {
                // This packet is lost with the buffered ones (counted by `flush_buf`).
                self.lost += 1;
                return Err(e);
            }
        }
        // A record larger than the buffer still goes in whole (the Vec grows once; caplen <= 256 KiB).
        self.buf.extend_from_slice(&header);
        self.buf.extend_from_slice(&data[..caplen]);
        self.buffered += 1;
        Ok(())
    }

    /// Hands the buffered whole records to `inner`; on failure stops the writer (see the module doc).
    fn flush_buf(&mut self) -> Result<(), TraceError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        match self.inner.write_all(&self.buf) {
            Ok(()) => {
                self.bytes += self.buf.len() as u64;
                self.packets += self.buffered;
                self.buf.clear();
                self.buffered = 0;
                Ok(())
            }
            Err(e) => {
                let e = self.err(TraceError::io(self.bytes, e));
                self.stop(&e);
                Err(e)
            }
        }
    }

    /// Stops the writer after `e`: the buffered records are lost, the file is cut back to its last whole record.
    fn stop(&mut self, e: &TraceError) {
        self.lost += self.buffered;
        self.buffered = 0;
        self.buf = Vec::new();
        if let Some(f) = &self.file {
            // Best effort: a partial record at the end would make the whole file unreadable to some tools.
            let _ = f.set_len(self.bytes);
        }
        if let Some(hook) = self.on_error.as_mut() {
            hook(e);
        }
        self.failed = Some(e.to_string().into_boxed_str());
    }

    /// Packets written so far (some may still be in the writer's buffer; [`Self::close`] says which reached the
    /// file).
    pub fn packets_written(&self) -> u64 {
        self.packets + self.buffered
    }

    /// Bytes written so far, global header included (some may still be buffered).
    pub fn bytes_written(&self) -> u64 {
        self.bytes + self.buf.len() as u64
    }

    /// Packets given to the writer that will not be written.
    pub fn packets_lost(&self) -> u64 {
        self.lost
    }

    /// Whether a failed write stopped the writer.
    pub fn is_stopped(&self) -> bool {
        self.failed.is_some()
    }

    /// Flushes and returns the inner writer; fails if any write failed (now or earlier).
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush_buf()?;
        if let Some(cause) = self.failed.take() {
            return Err(TraceErrorKind::WriteFailed(cause).into());
        }
        if let Err(e) = self.inner.flush() {
            return Err(self.err(TraceError::io(self.bytes, e)));
        }
        Ok(self.inner)
    }

    /// Flushes and says what became of every packet given: written, lost, and the error that stopped the
    /// writer. Never fails: a run's report is written whatever happened to its output.
    pub fn close(mut self) -> WriteOutcome {
        let flushed = self.flush_buf().and_then(|()| {
            let bytes = self.bytes;
            self.inner.flush().map_err(|e| self.err(TraceError::io(bytes, e)))
        });
        if let Err(e) = flushed {
            if self.failed.is_none() {
                self.stop(&e);
            }
        }
        WriteOutcome { written: self.packets, lost: self.lost, error: self.failed.take().map(String::from) }
    }

    fn err(&self, e: TraceError) -> TraceError {
        e.with_path_str(self.path.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A disk that fills after `room` bytes (a short write, then errors) and frees again after one failure.
    struct FillsOnce {
        data: Vec<u8>,
        room: usize,
        failed: bool,
    }

    impl Write for FillsOnce {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if !self.failed && self.data.len() + b.len() > self.room {
                let n = self.room - self.data.len();
                if n == 0 {
                    self.failed = true;
                    return Err(std::io::Error::from_raw_os_error(28));
                }
                self.data.extend_from_slice(&b[..n]);
                return Ok(n);
            }
            self.data.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_stops_the_writer_for_good_and_counts_what_is_lost() {
        // 300 KB of room: the first buffer (256 KiB) goes in whole, the second fails part-way.
        let mut w =
            PcapWriter::new(FillsOnce { data: Vec::new(), room: 300_000, failed: false }, WriterOptions::default())
                .unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let s = Arc::clone(&seen);
        w.on_error(Box::new(move |_| {
            s.fetch_add(1, Ordering::Relaxed);
        }));
        let frame = [0xabu8; 1000];
        let mut failed_at = None;
        for i in 0..1000u64 {
            if w.write_packet(i * 1000, &frame, 1000).is_err() && failed_at.is_none() {
                failed_at = Some(i);
            }
        }
        assert!(failed_at.is_some() && w.is_stopped());
        let before_close = w.inner.data.len();
        let out = w.close();
        assert_eq!(seen.load(Ordering::Relaxed), 1, "the hook hears of the failure once");
        // Nothing was written after the failure, though the "disk" had room again.
        assert_eq!(out.written + out.lost, 1000);
        assert_eq!(out.written, ((BUFFER - 24) / 1016) as u64, "only the first whole buffer was handed over");
        assert!(out.error.as_deref().is_some_and(|e| e.contains("os error 28")), "{:?}", out.error);
        assert!(before_close <= 300_000);
    }

    #[test]
    fn a_file_is_cut_back_to_its_last_whole_record() {
        let dir = std::env::temp_dir().join(format!("fp-writer-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("o.pcap");
        let mut w = PcapWriter::create(&path, WriterOptions::default()).unwrap();
        for i in 0..10u64 {
            w.write_packet(i, &[1u8; 60], 60).unwrap();
        }
        w.flush_buf().unwrap();
        // Simulate a failed flush that left half a record behind.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&[0u8; 30]).unwrap();
        let e = TraceError::io(w.bytes, std::io::Error::from_raw_os_error(28));
        w.stop(&e);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 24 + 10 * 76);
        assert!(w.write_packet(11, &[1u8; 60], 60).is_err());
        let out = w.close();
        assert_eq!((out.written, out.lost), (10, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

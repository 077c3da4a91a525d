//! What the tshark-checked NF tests share: writing a pcap, running tshark,
//! temporary files removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use flowplane_trace::{PcapWriter, WriterOptions};

/// Writes `frames` as a nanosecond pcap, 1 ms apart.
pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::create(path, WriterOptions { nanosecond: true, ..WriterOptions::default() })
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(1_700_000_000_000_000_000 + i as u64 * 1_000_000, f, f.len() as u32).expect("write packet");
    }
    w.finish().expect("flush pcap");
}

/// Runs tshark; `None` when it is not installed and skipping was asked for
/// (`FLOWPLANE_SKIP_TSHARK=1`), a panic otherwise: the check never passes silently.
pub fn tshark(args: &[&str]) -> Option<String> {
    match Command::new("tshark").args(args).output() {
        Ok(o) => {
            assert!(o.status.success(), "tshark {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
            Some(String::from_utf8_lossy(&o.stdout).into_owned())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var("FLOWPLANE_SKIP_TSHARK").as_deref() == Ok("1") {
                eprintln!("tshark not found: skipped (FLOWPLANE_SKIP_TSHARK=1)");
                None
            } else {
                panic!(
                    "tshark is not installed (needed to verify the output); install it or set FLOWPLANE_SKIP_TSHARK=1"
                );
            }
        }
        Err(e) => panic!("running tshark: {e}"),
    }
}

/// A file removed when dropped.
pub struct TempFile(pub PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

//! Where a run's results go, and what became of them: the `--export` files
//! and the pcap `--output`.
//!
//! Rules (issue 29): every path is checked before the first packet (an
//! export's temporary file is created beside it, the pcap is created), so a
//! missing directory is a one-line refusal (exit 2) instead of a lost run. A
//! write that fails later stops that writer only: it is reported at once on
//! stderr, the run goes on, the report and every other export are still
//! written, the report names what was lost, and the exit code is 1. Exports
//! are written to the temporary file and renamed over the target, so a full
//! disk never leaves a half line as the final file (a target that existed
//! before is then left as it was).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flowplane_io::sink::SharedPcapWriter;
use flowplane_trace::{PcapWriter, WriteOutcome, WriterOptions};

use crate::error::CliError;

/// An export's destination, checked before the run: a temporary file beside
/// the target, renamed over it once the rows are all written. Dropped
/// uncommitted (an error before the end), it removes its temporary file.
pub struct ExportFile {
    /// The NF whose state goes there.
    pub nf: String,
    /// The final path.
    pub path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

impl ExportFile {
    /// Creates the temporary file beside `path` (so the directory exists and
    /// is writable, and the rename at the end stays on one filesystem).
    pub fn create(nf: &str, path: &Path) -> Result<Self, CliError> {
        let err = |e: std::io::Error| CliError::new(format!("--export {nf}={}: {e}", path.display()));
        if path.is_dir() {
            return Err(CliError::new(format!("--export {nf}={}: is a directory", path.display())));
        }
        let name = path.file_name().ok_or_else(|| err(std::io::ErrorKind::InvalidInput.into()))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = dir.join(format!(".{}.flowplane-{}.tmp", name.to_string_lossy(), std::process::id()));
        let file = File::options().write(true).create_new(true).open(&tmp).map_err(err)?;
        Ok(ExportFile { nf: nf.to_string(), path: path.to_path_buf(), tmp, file: Some(file) })
    }

    /// Writes `rows` (JSON array or CSV, by the target's extension), syncs
    /// and renames over the target. On error the target is untouched and the
    /// temporary file removed; the error names the file.
    pub fn commit(mut self, rows: &[serde_json::Value]) -> Result<(), String> {
        let file = self.file.take().ok_or_else(|| format!("{}: already written", self.path.display()))?;
        let json = self.path.extension().and_then(|e| e.to_str()) == Some("json");
        let res = write_rows(file, json, rows).and_then(|()| std::fs::rename(&self.tmp, &self.path));
        // Drop removes the temporary file if the rename did not happen.
        res.map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

impl Drop for ExportFile {
    fn drop(&mut self) {
        // Harmless after a successful rename (nothing left under that name).
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Rows as JSON (an array) or CSV (columns of the first row, in order), synced to disk.
fn write_rows(file: File, json: bool, rows: &[serde_json::Value]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(file);
    if json {
        serde_json::to_writer_pretty(&mut w, rows)?;
        writeln!(w)?;
    } else {
        let cols: Vec<String> =
            rows.first().and_then(|r| r.as_object()).map(|o| o.keys().cloned().collect()).unwrap_or_default();
        writeln!(w, "{}", cols.join(","))?;
        for r in rows {
            let line: Vec<String> = cols
                .iter()
                .map(|c| match &r[c] {
                    serde_json::Value::String(s) => s.clone(),
                    v => v.to_string(),
                })
                .collect();
            writeln!(w, "{}", line.join(","))?;
        }
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    // A full disk may only show at write-back: the rename must not publish a file that is not all there.
    file.sync_all()
}

/// Checks every `--export` destination before the run (see the module doc).
pub fn create_exports(exports: &[(String, PathBuf)]) -> Result<Vec<ExportFile>, CliError> {
    for (i, (nf, p)) in exports.iter().enumerate() {
        if exports[..i].iter().any(|(_, q)| q == p) {
            return Err(CliError::new(format!("--export {nf}={}: the same file is exported twice", p.display())));
        }
    }
    exports.iter().map(|(nf, p)| ExportFile::create(nf, p)).collect()
}

/// Creates a pcap output (a missing directory is refused before the run)
/// whose first failed write is reported at once on stderr, as one line.
pub fn create_pcap(path: &Path, what: &str) -> Result<SharedPcapWriter, CliError> {
    let mut w = PcapWriter::create(path, WriterOptions { nanosecond: true, ..WriterOptions::default() })
        .map_err(|e| CliError::new(format!("{what} {e}")))?;
    let what = what.to_string();
    w.on_error(Box::new(move |e| {
        eprintln!("flowplane: error: {what} {e}; nothing more is written to it, the run goes on");
    }));
    Ok(Arc::new(Mutex::new(w)))
}

/// What a run did not write: packets meant for a pcap output, exports.
#[derive(Default)]
pub struct Losses {
    /// Per pcap output: its path and what became of its packets.
    pub outputs: Vec<(String, WriteOutcome)>,
    /// Exports not written: NF, path, error.
    pub exports: Vec<(String, String, String)>,
}

impl Losses {
    /// Closes a shared pcap output (every worker is done with it) and records its outcome.
    pub fn close_pcap(&mut self, path: &Path, w: SharedPcapWriter) {
        let outcome = match Arc::try_unwrap(w).map(|m| m.into_inner()) {
            Ok(Ok(w)) => w.close(),
            Ok(Err(poisoned)) => poisoned.into_inner().close(),
            // Cannot happen once the workers are joined; say so rather than claim the file is complete.
            Err(_) => WriteOutcome { written: 0, lost: 0, error: Some("output writer still in use".to_string()) },
        };
        self.outputs.push((path.display().to_string(), outcome));
    }

    /// Writes each export (its rows from the report), recording failures.
    pub fn commit_exports(&mut self, files: Vec<ExportFile>, rows_of: impl Fn(&str) -> Vec<serde_json::Value>) {
        for f in files {
            let (nf, path) = (f.nf.clone(), f.path.display().to_string());
            if let Err(e) = f.commit(&rows_of(&nf)) {
                eprintln!("flowplane: error: --export {nf}: {e}");
                self.exports.push((nf, path, e));
            }
        }
    }

    /// Whether anything meant for an output or an export was not written.
    pub fn any(&self) -> bool {
        !self.exports.is_empty() || self.outputs.iter().any(|(_, o)| o.lost > 0 || o.error.is_some())
    }

    /// The `lost` object of `--json` reports.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "outputs": self.outputs.iter().map(|(p, o)| serde_json::json!({
                "path": p,
                "packets_written": o.written,
                "packets_lost": o.lost,
                "error": o.error,
            })).collect::<Vec<_>>(),
            "exports_not_written": self.exports.iter().map(|(nf, p, e)| serde_json::json!({
                "nf": nf,
                "path": p,
                "error": e,
            })).collect::<Vec<_>>(),
        })
    }

    /// Text report lines, one per loss (none when nothing was lost).
    pub fn lines(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (p, o) in &self.outputs {
            if o.lost > 0 || o.error.is_some() {
                v.push(format!(
                    "lost         --output {p}: {} packets not written ({} written; {})",
                    o.lost,
                    o.written,
                    o.error.as_deref().unwrap_or("unencodable timestamps")
                ));
            }
        }
        for (nf, p, e) in &self.exports {
            v.push(format!("lost         --export {nf}={p} not written ({e})"));
        }
        v
    }

    /// Exit status 1 with one summary line when something was lost.
    pub fn into_result(self) -> Result<(), CliError> {
        if !self.any() {
            return Ok(());
        }
        let packets: u64 = self.outputs.iter().map(|(_, o)| o.lost).sum();
        Err(CliError::incomplete(format!(
            "results incomplete: {packets} packets not written to the output, {} export(s) not written",
            self.exports.len()
        )))
    }
}

//! Progress on long steps: loading or generating a trace, writing or reading a
//! session file, a benchmark's rounds. A bar (an `indicatif` bar on stderr) is
//! drawn only when stderr is a terminal and the command line did not say
//! `--quiet`, so pipes, files and tests never see a byte of it.
//!
//! Lines a command prints while a bar may be up (a benchmark's rows) go through
//! [`note`], which prints them above the bar and drops them under `--quiet`.
//!
//! Cost: a hidden [`Progress`] is `None`; callers update a shown one every few
//! thousand items, never per packet on a hot path.

use std::borrow::Cow;
use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// The bar drawn now (at most one at a time), so [`note`] can print above it.
static CURRENT: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// How often a spinner redraws itself while its step blocks (parsing a file).
const SPIN: Duration = Duration::from_millis(120);

/// `--quiet`: no bars, no status lines, no [`note`]s (errors still print).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether bars and status lines are drawn: stderr is a terminal and not `--quiet`.
pub fn shown() -> bool {
    !quiet() && std::io::stderr().is_terminal()
}

/// What a bar counts (its template's units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes of a file (shown as KiB/MiB/GiB).
    Bytes,
    /// Packets.
    Packets,
    /// Sessions.
    Sessions,
    /// Rounds of a benchmark (`--reps`).
    Rounds,
    /// Runs of an experiment (`flowplane sweep`).
    Runs,
}

impl Unit {
    fn template(self) -> &'static str {
        match self {
            Unit::Bytes => "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
            Unit::Packets => "{msg} [{bar:30}] {human_pos}/{human_len} packets ({rate}, {eta} left)",
            Unit::Sessions => "{msg} [{bar:30}] {human_pos}/{human_len} sessions ({eta} left)",
            Unit::Rounds => "{msg} [{bar:30}] round {pos}/{len} ({elapsed} elapsed, {eta} left)",
            Unit::Runs => "{msg} [{bar:30}] run {pos}/{len} ({elapsed} elapsed, {eta} left)",
        }
    }
}

/// One long step's bar (or spinner); hidden unless [`shown`]. Cleared when dropped.
#[derive(Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `total` units, titled `what`.
    pub fn bar(what: impl Into<Cow<'static, str>>, total: u64, unit: Unit) -> Progress {
        if !shown() {
            return Progress::default();
        }
        Progress::start(|| {
            let style = ProgressStyle::with_template(unit.template()).unwrap_or_else(|_| ProgressStyle::default_bar());
            // `{rate}`: items per second with a k/M/G suffix, as flowplane prints rates ("2.46 Mpps").
            let style = style.with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let r = s.per_sec();
                let _ = match r {
                    r if r >= 1e6 => write!(w, "{:.2} Mpps", r / 1e6),
                    r if r >= 1e3 => write!(w, "{:.1} kpps", r / 1e3),
                    r => write!(w, "{r:.0} pps"),
                };
            });
            ProgressBar::new(total).with_style(style.progress_chars("=> ")).with_message(what)
        })
    }

    /// A spinner with the elapsed time, for a step whose length is unknown (parsing a file in one call).
    pub fn spinner(what: impl Into<Cow<'static, str>>) -> Progress {
        if !shown() {
            return Progress::default();
        }
        Progress::start(|| {
            let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let b = ProgressBar::new_spinner().with_style(style).with_message(what);
            b.enable_steady_tick(SPIN);
            b
        })
    }

    /// Draws `bar` unless one is up already: a step inside a longer one (a trace loaded within a benchmark round)
    /// is part of the outer bar, not a second bar fighting it for the line.
    fn start(make: impl FnOnce() -> ProgressBar) -> Progress {
        let Ok(mut c) = CURRENT.lock() else { return Progress::default() };
        if c.is_some() {
            return Progress::default();
        }
        let bar = make();
        *c = Some(bar.clone());
        Progress { bar: Some(bar) }
    }

    /// Whether anything is drawn (callers may skip computing positions otherwise).
    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// Moves to `pos` units done.
    pub fn set(&self, pos: u64) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
        }
    }

    /// Adds `n` units done.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Changes the title (e.g. the row being measured).
    pub fn message(&self, msg: impl Into<Cow<'static, str>>) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
            if let Ok(mut c) = CURRENT.lock() {
                *c = None;
            }
        }
    }
}

/// Shows `msg` as the title of the bar drawn now, if any (the row a benchmark measures).
pub fn status(msg: impl Into<Cow<'static, str>>) {
    if let Some(b) = CURRENT.lock().ok().and_then(|c| c.clone()) {
        b.set_message(msg);
    }
}

/// An informational line on stderr (a benchmark's row as it is measured): above the bar if one is drawn, nothing
/// under `--quiet`.
pub fn note(line: &str) {
    if quiet() {
        return;
    }
    let bar = CURRENT.lock().ok().and_then(|c| c.clone());
    match bar {
        Some(b) => b.suspend(|| eprintln!("{line}")),
        None => eprintln!("{line}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests run with stderr captured (not a terminal): every bar is hidden, so nothing is drawn and updates cost
    /// nothing.
    #[test]
    fn hidden_when_stderr_is_not_a_terminal_or_quiet() {
        if !std::io::stderr().is_terminal() {
            let p = Progress::bar("x", 10, Unit::Packets);
            assert!(!p.is_shown());
            p.set(5);
        }
        set_quiet(true);
        assert!(!shown() && !Progress::spinner("y").is_shown());
        set_quiet(false);
    }
}

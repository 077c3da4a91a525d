//! Loading traffic into the replay source: from a trace file or straight
//! from the generator, through the dispatch stage (RSS) into per-queue streams
//! (a progress bar on a terminal: a large trace takes seconds to minutes).

use std::path::Path;
use std::sync::Arc;

use flowplane_io::replay::{ReplayBuilder, ReplayError, ReplayTrace};
use flowplane_scale::fragsteer::FragSteer;
use flowplane_scale::steer::Classifier;
use flowplane_scale::Dispatch;
use flowplane_trace::gen::Generator;
use flowplane_trace::progress::{Progress, Unit};
use flowplane_trace::{TraceReader, UnparsedCounts};
use serde::Serialize;

use crate::error::EngineError;

/// Packets between two updates of a progress bar.
const PROGRESS_EVERY: u64 = 1 << 16;

/// What loading saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LoadStats {
    /// Frames loaded.
    pub packets: u64,
    /// Frame bytes loaded.
    pub bytes: u64,
    /// Frames the dispatcher could not classify (non-IP, malformed): sent to queue 0, hash 0.
    pub unclassified: u64,
    /// Frames skipped because they were empty or longer than the replay's limit.
    pub skipped: u64,
    /// Trace records and packets that could not be read (bad records, packets with no Ethernet form), by reason.
    pub unparsed: UnparsedCounts,
}

/// How frames are spread at load.
#[derive(Clone, Copy)]
pub enum Spread<'a> {
    /// Split into static per-queue streams (a NIC whose table never changes).
    Split(&'a dyn Dispatch),
    /// One stream in arrival order with a steering key per packet: the
    /// run-time NIC ([`flowplane_io::nic`]) picks the queue at receive.
    Steered(&'a Classifier),
}

/// Accumulates frames through a dispatcher.
struct Loader<'a> {
    builder: ReplayBuilder,
    spread: Spread<'a>,
    stats: LoadStats,
    /// Later fragments go where their first fragment went (`flowplane_scale::fragsteer`).
    frags: FragSteer,
}

impl<'a> Loader<'a> {
    fn new(spread: Spread<'a>) -> Self {
        let queues = match spread {
            Spread::Split(d) => d.queues(),
            Spread::Steered(_) => 1,
        };
        Loader { builder: ReplayBuilder::new(queues), spread, stats: LoadStats::default(), frags: FragSteer::new() }
    }

    fn push(&mut self, frame: &[u8], ts_ns: u64) -> Result<(), EngineError> {
        let qh = match self.spread {
            Spread::Split(d) => d.classify(frame),
            Spread::Steered(c) => c.classify(frame),
        };
        let (q, h) = match qh {
            Some(qh) => self.frags.follow(frame, qh),
            None => {
                self.stats.unclassified += 1;
                (0, 0)
            }
        };
        let pushed = match self.spread {
            Spread::Split(_) => self.builder.push(q as usize, frame, h, ts_ns),
            Spread::Steered(_) => self.builder.push_steered(frame, h, ts_ns, q),
        };
        match pushed {
            Ok(()) => {
                self.stats.packets += 1;
                self.stats.bytes += frame.len() as u64;
                Ok(())
            }
            Err(ReplayError::Empty | ReplayError::TooLong(_)) => {
                self.stats.skipped += 1;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn finish(self) -> (Arc<ReplayTrace>, LoadStats) {
        (self.builder.build(), self.stats)
    }
}

/// Loads a pcap/pcapng file (any supported link type, presented as Ethernet).
/// `limit` caps the number of packets read.
pub fn load_trace(
    path: &Path,
    dispatch: &dyn Dispatch,
    limit: Option<u64>,
) -> Result<(Arc<ReplayTrace>, LoadStats), EngineError> {
    load_trace_with(path, Spread::Split(dispatch), limit)
}

/// [`load_trace`] spreading as `spread` says.
pub fn load_trace_with(
    path: &Path,
    spread: Spread<'_>,
    limit: Option<u64>,
) -> Result<(Arc<ReplayTrace>, LoadStats), EngineError> {
    let mut reader = TraceReader::open(path)?;
    let mut loader = Loader::new(spread);
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    // A 64-byte frame costs ~80 bytes of file: reserve for that density.
    loader.builder.reserve((size / 80) as usize, 64);
    let bar = Progress::bar(format!("loading {}", path.display()), size, Unit::Bytes);
    let mut scratch = Vec::new();
    let mut n = 0u64;
    while limit.is_none_or(|l| loader.stats.packets < l) {
        // Bad records and packets are counted by the reader, never the end of the run.
        let Some(pkt) = reader.next_frame(&mut scratch)? else { break };
        loader.push(pkt.data, pkt.ts_ns)?;
        n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            bar.set(reader.offset());
        }
    }
    loader.stats.unparsed = *reader.unparsed();
    Ok(loader.finish())
}

/// Runs the generator straight into memory.
pub fn load_generated(gen: Generator, dispatch: &dyn Dispatch) -> Result<(Arc<ReplayTrace>, LoadStats), EngineError> {
    load_generated_with(gen, Spread::Split(dispatch))
}

/// [`load_generated`] spreading as `spread` says.
pub fn load_generated_with(
    mut gen: Generator,
    spread: Spread<'_>,
) -> Result<(Arc<ReplayTrace>, LoadStats), EngineError> {
    let mut loader = Loader::new(spread);
    loader.builder.reserve(gen.remaining() as usize, 64);
    let bar = Progress::bar("generating", gen.remaining(), Unit::Packets);
    let mut buf = Vec::with_capacity(2048);
    let mut n = 0u64;
    while let Some(ts) = gen.next_frame(&mut buf) {
        loader.push(&buf, ts)?;
        n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            bar.set(n);
        }
    }
    Ok(loader.finish())
}

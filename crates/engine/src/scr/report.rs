//! What SCR reports: per core (sequence reached, replica digest, fast-forward
//! and loss counters) and for the run (the text lines and JSON section).

use flowplane_nf::stateful::{ScrFields, ScrRecord};
use serde::Serialize;

/// What one core's replica did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrCoreReport {
    /// Core.
    pub core: usize,
    /// Highest sequence number applied.
    pub max_seq: u64,
    /// The replica caught up to the stream's end (a bounded run that ran to completion).
    pub reached_end: bool,
    /// Digest of the replica's state (equal on every core when consistent).
    pub digest: u64,
    /// History entries fast-forwarded (applied without a verdict).
    pub fast_forwarded: u64,
    /// Own packets processed.
    pub own: u64,
    /// Sampled: fast-forward cycles and the own packets they covered.
    pub ff_cycles_sampled: u64,
    /// Own packets in the sampled batches.
    pub ff_packets_sampled: u64,
    /// Sampled: cycles of the own packets' actions (every NF, the same batches).
    pub own_cycles_sampled: u64,
    /// Cycles the sequencer spent on this core's packets (the NIC's or switch's work).
    pub seq_cycles: u64,
    /// Packets this core lost between the sequencer and itself (injected).
    pub lost: u64,
    /// Sequence numbers missing from the history a core received (lost packets' coverage).
    pub gaps: u64,
    /// Missing entries recovered from other cores' logs.
    pub recovered: u64,
    /// Missing entries every other core had lost too (skipped everywhere, consistently).
    pub lost_everywhere: u64,
    /// Missing entries skipped: no recovery, or not recoverable (the replica may diverge).
    pub unrecovered: u64,
    /// This core's own packets a replica table had no room for (full with
    /// live keys), per table: summed over cores, each refused packet once (as `table_full` under rss).
    pub table_full: u64,
    /// Passes over a full table removing idle entries (deterministic: the same records on every core).
    pub sweeps: u64,
    /// Keys the replica tables hold at the end (every replica the same).
    pub entries: u64,
    /// Keys the replica tables hold at most (`--flows` per table).
    pub capacity: u64,
    /// Keys inserted (new, or idle past the timeout and started over).
    pub insertions: u64,
    /// Keys removed idle, or started over.
    pub expiries: u64,
    /// Times logging waited for the slowest core to come within the log size (recovery on).
    pub drift_waits: u64,
    /// Cycles those waits took.
    pub drift_wait_cycles: u64,
}

impl ScrCoreReport {
    /// The replica tables' counters add up: `entries + expiries == insertions`
    /// (nothing else removes a key: no flow ends, no eviction, no hand-over).
    pub fn conserved(&self) -> bool {
        self.entries + self.expiries == self.insertions
    }
}

/// The SCR section of a report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrReport {
    /// Records piggybacked per packet (N).
    pub history: usize,
    /// Fields the records carry for this chain.
    pub fields: Vec<&'static str>,
    /// Bytes a sequencer would prefix to each packet: N records of the
    /// declared fields, a 2-byte index of the earliest, an 8-byte sequence number.
    pub history_bytes_per_packet: usize,
    /// Bytes each core copies per packet here (N fixed 32-byte records).
    pub copied_bytes_per_packet: usize,
    /// Fast-forward cycles per own packet (sampled batches, run packet by
    /// packet to time the two apart; catch-up and logging): an upper bound
    /// of the batch path's, which takes a heavy flow's records and packet in
    /// one scan (its cost shows in the workers' cycles and the projection).
    pub ff_cycles_per_packet: f64,
    /// History entries fast-forwarded per own packet.
    pub ff_entries_per_packet: f64,
    /// Own packet's actions (every NF), cycles per packet (the same sampled batches).
    pub own_cycles_per_packet: f64,
    /// The sequencer's cycles per packet (stamping, history; the NIC's work, not in the workers' figures).
    pub seq_cycles_per_packet: f64,
    /// Loss recovery (logs, Algorithm 1) on.
    pub recovery: bool,
    /// Injected loss rate.
    pub loss: f64,
    /// Every core's replica digest is the same.
    pub consistent: bool,
    /// The run had a known end (loops), so every replica caught up to it and the digests are comparable.
    pub comparable: bool,
    /// Per core.
    pub cores: Vec<ScrCoreReport>,
}

impl ScrReport {
    /// Sums the cores' reports.
    pub fn new(history: usize, fields: ScrFields, recovery: bool, loss: f64, cores: Vec<ScrCoreReport>) -> ScrReport {
        let comparable = cores.iter().all(|c| c.reached_end);
        let own: u64 = cores.iter().map(|c| c.own).sum();
        let ff: u64 = cores.iter().map(|c| c.fast_forwarded).sum();
        let (cy, pk) = cores.iter().fold((0, 0), |a, c| (a.0 + c.ff_cycles_sampled, a.1 + c.ff_packets_sampled));
        let owncy: u64 = cores.iter().map(|c| c.own_cycles_sampled).sum();
        let seqcy: u64 = cores.iter().map(|c| c.seq_cycles).sum();
        let consistent = cores.windows(2).all(|w| w[0].digest == w[1].digest && w[0].max_seq == w[1].max_seq);
        ScrReport {
            history,
            fields: fields.names(),
            history_bytes_per_packet: history * fields.wire_bytes() + 2 + 8,
            copied_bytes_per_packet: history * std::mem::size_of::<ScrRecord>(),
            ff_cycles_per_packet: if pk > 0 { cy as f64 / pk as f64 } else { 0.0 },
            ff_entries_per_packet: if own > 0 { ff as f64 / own as f64 } else { 0.0 },
            own_cycles_per_packet: if pk > 0 { owncy as f64 / pk as f64 } else { 0.0 },
            seq_cycles_per_packet: if own > 0 { seqcy as f64 / own as f64 } else { 0.0 },
            recovery,
            loss,
            consistent,
            comparable,
            cores,
        }
    }

    /// Text lines for the report.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "scr          history N={} ({}): {} B/packet on a wire, {} B copied; fast-forward {:.1} cycles/packet sampled ({:.2} entries/packet); recovery {}, loss {}",
            self.history,
            self.fields.join("+"),
            self.history_bytes_per_packet,
            self.copied_bytes_per_packet,
            self.ff_cycles_per_packet,
            self.ff_entries_per_packet,
            if self.recovery { "on" } else { "off" },
            self.loss
        )];
        let per_entry = if self.ff_entries_per_packet > 0.0 {
            format!(" ({:.1}/entry)", self.ff_cycles_per_packet / self.ff_entries_per_packet)
        } else {
            String::new()
        };
        v.push(format!(
            "scr cycles   per packet: sequencer {:.1} (NIC side), fast-forward {:.1}{}, own packet {:.1} (TSC, sampled batches run packet by packet: an upper bound, the batch path fuses a heavy flow's records and packet)",
            self.seq_cycles_per_packet, self.ff_cycles_per_packet, per_entry, self.own_cycles_per_packet
        ));
        let digests: Vec<String> = self.cores.iter().map(|c| format!("{:016x}", c.digest)).collect();
        let verdict = match (self.comparable, self.consistent) {
            (false, _) => "not comparable (run stopped by time: replicas at different points)",
            (true, true) => "identical",
            (true, false) => "DIVERGED",
        };
        v.push(format!("scr replicas {verdict}: {}", digests.join(" ")));
        let sum = |f: fn(&ScrCoreReport) -> u64| self.cores.iter().map(f).sum::<u64>();
        v.push(format!(
            "scr loss     {} lost, {} gaps: {} recovered, {} lost everywhere, {} unrecovered; {} table-full; {} drift waits",
            sum(|c| c.lost),
            sum(|c| c.gaps),
            sum(|c| c.recovered),
            sum(|c| c.lost_everywhere),
            sum(|c| c.unrecovered),
            sum(|c| c.table_full),
            sum(|c| c.drift_waits)
        ));
        v
    }
}

//! Sinks: where a worker's processed batches go.

use std::fs::File;
use std::sync::{Arc, Mutex};

use flowplane_packet::{Batch, PacketPool, DROP};
use flowplane_trace::PcapWriter;

use crate::{Sink, TxCounters};

/// Frees every packet, counting what would have been sent: the I/O baseline's sink.
#[derive(Debug, Default)]
pub struct Discard;

impl Sink for Discard {
    #[inline]
    fn tx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> TxCounters {
        let mut c = TxCounters::default();
        for (&v, &len) in batch.verdicts().iter().zip(batch.lens()) {
            let live = (v != DROP) as u64;
            c.sent += live;
            c.bytes += live * len as u64;
        }
        c.dropped = batch.len() as u64 - c.sent;
        // A batch always belongs to its worker's pool; a mismatch would be a
        // wiring bug, reported as errors rather than a panic.
        if batch.free_all(pool).is_err() {
            c.errors = c.sent + c.dropped;
        }
        c
    }
}

/// A pcap file shared by every worker: one lock per batch, never per packet.
pub type SharedPcapWriter = Arc<Mutex<PcapWriter<File>>>;

/// What timestamps a [`PcapSink`] writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stamp {
    /// The packet's own time (`Batch::timestamps`) after `base_ns`: a
    /// replayed capture keeps its timestamps.
    Packet {
        /// Absolute time (ns) of packet time 0.
        base_ns: u64,
    },
    /// The wall-clock time of transmission: `epoch_ns` at TSC `tsc0`.
    Transmit {
        /// TSC reading at `epoch_ns`.
        tsc0: u64,
        /// Wall clock (ns since the Unix epoch) at `tsc0`.
        epoch_ns: u64,
        /// TSC ticks per second.
        tsc_hz: f64,
    },
}

/// Writes live packets to a pcap file, stamped as [`Stamp`] says. Packets the
/// writer refuses (it stopped at its first failed write) count as errors; the
/// writer itself knows which packets were lost (`PcapWriter::close`).
/// [`PcapSink::by_verdict`]: one file per output port (verdict `i` to file
/// `i`, a replay's `--output` and `--port` files); a verdict with no file
/// counts as dropped.
pub struct PcapSink {
    writers: Vec<SharedPcapWriter>,
    /// Verdict i goes to `writers[i]` (else every live packet to `writers[0]`).
    by_verdict: bool,
    stamp: Stamp,
}

impl PcapSink {
    /// A sink writing every live packet into `writer`.
    pub fn new(writer: SharedPcapWriter, stamp: Stamp) -> Self {
        PcapSink { writers: vec![writer], by_verdict: false, stamp }
    }

    /// A sink writing packets with verdict `i` into `writers[i]`.
    pub fn by_verdict(writers: Vec<SharedPcapWriter>, stamp: Stamp) -> Self {
        PcapSink { writers, by_verdict: true, stamp }
    }

    /// The file index of verdict `v` (None: dropped, or no file for its port).
    #[inline]
    fn file_of(&self, v: u16) -> Option<usize> {
        match (v, self.by_verdict) {
            (DROP, _) => None,
            (_, false) => Some(0),
            (v, true) => ((v as usize) < self.writers.len()).then_some(v as usize),
        }
    }
}

impl Sink for PcapSink {
    fn tx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> TxCounters {
        let dropped = batch.verdicts().iter().filter(|&&v| self.file_of(v).is_none()).count() as u64;
        let mut c = TxCounters { dropped, ..TxCounters::default() };
        let now = match self.stamp {
            Stamp::Packet { .. } => 0,
            Stamp::Transmit { tsc0, epoch_ns, tsc_hz } => {
                let ticks = flowplane_packet::tsc::rdtsc().saturating_sub(tsc0);
                epoch_ns + (ticks as f64 * 1e9 / tsc_hz.max(1.0)) as u64
            }
        };
        for (k, writer) in self.writers.iter().enumerate() {
            let mine = |i: usize| self.file_of(batch.verdicts()[i]) == Some(k);
            let n = (0..batch.len()).filter(|&i| mine(i)).count() as u64;
            if n == 0 {
                continue;
            }
            // One lock per file and batch, never per packet. A poisoned lock means another
            // worker panicked mid-write; count this batch's packets as errors instead of panicking.
            let Ok(mut w) = writer.lock() else {
                c.errors += n;
                continue;
            };
            for i in (0..batch.len()).filter(|&i| mine(i)) {
                let data = batch.data(i);
                let ts = match self.stamp {
                    Stamp::Packet { base_ns } => base_ns.saturating_add(batch.timestamps()[i]),
                    Stamp::Transmit { .. } => now,
                };
                match w.write_packet(ts, data, data.len() as u32) {
                    Ok(()) => {
                        c.sent += 1;
                        c.bytes += data.len() as u64;
                    }
                    Err(_) => c.errors += 1,
                }
            }
        }
        if batch.free_all(pool).is_err() {
            c.errors += c.sent + c.dropped;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::PoolConfig;

    #[test]
    fn pcap_by_verdict_writes_each_port_to_its_file() {
        let dir = std::env::temp_dir().join(format!("flowplane-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |n: &str| -> SharedPcapWriter {
            Arc::new(Mutex::new(PcapWriter::create(&dir.join(n), Default::default()).unwrap()))
        };
        let ws = vec![open("p0.pcap"), open("p1.pcap")];
        let mut sink = PcapSink::by_verdict(ws.clone(), Stamp::Packet { base_ns: 0 });
        let mut pool = PacketPool::new(PoolConfig { buffers: 8, ..Default::default() }).unwrap();
        let mut b = Batch::new(&pool);
        for k in 0..5u8 {
            assert!(b.push_copy(&mut pool, &[k; 60], 0));
        }
        // Verdicts 1, 0, drop, 1, 7 (no file: dropped).
        b.verdicts_mut().copy_from_slice(&[1, 0, DROP, 1, 7]);
        let c = sink.tx_burst(&mut pool, &mut b);
        assert_eq!((c.sent, c.dropped, c.errors), (3, 2, 0));
        assert_eq!(pool.stats().free, 8);
        drop(sink);
        let written: Vec<u64> =
            ws.into_iter().map(|w| Arc::try_unwrap(w).ok().unwrap().into_inner().unwrap().close().written).collect();
        assert_eq!(written, vec![1, 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn discard_counts_and_frees() {
        let mut pool = PacketPool::new(PoolConfig { buffers: 8, ..Default::default() }).unwrap();
        let mut b = Batch::new(&pool);
        for _ in 0..4 {
            assert!(b.push_copy(&mut pool, &[0; 60], 0));
        }
        b.drop_packet(2);
        let c = Discard.tx_burst(&mut pool, &mut b);
        assert_eq!((c.sent, c.dropped, c.bytes, c.errors), (3, 1, 180, 0));
        assert!(b.is_empty());
        assert_eq!(pool.stats().free, 8);
    }
}

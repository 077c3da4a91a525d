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
pub struct PcapSink {
    writer: SharedPcapWriter,
    stamp: Stamp,
}

impl PcapSink {
    /// A sink writing into `writer`.
    pub fn new(writer: SharedPcapWriter, stamp: Stamp) -> Self {
        PcapSink { writer, stamp }
    }
}

impl Sink for PcapSink {
    fn tx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> TxCounters {
        let mut c = TxCounters::default();
        {
            // A poisoned lock means another worker panicked mid-write; count
            // this batch as errors instead of propagating the panic.
            match self.writer.lock() {
                Ok(mut w) => {
                    let now = match self.stamp {
                        Stamp::Packet { .. } => 0,
                        Stamp::Transmit { tsc0, epoch_ns, tsc_hz } => {
                            let ticks = flowplane_packet::tsc::rdtsc().saturating_sub(tsc0);
                            epoch_ns + (ticks as f64 * 1e9 / tsc_hz.max(1.0)) as u64
                        }
                    };
                    for i in 0..batch.len() {
                        if batch.is_dropped(i) {
                            c.dropped += 1;
                            continue;
                        }
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
                Err(_) => c.errors = batch.len() as u64,
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

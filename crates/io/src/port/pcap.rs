//! `pcap:FILE` (or a bare path): a capture file. Not a live port: as input
//! it is replayed (the emulated NIC); as an output port ([`PcapPort`]) a
//! run writes the packets its chain sends there, with their receive times.

use std::sync::Arc;

use flowplane_packet::{Batch, Verdict};

use super::{Port, PortCaps, PortError, PortInfo, PortOptions, PortSpec, QueueCounters, RxQueue, TxQueue};
use crate::sink::SharedPcapWriter;

/// Registration (see [`super::PORTS`]); the first kind: a bare path is a pcap file.
pub const INFO: PortInfo = PortInfo {
    name: "pcap",
    syntax: "pcap:FILE",
    about: "a pcap/pcapng file (or a bare path): replayed as input, written as output",
    caps: PortCaps {
        live: false,
        kernel_steering: false,
        peer: false,
        once_per_process: false,
        needs_root: false,
        options: &[],
        missing: None,
    },
    parse: |arg| if arg.is_empty() { Err("expected pcap:FILE".into()) } else { Ok(arg.to_string()) },
    open,
};

fn open(spec: &PortSpec, _queues: usize, _opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    Err(PortError::Unsupported(format!("{}: a pcap file is replayed or written, not opened as a live port", spec.arg())))
}

/// A pcap file as an output port (a live input's packets written with
/// their receive times after `base_ns`).
pub struct PcapPort {
    path: String,
    writer: SharedPcapWriter,
    base_ns: u64,
    counters: Vec<Arc<QueueCounters>>,
}

impl PcapPort {
    /// An output port over `writer` for `queues` workers; packet time 0 is `base_ns` (ns since the epoch).
    pub fn new(path: &str, writer: SharedPcapWriter, base_ns: u64, queues: usize) -> Self {
        PcapPort {
            path: path.to_string(),
            writer,
            base_ns,
            counters: (0..queues).map(|_| Arc::new(QueueCounters::default())).collect(),
        }
    }
}

impl Port for PcapPort {
    fn name(&self) -> String {
        format!("pcap:{}", self.path)
    }

    fn queues(&self) -> usize {
        self.counters.len()
    }

    fn open_rx(&self, _q: usize) -> Result<Box<dyn RxQueue>, PortError> {
        Err(PortError::Unsupported(format!("pcap:{}: an output file cannot be received from", self.path)))
    }

    fn open_tx(&self, _q: usize) -> Result<Box<dyn TxQueue>, PortError> {
        Ok(Box::new(PcapTx { writer: self.writer.clone(), base_ns: self.base_ns }))
    }

    fn counters(&self) -> &[Arc<QueueCounters>] {
        &self.counters
    }
}

/// A worker's handle on a shared pcap output: one lock per batch.
struct PcapTx {
    writer: SharedPcapWriter,
    base_ns: u64,
}

impl TxQueue for PcapTx {
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
        let (mut sent, mut bytes, mut lost) = (0, 0, 0);
        let Ok(mut w) = self.writer.lock() else {
            return (0, 0, batch.verdicts().iter().filter(|&&v| v == port).count() as u64);
        };
        for (i, &v) in batch.verdicts().iter().enumerate() {
            if v != port {
                continue;
            }
            let d = batch.data(i);
            match w.write_packet(self.base_ns.saturating_add(batch.timestamps()[i]), d, d.len() as u32) {
                Ok(()) => {
                    sent += 1;
                    bytes += d.len() as u64;
                }
                Err(_) => lost += 1,
            }
        }
        (sent, bytes, lost)
    }
}


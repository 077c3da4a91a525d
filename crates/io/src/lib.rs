//! `flowplane-io`: packet sources and sinks, and CPU placement.
//!
//! - [`replay`]: the in-memory replay source — a trace preloaded compactly,
//!   split into per-queue streams by an RSS stage as a NIC would, and copied
//!   into recycled pool buffers on every receive (the NIC's DMA), in a loop,
//!   at full speed or paced.
//! - [`sink`]: where processed batches go (discard, pcap file).
//! - [`cpu`]: pinning worker threads to cores.
//!
//! - [`dispatch`]: the software dispatcher that steers a live port's packets
//!   to workers by the run's table (spray, flow-director rules) where the port cannot.
//! - [`steered`]: a worker's source on a queue the kernel steers by flowplane's
//!   table (AF_PACKET fanout program), with RETA moves and state hand-over.
//! - [`port`]: real ports, a registry of kinds (`PORTS`: pcap, AF_PACKET, AF_XDP, DPDK)
//!   behind the same [`Source`]/[`Sink`] traits.
//!
//! No `unsafe` outside [`cpu`] (the affinity system calls) and [`port`]
//! (socket options, the mmap'ed rings).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod cpu;
pub mod dispatch;
pub mod nic;
#[allow(unsafe_code)]
pub mod port;
pub mod replay;
pub mod scr;
pub mod sink;
pub mod steered;

use flowplane_packet::{Batch, PacketPool};
use flowplane_scale::steer::Move;

/// What one receive call produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rx {
    /// `n > 0` packets were appended to the batch.
    Packets(usize),
    /// Nothing now (pacing, or an idle port); call again.
    Idle,
    /// The source is exhausted (loop or packet limit reached).
    Done,
}

/// A packet source for one queue, owned by one worker core.
pub trait Source: Send {
    /// Appends up to `batch.room()` packets (never more than `max`) taken
    /// from `pool`. `now` is the worker's TSC reading for this burst.
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now: u64) -> Rx;

    /// Every queue of the port is ready: `tsc` is when the port's (paced) traffic starts.
    fn start(&mut self, _tsc: u64) {}

    /// Paced sources: when a packet of time `ts_ns` arrived at the port, as
    /// `start_tsc + ts_ns * ticks_per_ns` (for receive-to-transmit latency
    /// including the wait in the ring); None at full speed.
    fn arrival_clock(&self) -> Option<(u64, f64)> {
        None
    }

    /// SCR (`--scale scr`): the sequence numbers and piggybacked histories
    /// of the last burst's packets, in batch order; None without a sequencer.
    fn scr_side(&self) -> Option<scr::ScrSide<'_>> {
        None
    }

    /// SCR: packets lost (injected) between the sequencer and this queue.
    fn scr_lost(&self) -> u64 {
        0
    }

    /// A live source's packet clock now (its packets' timestamp units): a worker whose
    /// source is idle advances its timers (expiry, NF sweeps) to it. None for replays,
    /// whose time is the trace's and advances only with its packets.
    fn clock_ns(&self) -> Option<u64> {
        None
    }

    /// Receive-side counters (NIC emulation, ring drops); zero for sources without them.
    fn rx_stats(&self) -> RxStats {
        RxStats::default()
    }

    /// A steering move whose state this queue must hand over now: every
    /// packet of its key before the switch point has been delivered and the
    /// caller has processed what it received. Call after each batch.
    fn take_due(&mut self) -> Option<Move> {
        None
    }
}

/// Receive-side counters of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxStats {
    /// Packets delivered.
    pub packets: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Stream positions the NIC emulation examined for this queue.
    pub scanned: u64,
    /// Packets steered here that found the descriptor ring full (dropped).
    pub rx_ring_full: u64,
    /// TSC cycles the NIC emulation spent steering (not the worker's work).
    pub nic_cycles: u64,
    /// Walks held back at a moving key's packet until its state arrived
    /// (only when more than the parking room of such packets wait).
    pub stalls: u64,
    /// Packets of a moving key held aside until its state arrived, the walk going on for the other keys.
    pub parked: u64,
    /// Bursts cut short because the pool was empty.
    pub pool_empty: u64,
}

/// A packet sink for one queue. It consumes the batch: every buffer —
/// forwarded or dropped — goes back to `pool`, and the batch is left empty.
pub trait Sink: Send {
    /// Transmits the batch's live packets and frees all its buffers.
    fn tx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> TxCounters;
}

/// Per-call transmit counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxCounters {
    /// Packets sent (verdict != DROP).
    pub sent: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets dropped (verdict == DROP) and freed.
    pub dropped: u64,
    /// Packets the sink could not write (I/O error); counted, freed.
    pub errors: u64,
}

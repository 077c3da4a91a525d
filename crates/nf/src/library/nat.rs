//! `nat`: source NAT (NAPT, NAT44) with a port pool per external address.
//!
//! This module owns the NAT NF: its configuration, its per-flow state, the
//! preallocated port pools, the NF-private reverse map that joins the two
//! directions of a translated connection, and the TIME_WAIT queue of TCP
//! ports whose connection closed.
//!
//! * **Outbound** (source inside `internal`, TCP/UDP): the flow's first packet
//!   takes an (external address, external port) slot from the protocol's pool
//!   (a FIFO free list, so a released port is reused as late as possible);
//!   every packet of the flow gets its source address and port rewritten, with
//!   the IPv4 and TCP/UDP checksums updated incrementally.
//! * **Mapping behaviour** (RFC 4787 section 4.1): every outbound 5-tuple gets
//!   its own external port, so two connections from one inside address and
//!   port to different remotes use different external ports — in RFC 4787's
//!   terms *address and port-dependent mapping* (a "symmetric" NAT), not
//!   endpoint-independent mapping. Each mapping therefore has exactly one
//!   remote endpoint: the destination of the outbound flow that created it.
//! * **Inbound** (destination one of the external addresses, TCP/UDP): the
//!   reply direction is a different 5-tuple, so it has its own flow state. Its
//!   first packet looks up the reverse map `(address index, port) -> (inside
//!   address, inside port, remote, generation)`; an unmapped port is dropped
//!   and counted without keeping state (a port scan must not fill the flow
//!   table). A mapped port is then filtered (`filter=`, RFC 4787 section 5):
//!   `eif` (endpoint-independent) lets any remote in; `adf`
//!   (address-dependent) only the mapping's remote address, from any port;
//!   `apdf` (address and port-dependent, the default and the safe choice) only
//!   the remote address and port the mapping sent to. A filtered packet is
//!   dropped and counted (`dropped_filtered`) without keeping state; one that
//!   passes is translated back (destination rewritten).
//! * **Idle timeout** (`timeout=`, on the packet clock): a mapping's clock is
//!   the time of the last outbound packet translated with it (replies do not
//!   refresh it, as RFC 4787 allows). At a packet of time `t`, a mapping whose
//!   last outbound packet was at `l` is *live* while `t - l <= timeout` and
//!   *free* once `t - l > timeout` — decided when the packet looks it up,
//!   whatever the executor, batch size or expiry sweep did (a last-seen time
//!   in the future after the clock jumped back is rebased to `t`, never
//!   expired early). The executor expiring or ending a flow entry frees
//!   nothing: `nat` declares no release hook (eviction: below).
//! * **Release**: a port is freed by exactly four events: an RST from inside
//!   (at that packet), the end of TIME_WAIT (below), the idle timeout (all on
//!   the packet clock), and the eviction of the outbound flow's entry under
//!   `--table-full evict` (below). Freeing bumps the slot's generation.
//! * **Allocation** (a new outbound flow's first packet): the head of the
//!   free list (ports freed by RST or TIME_WAIT join its tail, so a released
//!   port is reused as late as possible); if the list is empty, the first
//!   mapping idle at that packet's time in slot order from where the last
//!   such search stopped (slot = address index * ports + port offset;
//!   reclaimed, counted `idle_mappings_reclaimed`); if none, the pool is
//!   exhausted. An outbound packet whose flow's mapping is free (idle, or
//!   released after TIME_WAIT) starts a new mapping the same way.
//! * **Inbound packets are judged against the port's current mapping**: an
//!   inbound flow bound to a mapping that is gone (released, reclaimed, idle)
//!   is judged again at each packet against whatever holds the port now — a
//!   new connection to the same remote endpoint (the same inbound 5-tuple)
//!   gets its replies; a packet no live mapping admits is dropped and counted
//!   (`dropped_stale`), keeping the flow's state, so a stale connection never
//!   reaches the port's new owner unless that owner's filter admits it.
//! * **TCP close**: an RST from inside releases the port at once and ends
//!   the outbound flow; an RST from outside ends the inbound flow only (the
//!   port stays with the inside host until it closes too, or idles out). Once
//!   a FIN has been seen in both directions the port is held for
//!   `fin_timeout` seconds more (TIME_WAIT: the last ACK, retransmitted FINs)
//!   and then released — by the first packet the NAT sees at or after the
//!   deadline (`t >= FINs' time + fin_timeout`), before that packet is
//!   handled. After that a later packet of the outbound 5-tuple is a new
//!   connection that needs a new port.
//! * **Pool exhausted**: the new flow's packet is dropped and counted, and no
//!   state is kept, so the next packet of that flow retries the allocation.
//!   Every refusal of a new flow (exhausted, filtered, unmapped, fragment,
//!   `other=drop`) is [`Action::Refuse`]: the flow entry the lookup made for
//!   the packet goes as never inserted (the report's `tables.refused`, not
//!   `insertions` nor `ended`), and a batch goes on past it without a stop, so
//!   a refused packet costs about what a passed one does.
//! * **Other traffic**: ICMP and other protocols from inside or to an external
//!   address are passed untouched (`other=pass`, default) or dropped
//!   (`other=drop`), counted either way; **fragments**: the engine gives a
//!   later fragment its datagram's first-fragment key (`engine::frag`), so it
//!   meets that flow's mapping and is translated alike — its address
//!   rewritten with the IPv4 checksum; it has no transport header, and the
//!   transport checksum, which covers the whole datagram, is updated once in
//!   the first fragment; a later fragment whose flow has no mapping (its first
//!   fragment was refused) has no ports to allocate with and is refused too;
//!   non-first fragments without ports (no first fragment seen on this core:
//!   `tables.fragments.orphans`) in either direction are dropped and counted
//!   (`dropped_fragments`);
//!   traffic that is neither inside-sourced nor addressed to an external
//!   address, and IPv6, pass untouched (counted). Packets without a flow key
//!   (non-IP, malformed: `dropped_unparsed`) and packets without state
//!   because the flow table is full (`dropped_table_full`) are DROPPED: the
//!   NF fails closed, as passing a table-full packet would leak an
//!   untranslated inside address.
//! * **`--table-full evict`** (the flow table reuses the least recently seen
//!   of the new flow's 16 candidate entries): a translated connection is a
//!   pair of entries (outbound, inbound) around one mapping, and the pair
//!   goes together — never half a pair. The mapping lives in the outbound
//!   entry (nothing else can find it from the inside 5-tuple), so evicting
//!   it ends the mapping: the port is freed at once (queued for reuse,
//!   counted `ports_released` and `evicted_mappings`, an RFC 8158 delete),
//!   its generation bumped, so the inbound entry left behind is stale: its
//!   next reply is judged against the port's current holder (dropped,
//!   `dropped_stale`, unless a new mapping to the same remote holds the port
//!   and its filter admits it), and the next outbound packet is a new flow
//!   with a new mapping. Evicting the inbound entry loses nothing: the
//!   mapping stays whole with its outbound entry, and the next reply builds
//!   the inbound entry again from the reverse map (`evicted_inbound`).
//!   Which entries are evicted depends on the batching (a batch looks its
//!   keys up before it runs them), so executors may differ there.
//!
//! **Changing the pool while running** (`flowplane ctl SOCK set nat external
//! A [addrs N]`, or `ctl reload` of a run's config): the new pool (`external`,
//! `addrs`; the other parameters are fixed for the run) lands between two
//! batches and keeps every mapping. A flow mapped before keeps its external
//! address and port, in both directions, even if its address left the pool:
//! such an address is *retired* — inbound packets to it are still judged
//! against its mappings (an unmapped port of it is dropped, `dropped_unmapped`),
//! but its ports are never handed out again: a mapping on it that ends (RST,
//! TIME_WAIT) frees nothing (`retired_mappings_ended`), and one that goes idle
//! stays idle (an outbound flow whose mapping idled out takes a port of the new
//! pool). New flows take ports of the new pool's addresses: an address that
//! stays keeps its mappings and free ports, a new one joins the free list after
//! the ports already queued. The report counts the mappings live on retired
//! addresses (`mappings_on_retired_addrs`) and lists those addresses
//! (`retired_addrs`); an address that comes back into the pool gets its free
//! ports back. Retired addresses keep their slots for the run: the pool with
//! them stays under [`MAX_POOL`] slots per protocol, or the change is refused.
//! On several cores the pool cannot change (each core's replies are steered to
//! it by the pool's addresses and its share of the ports): `ctl` refuses it.
//!
//! With `--ipfix` the NAT logs RFC 8158 events through the engine's exporter:
//! a NAT44 session create when a mapping is allocated (inside 5-tuple,
//! translated address and port), a delete when it ends (an RST from inside,
//! the end of TIME_WAIT — at its deadline —, an idle mapping reclaimed by a new
//! flow, or idle past the timeout by the run's end — at last packet +
//! timeout), and "addresses exhausted" (natPoolID 0 TCP, 1 UDP) at most once
//! per second of packet time per pool and core. Mappings live at the run's
//! end get no delete (the export lists them).
//!
//! Each core builds its own instance with its own pools. The NF declares its
//! pool ([`crate::GlobalState::PortPool`]): on several cores the runtime
//! gives each core a disjoint share of `ports` and programs the NIC's
//! flow-director rules to steer a reply (by destination port) to the core
//! that allocated it; strategies that move flows between cores refuse it.
//! `--export nat=FILE` writes one row per translated flow (`direction` out or
//! in, the 5-tuple, the translated address and port) whose mapping is live at
//! the run's end — the time of the run's last packet, across every core (a
//! replay: the trace's last packet): flows whose mapping was released (RST,
//! TIME_WAIT), reclaimed, or is idle past the timeout then are not listed,
//! nor are dropped flows (stale, filtered, unmapped, exhausted). An inbound
//! row names the mapping's current holder. The report's `tcp_ports_in_use`
//! and `udp_ports_in_use` count the mappings live at that same time, and
//! `tcp_ports_in_time_wait` the ports still in TIME_WAIT then (a TIME_WAIT
//! whose deadline is at or before the end is over and its port released,
//! counted in `time_wait_released`, as the last packet of a one-core run
//! would have released it). So one core and several report the same
//! counts and rows (on several cores, each core's share of the pool gives
//! the translated ports).
//!
//! With `--replicate` (`flowplane_engine::repl`) the NAT pushes an upsert
//! of each outbound flow's state when its mapping is taken, and a delete of
//! the inside 5-tuple whenever a mapping is released (the events that end a
//! session above); a resync walk pushes every outbound flow whose mapping is
//! live. A standby adopts a received state (`repl_adopt`): it takes the
//! same slot of its own pool (same parameters and core share, or refused),
//! with the inside endpoint and remote from the key, its clock set to the
//! standby's packet time; a slot held by another mapping is taken over (its
//! generation bumped), the same mapping again only refreshes its clock. A
//! slot adopted while in the free ring keeps its place there and is skipped
//! when reached (`Mapping::queued`: never queued twice). Inbound flows are
//! not replicated: the first reply on the standby finds the mapping.
//!
//! Cost: every translated packet reads its mapping (outbound ones also
//! write its clock), a second cache line the prefetch hook fetches ahead.

use std::net::{IpAddr, Ipv4Addr};

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::ipv4::IpProtocol;
use flowplane_wire::prefix::{IpPrefix, PortRange};
use flowplane_wire::tcp::TcpFlags;
use serde_json::json;

use crate::ipfix::{ExportRecord, NatEvent, NatExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::repl::ReplTx;
use crate::report::{merge_keeping, Export};
use crate::stateful::{Action, Affinity, Cursor, GlobalState, Granularity, Placement, StatefulNf, Step};
use crate::topk::{merge_rows_v4, rows_v4, TopK};
use crate::{NfContext, ParamError, ParamSpec, Params};

const EXTERNAL: ParamSpec = ParamSpec::text("external", "203.0.113.1", "IPv4", "first external address").live();
const ADDRS: ParamSpec = ParamSpec::uint("addrs", 1, 1, 256, "number of consecutive external addresses").live();
const PORTS: ParamSpec = ParamSpec::text("ports", "1024-65535", "LO-HI", "port range per address and protocol");
const INTERNAL: ParamSpec = ParamSpec::text("internal", "10.0.0.0/8", "A.B.C.D/LEN", "inside source prefix");
const TIMEOUT: ParamSpec = ParamSpec::uint("timeout", 30, 1, 86_400, "idle timeout in seconds");
const OTHER: ParamSpec =
    ParamSpec::choice("other", "pass", &["pass", "drop"], "non-TCP/UDP traffic from inside or to an external address");
const FILTER: ParamSpec = ParamSpec::choice(
    "filter",
    "apdf",
    &["eif", "adf", "apdf"],
    "inbound filtering (RFC 4787): any remote, the mapping's remote address, or its address and port",
);
const FIN_TIMEOUT: ParamSpec = ParamSpec::float(
    "fin_timeout",
    4.0,
    0.0,
    3600.0,
    "seconds a TCP port stays held once FINs went both ways (TIME_WAIT)",
);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "nat",
    about: "source NAT with a port pool per external address, both directions, RFC 4787 filtering, port release on expiry/RST/FIN+TIME_WAIT (on several cores: a port share per core, replies steered to their core)",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[EXTERNAL, ADDRS, PORTS, INTERNAL, TIMEOUT, OTHER, FILTER, FIN_TIMEOUT],
};

/// Builds `nat` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Nat::from_params(p)?))
}

/// Inside hosts listed in the report's attribution (`top_hosts_by_ports`, `top_hosts_refused`).
pub const TOP_HOSTS: usize = 10;

/// Largest pool (external addresses x ports) per protocol: bounds the
/// constructor's preallocation to ~40 MiB for TCP (reverse map, free list,
/// TIME_WAIT ring) and ~24 MiB for UDP.
pub const MAX_POOL: u64 = 1 << 20;

/// State kinds (the `kind` byte of [`NatState`]).
pub mod kind {
    /// Neither inside-sourced nor addressed to us: pass untouched.
    pub const TRANSIT: u8 = 0;
    /// Translated outbound flow.
    pub const OUTBOUND: u8 = 1;
    /// Translated inbound flow.
    pub const INBOUND: u8 = 2;
    /// Inbound flow whose mapping was released or reused: drop.
    pub const STALE: u8 = 3;
    /// New outbound flow found the pool empty: drop, end flow.
    pub const EXHAUSTED: u8 = 4;
    /// Inbound to an unmapped external port: drop, end flow.
    pub const UNMAPPED: u8 = 5;
    /// Non-first TCP/UDP fragment: drop, end flow.
    pub const FRAGMENT: u8 = 6;
    /// Non-TCP/UDP protocol with `other=pass`.
    pub const OTHER_PASS: u8 = 7;
    /// Non-TCP/UDP protocol with `other=drop`: drop, end flow.
    pub const OTHER_DROP: u8 = 8;
    /// IPv6 (NAT44 only): pass untouched.
    pub const V6: u8 = 9;
    /// Created by the default action, classified (and a port taken) on the
    /// flow's first packet that actually reaches the NAT: in an aggregated
    /// chain the default action runs for every NF when the flow enters the
    /// chain, even if an upstream NF drops that packet.
    pub const PENDING: u8 = 10;
    /// Translated outbound TCP flow that has sent a FIN: its mapping may be
    /// released after TIME_WAIT, so every packet checks it.
    pub const OUTBOUND_CLOSING: u8 = 11;
    /// Inbound to a mapped port from a remote the filter refuses: drop, end flow.
    pub const FILTERED: u8 = 12;
}

/// Per-flow state (16 bytes, no padding).
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct NatState {
    /// Outbound: the external address; inbound: the inside address.
    pub addr: u32,
    /// Slot in the protocol's pool (address index * ports per address + port offset).
    pub slot: u32,
    /// The slot's generation when this flow was created.
    pub gen: u32,
    /// Outbound: the external port; inbound: the inside port.
    pub port: u16,
    /// One of [`kind`].
    pub kind: u8,
    /// Pool: 0 = TCP, 1 = UDP.
    pub pool: u8,
}

/// NAT configuration (what the chain-spec parameters say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatConfig {
    /// First external address.
    pub external: Ipv4Addr,
    /// Number of consecutive external addresses.
    pub addrs: u32,
    /// First port of each address's range.
    pub port_lo: u16,
    /// Last port (inclusive).
    pub port_hi: u16,
    /// Inside prefix address.
    pub internal: Ipv4Addr,
    /// Inside prefix length.
    pub internal_len: u8,
    /// Idle timeout, seconds.
    pub timeout_s: u64,
    /// Drop (instead of passing) non-TCP/UDP traffic from inside or to an external address.
    pub drop_other: bool,
    /// Inbound filtering.
    pub filter: Filter,
    /// TIME_WAIT after FINs in both directions, ns.
    pub fin_timeout_ns: u64,
}

/// Inbound filtering behaviour (RFC 4787 section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Any remote may reach a mapped port.
    EndpointIndependent,
    /// Only the mapping's remote address (any port).
    AddressDependent,
    /// Only the mapping's remote address and port.
    AddressAndPortDependent,
}

impl Filter {
    fn name(self) -> &'static str {
        match self {
            Filter::EndpointIndependent => "eif",
            Filter::AddressDependent => "adf",
            Filter::AddressAndPortDependent => "apdf",
        }
    }
}

impl Default for NatConfig {
    fn default() -> Self {
        NatConfig {
            external: Ipv4Addr::new(203, 0, 113, 1),
            addrs: const { ADDRS.uint_default() } as u32,
            port_lo: 1024,
            port_hi: 65535,
            internal: Ipv4Addr::new(10, 0, 0, 0),
            internal_len: 8,
            timeout_s: const { TIMEOUT.uint_default() },
            drop_other: false,
            filter: Filter::AddressAndPortDependent,
            fin_timeout_ns: 4_000_000_000,
        }
    }
}

/// One reverse-map entry: who holds an external (address, port) slot, and
/// the remote it was mapped for (what inbound filtering compares against).
#[derive(Clone, Copy, Debug, Default)]
struct Mapping {
    /// Time of the last outbound packet translated with it (its idle clock).
    last_out: u64,
    inside: u32,
    gen: u32,
    remote: u32,
    inside_port: u16,
    remote_port: u16,
    in_use: bool,
    /// [`FIN_OUT`] | [`FIN_IN`] | [`QUEUED`].
    fin: u8,
    /// The slot has a place in the free ring (a slot adopted from a peer
    /// keeps its place, skipped when reached: never queued twice).
    queued: bool,
}

impl Mapping {
    /// Idle past `timeout` at `now` (then the mapping is free). The rule of
    /// `flowplane_table`'s expiry sweep for clocks that jump: a last-seen time
    /// in the future is rebased to `now` (a full timeout from now), never
    /// expired early; the arithmetic saturates.
    #[inline]
    fn idle(&mut self, now: u64, timeout: u64) -> bool {
        if self.last_out > now {
            self.last_out = now;
            return false;
        }
        now - self.last_out > timeout
    }

    /// Held by generation `gen` and not idle at `now` (read-only: a future
    /// last-seen time counts as live).
    #[inline]
    fn live_at(&self, gen: u32, now: u64, timeout: u64) -> bool {
        self.in_use && self.gen == gen && now.saturating_sub(self.last_out) <= timeout
    }
}

/// A FIN went out (inside to remote).
const FIN_OUT: u8 = 1;
/// A FIN came in.
const FIN_IN: u8 = 2;
/// The slot is in the TIME_WAIT queue.
const QUEUED: u8 = 4;

/// A TCP slot waiting out TIME_WAIT: released at `deadline_ns` if still held by generation `gen`.
#[derive(Clone, Copy, Debug, Default)]
struct TimeWait {
    slot: u32,
    gen: u32,
    deadline_ns: u64,
}

/// The slots of one protocol: reverse map plus a FIFO ring of free slots,
/// both allocated once (and grown when the pool takes new addresses). The
/// ring holds exactly the slots not in use of the addresses in the pool.
#[derive(Debug)]
struct Pool {
    rev: Vec<Mapping>,
    /// Ports per address (slot = address index * ports + port offset).
    ports: u32,
    /// Per address index: in the pool (its free ports may be taken). A retired
    /// address's mappings live on; its ports, once freed, are not queued again.
    active: Vec<bool>,
    /// Mappings on retired addresses that ended (their ports not reused).
    retired_ended: u64,
    free: Vec<u32>,
    head: usize,
    len: usize,
    /// TIME_WAIT ring (TCP only: one place per slot, each slot queued at most once per mapping).
    tw: Vec<TimeWait>,
    tw_head: usize,
    tw_len: usize,
    /// Where the next search for an idle mapping starts.
    scan_at: u32,
    /// A search that found no idle mapping, at `scan_ns`: none can be idle
    /// before `idle_from` (the earliest last-seen + timeout + 1 ns then), so
    /// an exhausted pool costs one pass per such bound, not one per packet.
    idle_from: u64,
    scan_ns: u64,
}

impl Pool {
    /// Every slot free, queued address-interleaved so consecutive flows spread
    /// over the addresses; a TIME_WAIT ring when `time_wait`.
    fn new(addrs: u32, ports: u32, time_wait: bool) -> Self {
        let n = (addrs * ports) as usize;
        let mut free = Vec::with_capacity(n);
        for p in 0..ports {
            for a in 0..addrs {
                free.push(a * ports + p);
            }
        }
        let tw = if time_wait { vec![TimeWait::default(); n] } else { Vec::new() };
        Pool {
            rev: vec![Mapping { queued: true, ..Mapping::default() }; n],
            ports,
            active: vec![true; addrs as usize],
            retired_ended: 0,
            free,
            head: 0,
            len: n,
            tw,
            tw_head: 0,
            tw_len: 0,
            scan_at: 0,
            idle_from: 0,
            scan_ns: 0,
        }
    }

    /// A free slot: the head of the free list, or else the first mapping
    /// idle past `timeout` at `now` in slot order from where the last search
    /// stopped (reclaimed: generation bumped). `None`: the pool is exhausted.
    /// Whether a port is available is a function of the packet times alone.
    fn alloc(&mut self, now: u64, timeout: u64) -> Option<(u32, bool)> {
        while self.len > 0 {
            let s = self.free[self.head];
            self.head = if self.head + 1 == self.free.len() { 0 } else { self.head + 1 };
            self.len -= 1;
            let e = &mut self.rev[s as usize];
            e.queued = false;
            // Adopted from a peer while queued (replication): its place is dropped.
            if e.in_use {
                continue;
            }
            return Some((s, false));
        }
        // A clock that went backwards invalidates the bound.
        if now < self.idle_from && now >= self.scan_ns {
            return None;
        }
        let n = self.rev.len() as u32;
        let mut min_seen = u64::MAX;
        for k in 0..n {
            let mut i = self.scan_at + k;
            if i >= n {
                i -= n;
            }
            let e = &mut self.rev[i as usize];
            // A retired address's ports are never handed out again.
            if !e.in_use || !self.active[(i / self.ports) as usize] {
                continue;
            }
            if e.idle(now, timeout) {
                e.in_use = false;
                e.gen = e.gen.wrapping_add(1);
                e.fin = 0;
                self.scan_at = if i + 1 == n { 0 } else { i + 1 };
                return Some((i, true));
            }
            min_seen = min_seen.min(e.last_out);
        }
        self.idle_from = min_seen.saturating_add(timeout).saturating_add(1);
        self.scan_ns = now;
        None
    }

    /// Queues a slot at the tail. Callers free a slot only when it was in use,
    /// so the ring (one place per slot) never overflows. A retired address's
    /// slot is not queued: the mapping ends, the port is not reused.
    fn push(&mut self, slot: u32) {
        if !self.active.get((slot / self.ports) as usize).copied().unwrap_or(false) {
            self.retired_ended += 1;
            return;
        }
        let cap = self.free.len();
        let Some(e) = self.rev.get_mut(slot as usize) else { return };
        if e.queued {
            // Adopted while queued: the old place serves.
            return;
        }
        e.queued = true;
        if self.len < cap {
            let mut at = self.head + self.len;
            if at >= cap {
                at -= cap;
            }
            self.free[at] = slot;
            self.len += 1;
        }
    }

    /// Mappings held and not idle at `now`.
    fn live(&self, now: u64, timeout: u64) -> usize {
        self.rev.iter().filter(|e| e.in_use && now.saturating_sub(e.last_out) <= timeout).count()
    }

    /// Frees a slot held by generation `gen`: bumps the generation (stale
    /// inbound flows notice) and queues it. False if it was not held by `gen`.
    fn release(&mut self, slot: u32, gen: u32) -> bool {
        match self.rev.get_mut(slot as usize) {
            Some(e) if e.in_use && e.gen == gen => {
                e.in_use = false;
                e.gen = e.gen.wrapping_add(1);
                e.fin = 0;
                self.push(slot);
                true
            }
            _ => false,
        }
    }

    /// Queues a closed connection's slot for release at `deadline_ns` (once
    /// per mapping). False if the ring is full: entries of ports released
    /// meanwhile (RST, expiry) and reused within `fin_timeout` still take
    /// places; the port then waits for its flow's idle timeout.
    fn time_wait(&mut self, slot: u32, deadline_ns: u64) -> bool {
        let cap = self.tw.len();
        let Some(e) = self.rev.get_mut(slot as usize) else { return true };
        if e.fin & QUEUED != 0 {
            return true;
        }
        if self.tw_len >= cap {
            return false;
        }
        e.fin |= QUEUED;
        let mut at = self.tw_head + self.tw_len;
        if at >= cap {
            at -= cap;
        }
        self.tw[at] = TimeWait { slot, gen: e.gen, deadline_ns };
        self.tw_len += 1;
        true
    }

    /// Releases the queued slots whose TIME_WAIT is over at `now_ns` (in
    /// queue order); returns how many were still held and got released.
    fn expire_time_wait(&mut self, now_ns: u64, log: &mut EventLog) -> u64 {
        let mut released = 0;
        while self.tw_len > 0 {
            let w = self.tw[self.tw_head];
            if w.deadline_ns > now_ns {
                break;
            }
            self.tw_head = if self.tw_head + 1 == self.tw.len() { 0 } else { self.tw_head + 1 };
            self.tw_len -= 1;
            // Released meanwhile (RST, idle timeout) and maybe reused: leave it alone.
            if self.release(w.slot, w.gen) {
                released += 1;
                if let Some(e) = self.rev.get(w.slot as usize) {
                    // TIME_WAIT is TCP's: pool 0.
                    log.session(NatEvent::Nat44SessionDelete, e, w.slot, 0, w.deadline_ns);
                }
            }
        }
        released
    }

    /// Mappings on retired addresses held and not idle at `now`.
    fn live_retired(&self, now: u64, timeout: u64) -> usize {
        self.rev
            .iter()
            .enumerate()
            .filter(|(s, e)| {
                !self.active[*s / self.ports as usize] && e.in_use && now.saturating_sub(e.last_out) <= timeout
            })
            .count()
    }

    /// The pool's addresses change (between two batches): `active[i]` says
    /// whether address index `i` is in the pool now (indices past the old
    /// ones are new addresses). Every mapping stays where it is; the free
    /// ring keeps its order without the retired addresses' slots, then takes
    /// the free slots of the addresses that join, address-interleaved; the
    /// TIME_WAIT ring keeps its order.
    fn set_active(&mut self, active: &[bool]) {
        let (ports, n) = (self.ports as usize, active.len() * self.ports as usize);
        let cap = self.free.len().max(1);
        let mut queue: Vec<u32> =
            (0..self.len).map(|k| self.free[(self.head + k) % cap]).filter(|&s| active[s as usize / ports]).collect();
        let joining: Vec<usize> =
            (0..active.len()).filter(|&i| active[i] && !self.active.get(i).copied().unwrap_or(false)).collect();
        self.rev.resize(n, Mapping::default());
        for p in 0..ports {
            for &i in &joining {
                let s = i * ports + p;
                if !self.rev[s].in_use {
                    queue.push(s as u32);
                }
            }
        }
        // `queued` says a slot has a place in the ring (replication's adoption relies on it).
        for e in &mut self.rev {
            e.queued = false;
        }
        for &s in &queue {
            self.rev[s as usize].queued = true;
        }
        self.len = queue.len();
        queue.resize(n, 0);
        (self.free, self.head) = (queue, 0);
        if !self.tw.is_empty() {
            let cap = self.tw.len();
            let mut tw: Vec<TimeWait> = (0..self.tw_len).map(|k| self.tw[(self.tw_head + k) % cap]).collect();
            tw.resize(n, TimeWait::default());
            (self.tw, self.tw_head) = (tw, 0);
        }
        self.active = active.to_vec();
        // Slots may have joined: the exhausted pool's bound no longer holds.
        (self.idle_from, self.scan_ns) = (0, 0);
        if self.scan_at as usize >= n {
            self.scan_at = 0;
        }
    }

    /// Slots waiting out TIME_WAIT and still held by their connection.
    fn in_time_wait(&self) -> usize {
        (0..self.tw_len)
            .map(|i| self.tw[(self.tw_head + i) % self.tw.len()])
            .filter(|w| self.rev.get(w.slot as usize).is_some_and(|e| e.in_use && e.gen == w.gen))
            .count()
    }
}

/// Per-packet counters (report).
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    mappings: u64,
    released: u64,
    idle_reclaimed: u64,
    idle_remapped: u64,
    rejudged: u64,
    inbound_flows: u64,
    out_packets: u64,
    in_packets: u64,
    exhausted: u64,
    unmapped: u64,
    stale: u64,
    fragments: u64,
    other_passed: u64,
    other_dropped: u64,
    transit: u64,
    v6: u64,
    unparsed: u64,
    table_full: u64,
    rst_ends: u64,
    filtered: u64,
    fin_closed: u64,
    time_wait_released: u64,
    time_wait_full: u64,
    remapped: u64,
    evicted_mappings: u64,
    evicted_inbound: u64,
    /// Mappings taken from a peer (`--replicate`).
    adopted: u64,
}

/// The source NAT.
#[derive(Debug)]
pub struct Nat {
    cfg: NatConfig,
    /// The pool's first address (`cfg.external`) and, per address of the pool, its index.
    ext_base: u32,
    index: Vec<u32>,
    /// Addresses that left the pool, with their index, sorted by address (inbound packets still reach
    /// their mappings).
    retired: Vec<(u32, u32)>,
    /// Every address ever in the pool, by index (slot = index * ports + port offset).
    addr_of: Vec<u32>,
    ports: u32,
    inside_net: u32,
    inside_mask: u32,
    /// 0: TCP, 1: UDP.
    pools: [Pool; 2],
    timeout_ns: u64,
    /// The last packet's time, then the run's end (what export and report judge idleness at).
    now_ns: u64,
    c: Counters,
    /// The IPFIX event log (`--ipfix`): RFC 8158 NAT44 session create/delete, addresses exhausted.
    log: EventLog,
    /// Inside hosts whose new flows found the pool exhausted (attribution: who runs the pool dry).
    refused_by: TopK,
}

/// Where NAT events go, and what a slot means (address and port of a slot).
#[derive(Debug, Default)]
struct EventLog {
    tx: Option<RecordTx>,
    /// External address by address index.
    addr_of: Vec<u32>,
    /// `--replicate`: a delete for every mapping released (the create is pushed where it is made).
    repl: Option<ReplTx>,
    ports: u32,
    port_lo: u16,
    /// Per pool: the packet time of the last addresses-exhausted event (one per second at most).
    exhausted_ns: [Option<u64>; 2],
}

impl EventLog {
    /// A session event of mapping `e` (slot `slot` of pool `pool`: 0 TCP, 1 UDP).
    #[inline]
    fn session(&mut self, event: NatEvent, e: &Mapping, slot: u32, pool: u8, time_ns: u64) {
        if self.tx.is_none() && self.repl.is_none() {
            return;
        }
        let inside = mapping_key(e, pool);
        if let (Some(r), NatEvent::Nat44SessionDelete, Some(k)) = (&mut self.repl, event, &inside) {
            r.delete(k);
        }
        let Some(tx) = &mut self.tx else { return };
        tx.push(ExportRecord::Nat(NatExport {
            event,
            time_ns,
            inside,
            post_src: Ipv4Addr::from(self.addr_of.get((slot / self.ports) as usize).copied().unwrap_or(0)),
            post_sport: self.port_lo + (slot % self.ports) as u16,
            pool: 0,
        }));
    }

    /// The pool of `pool` is exhausted at `now` (logged once per second of packet time).
    #[cold]
    fn exhausted(&mut self, pool: u8, now: u64) {
        let Some(tx) = &mut self.tx else { return };
        let last = &mut self.exhausted_ns[(pool & 1) as usize];
        if last.is_some_and(|l| now.saturating_sub(l) < 1_000_000_000) {
            return;
        }
        *last = Some(now);
        tx.push(ExportRecord::Nat(NatExport {
            event: NatEvent::AddressesExhausted,
            time_ns: now,
            inside: None,
            post_src: Ipv4Addr::UNSPECIFIED,
            post_sport: 0,
            pool: u32::from(pool),
        }));
    }
}

/// The outbound flow key of mapping `e` (pool 0 TCP, 1 UDP): inside endpoint to remote.
fn mapping_key(e: &Mapping, pool: u8) -> Option<FiveTuple> {
    let proto = if pool == 0 { 6 } else { 17 };
    FiveTuple::new(
        IpAddr::V4(Ipv4Addr::from(e.inside)),
        IpAddr::V4(Ipv4Addr::from(e.remote)),
        e.inside_port,
        e.remote_port,
        proto,
    )
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - len as u32)
    }
}

impl NatConfig {
    /// The configuration the parameters give (checked alone; [`Nat::new`] checks it as a whole).
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let ext_s = p.text(&EXTERNAL)?;
        let external: Ipv4Addr = ext_s
            .parse()
            .map_err(|_| ParamError(format!("nat: parameter 'external={ext_s}' is not an IPv4 address")))?;
        let addrs = p.uint(&ADDRS)? as u32;
        let ports_s = p.text(&PORTS)?;
        let (port_lo, port_hi) =
            PortRange::parse(&ports_s).filter(|r| r.lo >= 1).map(|r| (r.lo, r.hi)).ok_or_else(|| {
                ParamError(format!(
                    "nat: parameter 'ports={ports_s}' is not a port range LO-HI with 1 <= LO <= HI <= 65535"
                ))
            })?;
        let int_s = p.text(&INTERNAL)?;
        let v4 = |p: IpPrefix| match p.addr() {
            IpAddr::V4(a) => Some((a, p.len())),
            IpAddr::V6(_) => None,
        };
        let (internal, internal_len) = IpPrefix::parse(&int_s).and_then(v4).ok_or_else(|| {
            ParamError(format!("nat: parameter 'internal={int_s}' is not an IPv4 prefix A.B.C.D/LEN"))
        })?;
        let timeout_s = p.uint(&TIMEOUT)?;
        let drop_other = p.choice(&OTHER, [false, true])?;
        let filter = p.choice(
            &FILTER,
            [Filter::EndpointIndependent, Filter::AddressDependent, Filter::AddressAndPortDependent],
        )?;
        let fin_timeout_ns = (p.float(&FIN_TIMEOUT)? * 1e9) as u64;
        Ok(NatConfig {
            external,
            addrs,
            port_lo,
            port_hi,
            internal,
            internal_len,
            timeout_s,
            drop_other,
            filter,
            fin_timeout_ns,
        })
    }
}

impl Nat {
    /// `nat(external=A, addrs=N, ports=LO-HI, internal=P/L, timeout=S, other=pass|drop, filter=eif|adf|apdf, fin_timeout=S)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        Nat::new(NatConfig::from_params(p)?)
    }

    /// A NAT for `cfg`; preallocates both pools. Fails on an empty or oversized
    /// pool, an external range that overflows or overlaps the inside prefix.
    pub fn new(cfg: NatConfig) -> Result<Self, ParamError> {
        let base = u32::from(cfg.external);
        if cfg.addrs == 0 || base as u64 + cfg.addrs as u64 - 1 > u32::MAX as u64 {
            return Err(ParamError(format!("nat: {} external addresses from {} overflow", cfg.addrs, cfg.external)));
        }
        if cfg.port_lo == 0 || cfg.port_lo > cfg.port_hi {
            return Err(ParamError(format!("nat: parameter 'ports={}-{}' is empty", cfg.port_lo, cfg.port_hi)));
        }
        if cfg.internal_len > 32 {
            return Err(ParamError(format!("nat: parameter 'internal' prefix length {} > 32", cfg.internal_len)));
        }
        let ports = (cfg.port_hi - cfg.port_lo) as u32 + 1;
        let size = cfg.addrs as u64 * ports as u64;
        if size > MAX_POOL {
            return Err(ParamError(format!(
                "nat: {} addresses x {ports} ports = {size} slots exceeds the limit of {MAX_POOL}",
                cfg.addrs
            )));
        }
        let inside_mask = mask(cfg.internal_len);
        let inside_net = u32::from(cfg.internal) & inside_mask;
        let last = base + (cfg.addrs - 1);
        let inside_end = inside_net | !inside_mask;
        if base <= inside_end && last >= inside_net {
            return Err(ParamError(format!(
                "nat: external addresses {}..{} overlap 'internal={}/{}'",
                cfg.external,
                Ipv4Addr::from(last),
                cfg.internal,
                cfg.internal_len
            )));
        }
        let pools = [Pool::new(cfg.addrs, ports, true), Pool::new(cfg.addrs, ports, false)];
        let timeout_ns = cfg.timeout_s.saturating_mul(1_000_000_000);
        Ok(Nat {
            cfg,
            ext_base: base,
            index: (0..cfg.addrs).collect(),
            retired: Vec::new(),
            addr_of: (0..cfg.addrs).map(|i| base + i).collect(),
            ports,
            inside_net,
            inside_mask,
            pools,
            timeout_ns,
            now_ns: 0,
            c: Counters::default(),
            log: EventLog {
                addr_of: (0..cfg.addrs).map(|i| base + i).collect(),
                ports,
                port_lo: cfg.port_lo,
                ..EventLog::default()
            },
            refused_by: TopK::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NatConfig {
        &self.cfg
    }

    /// The inside hosts holding the most ports (TCP and UDP mappings not idle at the latest packet time),
    /// most first: (inside address, ports), at most `n`. A walk over the pools: for reports, not packets.
    pub fn top_hosts_by_ports(&self, n: usize) -> Vec<(u32, u64)> {
        let mut held: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for p in &self.pools {
            for e in p.rev.iter().filter(|e| e.in_use && self.now_ns.saturating_sub(e.last_out) <= self.timeout_ns) {
                *held.entry(e.inside).or_default() += 1;
            }
        }
        let mut v: Vec<(u32, u64)> = held.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Ports held by a mapping not idle at the latest packet time (after
    /// the run: its end, see `end_of_run`): (TCP, UDP).
    pub fn ports_in_use(&self) -> (usize, usize) {
        (self.pools[0].live(self.now_ns, self.timeout_ns), self.pools[1].live(self.now_ns, self.timeout_ns))
    }

    #[inline]
    fn is_inside(&self, a: u32) -> bool {
        a & self.inside_mask == self.inside_net
    }

    /// The index of external address `a`: one in the pool, or one that left it.
    #[inline]
    fn ext_index(&self, a: u32) -> Option<u32> {
        let i = a.wrapping_sub(self.ext_base);
        if i < self.cfg.addrs {
            return self.index.get(i as usize).copied();
        }
        if self.retired.is_empty() {
            return None;
        }
        self.retired.binary_search_by_key(&a, |r| r.0).ok().map(|k| self.retired[k].1)
    }

    /// The pool becomes `addrs` addresses from `external` (see the module doc): addresses that stay keep
    /// their index, new ones get the next indices, those that leave are retired with their mappings.
    fn set_pool(&mut self, external: Ipv4Addr, addrs: u32) -> Result<(), ParamError> {
        let base = u32::from(external);
        let last = base as u64 + addrs as u64 - 1;
        if addrs == 0 || last > u32::MAX as u64 {
            return Err(ParamError(format!("nat: {addrs} external addresses from {external} overflow")));
        }
        let inside_end = self.inside_net | !self.inside_mask;
        if base <= inside_end && last as u32 >= self.inside_net {
            return Err(ParamError(format!(
                "nat: external addresses {external}..{} overlap 'internal={}/{}'",
                Ipv4Addr::from(last as u32),
                self.cfg.internal,
                self.cfg.internal_len
            )));
        }
        let new: Vec<u32> = (0..addrs).map(|i| base + i).collect();
        let known = new.iter().filter(|&a| self.addr_of.contains(a)).count();
        let slots = (self.addr_of.len() + new.len() - known) as u64 * self.ports as u64;
        if slots > MAX_POOL {
            return Err(ParamError(format!(
                "nat: {} addresses (with the retired ones, whose mappings are kept) x {} ports = {slots} slots \
                 exceeds the limit of {MAX_POOL} (a restart starts afresh)",
                self.addr_of.len() + new.len() - known,
                self.ports
            )));
        }
        let mut index = Vec::with_capacity(new.len());
        for &a in &new {
            let i = match self.addr_of.iter().position(|&x| x == a) {
                Some(i) => i,
                None => {
                    self.addr_of.push(a);
                    self.addr_of.len() - 1
                }
            };
            index.push(i as u32);
        }
        let mut active = vec![false; self.addr_of.len()];
        for &i in &index {
            active[i as usize] = true;
        }
        self.retired =
            self.addr_of.iter().enumerate().filter(|&(i, _)| !active[i]).map(|(i, &a)| (a, i as u32)).collect();
        self.retired.sort_unstable();
        for p in &mut self.pools {
            p.set_active(&active);
        }
        (self.ext_base, self.index) = (base, index);
        (self.cfg.external, self.cfg.addrs) = (external, addrs);
        self.log.addr_of = self.addr_of.clone();
        Ok(())
    }

    fn state(kind: u8) -> NatState {
        NatState { kind, ..NatState::zeroed() }
    }
}

impl StatefulNf for Nat {
    type State = NatState;
    // No release hook: a mapping is freed on the packet clock (RST, TIME_WAIT,
    // idle at lookup), never when the executor expires or ends a flow entry;
    // an eviction ends the pair (`evict`).
    const ENDS_FLOWS: bool = true;
    const HAS_PREFETCH: bool = true;
    const STEPS: bool = true;
    const ONE_STEP: bool = true;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn placement(&self) -> Placement {
        // The smallest prefix holding every external address.
        let first = u32::from(self.cfg.external);
        let last = first.saturating_add(self.cfg.addrs.saturating_sub(1));
        let len = (first ^ last).leading_zeros().min(32) as u8;
        Placement {
            affinity: Affinity::Flow,
            global: GlobalState::PortPool {
                param: "ports",
                lo: self.cfg.port_lo,
                hi: self.cfg.port_hi,
                dst: (self.cfg.external, len),
            },
        }
    }

    fn idle_timeout_ns(&self) -> Option<u64> {
        Some(self.timeout_ns)
    }

    /// A new address pool (`external`, `addrs`), every mapping kept (see the module doc). The other
    /// parameters are fixed for the run (`ctl` refuses their change before any core sees it); the run's
    /// own port range stays (on several cores each core has its share of `ports`, which the spec does not
    /// show).
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let cfg = NatConfig::from_params(p)?;
        if (cfg.external, cfg.addrs) == (self.cfg.external, self.cfg.addrs) {
            return Ok(());
        }
        self.set_pool(cfg.external, cfg.addrs)
    }

    fn tick(&mut self, now_ns: u64) {
        // An idle port's timer: TIME_WAITs end and ports idle past the timeout stop
        // counting as in use, without a packet.
        self.advance_to(now_ns);
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> NatState {
        Nat::state(kind::PENDING)
    }

    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut NatState, ctx: &NfContext) -> Action {
        self.now_ns = ctx.now_ns;
        // TIME_WAITs end on the packet clock, before the packet that finds them over.
        let tcp = &self.pools[0];
        if tcp.tw_len != 0 && tcp.tw[tcp.tw_head].deadline_ns <= ctx.now_ns {
            self.expire_time_wait(ctx.now_ns);
        }
        let first = st.kind == kind::PENDING;
        if first {
            *st = self.classify(pkt, ctx.now_ns);
        }
        match self.translate(pkt, st, ctx) {
            // A new flow refused (pool exhausted, filtered, unmapped, ...) holds nothing: its entry goes as never
            // inserted, and costs no stop in a batch (issue 33). A mapped flow's later refusal still ends it.
            Action::DropEndFlow if first => Action::Refuse,
            a => a,
        }
    }

    /// One step: translated flows name their reverse-map entry (a hint:
    /// `finish` is `process` and reads it again, since an earlier packet may
    /// release the slot meanwhile).
    fn step(&self, _pkt: &Pkt<'_>, st: &NatState, cur: &mut Cursor) -> Step {
        cur.step += 1;
        if cur.step == 1 && maps(st.kind) {
            if let Some(e) = self.pools[(st.pool & 1) as usize].rev.get(st.slot as usize) {
                return Step::at(e);
            }
        }
        Step::Ready
    }

    fn prefetch(&self, st: &NatState) {
        // Translated flows read indirect state: the reverse-map entry (outbound ones write its idle clock).
        if maps(st.kind) {
            if let Some(e) = self.pools[(st.pool & 1) as usize].rev.get(st.slot as usize) {
                flowplane_packet::prefetch::write(e);
            }
        }
    }

    fn on_unparsed(&mut self) -> Action {
        self.c.unparsed += 1;
        Action::Drop
    }

    fn evict(&mut self, _key: &FiveTuple, st: &NatState) {
        match st.kind {
            // The pair's mapping lives here: free the port; the inbound entry is then stale.
            kind::OUTBOUND | kind::OUTBOUND_CLOSING => {
                let p = &mut self.pools[(st.pool & 1) as usize];
                if p.release(st.slot, st.gen) {
                    self.c.released += 1;
                    self.c.evicted_mappings += 1;
                    if let Some(e) = p.rev.get(st.slot as usize) {
                        // At the latest packet time (the evicting packet's own is not known here).
                        self.log.session(NatEvent::Nat44SessionDelete, e, st.slot, st.pool, self.now_ns);
                    }
                }
            }
            // Rebuilt from the reverse map by the next reply while the mapping lives.
            kind::INBOUND => self.c.evicted_inbound += 1,
            _ => {}
        }
    }

    fn passes_without_state(&self) -> bool {
        false
    }

    fn on_no_state(&mut self) -> Action {
        self.c.table_full += 1;
        Action::Drop
    }

    fn end_of_run(&mut self, end_ns: u64) {
        // Judged at the run's end, as a one-core run's last packet would judge:
        // mappings idle by then are not in use, TIME_WAITs over by then are released.
        self.advance_to(end_ns);
        if self.log.tx.is_some() {
            // Sessions idle past the timeout by the run's end ended when they went idle.
            let (now, timeout) = (self.now_ns, self.timeout_ns);
            for (pool, p) in self.pools.iter().enumerate() {
                for (slot, e) in p.rev.iter().enumerate() {
                    if e.in_use && now.saturating_sub(e.last_out) > timeout {
                        let at = e.last_out.saturating_add(timeout);
                        self.log.session(NatEvent::Nat44SessionDelete, e, slot as u32, pool as u8, at);
                    }
                }
            }
        }
    }

    fn report(&self) -> Option<serde_json::Value> {
        let c = &self.c;
        let (tcp, udp) = self.ports_in_use();
        Some(json!({
            "external": self.cfg.external.to_string(),
            "addrs": self.cfg.addrs,
            "pool_size_per_proto_per_core": self.cfg.addrs as usize * self.ports as usize,
            "retired_addrs": self.retired.iter().map(|&(a, _)| Ipv4Addr::from(a).to_string()).collect::<Vec<_>>(),
            "mappings_on_retired_addrs": self.pools.iter().map(|p| p.live_retired(self.now_ns, self.timeout_ns)).sum::<usize>(),
            "retired_mappings_ended": self.pools.iter().map(|p| p.retired_ended).sum::<u64>(),
            "filter": self.cfg.filter.name(),
            "fin_timeout_s": self.cfg.fin_timeout_ns as f64 / 1e9,
            "tcp_ports_in_use": tcp,
            "tcp_ports_in_time_wait": self.pools[0].in_time_wait(),
            "udp_ports_in_use": udp,
            "mappings_created": c.mappings,
            "ports_released": c.released,
            "idle_mappings_reclaimed": c.idle_reclaimed,
            "remapped_after_idle": c.idle_remapped,
            "inbound_rejudged": c.rejudged,
            "inbound_flows": c.inbound_flows,
            "outbound_packets": c.out_packets,
            "inbound_packets": c.in_packets,
            "rst_ended_flows": c.rst_ends,
            "fin_closed_connections": c.fin_closed,
            "time_wait_released": c.time_wait_released,
            "time_wait_queue_full": c.time_wait_full,
            "remapped_after_time_wait": c.remapped,
            "evicted_mappings": c.evicted_mappings,
            "evicted_inbound": c.evicted_inbound,
            "mappings_adopted": c.adopted,
            "dropped_filtered": c.filtered,
            "dropped_pool_exhausted": c.exhausted,
            "dropped_unmapped": c.unmapped,
            "dropped_stale": c.stale,
            "dropped_fragments": c.fragments,
            "dropped_other_proto": c.other_dropped,
            "dropped_unparsed": c.unparsed,
            "dropped_table_full": c.table_full,
            "passed_other_proto": c.other_passed,
            "passed_transit": c.transit,
            "passed_ipv6": c.v6,
            "top_hosts_by_ports": rows_v4(&self.top_hosts_by_ports(TOP_HOSTS), "inside", "ports", TOP_HOSTS),
            "top_hosts_refused": rows_v4(
                &self.refused_by.top().iter().map(|&(a, n, _)| (a, n)).collect::<Vec<_>>(),
                "inside",
                "refused",
                TOP_HOSTS
            ),
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Per-host lists: summed by host over cores (each core's pool share), the first TOP_HOSTS kept.
        let tops = [("top_hosts_by_ports", "ports"), ("top_hosts_refused", "refused")].map(|(k, what)| {
            let mut mine = into.get_mut(k).map(serde_json::Value::take).unwrap_or_default();
            merge_rows_v4(&mut mine, &other[k], "inside", what, TOP_HOSTS);
            (k, mine)
        });
        // Configuration echoes; every core has its own pools (ports in use add up).
        merge_keeping(
            into,
            other,
            &["external", "addrs", "pool_size_per_proto_per_core", "filter", "fin_timeout_s", "retired_addrs"],
        );
        for (k, v) in tops {
            into[k] = v;
        }
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.log.tx = Some(tx);
    }

    // Replicated: outbound flows' mappings (an inbound flow is rebuilt from
    // the mapping by the reply's first packet on the standby).
    const REPL: Result<(), &'static str> = Ok(());

    fn attach_repl(&mut self, tx: ReplTx) {
        self.log.repl = Some(tx);
    }

    /// Takes the mapping's slot on this instance (same configuration and
    /// core share as the sender: a slot naming another address or port is
    /// refused). A slot held by another mapping (its release was lost) is
    /// taken over, its generation bumped so the old flows go stale; the same
    /// mapping again (a refresh, a resync) only moves its clock to `now`.
    fn repl_adopt(&mut self, key: &FiveTuple, st: &mut NatState, now: u64) -> bool {
        let FiveTuple::V4(k) = key else { return false };
        if !(st.kind == kind::OUTBOUND || st.kind == kind::OUTBOUND_CLOSING) || st.pool > 1 {
            return false;
        }
        if st.pool != u8::from(k.proto() == 17) || !self.is_inside(u32::from(k.src())) {
            return false;
        }
        let want_addr = self.addr_of.get((st.slot / self.ports) as usize).copied().unwrap_or(0);
        let want_port = u32::from(self.cfg.port_lo) + st.slot % self.ports;
        let p = &mut self.pools[st.pool as usize];
        let Some(e) = p.rev.get_mut(st.slot as usize) else { return false };
        if st.addr != want_addr || u32::from(st.port) != want_port {
            return false;
        }
        let (inside, iport, remote, rport) = (u32::from(k.src()), k.src_port(), u32::from(k.dst()), k.dst_port());
        let same =
            e.in_use && e.inside == inside && e.inside_port == iport && e.remote == remote && e.remote_port == rport;
        if !same {
            if e.in_use {
                e.gen = e.gen.wrapping_add(1);
            }
            e.inside = inside;
            e.inside_port = iport;
            e.remote = remote;
            e.remote_port = rport;
            e.fin = 0;
            e.in_use = true;
            self.c.adopted += 1;
        }
        e.last_out = e.last_out.max(now);
        st.gen = e.gen;
        st.kind = kind::OUTBOUND;
        self.now_ns = self.now_ns.max(now);
        true
    }

    /// The sender released the mapping: free its slot here if this flow still holds it.
    fn repl_forget(&mut self, _key: &FiveTuple, st: &NatState) {
        if maps(st.kind) && st.kind != kind::INBOUND {
            let p = &mut self.pools[(st.pool & 1) as usize];
            if p.release(st.slot, st.gen) {
                self.c.released += 1;
            }
        }
    }

    fn repl_entry(&mut self, key: &FiveTuple, st: &NatState) {
        if !(st.kind == kind::OUTBOUND || st.kind == kind::OUTBOUND_CLOSING) {
            return;
        }
        let live = self.pools[(st.pool & 1) as usize]
            .rev
            .get(st.slot as usize)
            .is_some_and(|e| e.live_at(st.gen, self.now_ns, self.timeout_ns));
        if let (true, Some(r)) = (live, &mut self.log.repl) {
            r.upsert(key, bytemuck::bytes_of(st));
        }
    }

    fn export_row(&self, key: &FiveTuple, st: &NatState) -> Option<serde_json::Value> {
        let dir = match st.kind {
            kind::OUTBOUND | kind::OUTBOUND_CLOSING => "out",
            kind::INBOUND => "in",
            _ => return None,
        };
        // Live translations only: a mapping released (RST, TIME_WAIT), reclaimed
        // or idle past the timeout at the latest packet time is not listed.
        let e = self.pools[(st.pool & 1) as usize].rev.get(st.slot as usize)?;
        if !e.live_at(st.gen, self.now_ns, self.timeout_ns) {
            return None;
        }
        Some(json!({
            "direction": dir,
            "proto": key.proto(),
            "src": key.src_ip().to_string(),
            "sport": key.src_port(),
            "dst": key.dst_ip().to_string(),
            "dport": key.dst_port(),
            "translated_addr": Ipv4Addr::from(st.addr).to_string(),
            "translated_port": st.port,
        }))
    }
}

/// Kinds whose state names a reverse-map entry.
#[inline(always)]
fn maps(kind: u8) -> bool {
    kind == kind::OUTBOUND || kind == kind::OUTBOUND_CLOSING || kind == kind::INBOUND
}

impl Nat {
    /// The old default action: classify the flow and, for a new outbound flow, take a port.
    fn classify(&mut self, pkt: &Pkt<'_>, now: u64) -> NatState {
        let m = pkt.meta();
        if m.v6 {
            return Nat::state(kind::V6);
        }
        let (Some(src), Some(dst)) = (pkt.ipv4_src(), pkt.ipv4_dst()) else {
            return Nat::state(kind::TRANSIT);
        };
        let (src, dst) = (u32::from(src), u32::from(dst));
        let inside = self.is_inside(src);
        let ext = self.ext_index(dst);
        if !inside && ext.is_none() {
            return Nat::state(kind::TRANSIT);
        }
        let pool = match m.proto {
            IpProtocol::TCP => 0u8,
            IpProtocol::UDP => 1u8,
            _ => return Nat::state(if self.cfg.drop_other { kind::OTHER_DROP } else { kind::OTHER_PASS }),
        };
        // Ports are needed on both sides; a non-first fragment has none.
        let (Some(sport), Some(dport)) = (pkt.src_port(), pkt.dst_port()) else {
            return Nat::state(kind::FRAGMENT);
        };
        if !inside {
            return self.judge_inbound(pool, ext.unwrap_or(0), src, sport, dport, now);
        }
        let timeout = self.timeout_ns;
        let p = &mut self.pools[pool as usize];
        let Some((slot, reclaimed)) = p.alloc(now, timeout) else {
            self.log.exhausted(pool, now);
            return Nat::state(kind::EXHAUSTED);
        };
        let e = &mut p.rev[slot as usize];
        if reclaimed {
            // The idle mapping the slot held ends now (its fields are still the old session's).
            self.log.session(NatEvent::Nat44SessionDelete, e, slot, pool, now);
        }
        e.inside = src;
        e.inside_port = sport;
        e.remote = dst;
        e.remote_port = dport;
        e.fin = 0;
        e.in_use = true;
        e.last_out = now;
        let gen = e.gen;
        self.log.session(NatEvent::Nat44SessionCreate, e, slot, pool, now);
        self.c.mappings += 1;
        self.c.idle_reclaimed += u64::from(reclaimed);
        self.c.released += u64::from(reclaimed);
        let st = NatState {
            addr: self.addr_of[(slot / self.ports) as usize],
            slot,
            gen,
            port: self.cfg.port_lo + (slot % self.ports) as u16,
            kind: kind::OUTBOUND,
            pool,
        };
        if let Some(r) = &mut self.log.repl {
            r.upsert(pkt.tuple(), bytemuck::bytes_of(&st));
        }
        st
    }

    /// An inbound packet from `src:sport` to external address `idx`, port
    /// `dport`, judged against the mapping that holds the port now.
    fn judge_inbound(&mut self, pool: u8, idx: u32, src: u32, sport: u16, dport: u16, now: u64) -> NatState {
        if dport < self.cfg.port_lo || dport > self.cfg.port_hi {
            return Nat::state(kind::UNMAPPED);
        }
        let slot = idx * self.ports + (dport - self.cfg.port_lo) as u32;
        let timeout = self.timeout_ns;
        let mut e = self.pools[pool as usize].rev.get_mut(slot as usize);
        if e.as_mut().is_some_and(|e| !e.in_use || e.idle(now, timeout)) {
            e = None;
        }
        match e {
            Some(e) => {
                let allowed = match self.cfg.filter {
                    Filter::EndpointIndependent => true,
                    Filter::AddressDependent => e.remote == src,
                    Filter::AddressAndPortDependent => e.remote == src && e.remote_port == sport,
                };
                if !allowed {
                    return Nat::state(kind::FILTERED);
                }
                let st = NatState { addr: e.inside, slot, gen: e.gen, port: e.inside_port, kind: kind::INBOUND, pool };
                self.c.inbound_flows += 1;
                st
            }
            _ => Nat::state(kind::UNMAPPED),
        }
    }

    /// The per-packet action on a classified flow.
    #[inline]
    fn translate(&mut self, pkt: &mut Pkt<'_>, st: &mut NatState, ctx: &NfContext) -> Action {
        let now = ctx.now_ns;
        let flags = pkt.tcp_flags().unwrap_or(TcpFlags(0));
        let rst = flags.contains(TcpFlags::RST);
        match st.kind {
            kind::OUTBOUND | kind::OUTBOUND_CLOSING => {
                let timeout = self.timeout_ns;
                let pool = &mut self.pools[(st.pool & 1) as usize];
                let held = match pool.rev.get_mut(st.slot as usize) {
                    Some(e) if e.in_use && e.gen == st.gen => {
                        if e.idle(now, timeout) {
                            // Idle past the timeout: free, and this packet a new flow's
                            // first (what an expiry at lookup gives; the old slot is
                            // left to the allocator, as it is after such an expiry).
                            self.c.idle_remapped += 1;
                            false
                        } else {
                            e.last_out = now;
                            true
                        }
                    }
                    _ => {
                        // Released after TIME_WAIT, or reclaimed idle: a new connection on the old
                        // 5-tuple, mapped afresh (never onto the released port's new owner).
                        self.c.remapped += u64::from(st.kind == kind::OUTBOUND_CLOSING);
                        false
                    }
                };
                if !held {
                    // (classify never returns a closing state nor an idle mapping: this recurses once.)
                    *st = self.classify(pkt, now);
                    return self.translate(pkt, st, ctx);
                }
                pkt.set_ipv4_src(Ipv4Addr::from(st.addr));
                pkt.set_src_port(st.port);
                self.c.out_packets += 1;
                if rst {
                    // The inside host reset the connection: the port is free at once.
                    self.c.rst_ends += 1;
                    let p = &mut self.pools[(st.pool & 1) as usize];
                    if p.release(st.slot, st.gen) {
                        self.c.released += 1;
                        if let Some(e) = p.rev.get(st.slot as usize) {
                            self.log.session(NatEvent::Nat44SessionDelete, e, st.slot, st.pool, now);
                        }
                    }
                    return Action::EndFlow;
                }
                if flags.contains(TcpFlags::FIN) && st.pool == 0 {
                    st.kind = kind::OUTBOUND_CLOSING;
                    self.fin_seen(st, FIN_OUT, now);
                }
                Action::Pass
            }
            kind::INBOUND | kind::STALE => {
                let timeout = self.timeout_ns;
                let live = st.kind == kind::INBOUND
                    && self.pools[(st.pool & 1) as usize]
                        .rev
                        .get_mut(st.slot as usize)
                        .is_some_and(|e| e.in_use && e.gen == st.gen && !e.idle(now, timeout));
                if !live {
                    // The mapping was released, reclaimed or is idle: judge the packet
                    // against whatever holds the port now (a new connection to the same
                    // remote endpoint reuses this 5-tuple).
                    let j = self.rejudge(pkt, now);
                    if j.kind != kind::INBOUND {
                        st.kind = kind::STALE;
                        self.c.stale += 1;
                        return Action::Drop;
                    }
                    self.c.rejudged += 1;
                    *st = j;
                }
                pkt.set_ipv4_dst(Ipv4Addr::from(st.addr));
                pkt.set_dst_port(st.port);
                self.c.in_packets += 1;
                if rst {
                    self.c.rst_ends += 1;
                    return Action::EndFlow;
                }
                if flags.contains(TcpFlags::FIN) && st.pool == 0 {
                    self.fin_seen(st, FIN_IN, now);
                }
                Action::Pass
            }
            kind::FILTERED => {
                self.c.filtered += 1;
                Action::DropEndFlow
            }
            kind::TRANSIT => {
                self.c.transit += 1;
                Action::Pass
            }
            kind::V6 => {
                self.c.v6 += 1;
                Action::Pass
            }
            kind::OTHER_PASS => {
                self.c.other_passed += 1;
                Action::Pass
            }
            // The drop kinds keep no state: the next packet re-runs `init`.
            kind::EXHAUSTED => {
                self.c.exhausted += 1;
                if let IpAddr::V4(a) = pkt.tuple().src_ip() {
                    self.refused_by.add(u32::from(a));
                }
                Action::DropEndFlow
            }
            kind::UNMAPPED => {
                self.c.unmapped += 1;
                Action::DropEndFlow
            }
            kind::FRAGMENT => {
                self.c.fragments += 1;
                Action::DropEndFlow
            }
            kind::OTHER_DROP => {
                self.c.other_dropped += 1;
                Action::DropEndFlow
            }
            _ => Action::DropEndFlow,
        }
    }

    /// An inbound packet of a flow whose mapping is gone, judged afresh
    /// (an `INBOUND` state when the port's current mapping admits it).
    #[cold]
    fn rejudge(&mut self, pkt: &Pkt<'_>, now: u64) -> NatState {
        let pool = match pkt.meta().proto {
            IpProtocol::TCP => 0u8,
            IpProtocol::UDP => 1u8,
            _ => return Nat::state(kind::UNMAPPED),
        };
        let (Some(src), Some(dst), Some(sport), Some(dport)) =
            (pkt.ipv4_src(), pkt.ipv4_dst(), pkt.src_port(), pkt.dst_port())
        else {
            return Nat::state(kind::UNMAPPED);
        };
        let Some(idx) = self.ext_index(u32::from(dst)) else { return Nat::state(kind::UNMAPPED) };
        self.judge_inbound(pool, idx, u32::from(src), sport, dport, now)
    }

    /// Records a FIN in one direction of a TCP mapping; once both directions
    /// have sent one, the port enters TIME_WAIT.
    fn fin_seen(&mut self, st: &NatState, dir: u8, now_ns: u64) {
        let deadline = now_ns.saturating_add(self.cfg.fin_timeout_ns);
        let p = &mut self.pools[0];
        let Some(e) = p.rev.get_mut(st.slot as usize) else { return };
        if !e.in_use || e.gen != st.gen {
            return;
        }
        e.fin |= dir;
        if e.fin & (FIN_OUT | FIN_IN) == FIN_OUT | FIN_IN && e.fin & QUEUED == 0 {
            self.c.fin_closed += 1;
            if !p.time_wait(st.slot, deadline) {
                self.c.time_wait_full += 1;
            }
        }
    }

    #[cold]
    /// Time passes to `t` without a packet (a timer tick, the run's end): the clock
    /// that judges ports in use moves there, and TIME_WAITs over by then end.
    fn advance_to(&mut self, t: u64) {
        self.now_ns = self.now_ns.max(t);
        let tcp = &self.pools[0];
        if tcp.tw_len != 0 && tcp.tw[tcp.tw_head].deadline_ns <= self.now_ns {
            self.expire_time_wait(self.now_ns);
        }
    }

    fn expire_time_wait(&mut self, now_ns: u64) {
        let n = self.pools[0].expire_time_wait(now_ns, &mut self.log);
        self.c.released += n;
        self.c.time_wait_released += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt::PktMeta;
    use crate::testutil::{assert_ipv4_checksums, ipv4_frame, tcp4, udp4, Harness};

    const EXT: [u8; 4] = [203, 0, 113, 1];
    const REMOTE: [u8; 4] = [198, 51, 100, 7];

    fn nat(addrs: u32, lo: u16, hi: u16) -> Nat {
        Nat::new(NatConfig { addrs, port_lo: lo, port_hi: hi, ..NatConfig::default() }).unwrap()
    }

    fn src_of(f: &[u8]) -> ([u8; 4], u16) {
        ([f[26], f[27], f[28], f[29]], u16::from_be_bytes([f[34], f[35]]))
    }

    fn dst_of(f: &[u8]) -> ([u8; 4], u16) {
        ([f[30], f[31], f[32], f[33]], u16::from_be_bytes([f[36], f[37]]))
    }

    fn report_u64(n: &Nat, k: &str) -> u64 {
        n.report().unwrap()[k].as_u64().unwrap()
    }

    #[test]
    fn outbound_then_inbound_tcp_and_udp_with_valid_checksums() {
        let mut h = Harness::new(nat(1, 1024, 65535));
        let syn = tcp4([10, 1, 2, 3], REMOTE, 40000, 443, TcpFlags::SYN.bits(), 7, 0);
        let (out, act) = h.run(&syn);
        assert_eq!(act, Action::Pass);
        assert_ipv4_checksums(&out);
        let (src, eport) = src_of(&out);
        assert_eq!(src, EXT);
        assert!(eport >= 1024);
        assert_eq!(dst_of(&out), (REMOTE, 443), "destination untouched");
        // Later packets of the flow keep the same mapping.
        let (again, _) = h.run(&tcp4([10, 1, 2, 3], REMOTE, 40000, 443, TcpFlags::ACK.bits(), 8, 1));
        assert_eq!(src_of(&again), (EXT, eport));
        assert_ipv4_checksums(&again);
        // The reply, addressed to the external port, goes back to the inside host.
        let reply = tcp4(REMOTE, EXT, 443, eport, TcpFlags::SYN.bits() | TcpFlags::ACK.bits(), 100, 8);
        let (back, act) = h.run(&reply);
        assert_eq!(act, Action::Pass);
        assert_eq!(dst_of(&back), ([10, 1, 2, 3], 40000));
        assert_eq!(src_of(&back), (REMOTE, 443), "source untouched");
        assert_ipv4_checksums(&back);

        // UDP uses its own pool and also round-trips.
        let (uout, _) = h.run(&udp4([10, 9, 9, 9], REMOTE, 5353, 53));
        assert_ipv4_checksums(&uout);
        let (usrc, uport) = src_of(&uout);
        assert_eq!(usrc, EXT);
        let (uback, act) = h.run(&udp4(REMOTE, EXT, 53, uport));
        assert_eq!(act, Action::Pass);
        assert_eq!(dst_of(&uback), ([10, 9, 9, 9], 5353));
        assert_ipv4_checksums(&uback);
        assert_eq!(h.nf.ports_in_use(), (1, 1));
        assert_eq!(report_u64(&h.nf, "mappings_created"), 2);
        assert_eq!(report_u64(&h.nf, "inbound_flows"), 2);
    }

    #[test]
    fn distinct_flows_get_distinct_ports_spread_over_addresses() {
        let mut h = Harness::new(nat(2, 2000, 2009));
        let mut seen = std::collections::HashSet::new();
        for i in 0..20u16 {
            let (out, act) = h.run(&udp4([10, 0, 0, 1], REMOTE, 1000 + i, 53));
            assert_eq!(act, Action::Pass);
            let (a, p) = src_of(&out);
            assert!(a == EXT || a == [203, 0, 113, 2], "{a:?}");
            assert!((2000..=2009).contains(&p));
            assert!(seen.insert((a, p)), "mapping handed out twice");
            if i < 2 {
                // Consecutive flows alternate addresses.
                assert_eq!(a[3], 1 + i as u8);
            }
        }
        assert_eq!(h.nf.ports_in_use(), (0, 20));
    }

    #[test]
    fn exhaustion_drops_new_flows_without_keeping_state() {
        let mut h = Harness::new(nat(1, 5000, 5001));
        for i in 0..2 {
            assert_eq!(h.run(&udp4([10, 0, 0, 1], REMOTE, 100 + i, 53)).1, Action::Pass);
        }
        let third = udp4([10, 0, 0, 1], REMOTE, 102, 53);
        let (out, act) = h.run(&third);
        assert_eq!(act, Action::Refuse);
        assert_eq!(out, third, "dropped packet left untouched");
        assert!(h.state_of(&third).is_none(), "no state kept for a refused flow");
        assert_eq!(h.run(&third).1, Action::Refuse);
        assert_eq!(report_u64(&h.nf, "dropped_pool_exhausted"), 2);
        // TCP has its own pool, still free.
        assert_eq!(h.run(&tcp4([10, 0, 0, 1], REMOTE, 102, 53, TcpFlags::SYN.bits(), 0, 0)).1, Action::Pass);
    }

    #[test]
    fn idle_mapping_is_free_at_lookup_and_its_stale_inbound_is_dropped() {
        const S: u64 = 1_000_000_000;
        let mut h = Harness::new(nat_with(&[("ports", "6000-6000"), ("timeout", "10")]));
        let a_out = udp4([10, 0, 0, 1], REMOTE, 1111, 53);
        let (out, _) = h.run(&a_out);
        assert_eq!(src_of(&out), (EXT, 6000));
        // The remote's reply flow is created while A holds the port.
        let a_reply = udp4(REMOTE, EXT, 53, 6000);
        assert_eq!(dst_of(&h.run(&a_reply).0), ([10, 0, 0, 1], 1111));
        // Pool of one: B is refused while A holds it, up to exactly the timeout.
        let b_out = udp4([10, 0, 0, 2], [192, 0, 2, 9], 2222, 123);
        h.now_ns = 10 * S;
        assert_eq!(h.run(&b_out).1, Action::Refuse);
        assert_eq!(h.run(&a_reply).1, Action::Pass, "replies do not refresh the mapping, but 10 s is not past 10 s");
        // Past the timeout: A's mapping is free, whatever the executor's sweep did.
        h.now_ns = 10 * S + 1;
        assert_eq!(h.nf.ports_in_use(), (0, 1), "counted at the last packet's time");
        assert_eq!(h.run(&a_reply).1, Action::Drop, "idle: the reply is stale");
        let (bout, act) = h.run(&b_out);
        assert_eq!((src_of(&bout), act), ((EXT, 6000), Action::Pass), "B takes the idle port");
        assert_ne!(h.state_of(&b_out).unwrap().gen, h.state_of(&a_reply).unwrap().gen);
        // A's old inbound flow is judged against B's mapping: apdf refuses it, and keeps refusing.
        let (stale, act) = h.run(&a_reply);
        assert_eq!((stale, act), (a_reply.clone(), Action::Drop));
        assert_eq!(h.state_of(&a_reply).unwrap().kind, kind::STALE);
        assert_eq!(h.run(&a_reply).1, Action::Drop);
        assert_eq!(report_u64(&h.nf, "dropped_stale"), 3);
        // B's own reply is translated to B.
        let (bback, act) = h.run(&udp4([192, 0, 2, 9], EXT, 123, 6000));
        assert_eq!(act, Action::Pass);
        assert_eq!(dst_of(&bback), ([10, 0, 0, 2], 2222));
        assert_ipv4_checksums(&bback);
        // A comes back: its mapping was reclaimed, so it is a new flow; the pool is B's.
        assert_eq!(h.run(&a_out).1, Action::DropEndFlow);
        let r = h.nf.report().unwrap();
        assert_eq!((r["idle_mappings_reclaimed"].as_u64(), r["mappings_created"].as_u64()), (Some(1), Some(2)));
        // The executor dropping a flow entry frees nothing: release is not even declared.
        const { assert!(!<Nat as StatefulNf>::HAS_RELEASE) };
    }

    #[test]
    fn an_idle_outbound_flow_starts_a_new_mapping_and_the_clock_may_jump_back() {
        const S: u64 = 1_000_000_000;
        let mut h = Harness::new(nat_with(&[("ports", "6000-6001"), ("timeout", "10")]));
        let a = udp4([10, 0, 0, 1], REMOTE, 1111, 53);
        h.now_ns = 100 * S;
        assert_eq!(src_of(&h.run(&a).0), (EXT, 6000));
        // Past the timeout, the same 5-tuple gets a fresh mapping: the free list's next port.
        h.now_ns = 111 * S;
        assert_eq!(src_of(&h.run(&a).0), (EXT, 6001));
        assert_eq!(report_u64(&h.nf, "remapped_after_idle"), 1);
        // A clock that goes back never expires a mapping early.
        h.now_ns = 50 * S;
        assert_eq!(src_of(&h.run(&a).0), (EXT, 6001));
        h.now_ns = 59 * S;
        assert_eq!(src_of(&h.run(&a).0), (EXT, 6001), "rebased at 50 s: live");
        assert_eq!(h.run(&udp4(REMOTE, EXT, 53, 6001)).1, Action::Pass);
        // Both ports held: A's first mapping (last seen at 100 s, in the future) is rebased
        // to 60 s by the search, not reclaimed. The exhausted answer holds until the earliest
        // mapping can be idle; then the idle one (A's, last seen at 59 s) is found.
        h.now_ns = 60 * S;
        let (b, c) = (udp4([10, 0, 0, 2], REMOTE, 2222, 53), udp4([10, 0, 0, 3], REMOTE, 3333, 53));
        assert_eq!(h.run(&b).1, Action::Refuse);
        assert_eq!(h.nf.ports_in_use(), (0, 2));
        assert_eq!(h.run(&c).1, Action::Refuse);
        h.now_ns = 69 * S;
        assert_eq!(h.run(&c).1, Action::Refuse, "59 s + 10 s is not past the timeout");
        h.now_ns = 69 * S + 1;
        assert_eq!(src_of(&h.run(&c).0), (EXT, 6001), "A idle since 59 s: C takes its port");
        assert_eq!(h.nf.ports_in_use(), (0, 2));
        assert_eq!(h.run(&udp4(REMOTE, EXT, 53, 6001)).0, udp4(REMOTE, [10, 0, 0, 3], 53, 3333));
    }

    #[test]
    fn tcp_rst_releases_the_port_fin_does_not() {
        let mut h = Harness::new(nat(1, 7000, 7000));
        let ack = tcp4([10, 0, 0, 1], REMOTE, 3000, 80, TcpFlags::ACK.bits(), 1, 1);
        assert_eq!(h.run(&ack).1, Action::Pass);
        let fin = tcp4([10, 0, 0, 1], REMOTE, 3000, 80, TcpFlags::FIN.bits() | TcpFlags::ACK.bits(), 2, 1);
        assert_eq!(h.run(&fin).1, Action::Pass);
        assert_eq!(
            h.nf.ports_in_use(),
            (1, 0),
            "a FIN one way keeps the port (until FINs both ways and TIME_WAIT, or the idle timeout)"
        );
        let rst = tcp4([10, 0, 0, 1], REMOTE, 3000, 80, TcpFlags::RST.bits(), 3, 0);
        let (out, act) = h.run(&rst);
        assert_eq!(act, Action::EndFlow);
        assert_eq!(src_of(&out), (EXT, 7000), "the RST itself is translated");
        assert_ipv4_checksums(&out);
        assert_eq!(h.nf.ports_in_use(), (0, 0));
        assert!(h.state_of(&ack).is_none());
        // The port is free again.
        let other = tcp4([10, 0, 0, 5], REMOTE, 3001, 80, TcpFlags::SYN.bits(), 0, 0);
        assert_eq!(src_of(&h.run(&other).0), (EXT, 7000));
    }

    fn nat_with(params: &[(&str, &str)]) -> Nat {
        let mut p = Params::new("nat", params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        Nat::from_params(&mut p).unwrap()
    }

    /// `ctl set nat external A addrs N`: mappings made before the change keep their address and port in
    /// both directions though the address left the pool (an unmapped port of it is still dropped); new flows
    /// take the new pool's addresses, never a retired one, even when the new pool runs dry; a mapping on a
    /// retired address that ends frees no port; an address back in the pool gets its free ports back.
    #[test]
    fn a_new_pool_keeps_every_mapping_and_retires_the_old_addresses() {
        let base = [("ports", "40000-40004")];
        let mut h = Harness::new(nat_with(&base));
        let set = |h: &mut Harness<Nat>, ext: &str, n: &str| {
            let mut pairs: Vec<(String, String)> = base.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            pairs.extend([("external".to_string(), ext.to_string()), ("addrs".to_string(), n.to_string())]);
            h.nf.reconfigure(&mut Params::new("nat", pairs))
        };
        let udp = |sport: u16| udp4([10, 0, 0, 1], REMOTE, sport, 53);
        let syn = tcp4([10, 0, 0, 1], REMOTE, 7000, 443, TcpFlags::SYN.bits(), 1, 0);
        assert_eq!(src_of(&h.run(&udp(5000)).0), (EXT, 40000));
        assert_eq!(src_of(&h.run(&syn).0), (EXT, 40000));
        set(&mut h, "198.51.100.50", "2").unwrap();
        let rep = h.nf.report().unwrap();
        assert_eq!((rep["external"].as_str(), rep["addrs"].as_u64()), (Some("198.51.100.50"), Some(2)));
        assert_eq!(rep["retired_addrs"], json!(["203.0.113.1"]));
        assert_eq!(report_u64(&h.nf, "mappings_on_retired_addrs"), 2);
        // The old flow keeps its mapping both ways; its address's other ports stay closed.
        let (out, act) = h.run(&udp(5000));
        assert_eq!((src_of(&out), act), ((EXT, 40000), Action::Pass));
        assert_ipv4_checksums(&out);
        let (back, act) = h.run(&udp4(REMOTE, EXT, 53, 40000));
        assert_eq!((dst_of(&back), act), (([10, 0, 0, 1], 5000), Action::Pass));
        assert_eq!(h.run(&udp4(REMOTE, EXT, 53, 40001)).1, Action::Refuse, "unmapped port of a retired address");
        // New flows: the new pool's 2 x 5 ports, address-interleaved, then exhausted (never the retired address).
        let mut got = Vec::new();
        for k in 0..11 {
            let (out, act) = h.run(&udp(6000 + k));
            got.push((act == Action::Pass).then(|| src_of(&out)));
        }
        let new = |a: u8, p: u16| Some(([198, 51, 100, a], p));
        assert_eq!(&got[..4], &[new(50, 40000), new(51, 40000), new(50, 40001), new(51, 40001)]);
        assert!(got[..10].iter().all(|g| g.is_some_and(|(a, _)| a != EXT)) && got[10].is_none(), "{got:?}");
        // The TCP mapping on the retired address ends (RST from inside): its port is not reused.
        let rst = tcp4([10, 0, 0, 1], REMOTE, 7000, 443, TcpFlags::RST.bits(), 2, 0);
        assert_eq!(h.run(&rst).1, Action::EndFlow);
        assert_eq!(report_u64(&h.nf, "retired_mappings_ended"), 1);
        assert_eq!(report_u64(&h.nf, "mappings_on_retired_addrs"), 1);
        let (out, _) = h.run(&tcp4([10, 0, 0, 1], REMOTE, 7001, 443, TcpFlags::SYN.bits(), 1, 0));
        assert_eq!(src_of(&out), ([198, 51, 100, 50], 40000), "a new TCP flow takes the new pool");
        // Back to the old address: its free ports (all but the UDP flow's) serve new flows; the UDP flow keeps its.
        set(&mut h, "203.0.113.1", "1").unwrap();
        assert_eq!(h.nf.report().unwrap()["retired_addrs"], json!(["198.51.100.50", "198.51.100.51"]));
        assert_eq!(src_of(&h.run(&udp(7000)).0), (EXT, 40001));
        assert_eq!(src_of(&h.run(&udp(5000)).0), (EXT, 40000));
        assert_eq!(src_of(&h.run(&udp(6000)).0), ([198, 51, 100, 50], 40000), "kept on a now retired address");
        // Refused in one line: a pool overlapping the inside prefix; the pool is unchanged.
        let e = set(&mut h, "10.0.0.9", "1").unwrap_err().0;
        assert!(e.contains("overlap 'internal=10.0.0.0/8'"), "{e}");
        assert_eq!(h.nf.config().external, Ipv4Addr::new(203, 0, 113, 1));
    }

    #[test]
    fn inbound_filtering_follows_rfc_4787_behaviours() {
        // One mapping: 10.0.0.1:1111 -> 8.8.8.8:53. Who may reach it back?
        let dns = [8, 8, 8, 8];
        let cases: [(&[u8; 4], u16, [bool; 3]); 4] = [
            //                 eif    adf    apdf
            (&dns, 53, [true, true, true]),            // the mapping's remote
            (&dns, 5353, [true, true, false]),         // its address, another port
            (&[6, 6, 6, 6], 53, [true, false, false]), // another host, same port
            (&[6, 6, 6, 6], 80, [true, false, false]), // anyone else
        ];
        for (m, mode) in ["eif", "adf", "apdf"].iter().enumerate() {
            let mut h = Harness::new(nat_with(&[("filter", mode)]));
            let (out, _) = h.run(&udp4([10, 0, 0, 1], dns, 1111, 53));
            let (ext, port) = src_of(&out);
            let mut filtered = 0;
            for (src, sport, allowed) in cases {
                let f = udp4(*src, ext, sport, port);
                let (back, act) = h.run(&f);
                if allowed[m] {
                    assert_eq!(act, Action::Pass, "{mode}: {src:?}:{sport} is let in");
                    assert_eq!(dst_of(&back), ([10, 0, 0, 1], 1111));
                    assert_ipv4_checksums(&back);
                } else {
                    filtered += 1;
                    assert_eq!((back, act), (f.clone(), Action::Refuse), "{mode}: {src:?}:{sport} is filtered");
                    assert!(h.state_of(&f).is_none(), "{mode}: a filtered packet leaves no state");
                }
            }
            let r = h.nf.report().unwrap();
            assert_eq!((r["filter"].as_str(), r["dropped_filtered"].as_u64()), (Some(*mode), Some(filtered)));
        }
        // The default is the safe one; TCP filters the same way.
        assert_eq!(
            Nat::from_params(&mut Params::new("nat", vec![])).unwrap().config().filter,
            Filter::AddressAndPortDependent
        );
        let mut h = Harness::new(nat(1, 3000, 3000));
        let (out, _) = h.run(&tcp4([10, 0, 0, 1], REMOTE, 4000, 443, TcpFlags::SYN.bits(), 1, 0));
        let (ext, port) = src_of(&out);
        let synack = TcpFlags::SYN.bits() | TcpFlags::ACK.bits();
        assert_eq!(h.run(&tcp4([6, 6, 6, 6], ext, 443, port, synack, 9, 2)).1, Action::Refuse);
        assert_eq!(h.run(&tcp4(REMOTE, ext, 443, port, synack, 9, 2)).1, Action::Pass);
    }

    /// On several cores a core's last packet may be long before the run's end: the report
    /// judges at the end the engine hands over, as a one-core run's last packet would.
    #[test]
    fn ports_in_use_and_time_wait_are_judged_at_the_run_end() {
        const S: u64 = 1_000_000_000;
        let (syn, fin) = (TcpFlags::SYN.bits(), TcpFlags::FIN.bits() | TcpFlags::ACK.bits());
        let mut h = Harness::new(nat_with(&[("ports", "7000-7001"), ("fin_timeout", "2"), ("timeout", "10")]));
        h.run(&udp4([10, 0, 0, 1], REMOTE, 1111, 53));
        let out = |flags| tcp4([10, 0, 0, 2], REMOTE, 3000, 80, flags, 1, 1);
        h.run(&out(syn));
        h.now_ns = 8 * S;
        h.run(&tcp4(REMOTE, EXT, 80, 7000, fin, 100, 2));
        h.run(&out(fin));
        let r = h.nf.report().unwrap();
        assert_eq!((r["tcp_ports_in_use"].as_u64(), r["tcp_ports_in_time_wait"].as_u64()), (Some(1), Some(1)));
        assert_eq!(r["udp_ports_in_use"], 1, "at this core's last packet (8 s)");
        // The run ended at 11 s: the UDP mapping (last out at 0 s) is idle, TIME_WAIT (over at 10 s) released.
        h.nf.end_of_run(11 * S);
        let r = h.nf.report().unwrap();
        assert_eq!((r["tcp_ports_in_use"].as_u64(), r["udp_ports_in_use"].as_u64()), (Some(0), Some(0)));
        assert_eq!((r["tcp_ports_in_time_wait"].as_u64(), r["time_wait_released"].as_u64()), (Some(0), Some(1)));
        // An end before the core's own last packet changes nothing.
        h.nf.end_of_run(S);
        assert_eq!(h.nf.report().unwrap()["time_wait_released"], 1);
    }

    #[test]
    fn fin_both_ways_releases_the_port_after_time_wait_on_the_packet_clock() {
        let (syn, ack, fin) = (TcpFlags::SYN.bits(), TcpFlags::ACK.bits(), TcpFlags::FIN.bits() | TcpFlags::ACK.bits());
        let mut h = Harness::new(nat_with(&[("ports", "7000-7000"), ("fin_timeout", "2")]));
        let out = |flags, seq| tcp4([10, 0, 0, 1], REMOTE, 3000, 80, flags, seq, 1);
        let inb = |flags| tcp4(REMOTE, EXT, 80, 7000, flags, 100, 2);
        assert_eq!(src_of(&h.run(&out(syn, 1)).0), (EXT, 7000));
        assert_eq!(h.run(&inb(syn | ack)).1, Action::Pass);
        // The remote closes first; then the inside host: FINs both ways at t = 1 s.
        h.now_ns = 500_000_000;
        assert_eq!(h.run(&inb(fin)).1, Action::Pass);
        assert_eq!(h.nf.report().unwrap()["tcp_ports_in_time_wait"], 0, "one FIN is not a close");
        h.now_ns = 1_000_000_000;
        assert_eq!(h.run(&out(fin, 2)).1, Action::Pass);
        let r = h.nf.report().unwrap();
        assert_eq!((r["tcp_ports_in_time_wait"].as_u64(), r["fin_closed_connections"].as_u64()), (Some(1), Some(1)));
        // TIME_WAIT: the last ACK and a retransmitted FIN still go through, both ways.
        h.now_ns = 2_999_999_999;
        let (last, act) = h.run(&out(ack, 3));
        assert_eq!((src_of(&last), act), ((EXT, 7000), Action::Pass));
        assert_eq!(dst_of(&h.run(&inb(fin)).0), ([10, 0, 0, 1], 3000));
        // The next host talks to the remote's other port.
        let other = tcp4([10, 0, 0, 2], REMOTE, 5000, 81, syn, 1, 0);
        assert_eq!(h.run(&other).1, Action::Refuse, "the only port is still held");
        assert_eq!(h.nf.ports_in_use(), (1, 0));
        // 2 s after the close the first packet the NAT sees releases it — and can take it.
        h.now_ns = 3_000_000_000;
        let (o, act) = h.run(&other);
        assert_eq!((src_of(&o), act), ((EXT, 7000), Action::Pass), "released port reused by the next host");
        let r = h.nf.report().unwrap();
        assert_eq!((r["time_wait_released"].as_u64(), r["ports_released"].as_u64()), (Some(1), Some(1)));
        // The old connection's packets never reach the new owner (apdf: it maps to REMOTE:81).
        assert_eq!(h.run(&inb(ack)).1, Action::Drop, "stale inbound");
        assert_eq!(h.state_of(&inb(ack)).unwrap().kind, kind::STALE);
        // A late packet of the old outbound 5-tuple is a new connection: no port left for it.
        assert_eq!(h.run(&out(ack, 3)).1, Action::DropEndFlow);
        assert_eq!(h.nf.report().unwrap()["remapped_after_time_wait"], 1);
        assert_eq!(h.nf.ports_in_use(), (1, 0));
        // Export: the new owner's flow only; the closed connection's rows are gone.
        let row = |f: &[u8]| h.nf.export_row(&h.key_of(f).unwrap(), &h.state_of(f).unwrap());
        assert!(h.state_of(&out(ack, 3)).is_none() && row(&inb(ack)).is_none());
        assert_eq!(row(&other).unwrap()["src"], "10.0.0.2");
    }

    #[test]
    fn a_new_connection_to_the_same_remote_endpoint_gets_its_replies_after_rst_and_time_wait() {
        // Issue 29: the replies of a connection that reuses a port freed by an inside RST or
        // by TIME_WAIT, toward the same remote endpoint (the same inbound 5-tuple), were dropped
        // as stale. They belong to the port's current mapping, under every filter.
        let (syn, ack, rst, fin) = (
            TcpFlags::SYN.bits(),
            TcpFlags::ACK.bits(),
            TcpFlags::RST.bits(),
            TcpFlags::FIN.bits() | TcpFlags::ACK.bits(),
        );
        for filter in ["eif", "adf", "apdf"] {
            let mut h = Harness::new(nat_with(&[("ports", "7000-7000"), ("fin_timeout", "1"), ("filter", filter)]));
            let inb = |flags| tcp4(REMOTE, EXT, 80, 7000, flags, 100, 2);
            let a = |flags| tcp4([10, 0, 0, 1], REMOTE, 3000, 80, flags, 1, 0);
            let b = |flags| tcp4([10, 0, 0, 2], REMOTE, 4000, 80, flags, 1, 0);
            let c = |flags| tcp4([10, 0, 0, 3], REMOTE, 5000, 80, flags, 1, 0);
            h.run(&a(syn));
            assert_eq!(dst_of(&h.run(&inb(syn | ack)).0), ([10, 0, 0, 1], 3000));
            assert_eq!(h.run(&a(rst)).1, Action::EndFlow);
            assert_eq!(src_of(&h.run(&b(syn)).0), (EXT, 7000), "{filter}");
            for _ in 0..3 {
                assert_eq!(dst_of(&h.run(&inb(ack)).0), ([10, 0, 0, 2], 4000), "{filter}: B's reply");
            }
            h.run(&b(fin));
            h.run(&inb(fin));
            h.now_ns = 2_000_000_000;
            assert_eq!(src_of(&h.run(&c(syn)).0), (EXT, 7000), "{filter}: after TIME_WAIT");
            for _ in 0..3 {
                assert_eq!(dst_of(&h.run(&inb(ack)).0), ([10, 0, 0, 3], 5000), "{filter}: C's reply");
            }
            let r = h.nf.report().unwrap();
            assert_eq!((r["dropped_stale"].as_u64(), r["inbound_rejudged"].as_u64()), (Some(0), Some(2)), "{filter}");
        }
    }

    #[test]
    fn rst_releases_at_once_from_inside_and_ends_only_the_inbound_flow_from_outside() {
        let (syn, ack, rst) = (TcpFlags::SYN.bits(), TcpFlags::ACK.bits(), TcpFlags::RST.bits());
        let mut h = Harness::new(nat_with(&[("ports", "7000-7000")]));
        let out = tcp4([10, 0, 0, 1], REMOTE, 3000, 80, syn, 1, 0);
        h.run(&out);
        let inb = |flags| tcp4(REMOTE, EXT, 80, 7000, flags, 100, 2);
        assert_eq!(h.run(&inb(syn | ack)).1, Action::Pass);
        let (r, act) = h.run(&inb(rst));
        assert_eq!((dst_of(&r), act), (([10, 0, 0, 1], 3000), Action::EndFlow), "the RST is delivered, its flow ends");
        assert!(h.state_of(&inb(ack)).is_none());
        assert_eq!(h.nf.ports_in_use(), (1, 0), "the inside host still holds the port");
        // The inside host answers with its own RST: released at once.
        assert_eq!(h.run(&tcp4([10, 0, 0, 1], REMOTE, 3000, 80, rst, 2, 0)).1, Action::EndFlow);
        assert_eq!(h.nf.ports_in_use(), (0, 0));
        // A FIN after an RST-ended flow: a new connection on a fresh mapping, nothing left in TIME_WAIT.
        assert_eq!(h.nf.report().unwrap()["tcp_ports_in_time_wait"], 0);
    }

    /// RFC 8158 events (`--ipfix`): a create per mapping with its translation, a delete at each of the three
    /// releases (RST from inside, the end of TIME_WAIT at its deadline, an idle mapping reclaimed), and one
    /// addresses-exhausted event per second of packet time however many packets find the pool empty.
    #[test]
    fn ipfix_events_follow_the_mappings() {
        use crate::ipfix::{ExportRecord, NatEvent, RecordTx};
        use std::sync::atomic::{AtomicBool, AtomicU64};
        use std::sync::Arc;
        const S: u64 = 1_000_000_000;
        let (syn, fin, rst) = (TcpFlags::SYN.bits(), TcpFlags::FIN.bits() | TcpFlags::ACK.bits(), TcpFlags::RST.bits());
        let mut h = Harness::new(nat_with(&[("ports", "7000-7000"), ("fin_timeout", "2"), ("timeout", "5")]));
        let lost = Arc::new(AtomicU64::new(0));
        let (tx, mut rx) = RecordTx::new(64, Arc::clone(&lost), Arc::new(AtomicBool::new(false)), 0);
        h.nf.attach_ipfix(tx);
        let mut events = |want: &[(NatEvent, u64, u16)]| {
            let mut got = Vec::new();
            while let Ok(ExportRecord::Nat(n)) = rx.pop() {
                got.push((n.event, n.time_ns, n.inside.map_or(0, |t| t.src_port())));
                if n.event == NatEvent::Nat44SessionCreate {
                    assert_eq!((n.post_src, n.post_sport), (Ipv4Addr::from(EXT), 7000));
                }
            }
            assert_eq!(got, want);
        };
        // A takes the only port; B finds the pool empty twice in a second (one event), then again a second later.
        h.run(&tcp4([10, 0, 0, 1], REMOTE, 3000, 80, syn, 1, 0));
        for t in [0, S / 2, S] {
            h.now_ns = t;
            h.run(&tcp4([10, 0, 0, 2], REMOTE, 4000, 80, syn, 1, 0));
        }
        events(&[
            (NatEvent::Nat44SessionCreate, 0, 3000),
            (NatEvent::AddressesExhausted, 0, 0),
            (NatEvent::AddressesExhausted, S, 0),
        ]);
        // A resets: deleted at once; B gets the port.
        h.run(&tcp4([10, 0, 0, 1], REMOTE, 3000, 80, rst, 2, 0));
        h.run(&tcp4([10, 0, 0, 2], REMOTE, 4000, 80, syn, 1, 0));
        events(&[(NatEvent::Nat44SessionDelete, S, 3000), (NatEvent::Nat44SessionCreate, S, 4000)]);
        // B closes both ways at 1 s: released at the TIME_WAIT deadline (3 s), logged with that time.
        h.run(&tcp4([10, 0, 0, 2], REMOTE, 4000, 80, fin, 2, 1));
        h.run(&tcp4(REMOTE, EXT, 80, 7000, fin, 5, 3));
        h.now_ns = 4 * S;
        h.run(&tcp4([10, 0, 0, 3], REMOTE, 5000, 80, syn, 1, 0));
        events(&[(NatEvent::Nat44SessionDelete, 3 * S, 4000), (NatEvent::Nat44SessionCreate, 4 * S, 5000)]);
        // C idles past 5 s: D reclaims the port (C's delete, then D's create).
        h.now_ns = 10 * S;
        h.run(&tcp4([10, 0, 0, 4], REMOTE, 6000, 80, syn, 1, 0));
        events(&[(NatEvent::Nat44SessionDelete, 10 * S, 5000), (NatEvent::Nat44SessionCreate, 10 * S, 6000)]);
        assert_eq!(lost.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    /// `--table-full evict` takes a NAT pair as a whole (issue 33): evicting the outbound entry frees the port
    /// (its replies are then dropped as stale, the next outbound packet maps afresh, and the port goes to the
    /// free list's tail for reuse); evicting the inbound entry keeps the mapping and the next reply rebuilds it.
    #[test]
    fn eviction_ends_a_pair_together_and_frees_its_port() {
        let mut h = Harness::new(nat(1, 7000, 7001));
        let (a, b) = (udp4([10, 0, 0, 1], REMOTE, 3000, 53), udp4([10, 0, 0, 2], REMOTE, 3001, 53));
        assert_eq!(src_of(&h.run(&a).0), (EXT, 7000));
        assert_eq!(src_of(&h.run(&b).0), (EXT, 7001));
        let (reply_a, reply_b) = (udp4(REMOTE, EXT, 53, 7000), udp4(REMOTE, EXT, 53, 7001));
        assert_eq!(dst_of(&h.run(&reply_a).0), ([10, 0, 0, 1], 3000));
        assert_eq!(dst_of(&h.run(&reply_b).0), ([10, 0, 0, 2], 3001));
        // B's inbound entry evicted: the mapping stays, the next reply is translated again.
        assert!(h.evict(&reply_b));
        assert_eq!(h.run(&reply_b), (udp4(REMOTE, [10, 0, 0, 2], 53, 3001), Action::Pass));
        // A's outbound entry evicted: the port is free, A's reply (its inbound entry still there) is dropped.
        assert!(h.evict(&a));
        assert_eq!(h.nf.ports_in_use(), (0, 1));
        assert_eq!(h.run(&reply_a).1, Action::Drop);
        // The freed port is reused: C takes it (the pool has two ports, B holds the other), and A, as a new
        // flow, finds the pool exhausted.
        let c = udp4([10, 0, 0, 3], REMOTE, 3002, 54);
        assert_eq!(src_of(&h.run(&c).0), (EXT, 7000));
        assert_eq!(h.run(&a).1, Action::Refuse);
        // A reply from A's remote endpoint never reaches C (filtered by C's remote port under apdf).
        assert_eq!(h.run(&reply_a).1, Action::Drop);
        let r = h.nf.report().unwrap();
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!((n("evicted_mappings"), n("evicted_inbound"), n("ports_released")), (1, 1, 1), "{r}");
        assert_eq!((n("mappings_created"), n("dropped_stale"), n("dropped_pool_exhausted")), (3, 2, 1), "{r}");
        assert_eq!(n("mappings_created") - n("ports_released"), n("udp_ports_in_use"), "{r}");
        // Evicting states that hold nothing (a refused or pending flow, a stale entry) frees nothing.
        h.nf.evict(&h.key_of(&a).unwrap(), &Nat::state(kind::PENDING));
        assert!(h.evict(&reply_a));
        assert_eq!(h.nf.ports_in_use(), (0, 2));
    }

    #[test]
    fn time_wait_of_a_port_released_meanwhile_is_ignored() {
        // FINs both ways, then the mapping idles out before the TIME_WAIT ends and B takes
        // the port: the port is released once, and the later deadline does not free B's.
        const S: u64 = 1_000_000_000;
        let fin = TcpFlags::FIN.bits() | TcpFlags::ACK.bits();
        let mut h = Harness::new(nat_with(&[("ports", "7000-7000"), ("fin_timeout", "10"), ("timeout", "5")]));
        h.run(&tcp4([10, 0, 0, 1], REMOTE, 3000, 80, fin, 1, 1));
        h.run(&tcp4(REMOTE, EXT, 80, 7000, fin, 5, 2));
        let b = tcp4([10, 0, 0, 2], REMOTE, 4000, 80, TcpFlags::SYN.bits(), 1, 0);
        h.now_ns = 6 * S;
        assert_eq!(src_of(&h.run(&b).0), (EXT, 7000), "A idle past 5 s: reclaimed");
        for t in [9, 12, 15] {
            h.now_ns = t * S;
            assert_eq!(src_of(&h.run(&b).0), (EXT, 7000), "b keeps its port after a's deadline");
        }
        assert_eq!(h.nf.ports_in_use(), (1, 0));
        let r = h.nf.report().unwrap();
        assert_eq!((r["time_wait_released"].as_u64(), r["ports_released"].as_u64()), (Some(0), Some(1)));
        assert_eq!(r["idle_mappings_reclaimed"], 1);
    }

    #[test]
    fn a_full_time_wait_queue_is_counted_and_leaves_the_port_to_the_idle_timeout() {
        // One port, so one place in the queue: A closes (queued), then RSTs (released at
        // once, its stale entry stays queued); B takes the port and closes: no place left.
        let (fin, rst) = (TcpFlags::FIN.bits() | TcpFlags::ACK.bits(), TcpFlags::RST.bits());
        let mut h = Harness::new(nat_with(&[("ports", "7000-7000"), ("fin_timeout", "1")]));
        for (host, sport, dport) in [([10, 0, 0, 1], 3000, 80), ([10, 0, 0, 2], 3001, 81)] {
            assert_eq!(src_of(&h.run(&tcp4(host, REMOTE, sport, dport, fin, 1, 1)).0), (EXT, 7000));
            assert_eq!(h.run(&tcp4(REMOTE, EXT, dport, 7000, fin, 5, 2)).1, Action::Pass);
            if sport == 3000 {
                assert_eq!(h.run(&tcp4(host, REMOTE, sport, dport, rst, 2, 0)).1, Action::EndFlow);
            }
        }
        let r = h.nf.report().unwrap();
        assert_eq!((r["time_wait_queue_full"].as_u64(), r["fin_closed_connections"].as_u64()), (Some(1), Some(2)));
        h.now_ns = 5_000_000_000;
        h.run(&udp4([10, 0, 0, 9], REMOTE, 1, 2));
        assert_eq!(h.nf.ports_in_use().0, 1, "B keeps the port until its flow idles out");
    }

    #[test]
    fn unmapped_inbound_is_dropped_without_state() {
        let mut h = Harness::new(nat(2, 1024, 2047));
        let cases = [
            udp4(REMOTE, EXT, 53, 1500),              // in range, never mapped
            udp4(REMOTE, EXT, 53, 80),                // below the range
            udp4(REMOTE, EXT, 53, 4000),              // above the range
            udp4(REMOTE, [203, 0, 113, 2], 53, 1024), // second address, unmapped
            tcp4(REMOTE, EXT, 53, 1024, TcpFlags::SYN.bits(), 0, 0),
        ];
        for f in &cases {
            let (out, act) = h.run(f);
            assert_eq!(act, Action::Refuse);
            assert_eq!(&out, f);
            assert!(h.state_of(f).is_none());
        }
        assert_eq!(report_u64(&h.nf, "dropped_unmapped"), 5);
        // A UDP mapping does not open the same TCP port.
        let (o, _) = h.run(&udp4([10, 0, 0, 1], REMOTE, 9, 53));
        let (a, p) = src_of(&o);
        assert_eq!(h.run(&tcp4(REMOTE, a, 53, p, TcpFlags::SYN.bits(), 0, 0)).1, Action::Refuse);
    }

    #[test]
    fn transit_ipv6_and_other_protocols() {
        let mut h = Harness::new(nat(1, 1024, 65535));
        // Neither inside nor to us: untouched.
        let t = udp4([192, 0, 2, 1], REMOTE, 1, 2);
        assert_eq!(h.run(&t), (t.clone(), Action::Pass));
        // ICMP echo from inside: passed untouched by default.
        let icmp = ipv4_frame([10, 0, 0, 1], REMOTE, IpProtocol::ICMP.0, &[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
        assert!(PktMeta::parse(&icmp).valid, "ICMP has a flow key");
        assert_eq!(h.run(&icmp), (icmp.clone(), Action::Pass));
        // IPv6 is not translated.
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        v6[14] = 0x60;
        v6[18..20].copy_from_slice(&8u16.to_be_bytes());
        v6[20] = IpProtocol::UDP.0;
        v6[21] = 64;
        v6[22] = 0xfd;
        v6[54..56].copy_from_slice(&1u16.to_be_bytes());
        v6[56..58].copy_from_slice(&2u16.to_be_bytes());
        v6[58..60].copy_from_slice(&8u16.to_be_bytes());
        assert!(PktMeta::parse(&v6).valid && PktMeta::parse(&v6).v6);
        assert_eq!(h.run(&v6), (v6.clone(), Action::Pass));
        let r = h.nf.report().unwrap();
        assert_eq!(r["passed_transit"], 1);
        assert_eq!(r["passed_other_proto"], 1);
        assert_eq!(r["passed_ipv6"], 1);

        // other=drop drops ICMP from inside and to the external address.
        let mut p = Params::new("nat", vec![("other".into(), "drop".into())]);
        let mut h = Harness::new(Nat::from_params(&mut p).unwrap());
        assert_eq!(h.run(&icmp).1, Action::Refuse);
        let inbound_icmp = ipv4_frame(REMOTE, EXT, IpProtocol::ICMP.0, &[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
        assert_eq!(h.run(&inbound_icmp).1, Action::Refuse);
        assert_eq!(report_u64(&h.nf, "dropped_other_proto"), 2);
    }

    #[test]
    fn malformed_truncated_and_fragments() {
        let mut h = Harness::new(nat(1, 1024, 65535));
        let good = tcp4([10, 0, 0, 1], REMOTE, 4000, 80, TcpFlags::SYN.bits(), 0, 0);
        // Every truncation of a valid inside packet: no panic; unparsed ones dropped.
        for len in 0..good.len() {
            let f = &good[..len];
            let (out, act) = h.run(f);
            assert_eq!(out.len(), len);
            if !PktMeta::parse(f).valid {
                assert_eq!(act, Action::Drop);
            }
        }
        assert!(report_u64(&h.nf, "dropped_unparsed") > 0);
        // Garbage and non-IP frames.
        for f in [vec![0xffu8; 60], vec![0u8; 14], {
            let mut arp = vec![0u8; 42];
            arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
            arp
        }] {
            assert_eq!(h.run(&f).1, Action::Drop);
        }
        // A TCP header cut right after the ports is still translated (nothing to checksum).
        let short = &good[..38];
        assert!(PktMeta::parse(short).valid);
        let (out, act) = h.run(short);
        assert_eq!(act, Action::Pass);
        assert_eq!(&out[26..30], &EXT);
        // A non-first fragment of an inside UDP datagram: no ports, dropped.
        let mut frag = udp4([10, 0, 0, 3], REMOTE, 1, 2);
        frag[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
        let c = flowplane_wire::checksum::checksum(&{
            let mut hdr = frag[14..34].to_vec();
            hdr[10..12].copy_from_slice(&[0, 0]);
            hdr
        });
        frag[24..26].copy_from_slice(&c.to_be_bytes());
        let m = PktMeta::parse(&frag);
        assert!(m.valid && m.l4 == 0, "non-first fragment keyed without L4");
        assert_eq!(h.run(&frag).1, Action::Refuse);
        assert_eq!(report_u64(&h.nf, "dropped_fragments"), 1);
        // UDP with no checksum keeps none.
        let mut nocsum = udp4([10, 0, 0, 4], REMOTE, 5, 6);
        nocsum[40..42].copy_from_slice(&[0, 0]);
        let (out, _) = h.run(&nocsum);
        assert_eq!(&out[40..42], &[0, 0]);
        assert_ipv4_checksums(&out);
    }

    #[test]
    fn prefetch_and_export() {
        let mut h = Harness::new(nat(1, 1024, 65535));
        let f = udp4([10, 0, 0, 1], REMOTE, 10, 20);
        let (out, _) = h.run(&f);
        let (_, p) = src_of(&out);
        let r = udp4(REMOTE, EXT, 20, p);
        h.run(&r);
        let (si, so) = (h.state_of(&r).unwrap(), h.state_of(&f).unwrap());
        h.nf.prefetch(&si);
        h.nf.prefetch(&so);
        h.nf.prefetch(&NatState { slot: u32::MAX, kind: kind::INBOUND, ..NatState::zeroed() });
        let row = h.nf.export_row(&h.key_of(&f).unwrap(), &so).unwrap();
        assert_eq!(row["direction"], "out");
        assert_eq!(row["translated_addr"], "203.0.113.1");
        assert_eq!(row["translated_port"], p);
        let row = h.nf.export_row(&h.key_of(&r).unwrap(), &si).unwrap();
        assert_eq!(row["direction"], "in");
        assert_eq!(row["translated_addr"], "10.0.0.1");
        assert!(h.nf.export_row(&h.key_of(&r).unwrap(), &Nat::state(kind::TRANSIT)).is_none());
        // Corrupt state bytes never panic.
        let mut bad = NatState { kind: 200, slot: u32::MAX, pool: 7, ..NatState::zeroed() };
        let mut data = f.clone();
        let meta = PktMeta::parse(&data);
        let ctx = NfContext::default();
        assert_eq!(h.nf.process(&mut Pkt::new(&mut data, &meta), &mut bad, &ctx), Action::DropEndFlow);
        bad.kind = kind::INBOUND;
        assert_eq!(h.nf.process(&mut Pkt::new(&mut data, &meta), &mut bad, &ctx), Action::Drop);
        bad.kind = kind::OUTBOUND;
        h.nf.release(&h.key_of(&f).unwrap(), &bad);
        assert_eq!(h.nf.ports_in_use(), (0, 1));
        assert_eq!(h.nf.idle_timeout_ns(), Some(30_000_000_000));
    }

    #[test]
    fn params() {
        let build = |pairs: &[(&str, &str)]| {
            let mut p = Params::new("nat", pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            Nat::from_params(&mut p).map(|n| *n.config())
        };
        assert_eq!(build(&[]).unwrap(), NatConfig::default());
        let c = build(&[
            ("external", "192.0.2.10"),
            ("addrs", "4"),
            ("ports", "10000-10999"),
            ("internal", "172.16.0.0/12"),
            ("timeout", "60"),
        ])
        .unwrap();
        assert_eq!((c.addrs, c.port_lo, c.port_hi, c.internal_len, c.timeout_s), (4, 10000, 10999, 12, 60));
        assert_eq!(build(&[("ports", "5000")]).unwrap().port_hi, 5000);
        let err = |pairs: &[(&str, &str)]| build(pairs).unwrap_err().0;
        assert!(err(&[("external", "1.2.3")]).contains("'external=1.2.3'"));
        assert!(err(&[("ports", "9-3")]).contains("'ports=9-3'"));
        assert!(err(&[("ports", "0-3")]).contains("'ports=0-3'"));
        assert!(err(&[("ports", "1-70000")]).contains("'ports=1-70000'"));
        assert!(err(&[("internal", "10.0.0.0/33")]).contains("'internal=10.0.0.0/33'"));
        assert!(err(&[("internal", "x/8")]).contains("'internal=x/8'"));
        assert!(err(&[("timeout", "0")]).contains("'timeout=0'"));
        assert!(err(&[("addrs", "0")]).contains("'addrs=0'"));
        assert!(err(&[("other", "maybe")]).contains("'other=maybe'"));
        assert!(err(&[("filter", "full-cone")]).contains("'filter=full-cone'"));
        assert!(err(&[("fin_timeout", "-1")]).contains("'fin_timeout=-1'"));
        let c = build(&[("filter", "adf"), ("fin_timeout", "0.5")]).unwrap();
        assert_eq!((c.filter, c.fin_timeout_ns), (Filter::AddressDependent, 500_000_000));
        assert!(err(&[("external", "255.255.255.255"), ("addrs", "2")]).contains("overflow"));
        assert!(err(&[("external", "10.1.1.1")]).contains("overlap"));
        assert!(err(&[("external", "9.255.255.255"), ("addrs", "2")]).contains("overlap"));
        assert!(err(&[("internal", "0.0.0.0/0")]).contains("overlap"));
        assert!(err(&[("addrs", "256"), ("ports", "1-65535")]).contains("exceeds"));
        // Registered under its chain-spec name; unknown parameters are refused.
        struct Name;
        impl crate::registry::NfSink for Name {
            type Out = &'static str;
            fn stateless(self, nf: Box<dyn crate::Nf>) -> &'static str {
                nf.name()
            }
            fn stateful<T: StatefulNf>(self, nf: T) -> &'static str {
                nf.name()
            }
        }
        let build = |p: Vec<(String, String)>| crate::registry::build_with("nat", Params::new("nat", p), Name);
        assert_eq!(build(vec![]), Ok("nat"));
        let typo = build(vec![("timout".into(), "5".into())]);
        assert_eq!(typo.err().unwrap().0, "nat: unknown parameter 'timout'");
    }

    /// Replication: what an active NAT pushes, a standby adopts (the records' states, as the engine imports
    /// them into its table), and the standby then translates the replies by the active's mappings, keeps
    /// those ports out of its own allocations, and frees them on the active's release.
    #[test]
    fn a_standby_adopts_the_active_mappings_and_follows_their_release() {
        let (tx, mut rx) = crate::repl::test_queue();
        let mut a = Harness::new(nat(1, 1024, 1027));
        a.nf.attach_repl(tx);
        let mut b = Harness::new(nat(1, 1024, 1027));
        let out = |i: u8| tcp4([10, 0, 0, i], REMOTE, 5000, 80, 0x10, 1, 1);
        let mut ext = Vec::new();
        for i in 1..=3 {
            let (f, act) = a.run(&out(i));
            assert_eq!(act, Action::Pass);
            ext.push(src_of(&f).1);
        }
        let take =
            |rx: &mut rtrb::Consumer<crate::repl::Record>| std::iter::from_fn(|| rx.pop().ok()).collect::<Vec<_>>();
        let recs = take(&mut rx);
        assert_eq!(recs.len(), 3);
        for r in &recs {
            assert_eq!(r.op, crate::repl::Op::Upsert);
            let mut st: NatState = bytemuck::pod_read_unaligned(r.state());
            assert!(b.nf.repl_adopt(&r.key, &mut st, 0));
            // The same record again (a refresh, a resync) changes nothing.
            let mut again = st;
            assert!(b.nf.repl_adopt(&r.key, &mut again, 5) && again == st);
            b.states.insert(r.key, st);
        }
        assert_eq!(b.nf.report().unwrap()["mappings_adopted"], 3);
        // Replies to the active's ports reach the inside hosts through the standby.
        for (i, &port) in ext.iter().enumerate() {
            let (f, act) = b.run(&tcp4(REMOTE, EXT, 80, port, 0x10, 1, 1));
            assert_eq!(act, Action::Pass);
            assert_eq!(dst_of(&f), ([10, 0, 0, i as u8 + 1], 5000));
        }
        // An outbound packet of an adopted flow keeps its port.
        let (f, _) = b.run(&out(2));
        assert_eq!(src_of(&f), (EXT, ext[1]));
        // The standby's own new flow takes the one port left, then the pool is exhausted.
        let (f, act) = b.run(&out(9));
        assert_eq!(act, Action::Pass);
        assert!(!ext.contains(&src_of(&f).1));
        assert_eq!(b.run(&out(10)).1, Action::Refuse);
        // A state naming another pool's port (another configuration) is refused.
        let mut odd = NatState { port: 2000, ..bytemuck::pod_read_unaligned(recs[0].state()) };
        assert!(!b.nf.repl_adopt(&recs[0].key, &mut odd, 0));
        // The active resets the first connection: its release reaches the standby, whose port is free again.
        let (_, act) = a.run(&tcp4([10, 0, 0, 1], REMOTE, 5000, 80, 0x04, 1, 1));
        assert_eq!(act, Action::EndFlow);
        let del = take(&mut rx);
        assert_eq!((del.len(), del[0].op, del[0].key), (1, crate::repl::Op::Delete, recs[0].key));
        let st = b.states.remove(&del[0].key).unwrap();
        b.nf.repl_forget(&del[0].key, &st);
        let (f, act) = b.run(&out(10));
        assert_eq!((act, src_of(&f).1), (Action::Pass, ext[0]));
    }
}

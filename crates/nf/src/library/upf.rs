//! `upf`: a 5G user plane function (TS 29.244 rules, TS 29.281 GTP-U).
//!
//! N3 (access) traffic is GTP-U over UDP port 2152; N6 (core) traffic is
//! plain IP to and from UE addresses. Uplink: the GTP-U header is parsed
//! (extension headers, the PDU Session Container's QFI), the TEID finds the
//! session, the session's access PDRs are matched by precedence (local
//! F-TEID, QFI, UE address, SDF filters), then QER (gates, MBR token bucket
//! per direction on the packet clock), URR (volume and packet counters,
//! volume threshold -> usage report) and FAR (forward, drop, buffer and release) apply;
//! outer-header removal strips IP/UDP/GTP-U. Downlink: the destination
//! address finds the session, its core PDRs are matched, and the FAR's
//! outer-header creation prepends IPv4/UDP/GTP-U (with a PDU Session
//! Container carrying the QER's or PDR's QFI) with correct lengths and
//! checksums. GTP-U echo requests are answered in place; end markers are
//! consumed; a G-PDU to an unknown TEID is answered with a GTP-U Error
//! Indication (TS 29.281 §7.3.1; `error_pps` per core). Everything else —
//! unknown UE, malformed GTP-U or inner packet, other message types, no
//! matching PDR — is a drop counted by reason.
//!
//! Buffering (TS 29.244 §5.2.4, see [`hold`]): a FAR that buffers keeps
//! copies of its packets on the core that received them, at most the
//! session's BAR's Suggested Buffering Packets Count (else `buffer=`) per
//! session and `buffer_total=` per core (over either: dropped, counted
//! `buffer_full`); a NOCP FAR's first packet raises a Downlink Data Report.
//! When the FAR forwards again the held packets are sent, oldest first,
//! through the rules as they are then (encapsulated, metered, counted by
//! the URRs), behind the batch that brought the change (`Nf::release`: the
//! worker appends them to its output burst, or sends them when idle); the
//! session's new packets queue behind them until they are out. Packets held
//! longer than the BAR's DL Buffering Duration are discarded
//! (`buffer_expired`); a FAR that drops or goes away discards its packets
//! (`buffer_discarded`).
//!
//! QERs (see [`qos`]): gates, MBRs (a session AMBR is a QER every PDR of the
//! session names) and GBR accounting are the session's on any number of
//! cores: one core keeps its own buckets, several lease credit from one
//! shared bucket per QER direction. A FAR's transport level marking is the
//! outer header's ToS (DSCP).
//!
//! As an IP node on N3/N6 (`mac=`, `n3_gw_mac=`, `n6_gw_mac=`, `n6_addr=`):
//! ARP requests for the N3 and N6 addresses are answered, forwarded frames
//! leave from the UPF's MAC to the configured next hop; `ttl=decrement`
//! decrements the TTL / hop limit (checksum updated incrementally; an
//! expired downlink packet gets ICMP Time Exceeded from `n6_addr`); `mtu=`
//! refuses a downlink packet too big once encapsulated with ICMP
//! Fragmentation Needed when it has DF (else it leaves with the outer DF
//! clear). ICMP errors and Error Indications share the `error_pps` budget.
//!
//! The NF is a batch element: its state is the provisioned rule set
//! ([`rules::RuleSet`], loaded from `sessions=FILE` or swapped in whole by
//! the control plane between batches, so no packet sees half a session)
//! plus per-core QER buckets and URR counters. A core's URR counters are
//! [`Cell`]s on a [`Board`] the PFCP endpoint also holds: the core writes
//! them (plain stores, one writer), the endpoint sums every core's cell of a
//! URR when it reports, so reports are exact across cores; a core only
//! nudges the endpoint when its share reaches the URR's volume threshold
//! divided by the number of cores. It changes packet lengths
//! (encapsulation, decapsulation), which only a batch element may do; put
//! 5-tuple NFs that should see inner headers after it in a separate chain.
//! `mode=staged` (default) walks a batch in six passes, each prefetching
//! what the next reads, so the lookups of a batch overlap: parse (prefetch
//! the TEID or UE index's home word), probe (prefetch the index entry the
//! word names, which holds what classifying needs of the session), lookup (prefetch the session's compiled classifier, see
//! [`cls`]), classify (prefetch the matched PDR's [`rules::Act`]: its rule
//! references with the FAR copied in), prepare (prefetch the URR counters and
//! QER buckets), act. `mode=rtc` does each packet to completion (the baseline).
//! In either mode, packets of sessions with a compiled classifier whose
//! headers have the usual layout (G-PDU with one UL PDU Session Container
//! and IPv4 inside; plain IPv4 downlink) are read at fixed offsets
//! ([`fast`]); others take the general parse, which counts drops by reason.
//!
//! `--export upf=FILE` writes one row per URR with traffic (SEID, URR ID,
//! bytes and packets per direction, every core's counters summed). With
//! `--ipfix` the same usage goes to the collectors as usage records
//! (template 262), per core and direction: what the URR counted on that core
//! since the core's previous record (octetDeltaCount and packetDeltaCount:
//! IANA's delta counters, counts since the previous report), every `--ipfix-active` seconds of
//! packet time (a walk paced over the URRs, checked once per batch and at an
//! idle port's tick, never per packet), when a control-plane swap drops the
//! URR (session deleted), and at the run's end; a direction with no new
//! packet sends none. The records of a URR and direction, over every core,
//! sum to its row in the export. Elements: the SEID as flowId (IANA IE 148),
//! the URR ID as element 1 of enterprise 32473 (RFC 5612's documentation
//! number: flowplane has no Private Enterprise Number), the direction as
//! flowDirection (IE 61: 0 ingress = uplink, 1 egress = downlink),
//! octetDeltaCount and packetDeltaCount (IP bytes and packets as the URR
//! counts them), observationTimeMilliseconds (the batch's packet time; at
//! the end, the run's last packet time).

#[path = "../upf/cls.rs"]
pub mod cls;
#[path = "../upf/control.rs"]
pub mod control;
#[path = "../upf/fast.rs"]
pub mod fast;
#[path = "../upf/hold.rs"]
pub mod hold;
#[path = "../upf/pfcp.rs"]
pub mod pfcp;
#[path = "../upf/qos.rs"]
pub mod qos;
#[path = "../upf/rules.rs"]
pub mod rules;
#[path = "../upf/table.rs"]
pub mod table;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{prefetch, tsc, Batch, PacketPool, DROP, MAX_BATCH};
use flowplane_wire::checksum;
use flowplane_wire::frame::PktMeta;
use flowplane_wire::gtpu::{self, GtpuPacket, PduSessionInfo, PduType};
use serde_json::{json, Map, Value};

use self::hold::Held;
use self::qos::{Bucket, Meters};
use self::rules::{Act, FarAction, Fields, Hot, Iface, Index, RuleSet, SessionsFile, TeidSlot, UeSlot, NONE};
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::{Nf, NfContext, NfCounters, ParamError, ParamSpec, Params};

const SESSIONS: ParamSpec =
    ParamSpec::text("sessions", "", "FILE", "session file (TOML or JSON; see `flowplane upf sessions`)");
const RULES: ParamSpec = ParamSpec::text(
    "rules",
    "",
    "NAME",
    "use the rule set registered in-process under NAME (embedding, benchmarks; see upf::control::register)",
);
const N3_ADDR: ParamSpec =
    ParamSpec::text("n3_addr", "192.0.2.1", "IPV4", "local N3 address: the outer source of downlink GTP-U");
const N3_PORT: ParamSpec = ParamSpec::uint_or_none("n3_port", 0, (DROP - 1) as u64, "output port towards the RAN");
const N6_PORT: ParamSpec = ParamSpec::uint_or_none("n6_port", 0, (DROP - 1) as u64, "output port towards the DN");
const MODE: ParamSpec =
    ParamSpec::choice("mode", "staged", &["staged", "rtc"], "staged: lookups of a batch overlap; rtc: per packet");
const UDP_CSUM: ParamSpec = ParamSpec::bool(
    "udp_checksum",
    false,
    "compute the outer UDP checksum on encapsulation (else 0, as RFC 768 allows)",
);
const BUFFER: ParamSpec = ParamSpec::uint(
    "buffer",
    64,
    0,
    1 << 20,
    "packets a session's buffering FARs hold per core before they drop (counted; a BAR's suggested count overrides)",
);
const BUFFER_TOTAL: ParamSpec = ParamSpec::uint(
    "buffer_total",
    1024,
    0,
    1 << 20,
    "packets held per core for all sessions (copies of up to 2 KiB, the store taken at the first)",
);
const REPORTS: ParamSpec =
    ParamSpec::uint("reports", 1024, 0, 1 << 20, "usage reports queued per core before they are counted as lost");
const USAGE: ParamSpec = ParamSpec::bool("usage", true, "list per-URR usage in the report");
const PROFILE: ParamSpec = ParamSpec::bool(
    "profile",
    false,
    "staged mode: report TSC cycles per packet of each pass (parse, probe, lookup, classify, prepare, act); a few cycles per packet",
);
const PFCP: ParamSpec = ParamSpec::text(
    "pfcp",
    "",
    "ADDR:PORT",
    "serve PFCP (N4) on this UDP address (e.g. 0.0.0.0:8805); rule changes reach the data path between batches",
);

const NODE_ID: ParamSpec = ParamSpec::text(
    "node_id",
    "",
    "IPV4|FQDN",
    "PFCP Node ID (default: the pfcp address's IP if it names one, else n3_addr)",
);
const HEARTBEAT: ParamSpec = ParamSpec::uint(
    "pfcp_heartbeat_ms",
    10_000,
    0,
    86_400_000,
    "Heartbeat Request interval per associated SMF (0: none)",
);
const T1: ParamSpec =
    ParamSpec::uint("pfcp_t1_ms", 3_000, 1, 600_000, "PFCP T1: wait for a response before retransmitting");
const N1: ParamSpec = ParamSpec::uint("pfcp_n1", 3, 0, 100, "PFCP N1: retransmissions before a peer counts as failed");
const KEEP_RESTART: ParamSpec = ParamSpec::bool(
    "keep_sessions_on_restart",
    false,
    "keep an SMF's sessions when it restarts (newer Recovery Time Stamp) or re-associates",
);
const KEEP_FAILURE: ParamSpec = ParamSpec::bool(
    "keep_sessions_on_failure",
    false,
    "keep an SMF's sessions when it stops answering heartbeats (its association is released)",
);
const ECHO: ParamSpec = ParamSpec::uint(
    "gtpu_echo_ms",
    60_000,
    0,
    86_400_000,
    "GTP-U echo request interval per N3 peer (FARs' outer-header addresses; 0: none); unanswered after pfcp_t1_ms x (pfcp_n1 + 1): path failure reported to the SMFs",
);
const N6_ADDR: ParamSpec = ParamSpec::text(
    "n6_addr",
    "",
    "IPV4",
    "local N6 address: the source of ICMP errors towards the DN (default: n3_addr)",
);
const N3_ADDR6: ParamSpec = ParamSpec::text(
    "n3_addr6",
    "",
    "IPV6",
    "the UPF's IPv6 address on N3: Neighbor Solicitations for it are answered (with `mac`)",
);
const N6_ADDR6: ParamSpec = ParamSpec::text(
    "n6_addr6",
    "",
    "IPV6",
    "the UPF's IPv6 address on N6: Neighbor Solicitations answered (with `mac`), the source of ICMPv6 errors",
);
const TTL: ParamSpec = ParamSpec::choice(
    "ttl",
    "keep",
    &["keep", "decrement"],
    "decrement: route as an IP hop (TTL / hop limit - 1; expired: dropped, ICMP Time Exceeded to an N6 sender)",
);
const MTU: ParamSpec = ParamSpec::uint(
    "mtu",
    0,
    0,
    9_216,
    "N3 MTU, bytes (0: none): a downlink packet too big once encapsulated gets ICMP Fragmentation Needed if DF, else leaves with the outer DF clear",
);
const ERROR_PPS: ParamSpec = ParamSpec::uint(
    "error_pps",
    100,
    0,
    1_000_000,
    "GTP-U Error Indications (unknown TEID) and ICMP errors sent per second per core (0: none; the rest are dropped, counted)",
);
const MAC: ParamSpec = ParamSpec::text(
    "mac",
    "",
    "MAC",
    "the UPF's MAC: ARP requests for n3_addr / n6_addr are answered, forwarded frames leave from it (default: neither)",
);
const N3_GW_MAC: ParamSpec = ParamSpec::text(
    "n3_gw_mac",
    "",
    "MAC",
    "next hop towards the RAN: destination MAC of frames sent to N3 (default: kept)",
);
const N6_GW_MAC: ParamSpec = ParamSpec::text(
    "n6_gw_mac",
    "",
    "MAC",
    "next hop towards the DN: destination MAC of frames sent to N6 (default: kept)",
);
const RCVBUF: ParamSpec = ParamSpec::uint(
    "pfcp_rcvbuf",
    8 << 20,
    4096,
    1 << 30,
    "PFCP socket receive buffer, bytes (past net.core.rmem_max with CAP_NET_ADMIN)",
);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "upf",
    about: "5G UPF: GTP-U uplink decapsulation / downlink encapsulation by PDR (precedence, F-TEID, QFI, SDF), FAR, QER, URR",
    keyed_by: KeyedBy::Own("TEID, UE address"),
    params: &[
        SESSIONS,
        PFCP,
        RULES,
        N3_ADDR,
        N3_PORT,
        N6_PORT,
        MODE,
        UDP_CSUM,
        BUFFER,
        BUFFER_TOTAL,
        REPORTS,
        USAGE,
        PROFILE,
        NODE_ID,
        HEARTBEAT,
        T1,
        N1,
        KEEP_RESTART,
        KEEP_FAILURE,
        RCVBUF,
        ECHO,
        N6_ADDR,
        N3_ADDR6,
        N6_ADDR6,
        TTL,
        MTU,
        ERROR_PPS,
        MAC,
        N3_GW_MAC,
        N6_GW_MAC,
    ],
};

/// Builds `upf` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateless(Box::new(Upf::from_params(p)?)))
}

/// Configuration of a [`Upf`].
#[derive(Clone, Debug)]
pub struct UpfConfig {
    /// Local N3 address (outer source of encapsulated packets).
    pub n3_addr: Ipv4Addr,
    /// Verdict for packets towards the RAN (None: leave it).
    pub n3_port: Option<u16>,
    /// Verdict for packets towards the DN.
    pub n6_port: Option<u16>,
    /// Three-pass batch walk (else per packet).
    pub staged: bool,
    /// Outer UDP checksum.
    pub udp_checksum: bool,
    /// Packets held per session per core (unless its BAR says).
    pub buffer: u64,
    /// Packets held per core in all.
    pub buffer_total: u64,
    /// Usage-report queue bound.
    pub reports: usize,
    /// List per-URR usage in the report.
    pub usage: bool,
    /// Staged mode: time each pass (TSC, per batch) for the report.
    pub profile: bool,
    /// Local N6 address (source of ICMP errors towards the DN).
    pub n6_addr: Ipv4Addr,
    /// Decrement the TTL / hop limit of forwarded packets.
    pub ttl_decrement: bool,
    /// N3 MTU (0: none).
    pub mtu: u16,
    /// Error Indications and ICMP errors per second per core (0: none).
    pub error_pps: u64,
    /// The UPF's MAC (answers ARP, source of forwarded frames).
    pub mac: Option<[u8; 6]>,
    /// Next-hop MACs towards N3 and N6.
    pub gw_mac: [Option<[u8; 6]>; 2],
    /// The UPF's IPv6 addresses on N3 and N6 (Neighbor Advertisements; ICMPv6 errors from N6's).
    pub addr6: [Option<[u8; 16]>; 2],
}

impl Default for UpfConfig {
    fn default() -> Self {
        UpfConfig {
            n3_addr: Ipv4Addr::new(192, 0, 2, 1),
            n3_port: None,
            n6_port: None,
            staged: true,
            udp_checksum: false,
            buffer: 64,
            buffer_total: 1024,
            reports: 1024,
            usage: true,
            profile: false,
            n6_addr: Ipv4Addr::new(192, 0, 2, 1),
            ttl_decrement: false,
            mtu: 0,
            error_pps: 100,
            mac: None,
            gw_mac: [None, None],
            addr6: [None, None],
        }
    }
}

/// Why packets were dropped, and what else happened (per core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpfCounters {
    /// GTP-U G-PDUs received on N3.
    pub uplink: u64,
    /// Plain IP packets received on N6.
    pub downlink: u64,
    /// Uplink packets forwarded.
    pub ul_forwarded: u64,
    /// Downlink packets forwarded.
    pub dl_forwarded: u64,
    /// Outer headers removed.
    pub decapsulated: u64,
    /// Outer headers created.
    pub encapsulated: u64,
    /// Echo requests answered.
    pub echo_responses: u64,
    /// End markers consumed.
    pub end_markers: u64,
    /// G-PDUs whose TEID belongs to no session.
    pub unknown_teid: u64,
    /// Downlink packets to no UE address.
    pub unknown_ue: u64,
    /// Malformed GTP-U headers.
    pub malformed_gtpu: u64,
    /// Malformed or truncated inner (or downlink) IP packets.
    pub malformed_inner: u64,
    /// GTP-U messages other than G-PDU, echo request, end marker.
    pub unsupported_msg: u64,
    /// Packets no PDR matched.
    pub no_pdr: u64,
    /// Dropped by a FAR.
    pub far_drop: u64,
    /// Taken by a buffering FAR (held; a FAR forwarding again sends them).
    pub buffered: u64,
    /// Dropped because the session's or the core's buffer was full.
    pub buffer_full: u64,
    /// Held packets sent again (their FAR forwards again; in order).
    pub released: u64,
    /// Held packets discarded: older than the BAR's DL Buffering Duration.
    pub buffer_expired: u64,
    /// Held packets discarded: their FAR drops now, or it or its session was removed.
    pub buffer_discarded: u64,
    /// Dropped by a closed QER gate.
    pub gate_closed: u64,
    /// Dropped over a QER's MBR.
    pub mbr_exceeded: u64,
    /// Not IPv4/IPv6 (or not Ethernet-framed).
    pub not_ip: u64,
    /// Encapsulation without headroom, or an echo response without tailroom.
    pub no_room: u64,
    /// Usage reports raised (volume threshold reached).
    pub usage_reports: u64,
    /// Usage reports lost because the queue was full.
    pub usage_reports_lost: u64,
    /// Dropped because a URR's volume quota was used up.
    pub quota_drop: u64,
    /// GTP-U Error Indications sent (G-PDUs to unknown TEIDs).
    pub error_indications: u64,
    /// Not forwarded: TTL / hop limit expired (`ttl=decrement`).
    pub ttl_expired: u64,
    /// Downlink packets too big for the N3 MTU with DF set (or IPv6): not forwarded.
    pub too_big: u64,
    /// ICMP errors sent (time exceeded, fragmentation needed).
    pub icmp_errors: u64,
    /// Error Indications and ICMP errors not sent: over `error_pps`.
    pub errors_limited: u64,
    /// ARP requests for the UPF's addresses answered (`mac`).
    pub arp_replies: u64,
    /// IPv6 Neighbor Solicitations for the UPF's addresses answered (`mac`).
    pub nd_adverts: u64,
    /// GTP-U echo requests sent to N3 peers (path management).
    pub echo_requests_sent: u64,
    /// GTP-U echo responses received (handed to the PFCP endpoint).
    pub echo_responses_received: u64,
}

impl UpfCounters {
    fn to_json(self) -> Value {
        json!({
            "uplink": self.uplink, "downlink": self.downlink,
            "ul_forwarded": self.ul_forwarded, "dl_forwarded": self.dl_forwarded,
            "decapsulated": self.decapsulated, "encapsulated": self.encapsulated,
            "echo_responses": self.echo_responses, "end_markers": self.end_markers,
            "unknown_teid": self.unknown_teid, "unknown_ue": self.unknown_ue,
            "malformed_gtpu": self.malformed_gtpu, "malformed_inner": self.malformed_inner,
            "unsupported_msg": self.unsupported_msg, "no_pdr": self.no_pdr,
            "far_drop": self.far_drop, "buffered": self.buffered, "buffer_full": self.buffer_full,
            "released": self.released, "buffer_expired": self.buffer_expired,
            "buffer_discarded": self.buffer_discarded,
            "gate_closed": self.gate_closed, "mbr_exceeded": self.mbr_exceeded,
            "not_ip": self.not_ip, "no_room": self.no_room,
            "usage_reports": self.usage_reports, "usage_reports_lost": self.usage_reports_lost,
            "quota_drop": self.quota_drop,
            "error_indications": self.error_indications, "ttl_expired": self.ttl_expired,
            "too_big": self.too_big, "icmp_errors": self.icmp_errors, "errors_limited": self.errors_limited,
            "arp_replies": self.arp_replies, "nd_adverts": self.nd_adverts,
            "echo_requests_sent": self.echo_requests_sent, "echo_responses_received": self.echo_responses_received,
        })
    }
}

/// A URR's usage on one core (a snapshot of its [`Cell`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uplink IP bytes.
    pub ul_bytes: u64,
    /// Uplink packets.
    pub ul_packets: u64,
    /// Downlink IP bytes.
    pub dl_bytes: u64,
    /// Downlink packets.
    pub dl_packets: u64,
}

impl Usage {
    /// The sum of two shares.
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            ul_bytes: self.ul_bytes + o.ul_bytes,
            ul_packets: self.ul_packets + o.ul_packets,
            dl_bytes: self.dl_bytes + o.dl_bytes,
            dl_packets: self.dl_packets + o.dl_packets,
        }
    }

    /// What was counted since `earlier` (a snapshot of the same counters).
    pub fn since(self, earlier: Usage) -> Usage {
        Usage {
            ul_bytes: self.ul_bytes.saturating_sub(earlier.ul_bytes),
            ul_packets: self.ul_packets.saturating_sub(earlier.ul_packets),
            dl_bytes: self.dl_bytes.saturating_sub(earlier.dl_bytes),
            dl_packets: self.dl_packets.saturating_sub(earlier.dl_packets),
        }
    }

    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.ul_bytes + self.dl_bytes
    }
}

/// A URR's counters on one core: a cache line each, with the URR's nudge
/// threshold, so counting a packet touches one line. Written by its core
/// only (a relaxed load and store: plain moves, no locked instruction), read
/// by the PFCP endpoint, which sums every core's cell of a URR when it
/// reports: reports are exact across cores without a shared counter.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Cell {
    ul_bytes: AtomicU64,
    ul_packets: AtomicU64,
    dl_bytes: AtomicU64,
    dl_packets: AtomicU64,
    /// Bytes this core counted since it last nudged the endpoint (core-private).
    since: AtomicU64,
    /// Nudge the endpoint after this many bytes (the URR's volume threshold
    /// split over the cores: when the whole session reaches the threshold,
    /// some core has counted its share; 0: none).
    nudge_at: AtomicU64,
    /// The endpoint found the URR's volume quota used up: drop (counted).
    exhausted: AtomicU64,
}

#[inline(always)]
fn bump(a: &AtomicU64, n: u64) {
    // One writer per cell: no read-modify-write instruction needed.
    a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl Cell {
    /// The counters now.
    pub fn snapshot(&self) -> Usage {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Usage {
            ul_bytes: g(&self.ul_bytes),
            ul_packets: g(&self.ul_packets),
            dl_bytes: g(&self.dl_bytes),
            dl_packets: g(&self.dl_packets),
        }
    }

    fn from_usage(u: Usage) -> Cell {
        let c = Cell::default();
        c.ul_bytes.store(u.ul_bytes, Ordering::Relaxed);
        c.ul_packets.store(u.ul_packets, Ordering::Relaxed);
        c.dl_bytes.store(u.dl_bytes, Ordering::Relaxed);
        c.dl_packets.store(u.dl_packets, Ordering::Relaxed);
        c
    }

    /// Marks the URR's quota used up (or not): its packets are dropped.
    pub fn set_exhausted(&self, on: bool) {
        self.exhausted.store(u64::from(on), Ordering::Relaxed);
    }
}

/// One core's URR counters for one rule set (indexed like its `urrs`).
#[derive(Debug, Default)]
pub struct Board {
    /// The rule set the cells are indexed by.
    pub rules: Arc<RuleSet>,
    /// One cell per URR.
    pub cells: Vec<Cell>,
}

impl Board {
    /// This core's usage of URR `urr_id` of session `seid`, if its rule set has it.
    pub fn usage_of(&self, seid: u64, urr_id: u32) -> Option<&Cell> {
        let i = self.rules.urrs.iter().position(|u| {
            u.id == urr_id && self.rules.sessions.get(u.session as usize).is_some_and(|s| s.seid == seid)
        })?;
        self.cells.get(i)
    }
}

/// A URR's volume threshold (or quota) share reached on one core: the
/// endpoint sums every core's counters and reports if the whole session's
/// usage reached it (without an endpoint, the report itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageReport {
    /// The session.
    pub seid: u64,
    /// The URR.
    pub urr_id: u32,
    /// Total bytes (both directions) counted by the URR at the report.
    pub volume: u64,
    /// Packet time of the report, ns.
    pub at_ns: u64,
}

/// A rated QER's state on one core (see [`qos`]).
#[derive(Clone, Copy, Debug, Default)]
struct QosState {
    /// MBR bucket (one core) or credit leased from the shared one, per direction.
    mbr: [Bucket; 2],
    /// GBR bucket or credit, per direction.
    gbr: [Bucket; 2],
    /// IP bytes passed within the GBR, per direction.
    within: [u64; 2],
    /// IP bytes passed above the GBR, per direction.
    above: [u64; 2],
    /// The QER's slot in the shared pool (set at each rule-set swap).
    slot: u32,
}

/// What pass one found about a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Kind {
    /// Dropped upstream, or already handled (counted).
    #[default]
    Done,
    /// GTP-U on N3.
    Gtpu,
    /// Plain IP on N6.
    Plain,
}

/// Per-packet scratch of the staged walk.
struct Scratch {
    metas: [PktMeta; MAX_BATCH],
    kind: [Kind; MAX_BATCH],
    /// The index key: the TEID (uplink) or the UE address (downlink), and its hash.
    key: [u128; MAX_BATCH],
    hash: [u32; MAX_BATCH],
    /// The session's index slot's [`Hot`] (`session` NONE: unknown).
    hot: [Hot; MAX_BATCH],
    /// Uplink: the session's UE IPv4 address.
    ue4: [u32; MAX_BATCH],
    /// Uplink: the session's first FAR and URR.
    bases: [(u32, u32); MAX_BATCH],
    /// The matched PDR's action, once known (`ready`): from the classifier's
    /// relative action (uplink), else read from [`RuleSet::acts`] in the prepare pass.
    act: [Act; MAX_BATCH],
    ready: [bool; MAX_BATCH],
    /// What classifying decided (`Pending`: matched PDR `pdr`, act in the last pass).
    out: [Outcome; MAX_BATCH],
    pdr: [u32; MAX_BATCH],
    inner_at: [u16; MAX_BATCH],
    inner_len: [u16; MAX_BATCH],
    v6: [bool; MAX_BATCH],
}

/// A packet's fate before the last pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Outcome {
    /// Matched a PDR: the last pass applies it.
    #[default]
    Pending,
    /// Dropped (counted).
    Drop,
    /// Answered in place (echo): pass, to this port if set.
    Pass(Option<u16>),
}

/// The UPF (one per core).
pub struct Upf {
    cfg: UpfConfig,
    rules: Arc<RuleSet>,
    /// Per rated QER ([`rules::Qer::rated`]): buckets or credit, GBR accounting.
    qos: Vec<QosState>,
    /// The QER buckets every core running these rules shares.
    meters: Arc<Meters>,
    /// More than one core meters with `meters`: rates are leased from it.
    shared_qos: bool,
    /// The rule set's version (the control block's; 0 for fixed rules).
    version: u64,
    /// This core's URR counters (shared with the PFCP endpoint, which reads them).
    board: Arc<Board>,
    /// Its place in the endpoint's list of cores.
    board_slot: Option<Arc<Mutex<Arc<Board>>>>,
    /// Cores sharing the endpoint when the nudge thresholds were set.
    split: usize,
    /// Packets held by buffering FARs, and the release queue.
    held: Held,
    /// Running the release queue's packets (they are not held again for draining).
    releasing: bool,
    /// GTP-U echo requests to send (taken from the endpoint) and responses seen: (peer IPv4, sequence number).
    echo_out: Vec<(u32, u16)>,
    echo_in: Vec<(u32, u16)>,
    /// First packets buffered for FARs that notify the CP: (SEID, PDR ID), for the endpoint.
    ddn: Vec<(u64, u16)>,
    /// Error messages allowed (units: 1/1e9 message), and the packet time they were refilled at.
    error_tokens: u64,
    error_last: u64,
    reports: Vec<UsageReport>,
    c: UpfCounters,
    counters: NfCounters,
    scratch: Box<Scratch>,
    /// With `profile`: TSC cycles spent in each staged pass, and packets timed.
    pass_cycles: [u64; PASSES.len()],
    timed_packets: u64,
    /// The PFCP endpoint's control block and the rule-set version in use.
    control: Option<(Arc<control::UpfControl>, u64)>,
    /// `--ipfix`: this core's usage records.
    ipfix: Option<Box<UsageFeed>>,
}

/// This core's IPFIX usage records (`--ipfix`): what each URR counted on
/// this core since its previous record, every active timeout (a walk paced
/// over the URRs on the packet clock, checked once per call, like the
/// engine's expiry sweep) and at the run's end. Deltas: the records of a
/// URR and direction, over every core, sum to its totals (the export's row).
struct UsageFeed {
    tx: crate::ipfix::RecordTx,
    /// Report each URR every this much packet time (None: only at the run's end).
    active_ns: Option<u64>,
    /// What this core's records carried so far, per URR (indexed like the board's cells).
    sent: Vec<Usage>,
    /// The walk's next URR.
    at: usize,
    /// Packet time up to which the walk has done its work (0: not started).
    walked_ns: u64,
    /// The latest batch time seen.
    now_ns: u64,
}

impl UsageFeed {
    /// Records URR `i`'s usage since its last record (none when nothing new).
    fn report(&mut self, rules: &RuleSet, cells: &[Cell], i: usize, now_ns: u64) {
        let (Some(u), Some(c), Some(sent)) = (rules.urrs.get(i), cells.get(i), self.sent.get_mut(i)) else { return };
        let snap = c.snapshot();
        let d = snap.since(*sent);
        if d.ul_packets == 0 && d.dl_packets == 0 {
            return;
        }
        *sent = snap;
        self.tx.push(crate::ipfix::ExportRecord::Usage(crate::ipfix::UsageExport {
            seid: rules.sessions.get(u.session as usize).map_or(0, |s| s.seid),
            urr: u.id,
            ul: (d.ul_bytes, d.ul_packets),
            dl: (d.dl_bytes, d.dl_packets),
            time_ns: now_ns,
        }));
    }

    /// The active-timeout walk's work for the time since its last call: each URR is visited once per period.
    #[inline]
    fn advance(&mut self, rules: &RuleSet, cells: &[Cell], now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some(period) = self.active_ns else { return };
        if self.walked_ns == 0 || now_ns < self.walked_ns {
            // The first batch starts the clock (a clock that stepped back restarts it).
            self.walked_ns = now_ns;
            return;
        }
        let len = cells.len().min(self.sent.len()) as u128;
        let elapsed = u128::from(now_ns - self.walked_ns);
        let due = elapsed * len / u128::from(period);
        if due == 0 {
            return;
        }
        self.walk(rules, cells, now_ns, due, len, period);
    }

    #[cold]
    fn walk(&mut self, rules: &RuleSet, cells: &[Cell], now_ns: u64, due: u128, len: u128, period: u64) {
        let n = if due >= len {
            self.walked_ns = now_ns;
            len
        } else {
            self.walked_ns += (due * u128::from(period) / len) as u64;
            due
        } as usize;
        for _ in 0..n {
            if self.at >= len as usize {
                self.at = 0;
            }
            self.report(rules, cells, self.at, now_ns);
            self.at += 1;
        }
    }
}

impl std::fmt::Debug for Upf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upf").field("sessions", &self.rules.sessions.len()).field("counters", &self.c).finish()
    }
}

/// The staged passes, as the profile names them.
type TeidIndex = Index<u32, TeidSlot>;
type UeIndex = Index<u128, UeSlot>;

const PASSES: [&str; 6] = ["parse", "probe", "lookup", "classify", "prepare", "act"];

const ETH_IPV4: [u8; 2] = [0x08, 0x00];
const ETH_IPV6: [u8; 2] = [0x86, 0xdd];
const GTPU_PORT: u16 = 2152;
/// Downlink data events a core queues between batches (the endpoint reports once per session).
const DDN_QUEUE: usize = 64;
/// GTP-U echo responses a core keeps between batches (more are not passed on: a path is judged by its next).
const ECHO_QUEUE: usize = 64;

impl Upf {
    /// Builds from spec parameters.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let file = p.text(&SESSIONS)?;
        let pfcp = p.text(&PFCP)?;
        let named = p.text(&RULES)?;
        let a = p.text(&N3_ADDR)?;
        let n3_addr =
            a.parse().map_err(|_| ParamError(format!("upf: parameter 'n3_addr={a}' is not an IPv4 address")))?;
        let n4 = n4_config(p, &pfcp, n3_addr)?;
        let cfg = UpfConfig {
            n3_addr,
            n3_port: p.uint_or_none(&N3_PORT)?.map(|x| x as u16),
            n6_port: p.uint_or_none(&N6_PORT)?.map(|x| x as u16),
            staged: p.choice(&MODE, [true, false])?,
            udp_checksum: p.flag(&UDP_CSUM)?,
            buffer: p.uint(&BUFFER)?,
            buffer_total: p.uint(&BUFFER_TOTAL)?,
            reports: p.uint(&REPORTS)? as usize,
            usage: p.flag(&USAGE)?,
            profile: p.flag(&PROFILE)?,
            n6_addr: match p.text(&N6_ADDR)?.as_str() {
                "" => n3_addr,
                a => {
                    a.parse().map_err(|_| ParamError(format!("upf: parameter 'n6_addr={a}' is not an IPv4 address")))?
                }
            },
            ttl_decrement: p.choice(&TTL, [false, true])?,
            mtu: p.uint(&MTU)? as u16,
            error_pps: p.uint(&ERROR_PPS)?,
            mac: mac_param(p, &MAC)?,
            gw_mac: [mac_param(p, &N3_GW_MAC)?, mac_param(p, &N6_GW_MAC)?],
            addr6: [v6_param(p, &N3_ADDR6)?, v6_param(p, &N6_ADDR6)?],
        };
        // A file of 130K sessions takes seconds to parse and compile: a spinner on a terminal until the rules are in.
        let spin = (!file.is_empty())
            .then(|| flowplane_trace::progress::Progress::spinner(format!("upf: loading sessions from {file}")));
        let specs = if file.is_empty() {
            Vec::new()
        } else {
            SessionsFile::load(&file).map_err(|e| ParamError(format!("upf: {e}")))?.sessions
        };
        if let Some(s) = &spin {
            s.message(format!("upf: compiling {} sessions from {file}", specs.len()));
        }
        if !named.is_empty() {
            let ctl = control::named(&named).ok_or_else(|| {
                ParamError(format!("upf: parameter 'rules={named}': no rule set registered under that name"))
            })?;
            return Ok(Upf::with_control(cfg, ctl));
        }
        if !pfcp.is_empty() {
            let ctl = control::shared(&pfcp, n4, &specs).map_err(|e| ParamError(format!("upf: {e}")))?;
            return Ok(Upf::with_control(cfg, ctl));
        }
        let rules = RuleSet::compile(&specs).map_err(|e| ParamError(format!("upf: {file}: {e}")))?;
        // The cores running one session file share its QERs' rates.
        let meters = if file.is_empty() { Meters::new() } else { Meters::shared(&format!("file:{file}")) };
        Ok(Upf::with_meters(cfg, Arc::new(rules), meters, 0))
    }

    /// A UPF whose rules come from a control block (a PFCP endpoint).
    pub fn with_control(cfg: UpfConfig, ctl: Arc<control::UpfControl>) -> Upf {
        let (v, rules) = ctl.current();
        let mut u = Upf::with_meters(cfg, rules, Arc::clone(&ctl.meters), v);
        // This core's counters join the endpoint's list: its reports sum every core's.
        let slot = ctl.attach(Arc::clone(&u.board));
        u.board_slot = Some(slot);
        u.split = ctl.cores();
        u.set_nudges();
        u.control = Some((ctl, v));
        u
    }

    /// A UPF with `rules` (its QER rates its own).
    pub fn new(cfg: UpfConfig, rules: Arc<RuleSet>) -> Upf {
        Upf::with_meters(cfg, rules, Meters::new(), 0)
    }

    /// A UPF with `rules` version `version`, metering with the cores sharing `meters`.
    pub fn with_meters(cfg: UpfConfig, rules: Arc<RuleSet>, meters: Arc<Meters>, version: u64) -> Upf {
        meters.attach();
        let cfg_error_burst = cfg.error_pps * 1_000_000_000;
        let reports = Vec::with_capacity(cfg.reports);
        let scratch = Box::new(Scratch {
            metas: [PktMeta::default(); MAX_BATCH],
            kind: [Kind::Done; MAX_BATCH],
            key: [0; MAX_BATCH],
            hash: [0; MAX_BATCH],
            hot: [Hot::EMPTY; MAX_BATCH],
            ue4: [0; MAX_BATCH],
            bases: [(0, 0); MAX_BATCH],
            act: [cls::TAct::default().act(0, 0); MAX_BATCH],
            ready: [false; MAX_BATCH],
            out: [Outcome::Pending; MAX_BATCH],
            pdr: [NONE; MAX_BATCH],
            inner_at: [0; MAX_BATCH],
            inner_len: [0; MAX_BATCH],
            v6: [false; MAX_BATCH],
        });
        let mut u = Upf {
            cfg,
            rules: Arc::new(RuleSet::default()),
            qos: Vec::new(),
            meters,
            shared_qos: false,
            version,
            board: Arc::new(Board::default()),
            board_slot: None,
            split: 1,
            held: Held::default(),
            releasing: false,
            echo_out: Vec::with_capacity(ECHO_QUEUE),
            echo_in: Vec::with_capacity(ECHO_QUEUE),
            ddn: Vec::with_capacity(DDN_QUEUE),
            error_tokens: cfg_error_burst,
            error_last: 0,
            reports,
            c: UpfCounters::default(),
            counters: NfCounters::default(),
            scratch,
            pass_cycles: [0; PASSES.len()],
            timed_packets: 0,
            control: None,
            ipfix: None,
        };
        u.set_rules(rules);
        u
    }

    /// Swaps in a new rule set (between batches: no packet sees half of
    /// one). QER buckets, URR counters and buffer counts of rules that keep
    /// their (SEID, ID) carry over; new rules start fresh.
    pub fn set_rules(&mut self, rules: Arc<RuleSet>) {
        let old = std::mem::replace(&mut self.rules, rules);
        let new = &self.rules;
        // Carry each per-core vector over by (SEID, rule ID).
        fn carry<T: Copy + Default>(
            old: impl Iterator<Item = (u64, u32)>,
            new: impl Iterator<Item = (u64, u32)>,
            state: &[T],
        ) -> Vec<T> {
            let at: HashMap<(u64, u32), usize> = old.enumerate().map(|(i, k)| (k, i)).collect();
            new.map(|k| at.get(&k).and_then(|&j| state.get(j).copied()).unwrap_or_default()).collect()
        }
        // With each URR's quota state: a URR the endpoint stopped stays stopped.
        // (And the bytes towards its next nudge: a new threshold applies to the count carried over.)
        let snap: Vec<(Usage, bool, u64)> = self
            .board
            .cells
            .iter()
            .map(|c| (c.snapshot(), c.exhausted.load(Ordering::Relaxed) != 0, c.since.load(Ordering::Relaxed)))
            .collect();
        let usage =
            carry(old.keys(&old.urrs, |u| (u.session, u.id)), new.keys(&new.urrs, |u| (u.session, u.id)), &snap);
        if let Some(f) = self.ipfix.as_deref_mut() {
            // A URR the new rules drop (its session deleted) sends what it counted since its last record now.
            let kept: std::collections::HashSet<(u64, u32)> = new.keys(&new.urrs, |u| (u.session, u.id)).collect();
            let gone: Vec<usize> = old
                .keys(&old.urrs, |u| (u.session, u.id))
                .enumerate()
                .filter(|(_, k)| !kept.contains(k))
                .map(|(i, _)| i)
                .collect();
            let now = f.now_ns;
            for i in gone {
                f.report(&old, &self.board.cells, i, now);
            }
            f.sent =
                carry(old.keys(&old.urrs, |u| (u.session, u.id)), new.keys(&new.urrs, |u| (u.session, u.id)), &f.sent);
        }
        let rated = |r: &Arc<RuleSet>| -> Vec<(u64, u32)> {
            r.keys(&r.qers, |q| (q.session, q.id)).zip(&r.qers).filter(|(_, q)| q.rated != NONE).map(|x| x.0).collect()
        };
        let mut qos = carry(rated(&old).into_iter(), rated(new).into_iter(), &self.qos);
        for (st, slot) in qos.iter_mut().zip(self.meters.slots(new, self.version)) {
            st.slot = slot;
        }
        // Held packets follow their FAR: still buffering, kept; forwarding, queued to be sent; else discarded.
        self.c.buffer_discarded += self.held.remap(&old, new);
        let cells: Vec<Cell> = usage
            .into_iter()
            .map(|(u, x, since)| {
                let c = Cell::from_usage(u);
                c.set_exhausted(x);
                c.since.store(since, Ordering::Relaxed);
                c
            })
            .collect();
        flowplane_table::huge::advise_hugepages(&cells);
        flowplane_table::huge::advise_hugepages(&qos);
        self.board = Arc::new(Board { rules: Arc::clone(&self.rules), cells });
        self.set_nudges();
        if let Some(slot) = &self.board_slot {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&self.board);
        }
        self.qos = qos;
    }

    /// Each URR's nudge threshold: its volume threshold over the cores
    /// sharing the endpoint (quotas the endpoint polls).
    fn set_nudges(&mut self) {
        for (c, r) in self.board.cells.iter().zip(&self.rules.urrs) {
            let t = r.threshold;
            let at = if t == 0 { 0 } else { (t / self.split as u64).max(1) };
            c.nudge_at.store(at, Ordering::Relaxed);
        }
    }

    /// The rule set in use.
    pub fn rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    /// Counters by reason (this core).
    pub fn upf_counters(&self) -> UpfCounters {
        self.c
    }

    /// Usage per URR, by (SEID, URR ID).
    pub fn usage(&self) -> impl Iterator<Item = ((u64, u32), Usage)> + '_ {
        self.rules
            .urrs
            .iter()
            .zip(self.board.cells.iter())
            .map(|(u, c)| ((self.rules.sessions[u.session as usize].seid, u.id), c.snapshot()))
    }

    /// Takes the queued usage reports (what a PFCP Session Report Request carries).
    pub fn take_reports(&mut self) -> Vec<UsageReport> {
        std::mem::replace(&mut self.reports, Vec::with_capacity(self.cfg.reports))
    }

    /// Pass one: parse, pick the index key, prefetch its home index word.
    #[inline(always)]
    fn stage_parse(&mut self, batch: &mut Batch, i: usize) {
        self.scratch.kind[i] = Kind::Done;
        if batch.is_dropped(i) {
            return;
        }
        self.counters.packets_in += 1;
        self.counters.bytes_in += batch.lens()[i] as u64;
        self.scratch.metas[i].parse_into(batch.data(i));
        if !self.scratch.metas[i].valid && self.cfg.mac.is_some() && batch.data(i).get(12..14) == Some(&[8, 6][..]) {
            self.scratch.out[i] = self.arp_reply(batch, i).map_or(Outcome::Drop, Outcome::Pass);
            return;
        }
        if self.cfg.mac.is_some() && self.scratch.metas[i].v6 && self.scratch.metas[i].proto.0 == 58 {
            if let Some(port) = self.nd_advert(batch, i) {
                self.scratch.out[i] = Outcome::Pass(port);
                return;
            }
        }
        let sc = &mut *self.scratch;
        let m = &mut sc.metas[i];
        if !m.valid || m.l3 < 14 {
            self.c.not_ip += 1;
            sc.kind[i] = Kind::Done;
            sc.out[i] = Outcome::Drop;
            return;
        }
        // Anything to UDP port 2152 is N3 (a GTP-U header too short for a TEID is malformed there).
        let n3 = m.proto.0 == 17 && m.l4 != 0 && m.tuple.dst_port() == GTPU_PORT;
        sc.out[i] = Outcome::Pending;
        sc.hot[i] = Hot::EMPTY;
        if n3 {
            let h = TeidIndex::hash(&m.teid);
            (sc.kind[i], sc.key[i], sc.hash[i]) = (Kind::Gtpu, u128::from(m.teid), h);
            if self.cfg.staged {
                prefetch::read(self.rules.teids.home(h));
            }
        } else {
            let key = rules::ip128(m.tuple.dst_ip());
            let h = UeIndex::hash(&key);
            (sc.kind[i], sc.key[i], sc.hash[i]) = (Kind::Plain, key, h);
            if self.cfg.staged {
                prefetch::read(self.rules.ues.home(h));
            }
        }
    }

    /// Pass two (staged only): the home index word is in cache; prefetch the
    /// entry it names (what classifying needs of the session is in it).
    #[inline(always)]
    fn stage_probe(&self, i: usize) {
        let sc = &*self.scratch;
        match sc.kind[i] {
            Kind::Done => {}
            Kind::Gtpu => {
                if let Some(e) = self.rules.teids.hint(sc.hash[i]) {
                    prefetch::read(e);
                }
            }
            Kind::Plain => {
                if let Some(e) = self.rules.ues.hint(sc.hash[i]) {
                    prefetch::read(e);
                }
            }
        }
    }

    /// Pass three: resolve the session's index entry (what classifying needs
    /// of the session is in it); prefetch the classifier's first lines (or,
    /// for the general path, the session and its first PDRs).
    #[inline(always)]
    fn stage_lookup(&mut self, i: usize) {
        let sc = &mut *self.scratch;
        let (key, h) = (sc.key[i], sc.hash[i]);
        let found = match sc.kind[i] {
            Kind::Done => return,
            Kind::Gtpu => {
                self.rules.teids.get_hashed(h, &(key as u32)).map(|e| (e.hot, e.ue4, (e.far_base, e.urr_base)))
            }
            Kind::Plain => self.rules.ues.get_hashed(h, &key).map(|e| (e.hot, 0, (0, 0))),
        };
        let Some((hot, ue4, bases)) = found else { return };
        (sc.hot[i], sc.ue4[i], sc.bases[i]) = (hot, ue4, bases);
        if !self.cfg.staged {
            return;
        }
        if hot.flags & Hot::FAST != 0 {
            // A block is six lines; shared classifiers are usually cached already.
            let at = hot.cls as usize;
            if let Some(b) = self.rules.cls.get(at..at + usize::from(hot.cls_len)) {
                for x in b.iter().take(2) {
                    prefetch::read(&x.remote);
                    prefetch::read(&x.ue);
                    prefetch::read(&x.remote_lo);
                    prefetch::read(&x.ue_lo);
                    prefetch::read(&x.meta);
                    prefetch::read(&x.rank);
                }
            }
        } else if let Some(sess) = self.rules.sessions.get(hot.session as usize) {
            prefetch::read(sess);
            let (start, len) = if sc.kind[i] == Kind::Gtpu { sess.ul } else { sess.dl };
            if let Some(p) = self.rules.pdrs.get(start as usize..(start + len) as usize) {
                for x in p.iter().step_by(2).take(4) {
                    prefetch::read(x);
                }
            }
        }
    }

    /// Pass four: parse the GTP-U header and inner packet, match the
    /// session's PDRs. An uplink PDR's action usually comes with the
    /// classifier (relative to the session's rules; a staged walk prefetches
    /// its URR counters); else a staged walk prefetches the PDR's [`Act`].
    #[inline(always)]
    fn stage_classify(&mut self, batch: &mut Batch, i: usize) {
        let kind = self.scratch.kind[i];
        let out = match kind {
            Kind::Done => return,
            Kind::Gtpu => self.classify_uplink(batch, i),
            Kind::Plain => self.classify_downlink(batch, i),
        };
        let sc = &mut *self.scratch;
        sc.out[i] = out;
        sc.ready[i] = false;
        if out != Outcome::Pending {
            return;
        }
        let (hot, pdr) = (sc.hot[i], sc.pdr[i]);
        if kind == Kind::Gtpu && hot.flags & Hot::FAST != 0 {
            let t = (hot.cls as usize * cls::LANES).wrapping_add(pdr.wrapping_sub(hot.pdrs) as usize);
            if let Some(t) = self.rules.tacts.get(t).filter(|t| t.bits & cls::TAct::SLOW == 0) {
                let (far_base, urr_base) = sc.bases[i];
                let a = t.act(far_base, urr_base);
                (sc.act[i], sc.ready[i]) = (a, true);
                if self.cfg.staged {
                    if let Some(u) = self.board.cells.get(a.urr as usize) {
                        prefetch::write(u);
                    }
                }
                return;
            }
        }
        if self.cfg.staged {
            if let Some(a) = self.rules.acts.get(pdr as usize) {
                prefetch::read(a);
            }
        }
    }

    /// Pass five (staged only): for packets whose action is not known yet,
    /// read the PDR's [`Act`] and prefetch the per-core state its rules
    /// update (URR counters; QER buckets and rates with an MBR).
    #[inline(always)]
    fn stage_prepare(&mut self, i: usize) {
        let sc = &mut *self.scratch;
        if sc.kind[i] == Kind::Done || sc.out[i] != Outcome::Pending || sc.ready[i] {
            return;
        }
        let Some(&a) = self.rules.acts.get(sc.pdr[i] as usize) else { return };
        (sc.act[i], sc.ready[i]) = (a, true);
        for &u in self.rules.refs(&a.urr) {
            if let Some(u) = self.board.cells.get(u as usize) {
                prefetch::write(u);
            }
        }
        if a.mbr != 0 {
            for &q in self.rules.refs(&a.qer) {
                if let Some(r) = self.rules.qers.get(q as usize) {
                    if let Some(b) = self.qos.get(r.rated as usize) {
                        prefetch::write(b);
                    }
                }
            }
        }
    }

    /// Pass six: QER, URR, FAR; decapsulate or encapsulate; the verdict.
    #[inline(always)]
    fn stage_act(&mut self, batch: &mut Batch, i: usize, now: u64) {
        let verdict = match (self.scratch.kind[i], self.scratch.out[i]) {
            (_, Outcome::Drop) => None,
            (_, Outcome::Pass(p)) => Some(p),
            (Kind::Done, Outcome::Pending) => return,
            (Kind::Gtpu, Outcome::Pending) => self.act(batch, i, now, true),
            (Kind::Plain, Outcome::Pending) => self.act(batch, i, now, false),
        };
        match verdict {
            Some(v) => {
                if let Some(p) = v {
                    batch.verdicts_mut()[i] = p;
                }
                self.counters.packets_out += 1;
            }
            None => {
                batch.drop_packet(i);
                self.counters.dropped += 1;
            }
        }
    }

    /// An N3 packet up to its PDR (`Pending`), or its fate.
    fn classify_uplink(&mut self, batch: &mut Batch, i: usize) -> Outcome {
        let m = self.scratch.metas[i];
        let g0 = m.l4 as usize + 8;
        let data = batch.data(i);
        let hot = self.scratch.hot[i];
        if hot.flags & Hot::FAST != 0 {
            // The usual layout, read at fixed offsets (else the general parse below).
            if let Some(u) = fast::uplink_v4(data, &m) {
                self.c.uplink += 1;
                let mut p = u.pkt;
                p.ue_ok = hot.flags & Hot::HAS_UE4 != 0 && self.scratch.ue4[i] == p.ue;
                let Some(pi) = self.rules.classify_v4(&hot, &p) else {
                    self.c.no_pdr += 1;
                    return Outcome::Drop;
                };
                let sc = &mut *self.scratch;
                (sc.pdr[i], sc.inner_at[i], sc.inner_len[i], sc.v6[i]) =
                    (pi, u.inner_at as u16, u.inner_len as u16, false);
                return Outcome::Pending;
            }
        }
        let Some(udp_end) = udp_end(data, &m) else {
            self.c.malformed_gtpu += 1;
            return Outcome::Drop;
        };
        let g = GtpuPacket::new_unchecked(&data[g0..udp_end]);
        let Ok(layout) = g.layout() else {
            self.c.malformed_gtpu += 1;
            return Outcome::Drop;
        };
        match g.msg_type() {
            gtpu::msg_type::G_PDU => {}
            gtpu::msg_type::ECHO_REQUEST => {
                return self.echo_response(batch, i).map_or(Outcome::Drop, Outcome::Pass);
            }
            gtpu::msg_type::ECHO_RESPONSE => {
                // Path management: the endpoint matches it to its request.
                self.c.echo_responses_received += 1;
                if self.echo_in.len() < ECHO_QUEUE && !m.v6 {
                    let l3 = m.l3 as usize;
                    let src = u32::from_be_bytes([data[l3 + 12], data[l3 + 13], data[l3 + 14], data[l3 + 15]]);
                    self.echo_in.push((src, g.seq_number().unwrap_or(0)));
                }
                return Outcome::Drop;
            }
            gtpu::msg_type::END_MARKER => {
                // The last packet on the old path of a handover: nothing follows it on this TEID.
                self.c.end_markers += 1;
                return Outcome::Drop;
            }
            _ => {
                self.c.unsupported_msg += 1;
                return Outcome::Drop;
            }
        }
        self.c.uplink += 1;
        let teid = g.teid();
        let qfi = layout.pdu_session.map(|p| p.qfi);
        if hot.session == NONE {
            self.c.unknown_teid += 1;
            return self.error_indication(batch, i, teid).map_or(Outcome::Drop, Outcome::Pass);
        }
        let inner_at = g0 + layout.header_len;
        let Some((f, inner_len, v6)) = inner_fields(&data[inner_at..g0 + layout.end]) else {
            self.c.malformed_inner += 1;
            return Outcome::Drop;
        };
        let Some(pi) = self.rules.classify_hot(&hot, self.scratch.ue4[i], true, teid, qfi, &f) else {
            self.c.no_pdr += 1;
            return Outcome::Drop;
        };
        let sc = &mut *self.scratch;
        (sc.pdr[i], sc.inner_at[i], sc.inner_len[i], sc.v6[i]) = (pi, inner_at as u16, inner_len as u16, v6);
        Outcome::Pending
    }

    /// An N6 packet up to its PDR, or its fate.
    fn classify_downlink(&mut self, batch: &Batch, i: usize) -> Outcome {
        let m = self.scratch.metas[i];
        self.c.downlink += 1;
        let hot = self.scratch.hot[i];
        if hot.session == NONE {
            self.c.unknown_ue += 1;
            return Outcome::Drop;
        }
        let l3 = m.l3 as usize;
        if hot.flags & Hot::FAST != 0 {
            if let Some((p, inner_len)) = fast::downlink_v4(batch.data(i), &m) {
                let Some(pi) = self.rules.classify_v4(&hot, &p) else {
                    self.c.no_pdr += 1;
                    return Outcome::Drop;
                };
                let sc = &mut *self.scratch;
                (sc.pdr[i], sc.inner_at[i], sc.inner_len[i], sc.v6[i]) = (pi, l3 as u16, inner_len as u16, false);
                return Outcome::Pending;
            }
        }
        let Some((f, inner_len, v6)) = inner_fields(&batch.data(i)[l3..]) else {
            self.c.malformed_inner += 1;
            return Outcome::Drop;
        };
        // Downlink: the UE is the destination.
        let f = Fields { proto: f.proto, ue: f.remote, remote: f.ue, ue_port: f.remote_port, remote_port: f.ue_port };
        let Some(pi) = self.rules.classify_hot(&hot, 0, false, 0, None, &f) else {
            self.c.no_pdr += 1;
            return Outcome::Drop;
        };
        let sc = &mut *self.scratch;
        (sc.pdr[i], sc.inner_at[i], sc.inner_len[i], sc.v6[i]) = (pi, l3 as u16, inner_len as u16, v6);
        Outcome::Pending
    }

    /// Applies the matched PDR's rules. `None`: drop; `Some(port)`: pass (to `port` if set).
    fn act(&mut self, batch: &mut Batch, i: usize, now: u64, uplink: bool) -> Option<Option<u16>> {
        let l3 = self.scratch.metas[i].l3 as usize;
        let (pi, inner_at, inner_len, v6) = {
            let sc = &*self.scratch;
            (sc.pdr[i], usize::from(sc.inner_at[i]), usize::from(sc.inner_len[i]), sc.v6[i])
        };
        let a = if self.scratch.ready[i] { self.scratch.act[i] } else { self.rules.acts[pi as usize] };
        // Buffered, or its session's held packets are still being sent (it queues behind them).
        let draining = self.held.queue.n > 0
            && a.action == FarAction::Forward
            && !self.releasing
            && self.held.queued_of(self.rules.fars[a.far as usize].session) > 0;
        if a.action == FarAction::Buffer || draining {
            self.hold(batch, i, pi, a.far, draining, now);
            return None;
        }
        // A packet not forwarded (expired, too big) is neither metered nor counted.
        let mut df = true;
        if a.action == FarAction::Forward {
            if self.cfg.ttl_decrement && !decrement_ttl(&mut batch.data_mut(i)[inner_at..], v6) {
                self.c.ttl_expired += 1;
                // An N6 sender learns it (ICMP Time Exceeded); back through the tunnel: not done.
                let sent = !uplink
                    && if v6 {
                        self.icmp6_error(batch, i, l3, [3, 0], [0; 4], now)
                    } else {
                        self.icmp4_error(batch, i, l3, [11, 0], [0; 4], now)
                    };
                return sent.then_some(self.cfg.n6_port);
            }
            if !uplink && a.ohc && self.cfg.mtu > 0 {
                let over = 28 + if a.mark_qfi != rules::ANY_QFI { 16 } else { 8 };
                let mtu = usize::from(self.cfg.mtu);
                if inner_len + over > mtu {
                    let ip = &batch.data(i)[inner_at..];
                    if v6 || ip[6] & 0x40 != 0 {
                        self.c.too_big += 1;
                        // RFC 1191: Fragmentation Needed with the MTU left for the inner packet.
                        let m = (mtu.saturating_sub(over) as u16).to_be_bytes();
                        // RFC 4443 §3.2: Packet Too Big with the MTU (IPv6 routers never fragment).
                        let sent = if v6 {
                            self.icmp6_error(batch, i, l3, [2, 0], [0, 0, m[0], m[1]], now)
                        } else {
                            self.icmp4_error(batch, i, l3, [3, 4], [0, 0, m[0], m[1]], now)
                        };
                        return sent.then_some(self.cfg.n6_port);
                    }
                    df = false;
                }
            }
        }
        if !self.enforce(&a, usize::from(!uplink), inner_len as u64, now) {
            return None;
        }
        if uplink && a.outer_header_removal() {
            // Keep the L2 header, drop outer IP/UDP/GTP-U and any trailer.
            let hdr = inner_at - l3;
            let d = batch.data_mut(i);
            if l3 == 14 {
                // The usual untagged header: a fixed-size copy, not a memmove call.
                let mut h = [0u8; 14];
                h.copy_from_slice(&d[..14]);
                d[hdr..hdr + 14].copy_from_slice(&h);
            } else {
                d.copy_within(0..l3, hdr);
            }
            d[hdr + l3 - 2..hdr + l3].copy_from_slice(if v6 { &ETH_IPV6 } else { &ETH_IPV4 });
            if !batch.adj(i, hdr) || !batch.set_len(i, l3 + inner_len) {
                self.c.no_room += 1;
                return None;
            }
            self.c.decapsulated += 1;
        }
        if a.ohc {
            // Downlink: drop an Ethernet trailer before the length fields are computed.
            if !uplink && !batch.set_len(i, l3 + inner_len) {
                self.c.no_room += 1;
                return None;
            }
            if !self.encap(batch, i, l3, (a.ohc_teid, a.ohc_addr), (a.mark_qfi, a.tos, df)) {
                return None;
            }
        }
        if uplink {
            self.c.ul_forwarded += 1;
        } else {
            self.c.dl_forwarded += 1;
        }
        // The UPF routes: frames leave from its MAC to the next hop's (when configured).
        let gw = self.cfg.gw_mac[usize::from(a.destination == Iface::Core)];
        if self.cfg.mac.is_some() || gw.is_some() {
            let d = batch.data_mut(i);
            if let Some(m) = self.cfg.mac {
                d[6..12].copy_from_slice(&m);
            }
            if let Some(g) = gw {
                d[0..6].copy_from_slice(&g);
            }
        }
        Some(self.port(a.destination))
    }

    /// Holds packet `i` (matched PDR `pi`, FAR `far`) for its buffering FAR
    /// (`draining`: for the release queue, behind its session's packets
    /// still there), within the session's bound (its BAR's, else `buffer`)
    /// and the core's (`buffer_total`); the FAR's packets older than the
    /// BAR's DL Buffering Duration go first (counted).
    #[cold]
    fn hold(&mut self, batch: &Batch, i: usize, pi: u32, far: u32, draining: bool, now: u64) {
        let (fi, s) = (far as usize, self.rules.fars[far as usize].session);
        let bar = self.rules.bars.get(s as usize).copied().unwrap_or_default();
        if !draining {
            if self.held.fars.get(fi).is_none_or(|l| l.n == 0) {
                // The FAR's first packet on this core: a notifying FAR tells the CP (the endpoint dedups cores).
                let f = &self.rules.fars[fi];
                if f.notify && self.ddn.len() < DDN_QUEUE {
                    let seid = self.rules.sessions[s as usize].seid;
                    self.ddn.push((seid, self.rules.pdrs[pi as usize].id));
                }
            }
            self.c.buffer_expired += self.held.expire_far(fi, now, bar.duration_ns);
        }
        let limit = if bar.packets == NONE { self.cfg.buffer } else { u64::from(bar.packets) };
        let seid = self.rules.sessions[s as usize].seid;
        // Packets queued behind released ones are bounded by the store only (their FAR forwards).
        let ok = (draining || u64::from(self.held.held_of(s)) < limit)
            && self.held.put(batch.data(i), batch.timestamps()[i], (s, seid), fi, draining, self.cfg.buffer_total);
        if ok {
            self.c.buffered += 1;
        } else {
            self.c.buffer_full += 1;
        }
    }

    /// Takes the control block's new rule set, if there is one (one atomic load).
    fn sync_rules(&mut self) {
        if let Some((ctl, v)) = &self.control {
            if ctl.version() != *v {
                let (v, rules) = ctl.current();
                let split = ctl.cores();
                if let Some(c) = self.control.as_mut() {
                    c.1 = v;
                }
                self.split = split;
                self.version = v;
                self.set_rules(rules);
            }
        }
    }

    /// Hands queued usage reports and downlink data events to the endpoint.
    fn push_events(&mut self) {
        if let Some((ctl, _)) = &self.control {
            if !self.reports.is_empty() {
                ctl.push_reports(&mut self.reports);
            }
            if !self.ddn.is_empty() {
                ctl.push_ddn(&mut self.ddn);
            }
            if !self.echo_in.is_empty() {
                ctl.push_echo_responses(&mut self.echo_in);
            }
        } else {
            // No control plane to notify (a session file).
            self.ddn.clear();
            self.echo_in.clear();
        }
    }

    /// Appends the GTP-U echo requests the endpoint asked for to `out` (TS
    /// 29.281 §7.2.1: TEID 0, the S flag and a sequence number, no IE), from
    /// the N3 address and the UPF's MAC to the N3 next hop, out of the N3 port.
    fn send_echo_requests(&mut self, pool: &mut PacketPool, out: &mut Batch, now: u64) {
        if let Some((ctl, _)) = &self.control {
            ctl.take_echo_requests(&mut self.echo_out);
        }
        let mut sent = 0;
        for &(peer, seq) in &self.echo_out {
            let mut f = [0u8; 14 + 20 + 8 + 12];
            f[0..6].copy_from_slice(&self.cfg.gw_mac[0].unwrap_or([0xff; 6]));
            f[6..12].copy_from_slice(&self.cfg.mac.unwrap_or([0; 6]));
            f[12..14].copy_from_slice(&ETH_IPV4);
            let ip = &mut f[14..34];
            ip.copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            ip[12..16].copy_from_slice(&self.cfg.n3_addr.octets());
            ip[16..20].copy_from_slice(&peer.to_be_bytes());
            let c = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let p = GTPU_PORT.to_be_bytes();
            let q = seq.to_be_bytes();
            f[34..54]
                .copy_from_slice(&[p[0], p[1], p[0], p[1], 0, 20, 0, 0, 0x32, 1, 0, 4, 0, 0, 0, 0, q[0], q[1], 0, 0]);
            if !out.push_copy(pool, &f, now) {
                break;
            }
            let i = out.len() - 1;
            if let Some(port) = self.cfg.n3_port {
                out.verdicts_mut()[i] = port;
            }
            sent += 1;
        }
        // What did not fit goes in the next burst.
        self.echo_out.drain(..sent);
        self.c.echo_requests_sent += sent as u64;
    }

    fn port(&self, to: Iface) -> Option<u16> {
        match to {
            Iface::Access => self.cfg.n3_port,
            Iface::Core => self.cfg.n6_port,
        }
    }

    /// FAR action, QER gate and MBR, URR counting (direction `dir`: 0 up, 1 down).
    /// `false`: the packet is dropped (counted).
    #[inline]
    fn enforce(&mut self, pdr: &Act, dir: usize, bytes: u64, now: u64) -> bool {
        match pdr.action {
            FarAction::Forward => {}
            FarAction::Drop => {
                self.c.far_drop += 1;
                return false;
            }
            // Held before (`act`): never here.
            FarAction::Buffer => return false,
        }
        if pdr.gate & (1 << dir) == 0 {
            self.c.gate_closed += 1;
            return false;
        }
        if pdr.mbr & (1 << dir) != 0 && !self.rate(pdr, dir, bytes, now) {
            self.c.mbr_exceeded += 1;
            return false;
        }
        let board = &*self.board;
        let urrs = self.rules.refs(&pdr.urr);
        if urrs.iter().any(|&ui| board.cells.get(ui as usize).is_some_and(|c| c.exhausted.load(Ordering::Relaxed) != 0))
        {
            // TS 29.244 5.2.2.2: a URR's volume quota used up stops the traffic it measures.
            self.c.quota_drop += 1;
            return false;
        }
        for &ui in urrs {
            let Some(u) = board.cells.get(ui as usize) else { continue };
            if dir == 0 {
                bump(&u.ul_bytes, bytes);
                bump(&u.ul_packets, 1);
            } else {
                bump(&u.dl_bytes, bytes);
                bump(&u.dl_packets, 1);
            }
            let since = u.since.load(Ordering::Relaxed) + bytes;
            u.since.store(since, Ordering::Relaxed);
            let at = u.nudge_at.load(Ordering::Relaxed);
            if at > 0 && since >= at {
                u.since.store(0, Ordering::Relaxed);
                let s = u.snapshot();
                let cfg = self.rules.urrs[ui as usize];
                self.c.usage_reports += 1;
                if self.reports.len() < self.cfg.reports {
                    let seid = self.rules.sessions[cfg.session as usize].seid;
                    self.reports.push(UsageReport { seid, urr_id: cfg.id, volume: s.bytes(), at_ns: now });
                } else {
                    self.c.usage_reports_lost += 1;
                }
            }
        }
        true
    }

    /// The PDR's QERs' rates (TS 29.244 §5.4.2): true if the packet conforms
    /// to every MBR (a session AMBR is one of them), then charged to each,
    /// and counted within or above each GBR; false: it exceeds one (nothing charged).
    #[inline]
    fn rate(&mut self, pdr: &Act, dir: usize, bytes: u64, now: u64) -> bool {
        let (rules, meters, qos, shared) = (&*self.rules, &*self.meters, &mut self.qos, self.shared_qos);
        let qers = rules.refs(&pdr.qer);
        // Several cores: credit leased from the QER's shared bucket; one core: its own bucket.
        for &q in qers {
            let r = &rules.qers[q as usize];
            let kbps = r.mbr_kbps[dir];
            let Some(st) = qos.get_mut(r.rated as usize).filter(|_| kbps > 0) else { continue };
            let meter = if shared { meters.get(st.slot) } else { None };
            let ok = match meter {
                Some(m) => st.mbr[dir].conforms_shared(&m.mbr[dir], kbps, bytes, now),
                None => st.mbr[dir].conforms(kbps, bytes, now),
            };
            if !ok {
                return false;
            }
        }
        for &q in qers {
            let r = &rules.qers[q as usize];
            let Some(st) = qos.get_mut(r.rated as usize) else { continue };
            if r.mbr_kbps[dir] > 0 {
                st.mbr[dir].charge(bytes);
            }
            let g = r.gbr_kbps[dir];
            if g > 0 {
                let meter = if shared { meters.get(st.slot) } else { None };
                let within = match meter {
                    Some(m) => st.gbr[dir].conforms_shared(&m.gbr[dir], g, bytes, now),
                    None => st.gbr[dir].conforms(g, bytes, now),
                };
                if within {
                    st.gbr[dir].charge(bytes);
                    st.within[dir] += bytes;
                } else {
                    st.above[dir] += bytes;
                }
            }
        }
        true
    }

    /// Prepends IPv4/UDP/GTP-U (and a DL PDU Session Container when a QFI
    /// is set) after the L2 header of packet `i`, whose IP packet runs to the end.
    fn encap(
        &mut self,
        batch: &mut Batch,
        i: usize,
        l3: usize,
        (ohc_teid, ohc_addr): (u32, u32),
        (qfi, tos, df): (u8, u8, bool),
    ) -> bool {
        let psc = (qfi != rules::ANY_QFI).then_some(PduSessionInfo {
            pdu_type: PduType::Downlink,
            qfi,
            ppp: false,
            rqi: false,
            ppi: None,
        });
        let g = gtpu::GtpuRepr::g_pdu(ohc_teid, psc, 0);
        let glen = g.buffer_len();
        let n = 28 + glen;
        let inner_len = batch.lens()[i] as usize - l3;
        let total = 28 + glen + inner_len;
        if total > usize::from(u16::MAX) {
            self.c.no_room += 1;
            return false;
        }
        let Some(d) = batch.prepend(i, n) else {
            self.c.no_room += 1;
            return false;
        };
        d.copy_within(n..n + l3, 0);
        d[l3 - 2..l3].copy_from_slice(&ETH_IPV4);
        let ip = &mut d[l3..l3 + 20];
        ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // The FAR's transport level marking (DSCP the SMF chose for the QoS flow).
        ip[1] = tos;
        if !df {
            // Too big for the N3 MTU, inner DF clear: routers on N3 may fragment it.
            ip[6] = 0;
        }
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[12..16].copy_from_slice(&self.cfg.n3_addr.octets());
        ip[16..20].copy_from_slice(&ohc_addr.to_be_bytes());
        let c = checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let u = l3 + 20;
        let ulen = (8 + glen + inner_len) as u16;
        d[u..u + 2].copy_from_slice(&GTPU_PORT.to_be_bytes());
        d[u + 2..u + 4].copy_from_slice(&GTPU_PORT.to_be_bytes());
        d[u + 4..u + 6].copy_from_slice(&ulen.to_be_bytes());
        d[u + 6..u + 8].copy_from_slice(&[0, 0]);
        let g = gtpu::GtpuRepr::g_pdu(ohc_teid, psc, inner_len);
        if g.emit(&mut GtpuPacket::new_unchecked(&mut d[u + 8..u + 8 + glen])).is_err() {
            self.c.no_room += 1;
            return false;
        }
        if self.cfg.udp_checksum {
            let ph = checksum::pseudo_header_v4(self.cfg.n3_addr.octets(), ohc_addr.to_be_bytes(), 17, ulen);
            let s = checksum::combine(ph, checksum::sum(&d[u..u + ulen as usize]));
            let mut c = checksum::finish(s);
            if c == 0 {
                c = 0xffff;
            }
            d[u + 6..u + 8].copy_from_slice(&c.to_be_bytes());
        }
        self.c.encapsulated += 1;
        true
    }

    /// Turns an echo request into its response in place (TS 29.281 §7.2.2):
    /// addresses and ports swapped, the sequence number kept, a Recovery IE.
    fn echo_response(&mut self, batch: &mut Batch, i: usize) -> Option<Option<u16>> {
        let m = self.scratch.metas[i];
        if m.v6 {
            self.c.unsupported_msg += 1;
            return None;
        }
        let (l3, l4) = (m.l3 as usize, m.l4 as usize);
        let d = batch.data(i);
        let g = GtpuPacket::new_unchecked(&d[l4 + 8..]);
        let seq = g.seq_number().unwrap_or(0);
        let (src, dst) =
            (<[u8; 4]>::try_from(&d[l3 + 12..l3 + 16]).ok()?, <[u8; 4]>::try_from(&d[l3 + 16..l3 + 20]).ok()?);
        let sport = u16::from_be_bytes([d[l4], d[l4 + 1]]);
        let len = l3 + 20 + 8 + 14;
        if !batch.set_len(i, len) {
            self.c.no_room += 1;
            return None;
        }
        let d = batch.data_mut(i);
        for k in 0..6 {
            d.swap(k, k + 6);
        }
        let ip = &mut d[l3..l3 + 20];
        ip.copy_from_slice(&[0x45, 0, 0, 42, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip[12..16].copy_from_slice(&dst);
        ip[16..20].copy_from_slice(&src);
        let c = checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let u = l3 + 20;
        d[u..u + 8].copy_from_slice(&[0, 0, 0, 0, 0, 22, 0, 0]);
        d[u..u + 2].copy_from_slice(&GTPU_PORT.to_be_bytes());
        d[u + 2..u + 4].copy_from_slice(&sport.to_be_bytes());
        let s = seq.to_be_bytes();
        d[u + 8..u + 22].copy_from_slice(&[0x32, 2, 0, 6, 0, 0, 0, 0, s[0], s[1], 0, 0, 14, 0]);
        self.c.echo_responses += 1;
        Some(self.cfg.n3_port)
    }

    /// Answers an ARP request for the N3 or N6 address in place (RFC 826:
    /// the reply from `mac`, to the asker, out of the side the address is on).
    fn arp_reply(&mut self, batch: &mut Batch, i: usize) -> Option<Option<u16>> {
        let mac = self.cfg.mac?;
        let d = batch.data(i);
        // Ethernet/IPv4 request: htype 1, ptype 0x0800, hlen 6, plen 4, op 1.
        let ours = d.len() >= 42 && d[14..22] == [0, 1, 8, 0, 6, 4, 0, 1];
        let target = <[u8; 4]>::try_from(d.get(38..42)?).ok()?;
        let port = if target == self.cfg.n3_addr.octets() {
            self.cfg.n3_port
        } else if target == self.cfg.n6_addr.octets() {
            self.cfg.n6_port
        } else {
            self.c.not_ip += 1;
            return None;
        };
        if !ours {
            self.c.not_ip += 1;
            return None;
        }
        let d = batch.data_mut(i);
        let (asker_mac, asker_ip) = (<[u8; 6]>::try_from(&d[22..28]).ok()?, <[u8; 4]>::try_from(&d[28..32]).ok()?);
        d[0..6].copy_from_slice(&asker_mac);
        d[6..12].copy_from_slice(&mac);
        d[21] = 2;
        d[22..28].copy_from_slice(&mac);
        d[28..32].copy_from_slice(&target);
        d[32..38].copy_from_slice(&asker_mac);
        d[38..42].copy_from_slice(&asker_ip);
        self.c.arp_replies += 1;
        Some(port)
    }

    /// One more error message within `error_pps` (a token bucket of one
    /// second's worth on the packet clock), else counted as limited.
    fn error_allowed(&mut self, now: u64) -> bool {
        let rate = self.cfg.error_pps;
        let dt = now.saturating_sub(self.error_last).min(1_000_000_000);
        self.error_last = self.error_last.max(now);
        self.error_tokens = (self.error_tokens + dt * rate).min(rate * 1_000_000_000);
        if rate == 0 || self.error_tokens < 1_000_000_000 {
            self.c.errors_limited += 1;
            return false;
        }
        self.error_tokens -= 1_000_000_000;
        true
    }

    /// Turns a G-PDU to an unknown TEID into a GTP-U Error Indication to its
    /// sender in place (TS 29.281 §7.3.1: TEID 0, the S flag, the IEs TEID
    /// Data I (the unknown TEID) and GTP-U Peer Address (the address it was
    /// sent to); UDP port 2152 both ways, §4.4.2.4).
    fn error_indication(&mut self, batch: &mut Batch, i: usize, teid: u32) -> Option<Option<u16>> {
        let m = self.scratch.metas[i];
        if m.v6 || !self.error_allowed(batch.timestamps()[i]) {
            return None;
        }
        let l3 = m.l3 as usize;
        let d = batch.data(i);
        let (src, dst) =
            (<[u8; 4]>::try_from(&d[l3 + 12..l3 + 16]).ok()?, <[u8; 4]>::try_from(&d[l3 + 16..l3 + 20]).ok()?);
        if !batch.set_len(i, l3 + 52) {
            self.c.no_room += 1;
            return None;
        }
        let d = batch.data_mut(i);
        for k in 0..6 {
            d.swap(k, k + 6);
        }
        let ip = &mut d[l3..l3 + 20];
        ip.copy_from_slice(&[0x45, 0, 0, 52, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip[12..16].copy_from_slice(&dst);
        ip[16..20].copy_from_slice(&src);
        let c = checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let u = l3 + 20;
        let p = GTPU_PORT.to_be_bytes();
        d[u..u + 8].copy_from_slice(&[p[0], p[1], p[0], p[1], 0, 32, 0, 0]);
        let t = teid.to_be_bytes();
        d[u + 8..u + 32].copy_from_slice(&[
            0x32, 26, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, // header: S, type 26, length 16, TEID 0, seq 0
            16, t[0], t[1], t[2], t[3], // TEID Data I
            133, 0, 4, dst[0], dst[1], dst[2], dst[3], // GTP-U Peer Address
        ]);
        self.c.error_indications += 1;
        Some(self.cfg.n3_port)
    }

    /// Turns the IPv4 packet at `l3` into an ICMP error (`[type, code]`, the
    /// 4 bytes after the checksum `rest`) from the N6 address back to its
    /// source, quoting its header and first 8 payload bytes (RFC 792, RFC
    /// 1812 §4.3.2.3); no error about an ICMP error or a non-first fragment.
    fn icmp4_error(&mut self, batch: &mut Batch, i: usize, l3: usize, tc: [u8; 2], rest: [u8; 4], now: u64) -> bool {
        let d = batch.data(i);
        let ip = &d[l3..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
        let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
        let icmp_error = ip[9] == 1 && ip.get(ihl).is_some_and(|&t| matches!(t, 3 | 4 | 5 | 11 | 12));
        if frag != 0 || icmp_error || !self.error_allowed(now) {
            return false;
        }
        let src = <[u8; 4]>::try_from(&ip[12..16]).unwrap_or([0; 4]);
        let quote = (ihl + 8).min(total);
        let cur = d.len();
        let len = l3 + 28 + quote;
        if len > cur && !batch.set_len(i, len) {
            self.c.no_room += 1;
            return false;
        }
        let d = batch.data_mut(i);
        d.copy_within(l3..l3 + quote, l3 + 28);
        for k in 0..6 {
            d.swap(k, k + 6);
        }
        let ip = &mut d[l3..l3 + 20];
        ip.copy_from_slice(&[0x45, 0xc0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip[2..4].copy_from_slice(&((28 + quote) as u16).to_be_bytes());
        ip[12..16].copy_from_slice(&self.cfg.n6_addr.octets());
        ip[16..20].copy_from_slice(&src);
        let c = checksum::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let icmp = &mut d[l3 + 20..l3 + 28 + quote];
        icmp[..8].copy_from_slice(&[tc[0], tc[1], 0, 0, rest[0], rest[1], rest[2], rest[3]]);
        let c = checksum::checksum(icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        if !batch.set_len(i, len) {
            return false;
        }
        self.c.icmp_errors += 1;
        true
    }
}

impl Upf {
    /// Answers an IPv6 Neighbor Solicitation for the N3 or N6 IPv6 address
    /// in place (RFC 4861 §7.2.4: a Neighbor Advertisement with the Router
    /// and Override flags, Solicited when the asker has an address — else
    /// to all nodes — and the UPF's MAC as Target Link-Layer Address), out
    /// of the side the address is on. None: not a solicitation for us.
    fn nd_advert(&mut self, batch: &mut Batch, i: usize) -> Option<Option<u16>> {
        let mac = self.cfg.mac?;
        let l3 = self.scratch.metas[i].l3 as usize;
        let ip = batch.data(i).get(l3..)?;
        // A solicitation right after the fixed header, hop limit 255 (§7.1.1).
        if ip.len() < 64 || ip[0] >> 4 != 6 || ip[6] != 58 || ip[7] != 255 || ip[40] != 135 || ip[41] != 0 {
            return None;
        }
        let target = <[u8; 16]>::try_from(&ip[48..64]).ok()?;
        let port = if Some(target) == self.cfg.addr6[0] {
            self.cfg.n3_port
        } else if Some(target) == self.cfg.addr6[1] {
            self.cfg.n6_port
        } else {
            return None;
        };
        let asker = <[u8; 16]>::try_from(&ip[8..24]).ok()?;
        let solicited = asker != [0; 16];
        let d = batch.data(i);
        let (dst, dst_mac) = if solicited {
            (asker, <[u8; 6]>::try_from(&d[6..12]).ok()?)
        } else {
            let mut all = [0u8; 16];
            (all[0], all[1], all[15]) = (0xff, 0x02, 1);
            (all, [0x33, 0x33, 0, 0, 0, 1])
        };
        if !batch.set_len(i, l3 + 40 + 32) {
            self.c.no_room += 1;
            return None;
        }
        let d = batch.data_mut(i);
        d[0..6].copy_from_slice(&dst_mac);
        d[6..12].copy_from_slice(&mac);
        let ip = &mut d[l3..l3 + 72];
        ip[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 32, 58, 255]);
        ip[8..24].copy_from_slice(&target);
        ip[24..40].copy_from_slice(&dst);
        let flags = 0x80 | 0x20 | if solicited { 0x40 } else { 0 };
        ip[40..48].copy_from_slice(&[136, 0, 0, 0, flags, 0, 0, 0]);
        ip[48..64].copy_from_slice(&target);
        ip[64..66].copy_from_slice(&[2, 1]);
        ip[66..72].copy_from_slice(&mac);
        let ph = checksum::pseudo_header_v6(target, dst, 58, 32);
        let c = checksum::finish(checksum::combine(ph, checksum::sum(&ip[40..72])));
        ip[42..44].copy_from_slice(&c.to_be_bytes());
        self.c.nd_adverts += 1;
        Some(port)
    }

    /// Turns the IPv6 packet at `l3` into an ICMPv6 error (`[type, code]`,
    /// the 4 bytes after the checksum `rest`) from the N6 IPv6 address back
    /// to its source, quoting as much of it as fits in 1,280 bytes (RFC 4443
    /// §2.4); none without an N6 IPv6 address, about an ICMPv6 error, or
    /// over `error_pps`.
    fn icmp6_error(&mut self, batch: &mut Batch, i: usize, l3: usize, tc: [u8; 2], rest: [u8; 4], now: u64) -> bool {
        let Some(src) = self.cfg.addr6[1].or(self.cfg.addr6[0]) else { return false };
        let d = batch.data(i);
        let ip = &d[l3..];
        if ip.len() < 40 || (ip[6] == 58 && ip.get(40).is_some_and(|&t| t < 128)) || !self.error_allowed(now) {
            return false;
        }
        let Ok(asker) = <[u8; 16]>::try_from(&ip[8..24]) else { return false };
        let quote = ip_len(ip).unwrap_or(0).min(ip.len()).min(1280 - 48);
        let len = l3 + 48 + quote;
        if len > d.len() && !batch.set_len(i, len) {
            self.c.no_room += 1;
            return false;
        }
        let d = batch.data_mut(i);
        d.copy_within(l3..l3 + quote, l3 + 48);
        for k in 0..6 {
            d.swap(k, k + 6);
        }
        let plen = ((8 + quote) as u16).to_be_bytes();
        let ip = &mut d[l3..l3 + 48 + quote];
        ip[..8].copy_from_slice(&[0x60, 0, 0, 0, plen[0], plen[1], 58, 64]);
        ip[8..24].copy_from_slice(&src);
        ip[24..40].copy_from_slice(&asker);
        ip[40..48].copy_from_slice(&[tc[0], tc[1], 0, 0, rest[0], rest[1], rest[2], rest[3]]);
        let ph = checksum::pseudo_header_v6(src, asker, 58, (8 + quote) as u32);
        let c = checksum::finish(checksum::combine(ph, checksum::sum(&ip[40..])));
        ip[42..44].copy_from_slice(&c.to_be_bytes());
        if !batch.set_len(i, len) {
            return false;
        }
        self.c.icmp_errors += 1;
        true
    }
}

/// Decrements the TTL (IPv4, checksum updated as RFC 1624 eq. 3) or hop
/// limit (IPv6) of the IP packet at the start of `ip`; false if it expired
/// (1 or 0 on arrival: not forwarded).
#[inline]
fn decrement_ttl(ip: &mut [u8], v6: bool) -> bool {
    let at = if v6 { 7 } else { 8 };
    let Some(&ttl) = ip.get(at) else { return false };
    if ttl <= 1 {
        return false;
    }
    ip[at] = ttl - 1;
    if !v6 {
        let old = u16::from_be_bytes([ttl, ip[9]]);
        let new = u16::from_be_bytes([ttl - 1, ip[9]]);
        let hc = u16::from_be_bytes([ip[10], ip[11]]);
        let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }
    true
}

/// The end of the UDP datagram at `m.l4` (within the frame and IP datagram).
fn udp_end(data: &[u8], m: &PktMeta) -> Option<usize> {
    let l4 = m.l4 as usize;
    let ulen = u16::from_be_bytes([*data.get(l4 + 4)?, *data.get(l4 + 5)?]) as usize;
    let ip_end = m.l3 as usize + ip_len(data.get(m.l3 as usize..)?)?;
    let end = l4 + ulen;
    (ulen >= 8 + gtpu::HEADER_LEN && end <= ip_end && end <= data.len()).then_some(end)
}

/// The length of the IP packet at the start of `ip` by its own header.
fn ip_len(ip: &[u8]) -> Option<usize> {
    match ip.first()? >> 4 {
        4 => Some(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize),
        6 => Some(40 + u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]) as usize),
        _ => None,
    }
}

/// The classification fields of an IP packet as sent by the UE (`ue` is
/// the source), its length and whether it is IPv6; `None` when malformed.
/// IPv6 extension headers (hop-by-hop, routing, fragment, destination
/// options) are walked; a non-first fragment has no ports.
#[inline]
fn inner_fields(ip: &[u8]) -> Option<(Fields, usize, bool)> {
    let len = ip_len(ip)?;
    if len > ip.len() {
        return None;
    }
    let ip = &ip[..len];
    let (proto, src, dst, l4, first) = match ip[0] >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 || len < ihl {
                return None;
            }
            let a = |at: usize| rules::v4_128(u32::from_be_bytes([ip[at], ip[at + 1], ip[at + 2], ip[at + 3]]));
            let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            (ip[9], a(12), a(16), ihl, frag == 0)
        }
        _ => {
            if len < 40 {
                return None;
            }
            let a = |at: usize| u128::from_be_bytes(ip[at..at + 16].try_into().unwrap_or([0; 16]));
            let (mut nh, mut off, mut first) = (ip[6], 40usize, true);
            for _ in 0..8 {
                match nh {
                    0 | 43 | 60 => {
                        let h = ip.get(off..off + 2)?;
                        nh = h[0];
                        off += 8 + usize::from(h[1]) * 8;
                    }
                    44 => {
                        let h = ip.get(off..off + 8)?;
                        nh = h[0];
                        first = u16::from_be_bytes([h[2], h[3]]) & 0xfff8 == 0;
                        off += 8;
                    }
                    _ => break,
                }
            }
            if off > len {
                return None;
            }
            (nh, a(8), a(24), off, first)
        }
    };
    let (sp, dp) = match proto {
        6 | 17 | 132 | 136 if first => {
            let p = ip.get(l4..l4 + 4)?;
            (u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]]))
        }
        _ => (0, 0),
    };
    Some((Fields { proto, ue: src, remote: dst, ue_port: sp, remote_port: dp }, len, ip[0] >> 4 == 6))
}

impl Nf for Upf {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn process(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, ctx: &NfContext) {
        // One atomic load per call; a new rule set applies to whole batches (ranges).
        self.sync_rules();
        // One relaxed load per call: the cores metering these rules (they attach before traffic).
        self.shared_qos = self.meters.cores() > 1;
        self.run(batch, range, ctx);
        if let Some(f) = self.ipfix.as_deref_mut() {
            // The active timeout's walk: one comparison per call on the batch's time.
            f.advance(&self.rules, &self.board.cells, ctx.now_ns);
        }
        self.push_events();
    }

    fn holds_packets(&self) -> bool {
        true
    }

    /// Sends held packets whose FAR forwards again, oldest first, through the
    /// rules as they are now (so they are encapsulated, metered and counted
    /// as forwarded packets are); ones older than their BAR's duration are
    /// discarded (counted).
    fn release(&mut self, pool: &mut PacketPool, out: &mut Batch, ctx: &NfContext) {
        self.sync_rules();
        self.send_echo_requests(pool, out, ctx.now_ns);
        if self.held.queue.n == 0 {
            return;
        }
        let start = out.len();
        while out.room() > 0 {
            let Some((slot, s)) = self.held.front() else { break };
            let ts = self.held.ts[slot];
            let dur = self.rules.bars.get(s as usize).map_or(u64::MAX, |b| b.duration_ns);
            if ctx.now_ns.saturating_sub(ts) > dur {
                self.held.pop_front();
                self.c.buffer_expired += 1;
                continue;
            }
            // The packet leaves now: its time is the release's (rates meter it then).
            if !out.push_copy(pool, self.held.frame(slot), ctx.now_ns.max(ts)) {
                break;
            }
            self.held.pop_front();
            self.c.released += 1;
        }
        let end = out.len();
        if end > start {
            self.shared_qos = self.meters.cores() > 1;
            self.releasing = true;
            self.run(out, start..end, ctx);
            self.releasing = false;
            self.push_events();
        }
    }

    fn counters(&self) -> NfCounters {
        self.counters
    }

    fn rewrites_flow(&self) -> bool {
        true
    }

    fn report(&self) -> Option<Value> {
        self.report_json()
    }

    fn merge_report(&self, into: &mut Value, other: &Value) {
        // The rule set is the same on every core: keep one count.
        // The PFCP counters are the endpoint's, shared by every core: one copy too.
        crate::report::merge_keeping(into, other, &["sessions", "pdrs", "pfcp"]);
    }

    /// URR usage rows; refused when no URR can ever count (no URR in a
    /// fixed rule set: no session file or one without URRs, and no PFCP).
    fn export_kind(&self) -> Export {
        if self.control.is_none() && self.rules.urrs.is_empty() {
            Export::None
        } else {
            Export::Report
        }
    }

    /// One row per URR with traffic: SEID, URR ID, bytes and packets per direction (all cores).
    fn export_report_rows(&self, merged: &Value) -> Vec<Value> {
        export_rows(merged)
    }

    fn ipfix_usage_on(&self) -> bool {
        true
    }

    /// Usage records (see `flowplane_wire::ipfix::UsageRecord` for the
    /// elements): each URR's counts on this core since its previous record,
    /// every `active_ns` and at the run's end.
    fn attach_ipfix(&mut self, tx: crate::ipfix::RecordTx, active_ns: Option<u64>) {
        self.ipfix = Some(Box::new(UsageFeed {
            tx,
            active_ns: active_ns.map(|a| a.max(1)),
            sent: vec![Usage::default(); self.board.cells.len()],
            at: 0,
            walked_ns: 0,
            now_ns: 0,
        }));
    }

    fn ipfix_end(&mut self, end_ns: u64) {
        if let Some(f) = self.ipfix.as_deref_mut() {
            // A chain of batch elements keeps no run clock: the latest batch this core saw then.
            let end = end_ns.max(f.now_ns);
            for i in 0..self.board.cells.len() {
                f.report(&self.rules, &self.board.cells, i, end);
            }
        }
    }

    fn tick(&mut self, now_ns: u64) {
        // An idle port's timer: usage counted before the port went quiet is still reported on time.
        if let Some(f) = self.ipfix.as_deref_mut() {
            f.advance(&self.rules, &self.board.cells, now_ns);
        }
    }
}

impl Upf {
    fn run(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, ctx: &NfContext) {
        if self.cfg.staged {
            // With `profile`, where the cycles go: one TSC read between passes (per batch, not per packet).
            let profile = self.cfg.profile;
            let mut t = if profile { tsc::rdtsc() } else { 0 };
            let mut lap = |u: &mut Upf, k: usize| {
                if profile {
                    let now = tsc::rdtsc();
                    u.pass_cycles[k] += now.saturating_sub(t);
                    t = now;
                }
            };
            for i in range.clone() {
                self.stage_parse(batch, i);
            }
            lap(self, 0);
            for i in range.clone() {
                self.stage_probe(i);
            }
            lap(self, 1);
            for i in range.clone() {
                self.stage_lookup(i);
            }
            lap(self, 2);
            for i in range.clone() {
                self.stage_classify(batch, i);
            }
            lap(self, 3);
            for i in range.clone() {
                self.stage_prepare(i);
            }
            lap(self, 4);
            if profile {
                self.timed_packets += range.len() as u64;
            }
            for i in range {
                let now = packet_time(batch, i, ctx);
                self.stage_act(batch, i, now);
            }
            lap(self, 5);
        } else {
            for i in range {
                self.stage_parse(batch, i);
                self.stage_lookup(i);
                self.stage_classify(batch, i);
                let now = packet_time(batch, i, ctx);
                self.stage_act(batch, i, now);
            }
        }
    }

    fn report_json(&self) -> Option<Value> {
        let mut usage = Map::new();
        if self.cfg.usage {
            for ((seid, id), u) in self.usage() {
                if u.ul_packets + u.dl_packets == 0 {
                    continue;
                }
                usage.insert(
                    format!("{seid}/{id}"),
                    json!({"ul_bytes": u.ul_bytes, "ul_packets": u.ul_packets, "dl_bytes": u.dl_bytes, "dl_packets": u.dl_packets}),
                );
            }
        }
        let reports: Vec<Value> = self
            .reports
            .iter()
            .take(64)
            .map(|r| json!({"seid": r.seid, "urr": r.urr_id, "volume": r.volume, "at_ns": r.at_ns}))
            .collect();
        // GBR accounting per QER (TS 29.244 §5.4.2): bytes passed within and above the GBR.
        let mut gbr = Map::new();
        for ((seid, id), q) in self.rules.keys(&self.rules.qers, |q| (q.session, q.id)).zip(&self.rules.qers) {
            let Some(st) = self.qos.get(q.rated as usize).filter(|_| q.gbr_kbps != [0, 0]) else { continue };
            gbr.insert(
                format!("{seid}/{id}"),
                json!({"ul_within": st.within[0], "ul_above": st.above[0], "dl_within": st.within[1], "dl_above": st.above[1]}),
            );
        }
        let mut out = json!({
            "sessions": self.rules.sessions.len(),
            "gbr": gbr,
            "pdrs": self.rules.pdrs.len(),
            "counters": self.c.to_json(),
            "usage": usage,
            "queued_reports": reports,
            "held": self.held.in_use(),
        });
        if let Some((ctl, _)) = &self.control {
            out["pfcp"] = ctl.stats.to_json();
        }
        if self.cfg.profile && self.cfg.staged {
            // Sums (cycles, packets): they add up over cores; the reader divides.
            let passes: Map<String, Value> =
                PASSES.iter().zip(&self.pass_cycles).map(|(n, &c)| (n.to_string(), json!(c))).collect();
            out["profile"] = json!({"cycles": passes, "packets": self.timed_packets});
        }
        Some(out)
    }
}

/// The PFCP endpoint's settings from the `upf` parameters: the Node ID is
/// `node_id=`, else the `pfcp=` address's IP when it names one, else the
/// N3 address; the N4 address (in F-SEIDs) is the `pfcp=` IP, else the Node
/// ID's address, else the N3 address.
fn n4_config(p: &mut Params, pfcp: &str, n3: Ipv4Addr) -> Result<control::N4Config, ParamError> {
    let node = p.text(&NODE_ID)?;
    let bound: Option<Ipv4Addr> =
        pfcp.parse::<std::net::SocketAddrV4>().ok().map(|a| *a.ip()).filter(|a| !a.is_unspecified());
    let node_id = if node.is_empty() {
        control::NodeId::V4(bound.unwrap_or(n3))
    } else {
        control::NodeId::parse(&node).map_err(|e| ParamError(format!("upf: parameter 'node_id={node}': {e}")))?
    };
    let n4 = bound.or(match node_id {
        control::NodeId::V4(a) => Some(a),
        control::NodeId::Fqdn(_) => None,
    });
    let mut c = control::N4Config::new(n3);
    c.node_id = node_id;
    c.n4 = n4.unwrap_or(n3);
    c.heartbeat = std::time::Duration::from_millis(p.uint(&HEARTBEAT)?);
    c.t1 = std::time::Duration::from_millis(p.uint(&T1)?);
    c.n1 = p.uint(&N1)? as u32;
    c.keep_sessions_on_restart = p.flag(&KEEP_RESTART)?;
    c.keep_sessions_on_failure = p.flag(&KEEP_FAILURE)?;
    c.rcvbuf = p.uint(&RCVBUF)? as usize;
    c.gtpu_echo = std::time::Duration::from_millis(p.uint(&ECHO)?);
    Ok(c)
}

/// A MAC parameter (`02:00:00:00:00:01`), if set.
fn mac_param(p: &mut Params, spec: &ParamSpec) -> Result<Option<[u8; 6]>, ParamError> {
    let t = p.text(spec)?;
    if t.is_empty() {
        return Ok(None);
    }
    let bad =
        || ParamError(format!("upf: parameter '{}={t}' is not a MAC address (like 02:00:00:00:00:01)", spec.name));
    let parts: Vec<&str> = t.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut m = [0u8; 6];
    for (x, s) in m.iter_mut().zip(&parts) {
        *x = u8::from_str_radix(s, 16).map_err(|_| bad())?;
    }
    Ok(Some(m))
}

/// An IPv6 address parameter, if set.
fn v6_param(p: &mut Params, spec: &ParamSpec) -> Result<Option<[u8; 16]>, ParamError> {
    let t = p.text(spec)?;
    if t.is_empty() {
        return Ok(None);
    }
    let a: std::net::Ipv6Addr =
        t.parse().map_err(|_| ParamError(format!("upf: parameter '{}={t}' is not an IPv6 address", spec.name)))?;
    Ok(Some(a.octets()))
}

/// Export rows of a merged report: one per URR with traffic.
fn export_rows(merged: &Value) -> Vec<Value> {
    let Some(u) = merged.get("usage").and_then(Value::as_object) else { return Vec::new() };
    u.iter()
        .filter_map(|(k, v)| {
            let (seid, urr) = k.split_once('/')?;
            let mut row = json!({"seid": seid.parse::<u64>().ok()?, "urr": urr.parse::<u32>().ok()?});
            for f in ["ul_bytes", "ul_packets", "dl_bytes", "dl_packets"] {
                row[f] = v[f].clone();
            }
            Some(row)
        })
        .collect()
}

/// The packet clock for packet `i`: its own timestamp (as the executors
/// give stateful NFs; `ctx` is the batch's).
#[inline(always)]
fn packet_time(batch: &Batch, i: usize, _ctx: &NfContext) -> u64 {
    batch.timestamps()[i]
}

#[cfg(test)]
#[path = "../upf/tests.rs"]
mod tests;

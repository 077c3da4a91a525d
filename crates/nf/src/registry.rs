//! The NF registry: chain-spec names -> constructors, with parameter docs
//! for `flowplane nfs`. Adding an NF = one file + one entry here.
//!
//! A built NF is handed to an [`NfSink`] with its concrete type, so whoever
//! drives it (the engine's executors, a test harness) can monomorphise over
//! it: the NF library knows nothing of tables or batches of state.

use crate::acl::Acl;
use crate::count::Count;
use crate::ddos::Ddos;
use crate::forward::Forward;
use crate::fsc::Fsc;
use crate::hh::Hh;
use crate::lb::Lb;
use crate::policer::Policer;
use crate::psd::Psd;
use crate::ratelimit::RateLimit;
use crate::srcctr::SrcCtr;
use crate::stateful::StatefulNf;
use crate::synthetic::Synthetic;
use crate::{Nf, ParamError, Params};

/// Receives a freshly built NF with its concrete type, so the engine can
/// monomorphise its batch loop over it.
pub trait NfSink {
    /// What the sink makes of the NF.
    type Out;
    /// A stateless batch element.
    fn stateless(self, nf: Box<dyn Nf>) -> Self::Out;
    /// A stateful NF the executor drives.
    fn stateful<T: StatefulNf>(self, nf: T) -> Self::Out;
}

/// One registered NF kind.
pub struct NfKind {
    /// Name in chain specs.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// Parameters: (name, description with default).
    pub params: &'static [(&'static str, &'static str)],
}

/// Every NF flowplane knows.
pub static NFS: &[NfKind] = &[
    NfKind {
        name: "forward",
        about: "send every packet to an output port (I/O baseline)",
        params: &[("port", "output port (default 0)")],
    },
    NfKind {
        name: "count",
        about: "count packets and bytes",
        params: &[],
    },
    NfKind {
        name: "lb",
        about: "stateful round-robin load balancer: rewrites the destination, sticky per 5-tuple",
        params: &[("backends", "backend pool size (default 16)"), ("base", "first backend IPv4 (default 10.10.0.1)")],
    },
    NfKind {
        name: "fsc",
        about: "flow statistics counter: packets, bytes, first/last seen per 5-tuple (exportable)",
        params: &[],
    },
    NfKind {
        name: "ratelimit",
        about: "flow rate limiter: token bucket per 5-tuple",
        params: &[("pps", "tokens per second per flow (default 1000)"), ("burst", "bucket depth (default pps)")],
    },
    NfKind {
        name: "acl",
        about: "stateful ACL: ordered rules (proto, v4/v6 prefixes, port ranges), first match wins, verdict cached per flow",
        params: &[
            ("rules", "rule file: 'allow|drop [proto tcp|udp|icmp|any|N] [src CIDR] [dst CIDR] [sport N[-M]] [dport N[-M]]' per line, # comments (default none)"),
            ("rule", "inline rules 'action:proto:src:dst:sport:dport' (trailing fields optional, any = wildcard, IPv6 as [2001:db8::]/32) separated by ';', after the file's (default none)"),
            ("default", "verdict when no rule matches, and for non-IP packets: allow|drop (default allow)"),
        ],
    },
    NfKind {
        name: "synthetic",
        about: "synthetic NF with k dependent indirect memory accesses per packet (FAJITA Fig. 3/17); prefetch hook loads the first",
        params: &[
            ("k", "indirect accesses per packet, 0..=16 (default 1)"),
            ("mem", "bytes of the private pointer-chasing array per instance (default 268435456 = 256 MiB)"),
            ("seed", "seed of the random permutation and flow starts (default 1)"),
        ],
    },
    NfKind {
        name: "hh",
        about: "heavy-hitter monitor: bytes/packets per 5-tuple, reports the top-k flows (exportable)",
        params: &[
            ("k", "flows in the top-k summary, 1..=1024 (default 10)"),
            ("threshold", "bytes above which a flow is flagged heavy (default none)"),
        ],
    },
    NfKind {
        name: "nat",
        about: "source NAT with a port pool per external address, both directions, port release on expiry (pools are per core: run two-way traffic on one core)",
        params: &[
            ("external", "first external IPv4 address (default 203.0.113.1)"),
            ("addrs", "number of consecutive external addresses, 1..256 (default 1)"),
            ("ports", "port range per address and protocol, LO-HI (default 1024-65535)"),
            ("internal", "inside source prefix (default 10.0.0.0/8)"),
            ("timeout", "idle timeout in seconds (default 30)"),
            ("other", "non-TCP/UDP traffic from inside or to an external address: pass|drop (default pass)"),
        ],
    },
    NfKind {
        name: "srcctr",
        about: "source-IP statistics counter: packets, bytes, first/last seen per source IP (exportable)",
        params: &[],
    },
    NfKind {
        name: "policer",
        about: "policer: token bucket per destination IP limiting each server's download rate",
        params: &[
            ("rate", "bytes/s per destination, packets/s with pps=true (default 125M = 1 Gbit/s)"),
            ("burst", "bucket depth in bytes, packets with pps=true (default rate)"),
            ("pps", "count packets instead of bytes (default false)"),
        ],
    },
    NfKind {
        name: "psd",
        about: "port-scan detector: distinct destination ports per source IP over a window (512-bit sketch)",
        params: &[
            ("window", "window in seconds (default 10)"),
            ("ports", "distinct ports in a window that flag a source, 1..1024 (default 20)"),
            ("action", "drop|flag: drop a flagged source's packets or pass and count them (default drop)"),
            ("tcp", "noack|all: TCP packets that count as probes (default noack: no ACK flag)"),
        ],
    },
    NfKind {
        name: "ddos",
        about: "DDoS mitigator: packets per source IP per window, drop the source over the threshold",
        params: &[
            ("window", "window in seconds (default 1)"),
            ("threshold", "packets allowed per source per window (default 10000)"),
        ],
    },
    NfKind {
        name: "fw",
        about: "stateful firewall: TCP connection tracking (handshake, seq/ack windows, FIN/RST teardown), related UDP/ICMP",
        params: &[
            ("allow_new", "who may open connections: inside|any (default inside)"),
            ("inside", "inside prefix, IPv4 or IPv6 (default 10.0.0.0/8)"),
            ("timeout", "idle timeout in seconds (default 300)"),
            ("conns", "connection table capacity per core (default 1048576)"),
        ],
    },
    NfKind {
        name: "portknock",
        about: "port-knocking firewall (SCR App. C): per source IP, the protected TCP port opens after the knock sequence",
        params: &[
            ("knock", "knock sequence of 1..8 TCP ports, P1-P2-... (default 1111-2222-3333)"),
            ("protect", "protected TCP port (default 22)"),
            ("timeout", "idle timeout of a source's state in seconds, 0 = chain default (default 0)"),
        ],
    },
    NfKind {
        name: "keyctr",
        about: "packets and bytes per key of any granularity: source/destination IP, IP pair, GTP-U TEID or a field set (shared between cores)",
        params: &[("key", "src_ip|dst_ip|ip_pair|teid|5tuple, or fields src_ip, dst_ip, sport, dport, proto, vlan, teid joined by '+' (default src_ip)")],
    },
];

/// Looks up an NF kind by name.
pub fn find(name: &str) -> Option<&'static NfKind> {
    NFS.iter().find(|k| k.name == name)
}

/// Builds NF `name` from `params` (unknown NF or parameter: a one-line
/// [`ParamError`]) and hands it to `sink`.
pub fn build_with<S: NfSink>(name: &str, mut params: Params, sink: S) -> Result<S::Out, ParamError> {
    let kind = find(name).ok_or_else(|| {
        let known: Vec<&str> = NFS.iter().map(|k| k.name).collect();
        ParamError(format!("unknown NF '{name}' (known: {})", known.join(", ")))
    })?;
    // Reject unknown parameters before building: some NFs allocate a lot.
    params.check_known(kind.params.iter().map(|(p, _)| *p))?;
    let out = match kind.name {
        "forward" => sink.stateless(Box::new(Forward::from_params(&mut params)?)),
        "count" => sink.stateless(Box::new(Count::from_params(&mut params)?)),
        "lb" => sink.stateful(Lb::from_params(&mut params)?),
        "fsc" => sink.stateful(Fsc::from_params(&mut params)?),
        "ratelimit" => sink.stateful(RateLimit::from_params(&mut params)?),
        "acl" => sink.stateful(Acl::from_params(&mut params)?),
        "synthetic" => sink.stateful(Synthetic::from_params(&mut params)?),
        "hh" => sink.stateful(Hh::from_params(&mut params)?),
        "nat" => sink.stateful(crate::nat::Nat::from_params(&mut params)?),
        "srcctr" => sink.stateful(SrcCtr::from_params(&mut params)?),
        "policer" => sink.stateful(Policer::from_params(&mut params)?),
        "psd" => sink.stateful(Psd::from_params(&mut params)?),
        "ddos" => sink.stateful(Ddos::from_params(&mut params)?),
        "fw" => sink.stateful(crate::fw::Fw::from_params(&mut params)?),
        "portknock" => sink.stateful(crate::portknock::PortKnock::from_params(&mut params)?),
        "keyctr" => sink.stateful(crate::keyctr::KeyCtr::from_params(&mut params)?),
        other => return Err(ParamError(format!("{other}: registered without a constructor"))),
    };
    params.finish()?;
    Ok(out)
}

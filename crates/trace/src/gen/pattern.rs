//! Special traffic patterns mixed into the background flows: port scans and
//! port-knocking sessions (the firewall of SCR, Appendix C / Figure 12).
//!
//! Pattern packets are IPv4/TCP (scans follow `--ipv6`), use address ranges
//! disjoint from the background flows, and are interleaved with them by the
//! scheduler (`pattern_share` of the packets).

use rand::Rng;

use super::flows::{mix64, spread_bits};
use super::frame::{self, Addrs, TcpFields, TCP_ACK, TCP_PSH, TCP_SYN};
use super::sample::{below, GenRng};

/// Port-knocking firewall states (SCR Figure 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnockState {
    /// Initial state; every unexpected port leads back here.
    Closed1,
    /// First knock seen.
    Closed2,
    /// Second knock seen.
    Closed3,
    /// Sequence complete: the source may pass.
    Open,
}

/// The reference transition function of SCR Appendix C: the right port
/// advances, OPEN stays OPEN, anything else returns to CLOSED_1.
pub fn knock_transition(state: KnockState, dport: u16, ports: [u16; 3]) -> KnockState {
    match state {
        KnockState::Closed1 if dport == ports[0] => KnockState::Closed2,
        KnockState::Closed2 if dport == ports[1] => KnockState::Closed3,
        KnockState::Closed3 if dport == ports[2] => KnockState::Open,
        KnockState::Open => KnockState::Open,
        _ => KnockState::Closed1,
    }
}

/// Knock ports used by `--portknock` (SCR's PORT_1..3).
pub const KNOCK_PORTS: [u16; 3] = [1, 2, 3];
/// Service port the knocking sources then try to reach.
pub const KNOCK_SERVICE_PORT: u16 = 22;
/// Protected host (TEST-NET-1).
pub const KNOCK_SERVER: [u8; 4] = [192, 0, 2, 1];
/// Packets each knocking source sends to the service after its knocks.
const KNOCK_DATA_PACKETS: usize = 4;
/// Knocking sessions in progress at once (their packets interleave).
const KNOCK_ACTIVE: usize = 16;

/// One knocking source and whether the reference state machine ends OPEN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnockSession {
    /// Source IPv4 address (unique per session).
    pub src: [u8; 4],
    /// Destination ports the source sends, in order (knocks, then the service port).
    pub ports: [u16; 8],
    /// How many entries of `ports` are used.
    pub len: u8,
    /// Final state after all its packets, per [`knock_transition`].
    pub opens: bool,
}

/// Knock sequences: half are correct, the rest cover the classic mistakes.
const VARIANTS: [&[u16]; 6] = [
    &[1, 2, 3],    // correct
    &[9, 1, 2, 3], // noise, then correct: still opens
    &[1, 3, 2],    // swapped
    &[1, 2, 4],    // wrong last port
    &[1, 2],       // incomplete
    &[1, 1, 2, 3], // repeated first knock resets to CLOSED_1 (Figure 12)
];

#[derive(Debug, Clone, Copy)]
pub(crate) struct Active {
    session: usize,
    next: u8,
}

/// Generates port-scan probes or knocking sessions.
#[derive(Debug)]
pub(crate) enum PatternGen {
    /// `k` scanners, each sweeping the destination ports of one target.
    Scan { k: u64, next_scanner: u64, cursor: Vec<u16>, key: u32, ipv6: bool },
    /// Knocking sessions; `log` records every session started.
    Knock { active: Vec<Active>, log: Vec<KnockSession>, key: u32 },
}

impl PatternGen {
    pub(crate) fn scan(k: u64, seed: u64, ipv6: bool) -> Self {
        PatternGen::Scan { k, next_scanner: 0, cursor: vec![1; k as usize], key: mix64(seed ^ 0x5ca7) as u32, ipv6 }
    }

    pub(crate) fn knock(seed: u64) -> Self {
        PatternGen::Knock {
            active: Vec::with_capacity(KNOCK_ACTIVE),
            log: Vec::new(),
            key: mix64(seed ^ 0x6b0c) as u32,
        }
    }

    pub(crate) fn knock_log(&self) -> &[KnockSession] {
        match self {
            PatternGen::Knock { log, .. } => log,
            PatternGen::Scan { .. } => &[],
        }
    }

    /// Writes the next pattern packet into `buf`.
    pub(crate) fn next(&mut self, rng: &mut GenRng, buf: &mut Vec<u8>, marker: u64) {
        match self {
            PatternGen::Scan { k, next_scanner, cursor, key, ipv6 } => {
                let s = *next_scanner;
                *next_scanner = (s + 1) % *k;
                let port = cursor[s as usize];
                cursor[s as usize] = if port == u16::MAX { 1 } else { port + 1 };
                // Scanners in 198.18.0.0/15, one target each in 203.0.113.0/24.
                let src_bits = 0xc612_0000 | spread_bits(s as u32, *key, 17);
                let dst = [203, 0, 113, (s % 254) as u8 + 1];
                let addrs = if *ipv6 {
                    let mut src6 = [0u8; 16];
                    src6[0] = 0xfd;
                    src6[1] = 0x5c;
                    src6[12..16].copy_from_slice(&src_bits.to_be_bytes());
                    let mut dst6 = [0u8; 16];
                    dst6[0] = 0xfd;
                    dst6[1] = 0x5d;
                    dst6[12..16].copy_from_slice(&dst);
                    Addrs::V6 { src: src6, dst: dst6 }
                } else {
                    Addrs::V4 { src: src_bits.to_be_bytes(), dst }
                };
                let sport = 40_000 + (mix64(s ^ *key as u64) % 20_000) as u16;
                let t = TcpFields { seq: rng.next_u64() as u32, ack: 0, flags: TCP_SYN };
                frame::tcp(buf, &addrs, sport, port, t, 0, marker);
            }
            PatternGen::Knock { active, log, key } => {
                while active.len() < KNOCK_ACTIVE {
                    let v = below(rng, VARIANTS.len() as u64 * 2) as usize;
                    // Half of the sessions use the correct sequence.
                    let seq = if v >= VARIANTS.len() { VARIANTS[0] } else { VARIANTS[v] };
                    let mut ports = [0u16; 8];
                    ports[..seq.len()].copy_from_slice(seq);
                    let len = seq.len() + KNOCK_DATA_PACKETS;
                    ports[seq.len()..len].fill(KNOCK_SERVICE_PORT);
                    let mut st = KnockState::Closed1;
                    for &p in &ports[..len] {
                        st = knock_transition(st, p, KNOCK_PORTS);
                    }
                    // Sources in 100.64.0.0/10, unique per session.
                    let src = (0x6440_0000 | spread_bits(log.len() as u32, *key, 22)).to_be_bytes();
                    log.push(KnockSession { src, ports, len: len as u8, opens: st == KnockState::Open });
                    active.push(Active { session: log.len() - 1, next: 0 });
                }
                let a = below(rng, active.len() as u64) as usize;
                let Active { session, next } = active[a];
                let s = log[session];
                let dport = s.ports[next as usize];
                let addrs = Addrs::V4 { src: s.src, dst: KNOCK_SERVER };
                let sport = 30_000 + (mix64(session as u64) % 30_000) as u16;
                let knock = (next as usize) < s.len as usize - KNOCK_DATA_PACKETS;
                let t = if knock {
                    TcpFields { seq: rng.next_u64() as u32, ack: 0, flags: TCP_SYN }
                } else {
                    TcpFields { seq: 1000 + next as u32 * 64, ack: 1, flags: TCP_ACK | TCP_PSH }
                };
                frame::tcp(buf, &addrs, sport, dport, t, if knock { 0 } else { 64 }, marker);
                if next + 1 >= s.len {
                    active.swap_remove(a);
                } else {
                    active[a].next = next + 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn state_machine_follows_figure_12() {
        let run = |ports: &[u16]| ports.iter().fold(KnockState::Closed1, |s, &p| knock_transition(s, p, KNOCK_PORTS));
        assert_eq!(run(&[1, 2, 3]), KnockState::Open);
        assert_eq!(run(&[1, 2, 3, 80, 7]), KnockState::Open);
        assert_eq!(run(&[1, 3, 2]), KnockState::Closed1);
        assert_eq!(run(&[1, 2]), KnockState::Closed3);
        assert_eq!(run(&[1, 1, 2, 3]), KnockState::Closed1);
        assert_eq!(run(&[9, 1, 2, 3]), KnockState::Open);
    }

    #[test]
    fn knock_sessions_mix_verdicts_and_keep_order() {
        let mut g = PatternGen::knock(1);
        let mut rng = GenRng::seed_from_u64(1);
        let mut buf = Vec::new();
        let mut per_src: std::collections::HashMap<[u8; 4], Vec<u16>> = Default::default();
        for i in 0..5000 {
            g.next(&mut rng, &mut buf, i);
            let src = [buf[26], buf[27], buf[28], buf[29]];
            per_src.entry(src).or_default().push(u16::from_be_bytes([buf[36], buf[37]]));
        }
        let log = g.knock_log();
        assert!(log.iter().any(|s| s.opens) && log.iter().any(|s| !s.opens));
        for s in log {
            if let Some(seen) = per_src.get(&s.src) {
                assert_eq!(&seen[..], &s.ports[..seen.len()], "packets of a source keep their order");
            }
        }
    }

    #[test]
    fn scanners_sweep_ports() {
        let mut g = PatternGen::scan(3, 1, false);
        let mut rng = GenRng::seed_from_u64(1);
        let mut buf = Vec::new();
        let mut ports = Vec::new();
        for i in 0..9 {
            g.next(&mut rng, &mut buf, i);
            ports.push(u16::from_be_bytes([buf[36], buf[37]]));
        }
        assert_eq!(ports, [1, 1, 1, 2, 2, 2, 3, 3, 3]);
    }
}

//! Helpers for testing NFs on crafted packets: frame builders with valid
//! checksums and a [`Harness`] that runs one stateful NF with a plain
//! `HashMap` as its table (the executors are tested separately).

use std::collections::HashMap;
use std::net::Ipv6Addr;

use flowplane_wire::checksum;
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::packet_repr::FrameBuilder;
use flowplane_wire::tcp::TcpFlags;

use crate::pkt::{Pkt, PktMeta};
use crate::stateful::{Action, Granularity, StatefulNf};
use crate::NfContext;

/// An Ethernet/IPv4/UDP frame with valid checksums and 18 bytes of payload (64-byte frame).
pub fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    ipv4_frame(src, dst, 17, &{
        let mut u = vec![0u8; 8 + 18];
        u[0..2].copy_from_slice(&sport.to_be_bytes());
        u[2..4].copy_from_slice(&dport.to_be_bytes());
        u[4..6].copy_from_slice(&26u16.to_be_bytes());
        u
    })
}

/// An Ethernet/IPv4/TCP frame with the given flags, seq and ack, valid checksums.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    ipv4_frame(src, dst, 6, &{
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&65535u16.to_be_bytes());
        t
    })
}

/// Ethernet + IPv4 (no options) around an L4 segment whose checksum is filled in.
pub fn ipv4_frame(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = proto;
    f[26..30].copy_from_slice(&src);
    f[30..34].copy_from_slice(&dst);
    let c = checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let mut seg = l4.to_vec();
    let at = match proto {
        6 => Some(16),
        17 => Some(6),
        _ => None,
    };
    if let Some(at) = at {
        seg[at..at + 2].copy_from_slice(&[0, 0]);
        let ph = checksum::pseudo_header_v4(src, dst, proto, seg.len() as u16);
        let mut c = checksum::finish(checksum::combine(ph, checksum::sum(&seg)));
        if proto == 17 && c == 0 {
            c = 0xffff;
        }
        seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&seg);
    f
}

/// An Ethernet/IPv4/UDP(2152)/GTP-U G-PDU frame carrying IP packet `inner`
/// (without an Ethernet header), with an UL PDU Session Container when
/// `qfi` is set; outer UDP checksum 0 (none).
pub fn gtpu4(src: [u8; 4], dst: [u8; 4], teid: u32, qfi: Option<u8>, inner: &[u8]) -> Vec<u8> {
    use flowplane_wire::gtpu::{GtpuPacket, GtpuRepr, PduSessionInfo, PduType};
    let psc = qfi.map(|qfi| PduSessionInfo { pdu_type: PduType::Uplink, qfi, ppp: false, rqi: false, ppi: None });
    let g = GtpuRepr::g_pdu(teid, psc, inner.len());
    let mut u = vec![0u8; 8 + g.buffer_len()];
    u[0..2].copy_from_slice(&2152u16.to_be_bytes());
    u[2..4].copy_from_slice(&2152u16.to_be_bytes());
    let ulen = (u.len() + inner.len()) as u16;
    u[4..6].copy_from_slice(&ulen.to_be_bytes());
    g.emit(&mut GtpuPacket::new_unchecked(&mut u[8..])).expect("GTP-U header fits");
    u.extend_from_slice(inner);
    let mut f = ipv4_frame(src, dst, 17, &u);
    // ipv4_frame fills in the UDP checksum; GTP-U senders usually send none.
    f[40..42].copy_from_slice(&[0, 0]);
    f
}

/// Asserts the IPv4 header checksum and the TCP/UDP checksum of `f` verify.
pub fn assert_ipv4_checksums(f: &[u8]) {
    assert_eq!(checksum::sum(&f[14..34]), 0xffff, "IPv4 header checksum");
    let proto = f[23];
    let seg = &f[34..];
    if proto == 6 || (proto == 17 && u16::from_be_bytes([seg[6], seg[7]]) != 0) {
        let src = [f[26], f[27], f[28], f[29]];
        let dst = [f[30], f[31], f[32], f[33]];
        let ph = checksum::pseudo_header_v4(src, dst, proto, seg.len() as u16);
        assert_eq!(checksum::combine(ph, checksum::sum(seg)), 0xffff, "L4 checksum");
    }
}

/// An Ethernet/IPv6/UDP frame with a valid checksum and 18 bytes of payload.
pub fn udp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> Vec<u8> {
    emit(FrameBuilder::udp_v6(src, dst, sport, dport))
}

/// An Ethernet/IPv6/TCP frame with the given flags (seq 1, ack 0), valid checksum.
pub fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    emit(FrameBuilder::tcp_v6(src, dst, sport, dport, TcpFlags(flags)))
}

fn emit(b: FrameBuilder) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let n = b.emit(&mut buf, &[0u8; 18]).expect("frame fits");
    buf.truncate(n);
    buf
}

/// Asserts the TCP/UDP/ICMPv6 checksum of an Ethernet/IPv6 frame without extension headers verifies.
pub fn assert_ipv6_checksums(f: &[u8]) {
    let nh = f[20];
    let seg = &f[54..];
    let addr = |at: usize| -> [u8; 16] { f[at..at + 16].try_into().expect("16 bytes") };
    let ph = checksum::pseudo_header_v6(addr(22), addr(38), nh, seg.len() as u32);
    assert_eq!(checksum::combine(ph, checksum::sum(seg)), 0xffff, "L4 checksum over the IPv6 pseudo-header");
}

/// Runs one stateful NF packet by packet with a `HashMap` table keyed by
/// the NF's granularity (so coarse-key NFs are tested with their real sharing).
pub struct Harness<N: StatefulNf> {
    /// The NF under test.
    pub nf: N,
    /// Its states by 5-tuple (projected on the NF's granularity).
    pub states: HashMap<FiveTuple, N::State>,
    /// States of granularities with no 5-tuple projection (TEID, field sets), by exact key.
    pub keyed_states: HashMap<u128, N::State>,
    /// The clock handed to the NF (set it to test time-dependent NFs).
    pub now_ns: u64,
}

impl<N: StatefulNf> Harness<N> {
    /// A harness around `nf` at time 0.
    pub fn new(nf: N) -> Self {
        Harness { nf, states: HashMap::new(), keyed_states: HashMap::new(), now_ns: 0 }
    }

    /// Processes one frame; returns the (possibly rewritten) frame and the action.
    pub fn run(&mut self, frame: &[u8]) -> (Vec<u8>, Action) {
        let mut data = frame.to_vec();
        let meta = PktMeta::parse(&data);
        let ctx = NfContext { now_tsc: 0, now_ns: self.now_ns };
        if !meta.valid {
            let a = self.nf.on_unparsed();
            return (data, a);
        }
        if let g @ (Granularity::Teid | Granularity::Custom(_)) = self.nf.granularity() {
            let Some(k) = g.key(&meta) else { return (data, self.nf.on_unparsed()) };
            if !self.keyed_states.contains_key(&k) {
                let s = self.nf.init(&Pkt::new(&mut data, &meta), &ctx);
                self.keyed_states.insert(k, s);
            }
            let st = self.keyed_states.get_mut(&k).expect("inserted above");
            let a = self.nf.process(&mut Pkt::new(&mut data, &meta), st, &ctx);
            return (data, a);
        }
        let key = self.nf.granularity().project(&meta.tuple);
        if !self.states.contains_key(&key) {
            let s = self.nf.init(&Pkt::new(&mut data, &meta), &ctx);
            self.states.insert(key, s);
        }
        let st = self.states.get_mut(&key).expect("inserted above");
        let a = self.nf.process(&mut Pkt::new(&mut data, &meta), st, &ctx);
        if matches!(a, Action::EndFlow | Action::DropEndFlow | Action::Refuse) {
            if let Some(s) = self.states.remove(&key) {
                self.nf.release(&key, &s);
            }
        }
        (data, a)
    }

    /// What `--table-full evict` does to a frame's flow: its state goes to the NF's eviction hook and is
    /// removed (false if the flow had no state).
    pub fn evict(&mut self, frame: &[u8]) -> bool {
        let Some(key) = self.key_of(frame) else { return false };
        let Some(s) = self.states.remove(&key) else { return false };
        self.nf.evict(&key, &s);
        true
    }

    /// The state key of a frame (its 5-tuple projected on the NF's granularity).
    pub fn key_of(&self, frame: &[u8]) -> Option<FiveTuple> {
        let m = PktMeta::parse(frame);
        m.valid.then(|| self.nf.granularity().project(&m.tuple))
    }

    /// The state of a frame's flow.
    pub fn state_of(&self, frame: &[u8]) -> Option<N::State> {
        if let g @ (Granularity::Teid | Granularity::Custom(_)) = self.nf.granularity() {
            let m = PktMeta::parse(frame);
            return self.keyed_states.get(&g.key(&m)?).copied();
        }
        self.states.get(&self.key_of(frame)?).copied()
    }
}

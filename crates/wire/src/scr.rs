//! State-compute replication (SCR, Appendix C of the SCR paper): the
//! fixed-size history record a sequencer extracts from every packet and
//! piggybacks, with the records of the packets before it, on each packet it
//! sprays to a core; and the field sets NFs declare for their state
//! transitions (what a record must carry for them, and its size on a wire).
//!
//! One record layout serves every NF (32 bytes, two records per cache
//! line): the in-memory copy is fixed, the declared field set gives the
//! bytes a hardware sequencer would piggyback. IPv6 addresses are folded to
//! 32 bits (CRC32C of the address): replicas stay identical (every core keys
//! by the record), but two IPv6 addresses with one fold share SCR state.

use crate::frame::PktMeta;
use crate::hash::crc32c_u64;
use crate::ipv4::IpProtocol;

/// Bits of the record's kind byte.
pub mod kind {
    /// The packet had a usable flow key.
    pub const VALID: u8 = 1;
    /// IPv6 (addresses folded to 32 bits).
    pub const V6: u8 = 2;
    /// Ports present (not a non-first fragment, a transport header seen).
    pub const PORTS: u8 = 4;
    /// A TCP header was present (flags, seq, ack meaningful).
    pub const TCP: u8 = 8;
}

/// The header fields a state transition reads (an NF's declaration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScrFields(pub u16);

impl ScrFields {
    /// Source address (4 B).
    pub const SRC_IP: ScrFields = ScrFields(1);
    /// Destination address (4 B).
    pub const DST_IP: ScrFields = ScrFields(2);
    /// Both ports (4 B).
    pub const PORTS: ScrFields = ScrFields(4);
    /// IP protocol (1 B).
    pub const PROTO: ScrFields = ScrFields(8);
    /// Frame length (2 B).
    pub const LEN: ScrFields = ScrFields(16);
    /// TCP flags (1 B).
    pub const TCP_FLAGS: ScrFields = ScrFields(32);
    /// TCP sequence and acknowledgement numbers (8 B).
    pub const TCP_SEQ_ACK: ScrFields = ScrFields(64);
    /// The sequencer's timestamp (4 B: µs resolution would do on a wire; 8 here).
    pub const TIME: ScrFields = ScrFields(128);
    /// The 5-tuple (13 B).
    pub const FIVE_TUPLE: ScrFields = ScrFields(1 | 2 | 4 | 8);

    /// Union.
    pub const fn with(self, o: ScrFields) -> ScrFields {
        ScrFields(self.0 | o.0)
    }

    /// Bytes a sequencer piggybacks per history entry for these fields (a
    /// kind byte always: the control dependency, IPv4/IPv6, parsed or not).
    pub fn wire_bytes(self) -> usize {
        const SIZES: [(u16, usize); 8] = [(1, 4), (2, 4), (4, 4), (8, 1), (16, 2), (32, 1), (64, 8), (128, 8)];
        1 + SIZES.iter().filter(|(b, _)| self.0 & b != 0).map(|(_, s)| s).sum::<usize>()
    }

    /// Field names, for reports.
    pub fn names(self) -> Vec<&'static str> {
        const N: [(u16, &str); 8] = [
            (1, "src_ip"),
            (2, "dst_ip"),
            (4, "ports"),
            (8, "proto"),
            (16, "len"),
            (32, "tcp_flags"),
            (64, "tcp_seq_ack"),
            (128, "time"),
        ];
        N.iter().filter(|(b, _)| self.0 & b != 0).map(|(_, n)| *n).collect()
    }
}

/// One packet's history entry: what a state transition may read.
/// 32 bytes, no padding: four words ([`ScrRecord::to_words`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct ScrRecord {
    /// The sequencer's timestamp in ns (low 56 bits) and the kind byte (high 8).
    ts_kind: u64,
    /// Source address (IPv4; IPv6 folded).
    pub src: u32,
    /// Destination address (IPv4; IPv6 folded).
    pub dst: u32,
    /// Source port (0 without ports).
    pub sport: u16,
    /// Destination port (0 without ports).
    pub dport: u16,
    /// TCP sequence number.
    pub seq: u32,
    /// TCP acknowledgement number.
    pub ack: u32,
    /// Frame length.
    pub len: u16,
    /// IP protocol.
    pub proto: u8,
    /// TCP flags.
    pub flags: u8,
}

const TS_MASK: u64 = (1 << 56) - 1;

fn fold6(a: std::net::Ipv6Addr) -> u32 {
    let v = u128::from(a);
    crc32c_u64(crc32c_u64(0, v as u64), (v >> 64) as u64)
}

/// The block a record's folded IPv6 address is shown in: `100::/64`
/// (RFC 6666, discard-only: no flow's real address), the fold in the low 32
/// bits. So a record's tuple of an IPv6 flow is still an IPv6 tuple, told
/// apart from the flow's real tuple (see [`recorded`]).
const FOLDED_BLOCK: u128 = 0x0100 << 112;

/// The address a record shows for an IPv6 address of fold `fold`.
pub fn folded_addr(fold: u32) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(FOLDED_BLOCK | u128::from(fold))
}

/// `a` is a record's folded address ([`folded_addr`]).
pub fn is_folded_addr(a: std::net::Ipv6Addr) -> bool {
    u128::from(a) >> 32 == FOLDED_BLOCK >> 32
}

/// Address `a` as a record shows it: an IPv6 address folded ([`folded_addr`]), a folded one and IPv4 as they are.
pub fn recorded_addr(a: std::net::IpAddr) -> std::net::IpAddr {
    match a {
        std::net::IpAddr::V6(x) if !is_folded_addr(x) => folded_addr(fold6(x)).into(),
        other => other,
    }
}

/// Tuple `t` as a record of its packets shows it ([`ScrRecord::tuple`]):
/// an IPv6 flow's addresses folded, an IPv4 flow (or a record's tuple) as it is.
pub fn recorded(t: &crate::flow::FiveTuple) -> crate::flow::FiveTuple {
    match t {
        crate::flow::FiveTuple::V6(x) if !is_folded(t) => crate::flow::FiveTupleV6::new(
            folded_addr(fold6(x.src())),
            folded_addr(fold6(x.dst())),
            x.src_port(),
            x.dst_port(),
            x.proto(),
        )
        .into(),
        _ => *t,
    }
}

/// `t` is a record's tuple of an IPv6 flow (both addresses folded): the flow's real addresses are not known.
pub fn is_folded(t: &crate::flow::FiveTuple) -> bool {
    match t {
        crate::flow::FiveTuple::V6(x) => is_folded_addr(x.src()) && is_folded_addr(x.dst()),
        crate::flow::FiveTuple::V4(_) => false,
    }
}

impl ScrRecord {
    /// Extracts the record of `frame` (its parsed facts `m`), time unset.
    pub fn from_frame(frame: &[u8], m: &PktMeta) -> ScrRecord {
        let mut r = ScrRecord { len: frame.len().min(u16::MAX as usize) as u16, ..Default::default() };
        if !m.valid {
            return r;
        }
        let mut k = kind::VALID;
        match m.tuple {
            crate::flow::FiveTuple::V4(t) => {
                r.src = u32::from(t.src());
                r.dst = u32::from(t.dst());
            }
            crate::flow::FiveTuple::V6(t) => {
                k |= kind::V6;
                r.src = fold6(t.src());
                r.dst = fold6(t.dst());
            }
        }
        r.proto = m.tuple.proto();
        if m.l4 != 0 {
            k |= kind::PORTS;
            r.sport = m.tuple.src_port();
            r.dport = m.tuple.dst_port();
        }
        if m.proto == IpProtocol::TCP && m.l4 != 0 {
            let l4 = m.l4 as usize;
            if let Some(t) = frame.get(l4..l4 + 14) {
                k |= kind::TCP;
                r.seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
                r.ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
                r.flags = t[13];
            }
        }
        r.ts_kind = u64::from(k) << 56;
        r
    }

    /// Kind bits ([`kind`]).
    #[inline(always)]
    pub fn kind(&self) -> u8 {
        (self.ts_kind >> 56) as u8
    }

    /// The packet had a flow key.
    #[inline(always)]
    pub fn valid(&self) -> bool {
        self.kind() & kind::VALID != 0
    }

    /// The sequencer's timestamp (ns, 56 bits: 2.2 years).
    #[inline(always)]
    pub fn ts_ns(&self) -> u64 {
        self.ts_kind & TS_MASK
    }

    /// Sets the timestamp, clamped at the latest a record carries (56 bits
    /// of ns, 2.2 years), not wrapped: a sequencer's stamps never go back.
    #[inline(always)]
    pub fn set_ts_ns(&mut self, ts: u64) {
        self.ts_kind = (self.ts_kind & !TS_MASK) | ts.min(TS_MASK);
    }

    /// Destination port, if the packet had ports.
    #[inline(always)]
    pub fn dst_port(&self) -> Option<u16> {
        (self.kind() & kind::PORTS != 0).then_some(self.dport)
    }

    /// TCP flags, if a TCP header was present.
    #[inline(always)]
    pub fn tcp_flags(&self) -> Option<u8> {
        (self.kind() & kind::TCP != 0).then_some(self.flags)
    }

    /// The 5-tuple: an IPv6 packet's with its addresses folded, shown in
    /// `100::/64` ([`folded_addr`]; [`recorded`] of the packet's own tuple).
    pub fn tuple(&self) -> crate::flow::FiveTuple {
        if self.kind() & kind::V6 != 0 {
            let (s, d) = (folded_addr(self.src), folded_addr(self.dst));
            crate::flow::FiveTupleV6::new(s, d, self.sport, self.dport, self.proto).into()
        } else {
            crate::flow::FiveTupleV4::new(self.src.into(), self.dst.into(), self.sport, self.dport, self.proto).into()
        }
    }

    /// Exact 5-tuple key (104 bits) with the kind's family bit.
    #[inline(always)]
    pub fn five_tuple_key(&self) -> u128 {
        (u128::from(self.src) << 96)
            | (u128::from(self.dst) << 64)
            | (u128::from(self.sport) << 48)
            | (u128::from(self.dport) << 32)
            | (u128::from(self.proto) << 24)
            | u128::from(self.kind() & kind::V6)
    }

    /// The 5-tuple key of the connection, whichever direction (lower endpoint first).
    #[inline(always)]
    pub fn connection_key(&self) -> u128 {
        let a = (u64::from(self.src) << 16) | u64::from(self.sport);
        let b = (u64::from(self.dst) << 16) | u64::from(self.dport);
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        (u128::from(lo) << 80)
            | (u128::from(hi) << 32)
            | (u128::from(self.proto) << 24)
            | u128::from(self.kind() & kind::V6)
    }

    /// The record as four words (the log's lock-free copy; masked compares
    /// of a record): its memory, `ts_kind` first (on a little-endian machine
    /// the kind is word 0's top byte, `src` word 1's low half, and so on).
    /// One 32-byte load, where building the words from the fields took a
    /// load and a shift per field.
    #[inline(always)]
    pub fn to_words(&self) -> [u64; 4] {
        bytemuck::cast(*self)
    }

    /// The inverse of [`ScrRecord::to_words`].
    #[inline(always)]
    pub fn from_words(w: [u64; 4]) -> ScrRecord {
        bytemuck::cast(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_is_32_bytes_and_round_trips() {
        assert_eq!(std::mem::size_of::<ScrRecord>(), 32);
        let mut r =
            ScrRecord { src: 1, dst: 2, sport: 3, dport: 4, seq: 5, ack: 6, len: 7, proto: 6, flags: 0x12, ts_kind: 0 };
        r.ts_kind = u64::from(kind::VALID | kind::TCP | kind::PORTS) << 56;
        r.set_ts_ns(123_456_789);
        assert_eq!(ScrRecord::from_words(r.to_words()), r);
        // The documented word layout (little-endian): what masks over the words are built on.
        #[cfg(target_endian = "little")]
        assert_eq!(r.to_words(), [r.ts_kind, 1 | 2 << 32, 3 | 4 << 16 | 5 << 32, 6 | 7 << 32 | 6 << 48 | 0x12 << 56,]);
        assert_eq!(r.to_words()[0] >> 56, u64::from(r.kind()));
        assert_eq!(r.ts_ns(), 123_456_789);
        assert_eq!(r.tcp_flags(), Some(0x12));
        assert_eq!(r.dst_port(), Some(4));
    }

    /// A record's tuple of an IPv6 flow is the flow's own tuple as `recorded` shows it (folded addresses in
    /// `100::/64`, told apart from real ones); an IPv4 flow's is its own.
    #[test]
    fn a_records_tuple_is_the_recorded_form_of_the_flows() {
        use crate::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};
        let r = ScrRecord { src: 0xdead_beef, dst: 7, sport: 1, dport: 2, proto: 17, ts_kind: 0, ..Default::default() };
        let v6 = ScrRecord { ts_kind: u64::from(kind::VALID | kind::V6 | kind::PORTS) << 56, ..r };
        assert_eq!(r.tuple(), FiveTuple::from(FiveTupleV4::new(0xdead_beef.into(), 7.into(), 1, 2, 17)));
        assert!(!is_folded(&r.tuple()) && is_folded(&v6.tuple()));
        assert_eq!(v6.tuple().src_ip().to_string(), "100::dead:beef");
        let real: FiveTuple =
            FiveTupleV6::new("2001:db8::1".parse().unwrap(), "fd00::2".parse().unwrap(), 1, 2, 17).into();
        assert!(!is_folded(&real));
        let folded = recorded(&real);
        assert!(is_folded(&folded) && recorded(&folded) == folded);
        let (s, d) = ("2001:db8::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let rec = ScrRecord { src: fold6(s), dst: fold6(d), ..v6 };
        assert_eq!(rec.tuple(), folded);
        assert_eq!(recorded_addr(std::net::IpAddr::V6(s)), std::net::IpAddr::V6(folded_addr(fold6(s))));
    }

    #[test]
    fn field_sizes() {
        assert_eq!(ScrFields::SRC_IP.with(ScrFields::TIME).wire_bytes(), 13);
        assert_eq!(ScrFields::FIVE_TUPLE.wire_bytes(), 14);
    }

    #[test]
    fn connection_key_is_symmetric() {
        let a = ScrRecord { src: 10, dst: 20, sport: 1000, dport: 80, proto: 6, ..Default::default() };
        let b = ScrRecord { src: 20, dst: 10, sport: 80, dport: 1000, proto: 6, ..Default::default() };
        assert_eq!(a.connection_key(), b.connection_key());
        assert_ne!(a.five_tuple_key(), b.five_tuple_key());
    }
}

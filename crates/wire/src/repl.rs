//! The state replication protocol between flowplane instances
//! (`flowplane run --replicate`, `flowplane_engine::repl`): one UDP
//! datagram carries a header and any number of records (batched updates).
//!
//! Every field is big-endian (network order). Version 1.
//!
//! **Header** ([`HEADER_LEN`] = 28 bytes):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 2 | magic | `0x4650` ("FP") |
//! | 2 | 1 | version | 1 ([`VERSION`]); a datagram of another version is refused whole |
//! | 3 | 1 | kind | 1 updates ([`Kind::Updates`]), 2 resync request ([`Kind::ResyncRequest`]) |
//! | 4 | 4 | session | the sender's session: random per process start (a new one = the peer restarted) |
//! | 8 | 8 | seq | updates: the datagram's number in its session, from 1, +1 per datagram (heartbeats included); a request: the last number the requester received |
//! | 16 | 8 | sent_ns | the sender's wall clock when the datagram left (ns since the Unix epoch): the receiver's lag is its own clock minus this |
//! | 24 | 2 | count | records that follow |
//! | 26 | 2 | flags | bit 0: the records are part of a bulk resync; other bits 0 |
//!
//! An updates datagram with no records is a heartbeat (sent every second while
//! nothing else is): a receiver learns the sequence number, so a lost tail is
//! noticed too.
//!
//! **Record** (after the header, `count` times, no padding between):
//!
//! | size | field | meaning |
//! |---|---|---|
//! | 1 | op | 1 upsert (create or replace the entry), 2 delete |
//! | 1 | stage | the NF's index among the chain's stateful NFs (both instances run the same chain) |
//! | 1 | core | the sender's worker core (a receiver with as many cores imports into the same one) |
//! | 1 | family | 4 or 6 |
//! | 1 | proto | IP protocol of the key |
//! | 1 | key flags | the flow key's flag byte (`FiveTuple::flags`) |
//! | 2 | sport | |
//! | 2 | dport | |
//! | 4 or 16 | src | address |
//! | 4 or 16 | dst | address |
//! | 1 | len | bytes of state that follow (at most [`MAX_STATE`]; 0 for a delete) |
//! | len | state | the NF's per-flow state as it holds it (its `Pod` bytes, native order: both instances run the same build on the same architecture) |
//!
//! An IPv4 upsert of a 16-byte state (`nat`) is 35 bytes: a datagram of
//! [`MAX_DATAGRAM`] bytes holds 39 of them. A truncated record or an unknown op, family or version
//! ends decoding with an error; the records before it are returned (the
//! receiver counts the datagram as malformed).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};

/// `0x4650`: "FP".
pub const MAGIC: u16 = 0x4650;
/// The protocol's version.
pub const VERSION: u8 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 28;
/// Largest datagram written (fits a 1500-byte MTU with IPv6 and UDP headers).
pub const MAX_DATAGRAM: usize = 1400;
/// Largest per-flow state a record carries.
pub const MAX_STATE: usize = 64;
/// Header flag: the records belong to a bulk resync.
pub const FLAG_RESYNC: u16 = 1;

/// What a datagram is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Records (or none: a heartbeat).
    Updates = 1,
    /// "Send me everything": a receiver that restarted or saw a gap.
    ResyncRequest = 2,
}

/// A datagram's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What it is.
    pub kind: Kind,
    /// The sender's session.
    pub session: u32,
    /// Sequence number (see the module doc).
    pub seq: u64,
    /// The sender's wall clock, ns since the epoch.
    pub sent_ns: u64,
    /// Records that follow.
    pub count: u16,
    /// [`FLAG_RESYNC`] or 0.
    pub flags: u16,
}

/// What a record does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create or replace the flow's entry with this state.
    Upsert = 1,
    /// The flow's state is gone.
    Delete = 2,
}

/// One replicated entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Upsert or delete.
    pub op: Op,
    /// The NF's index among the chain's stateful NFs.
    pub stage: u8,
    /// The sender's worker core.
    pub core: u8,
    /// The flow key.
    pub key: FiveTuple,
    /// Bytes of `state` used.
    pub len: u8,
    /// The state's bytes (the first `len`).
    pub state: [u8; MAX_STATE],
}

impl Record {
    /// An upsert of `state` (at most [`MAX_STATE`] bytes: longer is cut, callers check the size once).
    pub fn upsert(stage: u8, core: u8, key: FiveTuple, state: &[u8]) -> Self {
        let mut s = [0; MAX_STATE];
        let n = state.len().min(MAX_STATE);
        s[..n].copy_from_slice(&state[..n]);
        Record { op: Op::Upsert, stage, core, key, len: n as u8, state: s }
    }

    /// A delete.
    pub fn delete(stage: u8, core: u8, key: FiveTuple) -> Self {
        Record { op: Op::Delete, stage, core, key, len: 0, state: [0; MAX_STATE] }
    }

    /// The state's bytes.
    pub fn state(&self) -> &[u8] {
        &self.state[..usize::from(self.len)]
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        let addrs = if matches!(self.key, FiveTuple::V4(_)) { 8 } else { 32 };
        10 + addrs + 1 + usize::from(self.len)
    }

    /// Appends the record.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.op as u8, self.stage, self.core]);
        match &self.key {
            FiveTuple::V4(k) => {
                out.extend_from_slice(&[4, k.proto(), k.flags()]);
                out.extend_from_slice(&k.src_port().to_be_bytes());
                out.extend_from_slice(&k.dst_port().to_be_bytes());
                out.extend_from_slice(&k.src().octets());
                out.extend_from_slice(&k.dst().octets());
            }
            FiveTuple::V6(k) => {
                out.extend_from_slice(&[6, k.proto(), k.flags()]);
                out.extend_from_slice(&k.src_port().to_be_bytes());
                out.extend_from_slice(&k.dst_port().to_be_bytes());
                out.extend_from_slice(&k.src().octets());
                out.extend_from_slice(&k.dst().octets());
            }
        }
        out.push(self.len);
        out.extend_from_slice(self.state());
    }
}

impl Header {
    /// Appends the header.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.extend_from_slice(&[VERSION, self.kind as u8]);
        out.extend_from_slice(&self.session.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.sent_ns.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
    }
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the header, or a record cut short.
    Truncated,
    /// Not [`MAGIC`].
    Magic,
    /// Another version.
    Version(u8),
    /// Unknown kind.
    Kind(u8),
    /// Unknown op, family or a state longer than [`MAX_STATE`].
    Record,
    /// Bytes after the `count` records.
    Trailing,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated"),
            DecodeError::Magic => write!(f, "bad magic"),
            DecodeError::Version(v) => write!(f, "version {v} (this build speaks {VERSION})"),
            DecodeError::Kind(k) => write!(f, "unknown kind {k}"),
            DecodeError::Record => write!(f, "malformed record"),
            DecodeError::Trailing => write!(f, "bytes after the last record"),
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a datagram's header.
pub fn decode_header(b: &[u8]) -> Result<Header, DecodeError> {
    if b.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    let t = DecodeError::Truncated;
    if be16(b, 0).ok_or(t)? != MAGIC {
        return Err(DecodeError::Magic);
    }
    if b[2] != VERSION {
        return Err(DecodeError::Version(b[2]));
    }
    let kind = match b[3] {
        1 => Kind::Updates,
        2 => Kind::ResyncRequest,
        k => return Err(DecodeError::Kind(k)),
    };
    Ok(Header {
        kind,
        session: be32(b, 4).ok_or(t)?,
        seq: be64(b, 8).ok_or(t)?,
        sent_ns: be64(b, 16).ok_or(t)?,
        count: be16(b, 24).ok_or(t)?,
        flags: be16(b, 26).ok_or(t)?,
    })
}

/// Reads one record at `at`: the record and where the next starts.
pub fn decode_record(b: &[u8], at: usize) -> Result<(Record, usize), DecodeError> {
    let t = DecodeError::Truncated;
    let head = b.get(at..at + 10).ok_or(t)?;
    let op = match head[0] {
        1 => Op::Upsert,
        2 => Op::Delete,
        _ => return Err(DecodeError::Record),
    };
    let (stage, core, family, proto, flags) = (head[1], head[2], head[3], head[4], head[5]);
    let sport = u16::from_be_bytes([head[6], head[7]]);
    let dport = u16::from_be_bytes([head[8], head[9]]);
    let mut p = at + 10;
    let key = match family {
        4 => {
            let a: [u8; 8] = b.get(p..p + 8).ok_or(t)?.try_into().map_err(|_| t)?;
            p += 8;
            let (s, d) = (Ipv4Addr::new(a[0], a[1], a[2], a[3]), Ipv4Addr::new(a[4], a[5], a[6], a[7]));
            FiveTuple::V4(FiveTupleV4::new(s, d, sport, dport, proto).with_flags(flags))
        }
        6 => {
            let s: [u8; 16] = b.get(p..p + 16).ok_or(t)?.try_into().map_err(|_| t)?;
            let d: [u8; 16] = b.get(p + 16..p + 32).ok_or(t)?.try_into().map_err(|_| t)?;
            p += 32;
            FiveTuple::V6(FiveTupleV6::new(Ipv6Addr::from(s), Ipv6Addr::from(d), sport, dport, proto).with_flags(flags))
        }
        _ => return Err(DecodeError::Record),
    };
    let len = usize::from(*b.get(p).ok_or(t)?);
    p += 1;
    if len > MAX_STATE {
        return Err(DecodeError::Record);
    }
    let state = b.get(p..p + len).ok_or(t)?;
    let mut s = [0; MAX_STATE];
    s[..len].copy_from_slice(state);
    Ok((Record { op, stage, core, key, len: len as u8, state: s }, p + len))
}

/// Reads a whole datagram: its header and records (into `out`, cleared first). On a bad record the ones
/// before it stay in `out`.
pub fn decode(b: &[u8], out: &mut Vec<Record>) -> Result<Header, DecodeError> {
    out.clear();
    let h = decode_header(b)?;
    let mut at = HEADER_LEN;
    for _ in 0..h.count {
        let (r, next) = decode_record(b, at)?;
        out.push(r);
        at = next;
    }
    if at != b.len() {
        return Err(DecodeError::Trailing);
    }
    Ok(h)
}

/// Writes a datagram: the header (its `count` set to the records written) and as many of `recs` as fit
/// in `max` bytes (at least one if any). Returns how many records it took.
pub fn encode(h: &Header, recs: &[Record], max: usize, out: &mut Vec<u8>) -> usize {
    out.clear();
    let mut len = HEADER_LEN;
    let mut n = 0;
    for r in recs.iter().take(usize::from(u16::MAX)) {
        let l = r.wire_len();
        if n > 0 && len + l > max {
            break;
        }
        len += l;
        n += 1;
    }
    Header { count: n as u16, ..*h }.emit(out);
    for r in &recs[..n] {
        r.emit(out);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = FiveTuple> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u16>(), any::<u16>(), any::<u8>(), any::<u8>()).prop_map(
                |(s, d, sp, dp, p, f)| FiveTuple::V4(FiveTupleV4::new(s.into(), d.into(), sp, dp, p).with_flags(f))
            ),
            (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u16>(), any::<u16>(), any::<u8>(), any::<u8>()).prop_map(
                |(s, d, sp, dp, p, f)| FiveTuple::V6(FiveTupleV6::new(s.into(), d.into(), sp, dp, p).with_flags(f))
            ),
        ]
    }

    fn record() -> impl Strategy<Value = Record> {
        (any::<bool>(), any::<u8>(), any::<u8>(), key(), proptest::collection::vec(any::<u8>(), 0..=MAX_STATE))
            .prop_map(
                |(up, stage, core, key, st)| {
                    if up {
                        Record::upsert(stage, core, key, &st)
                    } else {
                        Record::delete(stage, core, key)
                    }
                },
            )
    }

    proptest! {
        /// Records split over datagrams of at most MAX_DATAGRAM bytes decode back to the same records in order,
        /// with the header's fields.
        #[test]
        fn datagrams_round_trip(recs in proptest::collection::vec(record(), 0..200), session: u32, seq: u64,
                                sent: u64, resync: bool) {
            let mut back = Vec::new();
            let mut buf = Vec::new();
            let mut got = Vec::new();
            let mut at = 0;
            let mut s = seq;
            let flags = if resync { FLAG_RESYNC } else { 0 };
            loop {
                let h = Header { kind: Kind::Updates, session, seq: s, sent_ns: sent, count: 0, flags };
                let n = encode(&h, &recs[at..], MAX_DATAGRAM, &mut buf);
                prop_assert!(buf.len() <= MAX_DATAGRAM);
                let d = decode(&buf, &mut got).unwrap();
                prop_assert_eq!(d, Header { count: n as u16, ..h });
                back.extend_from_slice(&got);
                at += n;
                s = s.wrapping_add(1);
                if at == recs.len() {
                    break;
                }
                prop_assert!(n > 0);
            }
            prop_assert_eq!(back, recs);
        }

        /// Any bytes: an error or records, never a panic; a cut datagram is refused.
        #[test]
        fn bad_bytes_are_errors(b in proptest::collection::vec(any::<u8>(), 0..300), cut in 1usize..40) {
            let mut out = Vec::new();
            let _ = decode(&b, &mut out);
            let r = Record::upsert(0, 0, FiveTuple::new([10, 0, 0, 1].into(), [1, 1, 1, 1].into(), 1, 2, 6).unwrap(), &[7; 16]);
            let mut buf = Vec::new();
            encode(&Header { kind: Kind::Updates, session: 1, seq: 1, sent_ns: 0, count: 0, flags: 0 }, &[r], MAX_DATAGRAM, &mut buf);
            let cut = cut.min(buf.len() - 1);
            prop_assert!(decode(&buf[..buf.len() - cut], &mut out).is_err());
        }
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let mut b = Vec::new();
        Header { kind: Kind::ResyncRequest, session: 0x0102_0304, seq: 5, sent_ns: 6, count: 0, flags: 0 }.emit(&mut b);
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(&b[..8], &[0x46, 0x50, 1, 2, 1, 2, 3, 4]);
        assert_eq!(b[15], 5);
        assert_eq!(b[23], 6);
        b[2] = 2;
        assert_eq!(decode_header(&b), Err(DecodeError::Version(2)));
        let r = Record::upsert(
            1,
            2,
            FiveTuple::new([10, 0, 0, 1].into(), [192, 0, 2, 9].into(), 1000, 80, 6).unwrap(),
            &[9; 16],
        );
        assert_eq!(r.wire_len(), 35);
        let mut o = Vec::new();
        r.emit(&mut o);
        assert_eq!(&o[..10], &[1, 1, 2, 4, 6, 0, 0x03, 0xe8, 0, 80]);
    }
}

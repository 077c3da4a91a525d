//! `keyctr`: packets and bytes per key of any granularity — source or
//! destination IP, IP pair, GTP-U TEID, or a chosen field set
//! (`keyctr(key=dst_ip+dport)`). The state is shared between cores; packets
//! without such a key (a TEID counter seeing non-GTP-U traffic) pass and are
//! counted as unkeyed. A counter fails open: a packet whose key found no
//! room (the shared table full) passes, in no row, counted as `table_full`.
//!
//! `--export keyctr=FILE` writes one row per key: the key's fields (`src`,
//! `dst`, the 5-tuple, `teid`, or the chosen fields) and its packets and
//! bytes. A field-set key is stored in the table as a fingerprint, so for
//! field sets the state also keeps the key's fields (64 bytes instead of 16).

use std::net::{IpAddr, Ipv6Addr};

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::{CustomKey, FieldSet, FiveTuple};
use serde_json::{json, Map, Value};

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::stateful::{Action, Granularity, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const KEY: ParamSpec = ParamSpec::text(
    "key",
    "src_ip",
    "KEY",
    "src_ip|dst_ip|ip_pair|teid|5tuple, or fields src_ip, dst_ip, sport, dport, proto, vlan, teid joined by '+'",
);

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "keyctr",
    about: "packets and bytes per key of any granularity: source/destination IP, IP pair, GTP-U TEID or a field set (shared between cores, exportable)",
    keyed_by: KeyedBy::Param(&KEY),
    params: &[KEY],
};

/// Builds `keyctr` from its parameters and hands it to `sink`: a field-set
/// key gets the state that keeps the key's fields.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    let key = parse_key(p)?;
    Ok(match key {
        Granularity::Custom(_) => sink.stateful(KeyCtr::<FieldsState>::keyed(key)),
        _ => sink.stateful(KeyCtr::new(key)),
    })
}

fn parse_key(p: &mut Params) -> Result<Granularity, ParamError> {
    let spec = p.text(&KEY)?;
    Granularity::parse(&spec).map_err(|e| ParamError(format!("keyctr: parameter 'key={spec}': {e}")))
}

/// Per-key counters.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct KeyCtrState {
    /// Packets.
    pub packets: u64,
    /// Bytes (frame lengths).
    pub bytes: u64,
}

/// Per-key counters of a field-set key, with the key's fields (the table
/// holds only their fingerprint).
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct FieldsState {
    /// Packets.
    pub packets: u64,
    /// Bytes (frame lengths).
    pub bytes: u64,
    /// The key ([`CustomKey`] bytes) of the first packet.
    pub key: [u8; 48],
}

/// What a keyctr state is: counters, maybe with the key's fields.
pub trait CounterState: Pod + Zeroable + Send {
    /// A fresh state for the key of `pkt` (`fields`: the field set, if any).
    fn new(pkt: &Pkt<'_>, fields: Option<FieldSet>) -> Self;
    /// Packets and bytes.
    fn counts(&mut self) -> (&mut u64, &mut u64);
    /// Packets and bytes, read-only.
    fn totals(&self) -> (u64, u64);
    /// The field-set key's bytes ([`CustomKey`] layout), if the state keeps them.
    fn key_bytes(&self) -> Option<&[u8; 48]>;
}

impl CounterState for KeyCtrState {
    fn new(_pkt: &Pkt<'_>, _fields: Option<FieldSet>) -> Self {
        KeyCtrState::zeroed()
    }
    #[inline(always)]
    fn counts(&mut self) -> (&mut u64, &mut u64) {
        (&mut self.packets, &mut self.bytes)
    }
    fn totals(&self) -> (u64, u64) {
        (self.packets, self.bytes)
    }
    fn key_bytes(&self) -> Option<&[u8; 48]> {
        None
    }
}

impl CounterState for FieldsState {
    fn new(pkt: &Pkt<'_>, fields: Option<FieldSet>) -> Self {
        let m = pkt.meta();
        let key = fields.map_or([0; 48], |f| *CustomKey::build(f, &m.tuple, m.vlan, m.teid).as_bytes());
        FieldsState { packets: 0, bytes: 0, key }
    }
    #[inline(always)]
    fn counts(&mut self) -> (&mut u64, &mut u64) {
        (&mut self.packets, &mut self.bytes)
    }
    fn totals(&self) -> (u64, u64) {
        (self.packets, self.bytes)
    }
    fn key_bytes(&self) -> Option<&[u8; 48]> {
        Some(&self.key)
    }
}

/// The keyed counter (`S`: its state, [`FieldsState`] for field-set keys).
#[derive(Debug)]
pub struct KeyCtr<S = KeyCtrState> {
    key: Granularity,
    keys: u64,
    unkeyed: u64,
    table_full: u64,
    _state: std::marker::PhantomData<fn() -> S>,
}

impl KeyCtr {
    /// `keyctr(key=src_ip|dst_ip|ip_pair|teid|5tuple)` (a field set needs
    /// [`KeyCtr::<FieldsState>`] to export its keys; the registry picks it).
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        Ok(KeyCtr::new(parse_key(p)?))
    }

    /// A counter keyed by `key` (the 5-tuple is allowed too) with the plain counter state.
    pub fn new(key: Granularity) -> Self {
        KeyCtr::keyed(key)
    }
}

impl<S: CounterState> KeyCtr<S> {
    /// A counter keyed by `key` with state `S`.
    pub fn keyed(key: Granularity) -> Self {
        KeyCtr { key, keys: 0, unkeyed: 0, table_full: 0, _state: std::marker::PhantomData }
    }

    fn row(&self, mut m: Map<String, Value>, st: &S) -> Option<Value> {
        let (packets, bytes) = st.totals();
        m.insert("packets".into(), json!(packets));
        m.insert("bytes".into(), json!(bytes));
        Some(Value::Object(m))
    }
}

impl<S: CounterState> StatefulNf for KeyCtr<S> {
    type State = S;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn granularity(&self) -> Granularity {
        self.key
    }

    fn init(&mut self, pkt: &Pkt<'_>, _ctx: &NfContext) -> S {
        self.keys += 1;
        let fields = match self.key {
            Granularity::Custom(f) => Some(f),
            _ => None,
        };
        S::new(pkt, fields)
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut S, _ctx: &NfContext) -> Action {
        let (packets, bytes) = st.counts();
        *packets += 1;
        *bytes += pkt.len() as u64;
        Action::Pass
    }

    fn on_unparsed(&mut self) -> Action {
        self.unkeyed += 1;
        Action::Pass
    }

    /// A counter fails open: the packet passes, counted as `table_full`.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<Value> {
        Some(
            json!({ "key": self.key.name(), "keys_seen": self.keys, "unkeyed": self.unkeyed, "table_full": self.table_full }),
        )
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    /// Address keys (projected: the other fields are zero) and 5-tuples.
    fn export_row(&self, key: &FiveTuple, st: &S) -> Option<Value> {
        let mut m = Map::new();
        let ip = |a: IpAddr| json!(a.to_string());
        match self.key {
            Granularity::SrcIp => {
                m.insert("src".into(), ip(key.src_ip()));
            }
            Granularity::DstIp => {
                m.insert("dst".into(), ip(key.dst_ip()));
            }
            Granularity::IpPair => {
                m.insert("src".into(), ip(key.src_ip()));
                m.insert("dst".into(), ip(key.dst_ip()));
            }
            Granularity::FiveTuple => {
                m.insert("proto".into(), json!(key.proto()));
                m.insert("src".into(), ip(key.src_ip()));
                m.insert("dst".into(), ip(key.dst_ip()));
                m.insert("sport".into(), json!(key.src_port()));
                m.insert("dport".into(), json!(key.dst_port()));
            }
            Granularity::Teid | Granularity::Custom(_) => return None,
        }
        self.row(m, st)
    }

    /// TEIDs (the key's low 32 bits) and field sets (from the state).
    fn export_raw_row(&self, key: u128, st: &S) -> Option<Value> {
        let mut m = Map::new();
        match self.key {
            Granularity::Teid => {
                m.insert("teid".into(), json!(key as u32));
            }
            Granularity::Custom(fields) => {
                let b = st.key_bytes()?;
                let addr = |at: usize| {
                    let a = Ipv6Addr::from(<[u8; 16]>::try_from(&b[at..at + 16]).unwrap_or([0; 16]));
                    json!(a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4).to_string())
                };
                let be = |at: usize| json!(u16::from_be_bytes([b[at], b[at + 1]]));
                for (f, name) in [
                    (FieldSet::SRC_IP, "src"),
                    (FieldSet::DST_IP, "dst"),
                    (FieldSet::SPORT, "sport"),
                    (FieldSet::DPORT, "dport"),
                    (FieldSet::PROTO, "proto"),
                    (FieldSet::VLAN, "vlan"),
                    (FieldSet::TEID, "teid"),
                ] {
                    if !fields.contains(f) {
                        continue;
                    }
                    let v = match name {
                        "src" => addr(0),
                        "dst" => addr(16),
                        "sport" => be(32),
                        "dport" => be(34),
                        "proto" => json!(b[36]),
                        "vlan" => be(38),
                        _ => json!(u32::from_be_bytes([b[40], b[41], b[42], b[43]])),
                    };
                    m.insert(name.into(), v);
                }
            }
            _ => return None,
        }
        self.row(m, st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};
    use flowplane_wire::packet_repr::FrameBuilder;

    fn gtpu(teid: u32, inner_port: u16) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let inner = [0x45u8; 20];
        let b = FrameBuilder::udp_v4([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 2152, 2152).with_gtpu(teid, None);
        let n = b.emit(&mut buf, &[&inner[..], &inner_port.to_be_bytes()].concat()).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn counts_per_teid_and_passes_non_gtp() {
        let mut h = Harness::new(KeyCtr::new(Granularity::Teid));
        for (teid, port) in [(7, 1), (7, 2), (9, 1), (7, 3)] {
            assert_eq!(h.run(&gtpu(teid, port)).1, Action::Pass);
        }
        assert_eq!(h.state_of(&gtpu(7, 0)).unwrap().packets, 3);
        assert_eq!(h.state_of(&gtpu(9, 0)).unwrap().packets, 1);
        assert_eq!(h.run(&udp4([10, 0, 0, 1], [10, 0, 0, 2], 5, 6)).1, Action::Pass);
        let r = h.nf.report().unwrap();
        assert_eq!((r["keys_seen"].as_u64(), r["unkeyed"].as_u64()), (Some(2), Some(1)));
    }

    #[test]
    fn custom_field_set() {
        let mut p = Params::new("keyctr", vec![("key".into(), "dst_ip+dport".into())]);
        let mut h = Harness::new(KeyCtr::from_params(&mut p).unwrap());
        for sport in 0..5 {
            h.run(&udp4([10, 0, 0, sport as u8], [9, 9, 9, 9], 1000 + sport, 53));
        }
        h.run(&udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 54));
        assert_eq!(h.state_of(&udp4([1, 1, 1, 1], [9, 9, 9, 9], 1, 53)).unwrap().packets, 5);
        assert_eq!(h.nf.report().unwrap()["keys_seen"], 2);
        let mut p = Params::new("keyctr", vec![("key".into(), "src_ip+bogus".into())]);
        assert!(KeyCtr::from_params(&mut p).unwrap_err().0.contains("'key=src_ip+bogus'"));
    }

    /// Every row of a harness's table, sorted.
    fn rows<S: CounterState>(h: &Harness<KeyCtr<S>>) -> Vec<String> {
        let mut v: Vec<String> = h
            .states
            .iter()
            .filter_map(|(k, st)| h.nf.export_row(k, st))
            .chain(h.keyed_states.iter().filter_map(|(k, st)| h.nf.export_raw_row(*k, st)))
            .map(|r| r.to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn exports_every_key_with_its_fields() {
        // TEIDs: the raw key's low 32 bits.
        let mut h = Harness::new(KeyCtr::new(Granularity::Teid));
        for teid in [7, 7, 9] {
            h.run(&gtpu(teid, 1));
        }
        let len = gtpu(7, 1).len();
        assert_eq!(
            rows(&h),
            vec![
                format!(r#"{{"teid":7,"packets":2,"bytes":{}}}"#, 2 * len),
                format!(r#"{{"teid":9,"packets":1,"bytes":{len}}}"#)
            ]
        );
        // Field sets: the fields kept in the state, only those of the set.
        let key = Granularity::parse("dst_ip+dport").unwrap();
        let mut h = Harness::new(KeyCtr::<FieldsState>::keyed(key));
        for sport in 0..3 {
            h.run(&udp4([10, 0, 0, sport as u8], [9, 9, 9, 9], 1000 + sport, 53));
        }
        h.run(&udp4([10, 0, 0, 1], [8, 8, 4, 4], 1000, 443));
        assert_eq!(
            rows(&h),
            vec![
                r#"{"dst":"8.8.4.4","dport":443,"packets":1,"bytes":60}"#.to_string(),
                r#"{"dst":"9.9.9.9","dport":53,"packets":3,"bytes":180}"#.to_string(),
            ]
        );
        // Addresses: the projected key.
        let mut h = Harness::new(KeyCtr::new(Granularity::SrcIp));
        h.run(&udp4([10, 0, 0, 1], [9, 9, 9, 9], 1, 2));
        h.run(&udp4([10, 0, 0, 1], [9, 9, 9, 8], 1, 2));
        assert_eq!(rows(&h), vec![r#"{"src":"10.0.0.1","packets":2,"bytes":120}"#.to_string()]);
        assert_eq!(h.nf.export_kind(), Export::State);
        // The plain state cannot name a field set: no row rather than a wrong one.
        let plain = KeyCtr::new(key);
        assert!(plain.export_raw_row(1, &KeyCtrState { packets: 1, bytes: 1 }).is_none());
    }
}

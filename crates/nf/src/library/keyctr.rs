//! `keyctr`: packets and bytes per key of any granularity — source or
//! destination IP, IP pair, GTP-U TEID, or a chosen field set
//! (`keyctr(key=dst_ip+dport)`). The state is shared between cores; packets
//! without such a key (a TEID counter seeing non-GTP-U traffic) pass and are
//! counted as unkeyed.

use bytemuck::{Pod, Zeroable};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfDescriptor, NfSink};
use crate::stateful::{Action, Granularity, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const KEY: ParamSpec = ParamSpec::text(
    "key",
    "src_ip",
    "KEY",
    "src_ip|dst_ip|ip_pair|teid|5tuple, or fields src_ip, dst_ip, sport, dport, proto, vlan, teid joined by '+'",
);

/// Registration (see `crates/nf/build.rs`).
pub const NF: NfDescriptor = NfDescriptor {
    name: "keyctr",
    about: "packets and bytes per key of any granularity: source/destination IP, IP pair, GTP-U TEID or a field set (shared between cores)",
    keyed_by: KeyedBy::Param(&KEY),
    params: &[KEY],
};

/// Builds `keyctr` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(KeyCtr::from_params(p)?))
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

/// The keyed counter.
#[derive(Debug)]
pub struct KeyCtr {
    key: Granularity,
    keys: u64,
    unkeyed: u64,
}

impl KeyCtr {
    /// `keyctr(key=src_ip|dst_ip|ip_pair|teid|FIELD+FIELD...)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let spec = p.text(&KEY)?;
        let key = Granularity::parse(&spec).map_err(|e| ParamError(format!("keyctr: parameter 'key={spec}': {e}")))?;
        Ok(KeyCtr::new(key))
    }

    /// A counter keyed by `key` (the 5-tuple is allowed too).
    pub fn new(key: Granularity) -> Self {
        KeyCtr { key, keys: 0, unkeyed: 0 }
    }
}

impl StatefulNf for KeyCtr {
    type State = KeyCtrState;

    fn name(&self) -> &'static str {
        NF.name
    }

    fn granularity(&self) -> Granularity {
        self.key
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> KeyCtrState {
        self.keys += 1;
        KeyCtrState::zeroed()
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut KeyCtrState, _ctx: &NfContext) -> Action {
        st.packets += 1;
        st.bytes += pkt.len() as u64;
        Action::Pass
    }

    fn on_unparsed(&mut self) -> Action {
        self.unkeyed += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "key": self.key.name(), "keys_seen": self.keys, "unkeyed": self.unkeyed }))
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
}

//! A replica's state as export rows (every replica holds the same state, so
//! one replica's rows are the run's), and the IPv6 folds that name its keys.

use flowplane_nf::stateful::ScrRecord;
use flowplane_nf::PktMeta;

use super::replica::ScrReplica;
use super::table::KeyOf;
use crate::chain::{Chain, Stage};

impl ScrReplica {
    /// Export rows of NF `name` (as [`crate::exec::Pipeline::export`] makes them from a flow table or a shared
    /// table) from this replica's table for it: every replica holds the same state (the digests check it), so
    /// one replica's rows are the run's; a key idle past the timeout at the latest record time is not listed (what a
    /// lookup would find). None if no stateful NF is called `name`. Records fold IPv6 addresses
    /// to 32 bits: `v6` maps each fold back to an address of the input (see [`add_v6_folds`]); a key whose fold it
    /// lacks, or keyed by connection (the direction is not kept), has no row.
    pub fn export(
        &self,
        chain: &Chain,
        name: &str,
        v6: &std::collections::HashMap<u32, std::net::Ipv6Addr>,
    ) -> Option<Vec<serde_json::Value>> {
        use flowplane_wire::flow::FiveTuple;
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let si = chain.stages.iter().position(|s| matches!(s, Stage::Stateful { nf, .. } if nf.name() == name))?;
        let (Stage::Stateful { nf, .. }, Some(t)) = (&chain.stages[si], self.tables.get(si)?.as_ref()) else {
            return None;
        };
        let ip = |a: u32, is_v6: bool| -> Option<IpAddr> {
            if is_v6 {
                v6.get(&a).map(|&x| IpAddr::V6(x))
            } else {
                Some(IpAddr::V4(Ipv4Addr::from(a)))
            }
        };
        let zero =
            |is_v6: bool| if is_v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        let mut rows = Vec::new();
        // The idle rule of a lookup at the latest record time (every replica saw every record): a key a record
        // would find idle, and start over, is not listed though no sweep removed it yet.
        let now = t.entries().map(|(_, _, last)| last).max().unwrap_or(0);
        for (i, k, last) in t.entries() {
            if flowplane_nf::stateful::is_idle(last, now, t.timeout_ns()) {
                continue;
            }
            let is_v6 = k as u8 & flowplane_wire::scr::kind::V6 != 0;
            let tuple = match t.key_of {
                KeyOf::Src => ip((k >> 8) as u32, is_v6).and_then(|a| FiveTuple::new(a, zero(is_v6), 0, 0, 0)),
                KeyOf::Dst => ip((k >> 8) as u32, is_v6).and_then(|a| FiveTuple::new(zero(is_v6), a, 0, 0, 0)),
                KeyOf::Flow => match (ip((k >> 96) as u32, is_v6), ip((k >> 64) as u32, is_v6)) {
                    (Some(s), Some(d)) => FiveTuple::new(s, d, (k >> 48) as u16, (k >> 32) as u16, (k >> 24) as u8),
                    _ => None,
                },
                KeyOf::Connection => None,
            };
            let Some(tuple) = tuple else { continue };
            rows.extend(nf.export_row_bytes(&tuple, t.state_bytes(i)));
        }
        Some(rows)
    }
}

impl ScrReplica {
    /// Keys in the replica's first table keyed by the 5-tuple (None: no NF keeps per-flow state): the live flows.
    pub fn flows(&self) -> Option<u64> {
        self.tables.iter().flatten().find(|t| t.key_of == KeyOf::Flow).map(|t| t.len() as u64)
    }
}

/// Adds `frame`'s IPv6 addresses to `m`, by their 32-bit fold in SCR records (what [`ScrReplica::export`] needs to
/// show IPv6 keys).
pub fn add_v6_folds(m: &mut std::collections::HashMap<u32, std::net::Ipv6Addr>, frame: &[u8]) {
    let meta = PktMeta::parse(frame);
    if let (true, flowplane_wire::flow::FiveTuple::V6(t)) = (meta.valid, meta.tuple) {
        let r = ScrRecord::from_frame(frame, &meta);
        m.insert(r.src, t.src());
        m.insert(r.dst, t.dst());
    }
}

//! State hand-over between cores: export every per-flow entry (its key,
//! last-seen time and aggregated block, or each per-NF store's block) whose
//! key a predicate picks — the flows of one RETA entry — from one core's
//! stores, and import them into another's. Coarse entries live in the
//! shared tables every core reaches, and a moved block keeps its pins on
//! them, so they need no copying. NFs whose per-flow state points into
//! per-core structures declare it ([`flowplane_nf::GlobalState::Private`]
//! and port pools) and strategies that move flows refuse them.
//!
//! Encoding (in-process, little-endian): per entry `store u8, family u8
//! (4|6), src, dst, sport u16, dport u16, proto u8, flags u8, last_seen u64,
//! block_len u32, block`.

use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_wire::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};

use super::context::hash_tuple;
use super::ExecContext;
use flowplane_table::{FlowKey, FlowTable};

fn put_key(out: &mut Vec<u8>, t: &FiveTuple) {
    match t {
        FiveTuple::V4(k) => {
            out.push(4);
            out.extend_from_slice(&k.src().octets());
            out.extend_from_slice(&k.dst().octets());
            out.extend_from_slice(&k.src_port().to_le_bytes());
            out.extend_from_slice(&k.dst_port().to_le_bytes());
            out.push(k.proto());
            out.push(k.flags());
        }
        FiveTuple::V6(k) => {
            out.push(6);
            out.extend_from_slice(&k.src().octets());
            out.extend_from_slice(&k.dst().octets());
            out.extend_from_slice(&k.src_port().to_le_bytes());
            out.extend_from_slice(&k.dst_port().to_le_bytes());
            out.push(k.proto());
            out.push(k.flags());
        }
    }
}

/// A cursor over an encoded hand-over.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
    fn key(&mut self) -> Option<FiveTuple> {
        match self.u8()? {
            4 => {
                let s: [u8; 4] = self.take(4)?.try_into().ok()?;
                let d: [u8; 4] = self.take(4)?.try_into().ok()?;
                let (sp, dp, p, f) = (self.u16()?, self.u16()?, self.u8()?, self.u8()?);
                Some(FiveTuple::V4(FiveTupleV4::new(Ipv4Addr::from(s), Ipv4Addr::from(d), sp, dp, p).with_flags(f)))
            }
            6 => {
                let s: [u8; 16] = self.take(16)?.try_into().ok()?;
                let d: [u8; 16] = self.take(16)?.try_into().ok()?;
                let (sp, dp, p, f) = (self.u16()?, self.u16()?, self.u8()?, self.u8()?);
                Some(FiveTuple::V6(FiveTupleV6::new(Ipv6Addr::from(s), Ipv6Addr::from(d), sp, dp, p).with_flags(f)))
            }
            _ => None,
        }
    }
}

/// Moves every entry whose key `pick` selects out of `cx`'s stores into
/// `out` (appended); returns the number of entries.
pub(crate) fn export_flows(cx: &mut ExecContext, pick: &dyn Fn(&FiveTuple) -> bool, out: &mut Vec<u8>) -> usize {
    export_flows_by(cx, &|k| pick(k).then_some(0), std::slice::from_mut(out))
}

/// One pass over the stores for several hand-overs at once: an entry goes
/// to `outs[i]` when `which` says `Some(i)`. Returns the entries moved.
pub(crate) fn export_flows_by(
    cx: &mut ExecContext,
    which: &dyn Fn(&FiveTuple) -> Option<usize>,
    outs: &mut [Vec<u8>],
) -> usize {
    let mut n = 0;
    for (si, store) in cx.stores.iter_mut().enumerate() {
        n += export_table(store.v4(), si, &|k| FiveTuple::V4(*k), which, outs);
        n += export_table(store.v6(), si, &|k| FiveTuple::V6(*k), which, outs);
    }
    cx.stats.moved_out += n as u64;
    n
}

fn export_table<K: FlowKey>(
    t: &mut FlowTable<K>,
    si: usize,
    wrap: &dyn Fn(&K) -> FiveTuple,
    which: &dyn Fn(&FiveTuple) -> Option<usize>,
    outs: &mut [Vec<u8>],
) -> usize {
    if t.is_empty() {
        return 0;
    }
    let picked: Vec<(u32, FiveTuple, usize)> = t
        .iter()
        .filter_map(|(h, k, _)| {
            let k = wrap(k);
            which(&k).filter(|&i| i < outs.len()).map(|i| (h, k, i))
        })
        .collect();
    for (h, k, i) in &picked {
        let out = &mut outs[*i];
        out.push(si as u8);
        put_key(out, k);
        out.extend_from_slice(&t.last_seen(*h).unwrap_or(0).to_le_bytes());
        let block = t.state(*h);
        out.extend_from_slice(&(block.len() as u32).to_le_bytes());
        out.extend_from_slice(block);
        t.remove_handle(*h);
    }
    picked.len()
}

/// Imports entries exported by [`export_flows`] (from an identical chain on
/// another core). Returns (imported, refused: table full or malformed).
pub(crate) fn import_flows(cx: &mut ExecContext, data: &[u8]) -> (usize, usize) {
    let mut rd = Rd(data);
    let (mut ok, mut bad) = (0, 0);
    while !rd.0.is_empty() {
        let Some((si, key, last, block)) = (|| {
            let si = rd.u8()? as usize;
            let key = rd.key()?;
            let last = rd.u64()?;
            let len = rd.u32()? as usize;
            Some((si, key, last, rd.take(len)?))
        })() else {
            bad += 1;
            break;
        };
        let Some(store) = cx.stores.get_mut(si) else {
            bad += 1;
            continue;
        };
        let h = hash_tuple(&key, cx.scratch.seed);
        let fill = |b: &mut [u8]| {
            let n = b.len().min(block.len());
            b[..n].copy_from_slice(&block[..n]);
        };
        let new = match &key {
            FiveTuple::V4(k) => store.v4().insert(k, h, last, fill).ok().map(|(_, new)| new),
            FiveTuple::V6(k) => store.v6().insert(k, h, last, fill).ok().map(|(_, new)| new),
        };
        match new {
            Some(true) => ok += 1,
            // Already there (moves are exclusive, so not expected) or the table is full: counted.
            _ => bad += 1,
        }
    }
    cx.stats.moved_in += ok as u64;
    (ok, bad)
}

//! `route`: longest-prefix-match forwarding on the destination address, from
//! a table of routes loaded from a file — the classic memory-bound INFO.
//!
//! IPv4 uses DIR-24-8 (Gupta et al.; DPDK's `rte_lpm`): a 2^24-entry table
//! indexed by the top 24 bits (64 MiB of `u32` on huge pages), whose entries hold a next hop or the index of a 256-entry
//! second-level group for the /25../32 routes under that /24. A lookup is
//! one or two dependent reads. IPv6 uses a multibit trie of stride 8 with
//! leaf pushing (Poptrie's layout without its popcount compression): one
//! 256-entry node per level, one read per byte of the address that routes
//! still distinguish (6 for a /48). The resumable action (interleaved
//! executor) keeps its partial lookups: one step per table read.
//!
//! The table can be replaced while the router runs (`flowplane ctl SOCK load
//! route FILE`, `set route routes FILE`, `ctl reload`): each core builds the
//! new tables from the file and swaps them in between two batches, so a batch
//! is routed by one table, never half of each (a partial lookup never spans a
//! batch), and every packet after the swap is looked up in the new table.
//! Per-flow state (last next hop, packet count) is kept; counters go on.
//! The report's `version` counts the swaps. A file that does not parse is
//! refused in one line naming its line (`FILE:LINE: ...`) and the old table
//! stays. A swap allocates the new 64 MiB IPv4 table next to the old one and
//! fills it on the worker (tens of ms for a table with short prefixes).
//!
//! Route file (`routes=FILE`), one route per line, `#` starts a comment:
//! `PREFIX/LEN PORT`, e.g. `10.0.0.0/8 1`, `2001:db8::/32 4`, `0.0.0.0/0 0`;
//! `PORT` (0..=65534) becomes the packet's output port. A prefix listed
//! twice keeps its last port. Packets without a route, and non-IP ones,
//! follow `miss` (drop, or pass with the verdict unchanged), and so do
//! packets that found no state because the flow table was full (counted as
//! `table_full`, not `missed`).
//!
//! Per flow, the state records the last next hop and counts packets (an
//! export row per flow: which port its packets took).

use std::net::IpAddr;

use bytemuck::{Pod, Zeroable};
use flowplane_table::HugeArray;
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::prefix::{ip_bits, IpPrefix};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::{Action, Cursor, Granularity, StatefulNf, Step};
use crate::{NfContext, ParamError, ParamSpec, Params};

const ROUTES: ParamSpec =
    ParamSpec::text("routes", "", "FILE", "route file: 'PREFIX/LEN PORT' per line (IPv4 or IPv6), # comments").live();
const MISS: ParamSpec =
    ParamSpec::choice("miss", "drop", &["drop", "pass"], "packets without a route (and non-IP packets): drop or pass")
        .live();

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "route",
    about: "LPM forwarding on the destination: DIR-24-8 (IPv4) and a stride-8 trie (IPv6) from a route file; port = next hop",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[ROUTES, MISS],
};

/// Builds `route` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Route::from_params(p)?))
}

/// Largest next hop (port); 65535 is the drop verdict.
pub const MAX_PORT: u16 = 65534;
/// Most IPv6 trie nodes (1 KiB each): bounds the table at 256 MiB.
pub const MAX_V6_NODES: usize = 1 << 18;
/// Most second-level IPv4 groups (1 KiB each).
const MAX_TBL8: usize = 1 << 20;

/// Entry flag: the rest is a child (tbl8 group / trie node) index, not a next hop.
const EXT: u32 = 1 << 31;

/// One route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    /// Network bits (host bits cleared): IPv4 in the low 32 bits.
    pub net: u128,
    /// Prefix length.
    pub len: u8,
    /// IPv6.
    pub v6: bool,
    /// Output port.
    pub port: u16,
}

/// Parses a route file (`name` labels errors): one-line errors naming the line.
pub fn parse_routes(name: &str, text: &str) -> Result<Vec<RouteEntry>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |m: &str| format!("{name}:{}: {m}: '{line}'", n + 1);
        let mut tok = line.split_whitespace();
        let (Some(pfx), Some(port), None) = (tok.next(), tok.next(), tok.next()) else {
            return Err(err("expected 'PREFIX/LEN PORT'"));
        };
        let p = IpPrefix::parse(pfx).ok_or_else(|| err("bad prefix"))?;
        let port: u16 = port.parse().ok().filter(|&p| p <= MAX_PORT).ok_or_else(|| err("port must be 0..=65534"))?;
        out.push(entry(p, port));
    }
    Ok(out)
}

fn entry(p: IpPrefix, port: u16) -> RouteEntry {
    let v6 = p.is_ipv6();
    let width = if v6 { 128 } else { 32 };
    let len = u32::from(p.len());
    let full = if v6 { u128::MAX } else { u128::from(u32::MAX) };
    let mask = if len == 0 { 0 } else { full & !((1u128 << (width - len)) - 1) };
    RouteEntry { net: ip_bits(p.addr()) & mask, len: p.len(), v6, port }
}

/// The longest-prefix-match tables.
pub struct Lpm {
    /// On huge pages: lookups read it at random.
    tbl24: HugeArray<u32>,
    tbl8: Vec<u32>,
    /// Trie nodes, 256 entries each; node 0 is the root.
    v6: Vec<u32>,
    routes_v4: usize,
    routes_v6: usize,
}

impl std::fmt::Debug for Lpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lpm({} v4, {} v6 routes)", self.routes_v4, self.routes_v6)
    }
}

/// Where an address's lookup stands: the next entry to read, or the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// Read this entry of `tbl24`, `tbl8` or the trie next.
    V4Tbl24(usize),
    V4Tbl8(usize),
    V6(usize, u8),
    /// The next hop + 1 (0: no route).
    Done(u32),
}

impl Lpm {
    /// Builds the tables (errors name the limit that was hit).
    pub fn new(routes: &[RouteEntry]) -> Result<Lpm, String> {
        // The last of duplicate prefixes wins; then shortest first, so longer
        // prefixes overwrite the ranges they refine.
        let mut rs: Vec<(usize, RouteEntry)> = routes.iter().copied().enumerate().collect();
        rs.sort_by_key(|(i, r)| (r.v6, r.len, r.net, std::cmp::Reverse(*i)));
        rs.dedup_by_key(|(_, r)| (r.v6, r.len, r.net));
        let tbl24 = HugeArray::zeroed(1 << 24).map_err(|_| "cannot allocate the 64 MiB IPv4 table".to_string())?;
        let mut lpm = Lpm { tbl24, tbl8: Vec::new(), v6: vec![0; 256], routes_v4: 0, routes_v6: 0 };
        for (_, r) in rs.iter().filter(|(_, r)| !r.v6) {
            lpm.add_v4(r.net as u32, r.len, u32::from(r.port) + 1)?;
            lpm.routes_v4 += 1;
        }
        for (_, r) in rs.iter().filter(|(_, r)| r.v6) {
            lpm.add_v6(r.net, r.len, u32::from(r.port) + 1)?;
            lpm.routes_v6 += 1;
        }
        Ok(lpm)
    }

    /// Adds an IPv4 route (every shorter one is already in).
    fn add_v4(&mut self, net: u32, len: u8, hop: u32) -> Result<(), String> {
        if len <= 24 {
            let first = (net >> 8) as usize;
            let n = 1usize << (24 - len);
            // Shorter routes come first, so no entry of this range has a group yet.
            self.tbl24[first..first + n].fill(hop);
            return Ok(());
        }
        let i = (net >> 8) as usize;
        let e = self.tbl24[i];
        let g = if e & EXT != 0 {
            (e & !EXT) as usize
        } else {
            let g = self.tbl8.len() / 256;
            if g >= MAX_TBL8 {
                return Err(format!("more than {MAX_TBL8} /24s hold routes longer than /24"));
            }
            // The group starts as what the /24 routed to.
            self.tbl8.resize(self.tbl8.len() + 256, e);
            self.tbl24[i] = EXT | g as u32;
            g
        };
        let first = g * 256 + (net & 0xff) as usize;
        self.tbl8[first..first + (1usize << (32 - len))].fill(hop);
        Ok(())
    }

    /// Adds an IPv6 route (every shorter one is already in).
    fn add_v6(&mut self, net: u128, len: u8, hop: u32) -> Result<(), String> {
        let byte = |level: u32| ((net >> (120 - 8 * level)) & 0xff) as usize;
        // The level where the prefix ends: a /0../8 fills part of the root.
        let last = u32::from(len.max(1) - 1) / 8;
        let mut node = 0usize;
        for level in 0..last {
            let at = node * 256 + byte(level);
            let e = self.v6[at];
            node = if e & EXT != 0 {
                (e & !EXT) as usize
            } else {
                let child = self.v6.len() / 256;
                if child >= MAX_V6_NODES {
                    return Err(format!("the IPv6 routes need more than {MAX_V6_NODES} trie nodes"));
                }
                // Leaf pushing: the child starts as what this slot routed to.
                self.v6.resize(self.v6.len() + 256, e);
                self.v6[at] = EXT | child as u32;
                child
            };
        }
        let span = 8 * (last + 1) - u32::from(len);
        let first = node * 256 + (byte(last) & !((1usize << span) - 1));
        // Shorter routes come first, so no slot of this range has a child yet.
        self.v6[first..first + (1usize << span)].fill(hop);
        Ok(())
    }

    /// The first read of a lookup of `dst`.
    #[inline(always)]
    fn start(&self, dst: Dst) -> Probe {
        match dst {
            Dst::V4(a) => Probe::V4Tbl24((a >> 8) as usize),
            Dst::V6(_) => Probe::V6(0, 0),
        }
    }

    /// The entry a probe reads next (for a prefetch).
    #[inline(always)]
    fn slot(&self, p: Probe, dst: Dst) -> Option<&u32> {
        match (p, dst) {
            (Probe::V4Tbl24(i), _) => self.tbl24.get(i),
            (Probe::V4Tbl8(i), _) => self.tbl8.get(i),
            (Probe::V6(node, level), Dst::V6(a)) => self.v6.get(node * 256 + byte6(a, level)),
            _ => None,
        }
    }

    /// Does the read `p` names and says what comes next.
    #[inline(always)]
    fn advance(&self, p: Probe, dst: Dst) -> Probe {
        let Some(&e) = self.slot(p, dst) else { return Probe::Done(0) };
        match (p, dst) {
            (Probe::V4Tbl24(_), Dst::V4(a)) if e & EXT != 0 => {
                Probe::V4Tbl8((e & !EXT) as usize * 256 + (a & 0xff) as usize)
            }
            (Probe::V6(_, level), _) if e & EXT != 0 && level < 15 => Probe::V6((e & !EXT) as usize, level + 1),
            _ if e & EXT != 0 => Probe::Done(0),
            _ => Probe::Done(e),
        }
    }

    /// Next hop + 1 for `dst` (0: no route).
    #[inline]
    pub fn lookup(&self, dst: Dst) -> u32 {
        let mut p = self.start(dst);
        loop {
            match self.advance(p, dst) {
                Probe::Done(h) => return h,
                q => p = q,
            }
        }
    }
}

#[inline(always)]
fn byte6(a: u128, level: u8) -> usize {
    ((a >> (120 - 8 * u32::from(level))) & 0xff) as usize
}

/// A destination address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dst {
    /// IPv4.
    V4(u32),
    /// IPv6.
    V6(u128),
}

/// The packet's current destination (after any rewrite by an earlier NF).
#[inline]
fn dst_of(pkt: &Pkt<'_>) -> Option<Dst> {
    let m = pkt.meta();
    if !m.valid {
        return None;
    }
    if !m.v6 {
        return pkt.ipv4_dst().map(|a| Dst::V4(u32::from(a)));
    }
    let at = m.l3 as usize + 24;
    let b: [u8; 16] = pkt.data().get(at..at + 16)?.try_into().ok()?;
    Some(Dst::V6(u128::from_be_bytes(b)))
}

/// Per-flow state (8 bytes).
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RouteState {
    /// Next hop + 1 of the flow's last packet (0: none yet, or no route).
    pub hop: u32,
    /// Packets of the flow.
    pub packets: u32,
}

/// The route INFO.
#[derive(Debug)]
pub struct Route {
    lpm: Lpm,
    miss_drop: bool,
    /// Table swaps so far (see the module doc).
    version: u64,
    routed: u64,
    missed: u64,
    table_full: u64,
}

impl Route {
    /// `route(routes=FILE, miss=drop|pass)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let err = |m: String| ParamError(format!("route: {m}"));
        let miss_drop = p.choice(&MISS, [true, false])?;
        let file = p.text(&ROUTES)?;
        if file.is_empty() {
            return Err(err("parameter 'routes=FILE' is required".into()));
        }
        let text = crate::read_text_file(&file)
            .map_err(|e| err(format!("parameter 'routes={file}': cannot read route file: {e}")))?;
        let routes = parse_routes(&file, &text).map_err(|e| err(format!("route file {e}")))?;
        Route::new(&routes, miss_drop).map_err(err)
    }

    /// A router over `routes`.
    pub fn new(routes: &[RouteEntry], miss_drop: bool) -> Result<Self, String> {
        Ok(Route { lpm: Lpm::new(routes)?, miss_drop, version: 0, routed: 0, missed: 0, table_full: 0 })
    }

    /// The tables.
    pub fn lpm(&self) -> &Lpm {
        &self.lpm
    }

    #[inline]
    fn forward(&mut self, hop: u32, st: &mut RouteState) -> Action {
        st.hop = hop;
        st.packets = st.packets.wrapping_add(1);
        if hop == 0 {
            self.missed += 1;
            return if self.miss_drop { Action::Drop } else { Action::Pass };
        }
        self.routed += 1;
        Action::Port((hop - 1) as u16)
    }
}

/// `Cursor.input` of a lookup of `dst` (IPv6 also keeps the address in `val`).
#[inline(always)]
fn input_of(dst: Dst) -> u64 {
    match dst {
        Dst::V4(a) => (1 << 32) | u64::from(a),
        Dst::V6(_) => 2 << 32,
    }
}

#[inline(always)]
fn same_dst(cur: &Cursor, dst: Dst) -> bool {
    cur.input == input_of(dst)
        && match dst {
            Dst::V4(_) => true,
            Dst::V6(a) => cur.val == [(a >> 64) as u64, a as u64],
        }
}

/// A probe as cursor fields (`step` 1 = not resolved yet, 2 = resolved).
#[inline(always)]
fn store(cur: &mut Cursor, p: Probe) {
    match p {
        Probe::V4Tbl24(i) | Probe::V4Tbl8(i) => {
            cur.step = 1;
            cur.pos = i as u32 | if matches!(p, Probe::V4Tbl8(_)) { EXT } else { 0 };
        }
        Probe::V6(node, level) => {
            cur.step = 1;
            cur.pos = (node as u32) << 4 | u32::from(level);
        }
        Probe::Done(h) => {
            cur.step = 2;
            cur.pos = h;
        }
    }
}

#[inline(always)]
fn load(cur: &Cursor, dst: Dst) -> Probe {
    match (cur.step, dst) {
        (2, _) => Probe::Done(cur.pos),
        (_, Dst::V4(_)) if cur.pos & EXT != 0 => Probe::V4Tbl8((cur.pos & !EXT) as usize),
        (_, Dst::V4(_)) => Probe::V4Tbl24(cur.pos as usize),
        (_, Dst::V6(_)) => Probe::V6((cur.pos >> 4) as usize, (cur.pos & 15) as u8),
    }
}

impl StatefulNf for Route {
    type State = RouteState;
    const STEPS: bool = true;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> RouteState {
        RouteState::zeroed()
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut RouteState, _ctx: &NfContext) -> Action {
        let hop = dst_of(pkt).map_or(0, |d| self.lpm.lookup(d));
        self.forward(hop, st)
    }

    /// One step per table read: the first names the tbl24 entry (or the
    /// trie root's), each later one reads what the previous named.
    #[inline]
    fn step(&self, pkt: &Pkt<'_>, _st: &RouteState, cur: &mut Cursor) -> Step {
        let Some(dst) = dst_of(pkt) else { return Step::Ready };
        let p = match cur.step {
            0 => {
                cur.input = input_of(dst);
                if let Dst::V6(a) = dst {
                    cur.val = [(a >> 64) as u64, a as u64];
                }
                self.lpm.start(dst)
            }
            2 => return Step::Ready,
            _ => self.lpm.advance(load(cur, dst), dst),
        };
        store(cur, p);
        match self.lpm.slot(p, dst) {
            Some(e) if cur.step == 1 => Step::at(e),
            _ => Step::Ready,
        }
    }

    #[inline]
    fn finish(&mut self, pkt: &mut Pkt<'_>, st: &mut RouteState, cur: &Cursor, _ctx: &NfContext) -> Action {
        let hop = match dst_of(pkt) {
            None => 0,
            // The steps looked up this very address: resume (a swap lands between batches, never mid-lookup).
            Some(d) if cur.step != 0 && same_dst(cur, d) => {
                let mut p = load(cur, d);
                loop {
                    match p {
                        Probe::Done(h) => break h,
                        q => p = self.lpm.advance(q, d),
                    }
                }
            }
            Some(d) => self.lpm.lookup(d),
        };
        self.forward(hop, st)
    }

    /// A new table (and `miss`) from the parameters, swapped in whole; flow state and counters kept.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Route::from_params(p)?;
        (self.lpm, self.miss_drop) = (new.lpm, new.miss_drop);
        self.version += 1;
        Ok(())
    }

    fn on_unparsed(&mut self) -> Action {
        self.missed += 1;
        if self.miss_drop {
            Action::Drop
        } else {
            Action::Pass
        }
    }

    /// No state (flow table full): the packet is not routed, so it follows `miss`.
    fn passes_without_state(&self) -> bool {
        !self.miss_drop
    }

    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        if self.miss_drop {
            Action::Drop
        } else {
            Action::Pass
        }
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({
            "routes_v4": self.lpm.routes_v4,
            "routes_v6": self.lpm.routes_v6,
            "tbl8_groups": self.lpm.tbl8.len() / 256,
            "v6_nodes": self.lpm.v6.len() / 256,
            "version": self.version,
            "routed": self.routed,
            "missed": self.missed,
            "table_full": self.table_full,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        merge_keeping(into, other, &["routes_v4", "routes_v6", "tbl8_groups", "v6_nodes", "version"]);
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    fn export_row(&self, key: &FiveTuple, st: &RouteState) -> Option<serde_json::Value> {
        let dst: IpAddr = key.dst_ip();
        Some(json!({
            "src": key.src_ip().to_string(),
            "dst": dst.to_string(),
            "sport": key.src_port(),
            "dport": key.dst_port(),
            "port": st.hop.checked_sub(1),
            "packets": st.packets,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt::PktMeta;
    use crate::testutil::{udp4, Harness};
    use proptest::prelude::*;

    fn r(s: &str, port: u16) -> RouteEntry {
        entry(IpPrefix::parse(s).unwrap(), port)
    }

    /// The oracle: every route checked, the longest match wins (the last listed among equal prefixes).
    fn naive(routes: &[RouteEntry], dst: Dst) -> u32 {
        let (v6, bits, width) = match dst {
            Dst::V4(a) => (false, u128::from(a), 32),
            Dst::V6(a) => (true, a, 128),
        };
        let mut best: Option<(u8, u16)> = None;
        for x in routes.iter().filter(|x| x.v6 == v6) {
            let l = u32::from(x.len);
            let full = if v6 { u128::MAX } else { u128::from(u32::MAX) };
            let mask = if l == 0 { 0 } else { full & !((1u128 << (width - l)) - 1) };
            if bits & mask == x.net && best.is_none_or(|(bl, _)| x.len >= bl) {
                best = Some((x.len, x.port));
            }
        }
        best.map_or(0, |(_, p)| u32::from(p) + 1)
    }

    fn v4(s: &str) -> Dst {
        Dst::V4(u32::from(s.parse::<std::net::Ipv4Addr>().unwrap()))
    }

    fn v6(s: &str) -> Dst {
        Dst::V6(u128::from(s.parse::<std::net::Ipv6Addr>().unwrap()))
    }

    #[test]
    fn longest_prefix_wins_in_both_families() {
        let routes = [
            r("0.0.0.0/0", 9),
            r("10.0.0.0/8", 1),
            r("10.1.0.0/16", 2),
            r("10.1.2.0/24", 3),
            r("10.1.2.128/25", 4),
            r("10.1.2.200/32", 5),
            r("10.1.2.0/24", 6), // listed again: the last wins
            r("2001:db8::/32", 7),
            r("2001:db8:1::/48", 8),
            r("2001:db8:1:2::1/128", 10),
            r("::/0", 11),
        ];
        let lpm = Lpm::new(&routes).unwrap();
        for (d, want) in [
            (v4("11.0.0.1"), 9),
            (v4("10.9.9.9"), 1),
            (v4("10.1.9.9"), 2),
            (v4("10.1.2.3"), 6),
            (v4("10.1.2.129"), 4),
            (v4("10.1.2.200"), 5),
            (v4("10.1.2.201"), 4),
            (v6("2001:db8:9::1"), 7),
            (v6("2001:db8:1:2::1"), 10),
            (v6("2001:db8:1:2::2"), 8),
            (v6("fe80::1"), 11),
        ] {
            assert_eq!(lpm.lookup(d), want + 1, "{d:?}");
            assert_eq!(naive(&routes, d), want + 1, "oracle {d:?}");
        }
        let empty = Lpm::new(&[r("10.0.0.0/8", 1)]).unwrap();
        assert_eq!(empty.lookup(v4("11.0.0.0")), 0);
        assert_eq!(empty.lookup(v6("::1")), 0);
    }

    #[test]
    fn route_file_parsing_and_errors() {
        let rs = parse_routes("f", "# table\n10.0.0.0/8 1\n\n2001:db8::/32 4 # doc\n1.2.3.4 7\n").unwrap();
        assert_eq!(rs.len(), 3);
        assert_eq!(rs[2], r("1.2.3.4/32", 7));
        assert_eq!(parse_routes("f", "10.0.0.0/33 1").unwrap_err(), "f:1: bad prefix: '10.0.0.0/33 1'");
        assert!(parse_routes("f", "10.0.0.0/8").unwrap_err().contains("expected 'PREFIX/LEN PORT'"));
        assert!(parse_routes("f", "10.0.0.0/8 65535").unwrap_err().contains("0..=65534"));
        assert!(parse_routes("f", "10.0.0.0/8 1 2").is_err());
        let mut p = Params::new("route", vec![]);
        assert!(Route::from_params(&mut p).unwrap_err().0.contains("'routes=FILE' is required"));
        let mut p = Params::new("route", vec![("routes".into(), "/nonexistent/routes".into())]);
        assert!(Route::from_params(&mut p).unwrap_err().0.contains("cannot read route file"));
        let path = std::env::temp_dir().join(format!("fp-route-test-{}.txt", std::process::id()));
        std::fs::write(&path, "10.0.0.0/8 3\nbad\n").unwrap();
        let mut p = Params::new("route", vec![("routes".into(), path.display().to_string())]);
        let e = Route::from_params(&mut p).unwrap_err().0;
        assert!(e.contains(":2: expected"), "{e}");
        std::fs::write(&path, "10.0.0.0/8 3\n").unwrap();
        let mut p = Params::new("route", vec![("routes".into(), path.display().to_string())]);
        assert!(Route::from_params(&mut p).is_ok());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn packets_get_their_port_misses_follow_the_policy() {
        let routes = [r("192.168.0.0/16", 2), r("192.168.1.0/24", 3)];
        let mut h = Harness::new(Route::new(&routes, true).unwrap());
        let f = udp4([10, 0, 0, 1], [192, 168, 1, 9], 1000, 53);
        assert_eq!(h.run(&f).1, Action::Port(3));
        assert_eq!(h.run(&udp4([10, 0, 0, 1], [192, 168, 2, 9], 1000, 53)).1, Action::Port(2));
        assert_eq!(h.run(&udp4([10, 0, 0, 1], [8, 8, 8, 8], 1000, 53)).1, Action::Drop);
        assert_eq!(h.run(&[0u8; 7]).1, Action::Drop, "malformed: no destination");
        let st = h.state_of(&f).unwrap();
        assert_eq!((st.hop, st.packets), (4, 1));
        let rep = h.nf.report().unwrap();
        assert_eq!((rep["routed"].as_u64(), rep["missed"].as_u64()), (Some(2), Some(2)));
        let mut pass = Harness::new(Route::new(&routes, false).unwrap());
        assert_eq!(pass.run(&udp4([10, 0, 0, 1], [8, 8, 8, 8], 1000, 53)).1, Action::Pass);
    }

    /// `ctl load route FILE`: the new table routes every later packet, a flow keeps its state (its
    /// packet count goes on), `miss` changes with it; a bad file is refused naming its line and the
    /// old table stays.
    #[test]
    fn a_reloaded_table_routes_later_packets_and_keeps_flow_state() {
        let dir = std::env::temp_dir();
        let [old, new, bad] = [1, 2, 3].map(|i| dir.join(format!("fp-route-swap-{}-{i}.txt", std::process::id())));
        std::fs::write(&old, "10.0.0.0/8 1\n").unwrap();
        std::fs::write(&new, "10.0.0.0/8 2\n10.1.0.0/16 3\n").unwrap();
        std::fs::write(&bad, "10.0.0.0/8 2\n# fine so far\n10.1.0.0/16 port3\n").unwrap();
        let params = |f: &std::path::Path, miss: &str| {
            Params::new("route", vec![("routes".into(), f.display().to_string()), ("miss".into(), miss.into())])
        };
        let mut h = Harness::new(Route::from_params(&mut params(&old, "drop")).unwrap());
        let (a, b) = (udp4([1, 1, 1, 1], [10, 1, 2, 3], 1, 2), udp4([1, 1, 1, 1], [10, 9, 9, 9], 1, 2));
        let miss = udp4([1, 1, 1, 1], [8, 8, 8, 8], 1, 2);
        assert_eq!((h.run(&a).1, h.run(&b).1, h.run(&miss).1), (Action::Port(1), Action::Port(1), Action::Drop));
        h.nf.reconfigure(&mut params(&new, "pass")).unwrap();
        assert_eq!((h.run(&a).1, h.run(&b).1, h.run(&miss).1), (Action::Port(3), Action::Port(2), Action::Pass));
        let st = h.state_of(&a).unwrap();
        assert_eq!((st.hop, st.packets), (4, 2), "the flow's state goes on across the swap");
        let e = h.nf.reconfigure(&mut params(&bad, "drop")).unwrap_err().0;
        assert!(e.contains(&format!("{}:3: port must be 0..=65534", bad.display())), "{e}");
        assert_eq!((h.run(&a).1, h.run(&miss).1), (Action::Port(3), Action::Pass), "a refused file changes nothing");
        let rep = h.nf.report().unwrap();
        assert_eq!((rep["version"].as_u64(), rep["routed"].as_u64()), (Some(1), Some(5)), "{rep}");
        for f in [old, new, bad] {
            let _ = std::fs::remove_file(f);
        }
    }

    /// Steps then finish, stopping after any number of steps, give `process`'s answer.
    fn stepped(nf: &mut Route, frame: &mut [u8], stop: usize) -> (Action, usize) {
        let meta = PktMeta::parse(frame);
        let mut cur = Cursor::default();
        let mut named = 0;
        let st0 = RouteState::zeroed();
        while named < stop {
            match nf.step(&Pkt::new(frame, &meta), &st0, &mut cur) {
                Step::Prefetch(_) => named += 1,
                Step::Ready => break,
            }
        }
        let mut st = st0;
        (nf.finish(&mut Pkt::new(frame, &meta), &mut st, &cur, &NfContext::default()), named)
    }

    #[test]
    fn resumed_lookups_equal_whole_ones() {
        let routes = [r("10.0.0.0/8", 1), r("10.1.2.128/25", 4), r("2001:db8::/32", 7), r("2001:db8:1:2::/64", 8)];
        let mut nf = Route::new(&routes, true).unwrap();
        let mut a = udp4([1, 1, 1, 1], [10, 1, 2, 130], 1, 2);
        for stop in 0..4 {
            assert_eq!(stepped(&mut nf, &mut a, stop).0, Action::Port(4), "{stop}");
        }
        assert_eq!(stepped(&mut nf, &mut a, 9).1, 2, "tbl24 then tbl8");
        let mut b = udp4([1, 1, 1, 1], [10, 9, 9, 9], 1, 2);
        assert_eq!(stepped(&mut nf, &mut b, 9), (Action::Port(1), 1));
        // A cursor for another destination is not trusted.
        let meta = PktMeta::parse(&a);
        let mut cur = Cursor::default();
        while nf.step(&Pkt::new(&mut a, &meta), &RouteState::zeroed(), &mut cur) != Step::Ready {}
        let mb = PktMeta::parse(&b);
        let mut st = RouteState::zeroed();
        assert_eq!(nf.finish(&mut Pkt::new(&mut b, &mb), &mut st, &cur, &NfContext::default()), Action::Port(1));
    }

    fn arb_v4_routes() -> impl Strategy<Value = Vec<RouteEntry>> {
        // Lengths weighted towards the interesting ones: around /8, /16, /24 and past /24.
        let len = prop_oneof![0u8..=32, 20u8..=28, 23u8..=25, Just(32u8)];
        proptest::collection::vec((any::<u32>(), len, 0u16..=MAX_PORT), 0..60).prop_map(|v| {
            // Cluster the addresses so prefixes overlap.
            v.into_iter()
                .map(|(a, l, p)| {
                    let a = (a & 0x0303_ffff) | 0x0a00_0000;
                    entry(IpPrefix::new(IpAddr::V4(a.into()), l).unwrap(), p)
                })
                .collect()
        })
    }

    fn arb_v6_routes() -> impl Strategy<Value = Vec<RouteEntry>> {
        let len = prop_oneof![0u8..=128, 30u8..=66, Just(128u8)];
        proptest::collection::vec((any::<u128>(), len, 0u16..=MAX_PORT), 0..30).prop_map(|v| {
            v.into_iter()
                .map(|(a, l, p)| {
                    let a = (a & 0x0000_0003_0000_00ff_0000_0000_0000_000f) | (0x2001_0db8u128 << 96);
                    entry(IpPrefix::new(IpAddr::V6(a.into()), l).unwrap(), p)
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn dir_24_8_matches_the_naive_oracle(routes in arb_v4_routes(), probes in proptest::collection::vec(any::<(u32, u32)>(), 64)) {
            let lpm = Lpm::new(&routes).unwrap();
            for (i, (x, y)) in probes.into_iter().enumerate() {
                // Half the probes inside a route (host bits random), half anywhere nearby.
                let a = match routes.get(i % (routes.len().max(1))) {
                    Some(rt) if i % 2 == 0 => {
                        let host = match rt.len { 0 => u32::MAX, 32.. => 0, l => u32::MAX >> l };
                        (rt.net as u32) | (x & host)
                    }
                    _ => (y & 0x0303_ffff) | 0x0a00_0000,
                };
                prop_assert_eq!(lpm.lookup(Dst::V4(a)), naive(&routes, Dst::V4(a)), "{:x}", a);
            }
        }

        #[test]
        fn trie_matches_the_naive_oracle(routes in arb_v6_routes(), probes in proptest::collection::vec(any::<(u128, u128)>(), 64)) {
            let lpm = Lpm::new(&routes).unwrap();
            for (i, (x, y)) in probes.into_iter().enumerate() {
                let a = match routes.get(i % (routes.len().max(1))) {
                    Some(rt) if i % 2 == 0 => {
                        let host = if rt.len == 0 { u128::MAX } else if rt.len >= 128 { 0 } else { u128::MAX >> rt.len };
                        rt.net | (x & host)
                    }
                    _ => (y & 0x0000_0003_0000_00ff_0000_0000_0000_000f) | (0x2001_0db8u128 << 96),
                };
                prop_assert_eq!(lpm.lookup(Dst::V6(a)), naive(&routes, Dst::V6(a)), "{:x}", a);
            }
        }
    }
}

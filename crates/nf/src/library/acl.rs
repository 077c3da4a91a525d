//! `acl`: stateful access control list (FAJITA A.1). Ordered rules match on
//! protocol, source/destination prefixes (IPv4 or IPv6 CIDR) and
//! source/destination port ranges; the first matching rule decides
//! allow/drop, the `default` parameter decides when none matches.
//!
//! The rules are evaluated once per flow, at the flow's first packet that
//! reaches the ACL; the flow's state is a single integer (the matched rule
//! and its verdict), so every later packet costs one state read. Under the
//! interleaved executor the rule walk is resumable: [`RULES_PER_STEP`] rules
//! per step, prefetching the next rules while other packets run. This module owns the rule
//! language (file and inline forms), rule evaluation and per-rule counters.
//!
//! Rule file (`rules=FILE`), one rule per line, `#` starts a comment:
//! `allow|drop [proto tcp|udp|icmp|any|N] [src CIDR|any] [dst CIDR|any] [sport N[-M]] [dport N[-M]]`.
//! Inline (`rule=...`, chain specs allow no spaces): `;`-separated rules, each
//! `ACTION[:PROTO[:SRC[:DST[:SPORT[:DPORT]]]]]` with `any` for a wildcard and
//! IPv6 prefixes in brackets, e.g. `drop:udp:10.0.0.0/8:any:any:53;drop:any:[2001:db8::]/32`.
//! File rules come first, then inline ones.
//!
//! The rules can be replaced while the ACL runs (`flowplane ctl load acl
//! FILE`, `set acl rule ...`): the swap lands between two batches, so a batch
//! is judged by one rule set, and a flow's cached verdict carries the rule
//! set's version: the next packet of a flow decided under an older set walks
//! the new rules again (its state kept). Per-rule counters start over with
//! the new set. Versions are [`VERSION_BITS`] bits: a flow idle across a
//! multiple of 4096 swaps would keep its old verdict.
//!
//! Packets without a flow key (non-IP, malformed) get the default verdict
//! (`unparsed`); a packet with a key but no state because the flow table is
//! full is dropped whatever the rules say (`table_full`): an access list
//! fails closed.
//!
//! Matching conventions: `icmp` matches ICMP and ICMPv6; a prefix only
//! matches addresses of its own family; a rule with a port range only matches
//! TCP and UDP packets that carry ports (not ICMP, not a non-first fragment
//! without its first fragment's ports: the engine gives a later fragment the
//! key of its datagram's first fragment, so it matches as that one did).

use bytemuck::{Pod, Zeroable};
use flowplane_wire::ipv4::IpProtocol;
use flowplane_wire::prefix::{ip_bits, IpPrefix, PortRange};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, merge_rows};
use crate::stateful::{Action, Affinity, Cursor, GlobalState, Granularity, Placement, StatefulNf, Step};
use crate::{NfContext, ParamError, ParamSpec, Params};

const RULES: ParamSpec = ParamSpec::text(
    "rules",
    "",
    "FILE",
    "rule file: 'allow|drop [proto tcp|udp|icmp|any|N] [src CIDR] [dst CIDR] [sport N[-M]] [dport N[-M]]' per line, # comments",
).live();
const RULE: ParamSpec = ParamSpec::text(
    "rule",
    "",
    "RULES",
    "inline rules 'action:proto:src:dst:sport:dport' (trailing fields optional, any = wildcard, IPv6 as [2001:db8::]/32) separated by ';', after the file's",
).live();
const DEFAULT: ParamSpec =
    ParamSpec::choice("default", "allow", &["allow", "drop"], "verdict when no rule matches, and for non-IP packets")
        .live();

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "acl",
    about:
        "stateful ACL: ordered rules (proto, v4/v6 prefixes, port ranges), first match wins, verdict cached per flow",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[RULES, RULE, DEFAULT],
};

/// Builds `acl` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Acl::from_params(p)?))
}

/// Most rules an ACL accepts (evaluation is a linear scan per new flow).
pub const MAX_RULES: usize = 100_000;

/// Bit of [`AclState::verdict`] set when the flow is dropped.
pub const DROP_BIT: u32 = 1 << 31;
/// Set once the flow has been counted in its rule's flows.
const COUNTED_BIT: u32 = 1 << 30;
/// Set once the rules have been evaluated for the flow (a zeroed state has not been).
const DECIDED_BIT: u32 = 1 << 29;
/// Bits of the rule index (at least [`MAX_RULES`] + 1 values).
const RULE_BITS: u32 = 17;
/// Bits of the rule set's version a decided state carries (above the rule index).
pub const VERSION_BITS: u32 = 12;
const VERSION_MASK: u32 = (1 << VERSION_BITS) - 1;
const _: () = assert!(MAX_RULES < 1 << RULE_BITS && RULE_BITS + VERSION_BITS <= 29);
/// Rules a step of the resumable rule walk evaluates before yielding.
pub const RULES_PER_STEP: usize = 8;

/// Per-flow state: one integer, the index of the rule that matched (the
/// rule count for the default action) with [`DROP_BIT`] set for a drop.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct AclState {
    /// Rule index | drop bit | counted bit | decided bit.
    pub verdict: u32,
}

impl AclState {
    /// True if the flow's packets are dropped.
    pub fn drops(&self) -> bool {
        self.verdict & DROP_BIT != 0
    }

    /// Index of the deciding rule (the rule count means the default action).
    pub fn rule(&self) -> usize {
        (self.verdict & ((1 << RULE_BITS) - 1)) as usize
    }

    /// The version of the rule set that decided the flow.
    pub fn version(&self) -> u32 {
        (self.verdict >> RULE_BITS) & VERSION_MASK
    }

    /// True once the rules have been evaluated for the flow.
    pub fn decided(&self) -> bool {
        self.verdict & DECIDED_BIT != 0
    }
}

/// Which protocols a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProtoMatch {
    Any,
    /// ICMP or ICMPv6.
    Icmp,
    Num(u8),
}

/// One ACL rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    drop: bool,
    proto: ProtoMatch,
    src: Option<IpPrefix>,
    dst: Option<IpPrefix>,
    sport: Option<PortRange>,
    dport: Option<PortRange>,
    /// Where the rule came from (`FILE:LINE` or `rule#N`), for the report.
    origin: String,
}

/// The facts a rule looks at, extracted once per flow.
struct FlowFacts {
    v6: bool,
    proto: u8,
    src: u128,
    dst: u128,
    /// Ports, when the packet is TCP/UDP with its L4 header.
    ports: Option<(u16, u16)>,
}

impl Rule {
    fn matches(&self, f: &FlowFacts) -> bool {
        let proto_ok = match self.proto {
            ProtoMatch::Any => true,
            ProtoMatch::Icmp => f.proto == IpProtocol::ICMP.0 || f.proto == IpProtocol::ICMPV6.0,
            ProtoMatch::Num(p) => f.proto == p,
        };
        let in_range = |r: Option<PortRange>, p: Option<u16>| match (r, p) {
            (None, _) => true,
            (Some(r), Some(p)) => r.contains(p),
            (Some(_), None) => false,
        };
        proto_ok
            && self.src.is_none_or(|c| c.contains_bits(f.v6, f.src))
            && self.dst.is_none_or(|c| c.contains_bits(f.v6, f.dst))
            && in_range(self.sport, f.ports.map(|p| p.0))
            && in_range(self.dport, f.ports.map(|p| p.1))
    }
}

fn parse_action(tok: &str) -> Result<bool, String> {
    match tok {
        "allow" => Ok(false),
        "drop" => Ok(true),
        _ => Err(format!("bad action '{tok}' (expected allow or drop)")),
    }
}

fn parse_proto(tok: &str) -> Result<ProtoMatch, String> {
    match tok {
        "any" => Ok(ProtoMatch::Any),
        "tcp" => Ok(ProtoMatch::Num(IpProtocol::TCP.0)),
        "udp" => Ok(ProtoMatch::Num(IpProtocol::UDP.0)),
        "icmp" => Ok(ProtoMatch::Icmp),
        _ => tok
            .parse::<u8>()
            .map(ProtoMatch::Num)
            .map_err(|_| format!("bad protocol '{tok}' (expected tcp, udp, icmp, any or 0-255)")),
    }
}

fn parse_cidr(tok: &str) -> Result<Option<IpPrefix>, String> {
    if tok == "any" {
        return Ok(None);
    }
    // Inline rules bracket IPv6 addresses: `[2001:db8::]/32`.
    let unbracketed;
    let s = match tok.strip_prefix('[').and_then(|r| r.split_once(']')) {
        Some((a, rest)) => {
            unbracketed = format!("{a}{rest}");
            unbracketed.as_str()
        }
        None => tok,
    };
    IpPrefix::parse(s).map(Some).ok_or_else(|| format!("bad prefix '{tok}' (expected CIDR like 10.0.0.0/8 or any)"))
}

fn parse_ports(tok: &str) -> Result<Option<PortRange>, String> {
    if tok == "any" {
        return Ok(None);
    }
    PortRange::parse(tok)
        .map(Some)
        .ok_or_else(|| format!("bad port range '{tok}' (expected N or N-M with N <= M <= 65535)"))
}

/// Parses one file-form rule (`allow|drop [KEY VALUE]...`).
fn parse_line(line: &str, origin: String) -> Result<Rule, String> {
    let mut toks = line.split_whitespace();
    let first = toks.next().ok_or_else(|| "empty rule".to_string())?;
    let mut r = Rule {
        drop: parse_action(first)?,
        proto: ProtoMatch::Any,
        src: None,
        dst: None,
        sport: None,
        dport: None,
        origin,
    };
    let mut seen = [false; 5];
    while let Some(key) = toks.next() {
        let slot = match key {
            "proto" => 0,
            "src" => 1,
            "dst" => 2,
            "sport" => 3,
            "dport" => 4,
            _ => return Err(format!("bad token '{key}' (expected proto, src, dst, sport or dport)")),
        };
        if seen[slot] {
            return Err(format!("repeated token '{key}'"));
        }
        seen[slot] = true;
        let val = toks.next().ok_or_else(|| format!("token '{key}' needs a value"))?;
        match slot {
            0 => r.proto = parse_proto(val)?,
            1 => r.src = parse_cidr(val)?,
            2 => r.dst = parse_cidr(val)?,
            3 => r.sport = parse_ports(val)?,
            _ => r.dport = parse_ports(val)?,
        }
    }
    Ok(r)
}

/// Splits an inline rule on `:` outside brackets.
fn split_inline(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ':' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Parses one inline rule (`ACTION[:PROTO[:SRC[:DST[:SPORT[:DPORT]]]]]`).
fn parse_inline(s: &str, origin: String) -> Result<Rule, String> {
    let f = split_inline(s);
    if f.len() > 6 {
        return Err(format!("rule '{s}' has {} fields (at most 6: action:proto:src:dst:sport:dport)", f.len()));
    }
    let field = |i: usize| f.get(i).copied().unwrap_or("any");
    Ok(Rule {
        drop: parse_action(field(0))?,
        proto: parse_proto(field(1))?,
        src: parse_cidr(field(2))?,
        dst: parse_cidr(field(3))?,
        sport: parse_ports(field(4))?,
        dport: parse_ports(field(5))?,
        origin,
    })
}

/// Parses a rule file's text; errors name `name`, the line and the token.
pub fn parse_rules(name: &str, text: &str) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let rule = parse_line(line, format!("{name}:{}", i + 1)).map_err(|e| format!("{name}:{}: {e}", i + 1))?;
        rules.push(rule);
    }
    Ok(rules)
}

/// The stateful ACL.
#[derive(Debug)]
pub struct Acl {
    rules: Vec<Rule>,
    default_drop: bool,
    /// Flows decided per rule; the last slot is the default action.
    flows: Vec<u64>,
    /// Packets per rule (same indexing).
    packets: Vec<u64>,
    unparsed: u64,
    table_full: u64,
    /// The rule set's version (bumped by each swap; see the module doc).
    version: u32,
}

impl Acl {
    /// `acl(rules=FILE, rule=INLINE, default=allow|drop)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let err = |m: String| ParamError(format!("acl: {m}"));
        let default_drop = p.choice(&DEFAULT, [false, true])?;
        let mut rules = Vec::new();
        let file = p.text(&RULES)?;
        if !file.is_empty() {
            let text = crate::read_text_file(&file)
                .map_err(|e| err(format!("parameter 'rules={file}': cannot read rules file: {e}")))?;
            rules = parse_rules(&file, &text).map_err(|e| err(format!("rules file {e}")))?;
        }
        let inline = p.text(&RULE)?;
        for (i, r) in inline.split(';').filter(|r| !r.is_empty()).enumerate() {
            let rule = parse_inline(r, format!("rule#{}", i + 1)).map_err(|e| err(format!("parameter 'rule': {e}")))?;
            rules.push(rule);
        }
        if rules.len() > MAX_RULES {
            return Err(err(format!("{} rules exceed the limit of {MAX_RULES}", rules.len())));
        }
        Ok(Acl::new(rules, default_drop))
    }

    /// An ACL over `rules` (at most [`MAX_RULES`]; extra rules are ignored)
    /// with the given default verdict.
    pub fn new(mut rules: Vec<Rule>, default_drop: bool) -> Self {
        rules.truncate(MAX_RULES);
        let n = rules.len() + 1;
        Acl { rules, default_drop, flows: vec![0; n], packets: vec![0; n], unparsed: 0, table_full: 0, version: 0 }
    }

    /// The facts the rules look at, from the flow's packet.
    fn facts(pkt: &Pkt<'_>) -> FlowFacts {
        let t = pkt.tuple();
        let m = pkt.meta();
        // A later fragment the engine attributed to its first fragment (`l4 == 0`, no flag) carries that
        // fragment's ports in its key.
        let has_ports = matches!(m.proto, IpProtocol::TCP | IpProtocol::UDP) && !t.is_non_first_fragment();
        FlowFacts {
            v6: !t.is_ipv4(),
            proto: t.proto(),
            src: ip_bits(t.src_ip()),
            dst: ip_bits(t.dst_ip()),
            ports: has_ports.then(|| (t.src_port(), t.dst_port())),
        }
    }

    /// The decided state for rule `idx` (the rule count: the default action).
    fn verdict_of(&self, idx: usize) -> AclState {
        let drop = self.rules.get(idx).map_or(self.default_drop, |r| r.drop);
        AclState { verdict: idx as u32 | self.version << RULE_BITS | DECIDED_BIT | if drop { DROP_BIT } else { 0 } }
    }

    /// Evaluates the rules for a flow: first match wins.
    fn decide(&self, pkt: &Pkt<'_>) -> AclState {
        let facts = Self::facts(pkt);
        self.verdict_of(self.rules.iter().position(|r| r.matches(&facts)).unwrap_or(self.rules.len()))
    }

    /// True if the flow was decided by the rule set in force.
    #[inline]
    fn current(&self, st: &AclState) -> bool {
        st.decided() && st.version() == self.version
    }

    /// Counts the packet (and, at its first, the flow) against its deciding rule.
    #[inline]
    fn account(&mut self, st: &mut AclState) -> Action {
        if let Some(c) = self.packets.get_mut(st.rule()) {
            // A rule's flows are counted at their first packet that reaches acl (a drop upstream in
            // the chain can follow the flow's insertion).
            if st.verdict & COUNTED_BIT == 0 {
                st.verdict |= COUNTED_BIT;
                if let Some(f) = self.flows.get_mut(st.rule()) {
                    *f += 1;
                }
            }
            *c += 1;
        }
        if st.drops() {
            Action::Drop
        } else {
            Action::Pass
        }
    }
}

impl StatefulNf for Acl {
    type State = AclState;
    const HAS_PREFETCH: bool = true;
    const STEPS: bool = true;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// Per-flow state whose updates commute (the verdict is a function of the flow's first packet; counters add up): correct from any
    /// core, so `shared` may spray a flow's packets over cores (its state then
    /// lives in a shared table, updated under the entry's lock).
    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Any, global: GlobalState::None }
    }

    /// Undecided: the rules are walked at the flow's first packet that reaches
    /// the ACL (`process`, or step by step under the interleaved executor).
    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> AclState {
        AclState { verdict: 0 }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut AclState, _ctx: &NfContext) -> Action {
        if !self.current(st) {
            *st = self.decide(pkt);
        }
        self.account(st)
    }

    /// An undecided flow walks the rules, [`RULES_PER_STEP`] per step, each
    /// step prefetching the next rules (`cur.pos`: the next rule); the step
    /// that ends the walk leaves the decided state in `cur.val[0]` and names
    /// the deciding rule's counter. A decided flow: one step for the counter.
    /// (`cur.val[1]`: 2 once the counter has been named.)
    fn step(&self, pkt: &Pkt<'_>, st: &AclState, cur: &mut Cursor) -> Step {
        cur.step += 1;
        let rule = if self.current(st) {
            st.rule()
        } else if cur.val[1] != 0 {
            AclState { verdict: cur.val[0] as u32 }.rule()
        } else {
            let facts = Self::facts(pkt);
            let (from, n) = (cur.pos as usize, self.rules.len());
            let to = (from + RULES_PER_STEP).min(n);
            match self.rules[from.min(n)..to].iter().position(|r| r.matches(&facts)) {
                Some(i) => (cur.val[0], cur.val[1]) = (u64::from(self.verdict_of(from + i).verdict), 2),
                None if to == n => (cur.val[0], cur.val[1]) = (u64::from(self.verdict_of(n).verdict), 2),
                None => {
                    cur.pos = to as u32;
                    let next = &self.rules[to..(to + RULES_PER_STEP).min(n)];
                    for r in next.iter().skip(1) {
                        flowplane_packet::prefetch::read(r);
                    }
                    return Step::at(&next[0]);
                }
            }
            // The walk ended: its deciding rule's counter next.
            return self.packets.get(AclState { verdict: cur.val[0] as u32 }.rule()).map_or(Step::Ready, Step::at);
        };
        match self.packets.get(rule) {
            Some(c) if cur.val[1] != 2 => {
                cur.val[1] = 2;
                Step::at(c)
            }
            _ => Step::Ready,
        }
    }

    /// `process`, with the rule walk's result from the cursor when it completed.
    fn finish(&mut self, pkt: &mut Pkt<'_>, st: &mut AclState, cur: &Cursor, _ctx: &NfContext) -> Action {
        if !self.current(st) {
            // The walk's result, when it completed (a decided state always has DECIDED_BIT).
            let walked = AclState { verdict: cur.val[0] as u32 };
            *st = if self.current(&walked) { walked } else { self.decide(pkt) };
        }
        self.account(st)
    }

    /// A new rule set (file, inline rules, default) between two batches:
    /// flows decided under the old one are judged again at their next packet.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Acl::from_params(p)?;
        let version = (self.version + 1) & VERSION_MASK;
        *self = Acl { unparsed: self.unparsed, table_full: self.table_full, version, ..new };
        Ok(())
    }

    fn prefetch(&self, st: &AclState) {
        if let Some(c) = self.packets.get(st.rule()) {
            flowplane_packet::prefetch::read(c);
        }
    }

    /// Packets without a flow key (non-IP, malformed) get the default verdict.
    fn on_unparsed(&mut self) -> Action {
        self.unparsed += 1;
        if self.default_drop {
            Action::Drop
        } else {
            Action::Pass
        }
    }

    /// An ACL fails closed: a flow whose verdict cannot be kept is not let in.
    fn passes_without_state(&self) -> bool {
        false
    }

    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Drop
    }

    fn report(&self) -> Option<serde_json::Value> {
        let verdict = |d: bool| if d { "drop" } else { "allow" };
        let n = self.rules.len();
        let rules: Vec<_> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                json!({
                    "rule": i + 1,
                    "origin": r.origin,
                    "action": verdict(r.drop),
                    "flows": self.flows[i],
                    "packets": self.packets[i],
                })
            })
            .collect();
        Some(json!({
            "rules": n,
            "version": self.version,
            "default": verdict(self.default_drop),
            "default_flows": self.flows[n],
            "default_packets": self.packets[n],
            "unparsed": self.unparsed,
            "table_full": self.table_full,
            "per_rule": rules,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Every core has the same rules: per-rule counters add up rule by rule.
        merge_keeping(into, other, &["rules", "version", "default", "per_rule"]);
        if let (Some(mine), Some(theirs)) = (into.get_mut("per_rule"), other.get("per_rule")) {
            merge_rows(mine, theirs, &["rule", "origin", "action"]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ipv4_frame, tcp4, udp4, Harness};
    use flowplane_wire::frame::PktMeta;

    fn acl(inline: &str, default: &str) -> Result<Acl, ParamError> {
        let mut p = Params::new("acl", vec![("rule".into(), inline.into()), ("default".into(), default.into())]);
        let a = Acl::from_params(&mut p)?;
        p.finish()?;
        Ok(a)
    }

    /// Ethernet + IPv6 + UDP (checksums not needed by the ACL).
    fn udp6(src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&8u16.to_be_bytes());
        f[20] = 17;
        f[21] = 64;
        f[22..38].copy_from_slice(&src);
        f[38..54].copy_from_slice(&dst);
        f[54..56].copy_from_slice(&sport.to_be_bytes());
        f[56..58].copy_from_slice(&dport.to_be_bytes());
        f[58..60].copy_from_slice(&8u16.to_be_bytes());
        f
    }

    #[test]
    fn first_match_wins_and_default_applies() {
        let a = acl("allow:udp:10.1.0.0/16:any:any:53;drop:udp:10.0.0.0/8:any:any:53", "allow").unwrap();
        let mut h = Harness::new(a);
        // 10.1.x.x to port 53: rule 1 allows before rule 2 could drop.
        assert_eq!(h.run(&udp4([10, 1, 2, 3], [8, 8, 8, 8], 999, 53)).1, Action::Pass);
        // 10.2.x.x to port 53: rule 2 drops.
        assert_eq!(h.run(&udp4([10, 2, 2, 3], [8, 8, 8, 8], 999, 53)).1, Action::Drop);
        // Other port or TCP: default.
        assert_eq!(h.run(&udp4([10, 2, 2, 3], [8, 8, 8, 8], 999, 54)).1, Action::Pass);
        assert_eq!(h.run(&tcp4([10, 2, 2, 3], [8, 8, 8, 8], 999, 53, 0x02, 1, 0)).1, Action::Pass);
        let r = h.nf.report().unwrap();
        assert_eq!(r["per_rule"][0]["packets"], 1);
        assert_eq!(r["per_rule"][1]["packets"], 1);
        assert_eq!(r["default_flows"], 2);
    }

    #[test]
    fn verdict_cached_per_flow_and_counted_per_packet() {
        let mut h = Harness::new(acl("drop:tcp:any:192.168.0.0/24:any:1000-2000", "allow").unwrap());
        let f = tcp4([1, 1, 1, 1], [192, 168, 0, 7], 5555, 1500, 0x10, 1, 1);
        for _ in 0..5 {
            let (out, act) = h.run(&f);
            assert_eq!(act, Action::Drop);
            assert_eq!(out, f, "the ACL never rewrites");
        }
        let st = h.state_of(&f).unwrap();
        assert!(st.drops());
        assert_eq!(st.rule(), 0);
        let r = h.nf.report().unwrap();
        assert_eq!(r["per_rule"][0]["flows"], 1);
        assert_eq!(r["per_rule"][0]["packets"], 5);
        // Range edges.
        assert_eq!(h.run(&tcp4([1, 1, 1, 1], [192, 168, 0, 7], 5555, 2000, 0x10, 1, 1)).1, Action::Drop);
        assert_eq!(h.run(&tcp4([1, 1, 1, 1], [192, 168, 0, 7], 5555, 2001, 0x10, 1, 1)).1, Action::Pass);
        assert_eq!(h.run(&tcp4([1, 1, 1, 1], [192, 168, 1, 7], 5555, 1500, 0x10, 1, 1)).1, Action::Pass);
    }

    /// Steps then finish, stopping after any number of steps, give `process`'s answer and state.
    fn stepped(nf: &mut Acl, frame: &mut [u8], stop: usize) -> (Action, AclState, usize) {
        let meta = PktMeta::parse(frame);
        let mut cur = Cursor::default();
        let mut named = 0;
        let st0 = AclState { verdict: 0 };
        while named < stop {
            match nf.step(&Pkt::new(frame, &meta), &st0, &mut cur) {
                Step::Prefetch(_) => named += 1,
                Step::Ready => break,
            }
        }
        let mut st = st0;
        (nf.finish(&mut Pkt::new(frame, &meta), &mut st, &cur, &NfContext::default()), st, named)
    }

    #[test]
    fn resumed_rule_walks_equal_whole_ones() {
        // 50 rules; the flow matches rule 37 (0-based), six steps into the walk.
        let inline: Vec<String> = (0..50).map(|i| format!("drop:udp:any:10.0.{i}.0/24")).collect();
        let mut whole = acl(&inline.join(";"), "allow").unwrap();
        let mut f = udp4([1, 1, 1, 1], [10, 0, 37, 9], 1000, 53);
        let meta = PktMeta::parse(&f);
        let mut st = whole.init(&Pkt::new(&mut f, &meta), &NfContext::default());
        assert!(!st.decided(), "decided at the first packet, not at insertion");
        assert_eq!(whole.process(&mut Pkt::new(&mut f, &meta), &mut st, &NfContext::default()), Action::Drop);
        assert_eq!(st.rule(), 37);
        for stop in [0, 1, 2, 4, 5, 6, 7, 100] {
            let mut nf = acl(&inline.join(";"), "allow").unwrap();
            let (a, s, _) = stepped(&mut nf, &mut f, stop);
            assert_eq!((a, s), (Action::Drop, st), "stopped after {stop} steps");
            assert_eq!(nf.report().unwrap()["per_rule"][37]["flows"], 1);
        }
        // The whole walk: 37 / 8 = 4 yields for the next rules, then the counter.
        let mut nf = acl(&inline.join(";"), "allow").unwrap();
        assert_eq!(stepped(&mut nf, &mut f, 100).2, 5);
        // No rule matches: the default, after walking every rule.
        let mut g = udp4([1, 1, 1, 1], [10, 1, 0, 9], 1000, 53);
        let (a, s, named) = stepped(&mut nf, &mut g, 100);
        assert_eq!((a, s.rule(), named), (Action::Pass, 50, 7));
    }

    #[test]
    fn default_drop_and_sport() {
        let mut h = Harness::new(acl("allow:any:any:any:1024-65535", "drop").unwrap());
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 40000, 80)).1, Action::Pass);
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 53, 80)).1, Action::Drop);
        // ICMP has no ports: a port rule cannot match it, the default drops it.
        let icmp = ipv4_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, &[8, 0, 0, 0, 0, 1, 0, 1]);
        assert_eq!(h.run(&icmp).1, Action::Drop);
        // Non-IP and truncated frames get the default verdict.
        for len in [0usize, 10, 20, 33] {
            assert_eq!(h.run(&vec![0u8; len]).1, Action::Drop);
        }
        assert_eq!(h.nf.report().unwrap()["unparsed"], 4);
    }

    #[test]
    fn icmp_and_protocol_numbers() {
        let mut h = Harness::new(acl("drop:icmp;drop:47", "allow").unwrap());
        let icmp = ipv4_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, &[8, 0, 0, 0, 0, 1, 0, 1]);
        assert_eq!(h.run(&icmp).1, Action::Drop);
        let gre = ipv4_frame([1, 1, 1, 1], [2, 2, 2, 2], 47, &[0u8; 8]);
        assert_eq!(h.run(&gre).1, Action::Drop);
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)).1, Action::Pass);
    }

    #[test]
    fn ipv6_prefixes_match_their_family_only() {
        let mut h = Harness::new(acl("drop:any:[2001:db8::]/32;drop:any:0.0.0.0/0:any:any:9", "allow").unwrap());
        let mut inside = [0u8; 16];
        inside[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        inside[15] = 1;
        let mut outside = inside;
        outside[3] = 0xb9;
        let dst = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(h.run(&udp6(inside, dst, 1, 2)).1, Action::Drop);
        assert_eq!(h.run(&udp6(outside, dst, 1, 2)).1, Action::Pass);
        // 0.0.0.0/0 is an IPv4 prefix: it does not match IPv6 to port 9.
        assert_eq!(h.run(&udp6(outside, dst, 1, 9)).1, Action::Pass);
        assert_eq!(h.run(&udp4([3, 3, 3, 3], [4, 4, 4, 4], 1, 9)).1, Action::Drop);
    }

    #[test]
    fn prefix_parsing() {
        let c = |s: &str| parse_cidr(s).unwrap();
        assert_eq!(c("10.1.2.3/8"), c("10.0.0.0/8"));
        let all4 = c("0.0.0.0/0").unwrap();
        assert!(all4.contains_bits(false, 0xffff_ffff) && !all4.contains_bits(true, 0));
        let h = c("1.2.3.4").unwrap();
        assert!(h.contains_bits(false, 0x0102_0304) && !h.contains_bits(false, 0x0102_0305));
        assert!(c("::/0").unwrap().contains_bits(true, u128::MAX));
        assert!(c("[2001:db8::]/32").unwrap().is_ipv6() && c("any").is_none());
        assert!(c("ffff::/128").is_some());
        for bad in ["10.0.0.0/33", "::/129", "10.0.0/8", "x", "", "10.0.0.0/", "10.0.0.0/-1"] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rule_file_and_errors_name_line_and_token() {
        let text = "# header\n\nallow proto tcp src 10.0.0.0/8 dport 22 # ssh\ndrop proto any dst 2001:db8::/32\n";
        let rules = parse_rules("r.acl", text).unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].dport, Some(PortRange { lo: 22, hi: 22 }));
        assert_eq!(rules[0].origin, "r.acl:3");
        assert!(rules[1].dst.unwrap().is_ipv6());
        let cases = [
            ("allow\nreject proto tcp\n", "r.acl:2: bad action 'reject'"),
            ("allow proto sctp\n", "bad protocol 'sctp'"),
            ("allow src 10.0.0.0/40\n", "bad prefix '10.0.0.0/40'"),
            ("allow dport 20-10\n", "bad port range '20-10'"),
            ("allow dport 70000\n", "bad port range '70000'"),
            ("allow sport\n", "token 'sport' needs a value"),
            ("allow dst 1.1.1.1 dst 2.2.2.2\n", "repeated token 'dst'"),
            ("allow from 1.1.1.1\n", "bad token 'from'"),
        ];
        for (text, want) in cases {
            let e = parse_rules("r.acl", text).unwrap_err();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }

    #[test]
    fn params_from_file_and_errors() {
        let path = std::env::temp_dir().join(format!("flowplane-acl-test-{}.rules", std::process::id()));
        std::fs::write(&path, "drop proto udp dport 53\nallow\n").unwrap();
        let file = path.to_string_lossy().to_string();
        let mut p = Params::new("acl", vec![("rules".into(), file.clone()), ("rule".into(), "drop".into())]);
        let a = Acl::from_params(&mut p).unwrap();
        assert_eq!(a.rules.len(), 3);
        let mut h = Harness::new(a);
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 53)).1, Action::Drop);
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 54)).1, Action::Pass);
        std::fs::write(&path, "allow\ndrop proto udp dport x53\n").unwrap();
        let mut p = Params::new("acl", vec![("rules".into(), file.clone())]);
        let e = Acl::from_params(&mut p).unwrap_err().0;
        assert!(e.starts_with("acl: rules file ") && e.contains(":2: bad port range 'x53'"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let mut p = Params::new("acl", vec![("rules".into(), file.clone())]);
        assert!(Acl::from_params(&mut p).unwrap_err().0.contains("cannot read rules file"));
        assert!(acl("drop", "maybe").unwrap_err().0.contains("'default=maybe'"));
        assert!(acl("drop:udp:1.1.1.1:any:any:53:7", "allow").unwrap_err().0.contains("at most 6"));
        assert!(acl("permit", "allow").unwrap_err().0.contains("bad action 'permit'"));
        // No rules at all: everything gets the default.
        let mut h = Harness::new(acl("", "drop").unwrap());
        assert_eq!(h.run(&udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)).1, Action::Drop);
    }
}

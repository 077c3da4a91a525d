//! Declared state placement checked against a multi-core strategy: from the
//! chain's NFs' [`Placement`]s, the NIC programming that keeps every NF
//! correct (symmetric key, hash on one address, ICMP errors with their
//! flow, flow-director rules and per-core port shares for port pools), or a
//! one-line refusal naming the NF and why.

use flowplane_nf::stateful::Granularity;
use flowplane_nf::{Affinity, GlobalState, Placement};
use flowplane_scale::steer::{FdirRule, HashOn};
use flowplane_scale::strategy::{Delivery, Strategy};

use crate::chain::{Chain, Stage};
use crate::error::EngineError;
use crate::spec::ChainSpec;

/// How the NIC is programmed and the chain adapted for a strategy.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Symmetric Toeplitz key.
    pub symmetric: bool,
    /// What the hash covers.
    pub hash_on: HashOn,
    /// ICMP errors steered by the flow they quote.
    pub icmp_inner: bool,
    /// Flow-director rules (before the RETA).
    pub rules: Vec<FdirRule>,
    /// Per core: parameter overrides (NF index in the spec, parameter, value).
    pub overrides: Vec<Vec<(usize, String, String)>>,
    /// Why the steering is what it is (for the report), e.g. "fw needs both directions".
    pub notes: Vec<String>,
    /// NFs whose per-packet order is not guaranteed by the strategy (reported).
    pub unordered: Vec<String>,
    /// The 5-tuple NFs' state lives in shared tables (packets of a flow are sprayed over cores).
    pub shared_flows: bool,
}

fn refuse(strategy: &str, msg: String) -> EngineError {
    EngineError::Config(format!("--scale {strategy}: {msg}"))
}

/// The placements of the chain's stateful NFs and of the stateless elements
/// that declare one (amf's private UE table): (spec index, name, placement).
/// A graph's NFs count in the spec's flat order (every segment's).
fn placements(chain: &Chain) -> Vec<(usize, &'static str, Placement)> {
    chain
        .all_stages()
        .into_iter()
        .map(|(_, s)| s)
        .enumerate()
        .filter_map(|(i, s)| match s {
            Stage::Stateful { nf, .. } => Some((i, nf.name(), nf.placement())),
            Stage::Stateless(nf) => nf.placement().map(|p| (i, nf.name(), p)),
        })
        .collect()
}

/// Sprayed packets of one flow reach every core: state that is neither in
/// the flow tables (shared under `shared`) nor commutative is wrong there.
fn spray_refusal(nf: &str, pl: &Placement) -> Option<String> {
    match (pl.affinity, pl.global) {
        (_, GlobalState::PortPool { .. } | GlobalState::Private) => {
            Some(format!("{nf} keeps NF-global state per core that sprayed packets cannot share; use rss"))
        }
        (Affinity::Connection, _) => {
            Some(format!("{nf} needs both directions of a connection in order on one core; use rss"))
        }
        _ => None,
    }
}

/// Checks every NF's declared placement against `strategy` on `cores`
/// cores and returns the NIC programming that makes the run correct.
pub fn plan(
    chain: &Chain,
    spec: &ChainSpec,
    strategy: &dyn Strategy,
    cores: usize,
    symmetric_flag: bool,
) -> Result<Plan, EngineError> {
    let name = strategy.name();
    let mut p = Plan { symmetric: symmetric_flag, overrides: vec![Vec::new(); cores], ..Plan::default() };
    let ps = placements(chain);
    let moves = strategy.controller().is_some();
    if strategy.delivery() == Delivery::Sequenced && chain.is_graph() {
        return Err(refuse(name, "chain graphs run on per-core state; SCR replicas run one linear chain".to_string()));
    }
    if strategy.delivery() == Delivery::Sequenced {
        // SCR: every core holds every key, so no steering is needed; each NF must opt in.
        // A stateless element's own state is not replicated: it sees only its core's share.
        let own = chain.stages.iter().filter_map(|s| match s {
            Stage::Stateless(nf) => nf.placement().map(|p| (nf.name(), p)),
            Stage::Stateful { .. } => None,
        });
        for (nf, pl) in own {
            if cores > 1 {
                if let Some(why) = spray_refusal(nf, &pl) {
                    return Err(refuse(name, why));
                }
            }
        }
        if let Some(why) = crate::scr::refusal(chain) {
            return Err(refuse(name, why));
        }
        p.notes.push("sequencer: round-robin spray with piggybacked history; per-core state replicas".to_string());
        return Ok(p);
    }
    if cores <= 1 {
        return Ok(p);
    }
    if strategy.delivery() == Delivery::Spray {
        // A flow's packets reach every core: 5-tuple state moves to shared tables.
        p.shared_flows = chain
            .all_stages()
            .into_iter()
            .any(|(_, s)| matches!(s, Stage::Stateful { nf, .. } if nf.granularity() == Granularity::FiveTuple));
        for (i, nf, pl) in &ps {
            if let Some(why) = spray_refusal(nf, pl) {
                return Err(refuse(name, why));
            }
            if let GlobalState::SprayShare { param } = pl.global {
                // Each core sees about 1/cores of a key's packets: the NF scales its per-core counts.
                if let Some(si) = Some(*i).filter(|&k| spec.nfs.get(k).is_some_and(|n| n.name == *nf)) {
                    for o in p.overrides.iter_mut() {
                        o.push((si, param.to_string(), cores.to_string()));
                    }
                    p.notes
                        .push(format!("{nf}: per-core counts scaled by {cores} (packets sprayed over {cores} cores)"));
                }
            }
            // Order-dependent per-flow or per-address state: runs, its order not guaranteed.
            if pl.affinity != Affinity::Any {
                p.unordered.push(nf.to_string());
            }
        }
        return Ok(p);
    }
    // Steering: the strongest affinity wins; two that no hash satisfies together are refused.
    let mut need: Option<(Affinity, &str)> = None;
    for (_, nf, pl) in &ps {
        let a = pl.affinity;
        if matches!(a, Affinity::Any | Affinity::Flow) {
            continue;
        }
        match need {
            None => need = Some((a, nf)),
            Some((b, _)) if b == a => {}
            Some((b, other)) => {
                return Err(refuse(
                    name,
                    format!(
                        "{other} needs {} on one core and {nf} needs {}: no steering gives both; run on one core",
                        what(b),
                        what(a)
                    ),
                ))
            }
        }
    }
    match need {
        Some((Affinity::Connection, nf)) => {
            p.symmetric = true;
            p.icmp_inner = true;
            p.notes
                .push(format!("symmetric key, ICMP errors with their flow ({nf} needs both directions on one core)"));
        }
        Some((Affinity::Source, nf)) => {
            p.hash_on = HashOn::SrcIp;
            p.notes.push(format!("hash on the source address ({nf} needs every packet of a source on one core)"));
        }
        Some((Affinity::Destination, nf)) => {
            p.hash_on = HashOn::DstIp;
            p.notes.push(format!(
                "hash on the destination address ({nf} needs every packet to a destination on one core)"
            ));
        }
        _ => {}
    }
    let mut pools = 0;
    for (i, nf, pl) in &ps {
        match pl.global {
            GlobalState::None | GlobalState::SprayShare { .. } => {}
            GlobalState::Private if moves => {
                return Err(refuse(
                    name,
                    format!(
                        "{nf} keeps per-core state its flows point into, so they cannot move between cores; use rss"
                    ),
                ))
            }
            GlobalState::Private => {}
            GlobalState::PortPool { .. } if moves => {
                return Err(refuse(
                    name,
                    format!("{nf}'s port pool is split per core, so its flows cannot move between cores; use rss"),
                ))
            }
            GlobalState::PortPool { param, lo, hi, dst } => {
                pools += 1;
                if pools > 1 {
                    return Err(refuse(name, format!("{nf}: one port-pool NF per chain on several cores")));
                }
                let span = u32::from(hi) - u32::from(lo) + 1;
                if span < cores as u32 {
                    return Err(refuse(name, format!("{nf}: {span} ports cannot be split over {cores} cores")));
                }
                // Stages are the spec's NFs in order.
                let si = Some(*i).filter(|&k| spec.nfs.get(k).is_some_and(|n| n.name == *nf));
                let Some(si) = si else { continue };
                for c in 0..cores {
                    let a = u32::from(lo) + span * c as u32 / cores as u32;
                    let b = u32::from(lo) + span * (c as u32 + 1) / cores as u32 - 1;
                    p.overrides[c].push((si, param.to_string(), format!("{a}-{b}")));
                    for proto in [6u8, 17] {
                        p.rules.push(FdirRule {
                            proto: Some(proto),
                            dst: Some(dst),
                            dst_ports: (a as u16, b as u16),
                            queue: c as u16,
                        });
                    }
                }
                p.notes.push(format!(
                    "{nf}: ports {lo}-{hi} split over {cores} cores, replies steered to their port's core (flow director)"
                ));
            }
        }
    }
    Ok(p)
}

fn what(a: Affinity) -> &'static str {
    match a {
        Affinity::Connection => "both directions of a connection",
        Affinity::Source => "every packet of a source",
        Affinity::Destination => "every packet to a destination",
        Affinity::Flow => "every packet of a flow",
        Affinity::Any => "nothing",
    }
}

/// `spec` with core `core`'s parameter overrides applied.
pub fn spec_for_core(spec: &ChainSpec, plan: &Plan, core: usize) -> ChainSpec {
    let mut s = spec.clone();
    for (i, k, v) in plan.overrides.get(core).map(Vec::as_slice).unwrap_or(&[]) {
        if let Some(n) = s.nfs.get_mut(*i) {
            match n.params.iter_mut().find(|(pk, _)| pk == k) {
                Some(p) => p.1 = v.clone(),
                None => n.params.push((k.clone(), v.clone())),
            }
        }
    }
    s
}

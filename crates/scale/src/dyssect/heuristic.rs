//! The short-timescale step (Dyssect, Table III, solved greedily): with the
//! core roles fixed by the long timescale, repair the previous assignment
//! with as few changes as possible so every core is within its cap.
//!
//! Invariant (tested): a step never takes a core over its cap, nor adds
//! load to a core already over it. Only moves forced by a role change
//! (a shard whose core stopped working) may break a cap, and they go to
//! the working core with the most room.

use super::model::{Assignment, Input, Role};

/// Load an offloaded flow must keep (fraction of the working cap) to stay
/// offloaded when its working core could take it back (hysteresis).
const RETURN_BELOW: f64 = 0.02;

/// One short-timescale step from `input.old` under `roles`.
pub fn step(input: &Input, roles: &[Role]) -> Assignment {
    let cap = |r: Role| match r {
        Role::Working => input.cap_w,
        Role::Offloading => input.cap_o,
        Role::Idle => 0.0,
    };
    let mut a = input.old.clone();
    a.role = roles.to_vec();
    let working: Vec<usize> = (0..roles.len()).filter(|&c| roles[c] == Role::Working).collect();
    let offloading: Vec<usize> = (0..roles.len()).filter(|&c| roles[c] == Role::Offloading).collect();
    if working.is_empty() {
        return a;
    }
    // Forced: shards of cores that no longer work go to the working core with the most room.
    for s in 0..a.shard_core.len() {
        if roles.get(a.shard_core[s]) != Some(&Role::Working) {
            let u = a.loads(input);
            let best = *working.iter().min_by(|&&x, &&y| u[x].total_cmp(&u[y])).unwrap_or(&working[0]);
            a.shard_core[s] = best;
        }
    }
    // Forced: flows on cores that no longer offload, and priority flows, go home or to another offloading core.
    for h in 0..a.flow_core.len() {
        if let Some(k) = a.flow_core[h] {
            if roles.get(k) != Some(&Role::Offloading) || input.flows[h].priority {
                a.flow_core[h] = None;
                if !input.flows[h].priority {
                    place_flow(input, &mut a, &offloading, h);
                }
            }
        }
    }
    // Reverse moves: a flow whose load dropped returns to its shard's core if it fits there.
    for h in 0..a.flow_core.len() {
        if a.flow_core[h].is_some() && input.flows[h].load < RETURN_BELOW * input.cap_w {
            let home = a.shard_core[input.flows[h].shard];
            let u = a.loads(input);
            if u[home] + input.flows[h].load <= cap(Role::Working) {
                a.flow_core[h] = None;
            }
        }
    }
    // Overloaded working cores: offload their heaviest flows, then move shards.
    let mut order: Vec<usize> = working.clone();
    let u0 = a.loads(input);
    order.sort_by(|&x, &y| u0[y].total_cmp(&u0[x]));
    for &c in &order {
        let mut flows: Vec<usize> = (0..input.flows.len())
            .filter(|&h| {
                a.flow_core[h].is_none() && !input.flows[h].priority && a.shard_core[input.flows[h].shard] == c
            })
            .collect();
        flows.sort_by(|&x, &y| input.flows[y].load.total_cmp(&input.flows[x].load));
        for h in flows {
            if a.loads(input)[c] <= input.cap_w {
                break;
            }
            place_flow(input, &mut a, &offloading, h);
        }
        // Shards, largest net load first, to the working core with the most room where they fit.
        let mut guard = 0;
        while a.loads(input)[c] > input.cap_w && guard < a.shard_core.len() {
            guard += 1;
            let u = a.loads(input);
            let mine: Vec<usize> = (0..a.shard_core.len()).filter(|&s| a.shard_core[s] == c).collect();
            if mine.len() <= 1 {
                break;
            }
            let net = |s: usize| {
                input.shard_load[s]
                    - input
                        .flows
                        .iter()
                        .zip(&a.flow_core)
                        .filter(|(f, k)| f.shard == s && k.is_some())
                        .map(|(f, _)| f.load)
                        .sum::<f64>()
            };
            let Some(&dst) = working.iter().filter(|&&w| w != c).min_by(|&&x, &&y| u[x].total_cmp(&u[y])) else {
                break;
            };
            let room = input.cap_w - u[dst];
            let best = mine
                .iter()
                .copied()
                .filter(|&s| net(s) > 0.0 && net(s) <= room)
                .max_by(|&x, &y| net(x).total_cmp(&net(y)));
            let Some(s) = best else { break };
            a.shard_core[s] = dst;
        }
    }
    a
}

/// Makes `a` meet the model's structural constraints (Eq. 6, 8): an
/// offloading core without a flow becomes working (fixed cores) or idle,
/// and a working core without a shard takes the lightest shard of the
/// working core with the most shards (or goes idle when cores may be idle).
pub fn repair(input: &Input, mut a: Assignment) -> Assignment {
    for k in 0..a.role.len() {
        if a.role[k] == Role::Offloading && !a.flow_core.contains(&Some(k)) {
            a.role[k] = if input.fixed_cores { Role::Working } else { Role::Idle };
        }
    }
    for k in 0..a.role.len() {
        if a.role[k] != Role::Working || a.shard_core.contains(&k) {
            continue;
        }
        let count = |c: usize, a: &Assignment| a.shard_core.iter().filter(|&&x| x == c).count();
        let donor = (0..a.role.len()).filter(|&c| a.role[c] == Role::Working).max_by_key(|&c| count(c, &a));
        match donor {
            Some(d) if count(d, &a) >= 2 => {
                let s = (0..a.shard_core.len())
                    .filter(|&s| {
                        a.shard_core[s] == d
                            && !input.flows.iter().zip(&a.flow_core).any(|(f, x)| f.shard == s && x.is_some())
                    })
                    .min_by(|&x, &y| input.shard_load[x].total_cmp(&input.shard_load[y]));
                if let Some(s) = s {
                    a.shard_core[s] = k;
                } else if !input.fixed_cores {
                    a.role[k] = Role::Idle;
                }
            }
            _ if !input.fixed_cores => a.role[k] = Role::Idle,
            _ => {}
        }
    }
    a
}

/// Offloads flow `h` to the offloading core with the most room where it fits (if any).
fn place_flow(input: &Input, a: &mut Assignment, offloading: &[usize], h: usize) {
    let u = a.loads(input);
    let l = input.flows[h].load;
    if let Some(&k) = offloading.iter().filter(|&&k| u[k] + l <= input.cap_o).min_by(|&&x, &&y| u[x].total_cmp(&u[y])) {
        a.flow_core[h] = Some(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dyssect::model::FlowLoad;
    use proptest::prelude::*;

    fn instance(
        loads: Vec<f64>,
        flows: Vec<(usize, f64, bool)>,
        cores: usize,
        nw: usize,
        seed: u64,
    ) -> (Input, Vec<Role>) {
        let s = loads.len();
        let flows: Vec<FlowLoad> = flows
            .into_iter()
            .map(|(sh, frac, p)| FlowLoad { shard: sh % s, load: loads[sh % s] * frac, priority: p })
            .collect();
        let old_roles: Vec<Role> = (0..cores)
            .map(|c| if (c as u64 + seed).is_multiple_of(3) && c > 0 { Role::Offloading } else { Role::Working })
            .collect();
        let w: Vec<usize> = (0..cores).filter(|&c| old_roles[c] == Role::Working).collect();
        let o: Vec<usize> = (0..cores).filter(|&c| old_roles[c] == Role::Offloading).collect();
        let old = Assignment {
            role: old_roles,
            shard_core: (0..s).map(|i| w[(i + seed as usize) % w.len()]).collect(),
            flow_core: (0..flows.len())
                .map(|i| if !o.is_empty() && i % 2 == 0 && !flows[i].priority { Some(o[i % o.len()]) } else { None })
                .collect(),
        };
        let roles: Vec<Role> = (0..cores).map(|c| if c < nw { Role::Working } else { Role::Offloading }).collect();
        (Input { cores, shard_load: loads, flows, old, cap_w: 0.8, cap_o: 0.9, fixed_cores: true, alpha: 0.01 }, roles)
    }

    proptest! {
        #[test]
        fn steps_never_take_a_core_over_its_cap(
            loads in proptest::collection::vec(0.0f64..0.3, 4..64),
            flows in proptest::collection::vec((0usize..64, 0.0f64..1.0, any::<bool>()), 0..16),
            cores in 2usize..9,
            seed in 0u64..5,
        ) {
            // Keep the old roles so no move is forced: every change is a free step.
            let (mut input, _) = instance(loads, flows, cores, cores, seed);
            let roles = input.old.role.clone();
            // Old assignment valid w.r.t. flows of priority class.
            for (h, f) in input.flows.iter().enumerate() {
                if f.priority { input.old.flow_core[h] = None; }
            }
            let before = input.old.loads(&input);
            let a = step(&input, &roles);
            let after = a.loads(&input);
            for c in 0..cores {
                let cap = if roles[c] == Role::Working { input.cap_w } else { input.cap_o };
                prop_assert!(after[c] <= cap + 1e-9 || after[c] <= before[c] + 1e-9,
                    "core {} {:?}: {} -> {} cap {}", c, roles[c], before[c], after[c], cap);
            }
            for (h, k) in a.flow_core.iter().enumerate() {
                if let Some(k) = k { prop_assert!(roles[*k] == Role::Offloading && !input.flows[h].priority); }
            }
            for &c in &a.shard_core { prop_assert_eq!(roles[c], Role::Working); }
        }
    }

    #[test]
    fn an_elephant_is_offloaded_and_returns_when_it_shrinks() {
        // Two working cores, one offloading; shard 0 holds an elephant.
        let mut loads = vec![0.05; 8];
        loads[0] = 0.9;
        let old = Assignment {
            role: vec![Role::Working, Role::Working, Role::Offloading],
            shard_core: (0..8).map(|s| s % 2).collect(),
            flow_core: vec![None],
        };
        let mut input = Input {
            cores: 3,
            shard_load: loads,
            flows: vec![FlowLoad { shard: 0, load: 0.8, priority: false }],
            old: old.clone(),
            cap_w: 0.8,
            cap_o: 0.9,
            fixed_cores: true,
            alpha: 0.01,
        };
        let a = step(&input, &old.role);
        assert_eq!(a.flow_core, vec![Some(2)]);
        assert!(a.loads(&input).iter().all(|&u| u <= 0.9));
        input.old = a;
        input.flows[0].load = 0.001;
        input.shard_load[0] = 0.051;
        let b = step(&input, &old.role);
        assert_eq!(b.flow_core, vec![None]);
    }
}

//! The long-timescale problem (Dyssect, Table II; with fixed cores, the
//! load-balancing variant of Table IV, linearised as min-max) as a MILP,
//! solved by good_lp over the pure-Rust microlp solver with a time limit
//! and the short-timescale heuristic's assignment as the warm start: when
//! the budget runs out the incumbent is used (microlp's, or the warm start).
//!
//! Variables: `w_c`, `f_c` (core c working / offloading), `A_sc` (shard s
//! on working core c), `x_hk` (flow h offloaded to core k), `X_hc` (flow h
//! offloaded while its shard is on c: linearises the product A * x), `Z`
//! (the busiest core's utilisation).
//! - `w_c + f_c <= 1` (`= 1` with fixed cores); `sum_c w_c >= 1` (Eq. 2)
//! - `sum_c A_sc = 1` (Eq. 3); `sum_s A_sc <= S w_c` (Eq. 4, aggregated); `sum_s A_sc >= w_c` (Eq. 6)
//! - `x_hk <= f_k` (Eq. 7); `sum_h x_hk >= f_k` (Eq. 8, relaxed); `sum_k x_hk <= 1`; priority flows: 0
//! - `X_hc <= A_s(h)c`; `sum_c X_hc = sum_k x_hk`
//! - working load `sum_s L_s A_sc - sum_h l_h X_hc <= cap_w w_c` and `<= Z` (Eq. 10, 12, 14)
//! - offloading load `sum_h l_h x_hk <= cap_o f_k` and `<= Z` (Eq. 11, 13, 15)
//!
//! Objective: fixed cores: `Z + alpha * migrations`; else `sum (w + f) + Z / C + alpha * migrations`
//! (fewest cores first, Eq. 1), migrations counted against the previous assignment (Eq. 16).

use std::time::{Duration, Instant};

use good_lp::solvers::microlp::microlp;
use good_lp::{
    constraint, variable, Expression, ProblemVariables, ResolutionError, Solution, SolutionStatus, SolverModel,
    Variable, WithInitialSolution, WithMipGap, WithTimeLimit,
};
use serde::Serialize;

use super::model::{Assignment, Input, Role};

/// How a solve ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Proven optimal.
    Optimal,
    /// Within the relative MIP gap of optimal.
    Gap,
    /// Time limit with the solver's incumbent.
    TimeLimit,
    /// Time limit before the solver had an incumbent: the warm start is used.
    TimeLimitWarmStart,
    /// Infeasible under the caps: the warm start is used.
    Infeasible,
    /// Solver error: the warm start is used.
    Error,
}

/// A solve's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Solved {
    /// The assignment (the solver's, or the warm start).
    #[serde(skip)]
    pub assignment: Assignment,
    /// Status.
    pub status: Status,
    /// Objective value of the assignment (recomputed, the solver's form).
    pub objective: f64,
    /// Wall time of the solve (model building included), ms.
    pub solve_ms: f64,
    /// Binary variables in the model.
    pub binaries: usize,
}

/// Relative MIP gap at which a solve stops (reported as `optimal` by status `GapLimit` -> `gap`).
pub const MIP_GAP: f32 = 0.02;

/// Objective weight of the overload beyond the caps.
pub const OVERLOAD_PENALTY: f64 = 100.0;

/// The largest load of a core beyond its cap (0 when every cap holds).
pub fn overload(input: &Input, a: &Assignment) -> f64 {
    a.loads(input)
        .into_iter()
        .zip(&a.role)
        .map(|(u, r)| match r {
            Role::Working => u - input.cap_w,
            Role::Offloading => u - input.cap_o,
            Role::Idle => u,
        })
        .fold(0.0, f64::max)
}

/// The objective of `a` as the MILP states it.
pub fn objective(input: &Input, a: &Assignment) -> f64 {
    let z = a.loads(input).into_iter().fold(0.0, f64::max);
    let m = a.migrations(&input.old) as f64;
    let o = OVERLOAD_PENALTY * overload(input, a);
    if input.fixed_cores {
        z + input.alpha * m + o
    } else {
        a.active() as f64 + z / input.cores.max(1) as f64 + input.alpha * m + o
    }
}

/// Solves the long-timescale problem for `input`, warm-started from `warm`, within `budget`.
pub fn solve(input: &Input, warm: &Assignment, budget: Duration) -> Solved {
    solve_reduced(input, warm, budget, usize::MAX, usize::MAX)
}

/// As [`solve`], with only the `free` most loaded shards (and those of
/// candidate flows) as decision variables; the others stay where `warm`
/// puts them (their load a constant of their core). The full 512-shard
/// model is too large for microlp's LP relaxation within a second; the
/// light shards rarely need to move.
/// At most `max_moves` shard migrations (a constraint; the warm start is
/// kept within it by the caller or the solve falls back to it).
pub fn solve_reduced(input: &Input, warm: &Assignment, budget: Duration, free: usize, max_moves: usize) -> Solved {
    let t0 = Instant::now();
    let c = input.cores;
    let s = input.shard_load.len();
    let h = input.flows.len();
    let mut by_load: Vec<usize> = (0..s).collect();
    by_load.sort_by(|&x, &y| input.shard_load[y].total_cmp(&input.shard_load[x]));
    let mut is_free = vec![false; s];
    for &si in by_load.iter().take(free) {
        is_free[si] = true;
    }
    for fl in &input.flows {
        if let Some(x) = is_free.get_mut(fl.shard) {
            *x = true;
        }
    }
    let mut vars = ProblemVariables::new();
    let w: Vec<Variable> = (0..c).map(|_| vars.add(variable().binary())).collect();
    let f: Vec<Variable> = (0..c).map(|_| vars.add(variable().binary())).collect();
    // A fixed shard's row is empty; its core and load are constants.
    let a: Vec<Vec<Variable>> = (0..s)
        .map(|si| if is_free[si] { (0..c).map(|_| vars.add(variable().binary())).collect() } else { Vec::new() })
        .collect();
    let fixed_on = |si: usize| warm.shard_core.get(si).copied().unwrap_or(0).min(c.saturating_sub(1));
    let x: Vec<Vec<Variable>> = (0..h).map(|_| (0..c).map(|_| vars.add(variable().binary())).collect()).collect();
    let xx: Vec<Vec<Variable>> =
        (0..h).map(|_| (0..c).map(|_| vars.add(variable().min(0.0).max(1.0))).collect()).collect();
    let z = vars.add(variable().min(0.0));
    // Overload beyond the caps, heavily penalised: the problem stays feasible
    // when the load exceeds what the caps allow (the checker still flags it).
    let over = vars.add(variable().min(0.0));
    let binaries = 2 * c + a.iter().map(Vec::len).sum::<usize>() + h * c;
    // Migrations (Eq. 16): shards off their old core, flows off their old offloading core or newly offloaded.
    let mut migr = Expression::from(0.0);
    let mut shard_migr = Expression::from(0.0);
    for (si, row) in a.iter().enumerate() {
        if let Some(&old) = input.old.shard_core.get(si) {
            if row.is_empty() {
                migr += f64::from(u8::from(fixed_on(si) != old));
            } else if old < c {
                migr += 1.0 - row[old];
                shard_migr += 1.0 - row[old];
            }
        }
    }
    for (hi, row) in x.iter().enumerate() {
        match input.old.flow_core.get(hi).copied().flatten() {
            Some(k) if k < c => migr += 1.0 - row[k],
            _ => {
                for &v in row {
                    migr += v;
                }
            }
        }
    }
    let goal: Expression = if input.fixed_cores {
        z + input.alpha * migr + OVERLOAD_PENALTY * over
    } else {
        let mut e = Expression::from(0.0);
        for k in 0..c {
            e += w[k] + f[k];
        }
        e + z * (1.0 / c.max(1) as f64) + input.alpha * migr + OVERLOAD_PENALTY * over
    };
    let mut m = vars.minimise(goal).using(microlp);
    let mut sum_w = Expression::from(0.0);
    for k in 0..c {
        sum_w += w[k];
        m = if input.fixed_cores {
            m.with(constraint!(w[k] + f[k] == 1.0))
        } else {
            m.with(constraint!(w[k] + f[k] <= 1.0))
        };
    }
    m = m.with(constraint!(sum_w >= 1.0));
    if max_moves < s {
        // The warm start's own forced moves (shards on cores that stopped working) stay allowed.
        let forced = warm.shard_core.iter().zip(&input.old.shard_core).filter(|(a, b)| a != b).count();
        m = m.with(constraint!(shard_migr <= max_moves.max(forced) as f64));
    }
    for row in a.iter().filter(|r| !r.is_empty()) {
        let e: Expression = row.iter().copied().sum();
        m = m.with(constraint!(e == 1.0));
    }
    for k in 0..c {
        let fixed: Vec<usize> = (0..s).filter(|&si| a[si].is_empty() && fixed_on(si) == k).collect();
        let mut on: Expression = a.iter().filter(|r| !r.is_empty()).map(|row| row[k]).sum();
        on += fixed.len() as f64;
        if !fixed.is_empty() {
            m = m.with(constraint!(w[k] == 1.0));
        }
        m = m.with(constraint!(on.clone() <= (s as f64) * w[k]));
        m = m.with(constraint!(on >= w[k]));
        let mut load = Expression::from(0.0);
        for (si, row) in a.iter().enumerate() {
            if row.is_empty() {
                if fixed_on(si) == k {
                    load += input.shard_load[si];
                }
            } else {
                load += input.shard_load[si] * row[k];
            }
        }
        for (hi, row) in xx.iter().enumerate() {
            load -= input.flows[hi].load * row[k];
        }
        m = m.with(constraint!(load.clone() <= input.cap_w * w[k] + over));
        m = m.with(constraint!(load <= z));
        let mut off = Expression::from(0.0);
        let mut served = Expression::from(0.0);
        for (hi, row) in x.iter().enumerate() {
            off += input.flows[hi].load * row[k];
            served += row[k];
            m = m.with(constraint!(row[k] <= f[k]));
        }
        m = m.with(constraint!(off.clone() <= input.cap_o * f[k] + over));
        m = m.with(constraint!(off <= z));
        m = m.with(constraint!(served >= f[k]));
    }
    for hi in 0..h {
        let out: Expression = x[hi].iter().copied().sum();
        if input.flows[hi].priority {
            m = m.with(constraint!(out.clone() == 0.0));
        } else {
            m = m.with(constraint!(out.clone() <= 1.0));
        }
        let home: Expression = xx[hi].iter().copied().sum();
        m = m.with(constraint!(home == out));
        let sh = input.flows[hi].shard;
        for (k, &v) in xx[hi].iter().enumerate() {
            match a.get(sh).and_then(|r| r.get(k)) {
                Some(&av) => m = m.with(constraint!(v <= av)),
                None => m = m.with(constraint!(v <= 0.0)),
            }
        }
    }
    // The warm start: the heuristic's assignment.
    let mut init: Vec<(Variable, f64)> = Vec::with_capacity(binaries + h * c + 1);
    for k in 0..c {
        init.push((w[k], f64::from(u8::from(warm.role.get(k) == Some(&Role::Working)))));
        init.push((f[k], f64::from(u8::from(warm.role.get(k) == Some(&Role::Offloading)))));
    }
    for (si, row) in a.iter().enumerate() {
        for (k, &v) in row.iter().enumerate() {
            init.push((v, f64::from(u8::from(warm.shard_core.get(si) == Some(&k)))));
        }
        let _ = si;
    }
    for hi in 0..h {
        let fk = warm.flow_core.get(hi).copied().flatten();
        let home = warm.shard_core.get(input.flows[hi].shard).copied();
        for k in 0..c {
            init.push((x[hi][k], f64::from(u8::from(fk == Some(k)))));
            init.push((xx[hi][k], f64::from(u8::from(fk.is_some() && home == Some(k)))));
        }
    }
    init.push((z, warm.loads(input).into_iter().fold(0.0, f64::max)));
    init.push((over, overload(input, warm)));
    let left = budget.saturating_sub(t0.elapsed()).as_secs_f64().max(0.001);
    // A 2% relative gap: the symmetric cores make proving the last percent the bulk of the search.
    let m = m.with_initial_solution(init).with_time_limit(left);
    let fallback = |status| {
        let assignment = warm.clone();
        Solved {
            objective: objective(input, &assignment),
            assignment,
            status,
            solve_ms: t0.elapsed().as_secs_f64() * 1e3,
            binaries,
        }
    };
    let Ok(m) = m.with_mip_gap(MIP_GAP) else { return fallback(Status::Error) };
    match m.solve() {
        Ok(sol) => {
            let role: Vec<Role> = (0..c)
                .map(|k| {
                    if sol.value(w[k]) > 0.5 {
                        Role::Working
                    } else if sol.value(f[k]) > 0.5 {
                        Role::Offloading
                    } else {
                        Role::Idle
                    }
                })
                .collect();
            let pick =
                |row: &[Variable]| (0..row.len()).max_by(|&i, &j| sol.value(row[i]).total_cmp(&sol.value(row[j])));
            let shard_core: Vec<usize> = a
                .iter()
                .enumerate()
                .map(|(si, row)| if row.is_empty() { fixed_on(si) } else { pick(row).unwrap_or(0) })
                .collect();
            let flow_core: Vec<Option<usize>> =
                x.iter().map(|row| pick(row).filter(|&k| sol.value(row[k]) > 0.5)).collect();
            let assignment = Assignment { role, shard_core, flow_core };
            let status = match sol.status() {
                SolutionStatus::Optimal => Status::Optimal,
                SolutionStatus::GapLimit => Status::Gap,
                SolutionStatus::TimeLimit => Status::TimeLimit,
            };
            Solved {
                objective: objective(input, &assignment),
                assignment,
                status,
                solve_ms: t0.elapsed().as_secs_f64() * 1e3,
                binaries,
            }
        }
        Err(ResolutionError::Infeasible) => fallback(Status::Infeasible),
        Err(ResolutionError::Other(_)) => fallback(Status::TimeLimitWarmStart),
        Err(_) => fallback(Status::Error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dyssect::heuristic;
    use crate::dyssect::model::{check, FlowLoad};

    fn input(shards: usize, cores: usize, seed: u64, fixed: bool) -> Input {
        // Zipf-like shard loads with a few elephants, total ~ 0.6 per core.
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let raw: Vec<f64> = (0..shards).map(|i| 1.0 / (1.0 + (i as f64)).powf(1.1) * (0.5 + rnd())).collect();
        let total: f64 = raw.iter().sum();
        let scale = 0.6 * cores as f64 / total;
        let shard_load: Vec<f64> = raw.iter().map(|l| l * scale).collect();
        // The heavy shards' load is mostly one elephant each (offloadable); shard 5's is priority.
        let flows: Vec<FlowLoad> =
            (0..8.min(shards)).map(|i| FlowLoad { shard: i, load: shard_load[i] * 0.9, priority: i == 5 }).collect();
        let old = Assignment::working(cores, (0..shards).map(|i| i % cores).collect(), flows.len());
        Input { cores, shard_load, flows, old, cap_w: 0.85, cap_o: 0.95, fixed_cores: fixed, alpha: 0.001 }
    }

    fn warm(i: &Input) -> Assignment {
        // Heuristic from the old assignment with the last quarter of the cores offloading.
        let nw = i.cores - (i.cores / 4).max(1);
        let roles: Vec<Role> = (0..i.cores).map(|k| if k < nw { Role::Working } else { Role::Offloading }).collect();
        heuristic::repair(i, heuristic::step(i, &roles))
    }

    #[test]
    fn solutions_satisfy_the_model_checked_independently() {
        for (shards, cores, fixed) in [(16, 4, true), (16, 4, false), (32, 6, true), (8, 3, false)] {
            for seed in 1..4 {
                let i = input(shards, cores, seed, fixed);
                let r = solve(&i, &warm(&i), Duration::from_secs(5));
                eprintln!(
                    "{shards}x{cores} fixed {fixed} seed {seed}: {:?} in {:.0} ms, {:.4}",
                    r.status, r.solve_ms, r.objective
                );
                if matches!(r.status, Status::Optimal | Status::Gap | Status::TimeLimit)
                    && overload(&i, &r.assignment) <= 0.0
                {
                    check(&i, &r.assignment)
                        .unwrap_or_else(|e| panic!("{shards}x{cores} seed {seed}: {e} ({:?})", r.status));
                }
                assert!(matches!(r.status, Status::Optimal | Status::Gap | Status::TimeLimit), "{:?}", r.status);
                // Never worse than its warm start.
                assert!(r.objective <= objective(&i, &warm(&i)) + 1e-6);
            }
        }
    }

    #[test]
    fn an_elephant_shard_is_split_by_offloading_its_flow() {
        // One shard needs 1.2 cores; its elephant (1.0) must go to an offloading core.
        let mut shard_load = vec![0.1; 6];
        shard_load[0] = 1.2;
        let flows = vec![FlowLoad { shard: 0, load: 0.9, priority: false }];
        let old = Assignment::working(3, vec![0, 1, 2, 0, 1, 2], 1);
        let i = Input { cores: 3, shard_load, flows, old, cap_w: 0.9, cap_o: 0.95, fixed_cores: true, alpha: 0.001 };
        let r = solve(&i, &i.old.clone(), Duration::from_secs(10));
        assert!(matches!(r.status, Status::Optimal | Status::Gap), "{:?}", r.status);
        check(&i, &r.assignment).unwrap();
        assert!(r.assignment.flow_core[0].is_some());
    }

    /// The 16-core, 512-shard problem within its budget (run with --ignored --nocapture: a figure).
    #[test]
    #[ignore]
    fn budget_16_cores_512_shards() {
        let i = input(512, 16, 7, true);
        let wm = warm(&i);
        for budget in [500u64, 1000] {
            let r = solve(&i, &wm, Duration::from_millis(budget));
            eprintln!(
                "budget {budget} ms: {:?} in {:.0} ms, objective {:.4} (warm {:.4}), {} binaries",
                r.status,
                r.solve_ms,
                r.objective,
                objective(&i, &wm),
                r.binaries
            );
            assert!(r.solve_ms < budget as f64 * 1.5 + 200.0);
            for free in [32, 64] {
                let r = solve_reduced(&i, &wm, Duration::from_millis(budget), free, 32);
                eprintln!(
                    "  reduced to {free} free shards: {:?} in {:.0} ms, objective {:.4}, {} binaries",
                    r.status, r.solve_ms, r.objective, r.binaries
                );
                if matches!(r.status, Status::Optimal | Status::Gap | Status::TimeLimit)
                    && overload(&i, &r.assignment) <= 0.0
                {
                    check(&i, &r.assignment).unwrap();
                }
                assert!(r.solve_ms < budget as f64 * 1.5 + 200.0);
            }
        }
    }
}

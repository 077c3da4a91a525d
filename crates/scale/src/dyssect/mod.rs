//! Dyssect (Carvalho et al., 2022) on the runtime's seams: shards are RETA
//! entries mapped to *working* cores; chosen heavy flows are *offloaded* to
//! *offloading* cores by exact-match NIC flow rules (flow-director style,
//! [`crate::steer::Steering::install_flow_rule`]), their state handed over
//! like a RETA entry's; a controller, off the data path, re-solves the
//! long-timescale problem (roles, shard and flow assignment, fewest
//! migrations: [`milp`]) every `long` period and runs the short-timescale
//! heuristic ([`heuristic`]) every period in between, with the working
//! cores' utilisation capped by Kingman's formula for the priority class's
//! SLO ([`kingman`]).
//!
//! Order and deadlock freedom come from the runtime's hand-over protocol:
//! every change (a shard, or a flow's slot key) is a move of one steering
//! key with a switch point past every queue's receive point; the new owner
//! holds the key's packets until the old one has processed those before
//! the switch and handed the state over. No move waits on another.

pub mod class;
pub mod heuristic;
pub mod kingman;
pub mod milp;
pub mod model;
pub mod sketch;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::steer::{FlowRule, Steering};
use crate::strategy::{Controller, LoadSample};
use class::PriorityClass;
use model::{Assignment, FlowLoad, Input, Role};

/// Dyssect's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Short timescale (the control period).
    pub short: Duration,
    /// Long timescale.
    pub long: Duration,
    /// Time budget of one MILP solve.
    pub budget: Duration,
    /// Flow-rule slots in the NIC.
    pub slots: usize,
    /// Candidate heavy flows per decision.
    pub candidates: usize,
    /// Utilisation cap (u_max) of every core.
    pub u_max: f64,
    /// Priority class.
    pub priority: Option<PriorityClass>,
    /// Priority class's SLO on its mean queueing delay (µs).
    pub slo_us: Option<f64>,
    /// Offered rate (packets/s) when paced: loads become real utilisations; else shares of a saturated port.
    pub rate_pps: Option<f64>,
    /// Full speed: the load every core would carry if the load were even (fixed cores, balance).
    pub fill: f64,
    /// Coefficients of variation of interarrival and service times for Kingman (estimated offline in the paper).
    pub ca: f64,
    /// See `ca`.
    pub cs: f64,
    /// Packets per batch (a batch is the service unit for Kingman).
    pub batch: usize,
    /// Sampling stride of the per-core heavy-flow sketch.
    pub stride: u32,
    /// Weight of a migration in the objective.
    pub alpha: f64,
    /// Minimise the cores in use (Table II) instead of balancing all of them
    /// (Table IV, the throughput use case); needs a known offered rate.
    pub min_cores: bool,
    /// Shards that are MILP variables (the most loaded; the others stay put).
    pub free_shards: usize,
    /// Most shard migrations one long-timescale decision may make (RSS++ bounds its moves too).
    pub max_moves: usize,
    /// Shards S (a power of two <= the RETA size): RETA entries sharing their low log2(S) bits.
    pub shards: usize,
    /// Short timescale, fixed cores: a core may carry this times the mean
    /// load before shards move (hysteresis: measured loads are noisy and
    /// every move is a hand-over).
    pub slack: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            short: Duration::from_millis(100),
            long: Duration::from_secs(1),
            budget: Duration::from_millis(200),
            slots: 256,
            candidates: 16,
            u_max: 0.9,
            priority: None,
            slo_us: None,
            rate_pps: None,
            fill: 0.75,
            ca: 1.0,
            cs: 1.0,
            batch: 32,
            stride: 16,
            alpha: 0.05,
            min_cores: false,
            free_shards: 48,
            // 64 shards of 8 RETA entries (16 shards of 32 balanced 8 cores
            // coarsely and each move cost 32 hand-overs: shifting skew, 8
            // projected cores, 0.5-0.9x rsspp; 64: 1.0x, moves halved).
            max_moves: 32,
            shards: 64,
            slack: 1.15,
        }
    }
}

/// One controller decision, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    /// Seconds since the strategy started.
    pub t_s: f64,
    /// `long` (MILP) or `short` (heuristic).
    pub kind: &'static str,
    /// Solver status (`heuristic` for the short timescale).
    pub status: String,
    /// Objective of the chosen assignment.
    pub objective: f64,
    /// Controller wall time for the decision, ms.
    pub solve_ms: f64,
    /// Shard moves started.
    pub shard_moves: usize,
    /// Flow moves started (offload, change of offloading core, return).
    pub flow_moves: usize,
    /// Working and offloading cores.
    pub working: usize,
    /// See `working`.
    pub offloading: usize,
    /// Working cores' cap (u_max or the Kingman bound) and offloading cores'.
    pub cap_w: f64,
    /// See `cap_w`.
    pub cap_o: f64,
    /// Per core: load (utilisation) the decision planned.
    pub planned: Vec<f64>,
}

/// Per-core load in one window.
#[derive(Clone, Debug, Serialize)]
pub struct LoadRow {
    /// Seconds since start.
    pub t_s: f64,
    /// Per core utilisation (measured; see `Config::rate_pps`).
    pub load: Vec<f64>,
    /// Per core role.
    pub role: Vec<Role>,
}

/// What the report carries.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Log {
    /// Decisions.
    pub decisions: Vec<Decision>,
    /// Per-core load over time.
    pub loads: Vec<LoadRow>,
    /// Controller CPU (wall) time in total, ms.
    pub controller_ms: f64,
    /// Flows offloaded at the end.
    pub offloaded: usize,
    /// Shard moves and flow moves started.
    pub shard_moves: u64,
    /// See `shard_moves`.
    pub flow_moves: u64,
    /// The priority class's SLO and the cap it gave (Kingman), if any.
    pub slo_us: Option<f64>,
}

/// An offloading core below this fraction of the mean load goes back to
/// working at the next short-timescale step (fixed cores).
const UNDERUSED: f64 = 0.5;

/// How much a long-timescale decision must lower the objective (about a
/// core's load fraction) over the short step's to be carried out.
const KEEP_MARGIN: f64 = 0.05;

/// A flow the controller tracks.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    rule: FlowRule,
    priority: bool,
    /// Load in the last window (utilisation).
    load: f64,
}

/// The Dyssect strategy.
pub struct Dyssect {
    cfg: Config,
    roles: Vec<Role>,
    started: Instant,
    last: Option<Instant>,
    last_long: Option<Instant>,
    prev_keys: Vec<(u64, Vec<u64>)>,
    smooth: Vec<f64>,
    prev_port_pos: u64,
    prev_heavy: HashMap<(usize, u32), u64>,
    /// Flows known by hash: their rule and last load.
    flows: HashMap<u32, Tracked>,
    log: Log,
}

impl Dyssect {
    /// With settings.
    pub fn new(cfg: Config) -> Self {
        let slo = cfg.slo_us;
        Dyssect {
            cfg,
            roles: Vec::new(),
            started: Instant::now(),
            last: None,
            last_long: None,
            prev_keys: Vec::new(),
            smooth: Vec::new(),
            prev_port_pos: 0,
            prev_heavy: HashMap::new(),
            flows: HashMap::new(),
            log: Log { slo_us: slo, ..Log::default() },
        }
    }

    /// The decision log.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// The caps: u_max, and for working cores the priority SLO's Kingman bound
    /// with the mean batch service time `t_us`.
    pub fn caps(&self, t_us: f64) -> (f64, f64) {
        let w = match self.cfg.slo_us {
            Some(slo) => kingman::max_utilisation(slo, self.cfg.ca, self.cfg.cs, t_us).min(self.cfg.u_max),
            None => self.cfg.u_max,
        };
        (w, self.cfg.u_max)
    }

    /// One control period over the live table (`cpp`: each queue's worker cycles per packet).
    pub fn control(&mut self, st: &Steering, cpp: &[f64], hz: f64) {
        let t0 = Instant::now();
        let window = self.last.map_or(self.cfg.short, |l| t0.duration_since(l)).as_secs_f64().max(1e-3);
        if self.last.is_some() && window < 0.5 * self.cfg.short.as_secs_f64() {
            // Ticks bunched up behind a long solve: no new window to act on.
            return;
        }
        if self.last.is_none() {
            self.started = t0;
        }
        self.last = Some(t0);
        let nq = st.queues();
        let reta = st.reta_size();
        if self.roles.len() != nq {
            self.roles = vec![Role::Working; nq];
        }
        // Per-key packets per million stream positions in the window: each
        // queue's count delta over the positions it walked between its two
        // publications (a consistent pair; queues publish at their own pace).
        let now = st.queue_key_loads();
        let keys = st.keys();
        let mut pk = vec![0.0f64; keys];
        for (q, (pos, counts)) in now.iter().enumerate() {
            let (ppos, pc) = self.prev_keys.get(q).map_or((0, &[][..]), |p| (p.0, &p.1[..]));
            let w = pos.saturating_sub(ppos);
            if w == 0 {
                continue;
            }
            for (k, x) in pk.iter_mut().enumerate() {
                let d = counts.get(k).copied().unwrap_or(0).saturating_sub(pc.get(k).copied().unwrap_or(0));
                *x += d as f64 * 1e6 / w as f64;
            }
        }
        // Smoothed over windows (one window alone is noisy).
        if self.smooth.len() != keys {
            self.smooth = pk.clone();
        } else {
            for (s, &x) in self.smooth.iter_mut().zip(&pk) {
                *s = 0.5 * *s + 0.5 * x;
            }
        }
        let pk = self.smooth.clone();
        self.prev_keys = now;
        let owners = st.owners();
        // The least disturbed core's cost per packet: busy cycles also carry
        // hand-overs, preemption and turn-taking, which are not the traffic's cost.
        let mean_cpp = cpp.iter().copied().filter(|&c| c > 0.0).fold(f64::INFINITY, f64::min);
        let mean_cpp = if mean_cpp.is_finite() { mean_cpp } else { 100.0 };
        // One cost per packet for every key: per-core figures are noisy (hand-overs,
        // turn-taking, a shared machine) and would shift load onto whichever core looked slow.
        let cost = |_k: usize| mean_cpp;
        // Cycles per key; utilisation: paced, cycles/s over the clock; at full speed, scaled so an even spread is `fill`.
        let cyc: Vec<f64> = pk.iter().enumerate().map(|(k, &p)| p * cost(k)).collect();
        let total: f64 = cyc.iter().sum();
        if total <= 0.0 {
            return;
        }
        // `cyc` is cycles per million positions (packets of the port): paced, times the rate gives cycles/s.
        let to_util = match self.cfg.rate_pps {
            Some(r) => r / 1e6 / hz,
            None => self.cfg.fill * nq as f64 / total,
        };
        let _ = window;
        let rules = st.flow_rules();
        // Shards: the RETA entries sharing their low log2(S) bits (Dyssect §II-B).
        let ns = self.cfg.shards.clamp(1, reta);
        let mut shard_load = vec![0.0; ns];
        for (e, c) in cyc.iter().take(reta).enumerate() {
            shard_load[e % ns] += c * to_util;
        }
        for (key, r) in &rules {
            if let Some(l) = shard_load.get_mut(r.entry as usize % ns) {
                *l += cyc[*key as usize] * to_util;
            }
        }
        // Candidate flows: the sketches' deltas, exact NIC counts for flows with rules.
        // Sketch deltas are packets per window: per million positions via the port's walk in the window.
        let port_pos = st.queue_scan().into_iter().filter(|&p| p != u64::MAX).max().unwrap_or(0);
        let walked = port_pos.saturating_sub(self.prev_port_pos).max(1) as f64;
        self.prev_port_pos = port_pos;
        let heavy = st.heavy_flows();
        let mut est: HashMap<u32, (f64, crate::steer::HeavyFlow)> = HashMap::new();
        for (q, hs) in heavy.iter().enumerate() {
            for h in hs {
                let prev = self.prev_heavy.insert((q, h.hash), h.packets).unwrap_or(0);
                let d = h.packets.saturating_sub(prev) as f64;
                let e = est.entry(h.hash).or_insert((0.0, *h));
                let _ = q;
                e.0 += d * 1e6 / walked * mean_cpp * to_util;
            }
        }
        for t in self.flows.values_mut() {
            t.load = 0.0;
        }
        for (hash, (load, h)) in &est {
            let entry = st_entry(st, h);
            let t = self.flows.entry(*hash).or_insert(Tracked {
                rule: FlowRule { entry, hash: *hash, tuple: h.tuple },
                priority: h.priority || self.cfg.priority.is_some_and(|_| h.priority),
                load: 0.0,
            });
            t.load = *load;
        }
        for (key, r) in &rules {
            if let Some(t) = self.flows.get_mut(&r.hash) {
                t.load = cyc[*key as usize] * to_util;
            }
        }
        // Keep the flows with rules and the heaviest others.
        let ruled: Vec<u32> = rules.iter().map(|(_, r)| r.hash).collect();
        let mut cands: Vec<Tracked> = self.flows.values().copied().filter(|t| ruled.contains(&t.rule.hash)).collect();
        // Candidates: flows heavy enough to matter (a fifth of an evenly loaded core);
        // the others only make the MILP larger (and the controller steals CPU from the workers).
        let even = shard_load.iter().sum::<f64>() / nq.max(1) as f64;
        let mut others: Vec<Tracked> = self
            .flows
            .values()
            .copied()
            .filter(|t| !ruled.contains(&t.rule.hash) && !t.priority && t.load > 0.2 * even)
            .collect();
        others.sort_by(|a, b| b.load.total_cmp(&a.load));
        cands.extend(others.into_iter().take(self.cfg.candidates.saturating_sub(cands.len())));
        self.flows.retain(|h, t| ruled.contains(h) || t.load > 0.0);
        // A flow's load is part of its shard's (shard load counts its slot traffic too).
        for c in &mut cands {
            c.load = c.load.min(shard_load[c.rule.entry as usize % ns]);
        }
        let flows: Vec<FlowLoad> = cands
            .iter()
            .map(|t| FlowLoad { shard: t.rule.entry as usize % ns, load: t.load, priority: t.priority })
            .collect();
        let slot_of = |t: &Tracked| rules.iter().find(|(_, r)| r.hash == t.rule.hash).map(|(k, _)| *k);
        let old = Assignment {
            role: self.roles.clone(),
            // A shard's core: where most of its entries are (all of them once settled).
            shard_core: (0..ns)
                .map(|sh| {
                    let mut n = vec![0usize; nq];
                    for e in (sh..reta).step_by(ns) {
                        if let Some(x) = n.get_mut(owners[e] as usize) {
                            *x += 1;
                        }
                    }
                    (0..nq).max_by_key(|&q| n[q]).unwrap_or(0)
                })
                .collect(),
            flow_core: cands
                .iter()
                .map(|t| {
                    let key = slot_of(t)?;
                    let o = owners[key as usize] as usize;
                    (o != owners[t.rule.entry as usize] as usize).then_some(o)
                })
                .collect(),
        };
        // Measured per-core load, for the report.
        let mut measured = vec![0.0; nq];
        for (k, &c) in cyc.iter().enumerate() {
            if let Some(x) = measured.get_mut(owners.get(k).copied().unwrap_or(0) as usize) {
                *x += c * to_util;
            }
        }
        self.log.loads.push(LoadRow {
            t_s: self.started.elapsed().as_secs_f64(),
            load: measured,
            role: self.roles.clone(),
        });
        let t_us = mean_cpp * self.cfg.batch as f64 / hz * 1e6;
        let (cap_w, cap_o) = self.caps(t_us);
        let mut input = Input {
            cores: nq,
            shard_load,
            flows,
            old,
            cap_w,
            cap_o,
            fixed_cores: !self.cfg.min_cores || self.cfg.rate_pps.is_none(),
            alpha: self.cfg.alpha,
        };
        // An old assignment can name offloaded flows of the priority class (class changed): the model forbids it.
        for (h, f) in input.flows.iter().enumerate() {
            if f.priority {
                input.old.flow_core[h] = None;
            }
        }
        if st.active_moves() > 0 {
            // The last decision is still being carried out: its flows are not
            // on their new cores yet, and a decision on that half-moved state
            // would undo it (offloading cores look idle until their flows arrive).
            return;
        }
        // The short step balances from the first period on (as RSS++ does); the
        // first long decision waits a long period for representative loads.
        let long = t0.duration_since(self.started) >= self.cfg.long
            && self.last_long.is_none_or(|l| t0.duration_since(l) >= self.cfg.long)
            && nq > 1;
        let (a, kind, status, objective) = if long {
            self.last_long = Some(t0);
            // Warm start: the heuristic under a role split with offloading cores for the heavy flows.
            let warm_roles = self.warm_roles(&input);
            let warm = heuristic::repair(&input, heuristic::step(&input, &warm_roles));
            let r = milp::solve_reduced(&input, &warm, self.cfg.budget, self.cfg.free_shards, self.cfg.max_moves);
            let status =
                serde_json::to_value(r.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
            // The long decision must beat what the short step would do by a
            // margin (a solve cut short by its budget can return a worse
            // incumbent; and every move is a hand-over).
            let stay = self.short_step(&input);
            // Compared on the model's objective while the caps can hold; when even
            // an even spread is over them, on the balance alone (max load and
            // migrations: the overload penalty would otherwise decide).
            let avg = input.shard_load.iter().sum::<f64>() / nq.max(1) as f64;
            let judge = |a: &Assignment| {
                if input.cap_w >= avg {
                    milp::objective(&input, a)
                } else {
                    a.loads(&input).into_iter().fold(0.0, f64::max) + input.alpha * a.migrations(&input.old) as f64
                }
            };
            let (o_new, o_stay) = (judge(&r.assignment), judge(&stay));
            if o_new < o_stay - KEEP_MARGIN {
                (r.assignment, "long", status, o_new)
            } else {
                (stay, "long", format!("kept ({status})"), o_stay)
            }
        } else {
            let a = self.short_step(&input);
            let o = milp::objective(&input, &a);
            (a, "short", "heuristic".to_string(), o)
        };
        let planned = a.loads(&input);
        let (sm, fm) = self.apply(st, &cands, &a);
        self.roles = a.role.clone();
        let solve_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.log.controller_ms += solve_ms;
        self.log.shard_moves += sm as u64;
        self.log.flow_moves += fm as u64;
        self.log.offloaded = a.flow_core.iter().filter(|k| k.is_some()).count();
        if long || sm + fm > 0 {
            self.log.decisions.push(Decision {
                t_s: self.started.elapsed().as_secs_f64(),
                kind,
                status,
                objective,
                solve_ms,
                shard_moves: sm,
                flow_moves: fm,
                working: a.role.iter().filter(|&&r| r == Role::Working).count(),
                offloading: a.role.iter().filter(|&&r| r == Role::Offloading).count(),
                cap_w,
                cap_o,
                planned,
            });
        }
    }

    /// The short-timescale step on the current roles. Balancing (fixed
    /// cores): the heuristic also evens load out, to within `slack` of the
    /// mean (Table IV's target with hysteresis: measured loads are noisy and
    /// every shard move is a hand-over), never beyond the caps.
    fn short_step(&self, input: &Input) -> Assignment {
        let nq = input.cores;
        let mut tight = input.clone();
        if input.fixed_cores {
            // Within the caps when the load allows it; when even an even spread
            // is over a cap, the caps cannot hold and the step only evens out
            // (else every core is "over" and shards churn to no gain).
            let avg = input.shard_load.iter().sum::<f64>() / nq.max(1) as f64;
            let even = avg * self.cfg.slack;
            tight.cap_w = if input.cap_w >= avg { input.cap_w.min(even) } else { even };
            tight.cap_o = if input.cap_o >= avg { input.cap_o.min(even) } else { even };
        }
        // An offloading core left with little (its flows' load moved on:
        // the heavy flows shifted) works again until the next long decision
        // instead of idling while working cores are loaded (fixed cores).
        let mut roles = self.roles.clone();
        if input.fixed_cores {
            let u = input.old.loads(input);
            let avg = input.shard_load.iter().sum::<f64>() / nq.max(1) as f64;
            for (r, &l) in roles.iter_mut().zip(&u) {
                if *r == Role::Offloading && l < UNDERUSED * avg {
                    *r = Role::Working;
                }
            }
        }
        heuristic::step(&tight, &roles)
    }

    /// Roles for the warm start: enough offloading cores for the heavy
    /// candidate flows, keeping current offloading cores first, then taking
    /// the least loaded working cores (fewest forced shard moves).
    fn warm_roles(&self, input: &Input) -> Vec<Role> {
        // Heavy: a flow worth a fifth of an evenly loaded core.
        let avg = input.shard_load.iter().sum::<f64>() / input.cores.max(1) as f64;
        let heavy: f64 = input.flows.iter().filter(|f| !f.priority && f.load > 0.2 * avg).map(|f| f.load).sum();
        let no = ((heavy / input.cap_o).ceil() as usize).min(input.cores / 2);
        let no = if no == 0 && heavy > 0.0 { 1 } else { no };
        let u = input.old.loads(input);
        let mut order: Vec<usize> = (0..input.cores).collect();
        order.sort_by(|&x, &y| {
            let ox = input.old.role[x] == Role::Offloading;
            let oy = input.old.role[y] == Role::Offloading;
            oy.cmp(&ox).then(u[x].total_cmp(&u[y]))
        });
        let mut roles = vec![Role::Working; input.cores];
        for &k in order.iter().take(no) {
            roles[k] = Role::Offloading;
        }
        roles
    }

    /// Carries an assignment out on the table: shard moves, then flow rules
    /// and their moves. Keys still moving are left for a later period.
    fn apply(&mut self, st: &Steering, cands: &[Tracked], a: &Assignment) -> (usize, usize) {
        let mut sm = 0;
        // Every entry of a shard to its core (also the stragglers of a shard whose majority is there).
        let ns = a.shard_core.len().max(1);
        let owners = st.owners();
        for (e, &o) in owners.iter().enumerate().take(st.reta_size()) {
            let want = a.shard_core[e % ns];
            if o as usize != want && st.start_move(e as u16, want as u16).is_ok() {
                sm += 1;
            }
        }
        let owners = st.owners();
        let mut fm = 0;
        let rules = st.flow_rules();
        let mut wanted: Vec<u32> = Vec::new();
        for (t, k) in cands.iter().zip(&a.flow_core) {
            let slot = rules.iter().find(|(_, r)| r.hash == t.rule.hash).map(|(k, _)| *k);
            let home = owners[t.rule.entry as usize];
            match (k, slot) {
                (Some(k), Some(key)) => {
                    wanted.push(t.rule.hash);
                    if owners[key as usize] as usize != *k && st.start_move(key, *k as u16).is_ok() {
                        fm += 1;
                    }
                }
                (Some(k), None) => {
                    if let Ok(key) = st.install_flow_rule(t.rule) {
                        wanted.push(t.rule.hash);
                        if st.start_move(key, *k as u16).is_ok() {
                            fm += 1;
                        }
                    }
                }
                (None, Some(key)) => {
                    if owners[key as usize] != home {
                        if st.start_move(key, home).is_ok() {
                            fm += 1;
                        }
                    } else {
                        // Back home and settled: the rule goes (refused while anything moves; retried).
                        let _ = st.remove_flow_rule(key);
                    }
                }
                (None, None) => {}
            }
        }
        // Rules of flows no longer candidates: return them home, then drop the rule.
        for (key, r) in &rules {
            if cands.iter().any(|t| t.rule.hash == r.hash) || wanted.contains(&r.hash) {
                continue;
            }
            let home = owners[r.entry as usize];
            if owners[*key as usize] != home {
                if st.start_move(*key, home).is_ok() {
                    fm += 1;
                }
            } else {
                let _ = st.remove_flow_rule(*key);
            }
        }
        (sm, fm)
    }
}

/// The RETA entry of a sampled flow: the low bits of its RSS hash (the classifier's mask).
fn st_entry(st: &Steering, h: &crate::steer::HeavyFlow) -> u16 {
    (h.hash as usize & (st.reta_size() - 1)) as u16
}

impl Controller for Dyssect {
    fn counts_loads(&self) -> bool {
        true
    }
    fn period(&self) -> Duration {
        self.cfg.short
    }
    fn flow_slots(&self) -> usize {
        self.cfg.slots
    }
    fn sample_stride(&self) -> u32 {
        self.cfg.stride
    }
    fn drive(&mut self, st: &Steering, _s: &LoadSample<'_>, cpp: &[f64], hz: f64) -> bool {
        self.control(st, cpp, hz);
        true
    }
    fn report_json(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.log).ok()
    }
}

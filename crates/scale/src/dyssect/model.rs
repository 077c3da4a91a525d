//! The controller's model: shards and candidate heavy flows with their loads
//! (utilisation of one core), core roles, and an assignment; [`check`]
//! verifies an assignment against the model's constraints with plain loops,
//! independently of the solver that produced it.
//!
//! Constraints (Dyssect, Table II, with flow-level offloading): every shard
//! on exactly one working core (Eq. 3, 4); at least one working core (Eq. 2);
//! an active working core holds a shard (Eq. 6); a flow is offloaded only to
//! an active offloading core (Eq. 7) that serves at least one flow (Eq. 8,
//! relaxed from two working cores: flows are steered by NIC rules, not
//! through per-working-core queues); utilisation within the caps, which the
//! caller sets to min(u_max, Kingman's SLO bound) (Eq. 12-15). Priority
//! flows are never offloaded.

use serde::Serialize;

/// A core's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Role {
    /// Receives shards through the RETA.
    Working,
    /// Receives offloaded flows through NIC flow rules.
    Offloading,
    /// Neither (scaled in).
    Idle,
}

/// A candidate heavy flow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowLoad {
    /// Its shard (RETA entry).
    pub shard: usize,
    /// Its load (utilisation of one core); part of its shard's load.
    pub load: f64,
    /// Priority class: stays on working cores.
    pub priority: bool,
}

/// What the controller decides over.
#[derive(Clone, Debug)]
pub struct Input {
    /// Cores available.
    pub cores: usize,
    /// Per shard: load (utilisation of one core), its flows included.
    pub shard_load: Vec<f64>,
    /// Candidate flows.
    pub flows: Vec<FlowLoad>,
    /// The current assignment (migrations count against it).
    pub old: Assignment,
    /// Utilisation cap of working cores (min of u_max and the priority SLO's Kingman bound).
    pub cap_w: f64,
    /// Utilisation cap of offloading cores (min of u_max and the regular SLO's bound).
    pub cap_o: f64,
    /// Every core active (fixed cores: balance load) instead of minimising cores.
    pub fixed_cores: bool,
    /// Weight of one migration in the objective.
    pub alpha: f64,
}

/// Roles, shard-to-working-core and flow-to-offloading-core assignment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Assignment {
    /// Per core.
    pub role: Vec<Role>,
    /// Per shard: its working core.
    pub shard_core: Vec<usize>,
    /// Per candidate flow: its offloading core, if offloaded.
    pub flow_core: Vec<Option<usize>>,
}

impl Assignment {
    /// All cores working, shards as given, nothing offloaded.
    pub fn working(cores: usize, shard_core: Vec<usize>, flows: usize) -> Self {
        Assignment { role: vec![Role::Working; cores], shard_core, flow_core: vec![None; flows] }
    }

    /// Per core: utilisation under `input`'s loads.
    pub fn loads(&self, input: &Input) -> Vec<f64> {
        let mut u = vec![0.0; self.role.len()];
        for (s, &c) in self.shard_core.iter().enumerate() {
            if let (Some(x), Some(l)) = (u.get_mut(c), input.shard_load.get(s)) {
                *x += l;
            }
        }
        for (f, k) in input.flows.iter().zip(&self.flow_core) {
            if let Some(k) = *k {
                if let Some(x) = u.get_mut(self.shard_core.get(f.shard).copied().unwrap_or(usize::MAX)) {
                    *x -= f.load;
                }
                if let Some(x) = u.get_mut(k) {
                    *x += f.load;
                }
            }
        }
        u
    }

    /// Shard migrations and flow (re)assignments from `old`.
    pub fn migrations(&self, old: &Assignment) -> usize {
        let s = self.shard_core.iter().zip(&old.shard_core).filter(|(a, b)| a != b).count();
        let f = self.flow_core.iter().zip(&old.flow_core).filter(|(a, b)| a != b).count();
        s + f
    }

    /// Active cores.
    pub fn active(&self) -> usize {
        self.role.iter().filter(|&&r| r != Role::Idle).count()
    }
}

/// Tolerance of the capacity checks (solver round-off).
pub const EPS: f64 = 1e-6;

/// Checks `a` against every constraint of the model for `input`; the error names the first violated.
pub fn check(input: &Input, a: &Assignment) -> Result<(), String> {
    let c = input.cores;
    if a.role.len() != c || a.shard_core.len() != input.shard_load.len() || a.flow_core.len() != input.flows.len() {
        return Err("dimensions".into());
    }
    let working = a.role.iter().filter(|&&r| r == Role::Working).count();
    if working == 0 {
        return Err("no working core (Eq. 2)".into());
    }
    if input.fixed_cores && a.role.contains(&Role::Idle) {
        return Err("an idle core with fixed cores".into());
    }
    let mut shards_on = vec![0usize; c];
    for (s, &k) in a.shard_core.iter().enumerate() {
        if k >= c || a.role[k] != Role::Working {
            return Err(format!("shard {s} on core {k}, not an active working core (Eq. 3, 4)"));
        }
        shards_on[k] += 1;
    }
    for (k, &r) in a.role.iter().enumerate() {
        if r == Role::Working && shards_on[k] == 0 {
            return Err(format!("working core {k} without a shard (Eq. 6)"));
        }
    }
    let mut flows_on = vec![0usize; c];
    for (h, (f, k)) in input.flows.iter().zip(&a.flow_core).enumerate() {
        if let Some(k) = *k {
            if k >= c || a.role[k] != Role::Offloading {
                return Err(format!("flow {h} on core {k}, not an active offloading core (Eq. 7)"));
            }
            if f.priority {
                return Err(format!("priority flow {h} offloaded"));
            }
            flows_on[k] += 1;
        }
    }
    for (k, &r) in a.role.iter().enumerate() {
        if r == Role::Offloading && flows_on[k] == 0 {
            return Err(format!("offloading core {k} serves no flow (Eq. 8)"));
        }
    }
    for (k, u) in a.loads(input).into_iter().enumerate() {
        let cap = match a.role[k] {
            Role::Working => input.cap_w,
            Role::Offloading => input.cap_o,
            Role::Idle => 0.0,
        };
        if u > cap + EPS {
            return Err(format!("core {k} ({:?}) at {u:.4} over its cap {cap:.4} (Eq. 12-15)", a.role[k]));
        }
    }
    Ok(())
}

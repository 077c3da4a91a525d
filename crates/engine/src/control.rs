//! Run-time requests to the workers (`flowplane ctl`): a mailbox per
//! worker that the worker looks at between two batches, so a change lands
//! at a batch boundary on every core — a batch sees an NF's old parameters
//! or its new ones, never half of each — and flow state stays where it is.
//!
//! Posting takes a lock and bumps the mailbox's counter; a worker reads the
//! counter (one relaxed atomic load per batch) and takes the lock only when
//! it moved, so the data path pays nothing while nobody asks. Each request
//! carries its reply channel; [`Mailboxes::ask`] waits for every worker's
//! answer (or a timeout: a worker stuck or gone is named, not waited for).
//!
//! Traces and captures (`crate::tap`) are armed the same way: the records
//! and rings are allocated by the control path and handed to each worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use flowplane_nf::Params;

use crate::exec::Pipeline;
use crate::spec::NfSpec;

/// What a worker is asked to do between two batches.
#[derive(Clone, Debug)]
pub enum Command {
    /// NF `index` of the chain takes these parameters (all of them, as the chain now gives them).
    Reconfigure {
        /// The NF's position in the chain.
        index: usize,
        /// The NF with its new parameters.
        nf: NfSpec,
    },
    /// NF `index`'s state rows now (its `--export` rows on this core), or its
    /// report when its export is derived from the merged report.
    Export {
        /// The NF's position in the chain.
        index: usize,
    },
    /// Each stateful NF's state for one flow (and, on core 0, the coarse state of its source,
    /// destination or other key: shared by every core).
    Flow {
        /// The flow.
        key: flowplane_wire::flow::FiveTuple,
    },
    /// Arm a trace (its records allocated now), or disarm it (None: `trace clear`).
    Trace(Option<crate::tap::TraceArm>),
    /// The packets traced so far.
    TraceShow,
    /// Arm a capture (the worker takes its ring), or stop it (None).
    Capture(Option<crate::tap::CaptureArm>),
    /// Start (true: from zero) or stop the per-NF profile (`show runtime` shows it while it runs).
    Profile(bool),
}

/// A worker's answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Done.
    Done,
    /// This core's rows (state exports; shared state only from core 0).
    Rows(Vec<serde_json::Value>),
    /// This core's report of the NF (for exports derived from the merged report).
    Report(Option<serde_json::Value>),
    /// This core's state of one flow: (NF, its export row).
    Flow(Vec<(String, serde_json::Value)>),
    /// This core's traced packets.
    Trace(Vec<crate::tap::TraceRecord>),
    /// Refused, with the one-line reason.
    Refused(String),
}

type Request = (Command, mpsc::Sender<(usize, Answer)>);

/// One mailbox per worker.
pub struct Mailboxes {
    boxes: Vec<Mailbox>,
}

struct Mailbox {
    posted: AtomicU64,
    queue: Mutex<Vec<Request>>,
}

impl Mailboxes {
    /// Mailboxes for `workers` workers.
    pub fn new(workers: usize) -> Mailboxes {
        Mailboxes {
            boxes: (0..workers).map(|_| Mailbox { posted: AtomicU64::new(0), queue: Mutex::new(Vec::new()) }).collect(),
        }
    }

    /// Workers served.
    pub fn workers(&self) -> usize {
        self.boxes.len()
    }

    /// Posts `cmd` to every worker and waits for every answer, in worker
    /// order; a worker that has not answered within `timeout` is an error
    /// naming it (a stopped run's workers answer nothing).
    pub fn ask(&self, cmd: &Command, timeout: Duration) -> Result<Vec<Answer>, String> {
        let (tx, rx) = mpsc::channel();
        for b in &self.boxes {
            b.queue.lock().map_err(|_| "a worker's mailbox is poisoned".to_string())?.push((cmd.clone(), tx.clone()));
            b.posted.fetch_add(1, Ordering::Release);
        }
        drop(tx);
        let mut answers: Vec<Option<Answer>> = vec![None; self.boxes.len()];
        let deadline = std::time::Instant::now() + timeout;
        while answers.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok((w, a)) => {
                    if let Some(slot) = answers.get_mut(w) {
                        *slot = Some(a);
                    }
                }
                Err(_) => {
                    let missing: Vec<String> =
                        answers.iter().enumerate().filter(|(_, a)| a.is_none()).map(|(w, _)| w.to_string()).collect();
                    return Err(format!(
                        "worker(s) {} did not answer within {} ms (the run is ending or stuck)",
                        missing.join(", "),
                        timeout.as_millis()
                    ));
                }
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// Worker `w`'s side, between two batches: carries out what was posted
    /// since `seen` on its pipeline. One atomic load when nothing was.
    #[inline]
    pub fn serve(&self, w: usize, seen: &mut u64, pipeline: &mut Pipeline) {
        let Some(b) = self.boxes.get(w) else { return };
        let now = b.posted.load(Ordering::Acquire);
        if now == *seen {
            return;
        }
        *seen = now;
        let reqs = match b.queue.lock() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(_) => return,
        };
        let workers = self.boxes.len();
        for (cmd, reply) in reqs {
            let _ = reply.send((w, carry_out(w, workers, &cmd, pipeline)));
        }
    }
}

/// Why `stage` cannot change on `workers` cores, if it cannot: its state points into a pool split per
/// core (nat's ports), whose replies the run steers to their core by the pool's addresses.
pub fn split_pool(stage: &crate::chain::Stage, workers: usize) -> Option<String> {
    let pl = match stage {
        crate::chain::Stage::Stateful { nf, .. } => Some(nf.placement()),
        crate::chain::Stage::Stateless(nf) => nf.placement(),
    };
    match pl?.global {
        flowplane_nf::GlobalState::PortPool { param, .. } if workers > 1 => Some(format!(
            "{}: its pool is split over the {workers} cores ('{param}' shared out, replies steered to their core by \
             the pool's addresses), so it cannot change while running on several cores (a restart changes it)",
            stage.name()
        )),
        _ => None,
    }
}

/// One command on one worker's pipeline (of `workers`).
fn carry_out(w: usize, workers: usize, cmd: &Command, pipeline: &mut Pipeline) -> Answer {
    match cmd {
        Command::Reconfigure { index, nf } => match pipeline.stage_mut(*index) {
            Some(stage) if stage.name() == nf.name => {
                if let Some(why) = split_pool(stage, workers) {
                    return Answer::Refused(why);
                }
                let mut p = Params::new(&nf.name, nf.params.clone());
                match stage.reconfigure(&mut p) {
                    Ok(()) => Answer::Done,
                    Err(e) => Answer::Refused(e.to_string()),
                }
            }
            _ => Answer::Refused(format!("no NF {} at position {index} of the chain", nf.name)),
        },
        Command::Flow { key } => Answer::Flow(pipeline.flow_rows(key, w == 0)),
        Command::Trace(arm) => {
            pipeline.arm_trace(w, arm.as_ref());
            Answer::Done
        }
        Command::TraceShow => Answer::Trace(pipeline.trace_records()),
        Command::Profile(on) => {
            pipeline.arm_profile(*on);
            Answer::Done
        }
        Command::Capture(arm) => {
            if let Some(a) = arm {
                if a.at.is_some_and(|at| at >= pipeline.stage_total()) {
                    return Answer::Refused(format!("capture --at: no NF at position {:?} of the chain", a.at));
                }
            }
            pipeline.arm_capture(w, arm.as_ref());
            Answer::Done
        }
        Command::Export { index } => {
            let stages = pipeline.stages();
            let Some((_, stage)) = stages.get(*index) else {
                return Answer::Refused(format!("no NF at position {index} of the chain"));
            };
            match stage.export_kind() {
                flowplane_nf::Export::State => {
                    Answer::Rows(pipeline.export_at(*index, w == 0, &|_| None).unwrap_or_default())
                }
                flowplane_nf::Export::Report => Answer::Report(stage.report()),
                flowplane_nf::Export::None => Answer::Refused(format!("{} keeps no exportable state", stage.name())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::Chain;
    use crate::spec::{ChainSpec, NfSpec};

    /// nat's port pool is split over the cores (replies steered by its addresses): on several cores it
    /// cannot change (refused by every worker in one line), on one it can.
    #[test]
    fn a_pool_split_over_cores_cannot_change_on_several() {
        let one = |name: &str| Chain::build(&ChainSpec::linear(vec![NfSpec { name: name.into(), params: Vec::new() }]));
        let nat = one("nat").unwrap();
        let why = split_pool(&nat.stages[0], 2).unwrap();
        assert!(why.starts_with("nat: its pool is split over the 2 cores ('ports' shared out"), "{why}");
        assert!(!why.contains('\n'));
        assert_eq!(split_pool(&nat.stages[0], 1), None);
        assert_eq!(split_pool(&one("fsc").unwrap().stages[0], 2), None);
    }

    /// The contract `flowplane nfs` shows and `ctl set` relies on: an NF that declares a
    /// parameter live takes its parameters again while it runs; one that declares none refuses.
    #[test]
    fn live_parameters_are_exactly_the_ones_reconfigure_takes() {
        let mut checked = 0;
        for d in flowplane_nf::registry::NFS {
            let spec = ChainSpec::linear(vec![NfSpec { name: d.name.to_string(), params: Vec::new() }]);
            // NFs that need a parameter to be built (a session file, a table) are skipped.
            let Ok(mut chain) = Chain::build(&spec) else { continue };
            let mut p = Params::new(d.name, Vec::new());
            let r = chain.stages[0].reconfigure(&mut p);
            let live = d.params.iter().any(|p| p.live);
            assert_eq!(r.is_ok(), live, "{}: live parameters {live}, reconfigure {r:?}", d.name);
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} NFs built with their defaults");
    }
}

//! The chain compiler: from a spec to one core's NF instances, with the
//! state layout of the 5-tuple NFs aggregated into one block per flow.
//!
//! Every 5-tuple NF of the chain shares ONE table and ONE state block per
//! flow (FAJITA ①): states are packed back to back, smallest first, so the
//! first cache line covers as many NFs as possible. Stateless elements
//! (`forward`, `count`) stay batch-level stages in their chain position.

use flowplane_nf::registry::{self, NfInstance};
use flowplane_nf::stateful::Granularity;
use flowplane_nf::{DynStateful, Nf, NfCounters, Params};

use crate::spec::ChainSpec;

/// One stage of a compiled chain.
pub enum Stage {
    /// A batch-level element.
    Stateless(Box<dyn Nf>),
    /// A stateful NF with its state at `offset` in the aggregated block.
    Stateful {
        /// The NF.
        nf: Box<dyn DynStateful>,
        /// Byte offset of its state in the flow's block.
        offset: usize,
        /// Counters kept by the executor.
        counters: NfCounters,
    },
}

impl Stage {
    /// The NF's name.
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Stateless(n) => n.name(),
            Stage::Stateful { nf, .. } => nf.name(),
        }
    }
}

/// One core's compiled chain.
pub struct Chain {
    /// Stages in chain order.
    pub stages: Vec<Stage>,
    /// Bytes of the aggregated 5-tuple state block.
    pub state_size: usize,
    /// Longest idle timeout any 5-tuple NF asked for (None: none asked).
    pub idle_timeout_ns: Option<u64>,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

impl Chain {
    /// Instantiates every NF of `spec` and lays out the aggregated state;
    /// the error names the offending NF or parameter.
    pub fn build(spec: &ChainSpec) -> Result<Chain, String> {
        let mut stages = Vec::with_capacity(spec.nfs.len());
        for s in &spec.nfs {
            let nf = registry::build(&s.name, Params::new(&s.name, s.params.clone())).map_err(|e| e.to_string())?;
            stages.push(match nf {
                NfInstance::Stateless(n) => Stage::Stateless(n),
                NfInstance::Stateful(n) => {
                    if n.granularity() != Granularity::FiveTuple {
                        return Err(format!(
                            "{}: {} state needs the shared-table executor, which this build does not have yet",
                            n.name(),
                            n.granularity().name()
                        ));
                    }
                    if n.state_align() > 16 {
                        return Err(format!("{}: state alignment {} exceeds 16 bytes", n.name(), n.state_align()));
                    }
                    Stage::Stateful { nf: n, offset: 0, counters: NfCounters::default() }
                }
            });
        }
        // Pack smallest states first (stable for equal sizes), each at its alignment.
        let mut order: Vec<usize> = (0..stages.len()).filter(|&i| matches!(stages[i], Stage::Stateful { .. })).collect();
        order.sort_by_key(|&i| match &stages[i] {
            Stage::Stateful { nf, .. } => nf.state_size(),
            Stage::Stateless(_) => 0,
        });
        let mut size = 0;
        let mut timeout: Option<u64> = None;
        for i in order {
            if let Stage::Stateful { nf, offset, .. } = &mut stages[i] {
                size = align_up(size, nf.state_align());
                *offset = size;
                size += nf.state_size();
                if let Some(t) = nf.idle_timeout_ns() {
                    timeout = Some(timeout.map_or(t, |x| x.max(t)));
                }
            }
        }
        Ok(Chain { stages, state_size: size, idle_timeout_ns: timeout })
    }

    /// True if any stage keeps per-flow state.
    pub fn is_stateful(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Stateful { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    #[test]
    fn builds_and_reports_errors() {
        assert_eq!(Chain::build(&parse("forward -> count").unwrap()).unwrap().stages.len(), 2);
        let e = Chain::build(&parse("forward -> nope").unwrap()).err().unwrap();
        assert!(e.starts_with("unknown NF 'nope'"), "{e}");
        let e = Chain::build(&parse("forward(prot=1)").unwrap()).err().unwrap();
        assert_eq!(e, "forward: unknown parameter 'prot'");
        let e = Chain::build(&parse("forward(port=x)").unwrap()).err().unwrap();
        assert!(e.contains("'port=x'"), "{e}");
    }

    #[test]
    fn aggregates_state_smallest_first() {
        let c = Chain::build(&parse("fsc -> lb -> ratelimit").unwrap()).unwrap();
        let offs: Vec<(&str, usize)> = c
            .stages
            .iter()
            .filter_map(|s| match s {
                Stage::Stateful { nf, offset, .. } => Some((nf.name(), *offset)),
                _ => None,
            })
            .collect();
        // lb (4 B) first, then ratelimit (16 B, 8-aligned), then fsc (32 B).
        assert_eq!(offs, vec![("fsc", 24), ("lb", 0), ("ratelimit", 8)]);
        assert_eq!(c.state_size, 56);
    }
}

//! The memory a run will allocate, computed from its configuration alone and
//! checked against the machine's available memory (`MemAvailable`) before
//! anything is allocated: a size the machine cannot hold is a one-line error
//! naming the option and the bytes needed vs available (exit code 2), not an
//! allocation failure (SIGABRT) or the kernel's OOM killer halfway through.
//!
//! What is counted: per worker (real or virtual) its flow tables (`--flows`,
//! the IPv6 table beside it, one store per NF under per-NF matching), its
//! packet pool (`--pool`), its receive ring (`--ring`) and its NFs' private
//! arrays (parameters declared with `ParamSpec::allocates`); once per run the
//! coarse groups' shared tables (`--flows`), SCR's per-core logs
//! (`--scr-log`) and the replayed trace. Small fixed structures are left out:
//! the figure is a lower bound, so a refusal is always right.

use flowplane_nf::param_spec::private_bytes;
use flowplane_nf::{human_bytes, mem_available};
use flowplane_table::flow_table::FlowTable;
use flowplane_table::shared::SharedFlowTable;
use flowplane_wire::flow::{FiveTupleV4, FiveTupleV6};

use crate::chain::Chain;
use crate::chain::Stage;
use crate::error::EngineError;
use crate::exec::StateLayout;
use crate::runner::RunConfig;
use crate::spec::ChainSpec;
use crate::store::store_layout;

/// One item of a run's memory: what sets its size (an option, an NF parameter) and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Need {
    /// What sets the size, as the user wrote it (`--flows 1048576`, `amf(ues=...)`).
    pub what: String,
    /// Bytes allocated.
    pub bytes: u128,
}

/// Logical workers of a run (each has its own tables, pool and NF instances).
fn workers(cfg: &RunConfig) -> u128 {
    cfg.virtual_cores.unwrap_or(cfg.cores).max(1) as u128
}

/// The NFs' private arrays over every worker: known from the spec alone, so
/// checked before the first chain is built (building allocates them).
pub fn nf_needs(cfg: &RunConfig, spec: &ChainSpec) -> Vec<Need> {
    spec.nfs
        .iter()
        .map(|n| {
            let params: Vec<String> = n.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            Need {
                what: format!("{}({}) on {} worker(s)", n.name, params.join(", "), workers(cfg)),
                bytes: private_bytes(&n.name, &n.params) * workers(cfg),
            }
        })
        .filter(|n| n.bytes > 0)
        .collect()
}

/// Bytes of one flow store (IPv4 and IPv6 tables) as `FlowStore::new` sizes it.
fn store_bytes(flows: usize, state_size: usize, inline: bool) -> u128 {
    let size = state_size.max(1);
    let (f4, f6) = (flows.max(1), (flows / 4).max(1024));
    let v4 = FlowTable::<FiveTupleV4>::footprint_with(store_layout::<FiveTupleV4>(inline, size, f4), f4, size);
    let v6 = FlowTable::<FiveTupleV6>::footprint_with(store_layout::<FiveTupleV6>(inline, size, f6), f6, size);
    // A state too large for an entry is refused when the table is built; count nothing for it here.
    v4.unwrap_or(0) + v6.unwrap_or(0)
}

/// One worker's flow tables and the run's shared tables for `chain` and,
/// in a graph, every branch segment (each has its own).
fn chain_bytes(cfg: &RunConfig, chain: &Chain) -> (u128, u128) {
    let scr = cfg.scale == "scr";
    let mut per_worker: u128 = 0;
    if chain.is_stateful() {
        let info = cfg.exec.kind.info();
        let per_nf = info.layout == StateLayout::PerNf || !cfg.exec.match_sharing;
        // Under scr the executor's tables hold 1024 flows and the replica's table (at most --flows) the state.
        let flows = if scr { 1024 } else { cfg.exec.flows };
        per_worker = if per_nf {
            chain
                .stages
                .iter()
                .filter_map(|s| match s {
                    Stage::Stateful { nf, group: None, .. } => {
                        Some(store_bytes(flows, nf.state_size(), cfg.exec.inline_entries))
                    }
                    _ => None,
                })
                .sum()
        } else {
            store_bytes(flows, chain.state_size, cfg.exec.inline_entries)
        };
        if scr {
            per_worker += FlowTable::<FiveTupleV4>::footprint(cfg.exec.flows, chain.state_size.max(1)).unwrap_or(0);
        }
    }
    let mut shared: u128 =
        chain.groups.iter().map(|g| SharedFlowTable::<u128>::footprint(cfg.exec.flows, 1 + g.words)).sum();
    for b in &chain.branches {
        let (t, s) = chain_bytes(cfg, &b.chain);
        per_worker += t;
        shared += s;
    }
    (per_worker, shared)
}

/// Everything [`nf_needs`] leaves out, from the built chain (its state sizes and coarse groups).
pub fn run_needs(cfg: &RunConfig, chain: &Chain) -> Vec<Need> {
    let w = workers(cfg);
    let scr = cfg.scale == "scr";
    let mut needs = Vec::new();
    let (tables, shared) = chain_bytes(cfg, chain);
    if tables > 0 {
        needs.push(Need {
            what: format!("--table-capacity {} (flow tables of {w} worker(s))", cfg.exec.flows),
            bytes: tables * w,
        });
    }
    if shared > 0 {
        needs.push(Need { what: format!("--table-capacity {} (shared tables)", cfg.exec.flows), bytes: shared });
    }
    let pool = cfg.pool_buffers.max(2 * flowplane_packet::MAX_BATCH) as u128;
    needs.push(Need {
        what: format!("--pool {} ({w} worker(s))", cfg.pool_buffers),
        bytes: pool * flowplane_packet::SPREAD_BUF_SIZE as u128 * w,
    });
    // A ring entry is a packet index and its metadata: 16 bytes is a floor.
    needs.push(Need { what: format!("--ring {} ({w} worker(s))", cfg.ring), bytes: cfg.ring as u128 * 16 * w });
    if scr {
        // Each log entry: a tag word and a 32-byte record.
        let entries = (cfg.scr.log_entries.max(2) as u128).next_power_of_two();
        needs.push(Need { what: format!("--scr-log {}", cfg.scr.log_entries), bytes: entries * 40 * w });
    }
    needs
}

/// Bytes a generated trace takes in memory: each frame in whole 64-byte lines plus ~24 bytes of per-packet
/// metadata (length, hash, key, timestamp, index).
pub fn generated_bytes(cfg: &flowplane_trace::gen::GenConfig) -> u128 {
    use flowplane_trace::gen::SizeSpec;
    let size = match &cfg.size {
        SizeSpec::Fixed(s) => u128::from(*s),
        SizeSpec::Range(a, b) => (u128::from(*a) + u128::from(*b)) / 2,
        SizeSpec::Mix(m) => m.iter().map(|(s, _)| u128::from(*s)).min().unwrap_or(64),
    };
    u128::from(cfg.packets) * (size.div_ceil(64) * 64 + 24)
}

/// Refuses `needs` when they add up to more than the available memory: one
/// line naming the largest item (the option to lower) and the bytes needed
/// vs available. Where the available memory cannot be read nothing is refused.
pub fn check(needs: &[Need]) -> Result<(), EngineError> {
    let Some(avail) = mem_available() else { return Ok(()) };
    check_against(needs, u128::from(avail))
}

/// [`check`] against `avail` bytes.
pub fn check_against(needs: &[Need], avail: u128) -> Result<(), EngineError> {
    let total: u128 = needs.iter().map(|n| n.bytes).sum();
    if total <= avail {
        return Ok(());
    }
    let Some(big) = needs.iter().max_by_key(|n| n.bytes) else { return Ok(()) };
    Err(EngineError::Config(format!(
        "{}: needs {} of memory{}, {} available (lower it)",
        big.what,
        human_bytes(big.bytes),
        if total > big.bytes { format!(" ({} in all)", human_bytes(total)) } else { String::new() },
        human_bytes(avail)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_item_is_named_with_bytes_needed_and_available() {
        let needs =
            [Need { what: "--pool 4096".into(), bytes: 1 << 20 }, Need { what: "--flows 9".into(), bytes: 3 << 30 }];
        assert!(check_against(&needs, 4 << 30).is_ok());
        let e = check_against(&needs, 2 << 30).unwrap_err().to_string();
        assert!(e.starts_with("--flows 9: needs 3.0 GiB of memory (3.0 GiB in all), 2.0 GiB available"), "{e}");
    }

    #[test]
    fn table_footprints_grow_with_capacity() {
        let small = store_bytes(1 << 10, 64, false);
        let big = store_bytes(1 << 30, 64, true);
        // 2^30 entries of at least 64 bytes each: more than 64 GiB.
        assert!(big > 64 << 30 && small < 1 << 20, "{small} {big}");
        assert!(SharedFlowTable::<u128>::footprint(1 << 30, 9) >= 128u128 << 30);
    }
}

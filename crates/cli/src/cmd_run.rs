//! `flowplane run`: load traffic (trace file or generator) into the replay
//! source, run a chain on N cores, print the report.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValue;
use clap::Parser;
use flowplane_engine::exec::{ExecConfig, ExecKind};
use flowplane_engine::runner::{prepare, run_prepared, Input, Output};
use flowplane_engine::{spec, RunConfig};
use flowplane_io::cpu;
use flowplane_table::FullPolicy;
use flowplane_trace::gen::{GenConfig, Generator};

use crate::cmd_gen::GenArgs;
use crate::error::CliError;

/// The chain `flowplane run` uses when none is given.
pub const DEFAULT_CHAIN: &str = "lb(backends=16) -> fsc -> ratelimit(pps=1000)";
/// The traffic of the default demo: 64-byte UDP packets, 1M flows, random order.
pub const DEFAULT_GEN: &str = "--flows 1000000 --packets 4000000 --size 64 --dist uniform --order random --seed 1";

/// `flowplane run`'s options, grouped by concern (each group a help heading);
/// `--config FILE` gives any of them from a TOML file ([`crate::run_config`]).
#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// A TOML file with the run's options: each option's name without its dashes as a key
    /// (`cores = 2`, `idle_timeout = 10`, flags `= true`, `port = ["afpacket:b"]`), the chain as
    /// `chain = "..."` or [[nf]] tables. Options on the command line override the file's.
    /// A live run with --ctl re-reads it on `flowplane ctl PATH reload`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The chain from the config file's [[nf]] tables (set by --config).
    #[arg(skip)]
    pub nf_chain: Option<spec::ChainSpec>,
    /// The config file and command line the run was built from (set by --config, kept for `ctl reload`).
    #[arg(skip)]
    pub source: Option<crate::run_config::Source>,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    #[command(flatten)]
    pub outputs: OutputArgs,
    #[command(flatten)]
    pub live: LiveArgs,
    #[command(flatten)]
    pub repl: ReplArgs,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    #[command(flatten)]
    pub tables: TableArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub strategy: StrategyArgs,
}

/// The traffic: a trace, generated packets or a live port, and how long and how fast it is replayed.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Traffic")]
pub struct TrafficArgs {
    // The port kinds are the registry's (flowplane_io::port::PORTS; `flowplane ports` lists them).
    #[arg(long, short = 'i', conflicts_with = "gen", help = input_help())]
    pub input: Option<PathBuf>,
    /// Generate the traffic in memory instead, with `flowplane gen` options
    /// (e.g. "--flows 1000 --packets 100000 --proto tcp").
    #[arg(long, allow_hyphen_values = true)]
    pub gen: Option<String>,
    /// Passes over the trace (default 1 for --input/--gen).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<u64>(1, u32::MAX as u64))]
    pub loops: Option<u64>,
    /// Run for this many seconds (the trace loops as needed).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(86400.0))]
    pub duration: Option<f64>,
    /// Seconds processed before measuring starts (added to --duration).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::real(0.0, 3600.0))]
    pub warmup: Option<f64>,
    /// Offered load in packets/s over all cores (default: full speed); suffixes k/M/G (2M).
    /// At least 1 pps, and without --duration the paced run must end within a day
    /// (trace packets x --loops / rate <= 86400 s).
    #[arg(long, allow_negative_numbers = true, value_parser = rate_value)]
    pub rate: Option<f64>,
}

/// Where packets, state exports and the report go.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Outputs")]
pub struct OutputArgs {
    /// Where packets with verdict 0 go: a pcap file (FILE or pcap:FILE) or a live port (afpacket:IFACE, ...).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// More output ports, for verdicts 1, 2, ... in order (NFs choose a port: forward(port=1), route).
    /// NAME=PORT names one for a chain graph's port(NAME) and branch labels. A replay
    /// writing a pcap --output takes pcap files here too (verdict i to the i-th file).
    #[arg(long = "port", value_name = "[NAME=]PORT")]
    pub ports: Vec<String>,
    /// Stamp --output packets with the time they were sent instead of their own (the input's) time.
    #[arg(long)]
    pub restamp: bool,
    /// Export an NF's state at the end of the run: NF=FILE.csv or NF=FILE.json (repeatable).
    #[arg(long, value_name = "NF=FILE")]
    pub export: Vec<String>,
    /// Export flow records (fsc, hh, lb, conntrack, fw), NAT events (nat) and usage records (upf)
    /// over IPFIX to a collector: udp:HOST:PORT, tcp:HOST:PORT or file:PATH (repeatable: every
    /// collector gets every message).
    #[arg(long, value_name = "COLLECTOR")]
    pub ipfix: Vec<String>,
    /// IPFIX active timeout (s of packet time): a live flow (and upf's usage per URR) is also
    /// reported every S (default: only at its end — idle timeout, end of flow, end of the run).
    #[arg(long, value_name = "S", value_parser = crate::num::positive(1e9))]
    pub ipfix_active: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Live ports and the running service: port options, metrics, the control socket.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Live ports and service")]
pub struct LiveArgs {
    /// Put live ports in promiscuous mode while they are open (the kinds that take it: `flowplane ports`).
    #[arg(long)]
    pub promisc: bool,
    /// DPDK EAL arguments for dpdk: ports, as one string (default "--no-huge --no-pci -m 1024 --no-shconf").
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub eal: Option<String>,
    /// Serve Prometheus metrics on this address while the run goes on (e.g. 127.0.0.1:9100): live runs and replays.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Serve the control socket at PATH while the run goes on (`flowplane ctl PATH show runtime`, `set`, `load`,
    /// `export`, `stop`): live runs and replays (paced with --rate, a replay can be watched and changed as it plays).
    #[arg(long, value_name = "PATH")]
    pub ctl: Option<std::path::PathBuf>,
}

/// State replication between instances (`--replicate`).
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Replication")]
pub struct ReplArgs {
    /// Replicate NF state (nat mappings, lb's connection table) to a peer flowplane instance: udp:HOST:PORT
    /// (an active instance's updates go there; a standby's resync requests). Same chain and --cores on both.
    #[arg(long, value_name = "udp:HOST:PORT")]
    pub replicate: Option<String>,
    /// The replication socket's address, udp:ADDR:PORT: a standby receives the peer's updates there, an
    /// active instance the peer's resync requests.
    #[arg(long, value_name = "udp:ADDR:PORT")]
    pub replicate_listen: Option<String>,
    /// active: send this instance's updates (default with --replicate); standby: import the peer's
    /// (default otherwise); both: active-active.
    #[arg(long, value_name = "ROLE", value_parser = ["active", "standby", "both"])]
    pub replicate_role: Option<String>,
}

/// The chain and how each core runs it (executor, batch, optimisations).
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Chain and executor")]
pub struct PipelineArgs {
    /// Chain spec, e.g. "forward -> count", or a chain graph splitting packets by verdict,
    /// e.g. "acl(rules=r.txt) -> { allow: fsc -> port(a) ; deny: count -> port(b) }" (with --port a=.. --port b=..).
    #[arg(long, short = 'c', default_value = DEFAULT_CHAIN, conflicts_with = "chain_file")]
    pub chain: String,
    /// Chain from a TOML file (`chain = "..."` or `[[nf]]` tables with `name` and parameters).
    #[arg(long)]
    pub chain_file: Option<PathBuf>,
    /// Executor (the engine's registry: batch = FAJITA, rtc, pernf = VPP, microbatch = FastClick, interleaved[:K] = GuNFu).
    #[arg(long, default_value = "batch", value_parser = executors())]
    pub exec: String,
    /// Packets per batch (1..=256).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 256))]
    pub batch: usize,
    /// Disable software prefetching (bulk lookups, state lines, NF prefetch hooks).
    #[arg(long)]
    pub no_prefetch: bool,
    /// Skip the NFs' prefetch hooks for indirect state (the table still prefetches).
    #[arg(long)]
    pub no_prefetch_hooks: bool,
    /// Disable FAJITA's auxiliary table: coarse (shared) state is then looked up per packet.
    #[arg(long)]
    pub no_aux: bool,
    /// Disable data packing: each 5-tuple NF's state on its own line of the flow's block, in chain order.
    #[arg(long)]
    pub no_packing: bool,
    /// Disable redundant-match removal: one flow match per NF (batch then runs as pernf).
    #[arg(long)]
    pub no_match_sharing: bool,
}

/// The per-core flow tables.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Flow tables")]
pub struct TableArgs {
    /// Flow-table capacity per core (IPv4 flows); default 2097152. Not the flow population: that is the traffic's
    /// (`gen --flows`).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 1 << 30))]
    pub table_capacity: Option<usize>,
    /// Deprecated name of --table-capacity (warns once).
    #[arg(long, hide = true, value_name = "N", allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 1 << 30))]
    pub flows: Option<usize>,
    /// Idle timeout of flow state in seconds, when no NF sets one.
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true, value_parser = crate::num::positive(1e9))]
    pub idle_timeout: f64,
    /// When a flow table is full: reject (count and pass without state) or evict the least recently used entry.
    #[arg(long, default_value = "reject", value_parser = ["reject", "evict"])]
    pub table_full: String,
    /// Secret of the flow tables' hash. Default: drawn at random for each run, so no one can compute flows that
    /// collide into one bucket; set it to reproduce a run in which a table filled (results do not depend on it
    /// while the tables have room).
    #[arg(long, value_name = "N", value_parser = crate::num::whole::<u32>(0, u32::MAX as u64))]
    pub hash_seed: Option<u32>,
}

impl TableArgs {
    /// The default `--table-capacity`.
    pub const DEFAULT_CAPACITY: usize = 1 << 21;

    /// The capacity per core and the option that gave it (`--flows` warns once per process that it is deprecated).
    pub fn capacity(&self) -> Result<(usize, &'static str), CliError> {
        match (self.table_capacity, self.flows) {
            (Some(_), Some(_)) => Err(CliError::new(
                "--flows and --table-capacity both given: --flows is the deprecated name of --table-capacity",
            )),
            (Some(c), None) => Ok((c, "--table-capacity")),
            (None, Some(f)) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "warning: run --flows is deprecated: it is the table capacity per core, now --table-capacity (the flow population is gen's --flows)"
                    )
                });
                Ok((f, "--flows"))
            }
            (None, None) => Ok((Self::DEFAULT_CAPACITY, "--table-capacity")),
        }
    }
}

/// The worker cores and their buffers.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Workers")]
pub struct WorkerArgs {
    /// Worker cores (default: all available).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 512))]
    pub cores: Option<usize>,
    /// Buffers per core's packet pool.
    #[arg(long, default_value_t = 4096, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(512, 1 << 24))]
    pub pool: usize,
    /// Receive ring entries per core of a replay's emulated NIC (a full ring drops and counts:
    /// rx_ring_full); default 4096. A live port's rings are its own.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(512, 1 << 20))]
    pub ring: Option<usize>,
    /// Do not pin workers to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Run N logical workers in turn on the real cores and report a projected throughput
    /// (shared-nothing strategies only).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 4096))]
    pub virtual_cores: Option<usize>,
}

/// How packets are spread over the cores: the strategy and its controller.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Multi-core strategy")]
pub struct StrategyArgs {
    /// Multi-core strategy: rss (shared-nothing sharding), shared (round-robin spray, shared state),
    /// rsspp (RSS++ rebalancing with state hand-over), scr (state-compute replication: a sequencer
    /// sprays round robin with piggybacked history; every core keeps a replica), dyssect (shards on
    /// working cores, heavy flows offloaded by NIC flow rules, MILP + heuristic controller).
    #[arg(long, default_value = "rss", value_parser = clap::builder::PossibleValuesParser::new(flowplane_scale::strategy::names()))]
    pub scale: String,
    /// Use the symmetric RSS key (both directions of a connection on one core).
    #[arg(long)]
    pub symmetric_rss: bool,
    /// Control period of the strategy, in milliseconds.
    #[arg(long, default_value_t = 100.0, allow_negative_numbers = true, value_parser = crate::num::real(1.0, 60_000.0))]
    pub scale_period_ms: f64,
    /// How long the emulated NIC takes to apply a RETA update or a flow rule (rsspp, dyssect; replay only):
    /// ideal (at once), bcm57416 (228 us), nfp4000 (1.07 ms), connectx4 (359 ms), or reta=DUR:rule=DUR.
    #[arg(long, value_name = "NAME")]
    pub nic_profile: Option<String>,
    /// --scale scr: history records piggybacked per packet (default: the number of cores; at least that).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(1, 4096))]
    pub scr_history: Option<usize>,
    /// --scale scr: per-core logs and loss recovery (SCR Algorithm 1).
    #[arg(long)]
    pub scr_recovery: bool,
    /// --scale scr: inject loss between the sequencer and the cores (probability per packet, 0..1).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, allow_negative_numbers = true, value_parser = crate::num::real(0.0, 1.0))]
    pub scr_loss: f64,
    /// --scale scr: entries of each core's recovery log (a power of two).
    #[arg(long, value_name = "ENTRIES", default_value_t = flowplane_engine::scr::DEFAULT_LOG, allow_negative_numbers = true, value_parser = crate::num::whole::<usize>(2, 1 << 26))]
    pub scr_log: usize,
    /// --scale scr: seed of the injected loss pattern.
    #[arg(long, default_value_t = 1, value_parser = crate::num::whole::<u64>(0, u64::MAX))]
    pub seed: u64,
    /// A priority traffic class measured apart (and kept on SLO-sized working cores by
    /// dyssect): dport=P[-Q] and/or dscp=D, comma-separated.
    #[arg(long)]
    pub priority: Option<String>,
    /// The priority class's latency SLO in microseconds (dyssect sizes working cores with Kingman's formula).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::num::positive(1e9))]
    pub slo_us: Option<f64>,
    /// Dyssect's long timescale (MILP period), in milliseconds.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true, value_parser = crate::num::real(1.0, 600_000.0))]
    pub long_period_ms: f64,
    /// Dyssect's MILP time budget, in milliseconds (the incumbent is used when it runs out).
    #[arg(long, default_value_t = 200.0, allow_negative_numbers = true, value_parser = crate::num::real(1.0, 600_000.0))]
    pub solver_budget_ms: f64,
}

/// `--exec` values: every registered executor (with its parameter, e.g.
/// `interleaved:8`), listed with its description in `--help`.
#[derive(Clone)]
struct Executors;

impl clap::builder::TypedValueParser for Executors {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let s = value.to_str().ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidUtf8).with_cmd(cmd))?;
        match ExecKind::parse(s) {
            Ok(_) => Ok(s.to_string()),
            // The reason (an unknown name and the known ones, or the parameter's range) in the one line.
            Err(e) => {
                let arg = arg.map_or("--exec".to_string(), |a| a.to_string());
                let msg = format!("invalid value '{s}' for '{arg}': {e}\n");
                Err(clap::Error::raw(clap::error::ErrorKind::ValueValidation, msg).with_cmd(cmd))
            }
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(ExecKind::all().map(|k| PossibleValue::new(k.info().name).help(k.info().about))))
    }
}

fn executors() -> Executors {
    Executors
}

/// `--rate` values: a number with an optional k/M/G suffix, as `gen --rate`.
fn rate_value(s: &str) -> Result<f64, String> {
    crate::num::real(1.0, 1e12)(s).map_err(|e| format!("{e} packets/s"))
}

/// Longest run `--rate` may pace without `--duration` (a day).
const MAX_PACED_S: f64 = 86_400.0;

/// Parses a `--gen` string with `flowplane gen`'s own option parser into a
/// validated configuration (nothing generated yet). `--size-mix FILE` and
/// `--dist cdf:FILE` read their file here.
pub fn parse_gen_config(s: &str) -> Result<GenConfig, CliError> {
    #[derive(Parser, Debug)]
    #[command(name = "--gen", no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
    struct Wrap {
        #[command(flatten)]
        args: GenArgs,
    }
    let mut tokens = vec!["-o".to_string(), "/dev/null".to_string()];
    tokens.extend(s.split_whitespace().map(str::to_string));
    let w = Wrap::try_parse_from(tokens).map_err(|e| {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or("invalid option").trim_start_matches("error: ").to_string();
        CliError::new(format!("--gen: {first}"))
    })?;
    w.args.to_config()
}

/// Parses a `--gen` string (see [`parse_gen_config`]) into a ready generator,
/// refusing a trace the machine's memory cannot hold before generating it
/// (the generator's set-up already walks every packet for TCP).
pub fn parse_gen(s: &str) -> Result<Generator, CliError> {
    let cfg = parse_gen_config(s)?;
    let need = flowplane_engine::budget::Need {
        what: format!("--gen --packets {}", cfg.packets),
        bytes: flowplane_engine::budget::generated_bytes(&cfg),
    };
    flowplane_engine::budget::check(&[need])?;
    Generator::new(cfg).map_err(|e| CliError::new(format!("--gen: {e}")))
}

pub(crate) fn validate(a: &RunArgs) -> Result<(), CliError> {
    if let Some(c) = a.workers.cores {
        if c == 0 || c > 512 {
            return Err(CliError::new(format!("--cores {c}: must be between 1 and 512")));
        }
    }
    if a.pipeline.batch == 0 || a.pipeline.batch > flowplane_packet::MAX_BATCH {
        return Err(CliError::new(format!(
            "--batch {}: must be between 1 and {}",
            a.pipeline.batch,
            flowplane_packet::MAX_BATCH
        )));
    }
    if let Some(d) = a.traffic.duration {
        if !(d.is_finite() && d > 0.0 && d <= 86_400.0) {
            return Err(CliError::new(format!("--duration {d}: must be a positive number of seconds (<= 86400)")));
        }
    }
    if let Some(r) = a.traffic.rate {
        if !(r.is_finite() && (1.0..=1e12).contains(&r)) {
            return Err(CliError::new(format!("--rate {r}: must be a packet rate between 1 and 1e12 packets/s")));
        }
    }
    if let Some(w) = a.traffic.warmup {
        if !(w.is_finite() && (0.0..=3600.0).contains(&w)) {
            return Err(CliError::new(format!("--warmup {w}: must be between 0 and 3600 seconds")));
        }
    }
    if a.traffic.loops == Some(0) {
        return Err(CliError::new("--loops 0: must be at least 1"));
    }
    let (capacity, name) = a.tables.capacity()?;
    if capacity == 0 || capacity > 1 << 30 {
        return Err(CliError::new(format!("{name} {capacity}: must be between 1 and {}", 1u64 << 30)));
    }
    if !(a.tables.idle_timeout.is_finite() && a.tables.idle_timeout > 0.0) {
        return Err(CliError::new(format!(
            "--idle-timeout {}: must be a positive number of seconds",
            a.tables.idle_timeout
        )));
    }
    if !(a.strategy.scale_period_ms.is_finite() && (1.0..=60_000.0).contains(&a.strategy.scale_period_ms)) {
        return Err(CliError::new(format!(
            "--scale-period-ms {}: must be between 1 and 60000",
            a.strategy.scale_period_ms
        )));
    }
    for (name, v) in
        [("--long-period-ms", a.strategy.long_period_ms), ("--solver-budget-ms", a.strategy.solver_budget_ms)]
    {
        if !(v.is_finite() && (1.0..=600_000.0).contains(&v)) {
            return Err(CliError::new(format!("{name} {v}: must be between 1 and 600000")));
        }
    }
    if let Some(s) = a.strategy.slo_us {
        if !(s.is_finite() && s > 0.0) {
            return Err(CliError::new(format!("--slo-us {s}: must be a positive number of microseconds")));
        }
    }
    if let Some(p) = &a.strategy.priority {
        flowplane_engine::runner::PriorityClass::parse(p).map_err(CliError::new)?;
    }
    let ring = a.workers.ring.unwrap_or(DEFAULT_RING);
    if !(2 * flowplane_packet::MAX_BATCH..=1 << 20).contains(&ring) {
        return Err(CliError::new(format!(
            "--ring {}: must be between {} and {}",
            ring,
            2 * flowplane_packet::MAX_BATCH,
            1 << 20
        )));
    }
    if let Some(v) = a.workers.virtual_cores {
        if v == 0 || v > 4096 {
            return Err(CliError::new(format!("--virtual-cores {v}: must be between 1 and 4096")));
        }
    }
    if !(a.strategy.scr_loss.is_finite() && (0.0..=1.0).contains(&a.strategy.scr_loss)) {
        return Err(CliError::new(format!(
            "--scr-loss {}: must be a probability between 0 and 1",
            a.strategy.scr_loss
        )));
    }
    if a.strategy.scale != "scr"
        && (a.strategy.scr_history.is_some() || a.strategy.scr_recovery || a.strategy.scr_loss > 0.0)
    {
        return Err(CliError::new("--scr-history/--scr-recovery/--scr-loss need --scale scr".to_string()));
    }
    // Options that act only in some runs are refused where they would change
    // nothing (a value equal to the default is the run without the option).
    let scr = a.strategy.scale == "scr";
    if a.strategy.seed != 1 && !(scr && a.strategy.scr_loss > 0.0) {
        return Err(CliError::new(format!(
            "--seed {}: seeds the loss --scr-loss injects; it needs --scale scr --scr-loss RATE",
            a.strategy.seed
        )));
    }
    if a.strategy.scr_log != flowplane_engine::scr::DEFAULT_LOG && !(scr && a.strategy.scr_recovery) {
        return Err(CliError::new(format!(
            "--scr-log {}: sizes the recovery logs; it needs --scale scr --scr-recovery",
            a.strategy.scr_log
        )));
    }
    let dyssect = a.strategy.scale == "dyssect";
    // What the strategy is made of decides which options apply to it.
    let strategy = flowplane_scale::strategy::by_name(&a.strategy.scale, flowplane_scale::strategy::DEFAULT_PERIOD)
        .map_err(|e| CliError::new(format!("--scale {e}")))?;
    let controlled = strategy.controller().is_some();
    if a.strategy.scale_period_ms != 100.0 && !controlled {
        return Err(CliError::new(format!(
            "--scale-period-ms {}: the control period of rsspp and dyssect; --scale {} runs no controller",
            a.strategy.scale_period_ms, a.strategy.scale
        )));
    }
    for (name, v, default) in [
        ("--long-period-ms", a.strategy.long_period_ms, 1000.0),
        ("--solver-budget-ms", a.strategy.solver_budget_ms, 200.0),
    ] {
        if v != default && !dyssect {
            return Err(CliError::new(format!("{name} {v}: sets Dyssect's controller; it needs --scale dyssect")));
        }
    }
    if let (Some(s), None, false) = (a.strategy.slo_us, &a.strategy.priority, dyssect) {
        return Err(CliError::new(format!(
            "--slo-us {s}: the SLO of the --priority class (and dyssect's working-core cap); it needs --priority or --scale dyssect"
        )));
    }
    if a.strategy.symmetric_rss && strategy.delivery().sprays() {
        return Err(CliError::new(format!(
            "--symmetric-rss: --scale {} sprays packets over the cores round robin; no RSS key steers them",
            a.strategy.scale
        )));
    }
    if a.outputs.restamp && a.outputs.output.is_none() {
        return Err(CliError::new("--restamp stamps the packets --output writes; it needs --output"));
    }
    if let Some(p) = &a.strategy.nic_profile {
        let p = flowplane_engine::runner::NicProfile::parse(p).map_err(CliError::new)?;
        if !p.is_ideal() && !controlled {
            return Err(CliError::new(format!(
                "--nic-profile {}: --scale {} never updates the NIC's table (the profile applies to rsspp and dyssect)",
                p.name, a.strategy.scale
            )));
        }
    }
    if a.workers.pool < 2 * flowplane_packet::MAX_BATCH {
        return Err(CliError::new(format!(
            "--pool {}: must be at least {}",
            a.workers.pool,
            2 * flowplane_packet::MAX_BATCH
        )));
    }
    Ok(())
}

/// A replay served while it runs (`--ctl`, `--metrics`): the same control
/// socket and endpoint as a live run, over the replay's workers (no ports:
/// `show ports` lists none; `ctl stop` or Ctrl-C ends the replay early, with
/// its report and exports). With `status` (stderr a terminal, no `--quiet`)
/// a status line on stderr, redrawn every second, shows its rate and loads.
fn serve_replay(
    a: &RunArgs,
    cfg: &RunConfig,
    spec: &flowplane_engine::spec::ChainSpec,
    prepared: &flowplane_engine::runner::Prepared,
    output: Output,
    status: bool,
) -> Result<flowplane_engine::Report, CliError> {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let what = match (&a.traffic.input, cfg.rate_pps) {
        (Some(p), Some(r)) => format!("replay of {} at {r} packets/s", p.display()),
        (Some(p), None) => format!("replay of {}", p.display()),
        (None, Some(r)) => format!("generated traffic at {r} packets/s"),
        (None, None) => "generated traffic".to_string(),
    };
    let live = Arc::new(flowplane_engine::live::Live::for_replay(what, flowplane_engine::runner::workers(cfg)));
    let stop = Arc::new(AtomicBool::new(false));
    crate::cmd_live::watch_signals(&stop)?;
    let server = match &a.live.metrics {
        Some(addr) => Some(crate::metrics::serve(addr, Arc::clone(&live), Arc::clone(&stop))?),
        None => None,
    };
    let ctl = match &a.live.ctl {
        Some(path) => {
            Some(crate::ctl::serve(path, Arc::clone(&live), spec.clone(), Arc::clone(&stop), a.source.clone())?)
        }
        None => None,
    };
    let mut line = crate::metrics::Status::default();
    let mut tick = |l: &flowplane_engine::live::Live, at: Duration| {
        use std::io::Write as _;
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{}", line.line(l, at));
        let _ = e.flush();
    };
    let tick: Option<flowplane_engine::runtime::StatusTick<'_>> = if status { Some(&mut tick) } else { None };
    let watch = flowplane_engine::runtime::Watch { stop: Some(&stop), tick, service: Some(&live) };
    let report = flowplane_engine::runner::run_prepared_watched(cfg, spec, prepared, output, watch);
    if status {
        // The report follows on stdout: the status line goes.
        eprint!("\r\x1b[2K");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(h) = server {
        let _ = h.join();
    }
    drop(ctl);
    Ok(report?)
}

/// Receive ring entries per core of the emulated NIC when `--ring` is not given.
pub const DEFAULT_RING: usize = 4096;

/// `flowplane run`; `cli` is the command line's words after `run` (merged over a `--config` file).
pub fn run_cmd(mut a: RunArgs, cli: &[std::ffi::OsString]) -> Result<(), CliError> {
    if let Some(path) = a.config.clone() {
        let m = crate::run_config::merge(&path, cli)?;
        a = m.args;
        a.nf_chain = m.nf;
        a.source = Some(crate::run_config::Source { path, cli: cli.to_vec(), values: m.values });
    }
    validate(&a)?;
    check_port_options(&a)?;
    #[cfg(feature = "dpdk")]
    if let Some(e) = &a.live.eal {
        flowplane_io::port::dpdk::set_eal_args(e.split_whitespace().map(str::to_string).collect());
    }
    if a.outputs.output.is_none() && !a.outputs.ports.is_empty() {
        return Err(CliError::new("--port gives verdicts 1, 2, ...: it needs --output (verdict 0) first"));
    }
    if let Some(port) = crate::cmd_live::live_input(&a)? {
        if a.strategy.nic_profile.is_some() {
            return Err(CliError::new(
                "--nic-profile models the emulated NIC of a replay; a live port's NIC has its own",
            ));
        }
        return crate::cmd_live::run(a, port);
    }
    a.traffic.input = a.traffic.input.as_deref().map(crate::cmd_live::file_of);
    let demo = a.traffic.input.is_none() && a.traffic.gen.is_none();
    if demo {
        a.traffic.gen = Some(DEFAULT_GEN.to_string());
        if a.traffic.loops.is_none() && a.traffic.duration.is_none() {
            a.traffic.duration = Some(3.0);
        }
    }
    let (cfg, spec) = config(&a)?;
    let cores = cfg.cores;
    let input = match &a.traffic.input {
        Some(path) => Input::File(path),
        None => Input::Generated(Box::new(parse_gen(a.traffic.gen.as_deref().unwrap_or(DEFAULT_GEN))?)),
    };
    // Every destination is checked before the first packet: export files first
    // (creating the pcap truncates an existing one), then the output.
    let exports = crate::results::create_exports(&parse_exports(&a.outputs.export)?)?;
    let mut pcap_paths = Vec::new();
    let is_live = |p: &str| crate::io_port_spec(p).is_some_and(|s| s.is_live());
    let live_out = a.outputs.output.as_ref().is_some_and(|p| is_live(&p.to_string_lossy()))
        || a.outputs.ports.iter().any(|p| is_live(port_arg(p).1));
    let output = match &a.outputs.output {
        Some(_) if live_out => {
            let (ports, files) = crate::cmd_live::output_ports(&a, cores, 0)?;
            if !files.is_empty() {
                return Err(CliError::new(
                    "a replayed input writes either live ports or pcap files (--output and --port), not both",
                ));
            }
            Output::Ports(ports)
        }
        Some(p) => {
            // Verdict 0 to --output, verdict i to the i-th --port file.
            let mut ws = Vec::new();
            let files = std::iter::once(p.clone()).chain(a.outputs.ports.iter().map(|q| PathBuf::from(port_arg(q).1)));
            for (i, f) in files.enumerate() {
                let f = crate::cmd_live::file_of(&f);
                let what = if i == 0 { "--output".to_string() } else { format!("--port {}", f.display()) };
                ws.push(crate::results::create_pcap(&f, &what)?);
                pcap_paths.push(f);
            }
            if ws.len() == 1 {
                Output::Pcap(ws.remove(0))
            } else {
                Output::Pcaps(ws)
            }
        }
        None => Output::Discard,
    };
    let prepared = prepare(&cfg, &spec, input, a.strategy.symmetric_rss)?;
    check_paced_length(&cfg, prepared.load.packets)?;
    // On a terminal a replay shows a status line: it is served to itself (its workers publish twice a second).
    let status = flowplane_trace::progress::shown();
    let report = if a.live.ctl.is_some() || a.live.metrics.is_some() || status {
        serve_replay(&a, &cfg, &spec, &prepared, output.clone(), status)?
    } else {
        run_prepared(&cfg, &spec, &prepared, output.clone())?
    };
    let (load, symmetric, auto_symmetric) = (prepared.load, prepared.plan.symmetric, prepared.auto_symmetric);
    // From here on nothing aborts the command: whatever cannot be written is
    // reported and turns the exit code to 1, after the report.
    let mut lost = crate::results::Losses::default();
    match output {
        Output::Pcap(w) => {
            if let Some(p) = pcap_paths.first() {
                lost.close_pcap(p, w);
            }
        }
        Output::Pcaps(ws) => {
            for (p, w) in pcap_paths.iter().zip(ws) {
                lost.close_pcap(p, w);
            }
        }
        _ => {}
    }
    lost.commit_exports(exports, |nf| export_rows(&report, nf));
    if a.outputs.json {
        let mut v = serde_json::to_value(&report)?;
        v["load"] = serde_json::to_value(load)?;
        v["symmetric_rss"] = serde_json::Value::Bool(symmetric);
        v["lost"] = lost.to_json();
        outln!("{}", serde_json::to_string_pretty(&crate::provenance::stamp(serde_json::to_value(&v)?))?);
    } else {
        if demo {
            outln!("flowplane demo: {DEFAULT_GEN}");
        }
        outln!(
            "loaded       {} packets ({} unclassified, {} skipped), steered at receive over {} queue(s)",
            load.packets,
            load.unclassified,
            load.skipped,
            a.workers.virtual_cores.unwrap_or(cores)
        );
        if load.unparsed.total() > 0 {
            outln!("unparsed     {} (not replayed)", load.unparsed);
        }
        if let Some(nf) = auto_symmetric {
            outln!("rss          symmetric key ({nf} needs both directions of a connection on one core)");
        }
        out!("{report}");
        for l in lost.lines() {
            outln!("{l}");
        }
    }
    lost.into_result()
}

/// The rows `report` exported for `nf` (none if it exported nothing).
pub(crate) fn export_rows(report: &flowplane_engine::Report, nf: &str) -> Vec<serde_json::Value> {
    report.exports.iter().find(|(n, _)| n == nf).map(|(_, r)| r.clone()).unwrap_or_default()
}

/// Refuses a paced run that would not end within [`MAX_PACED_S`] (`--rate 1e-9`):
/// with a loop count and no duration, its length is packets x loops / rate.
fn check_paced_length(cfg: &RunConfig, packets: u64) -> Result<(), CliError> {
    if let (Some(rate), Some(loops), None) = (cfg.rate_pps, cfg.loops, cfg.duration) {
        let secs = packets as f64 * loops as f64 / rate;
        if secs > MAX_PACED_S {
            return Err(CliError::new(format!(
                "--rate {rate}: {packets} packets x {loops} loop(s) would take {secs:.0} s (more than a day); raise the rate or give --duration"
            )));
        }
    }
    Ok(())
}

/// `--input`'s help: a trace, or a port of a registered kind.
fn input_help() -> String {
    format!(
        "Trace to replay (pcap or pcapng; Ethernet, raw IP, Linux cooked, loopback, PPP, Cisco HDLC), \
         or a live port to run on until Ctrl-C: {} (`flowplane ports` lists them)",
        flowplane_io::port::syntaxes()
    )
}

/// The ports a run names: `--input`, `--output`, then each `--port` (malformed ones skipped:
/// they are reported where they are opened).
pub(crate) fn named_ports(a: &RunArgs) -> Vec<flowplane_io::port::PortSpec> {
    let input = a.traffic.input.iter().chain(&a.outputs.output).map(|p| p.to_string_lossy().into_owned());
    input
        .chain(a.outputs.ports.iter().map(|p| port_arg(p).1.to_string()))
        .filter_map(|p| crate::io_port_spec(&p))
        .collect()
}

/// A port option (`--promisc`, `--eal`) acts only on the port kinds whose registry entry
/// takes it: given to a run with no such port, it would change nothing, and is refused.
pub(crate) fn check_port_options(a: &RunArgs) -> Result<(), CliError> {
    let kinds: Vec<_> = named_ports(a).iter().map(|s| s.kind()).collect();
    for (opt, given) in [("--promisc", a.live.promisc), ("--eal", a.live.eal.is_some())] {
        if given && !kinds.iter().any(|k| k.caps.options.contains(&opt)) {
            let takers: Vec<String> = flowplane_io::port::PORTS
                .iter()
                .filter(|k| k.caps.options.contains(&opt))
                .map(|k| format!("{}:", k.name))
                .collect();
            return Err(CliError::new(format!(
                "{opt} configures live ports ({}); no port of this run is one",
                takers.join(", ")
            )));
        }
    }
    Ok(())
}

/// `--port`'s value: its name (`NAME=`, a name being `[A-Za-z_][A-Za-z0-9_]*`) and the port itself.
pub(crate) fn port_arg(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once('=') {
        Some((n, rest))
            if n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            (Some(n), rest)
        }
        _ => (None, arg),
    }
}

/// The names `--port NAME=PORT` gives, with their verdicts (the i-th `--port` is verdict i).
pub(crate) fn port_names(a: &RunArgs) -> Result<Vec<(String, u16)>, CliError> {
    let mut names: Vec<(String, u16)> = Vec::new();
    for (i, p) in a.outputs.ports.iter().enumerate() {
        if let (Some(n), _) = port_arg(p) {
            if names.iter().any(|(k, _)| k == n) {
                return Err(CliError::new(format!("--port: the name '{n}' is given twice")));
            }
            names.push((n.to_string(), (i + 1).min(u16::MAX as usize - 1) as u16));
        }
    }
    Ok(names)
}

/// The chain `a` gives: the config file's [[nf]] tables, --chain-file, or --chain.
pub(crate) fn chain_spec(a: &RunArgs) -> Result<spec::ChainSpec, CliError> {
    Ok(match (&a.nf_chain, &a.pipeline.chain_file) {
        (Some(s), _) => s.clone(),
        (None, Some(p)) => {
            let text = flowplane_nf::read_text_file(&p.to_string_lossy())
                .map_err(|e| CliError::new(format!("--chain-file {e}")))?;
            spec::parse_toml(&text).map_err(|e| CliError::new(format!("{}: {e}", p.display())))?
        }
        (None, None) => spec::parse(&a.pipeline.chain)?,
    })
}

/// The run configuration and chain `a` describe (validated).
pub(crate) fn config(a: &RunArgs) -> Result<(RunConfig, spec::ChainSpec), CliError> {
    let spec = chain_spec(a)?;
    let cores = a.workers.cores.unwrap_or_else(cpu::available_cores);
    let loops = if a.traffic.duration.is_some() && a.traffic.loops.is_none() {
        None
    } else {
        Some(a.traffic.loops.unwrap_or(1))
    };
    let mut spec = spec;
    if spec.is_graph() {
        spec.bind_ports(&port_names(a)?).map_err(|e| CliError::new(format!("chain graph: {e}")))?;
    }
    let exports = parse_exports(&a.outputs.export)?;
    let priority = match &a.strategy.priority {
        Some(p) => Some((p.clone(), flowplane_engine::runner::PriorityClass::parse(p).map_err(CliError::new)?)),
        None => None,
    };
    let exec = ExecConfig {
        kind: ExecKind::parse(&a.pipeline.exec)?,
        prefetch: !a.pipeline.no_prefetch,
        flows: a.tables.capacity()?.0,
        default_idle_timeout_ns: (a.tables.idle_timeout * 1e9) as u64,
        full_policy: if a.tables.table_full == "evict" { FullPolicy::EvictLruIdle } else { FullPolicy::Reject },
        hugepages: true,
        aux: !a.pipeline.no_aux,
        prefetch_hooks: !a.pipeline.no_prefetch_hooks,
        packing: !a.pipeline.no_packing,
        match_sharing: !a.pipeline.no_match_sharing,
        hash_seed: a.tables.hash_seed.unwrap_or_else(flowplane_engine::exec::random_hash_seed),
        inline_entries: true,
    };
    let cfg = RunConfig {
        cores,
        batch_size: a.pipeline.batch,
        pool_buffers: a.workers.pool,
        loops,
        duration: a.traffic.duration.map(Duration::from_secs_f64),
        rate_pps: a.traffic.rate,
        pin: !a.workers.no_pin,
        warmup: a.traffic.warmup.map(Duration::from_secs_f64),
        exec,
        export: exports.iter().map(|(n, _)| n.clone()).collect(),
        restamp: a.outputs.restamp,
        scale: a.strategy.scale.clone(),
        scale_period: Duration::from_secs_f64(a.strategy.scale_period_ms / 1e3),
        ring: a.workers.ring.unwrap_or(DEFAULT_RING),
        virtual_cores: a.workers.virtual_cores,
        scr: flowplane_engine::scr::ScrConfig {
            history: a.strategy.scr_history,
            recovery: a.strategy.scr_recovery,
            loss: a.strategy.scr_loss,
            seed: a.strategy.seed,
            log_entries: a.strategy.scr_log,
        },
        priority,
        slo_us: a.strategy.slo_us,
        long_period: Duration::from_secs_f64(a.strategy.long_period_ms / 1e3),
        solver_budget: Duration::from_secs_f64(a.strategy.solver_budget_ms / 1e3),
        nic_profile: match &a.strategy.nic_profile {
            Some(p) => flowplane_engine::runner::NicProfile::parse(p).map_err(CliError::new)?,
            None => flowplane_engine::runner::NicProfile::ideal(),
        },
        ipfix: parse_ipfix(&a.outputs.ipfix, a.outputs.ipfix_active)?,
        repl: parse_repl(&a.repl)?,
    };
    Ok((cfg, spec))
}

/// Parses `--replicate`, `--replicate-listen` and `--replicate-role` (None: no replication).
fn parse_repl(l: &ReplArgs) -> Result<Option<flowplane_engine::repl::ReplConfig>, CliError> {
    if l.replicate.is_none() && l.replicate_listen.is_none() {
        if l.replicate_role.is_some() {
            return Err(CliError::new("--replicate-role needs --replicate or --replicate-listen"));
        }
        return Ok(None);
    }
    flowplane_engine::repl::ReplConfig::new(
        l.replicate.as_deref(),
        l.replicate_listen.as_deref(),
        l.replicate_role.as_deref(),
    )
    .map(Some)
    .map_err(CliError::new)
}

/// Parses `--ipfix` collectors and `--ipfix-active` (None: no collector).
fn parse_ipfix(
    collectors: &[String],
    active_s: Option<f64>,
) -> Result<Option<flowplane_engine::ipfix::IpfixConfig>, CliError> {
    if let Some(a) = active_s {
        if !(a > 0.0 && a.is_finite()) {
            return Err(CliError::new(format!("--ipfix-active {a}: expected a positive number of seconds")));
        }
        if collectors.is_empty() {
            return Err(CliError::new("--ipfix-active needs --ipfix"));
        }
    }
    if collectors.is_empty() {
        return Ok(None);
    }
    let collectors = collectors.iter().map(|c| c.parse()).collect::<Result<Vec<_>, String>>().map_err(CliError::new)?;
    Ok(Some(flowplane_engine::ipfix::IpfixConfig {
        collectors,
        active_ns: active_s.map(|a| (a * 1e9) as u64),
        queue: flowplane_engine::ipfix::DEFAULT_QUEUE,
    }))
}

/// Parses `--export` values: `NF=FILE.csv|json` pairs (no file is touched here).
pub fn parse_exports(specs: &[String]) -> Result<Vec<(String, PathBuf)>, CliError> {
    specs
        .iter()
        .map(|s| {
            let (nf, file) = s
                .split_once('=')
                .ok_or_else(|| CliError::new(format!("--export {s}: expected NF=FILE.csv or NF=FILE.json")))?;
            let path = PathBuf::from(file);
            match path.extension().and_then(|e| e.to_str()) {
                Some("csv" | "json") => Ok((nf.to_string(), path)),
                _ => Err(CliError::new(format!("--export {s}: the file must end in .csv or .json"))),
            }
        })
        .collect()
}

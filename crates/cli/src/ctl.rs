//! The control socket of a live run (`flowplane run ... --ctl PATH`) and its
//! client (`flowplane ctl PATH COMMAND...`).
//!
//! A Unix stream socket created with mode 0600; a connection whose peer
//! (SO_PEERCRED) is not this process's user, or root, is closed unanswered.
//! One request per connection: the client sends its words as a JSON array
//! on one line, the server answers one JSON object (`{"ok": true,
//! "result": ...}` or `{"ok": false, "error": "..."}`) and closes. Reads
//! come from the workers' published snapshots (twice a second) and the
//! ports' counters; changes (`set`, `load`) and mid-run exports go to the
//! workers' mailboxes and land between two batches on every core
//! ([`flowplane_engine::control`]).
//!
//! Commands: `show runtime|errors|nfs|tables|ports|attribution`, `set NF PARAM VALUE
//! [PARAM VALUE ...]` (several parameters change together), `load NF FILE`
//! (the NF's file parameter: acl's rules, route's table, ...), `export NF
//! FILE`, `trace add N [FILTER]|show|clear`, `capture start FILE [--at NF]
//! [--dropped]|stop` (see [`crate::ctl_trace`]), `reload`, `stop`, `help`. An
//! NF is named as in the chain (`acl`), or `acl#2` for its second occurrence.
//!
//! `reload` (a run started with `--config FILE`) re-reads the file, merged
//! under the run's command line as at start, and compares it with the
//! running configuration: any option other than the chain changed (cores,
//! ports, strategy, table sizes, ...), or the chain's shape (its NFs and
//! their order), refuses the whole reload in one line naming the first such
//! key. Otherwise every NF whose parameters changed, or whose file
//! parameter's file (acl's rules) changed content, is first checked alone
//! (built from its new parameters and reconfigured, so an NF that cannot
//! change at run time refuses here), and only when every one passes are the
//! changes sent to the workers, NF by NF, as `set` does: nothing is applied
//! unless everything can be.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flowplane_engine::control::{Answer, Command};
use flowplane_engine::live::Live;
use flowplane_engine::spec::{ChainSpec, NfSpec};
use serde_json::{json, Value};

use crate::error::CliError;
use crate::run_config::Source;

/// Longest request line read.
const MAX_REQUEST: u64 = 64 << 10;
/// A client must send its request within this time.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a change or an export waits for every worker.
const WORKER_TIMEOUT: Duration = Duration::from_secs(5);
/// The server's sleep between two looks at the listener.
const NAP: Duration = Duration::from_millis(20);

/// The commands, for `help` and errors.
pub const HELP: &str =
    "show runtime|errors|nfs|tables|ports|attribution; show flow PROTO SRC SPORT DST DPORT | SRC; set NF PARAM VALUE [PARAM VALUE ...]; \
     load NF FILE; export NF FILE; trace add N [PROTO SRC SPORT DST DPORT | SRC]; trace show; trace clear; \
     capture start FILE [--at NF] [--dropped]; capture stop; profile start|stop; reload; stop; help";

/// A running control socket: removed when dropped.
pub struct CtlServer {
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (refusing one a live process listens on; a stale socket
/// file is replaced) and serves it until `stop` rises. `config`: where the
/// run's options came from, for `reload` (none: the run has no `--config`).
pub fn serve(
    path: &Path,
    live: Arc<Live>,
    spec: ChainSpec,
    stop: Arc<AtomicBool>,
    config: Option<Source>,
) -> Result<CtlServer, CliError> {
    let e = |m: String| CliError::new(format!("--ctl {}: {m}", path.display()));
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_socket() {
            return Err(e("exists and is not a socket".into()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(e("another process serves it".into()));
        }
        std::fs::remove_file(path).map_err(|x| e(x.to_string()))?;
    }
    let listener = UnixListener::bind(path).map_err(|x| e(x.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|x| e(x.to_string()))?;
    listener.set_nonblocking(true).map_err(|x| e(x.to_string()))?;
    let files = spec.nfs.iter().map(file_digests).collect();
    // Packet time 0 of a live port is the run's start: close enough to now for the captures' stamps.
    let base_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let taps = crate::ctl_trace::Taps::new(base_ns);
    let mut state = Server { live, spec, stop: Arc::clone(&stop), config, files, taps };
    let thread = std::thread::Builder::new()
        .name("fp-ctl".into())
        .spawn(move || {
            while !state.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => state.connection(s),
                    Err(x) if x.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => std::thread::sleep(NAP),
                }
            }
            // The run is over: a capture still running is drained and closed.
            state.taps.end();
        })
        .map_err(|x| e(x.to_string()))?;
    Ok(CtlServer { path: path.to_path_buf(), thread: Some(thread) })
}

/// True if `s`'s peer runs as this process's user or as root.
fn peer_allowed(s: &UnixStream) -> bool {
    match rustix::net::sockopt::socket_peercred(s) {
        Ok(c) => {
            let uid = c.uid.as_raw();
            uid == 0 || uid == rustix::process::geteuid().as_raw()
        }
        Err(_) => false,
    }
}

struct Server {
    live: Arc<Live>,
    /// The chain as it runs now (changes accepted by every worker are written here).
    spec: ChainSpec,
    stop: Arc<AtomicBool>,
    /// The run's config file and command line (`reload`).
    config: Option<Source>,
    /// Per NF: its file parameters' contents as last applied (`reload` re-applies a changed file).
    files: Vec<Vec<(String, Option<u64>)>>,
    /// Packet traces and captures.
    taps: crate::ctl_trace::Taps,
}

/// The NF's file parameters (text parameters whose syntax is FILE) with a digest of each file's content now.
fn file_digests(nf: &NfSpec) -> Vec<(String, Option<u64>)> {
    let Some(desc) = flowplane_nf::registry::find(&nf.name) else { return Vec::new() };
    desc.params
        .iter()
        .filter(|p| matches!(p.kind, flowplane_nf::ParamKind::Text { syntax: "FILE", .. }))
        .filter_map(|p| nf.params.iter().find(|(k, _)| k == p.name))
        .map(|(k, path)| {
            let digest = flowplane_nf::read_text_file(path).ok().map(|text| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                text.hash(&mut h);
                h.finish()
            });
            (k.clone(), digest)
        })
        .collect()
}

/// The first parameter that differs between `old` and `new` (same NF) and is not
/// declared live, as the refusal `set` gives; None if every change is live.
fn fixed_param_changed(old: &NfSpec, new: &NfSpec) -> Option<String> {
    let desc = flowplane_nf::registry::find(&new.name)?;
    let value = |nf: &NfSpec, k: &str| nf.params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let p = desc.params.iter().find(|p| !p.live && value(old, p.name) != value(new, p.name))?;
    let live: Vec<&str> = desc.params.iter().filter(|p| p.live).map(|p| p.name).collect();
    let can = if live.is_empty() { "none of its parameters".to_string() } else { live.join(", ") };
    Some(format!("'{}' is fixed for the run (a restart changes it; changeable while running: {can})", p.name))
}

/// Parameters as a sorted list (a spec's order does not change an NF).
fn sorted(p: &[(String, String)]) -> Vec<(String, String)> {
    let mut v = p.to_vec();
    v.sort();
    v
}

impl Server {
    fn connection(&mut self, mut s: UnixStream) {
        if !peer_allowed(&s) {
            return;
        }
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(READ_TIMEOUT));
        let _ = s.set_write_timeout(Some(READ_TIMEOUT));
        let mut line = String::new();
        let read = BufReader::new((&s).take(MAX_REQUEST)).read_line(&mut line);
        let answer = match read {
            Ok(_) => match serde_json::from_str::<Vec<String>>(line.trim()) {
                Ok(words) => match self.answer(&words) {
                    Ok(v) => json!({"ok": true, "result": v}),
                    Err(m) => json!({"ok": false, "error": m}),
                },
                Err(_) => json!({"ok": false, "error": "a request is a JSON array of strings on one line"}),
            },
            Err(x) => json!({"ok": false, "error": format!("reading the request: {x}")}),
        };
        let _ = writeln!(s, "{answer}");
    }

    fn answer(&mut self, words: &[String]) -> Result<Value, String> {
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["help"] => Ok(json!(HELP)),
            ["show", "runtime"] => Ok(self.runtime()),
            ["show", "errors"] => Ok(self.errors()),
            ["show", "nfs"] => Ok(self.nfs()),
            ["show", "tables"] => Ok(self.tables()),
            ["show", "ports"] => Ok(self.ports()),
            ["show", "attribution"] => Ok(self.attribution()),
            ["show", "flow", key @ ..] => self.flow(key),
            ["set", nf, pairs @ ..] if !pairs.is_empty() && pairs.len().is_multiple_of(2) => {
                let pairs: Vec<(&str, &str)> = pairs.chunks(2).map(|p| (p[0], p[1])).collect();
                self.set(nf, &pairs)
            }
            ["load", nf, file] => self.load(nf, file),
            ["export", nf, file] => self.export(nf, file),
            ["trace", rest @ ..] => {
                let labels: Vec<String> = (0..self.spec.nfs.len()).map(|i| self.label(i)).collect();
                self.taps.trace(&self.live, &labels, rest)
            }
            ["capture", rest @ ..] => {
                let mut taps = std::mem::take(&mut self.taps);
                let r = taps.capture(&self.live, &|nf| self.position(nf), rest);
                self.taps = taps;
                r
            }
            ["profile", on @ ("start" | "stop")] => {
                let answers =
                    self.live.ctl.ask(&flowplane_engine::control::Command::Profile(*on == "start"), WORKER_TIMEOUT)?;
                crate::ctl_trace::all_done(&answers)?;
                Ok(json!(if *on == "start" {
                    "profiling: show runtime gives each NF's calls, vectors per call and cycles per packet"
                } else {
                    "profile stopped"
                }))
            }
            ["reload"] => self.reload(),
            ["stop"] => {
                self.stop.store(true, Ordering::Relaxed);
                Ok(json!("stopping"))
            }
            _ => Err(format!("unknown command '{}' (commands: {HELP})", w.join(" "))),
        }
    }

    fn runtime(&self) -> Value {
        let cores = self.live.snapshots();
        let hz = self.live.hz;
        let rows: Vec<Value> = cores
            .iter()
            .enumerate()
            .map(|(i, c)| {
                // The report's per-core row, from the same counts (equal to it once the traffic is over).
                let row =
                    flowplane_engine::report::CoreReport::new(i, c.packets, c.batches, c.cycles, c.busy_cycles, hz);
                let mut v = serde_json::to_value(row).unwrap_or_default();
                v["packets_out"] = c.tx.sent.into();
                v
            })
            .collect();
        let mut v = json!({"tsc_hz": hz, "ready": self.live.ready.load(Ordering::Relaxed), "cores": rows});
        if let Some(nfs) = self.profile_rows(&cores) {
            v["nfs"] = Value::Array(nfs);
        }
        v
    }

    /// While a profile runs (`profile start`): per NF of the chain (before any branch point), summed
    /// over the cores: calls, packets, vectors per call, cycles per packet and its share of the NFs' cycles.
    fn profile_rows(&self, cores: &[flowplane_engine::live::CoreSnap]) -> Option<Vec<Value>> {
        let mut sum: Vec<flowplane_engine::tap::StageCost> = Vec::new();
        for p in cores.iter().filter_map(|c| c.profile.as_ref()) {
            sum.resize(sum.len().max(p.len()), Default::default());
            for (t, c) in sum.iter_mut().zip(p) {
                t.calls += c.calls;
                t.packets += c.packets;
                t.cycles += c.cycles;
            }
        }
        if cores.iter().all(|c| c.profile.is_none()) {
            return None;
        }
        let all: u64 = sum.iter().map(|c| c.cycles).sum();
        Some(
            sum.iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({
                        "nf": self.label(i),
                        "calls": c.calls,
                        "packets": c.packets,
                        "vectors_per_call": if c.calls > 0 { c.packets as f64 / c.calls as f64 } else { 0.0 },
                        "cycles_per_packet": if c.packets > 0 { c.cycles as f64 / c.packets as f64 } else { 0.0 },
                        "share": if all > 0 { c.cycles as f64 / all as f64 } else { 0.0 },
                    })
                })
                .collect(),
        )
    }

    /// Per-NF counters summed over the cores, in chain order.
    fn nf_totals(&self) -> Vec<(String, flowplane_nf::NfCounters)> {
        let mut nfs: Vec<(String, flowplane_nf::NfCounters)> = Vec::new();
        for c in self.live.snapshots() {
            for (i, (n, k)) in c.nfs.iter().enumerate() {
                match nfs.get_mut(i) {
                    Some(t) => t.1.merge(k),
                    None => nfs.push((n.clone(), *k)),
                }
            }
        }
        nfs
    }

    fn errors(&self) -> Value {
        let cores = self.live.snapshots();
        let drops: serde_json::Map<String, Value> =
            crate::metrics::drops(&self.live, &cores).into_iter().map(|(r, n)| (r.to_string(), n.into())).collect();
        let nfs: Vec<Value> =
            self.nf_totals().into_iter().map(|(n, k)| json!({"nf": n, "dropped": k.dropped})).collect();
        json!({"drops": drops, "nfs": nfs})
    }

    fn nfs(&self) -> Value {
        let totals = self.nf_totals();
        let cores = self.live.snapshots();
        // Each NF's own report per core, as its numeric fields (the metrics' flowplane_nf_stat).
        let stats = |i: usize| -> Vec<Value> {
            cores
                .iter()
                .enumerate()
                .map(|(core, c)| {
                    let fields: serde_json::Map<String, Value> = c
                        .nf_details
                        .get(i)
                        .and_then(Option::as_ref)
                        .map(crate::metrics::report_fields)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into()))
                        .collect();
                    json!({"core": core, "fields": fields})
                })
                .collect()
        };
        let rows: Vec<Value> = self
            .spec
            .nfs
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let k = totals.get(i).map(|t| t.1).unwrap_or_default();
                let params: serde_json::Map<String, Value> =
                    n.params.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
                json!({
                    "index": i,
                    "nf": n.name,
                    "params": params,
                    "packets_in": k.packets_in,
                    "packets_out": k.packets_out,
                    "dropped": k.dropped,
                    "stats": stats(i),
                })
            })
            .collect();
        Value::Array(rows)
    }

    fn tables(&self) -> Value {
        let rows: Vec<Value> = self
            .live
            .snapshots()
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "core": i,
                    "flows": c.store.flows,
                    "capacity": c.store.capacity,
                    "insertions": c.store.insertions,
                    "expiries": c.store.expiries,
                    "table_full": c.store.table_full,
                })
            })
            .collect();
        Value::Array(rows)
    }

    /// Who fills the flow table (`table_full_sources`) and the NFs' attribution lists (nat's
    /// `top_hosts_by_ports`, `top_hosts_refused`), summed over the cores, in the report's row shapes.
    fn attribution(&self) -> Value {
        let (full, lists) = crate::metrics::attribution(&self.live.snapshots());
        let nfs: Vec<Value> = lists
            .into_iter()
            .map(|l| {
                let rows: Vec<Value> =
                    l.rows.into_iter().map(|(k, n)| json!({ l.key.as_str(): k, l.what.as_str(): n })).collect();
                json!({"index": l.index, "nf": l.nf, "list": l.list, "rows": rows})
            })
            .collect();
        let full: Vec<Value> = full.into_iter().map(|(a, n)| json!({"src": a, "packets": n})).collect();
        json!({"table_full_sources": full, "nfs": nfs})
    }

    fn ports(&self) -> Value {
        let rows: Vec<Value> = self
            .live
            .ports()
            .map(|p| {
                let s = p.stats();
                json!({
                    "name": p.name(),
                    "rx_packets": s.rx_packets,
                    "rx_overrun": s.rx_overrun,
                    "rx_pool_empty": s.rx_pool_empty,
                    "tx_packets": s.tx_packets,
                    "tx_full": s.tx_full,
                    "tx_errors": s.tx_errors,
                })
            })
            .collect();
        Value::Array(rows)
    }

    /// The chain position of `nf` (`name` or `name#N`, the N-th occurrence from 1; in a chain graph also
    /// its path, `allow/fsc`).
    fn position(&self, nf: &str) -> Result<usize, String> {
        if self.spec.is_graph() {
            if let Some(i) = self.spec.nf_paths().iter().position(|p| p == nf) {
                return Ok(i);
            }
        }
        let (name, nth) = match nf.split_once('#') {
            Some((n, k)) => {
                (n, k.parse::<usize>().ok().filter(|&k| k >= 1).ok_or(format!("'{nf}': NAME#N, N from 1"))?)
            }
            None => (nf, 1),
        };
        self.spec.nfs.iter().enumerate().filter(|(_, n)| n.name == name).nth(nth - 1).map(|(i, _)| i).ok_or_else(|| {
            let names: Vec<&str> = self.spec.nfs.iter().map(|n| n.name.as_str()).collect();
            format!("no NF '{nf}' in the chain ({})", names.join(" -> "))
        })
    }

    /// `set NF PARAM VALUE [PARAM VALUE ...]`: the parameters change together (one change on every core).
    fn set(&mut self, nf: &str, pairs: &[(&str, &str)]) -> Result<Value, String> {
        let i = self.position(nf)?;
        let mut new = self.spec.nfs[i].clone();
        let desc = flowplane_nf::registry::find(&new.name).ok_or(format!("unknown NF '{}'", new.name))?;
        for &(param, value) in pairs {
            match new.params.iter_mut().find(|(k, _)| k == param) {
                Some(p) => p.1 = value.to_string(),
                None => new.params.push((param.to_string(), value.to_string())),
            }
            // Unknown and fixed parameters are refused before any worker sees them.
            let Some(spec) = desc.params.iter().find(|p| p.name == param) else {
                let known: Vec<&str> = desc.params.iter().map(|p| p.name).collect();
                return Err(format!("{}: unknown parameter '{param}' (known: {})", new.name, known.join(", ")));
            };
            if !spec.live {
                let live: Vec<&str> = desc.params.iter().filter(|p| p.live).map(|p| p.name).collect();
                let can = if live.is_empty() { "none of its parameters".to_string() } else { live.join(", ") };
                return Err(format!(
                    "{}: '{param}' is fixed for the run (a restart changes it; changeable while running: {can})",
                    new.name
                ));
            }
        }
        let cores = self.apply(i, new)?;
        Ok(match pairs {
            [(param, value)] => json!({"nf": nf, "param": param, "value": value, "cores": cores}),
            _ => {
                let params: serde_json::Map<String, Value> =
                    pairs.iter().map(|(k, x)| (k.to_string(), json!(x))).collect();
                json!({"nf": nf, "params": params, "cores": cores})
            }
        })
    }

    /// Sends NF `i`'s new parameters to every worker; on success the running chain takes them.
    fn apply(&mut self, i: usize, new: NfSpec) -> Result<usize, String> {
        let answers = self.live.ctl.ask(&Command::Reconfigure { index: i, nf: new.clone() }, WORKER_TIMEOUT)?;
        let refused: Vec<&String> =
            answers.iter().filter_map(|a| if let Answer::Refused(m) = a { Some(m) } else { None }).collect();
        match refused.first() {
            // Every core runs the same check on the same parameters: all refuse or none.
            Some(m) if refused.len() == answers.len() => Err((*m).clone()),
            Some(m) => Err(format!("{} of {} cores refused: {m}", refused.len(), answers.len())),
            None => {
                if let Some(f) = self.files.get_mut(i) {
                    *f = file_digests(&new);
                }
                self.spec.nfs[i] = new;
                Ok(answers.len())
            }
        }
    }

    /// The name `nf` has in commands: `name`, or `name#N` for its N-th occurrence; in a chain graph, a
    /// branch's NF by its path (`deny/count`).
    fn label(&self, i: usize) -> String {
        if self.spec.is_graph() {
            if let Some(p) = self.spec.nf_paths().get(i).filter(|p| p.contains('/')) {
                return p.clone();
            }
        }
        let name = &self.spec.nfs[i].name;
        let nth = self.spec.nfs[..i].iter().filter(|n| &n.name == name).count();
        if nth == 0 {
            name.clone()
        } else {
            format!("{name}#{}", nth + 1)
        }
    }

    /// `reload`: the config file's changed NF parameters and rule files, all or nothing (see the module doc).
    fn reload(&mut self) -> Result<Value, String> {
        let Some(src) = self.config.clone() else {
            return Err("this run was started without --config: there is no file to reload".into());
        };
        let m = crate::run_config::merge(&src.path, &src.cli).map_err(|e| e.to_string())?;
        let restart = |what: String| Err(format!("{what}: a restart changes it (nothing applied)"));
        for ((long, was), (_, now)) in src.values.iter().zip(&m.values) {
            if was != now && long != "chain" && long != "chain-file" {
                let key = crate::run_config::key_of(long);
                return restart(format!("'{key}' changed from '{}' to '{}'", was.join(","), now.join(",")));
            }
        }
        let mut args = m.args;
        args.nf_chain = m.nf;
        let new = crate::cmd_run::chain_spec(&args).map_err(|e| e.to_string())?;
        let shape = |c: &ChainSpec| c.nfs.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(" -> ");
        if shape(&new) != shape(&self.spec) {
            return restart(format!("the chain's NFs changed from '{}' to '{}'", shape(&self.spec), shape(&new)));
        }
        let changed: Vec<usize> = (0..new.nfs.len())
            .filter(|&i| {
                sorted(&new.nfs[i].params) != sorted(&self.spec.nfs[i].params)
                    || self.files.get(i).is_some_and(|f| *f != file_digests(&new.nfs[i]))
            })
            .collect();
        // Each changed NF alone first: its parameters declared live, valid, and taken by the NF.
        for &i in &changed {
            let nf = &new.nfs[i];
            let label = self.label(i);
            if let Some(why) = fixed_param_changed(&self.spec.nfs[i], nf) {
                return Err(format!("{label}: {why} (nothing applied)"));
            }
            let refuse = |e: String| {
                let named = e.starts_with(&format!("{}:", nf.name));
                format!("{}{e} (nothing applied)", if named { String::new() } else { format!("{label}: ") })
            };
            let one = ChainSpec::linear(vec![nf.clone()]);
            let mut chain = flowplane_engine::chain::Chain::build(&one).map_err(|e| refuse(e.to_string()))?;
            let workers = self.live.ctl.workers();
            if let Some(why) = chain.stages.first().and_then(|st| flowplane_engine::control::split_pool(st, workers)) {
                return Err(refuse(why));
            }
            let mut p = flowplane_nf::Params::new(&nf.name, nf.params.clone());
            if let Some(st) = chain.stages.first_mut() {
                st.reconfigure(&mut p).map_err(|e| refuse(e.to_string()))?;
            }
        }
        let mut applied = Vec::new();
        for &i in &changed {
            let label = self.label(i);
            let nf = new.nfs[i].clone();
            let params: serde_json::Map<String, Value> =
                nf.params.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
            self.apply(i, nf).map_err(|e| {
                let done: Vec<&str> = applied.iter().filter_map(|a: &Value| a["nf"].as_str()).collect();
                format!(
                    "{label}: {e} (applied before it: {})",
                    if done.is_empty() { "none".into() } else { done.join(", ") }
                )
            })?;
            applied.push(json!({"nf": label, "params": params}));
        }
        Ok(json!({"file": src.path.display().to_string(), "applied": applied}))
    }

    fn load(&mut self, nf: &str, file: &str) -> Result<Value, String> {
        let i = self.position(nf)?;
        let name = self.spec.nfs[i].name.clone();
        let desc = flowplane_nf::registry::find(&name).ok_or(format!("unknown NF '{name}'"))?;
        // The NF's file parameter: a text parameter whose syntax is FILE.
        let param = desc
            .params
            .iter()
            .find(|p| matches!(p.kind, flowplane_nf::ParamKind::Text { syntax: "FILE", .. }))
            .ok_or(format!("{name} reads no file (use set {name} PARAM VALUE)"))?;
        let abs = std::fs::canonicalize(file).map_err(|e| format!("{file}: {e}"))?;
        let path = abs.to_string_lossy().into_owned();
        self.set(nf, &[(param.name, path.as_str())])
    }

    /// `show flow PROTO SRC SPORT DST DPORT` (a flow) or `show flow SRC` (a source's coarse state).
    fn flow(&self, words: &[&str]) -> Result<Value, String> {
        let (key, _) = crate::ctl_trace::flow_key(words).map_err(|e| format!("show flow {e}"))?;
        let answers = self.live.ctl.ask(&Command::Flow { key }, WORKER_TIMEOUT)?;
        let mut rows = Vec::new();
        for (core, a) in answers.into_iter().enumerate() {
            if let Answer::Flow(r) = a {
                rows.extend(r.into_iter().map(|(nf, state)| json!({"core": core, "nf": nf, "state": state})));
            }
        }
        Ok(Value::Array(rows))
    }

    fn export(&self, nf: &str, file: &str) -> Result<Value, String> {
        let i = self.position(nf)?;
        let answers = self.live.ctl.ask(&Command::Export { index: i }, WORKER_TIMEOUT)?;
        let mut rows = Vec::new();
        let mut merged: Option<Value> = None;
        let mut hook: Option<flowplane_engine::chain::Chain> = None;
        for a in answers {
            match a {
                Answer::Rows(r) => rows.extend(r),
                Answer::Report(Some(r)) => {
                    // The NF's own merge hook (a one-NF chain built for it).
                    if hook.is_none() {
                        let one = ChainSpec::linear(vec![self.spec.nfs[i].clone()]);
                        hook = Some(flowplane_engine::chain::Chain::build(&one).map_err(|e| e.to_string())?);
                    }
                    match (&mut merged, hook.as_ref().and_then(|c| c.stages.first())) {
                        (Some(m), Some(st)) => st.merge_report(m, &r),
                        (m, _) => *m = Some(r),
                    }
                }
                Answer::Refused(m) => return Err(m),
                Answer::Report(None) | Answer::Done | Answer::Flow(_) | Answer::Trace(_) => {}
            }
        }
        if let (Some(m), Some(st)) = (&merged, hook.as_ref().and_then(|c| c.stages.first())) {
            rows = st.export_report_rows(m);
        }
        let n = rows.len();
        // Written beside its target and renamed over it, as an end-of-run export.
        let out = crate::results::ExportFile::create(nf, Path::new(file)).map_err(|e| e.to_string())?;
        out.commit(&rows)?;
        Ok(json!({"nf": nf, "rows": n, "file": file}))
    }
}

/// `flowplane ctl PATH COMMAND...`: sends the command, prints the answer.
pub fn request(path: &Path, words: &[String]) -> Result<Value, CliError> {
    let e = |m: String| CliError::new(format!("ctl {}: {m}", path.display()));
    let mut s = UnixStream::connect(path).map_err(|x| e(x.to_string()))?;
    s.set_read_timeout(Some(WORKER_TIMEOUT + Duration::from_secs(5))).map_err(|x| e(x.to_string()))?;
    writeln!(s, "{}", serde_json::to_string(words).map_err(|x| e(x.to_string()))?).map_err(|x| e(x.to_string()))?;
    let mut line = String::new();
    BufReader::new(s.take(16 << 20)).read_line(&mut line).map_err(|x| e(x.to_string()))?;
    if line.is_empty() {
        return Err(e("the server closed the connection without answering (not this user's run?)".into()));
    }
    let v: Value = serde_json::from_str(line.trim()).map_err(|x| e(format!("bad answer: {x}")))?;
    if v["ok"].as_bool() == Some(true) {
        Ok(v["result"].clone())
    } else {
        Err(CliError::new(format!("ctl: {}", v["error"].as_str().unwrap_or("refused"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nf(name: &str, params: &[(&str, &str)]) -> NfSpec {
        NfSpec { name: name.into(), params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    #[test]
    fn reload_names_the_first_fixed_parameter_changed() {
        assert_eq!(fixed_param_changed(&nf("hh", &[("threshold", "5")]), &nf("hh", &[("threshold", "9")])), None);
        let why = fixed_param_changed(&nf("hh", &[]), &nf("hh", &[("k", "20")])).unwrap();
        assert!(why.starts_with("'k' is fixed for the run") && why.contains("threshold, export"), "{why}");
        let why = fixed_param_changed(&nf("lb", &[("base", "10.0.0.1")]), &nf("lb", &[])).unwrap();
        assert!(why.starts_with("'base' is fixed"), "{why}");
        let why = fixed_param_changed(&nf("portknock", &[]), &nf("portknock", &[("knock", "1-2")])).unwrap();
        assert!(why.starts_with("'knock' is fixed") && why.ends_with("changeable while running: protect)"), "{why}");
    }
}

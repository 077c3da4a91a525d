//! `flowplane ctl PATH trace ...` and `capture ...`: the control socket's side
//! of packet traces and captures (the workers' side is
//! [`flowplane_engine::tap`]).
//!
//! - `trace add N [FILTER]`: the next N packets in total over every worker
//!   (not per worker as VPP counts) matching FILTER — `PROTO SRC SPORT DST
//!   DPORT` (one direction of one flow) or `SRC` (a source address), as `show
//!   flow` takes them; none: any packet — are recorded with their worker, time,
//!   length, parsed 5-tuple, and per NF its verdict and its state for the
//!   packet's flow before and after it ran the packet (as `show flow` prints
//!   it). In a chain graph every NF is traced: a packet's record names the
//!   branch it took and lists the NFs on its path (a branch's by its path,
//!   `allow/fsc`). Under `--scale scr` each core traces its own packets on
//!   its replica. A new `trace add` replaces the previous trace; `trace show`
//!   lists the packets in time order; `trace clear` disarms and forgets.
//! - `capture start FILE [--at NF] [--dropped]`: a pcap of the packets as they
//!   enter the chain (or leave NF, a graph branch's NF too), or only of those
//!   dropped (by NF, or by any NF: a packet a `deny` branch takes back in and
//!   drops again is taken twice), from every worker. The file is created (and its header written) when
//!   the command is given, so a path that cannot be written is refused at once.
//!   Each worker copies packets into its own ring (2 MiB); one writer thread
//!   drains the rings into the file, so no worker ever touches the file, and a
//!   copy a full ring cannot take is dropped and counted. `capture stop`
//!   reports the packets written and dropped; the run's end stops a capture
//!   still running the same way (a line on stderr reports it).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use flowplane_engine::control::{Answer, Command};
use flowplane_engine::live::Live;
use flowplane_engine::tap::{pop_record, CaptureArm, TraceArm, TraceFilter, TraceRecord, NOT_REACHED, NOT_TAKEN};
use flowplane_packet::DROP;
use flowplane_trace::writer::{PcapWriter, WriteOutcome, WriterOptions};
use flowplane_wire::flow::FiveTuple;
use serde_json::{json, Value};

/// Most packets one trace takes (its records are preallocated on every worker).
pub const MAX_TRACE: usize = 10_000;
/// Bytes of each worker's capture ring.
const RING_BYTES: usize = 2 << 20;
/// How long a command waits for every worker.
const WORKER_TIMEOUT: Duration = Duration::from_secs(5);

/// The syntax of a flow or source filter (`show flow`, `trace add`).
pub const FLOW_SYNTAX: &str = "PROTO SRC SPORT DST DPORT (proto tcp|udp|icmp|N), or SRC";

/// A flow (`PROTO SRC SPORT DST DPORT`) or a source (`SRC`); true for a source alone.
pub fn flow_key(words: &[&str]) -> Result<(FiveTuple, bool), String> {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().map_err(|_| format!("'{s}' is not an IP address ({FLOW_SYNTAX})"));
    let port = |s: &str| s.parse::<u16>().map_err(|_| format!("'{s}' is not a port ({FLOW_SYNTAX})"));
    let (key, source) = match words {
        [proto, src, sport, dst, dport] => {
            let p = match *proto {
                "tcp" => 6,
                "udp" => 17,
                "icmp" => 1,
                n => n.parse::<u8>().map_err(|_| format!("'{n}' is not a protocol ({FLOW_SYNTAX})"))?,
            };
            (FiveTuple::new(ip(src)?, ip(dst)?, port(sport)?, port(dport)?, p), false)
        }
        [src] => {
            let s = ip(src)?;
            let any = if s.is_ipv4() {
                std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
            } else {
                std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            };
            (FiveTuple::new(s, any, 0, 0, 0), true)
        }
        _ => return Err(FLOW_SYNTAX.to_string()),
    };
    Ok((key.ok_or_else(|| format!("mixed address families ({FLOW_SYNTAX})"))?, source))
}

/// A capture in progress.
struct CaptureRun {
    file: String,
    at: Option<String>,
    dropped: bool,
    lost: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    writer: JoinHandle<WriteOutcome>,
}

/// The control socket's trace and capture state.
#[derive(Default)]
pub struct Taps {
    capture: Option<CaptureRun>,
    /// Wall-clock ns of packet time 0 (pcap stamps).
    base_ns: u64,
}

/// Refusals of a command posted to every worker, as one line.
pub(crate) fn all_done(answers: &[Answer]) -> Result<(), String> {
    match answers.iter().find_map(|a| if let Answer::Refused(m) = a { Some(m) } else { None }) {
        Some(m) => Err(m.clone()),
        None => Ok(()),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        n => n.to_string(),
    }
}

/// One traced packet as JSON: `labels` names the chain's NFs as commands do. Per NF: its verdict
/// (pass, port N, drop, not reached) and, for an NF keeping state for the packet's flow, that state before
/// and after it ran the packet (`null`: none) as `show flow` shows it; a graph's NFs of branches the
/// packet did not take are left out, the branch it took named.
fn record_json(r: &TraceRecord, labels: &[String], port: &str) -> Value {
    let stages: Vec<Value> = r
        .stages
        .iter()
        .enumerate()
        .filter(|&(_, &s)| s != NOT_TAKEN)
        .map(|(si, &s)| {
            let verdict = if s == NOT_REACHED {
                "not reached".to_string()
            } else {
                let v = s as u16;
                let before = r.entered.get(si).map_or(0, |&e| e as u16);
                if v == DROP {
                    "drop".to_string()
                } else if v != before {
                    format!("port {v}")
                } else {
                    "pass".to_string()
                }
            };
            let mut o = json!({"nf": labels.get(si).cloned().unwrap_or_else(|| format!("#{si}")), "verdict": verdict});
            if let Some(Some(c)) = r.state.get(si) {
                o["state"] = json!({"before": c.before, "after": c.after});
            }
            o
        })
        .collect();
    let flow = r.tuple.map(|t| {
        json!({"proto": proto_name(t.proto()), "src": t.src_ip().to_string(), "sport": t.src_port(),
               "dst": t.dst_ip().to_string(), "dport": t.dst_port()})
    });
    let last = r.out as u16;
    let mut v = json!({
        "worker": r.worker,
        "port": port,
        "queue": r.worker,
        "ts_ns": r.ts_ns,
        "len": r.len,
        "flow": flow,
        "stages": stages,
        "verdict": if last == DROP { "drop".to_string() } else { format!("out port {last}") },
    });
    if !r.branch.is_empty() {
        v["branch"] = json!(r.branch);
    }
    v
}

impl Taps {
    /// Trace and capture state for a run whose packet time 0 is `base_ns` (wall clock).
    pub fn new(base_ns: u64) -> Taps {
        Taps { capture: None, base_ns }
    }

    /// `trace add N [FILTER] | show | clear`; `labels`: the chain's NFs as commands name them.
    pub fn trace(&self, live: &Live, labels: &[String], words: &[&str]) -> Result<Value, String> {
        let syntax = format!("trace add N [{FLOW_SYNTAX}] | trace show | trace clear");
        match words {
            ["add", n, filter @ ..] => {
                let count = n
                    .parse::<usize>()
                    .ok()
                    .filter(|c| (1..=MAX_TRACE).contains(c))
                    .ok_or(format!("trace add: N must be an integer in 1..={MAX_TRACE}, not '{n}'"))?;
                let filter = match filter {
                    [] => TraceFilter::Any,
                    words => match flow_key(words).map_err(|e| format!("trace add N [FILTER]: {e}"))? {
                        (k, true) => TraceFilter::Source(k.src_ip()),
                        (k, false) => TraceFilter::Flow(k),
                    },
                };
                let arm = TraceArm { filter, count, left: Arc::new(AtomicU64::new(count as u64)) };
                let answers = live.ctl.ask(&Command::Trace(Some(arm)), WORKER_TIMEOUT)?;
                all_done(&answers)?;
                Ok(json!({"armed": count, "filter": filter.describe(), "cores": answers.len()}))
            }
            ["show"] => {
                let answers = live.ctl.ask(&Command::TraceShow, WORKER_TIMEOUT)?;
                let mut recs: Vec<TraceRecord> = Vec::new();
                for a in answers {
                    if let Answer::Trace(r) = a {
                        recs.extend(r);
                    }
                }
                recs.sort_by_key(|r| (r.ts_ns, r.worker));
                let port = live.source.clone();
                Ok(Value::Array(recs.iter().map(|r| record_json(r, labels, &port)).collect()))
            }
            ["clear"] => {
                let answers = live.ctl.ask(&Command::Trace(None), WORKER_TIMEOUT)?;
                all_done(&answers)?;
                Ok(json!("trace cleared"))
            }
            _ => Err(syntax),
        }
    }

    /// `capture start FILE [--at NF] [--dropped] | stop`; `position` finds an NF's chain index.
    pub fn capture(
        &mut self,
        live: &Live,
        position: &dyn Fn(&str) -> Result<usize, String>,
        words: &[&str],
    ) -> Result<Value, String> {
        let syntax = "capture start FILE [--at NF] [--dropped] | capture stop";
        match words {
            ["start", file, opts @ ..] => {
                let (mut at, mut dropped, mut rest) = (None, false, opts);
                while let Some((first, more)) = rest.split_first() {
                    match (*first, more) {
                        ("--dropped", m) => {
                            dropped = true;
                            rest = m;
                        }
                        ("--at", [nf, m @ ..]) => {
                            at = Some((nf.to_string(), position(nf)?));
                            rest = m;
                        }
                        _ => return Err(format!("capture start: unexpected '{first}' ({syntax})")),
                    }
                }
                if let Some(c) = &self.capture {
                    return Err(format!("a capture to {} is running (capture stop first)", c.file));
                }
                self.start(live, file, at, dropped)
            }
            ["stop"] => match self.capture.take() {
                Some(c) => {
                    // Every worker lets go of its ring; the writer drains the rings and closes the file.
                    let asked = live.ctl.ask(&Command::Capture(None), WORKER_TIMEOUT);
                    let v = finish(c);
                    asked.map(|_| v)
                }
                None => Err("no capture is running".into()),
            },
            _ => Err(syntax.into()),
        }
    }

    fn start(&mut self, live: &Live, file: &str, at: Option<(String, usize)>, dropped: bool) -> Result<Value, String> {
        let opts = WriterOptions { nanosecond: true, ..WriterOptions::default() };
        let mut w = PcapWriter::create(Path::new(file), opts).map_err(|e| format!("capture: {e}"))?;
        let workers = live.ctl.workers();
        let (mut prods, mut rings) = (Vec::new(), Vec::new());
        for _ in 0..workers {
            let (p, c) = rtrb::RingBuffer::<u8>::new(RING_BYTES);
            prods.push(Some(p));
            rings.push(c);
        }
        let lost = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let base = self.base_ns;
        let stop_w = Arc::clone(&stop);
        let writer = std::thread::Builder::new()
            .name("fp-capture".into())
            .spawn(move || {
                let mut buf = Vec::with_capacity(4096);
                loop {
                    // Read before draining: a ring abandoned or a stop seen now has nothing left after the drain.
                    let last = stop_w.load(Ordering::Acquire) || rings.iter().all(|r| r.is_abandoned());
                    let mut got = false;
                    for r in &mut rings {
                        while let Some((ts, orig)) = pop_record(r, &mut buf) {
                            let _ = w.write_packet(base.wrapping_add(ts), &buf, orig);
                            got = true;
                        }
                    }
                    if last {
                        break;
                    }
                    if !got {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                w.close()
            })
            .map_err(|e| format!("capture: {e}"))?;
        let arm = CaptureArm {
            at: at.as_ref().map(|a| a.1),
            dropped,
            rings: Arc::new(Mutex::new(prods)),
            lost: Arc::clone(&lost),
        };
        let run = CaptureRun { file: file.to_string(), at: at.map(|a| a.0), dropped, lost, stop, writer };
        let armed = live.ctl.ask(&Command::Capture(Some(arm)), WORKER_TIMEOUT).and_then(|a| all_done(&a));
        if let Err(e) = armed {
            let _ = live.ctl.ask(&Command::Capture(None), WORKER_TIMEOUT);
            finish(run);
            let _ = std::fs::remove_file(file);
            return Err(e);
        }
        let v = json!({"file": run.file, "at": run.at.clone().unwrap_or_else(|| "input".into()),
                       "dropped_only": dropped, "cores": workers});
        self.capture = Some(run);
        Ok(v)
    }

    /// The run ended: a capture still running is finished (the workers are gone, their rings abandoned) and
    /// reported on stderr.
    pub fn end(&mut self) {
        if let Some(c) = self.capture.take() {
            let v = finish(c);
            eprintln!(
                "capture {}: {} packets written, {} dropped (capture queue full){}",
                v["file"].as_str().unwrap_or(""),
                v["written"],
                v["dropped"],
                v["error"].as_str().map(|e| format!("; {e}")).unwrap_or_default()
            );
        }
    }
}

/// Stops the writer once the rings are drained; what the capture wrote.
fn finish(c: CaptureRun) -> Value {
    // Once every worker let go of its ring the writer ends by itself; the flag covers workers that no longer
    // answer (the run is ending).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !c.writer.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    c.stop.store(true, Ordering::Release);
    let out = c.writer.join().unwrap_or(WriteOutcome { written: 0, lost: 0, error: Some("writer panicked".into()) });
    json!({
        "file": c.file,
        "at": c.at.unwrap_or_else(|| "input".into()),
        "dropped_only": c.dropped,
        "written": out.written,
        "dropped": c.lost.load(Ordering::Relaxed) + out.lost,
        "error": out.error,
    })
}

/// How a filter is shown.
trait Describe {
    fn describe(&self) -> String;
}

impl Describe for TraceFilter {
    fn describe(&self) -> String {
        match self {
            TraceFilter::Any => "any packet".into(),
            TraceFilter::Source(a) => format!("from {a}"),
            TraceFilter::Flow(k) => {
                format!("{} {} {} {} {}", proto_name(k.proto()), k.src_ip(), k.src_port(), k.dst_ip(), k.dst_port())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_engine::tap::StateChange;

    #[test]
    fn stage_verdicts_read_as_pass_port_drop_not_reached() {
        let d = u32::from(DROP);
        let r = TraceRecord {
            worker: 1,
            ts_ns: 5,
            len: 60,
            tuple: None,
            input: 0,
            stages: vec![0, 3, 3, d, NOT_REACHED, NOT_TAKEN, 0],
            // A deny branch takes the dropped packet back in: its first NF gets it with verdict 0.
            entered: vec![0, 0, 3, 3, 0, 0, 0],
            out: d,
            segments: 0b101,
            branch: "deny".into(),
            state: vec![None, None, Some(StateChange { before: None, after: Some(json!({"packets": 1})) })],
        };
        let labels: Vec<String> =
            ["acl", "route", "fsc", "ratelimit", "count", "allow/fsc", "deny/count"].map(String::from).to_vec();
        let v = record_json(&r, &labels, "afpacket:x");
        let got: Vec<&str> = v["stages"].as_array().unwrap().iter().map(|s| s["verdict"].as_str().unwrap()).collect();
        assert_eq!(got, ["pass", "port 3", "pass", "drop", "not reached", "pass"]);
        assert_eq!(v["verdict"], "drop");
        assert_eq!(v["branch"], "deny");
        assert_eq!(v["stages"][1]["nf"], "route");
        assert_eq!(v["stages"][5]["nf"], "deny/count");
        assert_eq!(v["stages"][2]["state"], json!({"before": null, "after": {"packets": 1}}));
        assert!(v["stages"][0].get("state").is_none());
    }

    #[test]
    fn filters_parse_as_show_flow_takes_them() {
        let (k, src) = flow_key(&["udp", "10.0.0.1", "4000", "10.0.0.2", "5001"]).unwrap();
        assert!(!src && k.dst_port() == 5001 && k.proto() == 17);
        assert!(flow_key(&["10.0.0.1"]).unwrap().1);
        for bad in [&["udp", "x"][..], &["nope"][..], &["udp", "10.0.0.1", "1", "::1", "2"][..]] {
            let e = flow_key(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

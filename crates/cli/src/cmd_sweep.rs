//! `flowplane sweep FILE.toml`: an experiment runner in the spirit of NPF — a grid of `flowplane run`s, repeated,
//! with every result in a CSV (appended run by run, so an interrupted sweep resumes where it stopped), a JSON
//! summary (median, min and max per point, with the trust flags of every run) and one PNG per variable.
//!
//! The file, for a newcomer:
//!
//! ```toml
//! reps = 3                          # rounds over the whole grid (default 1)
//! out = "sweep-out"                 # results.csv, results.json, <variable>.png (default: FILE without .toml)
//!
//! [run]                             # what every run takes: `run` options by long name, as in `run --config`
//! gen = "--flows {flows} --packets 200000"
//! chain = "lb -> fsc(timeout={timeout})"
//! duration = 1
//!
//! [grid]                            # each key a list of values; every combination runs
//! exec = ["batch", "rtc", "interleaved:16"]   # a `run` option ...
//! cores = [1, 2]
//! flows = [1000, 100000]            # ... or a {placeholder} of the [run] strings (trace and NF parameters)
//! timeout = [10, 60]
//! ```
//!
//! Each run is `flowplane run --json` (this binary), one at a time; its figure is the report's throughput (the
//! projection with `virtual-cores`). A run that fails is a row with its error. Resuming: rows already in
//! `results.csv` (same round, same point) are not run again.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::CliError;

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// The experiment: a TOML file with [run] options, a [grid] of values, reps and out.
    pub file: PathBuf,
    /// Directory for the results (overrides the file's `out`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A parsed experiment.
#[derive(Debug)]
struct Sweep {
    reps: usize,
    out: PathBuf,
    /// `[run]`: option -> value (strings may hold `{placeholder}`s).
    run: Vec<(String, String)>,
    /// `[grid]`: variable -> its values, in file order.
    grid: Vec<(String, Vec<String>)>,
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn parse(file: &Path, text: &str) -> Result<Sweep, CliError> {
    let f = file.display();
    let t: toml::Table = text.parse().map_err(|e: toml::de::Error| CliError::new(format!("{f}: {e}")))?;
    for k in t.keys() {
        if !matches!(k.as_str(), "reps" | "out" | "run" | "grid") {
            return Err(CliError::new(format!("{f}: unknown key '{k}' (known: reps, out, run, grid)")));
        }
    }
    let reps = match t.get("reps") {
        None => 1,
        Some(toml::Value::Integer(n)) if (1..=100).contains(n) => *n as usize,
        Some(v) => return Err(CliError::new(format!("{f}: reps = {v}: must be an integer between 1 and 100"))),
    };
    let out = match t.get("out") {
        Some(toml::Value::String(s)) => PathBuf::from(s),
        Some(v) => return Err(CliError::new(format!("{f}: out = {v}: must be a string (a directory)"))),
        None => file.with_extension(""),
    };
    let table = |name: &str| -> Result<toml::Table, CliError> {
        match t.get(name) {
            None => Ok(toml::Table::new()),
            Some(toml::Value::Table(x)) => Ok(x.clone()),
            Some(_) => Err(CliError::new(format!("{f}: [{name}] must be a table"))),
        }
    };
    let mut run = Vec::new();
    for (k, v) in table("run")? {
        let s = scalar(&v).ok_or_else(|| CliError::new(format!("{f}: run.{k}: a string, number or boolean")))?;
        run.push((k, s));
    }
    let mut grid = Vec::new();
    for (k, v) in table("grid")? {
        let vals: Option<Vec<String>> = match &v {
            toml::Value::Array(a) => a.iter().map(scalar).collect(),
            other => scalar(other).map(|s| vec![s]),
        };
        match vals {
            Some(v) if !v.is_empty() => grid.push((k, v)),
            _ => return Err(CliError::new(format!("{f}: grid.{k}: a non-empty list of strings or numbers"))),
        }
    }
    let points: usize = grid.iter().map(|(_, v)| v.len()).product();
    if points * reps > 100_000 {
        return Err(CliError::new(format!("{f}: {points} points x {reps} reps: at most 100000 runs")));
    }
    Ok(Sweep { reps, out, run, grid })
}

/// Every combination of the grid's values, first variable slowest.
fn points(grid: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![Vec::new()];
    for (_, vals) in grid {
        out = out.iter().flat_map(|p| vals.iter().map(move |v| [p.clone(), vec![v.clone()]].concat())).collect();
    }
    out
}

/// The `run` words of one point: [run] options with the point's placeholders filled, then the point's own options.
fn words(s: &Sweep, point: &[String]) -> Vec<String> {
    let fill = |text: &str| {
        s.grid.iter().zip(point).fold(text.to_string(), |t, ((k, _), v)| t.replace(&format!("{{{k}}}"), v))
    };
    let used = |k: &str| s.run.iter().any(|(_, v)| v.contains(&format!("{{{k}}}")));
    let mut w = vec!["run".to_string(), "--json".to_string()];
    let flag = |w: &mut Vec<String>, k: &str, v: &str| match v {
        "true" => w.push(format!("--{}", k.replace('_', "-"))),
        "false" => {}
        v => w.push(format!("--{}={v}", k.replace('_', "-"))),
    };
    for (k, v) in &s.run {
        flag(&mut w, k, &fill(v));
    }
    for ((k, _), v) in s.grid.iter().zip(point) {
        if !used(k) {
            flag(&mut w, k, v);
        }
    }
    w
}

/// The CSV's header: round, the variables, then the results.
fn header(s: &Sweep) -> String {
    let vars: Vec<&str> = s.grid.iter().map(|(k, _)| k.as_str()).collect();
    format!("round,{},mpps,packets,busy_ms,flags,error\n", vars.join(","))
}

fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\"").replace('\n', " "))
    } else {
        v.to_string()
    }
}

/// One run's row.
#[derive(Clone, Debug)]
struct Row {
    round: usize,
    point: Vec<String>,
    mpps: Option<f64>,
    packets: u64,
    busy_ms: f64,
    flags: Vec<String>,
    error: Option<String>,
}

impl Row {
    fn csv(&self) -> String {
        let mut s = format!("{}", self.round);
        for v in &self.point {
            let _ = write!(s, ",{}", csv_field(v));
        }
        let _ = writeln!(
            s,
            ",{},{},{:.1},{},{}",
            self.mpps.map_or(String::new(), |m| format!("{m:.4}")),
            self.packets,
            self.busy_ms,
            csv_field(&self.flags.join("; ")),
            csv_field(self.error.as_deref().unwrap_or(""))
        );
        s
    }
}

/// Splits one CSV line (quoted fields with doubled quotes).
fn csv_split(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut chars) = (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The rows of an earlier, interrupted run of the same experiment (none when the header differs).
fn earlier(path: &Path, s: &Sweep) -> Vec<Row> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut lines = text.lines();
    if lines.next().map(|h| format!("{h}\n")) != Some(header(s)) {
        return Vec::new();
    }
    let n = s.grid.len();
    lines
        .filter_map(|l| {
            let f = csv_split(l);
            if f.len() != n + 6 {
                return None;
            }
            Some(Row {
                round: f[0].parse().ok()?,
                point: f[1..=n].to_vec(),
                mpps: f[n + 1].parse().ok(),
                packets: f[n + 2].parse().unwrap_or(0),
                busy_ms: f[n + 3].parse().unwrap_or(0.0),
                flags: f[n + 4].split("; ").filter(|x| !x.is_empty()).map(String::from).collect(),
                error: Some(f[n + 5].clone()).filter(|e| !e.is_empty()),
            })
        })
        .collect()
}

/// Runs one point: the report's figure and trust, or the run's error line.
fn run_one(words: &[String]) -> Row {
    let mut row =
        Row { round: 0, point: Vec::new(), mpps: None, packets: 0, busy_ms: 0.0, flags: Vec::new(), error: None };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            row.error = Some(format!("flowplane binary: {e}"));
            return row;
        }
    };
    match std::process::Command::new(exe).args(words).output() {
        Ok(o) if o.status.success() => match serde_json::from_slice::<Value>(&o.stdout) {
            Ok(v) => {
                let projected = v["scale"]["projected_mpps"].as_f64();
                row.mpps = projected.or_else(|| v["mpps"].as_f64());
                row.packets = v["trust"]["packets"].as_u64().unwrap_or(0);
                row.busy_ms = v["trust"]["busy_ms"].as_f64().unwrap_or(0.0);
                row.flags = v["trust"]["flags"]
                    .as_array()
                    .map_or(Vec::new(), |a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect());
            }
            Err(e) => row.error = Some(format!("report is not JSON: {e}")),
        },
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            row.error = Some(err.lines().last().unwrap_or("failed").trim_start_matches("flowplane: ").to_string());
        }
        Err(e) => row.error = Some(format!("cannot start a run: {e}")),
    }
    row
}

pub fn run(a: SweepArgs) -> Result<(), CliError> {
    let f = a.file.display().to_string();
    let text = flowplane_nf::read_text_file(&f).map_err(CliError::new)?;
    let mut s = parse(&a.file, &text)?;
    if let Some(o) = a.out {
        s.out = o;
    }
    std::fs::create_dir_all(&s.out).map_err(|e| CliError::new(format!("{}: {e}", s.out.display())))?;
    let csv_path = s.out.join("results.csv");
    let mut rows = earlier(&csv_path, &s);
    let resumed = rows.len();
    if resumed == 0 {
        std::fs::write(&csv_path, header(&s)).map_err(|e| CliError::new(format!("{}: {e}", csv_path.display())))?;
    }
    let grid_points = points(&s.grid);
    let total = grid_points.len() * s.reps;
    let mut csv = std::fs::OpenOptions::new()
        .append(true)
        .open(&csv_path)
        .map_err(|e| CliError::new(format!("{}: {e}", csv_path.display())))?;
    let mut done = resumed;
    let bar = flowplane_trace::progress::Progress::bar("sweep", total as u64, flowplane_trace::progress::Unit::Runs);
    bar.set(done as u64);
    for round in 1..=s.reps {
        for p in &grid_points {
            if rows.iter().any(|r| r.round == round && &r.point == p) {
                continue;
            }
            let mut row = run_one(&words(&s, p));
            row.round = round;
            row.point = p.clone();
            use std::io::Write as _;
            csv.write_all(row.csv().as_bytes())
                .and_then(|()| csv.flush())
                .map_err(|e| CliError::new(format!("{}: {e}", csv_path.display())))?;
            done += 1;
            bar.set(done as u64);
            let at: Vec<String> = s.grid.iter().zip(p).map(|((k, _), v)| format!("{k}={v}")).collect();
            let fig = match (&row.error, row.mpps) {
                (Some(e), _) => format!("error: {e}"),
                (None, m) => format!(
                    "{:.3} Mpps{}",
                    m.unwrap_or(0.0),
                    if row.flags.is_empty() { String::new() } else { format!(" ! {}", row.flags.join("; ")) }
                ),
            };
            // Nothing under the global --quiet (the summary only).
            flowplane_trace::progress::note(&format!("[{done}/{total}] round {round} {}: {fig}", at.join(" ")));
            rows.push(row);
        }
    }
    // Cleared before the summary goes to stdout (a bar cleared later would erase the summary's last line).
    drop(bar);
    let summary = summarise(&s, &grid_points, &rows);
    let json_path = s.out.join("results.json");
    let v = crate::provenance::stamp(json!({
        "grid": s.grid.iter().map(|(k, v)| json!({"variable": k, "values": v})).collect::<Vec<_>>(),
        "run": s.run.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
        "reps": s.reps,
        "points": summary,
        "resumed_runs": resumed,
    }));
    std::fs::write(&json_path, serde_json::to_string_pretty(&v)?)
        .map_err(|e| CliError::new(format!("{}: {e}", json_path.display())))?;
    flowplane_bench::set_footer(crate::provenance::line());
    let mut plots = Vec::new();
    for (i, (name, vals)) in s.grid.iter().enumerate() {
        if vals.len() < 2 {
            continue;
        }
        let path = s.out.join(format!("{}.png", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")));
        let series = series_for(&s, i, &summary);
        flowplane_bench::sweep_png(&path, name, vals, &series).map_err(CliError::new)?;
        plots.push(path);
    }
    outln!("{} runs ({} resumed) of {} points x {} reps", rows.len(), resumed, grid_points.len(), s.reps);
    outln!("results      {}", csv_path.display());
    outln!("summary      {}", json_path.display());
    for p in plots {
        outln!("plot         {}", p.display());
    }
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    let flagged = rows.iter().filter(|r| r.error.is_none() && !r.flags.is_empty()).count();
    if failed + flagged > 0 {
        outln!("{failed} run(s) failed, {flagged} flagged as not to quote (see results.csv)");
    }
    Ok(())
}

/// Per point: the median, min and max of its rounds' figures, the flags of any round, the errors.
fn summarise(s: &Sweep, grid_points: &[Vec<String>], rows: &[Row]) -> Vec<Value> {
    grid_points
        .iter()
        .map(|p| {
            let mine: Vec<&Row> = rows.iter().filter(|r| &r.point == p).collect();
            let figs: Vec<f64> = mine.iter().filter_map(|r| r.mpps.filter(|_| r.error.is_none())).collect();
            let spread = flowplane_engine::trust::Spread::of(&figs);
            let mut flags: Vec<String> = mine.iter().flat_map(|r| r.flags.iter().cloned()).collect();
            flags.sort();
            flags.dedup();
            if let Some(sp) = &spread {
                let mut t = flowplane_engine::trust::Trust::default();
                t.spread(sp);
                flags.extend(t.flags);
            }
            let at: BTreeMap<&str, &str> = s.grid.iter().zip(p).map(|((k, _), v)| (k.as_str(), v.as_str())).collect();
            json!({
                "at": at,
                "mpps": spread.as_ref().map(|x| x.median),
                "spread": spread,
                "flags": flags,
                "errors": mine.iter().filter_map(|r| r.error.clone()).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// For variable `i`: one series per combination of the other variables, its median Mpps at each of `i`'s values.
fn series_for(s: &Sweep, i: usize, summary: &[Value]) -> Vec<flowplane_bench::SweepSeries> {
    let mut out: Vec<flowplane_bench::SweepSeries> = Vec::new();
    for (p, v) in points(&s.grid).iter().zip(summary) {
        let others: Vec<String> = s
            .grid
            .iter()
            .zip(p)
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, ((k, _), x))| format!("{k}={x}"))
            .collect();
        let label = if others.is_empty() { "median".to_string() } else { others.join(" ") };
        let at = s.grid[i].1.iter().position(|x| x == &p[i]).unwrap_or(0);
        let point = flowplane_bench::SweepPoint {
            at,
            mpps: v["mpps"].as_f64(),
            bar: v["spread"].as_object().and_then(|o| Some((o.get("min")?.as_f64()?, o.get("max")?.as_f64()?))),
            ok: v["flags"].as_array().is_some_and(|a| a.is_empty())
                && v["errors"].as_array().is_some_and(|a| a.is_empty()),
        };
        match out.iter_mut().find(|x| x.label == label) {
            Some(x) => x.points.push(point),
            None => out.push(flowplane_bench::SweepSeries { label, points: vec![point] }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_expand_fill_placeholders_and_name_errors() {
        let text = "reps = 2\nout = \"o\"\n[run]\ngen = \"--flows {flows} --packets 100\"\nchain = \"fsc\"\nno_pin = true\n[grid]\nexec = [\"batch\", \"rtc\"]\nflows = [10, 20]\n";
        let s = parse(Path::new("x.toml"), text).unwrap();
        assert_eq!((s.reps, s.out.as_path()), (2, Path::new("o")));
        let ps = points(&s.grid);
        assert_eq!(ps, [["batch", "10"], ["batch", "20"], ["rtc", "10"], ["rtc", "20"]]);
        let w = words(&s, &ps[3]);
        assert!(
            w.contains(&"--gen=--flows 20 --packets 100".to_string()) && w.contains(&"--exec=rtc".to_string()),
            "{w:?}"
        );
        assert!(w.contains(&"--no-pin".to_string()) && !w.iter().any(|x| x.starts_with("--flows")), "{w:?}");
        for (bad, want) in [
            ("reps = 0", "reps = 0"),
            ("colour = 1", "unknown key 'colour'"),
            ("[grid]\ncores = []", "grid.cores"),
            ("[run]\nchain = [1]", "run.chain"),
        ] {
            let e = parse(Path::new("x.toml"), bad).unwrap_err().to_string();
            assert!(e.contains(want) && e.starts_with("x.toml"), "{bad}: {e}");
        }
        // CSV rows survive a round trip (quotes, commas): what resuming reads back.
        let r = Row {
            round: 2,
            point: vec!["interleaved:16".into(), "a,b".into()],
            mpps: Some(1.5),
            packets: 7,
            busy_ms: 3.0,
            flags: vec!["short: x".into(), "few \"y\"".into()],
            error: None,
        };
        let f = csv_split(r.csv().trim_end());
        assert_eq!(f[2], "a,b");
        assert_eq!(f[6], "short: x; few \"y\"");
    }
}

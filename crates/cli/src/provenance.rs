//! Where a result comes from: the `provenance` object every JSON report and
//! benchmark carries (flowplane's version and commit, the CPU, the cores this
//! process may use, the kernel, the command line as its arguments and the date), so a figure
//! can be traced to the build and the machine that printed it.

use serde_json::{json, Value};

/// flowplane's version and the commit it was built from (`-dirty` with uncommitted changes).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FLOWPLANE_COMMIT"), ")");

/// The provenance object.
pub fn provenance() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Each argument as given (one string each: "--gen" "--flows 10 ..." stay apart).
    let command: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    json!({
        "flowplane": env!("CARGO_PKG_VERSION"),
        "commit": env!("FLOWPLANE_COMMIT"),
        "cpu": cpu,
        "tsc_ghz": flowplane_packet::tsc::hz() / 1e9,
        "cores_available": cores,
        "kernel": kernel,
        "command": command,
        "date": utc(secs),
    })
}

/// The provenance as one line, for a plot's footer: version and commit, CPU and TSC GHz, cores, kernel, date, and
/// the command.
pub fn line() -> String {
    let p = provenance();
    let s = |k: &str| p[k].as_str().unwrap_or("").to_string();
    let command: Vec<&str> =
        p["command"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(|x| x.as_str()).collect());
    format!(
        "flowplane {} ({}), {} @ {:.2} GHz TSC, {} cores, Linux {}, {} -- {}",
        s("flowplane"),
        s("commit"),
        s("cpu"),
        p["tsc_ghz"].as_f64().unwrap_or(0.0),
        p["cores_available"],
        s("kernel"),
        s("date"),
        command.join(" ")
    )
}

/// `v` (an object) with the provenance added as `provenance`; anything else wrapped as `{"result": v, ...}`.
pub fn stamp(mut v: Value) -> Value {
    match v.as_object_mut() {
        Some(o) => {
            o.insert("provenance".into(), provenance());
            v
        }
        None => json!({"result": v, "provenance": provenance()}),
    }
}

/// Seconds since the epoch as an ISO 8601 UTC time (civil-from-days, proleptic Gregorian).
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_the_calendar_s() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_910_400 + 3_661), "2026-11-29T01:01:01Z");
    }

    #[test]
    fn stamp_adds_the_provenance_to_an_object() {
        let v = stamp(json!({"mpps": 1.0}));
        assert_eq!(v["mpps"], 1.0);
        assert_eq!(v["provenance"]["flowplane"], env!("CARGO_PKG_VERSION"));
        assert!(!v["provenance"]["commit"].as_str().unwrap().is_empty());
        assert!(v["provenance"]["date"].as_str().unwrap().ends_with('Z'));
        assert_eq!(stamp(json!([1]))["result"], json!([1]));
    }
}

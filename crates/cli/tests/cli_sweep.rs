//! `flowplane sweep FILE.toml` (issue 35, item 4): a grid of runs, repeated, results in CSV and JSON, a PNG per
//! variable, and an interrupted sweep resumed without running its finished runs again.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn sweep(file: &std::path::Path) -> (String, String) {
    let o = Command::new(BIN).args(["sweep", file.to_str().unwrap()]).output().expect("spawn flowplane");
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{out}\n{err}");
    (out, err)
}

#[test]
fn a_grid_runs_every_point_each_round_and_resumes() {
    let dir = std::env::temp_dir().join(format!("flowplane-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("exp.toml");
    let out = dir.join("out");
    let body = |reps: u32| {
        format!(
            "reps = {reps}\nout = \"{}\"\n[run]\ngen = \"--flows {{flows}} --packets 2000 --seed 1\"\nchain = \"fsc\"\ncores = 1\nno_pin = true\n[grid]\nexec = [\"batch\", \"rtc\"]\nflows = [50, 400]\n",
            out.display()
        )
    };
    std::fs::write(&file, body(1)).unwrap();
    let (text, _) = sweep(&file);
    assert!(text.contains("4 runs (0 resumed) of 4 points x 1 reps"), "{text}");
    // One more round: only its four runs are new.
    std::fs::write(&file, body(2)).unwrap();
    let (text, err) = sweep(&file);
    assert!(text.contains("8 runs (4 resumed) of 4 points x 2 reps"), "{text}");
    assert_eq!(err.lines().filter(|l| l.contains("round 2")).count(), 4, "{err}");
    assert!(!err.contains("round 1"), "round 1 ran again: {err}");
    // Every row ran the point it names: 2,000 packets each, no error.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("round,exec,flows,mpps,packets,busy_ms,flags,error"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert_eq!(r[4], "2000", "{r:?}");
        assert!(r[3].parse::<f64>().unwrap() > 0.0 && r.last() == Some(&""), "{r:?}");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    assert_eq!(points[3]["at"], serde_json::json!({"exec": "rtc", "flows": "400"}));
    assert_eq!(points[3]["spread"]["reps"], 2);
    // 2,000 packets are too few to quote: the summary says so.
    assert!(points[0]["flags"].as_array().unwrap().iter().any(|f| f.as_str().unwrap().starts_with("few packets")));
    assert!(v["provenance"]["commit"].is_string());
    for png in ["exec.png", "flows.png"] {
        assert_eq!(&std::fs::read(out.join(png)).unwrap()[1..4], b"PNG", "{png}");
    }
    // A bad file: one line naming it.
    std::fs::write(&file, "[grid]\ncores = []\n").unwrap();
    let o = Command::new(BIN).args(["sweep", file.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.lines().count() == 1 && err.contains("grid.cores"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

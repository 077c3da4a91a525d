//! Maglev's table (`flowplane_nf::maglev`) against an independent Python model of the rule
//! its module documents (`tests/models/maglev.py`, from the NSDI 2016 paper's section 3.4):
//! the same table, entry for entry, for plain, weighted, drained and IPv6-named backends.

use std::process::Command;

use flowplane_nf::maglev::{populate, table_size, NONE};

fn model(m: usize, backends: &[(&str, u32)]) -> Vec<i64> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/models/maglev.py");
    let out = Command::new("python3")
        .arg(dir)
        .arg(m.to_string())
        .args(backends.iter().map(|(n, w)| format!("{n}:{w}")))
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(|x| x.parse().unwrap()).collect()
}

#[test]
fn the_table_is_the_models_entry_for_entry() {
    let cases: Vec<(usize, Vec<(&str, u32)>)> = vec![
        (table_size(3), vec![("10.10.0.1", 1), ("10.10.0.2", 1), ("10.10.0.3", 1)]),
        (1009, vec![("10.10.0.1", 1), ("10.10.0.2", 3), ("10.10.0.3", 0), ("10.10.0.4", 2)]),
        (101, vec![("2001:db8::1", 1), ("2001:db8::2", 1)]),
        (7, vec![("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("f", 1), ("g", 1), ("h", 1)]),
        (101, vec![("x", 0)]),
    ];
    for (m, backends) in cases {
        let named: Vec<(&[u8], u32)> = backends.iter().map(|(n, w)| (n.as_bytes(), *w)).collect();
        let ours: Vec<i64> = populate(&named, m).into_iter().map(|b| if b == NONE { -1 } else { b as i64 }).collect();
        assert_eq!(ours, model(m, &backends), "M={m} {backends:?}");
    }
}

//! docs/WRITING_AN_NF.md is checked by the build (issue 35, item 8): its complete file is
//! `src/guide/synflood.rs`, which the crate compiles and tests (`guide_synflood`), and its
//! excerpts are lines of that file — so the guide cannot drift from the API again (its old
//! example named `crate::pkt::tcp_flags`, which did not exist).

use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The ```rust blocks after each `## ` heading: (heading, code).
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut code: Option<String> = None;
    for line in md.lines() {
        match (&mut code, line) {
            (None, l) if l.starts_with("## ") => heading = l.to_string(),
            (None, "```rust") => code = Some(String::new()),
            (Some(c), "```") => {
                out.push((heading.clone(), std::mem::take(c)));
                code = None;
            }
            (Some(c), l) => {
                c.push_str(l);
                c.push('\n');
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_guides_complete_file_is_the_compiled_and_tested_one() {
    let guide = read("../../docs/WRITING_AN_NF.md");
    let file = read("src/guide/synflood.rs");
    let all = blocks(&guide);
    let complete = all.iter().find(|(h, _)| h == "## The complete file").map(|(_, c)| c.as_str());
    assert_eq!(
        complete,
        Some(file.as_str()),
        "docs/WRITING_AN_NF.md's complete file differs from src/guide/synflood.rs"
    );
}

#[test]
fn the_guides_excerpts_are_lines_of_the_file() {
    let guide = read("../../docs/WRITING_AN_NF.md");
    let file = read("src/guide/synflood.rs");
    let lines: Vec<&str> = file.lines().map(str::trim).collect();
    // Sections quoting the file (5 abridges bodies with `{ ... }`, 8 shows other NFs' calls).
    let quoted = ["## 1.", "## 2.", "## 3.", "## 4.", "## 7.", "## 10."];
    let mut checked = 0;
    for (h, code) in blocks(&guide).iter().filter(|(h, _)| quoted.iter().any(|q| h.starts_with(q))) {
        for l in code.lines() {
            // An excerpt may end a line with a comment of its own (two spaces, then //).
            let l = l.split("  //").next().unwrap_or(l).trim();
            if l.is_empty() || l.contains("...") {
                continue;
            }
            assert!(lines.contains(&l), "{h}: `{l}` is not a line of src/guide/synflood.rs");
            checked += 1;
        }
    }
    assert!(checked > 40, "{checked} lines checked");
}

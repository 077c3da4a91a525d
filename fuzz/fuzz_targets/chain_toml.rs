//! Chain files (`--chain-file`, TOML): `spec::parse_toml` never panics, its byte offsets lie
//! inside the file, `chain = "..."` means exactly what the same string means on the command
//! line, an `[[nf]]` list renders back to a spec string that parses to the same chain (when its
//! names and values are ones the spec syntax can carry), and whatever parses either builds or
//! is refused with a message. File parameters are stripped and sizes capped before building.
#![no_main]

use flowplane_engine::chain::Chain;
use flowplane_engine::spec::{self, ChainSpec};
use flowplane_fuzz::sanitize_chain;
use libfuzzer_sys::fuzz_target;

/// True if `s` is a name or key of the spec grammar.
fn ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// True if `v` is a value of the spec grammar.
fn value(v: &str) -> bool {
    !v.is_empty() && !v.chars().any(|c| c.is_whitespace() || "(),=".contains(c))
}

/// The spec string of `c`, if every name and value can be written in one.
fn render(c: &ChainSpec) -> Option<String> {
    let mut parts = Vec::new();
    for nf in &c.nfs {
        if !ident(&nf.name) || nf.params.iter().any(|(k, v)| !ident(k) || !value(v)) {
            return None;
        }
        let params: Vec<String> = nf.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.push(if params.is_empty() { nf.name.clone() } else { format!("{}({})", nf.name, params.join(", ")) });
    }
    Some(parts.join(" -> "))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match spec::parse_toml(text) {
        Ok(mut parsed) => {
            assert!(!parsed.nfs.is_empty());
            let inline = text.parse::<toml::Table>().ok().and_then(|t| t.get("chain")?.as_str().map(str::to_string));
            if let Some(c) = inline {
                assert_eq!(spec::parse(&c).ok().as_ref(), Some(&parsed), "chain = {c:?}");
            } else if let Some(s) = render(&parsed) {
                assert_eq!(spec::parse(&s).ok().as_ref(), Some(&parsed), "rendered as {s:?}");
            }
            if !sanitize_chain(&mut parsed) {
                return;
            }
            if let Err(e) = Chain::build(&parsed) {
                assert!(!e.to_string().is_empty(), "empty chain error for {text:?}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("chain file") || msg.starts_with("chain spec"), "{msg}");
            if let Some(rest) = msg.strip_prefix("chain file: byte ") {
                let at: usize = rest.split(':').next().and_then(|n| n.parse().ok()).expect("byte offset");
                assert!(at <= text.len(), "byte {at} past the end of a {}-byte file", text.len());
            }
        }
    }
});

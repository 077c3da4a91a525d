//! What an NF reports and exports at the end of a run, and how per-core
//! reports merge into one.
//!
//! Every core runs its own instance of each NF, so `report()` gives one JSON
//! object per core. The runner merges them with the NF's `merge_report` hook
//! (on [`crate::StatefulNf`] and [`crate::Nf`]), whose default is
//! [`merge_default`]: numbers add, objects merge key by key, arrays
//! concatenate, equal values are kept. NFs override it where adding is wrong:
//! configuration echoes (`k`, `pps`, `backends`) and per-core figures are
//! kept ([`merge_keeping`]), a top-k list is re-ranked and cut to k.
//!
//! [`Export`] says what `--export NF=FILE` writes for an NF, so a run can
//! refuse an export the NF cannot serve before any traffic is processed.

use serde_json::{Map, Number, Value};

/// What `--export` writes for an NF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Nothing: the NF holds no state worth exporting; the run refuses the export.
    None,
    /// One row per key of its state (`StatefulNf::export_row`, or
    /// `export_raw_row` for keys without a 5-tuple projection), from every
    /// core's table (shared state once).
    State,
    /// Rows derived from its merged report (`export_report_rows`): totals, a top-k.
    Report,
}

/// Adds two JSON numbers: exactly for unsigned or signed integers
/// (saturating), as floats otherwise.
fn add(a: &Number, b: &Number) -> Number {
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return Number::from(x.saturating_add(y));
    }
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return Number::from(x.saturating_add(y));
    }
    let s = a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0);
    Number::from_f64(s).unwrap_or_else(|| a.clone())
}

/// The default merge of another core's report into `into`: numbers add,
/// objects merge key by key (keys only `other` has are copied), arrays
/// concatenate, `null` yields to a value. Values that differ and cannot be
/// added (strings, booleans, a number against an object) keep `into`'s:
/// an NF with such fields overrides `merge_report`.
pub fn merge_default(into: &mut Value, other: &Value) {
    match (into, other) {
        (_, Value::Null) => {}
        (Value::Number(a), Value::Number(b)) => *a = add(a, b),
        (Value::Object(a), Value::Object(b)) => merge_objects(a, b, &[]),
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (a @ Value::Null, b) => *a = b.clone(),
        _ => {}
    }
}

/// [`merge_default`] for an object, except that the top-level keys in `keep`
/// (configuration echoes like `k` or `pps`, figures that are the same on
/// every core) keep `into`'s value (or take `other`'s if `into` lacks it).
pub fn merge_keeping(into: &mut Value, other: &Value, keep: &[&str]) {
    match (into, other) {
        (Value::Object(a), Value::Object(b)) => merge_objects(a, b, keep),
        (into, other) => merge_default(into, other),
    }
}

fn merge_objects(a: &mut Map<String, Value>, b: &Map<String, Value>, keep: &[&str]) {
    for (k, v) in b {
        match a.get_mut(k) {
            Some(mine) if keep.contains(&k.as_str()) => {
                if mine.is_null() {
                    *mine = v.clone();
                }
            }
            Some(mine) => merge_default(mine, v),
            None => {
                a.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Merges two arrays of objects element by element (same length and order
/// on every core, e.g. per-rule counters): each pair with [`merge_keeping`].
/// Extra elements of `other` are appended.
pub fn merge_rows(into: &mut Value, other: &Value, keep: &[&str]) {
    match (into, other) {
        (Value::Array(a), Value::Array(b)) => {
            for (i, v) in b.iter().enumerate() {
                match a.get_mut(i) {
                    Some(mine) => merge_keeping(mine, v, keep),
                    None => a.push(v.clone()),
                }
            }
        }
        (into, other) => merge_default(into, other),
    }
}

/// A report as one compact line: `key=value` pairs, nested objects as
/// `outer.inner=value`, arrays of scalars inline (the first 32 and the count
/// past 64), arrays of objects as their count and first three entries (for
/// the text report; `--json` has everything).
pub fn compact_line(v: &Value) -> String {
    let mut out = Vec::new();
    flatten("", v, &mut out);
    out.join(" ")
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<String>) {
    let key = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match v {
                    Value::Object(_) => flatten(&key(k), v, out),
                    _ => out.push(format!("{}={}", key(k), scalar(v))),
                }
            }
        }
        other => out.push(if prefix.is_empty() { scalar(other) } else { format!("{prefix}={}", scalar(other)) }),
    }
}

/// Arrays of scalars up to this long are printed whole.
const INLINE_MAX: usize = 64;
/// Longer ones: this many first.
const INLINE_HEAD: usize = 32;
/// Arrays of objects: this many entries first.
const OBJECTS_HEAD: usize = 3;

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            let shown = if a.len() <= INLINE_MAX { a.len() } else { INLINE_HEAD };
            let head = a[..shown].iter().map(scalar).collect::<Vec<_>>().join(",");
            if shown == a.len() {
                format!("[{head}]")
            } else {
                format!("[{head},... {} in all]", a.len())
            }
        }
        Value::Array(a) => {
            let head: Vec<String> = a.iter().take(OBJECTS_HEAD).map(|x| format!("{{{}}}", compact_line(x))).collect();
            let more = if a.len() > OBJECTS_HEAD { ", ..." } else { "" };
            format!("[{} entries: {}{more}]", a.len(), head.join(", "))
        }
        Value::Object(_) => format!("{{{}}}", compact_line(v)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_merge_adds_merges_concatenates_and_keeps() {
        let mut a =
            json!({ "n": 1, "f": 0.5, "neg": -2, "s": "x", "b": true, "arr": [1], "o": { "p": 2, "q": 1 }, "z": null });
        let b = json!({ "n": 2, "f": 0.25, "neg": -3, "s": "x", "b": true, "arr": [2, 3], "o": { "p": 5, "r": 7 }, "z": 4, "new": "y" });
        merge_default(&mut a, &b);
        assert_eq!(
            a,
            json!({ "n": 3, "f": 0.75, "neg": -5, "s": "x", "b": true, "arr": [1, 2, 3], "o": { "p": 7, "q": 1, "r": 7 }, "z": 4, "new": "y" })
        );
        // Unaddable differences keep the first core's value; big counts saturate.
        let mut a = json!({ "s": "x", "max": u64::MAX });
        merge_default(&mut a, &json!({ "s": "y", "max": 1 }));
        assert_eq!(a, json!({ "s": "x", "max": u64::MAX }));
        let mut n = Value::Null;
        merge_default(&mut n, &json!({ "a": 1 }));
        assert_eq!(n, json!({ "a": 1 }));
    }

    #[test]
    fn keeping_and_rows() {
        let mut a = json!({ "k": 10, "seen": 1, "t": null });
        merge_keeping(&mut a, &json!({ "k": 10, "seen": 2, "t": 5 }), &["k", "t"]);
        assert_eq!(a, json!({ "k": 10, "seen": 3, "t": 5 }));
        let mut r = json!([{ "rule": 1, "flows": 2 }, { "rule": 2, "flows": 0 }]);
        merge_rows(&mut r, &json!([{ "rule": 1, "flows": 1 }, { "rule": 2, "flows": 4 }]), &["rule"]);
        assert_eq!(r, json!([{ "rule": 1, "flows": 3 }, { "rule": 2, "flows": 4 }]));
    }

    #[test]
    fn compact_lines() {
        let v =
            json!({ "a": 1, "s": "drop", "d": { "x": 0 }, "short": [1, 2], "top": [{ "a": 1 }], "long": vec![0; 9] });
        assert_eq!(compact_line(&v), "a=1 s=drop d.x=0 short=[1,2] top=[1 entries: {a=1}] long=[0,0,0,0,0,0,0,0,0]");
        // Issue 35: a backend list of 16 is shown, not `[len=16]`; past 64 the head and the count.
        let v = json!({ "per_backend": (0..16).collect::<Vec<u32>>(), "huge": vec![7; 100], "top": vec![json!({"k": 1}); 5] });
        let line = compact_line(&v);
        assert!(line.contains("per_backend=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]"), "{line}");
        assert!(
            line.contains(",7,... 100 in all]") && line.contains("top=[5 entries: {k=1}, {k=1}, {k=1}, ...]"),
            "{line}"
        );
    }
}

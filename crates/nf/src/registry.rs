//! The NF registry: chain-spec names -> descriptors and constructors.
//!
//! The entries are the library's (`src/library.rs`): each NF is one file
//! of `crates/nf/src/library/` exporting `pub const INFO: NfInfo` (name,
//! one-line description, what its state is keyed by, declared parameters)
//! and `pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out,
//! ParamError>`, plus its name on the library's `nfs!` line. Nothing here
//! changes when an NF is added.

use crate::param_spec::ParamSpec;
use crate::stateful::{Granularity, StatefulNf};
use crate::{Nf, ParamError, Params};

/// What an NF is: its name, description, key and parameters (no instance).
#[derive(Clone, Copy, Debug)]
pub struct NfInfo {
    /// Name in chain specs (by convention the NF's file name).
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// What its state is keyed by.
    pub keyed_by: KeyedBy,
    /// Its parameters, in the order `flowplane nfs` lists them.
    pub params: &'static [ParamSpec],
}

/// What an NF's state is keyed by, as known without building it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyedBy {
    /// No per-flow state: a batch element.
    Stateless,
    /// Always this granularity.
    Fixed(Granularity),
    /// Chosen by this parameter (`keyctr(key=...)`).
    Param(&'static ParamSpec),
    /// Its own table, keyed by this (not the flow table: `amf`'s UE contexts, `upf`'s rule set); stateful.
    Own(&'static str),
}

impl KeyedBy {
    /// For listings: `5-tuple`, `src-ip`, ..., `- (stateless)`, `param key`.
    pub fn describe(&self) -> String {
        match self {
            KeyedBy::Stateless => "- (stateless)".into(),
            KeyedBy::Fixed(g) => g.name().into(),
            KeyedBy::Param(p) => format!("param {}", p.name),
            KeyedBy::Own(what) => format!("{what} (own table)"),
        }
    }
}

impl NfInfo {
    /// The descriptor as JSON (for `flowplane nfs --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "about": self.about,
            "keyed_by": self.keyed_by.describe(),
            "stateful": self.keyed_by != KeyedBy::Stateless,
            "params": self.params.iter().map(ParamSpec::to_json).collect::<Vec<_>>(),
            "handlers": self.handlers(),
        })
    }

    /// What a running NF serves (`flowplane ctl`, the metrics): its counters and own report fields to read
    /// (`show nfs`, `show errors`, the metrics' `flowplane_nf_*`), its per-key state (`show flow`, `trace`,
    /// `export`; stateful NFs), the parameters `set` changes (the live ones) and the file `load` reads.
    pub fn handlers(&self) -> serde_json::Value {
        let set: Vec<&str> = self.params.iter().filter(|p| p.live).map(|p| p.name).collect();
        let load = self
            .params
            .iter()
            .find(|p| p.live && matches!(p.kind, crate::ParamKind::Text { syntax: "FILE", .. }))
            .map(|p| p.name);
        let stateful = self.keyed_by != KeyedBy::Stateless;
        serde_json::json!({
            "read": if stateful { vec!["counters", "report", "state"] } else { vec!["counters", "report"] },
            "set": set,
            "load": load,
        })
    }
}

/// Receives a freshly built NF with its concrete type, so the engine can monomorphise its batch loop.
pub trait NfSink {
    /// What the sink makes of the NF.
    type Out;
    /// A stateless batch element.
    fn stateless(self, nf: Box<dyn Nf>) -> Self::Out;
    /// A stateful NF, by value and type.
    fn stateful<T: StatefulNf>(self, nf: T) -> Self::Out;
}

use crate::library::build_nth;
pub use crate::library::NFS;

/// Looks up an NF by name.
pub fn find(name: &str) -> Option<&'static NfInfo> {
    NFS.iter().find(|k| k.name == name)
}

/// Builds NF `name` from `params` (unknown NF or parameter: a one-line ParamError) and hands it to `sink`.
pub fn build_with<S: NfSink>(name: &str, mut params: Params, sink: S) -> Result<S::Out, ParamError> {
    let unknown = || {
        let known: Vec<&str> = NFS.iter().map(|k| k.name).collect();
        ParamError(format!("unknown NF '{name}' (known: {})", known.join(", ")))
    };
    let i = NFS.iter().position(|k| k.name == name).ok_or_else(unknown)?;
    // Reject unknown parameters before building: some NFs allocate a lot.
    params.check_known(NFS[i].params.iter().map(|p| p.name))?;
    let out = build_nth(i, &mut params, sink).ok_or_else(unknown)??;
    params.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::library::FILES;

    #[test]
    fn one_entry_per_file_named_after_it() {
        // Every file of the library is named on the `nfs!` line (a file left off would be no module at all).
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/library");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".rs").map(str::to_string))
            .collect();
        on_disk.sort();
        let mut listed: Vec<&str> = FILES.to_vec();
        listed.sort();
        assert_eq!(on_disk, listed, "add each src/library/NAME.rs to nfs!(...) in src/library.rs");
        assert_eq!(NFS.len(), FILES.len());
        assert!(NFS.len() >= 16, "the library has {} NFs", NFS.len());
        for (d, f) in NFS.iter().zip(FILES) {
            assert_eq!(d.name, *f, "an NF's chain-spec name is its file name");
            assert!(!d.about.is_empty() && !d.about.contains('\n'), "{}: one-line about", d.name);
            for (i, p) in d.params.iter().enumerate() {
                assert!(d.params[..i].iter().all(|q| q.name != p.name), "{}: '{}' declared twice", d.name, p.name);
                assert!(!p.doc.is_empty(), "{}: '{}' has no doc", d.name, p.name);
            }
            if let KeyedBy::Param(p) = d.keyed_by {
                assert!(d.params.contains(p), "{}: keyed by an undeclared parameter", d.name);
            }
        }
        assert!(find("keyctr").is_some() && find("nope").is_none());
    }

    /// Names what it is handed.
    struct Name;

    impl NfSink for Name {
        type Out = &'static str;
        fn stateless(self, nf: Box<dyn Nf>) -> &'static str {
            nf.name()
        }
        fn stateful<T: StatefulNf>(self, nf: T) -> &'static str {
            nf.name()
        }
    }

    /// Calls `on_no_state` once on a stateful NF: (name, verdict, passes_without_state, report before, after).
    struct NoState;

    type NoStateSeen =
        Option<(&'static str, crate::Action, bool, Option<serde_json::Value>, Option<serde_json::Value>)>;

    impl NfSink for NoState {
        type Out = NoStateSeen;
        fn stateless(self, _nf: Box<dyn Nf>) -> NoStateSeen {
            None
        }
        fn stateful<T: StatefulNf>(self, mut nf: T) -> NoStateSeen {
            let before = nf.report();
            let verdict = nf.on_no_state();
            Some((nf.name(), verdict, nf.passes_without_state(), before, nf.report()))
        }
    }

    /// Issue 29: a packet with a key but no state (table full) is counted
    /// `table_full` — never `unparsed` — by every stateful NF that reports,
    /// and its verdict is the one `passes_without_state` states (what scr's
    /// fast-forward uses for other cores' packets). Access-control NFs fail
    /// closed; the others fail open.
    #[test]
    fn every_stateful_nf_counts_table_full_apart_and_states_its_verdict() {
        let dir = std::env::temp_dir().join(format!("fp-nostate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let routes = dir.join("routes");
        std::fs::write(&routes, "10.0.0.0/8 1\n").unwrap();
        let closed = ["acl", "conntrack", "fw", "nat", "portknock"];
        let mut seen = 0;
        for d in NFS {
            let params = match d.name {
                // route follows `miss` (default drop): with miss=pass it fails open.
                "route" => vec![("routes".into(), routes.display().to_string()), ("miss".into(), "pass".into())],
                _ => vec![],
            };
            let Some((name, verdict, passes, before, after)) =
                build_with(d.name, Params::new(d.name, params), NoState).unwrap_or_else(|e| panic!("{}: {e}", d.name))
            else {
                continue;
            };
            seen += 1;
            let want_pass = !closed.contains(&name);
            assert_eq!(passes, want_pass, "{name}: fails {}", if want_pass { "open" } else { "closed" });
            assert_eq!(verdict, if passes { crate::Action::Pass } else { crate::Action::Drop }, "{name}");
            let (Some(before), Some(after)) = (before, after) else { continue };
            // The count sits at the top level, or under `drops` (fw); nat names its drops `dropped_*`.
            let find = |r: &serde_json::Value, k: &str| {
                r.get(k).or_else(|| r.get("drops").and_then(|d| d.get(k))).and_then(|v| v.as_u64())
            };
            let full = |r: &serde_json::Value| find(r, "table_full").or_else(|| find(r, "dropped_table_full"));
            assert_eq!(full(&after), full(&before).map(|n| n + 1), "{name}: counted as table_full: {after}");
            for k in ["unparsed", "dropped_unparsed", "unkeyed", "missed"] {
                assert_eq!(find(&after, k), find(&before, k), "{name}: not counted as {k}");
            }
        }
        assert!(seen >= 15, "{seen} stateful NFs");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unknown_names_are_one_line_errors() {
        let build = |n: &str, p| build_with(n, Params::new(n, p), Name);
        assert_eq!(build("lb", vec![]), Ok("lb"));
        let e = build("nope", vec![]).err().unwrap().0;
        assert!(e.starts_with("unknown NF 'nope' (known: acl, amf, burn, conntrack, count,"), "{e}");
        let e = build("lb", vec![("bogus".into(), "1".into())]).err().unwrap().0;
        assert_eq!(e, "lb: unknown parameter 'bogus'");
    }
}

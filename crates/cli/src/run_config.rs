//! `flowplane run --config FILE`: a whole run in one TOML file, merged with
//! the command line (which overrides it), and re-read by `flowplane ctl PATH
//! reload` on a live run.
//!
//! Rules (for the help and the docs):
//! - every `run` option is a top-level key, its long name without the
//!   dashes, `-` or `_` alike (`idle_timeout = 10`, `scale = "rsspp"`);
//! - flags take `true` or `false`; options with a value take a string or a
//!   number; repeatable options (`port`, `export`, `ipfix`) take a string or an
//!   array of strings;
//! - the chain is `chain = "..."`, `chain_file = "..."`, or `[[nf]]` tables
//!   as `--chain-file` accepts (a `name` and the NF's parameters) — one of
//!   the three;
//! - an option given on the command line replaces the file's (`--input`
//!   replaces the file's `gen` too, `--chain`/`--chain-file` the file's
//!   chain in any form); a repeatable option replaces the file's list;
//! - paths are taken as given, relative to the working directory (as on the
//!   command line);
//! - unknown keys and wrong types are refused in one line naming the file,
//!   the line and the key; a value is checked by the option's own parser.
//!
//! The file becomes `--key=value` words placed before the command line's,
//! parsed by the same clap definition as the command line, so a key can
//! never mean something other than its option.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, Args, FromArgMatches};
use flowplane_engine::spec::{self, ChainSpec};

use crate::cmd_run::RunArgs;
use crate::error::CliError;

/// Keys that give the chain (at most one in a file; a command-line chain replaces them all).
const CHAIN_KEYS: [&str; 3] = ["chain", "chain-file", "nf"];
/// Keys that give the traffic (likewise).
const INPUT_KEYS: [&str; 2] = ["input", "gen"];

/// A run's config file and its command line, kept by a live run for `ctl reload`.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// The file.
    pub path: PathBuf,
    /// The command line's `run` words (they override the file at every reload too).
    pub cli: Vec<OsString>,
    /// Every option's value the run started with, by long name, in `run --help` order.
    pub values: Vec<(String, Vec<String>)>,
}

/// A config file merged with the command line.
#[derive(Debug)]
pub struct Merged {
    /// The run's options.
    pub args: RunArgs,
    /// The file's `[[nf]]` chain, when it gives one and the command line gives no chain.
    pub nf: Option<ChainSpec>,
    /// Every option's value (long name, raw values) in `run --help` order: what a reload compares.
    pub values: Vec<(String, Vec<String>)>,
}

/// The `run` options as a clap command of their own (no program name).
fn command() -> clap::Command {
    RunArgs::augment_args(clap::Command::new("run").no_binary_name(true))
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid value");
    first.trim().trim_start_matches("error: ").to_string()
}

/// 1-based line of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// One value as an option's word, or why it cannot be one.
fn scalar(v: &toml::Value) -> Result<String, &'static str> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(_) => Err("takes a value, not true/false"),
        toml::Value::Datetime(_) => Err("takes a string or a number, not a date"),
        toml::Value::Array(_) => Err("takes one value, not an array"),
        toml::Value::Table(_) => Err("takes a value, not a table"),
    }
}

/// Reads `path` and merges it under the command line's `cli` words (the `run` words after `run`).
pub fn merge(path: &Path, cli: &[OsString]) -> Result<Merged, CliError> {
    let file = path.display().to_string();
    let text = flowplane_nf::read_text_file(&file).map_err(|e| CliError::new(format!("--config {e}")))?;
    merge_text(&file, &text, cli)
}

/// [`merge`] on the file's text (`file` names it in errors).
pub fn merge_text(file: &str, text: &str, cli: &[OsString]) -> Result<Merged, CliError> {
    let err = |at: usize, m: String| CliError::new(format!("{file}:{}: {m}", line_of(text, at)));
    // Spans (for lines) from the parser's document; typed values from the table.
    let doc = toml::de::DeTable::parse(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        err(at, format!("not TOML: {}", e.message().trim()))
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| CliError::new(format!("{file}: {e}")))?;
    let at_of =
        |k: &str| doc.get_ref().iter().find(|(key, _)| key.get_ref() == k).map_or(0, |(key, _)| key.span().start);

    let cmd = command();
    let given = cmd.clone().try_get_matches_from(cli).map_err(|e| CliError::new(clap_line(&e)))?;
    let on_cli = |long: &str| {
        cmd.get_arguments().any(|a| {
            a.get_long() == Some(long) && given.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine)
        })
    };
    let cli_chain = CHAIN_KEYS.iter().any(|k| on_cli(k));
    let cli_input = INPUT_KEYS.iter().any(|k| on_cli(k));

    let mut words: Vec<OsString> = Vec::new();
    let mut nf = None;
    let mut seen: Vec<(String, String)> = Vec::new(); // (long name, key as written)
                                                      // In the file's order, so a conflict names the later key.
    let mut keys: Vec<(usize, &String, &toml::Value)> = table.iter().map(|(k, v)| (at_of(k), k, v)).collect();
    keys.sort_by_key(|k| k.0);
    for (at, key, value) in keys {
        let long = key.replace('_', "-");
        if let Some((_, first)) = seen.iter().find(|(l, _)| *l == long) {
            return Err(err(at, format!("'{key}' and '{first}' are the same option")));
        }
        for group in [&CHAIN_KEYS[..], &INPUT_KEYS[..]] {
            if group.contains(&long.as_str()) {
                if let Some((_, other)) = seen.iter().find(|(l, _)| group.contains(&l.as_str())) {
                    return Err(err(at, format!("'{key}' and '{other}' both given: give one")));
                }
            }
        }
        seen.push((long.clone(), key.clone()));
        let overridden = on_cli(&long)
            || (cli_chain && CHAIN_KEYS.contains(&long.as_str()))
            || (cli_input && INPUT_KEYS.contains(&long.as_str()));
        if long == "nf" {
            // `[[nf]]` tables, read by the chain file's own parser.
            let mut one = toml::Table::new();
            one.insert("nf".into(), value.clone());
            let t = toml::to_string(&one).map_err(|e| err(at, format!("nf: {e}")))?;
            let s = spec::parse_toml(&t).map_err(|e| err(at, format!("[[nf]]: {e}")))?;
            if !overridden {
                nf = Some(s);
            }
            continue;
        }
        if long == "config" {
            return Err(err(at, "'config': a config file cannot name another".into()));
        }
        let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(long.as_str())) else {
            return Err(err(
                at,
                format!("unknown key '{key}' (keys are `flowplane run` options without their dashes, and [[nf]])"),
            ));
        };
        let bad = |why: &str| err(at, format!("'{key}' {why}"));
        let mine: Vec<String> = match arg.get_action() {
            ArgAction::SetTrue => match value {
                toml::Value::Boolean(true) => vec![format!("--{long}")],
                toml::Value::Boolean(false) => vec![],
                _ => return Err(bad("is a flag: true or false")),
            },
            ArgAction::Append => {
                let items: Vec<&toml::Value> = match value {
                    toml::Value::Array(a) => a.iter().collect(),
                    v => vec![v],
                };
                let mut w = Vec::new();
                for v in items {
                    w.push(format!(
                        "--{long}={}",
                        scalar(v).map_err(|_| bad("takes a string or an array of strings"))?
                    ));
                }
                w
            }
            _ => vec![format!("--{long}={}", scalar(value).map_err(bad)?)],
        };
        // Each value through the option's own parser, alone, so the error names this key.
        if let Err(e) = cmd.clone().try_get_matches_from(&mine) {
            return Err(err(at, format!("{key}: {}", clap_line(&e))));
        }
        if !overridden {
            words.extend(mine.into_iter().map(OsString::from));
        }
    }
    words.extend(cli.iter().cloned());
    let m =
        cmd.clone().try_get_matches_from(&words).map_err(|e| CliError::new(format!("{file}: {}", clap_line(&e))))?;
    let args = RunArgs::from_arg_matches(&m).map_err(|e| CliError::new(format!("{file}: {}", clap_line(&e))))?;
    let values = cmd
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let raw = m.get_raw(a.get_id().as_str()).map(|r| r.map(|x| x.to_string_lossy().into_owned()).collect());
            Some((long.to_string(), raw.unwrap_or_default()))
        })
        .collect();
    Ok(Merged { args, nf, values })
}

/// The config key of option `long` (`idle-timeout` -> `idle_timeout`).
pub fn key_of(long: &str) -> String {
    long.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn merged(text: &str, cli: &[&str]) -> Result<Merged, String> {
        merge_text("run.toml", text, &os(cli)).map_err(|e| e.to_string())
    }

    /// The same options parsed from a command line (the oracle: clap's own parse).
    fn cli_args(cli: &[&str]) -> RunArgs {
        RunArgs::from_arg_matches(&command().try_get_matches_from(os(cli)).unwrap()).unwrap()
    }

    /// A valid value for every option that has no default (a new option without one fails the walk).
    const SAMPLES: &[(&str, &str)] = &[
        ("input", "in.pcap"),
        ("gen", "--flows 10 --packets 100"),
        ("output", "out.pcap"),
        ("port", "afpacket:b"),
        ("eal", "--no-huge"),
        ("metrics", "127.0.0.1:9100"),
        ("ctl", "/tmp/fp.sock"),
        ("chain-file", "chain.toml"),
        ("cores", "2"),
        ("export", "hh=hh.csv"),
        ("ipfix", "udp:127.0.0.1:4739"),
        ("ipfix-active", "1"),
        ("replicate", "udp:127.0.0.1:7700"),
        ("replicate-listen", "udp:127.0.0.1:7701"),
        ("hash-seed", "7"),
        ("ring", "1024"),
        ("scr-history", "4"),
        ("priority", "dport=80"),
        ("slo-us", "5"),
        ("nic-profile", "connectx4"),
        ("virtual-cores", "8"),
        ("loops", "3"),
        ("duration", "1.5"),
        ("warmup", "0.5"),
        ("rate", "2M"),
        ("table-capacity", "4096"),
        ("flows", "4096"),
    ];

    #[test]
    fn every_option_has_a_key_meaning_the_option() {
        let cmd = command();
        let mut walked = 0;
        for a in cmd.get_arguments() {
            let long = a.get_long().expect("run options are long options");
            if long == "config" {
                continue;
            }
            let (file, cli): (String, Vec<String>) = match a.get_action() {
                ArgAction::SetTrue => (format!("{} = true", key_of(long)), vec![format!("--{long}")]),
                _ => {
                    let v = SAMPLES.iter().find(|(k, _)| *k == long).map(|(_, v)| v.to_string()).or_else(|| {
                        // A value other than the default, where the option has a list of them.
                        let choices: Vec<String> =
                            a.get_possible_values().iter().map(|p| p.get_name().to_string()).collect();
                        let def = a.get_default_values().first().map(|d| d.to_string_lossy().into_owned());
                        choices.into_iter().find(|c| Some(c) != def.as_ref()).or(def)
                    });
                    let v = v.unwrap_or_else(|| panic!("--{long}: add a sample value to SAMPLES"));
                    (format!("{} = {}", key_of(long), toml::Value::String(v.clone())), vec![format!("--{long}"), v])
                }
            };
            let got = merged(&file, &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
            let want = cli_args(&cli.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(format!("{:?}", got.args), format!("{want:?}"), "{file}");
            // The same with dashes in the key.
            let dashed = file.replacen(&key_of(long), long, 1);
            let got = merged(&dashed, &[]).unwrap_or_else(|e| panic!("{dashed}: {e}"));
            assert_eq!(format!("{:?}", got.args), format!("{want:?}"), "{dashed}");
            walked += 1;
        }
        assert!(walked > 40, "{walked} options");
    }

    #[test]
    fn numbers_lists_and_flags() {
        let m = merged(
            "cores = 2\nidle_timeout = 2.5\ntable_capacity = 4096\nno-pin = true\njson = false\nport = [\"afpacket:a\", \"afpacket:b\"]\nexport = \"hh=x.csv\"\n",
            &[],
        )
        .unwrap();
        let a = m.args;
        assert_eq!(
            (a.workers.cores, a.tables.idle_timeout, a.tables.capacity().unwrap().0, a.workers.no_pin, a.outputs.json),
            (Some(2), 2.5, 4096, true, false)
        );
        assert_eq!(a.outputs.ports, vec!["afpacket:a", "afpacket:b"]);
        assert_eq!(a.outputs.export, vec!["hh=x.csv"]);
        assert!(m.values.iter().any(|(k, v)| k == "cores" && v == &["2"]));
    }

    #[test]
    fn the_command_line_overrides_the_file() {
        let text = "cores = 2\ninput = \"a.pcap\"\nchain = \"fsc\"\nport = [\"afpacket:a\"]\n";
        let a = merged(text, &["--cores", "4", "--gen", "--flows 5", "--chain-file", "c.toml", "--port", "afpacket:z"])
            .unwrap()
            .args;
        assert_eq!(a.workers.cores, Some(4));
        assert_eq!((a.traffic.input, a.traffic.gen.as_deref()), (None, Some("--flows 5")));
        assert_eq!(a.pipeline.chain_file.as_deref(), Some(Path::new("c.toml")));
        assert_eq!(a.outputs.ports, vec!["afpacket:z"], "a list replaces the file's");
        // Without the command line: the file's.
        let a = merged(text, &[]).unwrap().args;
        assert_eq!((a.workers.cores, a.pipeline.chain.as_str()), (Some(2), "fsc"));
        assert_eq!(a.traffic.input.as_deref(), Some(Path::new("a.pcap")));
    }

    #[test]
    fn nf_tables_give_the_chain() {
        let text =
            "cores = 1\n[[nf]]\nname = \"acl\"\nrules = \"my rules.txt\"\n[[nf]]\nname = \"ddos\"\nthreshold = 5\n";
        let m = merged(text, &[]).unwrap();
        let nf = m.nf.unwrap();
        assert_eq!(nf.nfs.len(), 2);
        assert_eq!(nf.nfs[0].params, vec![("rules".to_string(), "my rules.txt".to_string())]);
        assert_eq!(nf.nfs[1].params, vec![("threshold".to_string(), "5".to_string())]);
        assert!(merged(text, &["--chain", "fsc"]).unwrap().nf.is_none(), "the command line's chain wins");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let cases: &[(&str, &str)] = &[
            ("cores = 2\nbogus = 1\n", "run.toml:2: unknown key 'bogus'"),
            ("\n\ncores = \"many\"\n", "run.toml:3: cores: invalid value 'many'"),
            ("cores = true\n", "run.toml:1: 'cores' takes a value, not true/false"),
            ("json = 1\n", "run.toml:1: 'json' is a flag: true or false"),
            ("port = [1, [2]]\n", "run.toml:1: 'port' takes a string or an array of strings"),
            ("cores = [1]\n", "run.toml:1: 'cores' takes one value, not an array"),
            ("scale = \"magic\"\n", "run.toml:1: scale: invalid value 'magic'"),
            ("chain = \"fsc\"\n\n[[nf]]\nname = \"acl\"\n", "run.toml:3: 'nf' and 'chain' both given"),
            ("input = \"a\"\ngen = \"--flows 1\"\n", "run.toml:2: 'gen' and 'input' both given"),
            (
                "idle_timeout = 1\nidle-timeout = 2\n",
                "run.toml:2: 'idle-timeout' and 'idle_timeout' are the same option",
            ),
            ("config = \"x.toml\"\n", "run.toml:1: 'config': a config file cannot name another"),
            ("cores = 1\ncores = 2\n", "run.toml:2: not TOML"),
            ("[[nf]]\nrules = \"x\"\n", "run.toml:1: [[nf]]: chain file: nf #1 has no string 'name'"),
            ("[server]\nport = 1\n", "run.toml:1: unknown key 'server'"),
        ];
        for (text, want) in cases {
            let e = merged(text, &[]).err().unwrap_or_else(|| panic!("{text:?} accepted"));
            assert!(e.starts_with(want), "{text:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}

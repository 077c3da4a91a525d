//! `flowplane run --export NF=FILE` values (`flowplane_cli::parse_exports`; one value per input
//! line): never a panic, never a file touched; an accepted value splits at its first `=` into
//! the NF and a path ending in .csv or .json, and a refused one gets a one-line error naming
//! `--export`.
#![no_main]

use flowplane_cli::parse_exports;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let specs: Vec<String> = text.split('\n').map(str::to_string).collect();
    match parse_exports(&specs) {
        Ok(pairs) => {
            assert_eq!(pairs.len(), specs.len());
            for ((nf, path), s) in pairs.iter().zip(&specs) {
                let (want_nf, file) = s.split_once('=').expect("accepted values hold '='");
                assert_eq!(nf, want_nf);
                assert_eq!(path.as_os_str(), file);
                assert!(matches!(path.extension().and_then(|e| e.to_str()), Some("csv" | "json")), "{path:?}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("--export ") && !msg.contains('\n'), "{msg:?}");
        }
    }
});

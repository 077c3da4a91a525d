//! Chain specs as a user types them: the parser never panics, its error column points into the
//! spec, and whatever parses either compiles to a chain or is rejected with a message. File
//! parameters (`acl(rules=FILE)`) are stripped and allocation sizes capped before building
//! (`flowplane_fuzz::sanitize_chain`), so the target never reads the disk and stays fast.
#![no_main]

use flowplane_engine::chain::Chain;
use flowplane_engine::spec;
use flowplane_fuzz::sanitize_chain;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match spec::parse(text) {
        Ok(mut parsed) => {
            assert!(!parsed.nfs.is_empty());
            if !sanitize_chain(&mut parsed) {
                return;
            }
            if let Err(e) = Chain::build(&parsed) {
                // The CLI prints this as its one-line error.
                assert!(!e.to_string().is_empty(), "empty chain error for {text:?}");
            }
        }
        Err(e) => {
            // Columns are 1-based characters; one past the end names "end of input".
            assert!(e.column >= 1 && e.column <= text.chars().count() + 1, "column {} for {text:?}", e.column);
            assert!(!e.message.is_empty());
        }
    }
});

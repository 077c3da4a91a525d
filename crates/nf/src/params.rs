//! NF parameters from chain specs: `name(key=value, ...)` as given; typed
//! access through the NF's declarations is in [`crate::param_spec`].
//! Also the limits parameters are held to: the machine's available memory
//! ([`mem_available`]) and bounded reads of the files they name
//! ([`read_text_file`], at most [`MAX_FILE_BYTES`]).

use std::fmt;
use std::io::Read;

/// Largest rule, route, session or chain file read (64 MiB): a file past it,
/// or one that never ends (`/dev/zero`), is refused instead of read until the
/// process is killed.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads the text file `path` ([`MAX_FILE_BYTES`] at most; character and
/// block devices refused, they may never end). Errors are one line naming
/// the file.
pub fn read_text_file(path: &str) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("{path}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("{path}: is a directory"));
    }
    {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
            return Err(format!("{path}: is a device, not a file"));
        }
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("{path}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("{path}: larger than {} MiB", MAX_FILE_BYTES >> 20));
    }
    String::from_utf8(bytes).map_err(|_| format!("{path}: not UTF-8 text"))
}

/// Memory the kernel can give without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where it cannot be read (no check then).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `1.5 GiB`-style size for messages.
pub fn human_bytes(b: u128) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// A parameter problem, naming the offending token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

/// The parameters given to one NF in a chain spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    nf: String,
    pairs: Vec<(String, String)>,
    used: Vec<bool>,
}

impl Params {
    /// Parameters `pairs` for NF `nf` (for error messages).
    pub fn new(nf: &str, pairs: Vec<(String, String)>) -> Self {
        let used = vec![false; pairs.len()];
        Params { nf: nf.to_string(), pairs, used }
    }

    /// The NF these parameters are for (the prefix of every error).
    pub(crate) fn nf(&self) -> &str {
        &self.nf
    }

    /// The value given for `key`, marking it read.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        self.used[i] = true;
        Some(self.pairs[i].1.clone())
    }

    /// Fails on the first parameter whose name is not in `known`.
    pub fn check_known<'k>(&self, known: impl Iterator<Item = &'k str> + Clone) -> Result<(), ParamError> {
        for (k, _) in &self.pairs {
            if !known.clone().any(|n| n == k) {
                return Err(ParamError(format!("{}: unknown parameter '{k}'", self.nf)));
            }
        }
        Ok(())
    }

    /// Fails on the first parameter no getter asked for (a typo, usually).
    pub fn finish(&self) -> Result<(), ParamError> {
        match self.used.iter().position(|u| !u) {
            Some(i) => Err(ParamError(format!("{}: unknown parameter '{}'", self.nf, self.pairs[i].0))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::new("x", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn unknown_and_unread_parameters_are_refused() {
        let mut ps = p(&[("n", "16"), ("typo", "1")]);
        assert_eq!(ps.check_known(["n", "m"].into_iter()).unwrap_err().0, "x: unknown parameter 'typo'");
        assert!(ps.check_known(["n", "typo"].into_iter()).is_ok());
        assert_eq!(ps.take("n").as_deref(), Some("16"));
        assert_eq!(ps.take("absent"), None);
        assert_eq!(ps.finish().unwrap_err().0, "x: unknown parameter 'typo'");
        assert_eq!(ps.take("typo").as_deref(), Some("1"));
        assert!(ps.finish().is_ok());
    }
}

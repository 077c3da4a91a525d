//! NF parameters from chain specs: `name(key=value, ...)`, typed on access.

use std::fmt;

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

    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        self.used[i] = true;
        Some(self.pairs[i].1.clone())
    }

    /// An unsigned integer parameter in `[min, max]`, or `default` if absent.
    /// Accepts suffixes k/K (1e3), m/M (1e6), g/G (1e9).
    pub fn u64_in(&mut self, key: &str, default: u64, min: u64, max: u64) -> Result<u64, ParamError> {
        let Some(v) = self.take(key) else { return Ok(default) };
        let parsed = parse_u64(&v)
            .ok_or_else(|| ParamError(format!("{}: parameter '{key}={v}' is not an unsigned integer", self.nf)))?;
        if parsed < min || parsed > max {
            return Err(ParamError(format!("{}: parameter '{key}={v}' out of range [{min}, {max}]", self.nf)));
        }
        Ok(parsed)
    }

    /// A string parameter, or `default`.
    pub fn string(&mut self, key: &str, default: &str) -> String {
        self.take(key).unwrap_or_else(|| default.to_string())
    }

    /// A boolean parameter (`true/false/1/0/yes/no`), or `default`.
    pub fn bool(&mut self, key: &str, default: bool) -> Result<bool, ParamError> {
        let Some(v) = self.take(key) else { return Ok(default) };
        match v.as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ParamError(format!("{}: parameter '{key}={v}' is not a boolean", self.nf))),
        }
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

fn parse_u64(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1_000),
        b'm' | b'M' => (&s[..s.len() - 1], 1_000_000),
        b'g' | b'G' => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::new("x", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn typed_access_and_errors() {
        let mut ps = p(&[("n", "16"), ("rate", "2M"), ("on", "yes")]);
        assert_eq!(ps.u64_in("n", 1, 1, 64), Ok(16));
        assert_eq!(ps.u64_in("rate", 0, 0, u64::MAX), Ok(2_000_000));
        assert_eq!(ps.bool("on", false), Ok(true));
        assert_eq!(ps.u64_in("absent", 7, 0, 10), Ok(7));
        assert!(ps.finish().is_ok());
        let mut ps = p(&[("n", "abc"), ("typo", "1")]);
        assert!(ps.u64_in("n", 1, 1, 64).unwrap_err().0.contains("'n=abc'"));
        assert_eq!(ps.finish().unwrap_err().0, "x: unknown parameter 'typo'");
        let ps = p(&[("typo", "1")]);
        assert_eq!(ps.finish().unwrap_err().0, "x: unknown parameter 'typo'");
        let mut ps = p(&[("n", "100")]);
        assert!(ps.u64_in("n", 1, 1, 64).unwrap_err().0.contains("out of range"));
        assert_eq!(parse_u64("99999999999999999999"), None);
        assert_eq!(parse_u64("20000000000G"), None);
        assert_eq!(parse_u64(""), None);
    }
}

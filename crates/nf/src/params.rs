//! NF parameters from chain specs: `name(key=value, ...)` as given; typed
//! access through the NF's declarations is in [`crate::param_spec`].

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

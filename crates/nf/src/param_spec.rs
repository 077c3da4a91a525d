//! Declared NF parameters. Each NF lists its parameters once, as
//! [`ParamSpec`] constants (name, type and range, default, doc), and reads
//! them with the typed accessors here ([`Params::uint`], [`Params::float`],
//! ...). Parsing, `flowplane nfs` and the docs all come from that one
//! declaration, so a default or a range is never written twice.

use crate::params::{ParamError, Params};

/// One parameter an NF accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamSpec {
    /// Name in chain specs (`window` in `psd(window=0.5)`).
    pub name: &'static str,
    /// Type, range and default.
    pub kind: ParamKind,
    /// One-line description; the type, range and default are shown from `kind`.
    pub doc: &'static str,
    /// Bytes each unit of this integer parameter allocates per NF instance (0: it sizes nothing). Set with
    /// [`ParamSpec::allocates`]; checked against the machine's memory when read, and summed by the engine's
    /// memory budget before any chain is built.
    pub bytes_each: u64,
    /// The NF takes a new value while it runs (`flowplane ctl set`), keeping its state: its
    /// `reconfigure` hook re-reads this parameter. Set with [`ParamSpec::live`].
    pub live: bool,
}

/// The type of a parameter, with its range and default.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamKind {
    /// An unsigned integer in `[min, max]`. Decimal suffixes k, M, G are
    /// accepted, with a fraction before them when the value is whole (`1.5M`).
    UInt {
        /// Value when the parameter is absent.
        default: u64,
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
    },
    /// An unsigned integer in `[min, max]`, absent by default (what it sets is off).
    UIntOrNone {
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
    },
    /// An unsigned integer in `[min, max]` defaulting to the value of another
    /// parameter of the same NF, clamped into `[min, max]` (a bucket depth
    /// defaulting to its rate).
    UIntLike {
        /// The parameter whose value is the default.
        like: &'static ParamSpec,
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
    },
    /// A real number in `[min, max]` (suffixes as for `UInt`): a window of 0.5 seconds.
    Float {
        /// Value when the parameter is absent.
        default: f64,
        /// Smallest value accepted.
        min: f64,
        /// Largest value accepted.
        max: f64,
    },
    /// A boolean: `true/false`, `1/0`, `yes/no`, `on/off`.
    Bool {
        /// Value when the parameter is absent.
        default: bool,
    },
    /// One word of a fixed list.
    Choice {
        /// Value when the parameter is absent (one of `choices`).
        default: &'static str,
        /// The words accepted.
        choices: &'static [&'static str],
    },
    /// Text the NF parses itself (an address, a prefix, a list, a file name).
    Text {
        /// Value when the parameter is absent; empty means none.
        default: &'static str,
        /// The form it takes, for listings (`IPv4`, `PREFIX`, `LO-HI`, ...).
        syntax: &'static str,
    },
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The constructors check the declaration itself; as they run in `const`
// items, a default outside its range is a compile error.
impl ParamSpec {
    /// An unsigned integer in `[min, max]` defaulting to `default`.
    pub const fn uint(name: &'static str, default: u64, min: u64, max: u64, doc: &'static str) -> Self {
        assert!(min <= default && default <= max, "a parameter's default must lie in its range");
        ParamSpec { name, kind: ParamKind::UInt { default, min, max }, doc, bytes_each: 0, live: false }
    }

    /// An unsigned integer in `[min, max]`, absent by default.
    pub const fn uint_or_none(name: &'static str, min: u64, max: u64, doc: &'static str) -> Self {
        assert!(min <= max, "empty range");
        ParamSpec { name, kind: ParamKind::UIntOrNone { min, max }, doc, bytes_each: 0, live: false }
    }

    /// An unsigned integer in `[min, max]` defaulting to parameter `like`'s value (clamped).
    pub const fn uint_like(
        name: &'static str,
        like: &'static ParamSpec,
        min: u64,
        max: u64,
        doc: &'static str,
    ) -> Self {
        assert!(min <= max, "empty range");
        assert!(matches!(like.kind, ParamKind::UInt { .. }), "the default must come from an integer parameter");
        ParamSpec { name, kind: ParamKind::UIntLike { like, min, max }, doc, bytes_each: 0, live: false }
    }

    /// A real number in `[min, max]` defaulting to `default`.
    pub const fn float(name: &'static str, default: f64, min: f64, max: f64, doc: &'static str) -> Self {
        assert!(min <= default && default <= max, "a parameter's default must lie in its range");
        ParamSpec { name, kind: ParamKind::Float { default, min, max }, doc, bytes_each: 0, live: false }
    }

    /// A boolean defaulting to `default`.
    pub const fn bool(name: &'static str, default: bool, doc: &'static str) -> Self {
        ParamSpec { name, kind: ParamKind::Bool { default }, doc, bytes_each: 0, live: false }
    }

    /// One of `choices`, defaulting to `default`.
    pub const fn choice(
        name: &'static str,
        default: &'static str,
        choices: &'static [&'static str],
        doc: &'static str,
    ) -> Self {
        let mut i = 0;
        while i < choices.len() && !str_eq(choices[i], default) {
            i += 1;
        }
        assert!(i < choices.len(), "a parameter's default must be one of its choices");
        ParamSpec { name, kind: ParamKind::Choice { default, choices }, doc, bytes_each: 0, live: false }
    }

    /// Text of form `syntax` that the NF parses, defaulting to `default` (empty: none).
    pub const fn text(name: &'static str, default: &'static str, syntax: &'static str, doc: &'static str) -> Self {
        ParamSpec { name, kind: ParamKind::Text { default, syntax }, doc, bytes_each: 0, live: false }
    }

    /// Declares the parameter changeable while the NF runs (`flowplane ctl set`): the NF's
    /// `reconfigure` hook takes it, keeping every flow's state.
    pub const fn live(mut self) -> Self {
        self.live = true;
        self
    }

    /// Declares that each unit of this integer parameter allocates `bytes_each` bytes per NF instance
    /// (`ues` contexts of 1.5 KiB): a value the machine cannot hold is refused before anything is allocated.
    pub const fn allocates(mut self, bytes_each: u64) -> Self {
        assert!(
            matches!(self.kind, ParamKind::UInt { .. } | ParamKind::UIntOrNone { .. } | ParamKind::UIntLike { .. }),
            "only an integer parameter sizes memory"
        );
        self.bytes_each = bytes_each;
        self
    }

    /// The default of an integer parameter, for configuration structs that
    /// mirror the parameters (`timeout_s: const { TIMEOUT.uint_default() }`).
    /// Evaluated in a `const` block, a parameter of another kind is a compile error.
    pub const fn uint_default(&self) -> u64 {
        match self.kind {
            ParamKind::UInt { default, .. } => default,
            _ => panic!("uint_default of a parameter that is not a plain unsigned integer"),
        }
    }

    /// Short type name for listings: `uint`, `float`, `bool`, `drop|flag`, or the text's syntax.
    pub fn type_name(&self) -> String {
        match self.kind {
            ParamKind::UInt { .. } | ParamKind::UIntOrNone { .. } | ParamKind::UIntLike { .. } => "uint".into(),
            ParamKind::Float { .. } => "float".into(),
            ParamKind::Bool { .. } => "bool".into(),
            ParamKind::Choice { choices, .. } => choices.join("|"),
            ParamKind::Text { syntax, .. } => syntax.into(),
        }
    }

    /// The accepted range of a numeric parameter, as `[min, max]`.
    pub fn range(&self) -> Option<String> {
        match self.kind {
            ParamKind::UInt { min, max, .. }
            | ParamKind::UIntOrNone { min, max }
            | ParamKind::UIntLike { min, max, .. } => {
                let max = if max == u64::MAX { "2^64-1".to_string() } else { max.to_string() };
                Some(format!("[{min}, {max}]"))
            }
            ParamKind::Float { min, max, .. } => Some(format!("[{min}, {max}]")),
            _ => None,
        }
    }

    /// The default for listings: a value, `none`, or `= NAME` for the value of
    /// parameter NAME (clamped into this one's range).
    pub fn default_text(&self) -> String {
        match self.kind {
            ParamKind::UIntOrNone { .. } => "none".into(),
            ParamKind::UIntLike { like, .. } => format!("= {}", like.name),
            _ => self.explicit_default().unwrap_or_else(|| "none".into()),
        }
    }

    /// The value that, written in a chain spec, gives the same result as
    /// leaving the parameter out (`None` when the default is "none" or
    /// another parameter's value).
    pub fn explicit_default(&self) -> Option<String> {
        match self.kind {
            ParamKind::UInt { default, .. } => Some(default.to_string()),
            ParamKind::Float { default, .. } => Some(default.to_string()),
            ParamKind::Bool { default } => Some(default.to_string()),
            ParamKind::Choice { default, .. } => Some(default.into()),
            ParamKind::Text { default, .. } if !default.is_empty() => Some(default.into()),
            _ => None,
        }
    }

    /// The declaration as JSON: name, type, range, default, choices, doc.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let mut o = json!({ "name": self.name, "type": self.type_name() });
        let m = o.as_object_mut().expect("an object");
        if self.bytes_each > 0 {
            // Memory per unit per instance: what the run's memory check counts.
            m.insert("bytes_each".into(), json!(self.bytes_each));
        }
        if self.live {
            // Changeable while the NF runs (`flowplane ctl set`).
            m.insert("live".into(), json!(true));
        }
        match self.kind {
            ParamKind::UInt { default, min, max } => {
                m.insert("default".into(), json!(default));
                m.insert("min".into(), json!(min));
                m.insert("max".into(), json!(max));
            }
            ParamKind::UIntOrNone { min, max } => {
                m.insert("default".into(), serde_json::Value::Null);
                m.insert("min".into(), json!(min));
                m.insert("max".into(), json!(max));
            }
            ParamKind::UIntLike { like, min, max } => {
                m.insert("default_from".into(), json!(like.name));
                m.insert("min".into(), json!(min));
                m.insert("max".into(), json!(max));
            }
            ParamKind::Float { default, min, max } => {
                m.insert("default".into(), json!(default));
                m.insert("min".into(), json!(min));
                m.insert("max".into(), json!(max));
            }
            ParamKind::Bool { default } => {
                m.insert("default".into(), json!(default));
            }
            ParamKind::Choice { default, choices } => {
                m.insert("default".into(), json!(default));
                m.insert("choices".into(), json!(choices));
            }
            ParamKind::Text { default, .. } => {
                let d = if default.is_empty() { serde_json::Value::Null } else { json!(default) };
                m.insert("default".into(), d);
            }
        }
        m.insert("doc".into(), json!(self.doc));
        o
    }
}

/// Splits a decimal k/M/G suffix off a number: (mantissa, multiplier).
fn split_suffix(s: &str) -> (&str, u64) {
    match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1_000),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1_000_000),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    }
}

/// `DIGITS[.DIGITS][k|M|G]`, when the value is a whole number that fits a u64.
pub(crate) fn parse_uint(s: &str) -> Option<u64> {
    let (num, mul) = split_suffix(s);
    let (int, frac) = match num.split_once('.') {
        Some((_, "")) => return None,
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) {
        return None;
    }
    let whole = u128::from(int.parse::<u64>().ok()?) * u128::from(mul);
    // The fraction, times the multiplier, must be whole: `1.5k` is 1500, `1.5` is refused.
    let frac = frac.trim_end_matches('0');
    let part = if frac.is_empty() {
        0
    } else {
        // mul <= 1e9, so more than 9 significant decimals can never be whole.
        if frac.len() > 9 {
            return None;
        }
        let scale = 10u128.pow(frac.len() as u32);
        let scaled = frac.parse::<u128>().ok()? * u128::from(mul);
        if scaled % scale != 0 {
            return None;
        }
        scaled / scale
    };
    u64::try_from(whole + part).ok()
}

/// A finite decimal number with an optional exponent and k/M/G suffix (no `inf`, `nan`).
pub(crate) fn parse_float(s: &str) -> Option<f64> {
    let (num, mul) = split_suffix(s);
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+')) {
        return None;
    }
    let v = num.parse::<f64>().ok()? * mul as f64;
    v.is_finite().then_some(v)
}

/// Typed access to declared parameters: the default and range come from the
/// [`ParamSpec`]; errors are one line naming the NF and the parameter.
impl Params {
    /// An integer parameter ([`ParamKind::UInt`] or [`ParamKind::UIntLike`]).
    pub fn uint(&mut self, spec: &ParamSpec) -> Result<u64, ParamError> {
        let v = match spec.kind {
            ParamKind::UInt { default, min, max } => self.uint_in(spec.name, min, max)?.unwrap_or(default),
            ParamKind::UIntLike { like, min, max } => match self.uint_in(spec.name, min, max)? {
                Some(v) => v,
                None => self.uint(like)?.clamp(min, max),
            },
            _ => return Err(self.misread(spec, "uint")),
        };
        self.check_memory(spec, v)?;
        Ok(v)
    }

    /// Refuses a value of a memory-sizing parameter that one instance alone could not allocate.
    fn check_memory(&self, spec: &ParamSpec, v: u64) -> Result<(), ParamError> {
        let need = u128::from(v) * u128::from(spec.bytes_each);
        match crate::params::mem_available() {
            Some(avail) if need > u128::from(avail) => Err(ParamError(format!(
                "{}: parameter '{}={v}' needs {} per instance, {} of memory available",
                self.nf(),
                spec.name,
                crate::params::human_bytes(need),
                crate::params::human_bytes(u128::from(avail))
            ))),
            _ => Ok(()),
        }
    }

    /// An integer parameter that is absent by default ([`ParamKind::UIntOrNone`]).
    pub fn uint_or_none(&mut self, spec: &ParamSpec) -> Result<Option<u64>, ParamError> {
        match spec.kind {
            ParamKind::UIntOrNone { min, max } => {
                let v = self.uint_in(spec.name, min, max)?;
                self.check_memory(spec, v.unwrap_or(0))?;
                Ok(v)
            }
            _ => Err(self.misread(spec, "uint_or_none")),
        }
    }

    /// A real-number parameter ([`ParamKind::Float`]).
    pub fn float(&mut self, spec: &ParamSpec) -> Result<f64, ParamError> {
        let ParamKind::Float { default, min, max } = spec.kind else { return Err(self.misread(spec, "float")) };
        let Some(v) = self.take(spec.name) else { return Ok(default) };
        let x = parse_float(&v).ok_or_else(|| self.bad(spec, &v, "is not a number"))?;
        if !(min..=max).contains(&x) {
            return Err(self.bad(spec, &v, &format!("out of range [{min}, {max}]")));
        }
        Ok(x)
    }

    /// A boolean parameter ([`ParamKind::Bool`]).
    pub fn flag(&mut self, spec: &ParamSpec) -> Result<bool, ParamError> {
        let ParamKind::Bool { default } = spec.kind else { return Err(self.misread(spec, "flag")) };
        let Some(v) = self.take(spec.name) else { return Ok(default) };
        match v.as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(self.bad(spec, &v, "is not a boolean")),
        }
    }

    /// A [`ParamKind::Choice`] parameter, as `values[i]` for the i-th declared
    /// choice: `p.choice(&ACTION, [PsdAction::Drop, PsdAction::Flag])`.
    pub fn choice<T: Copy, const N: usize>(&mut self, spec: &ParamSpec, values: [T; N]) -> Result<T, ParamError> {
        let ParamKind::Choice { default, choices } = spec.kind else { return Err(self.misread(spec, "choice")) };
        if choices.len() != N {
            return Err(self.misread(spec, &format!("a choice of {N}")));
        }
        let v = self.take(spec.name);
        let word = v.as_deref().unwrap_or(default);
        match choices.iter().position(|c| *c == word) {
            Some(i) => Ok(values[i]),
            None => {
                let quoted: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
                let must = match quoted.as_slice() {
                    [a, b] => format!("must be {a} or {b}"),
                    _ => format!("must be one of {}", quoted.join(", ")),
                };
                Err(self.bad(spec, word, &must))
            }
        }
    }

    /// A text parameter ([`ParamKind::Text`]) for the NF to parse; empty when absent with no default.
    pub fn text(&mut self, spec: &ParamSpec) -> Result<String, ParamError> {
        let ParamKind::Text { default, .. } = spec.kind else { return Err(self.misread(spec, "text")) };
        Ok(self.take(spec.name).unwrap_or_else(|| default.to_string()))
    }

    fn uint_in(&mut self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ParamError> {
        let Some(v) = self.take(key) else { return Ok(None) };
        let nf = self.nf();
        let x = parse_uint(&v)
            .ok_or_else(|| ParamError(format!("{nf}: parameter '{key}={v}' is not an unsigned integer")))?;
        if !(min..=max).contains(&x) {
            return Err(ParamError(format!("{nf}: parameter '{key}={v}' out of range [{min}, {max}]")));
        }
        Ok(Some(x))
    }

    fn bad(&self, spec: &ParamSpec, value: &str, what: &str) -> ParamError {
        ParamError(format!("{}: parameter '{}={value}' {what}", self.nf(), spec.name))
    }

    /// The NF reads a parameter with an accessor of another type than declared (a bug in the NF).
    fn misread(&self, spec: &ParamSpec, accessor: &str) -> ParamError {
        ParamError(format!(
            "{}: parameter '{}' is declared as {} but read as {accessor}",
            self.nf(),
            spec.name,
            spec.type_name()
        ))
    }
}

/// Bytes the memory-sizing parameters ([`ParamSpec::allocates`]) of NF `nf`
/// given `pairs` allocate per instance, read without building the NF (an
/// unknown NF or a malformed value counts 0: building reports those).
pub fn private_bytes(nf: &str, pairs: &[(String, String)]) -> u128 {
    let Some(desc) = crate::registry::find(nf) else { return 0 };
    let mut p = Params::new(nf, pairs.to_vec());
    let mut value = |spec: &ParamSpec| -> u64 {
        let given = |p: &mut Params, min, max| p.uint_in(spec.name, min, max).ok().flatten();
        match spec.kind {
            ParamKind::UInt { default, min, max } => given(&mut p, min, max).unwrap_or(default),
            ParamKind::UIntOrNone { min, max } => given(&mut p, min, max).unwrap_or(0),
            ParamKind::UIntLike { like, min, max } => given(&mut p, min, max).unwrap_or_else(|| match like.kind {
                ParamKind::UInt { default, min: lmin, max: lmax } => {
                    p.uint_in(like.name, lmin, lmax).ok().flatten().unwrap_or(default).clamp(min, max)
                }
                _ => min,
            }),
            _ => 0,
        }
    };
    desc.params.iter().filter(|s| s.bytes_each > 0).map(|s| u128::from(value(s)) * u128::from(s.bytes_each)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::new("x", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    const N: ParamSpec = ParamSpec::uint("n", 16, 1, 64, "a count");
    const RATE: ParamSpec = ParamSpec::uint("rate", 1000, 1, 1_000_000_000, "per second");
    const BURST: ParamSpec = ParamSpec::uint_like("burst", &RATE, 1, 5000, "depth");
    const T: ParamSpec = ParamSpec::uint_or_none("t", 1, u64::MAX, "threshold");
    const W: ParamSpec = ParamSpec::float("window", 1.0, 0.001, 86_400.0, "seconds");
    const ON: ParamSpec = ParamSpec::bool("on", false, "switch");
    const ACT: ParamSpec = ParamSpec::choice("action", "drop", &["drop", "flag"], "what to do");
    const MODE: ParamSpec = ParamSpec::choice("mode", "a", &["a", "b", "c"], "mode");
    const ADDR: ParamSpec = ParamSpec::text("addr", "10.0.0.1", "IPv4", "an address");

    #[test]
    fn declared_defaults_and_ranges() {
        let mut ps = p(&[]);
        assert_eq!(ps.uint(&N), Ok(16));
        assert_eq!(ps.uint(&BURST), Ok(1000), "follows rate's default");
        assert_eq!(ps.uint_or_none(&T), Ok(None));
        assert_eq!(ps.float(&W), Ok(1.0));
        assert_eq!(ps.flag(&ON), Ok(false));
        assert_eq!(ps.choice(&ACT, [1, 2]), Ok(1));
        assert_eq!(ps.text(&ADDR).unwrap(), "10.0.0.1");
        let mut ps = p(&[("rate", "2.5k"), ("window", "0.5"), ("on", "yes"), ("action", "flag"), ("t", "3")]);
        assert_eq!(ps.uint(&RATE), Ok(2500));
        assert_eq!(ps.uint(&BURST), Ok(2500), "follows rate's value");
        assert_eq!(ps.float(&W), Ok(0.5));
        assert_eq!(ps.flag(&ON), Ok(true));
        assert_eq!(ps.choice(&ACT, [1, 2]), Ok(2));
        assert_eq!(ps.uint_or_none(&T), Ok(Some(3)));
        assert!(ps.finish().is_ok());
        // A followed value beyond the follower's range is clamped.
        assert_eq!(p(&[("rate", "1M")]).uint(&BURST), Ok(5000));
    }

    #[test]
    fn errors_are_one_line_naming_nf_and_parameter() {
        let e = |r: Result<u64, ParamError>| r.unwrap_err().0;
        assert_eq!(e(p(&[("n", "abc")]).uint(&N)), "x: parameter 'n=abc' is not an unsigned integer");
        assert_eq!(e(p(&[("n", "100")]).uint(&N)), "x: parameter 'n=100' out of range [1, 64]");
        assert_eq!(e(p(&[("n", "1.5")]).uint(&N)), "x: parameter 'n=1.5' is not an unsigned integer");
        assert_eq!(e(p(&[("burst", "9k")]).uint(&BURST)), "x: parameter 'burst=9k' out of range [1, 5000]");
        assert_eq!(
            p(&[("t", "0")]).uint_or_none(&T).unwrap_err().0,
            "x: parameter 't=0' out of range [1, 18446744073709551615]"
        );
        let f = |v: &str| p(&[("window", v)]).float(&W).unwrap_err().0;
        assert_eq!(f("0"), "x: parameter 'window=0' out of range [0.001, 86400]");
        assert_eq!(f("-1"), "x: parameter 'window=-1' out of range [0.001, 86400]");
        assert_eq!(f("inf"), "x: parameter 'window=inf' is not a number");
        assert_eq!(f("NaN"), "x: parameter 'window=NaN' is not a number");
        assert_eq!(f("1e999"), "x: parameter 'window=1e999' is not a number");
        assert_eq!(f(""), "x: parameter 'window=' is not a number");
        assert_eq!(p(&[("on", "maybe")]).flag(&ON).unwrap_err().0, "x: parameter 'on=maybe' is not a boolean");
        assert_eq!(
            p(&[("action", "shout")]).choice(&ACT, [0, 1]).unwrap_err().0,
            "x: parameter 'action=shout' must be 'drop' or 'flag'"
        );
        assert_eq!(
            p(&[("mode", "d")]).choice(&MODE, [0, 1, 2]).unwrap_err().0,
            "x: parameter 'mode=d' must be one of 'a', 'b', 'c'"
        );
        // Reading with the wrong accessor is a bug in the NF: still one line, no panic.
        assert_eq!(p(&[]).float(&N).unwrap_err().0, "x: parameter 'n' is declared as uint but read as float");
        assert!(p(&[]).choice(&ACT, [0, 1, 2]).is_err());
        assert!(p(&[]).uint(&T).is_err());
    }

    #[test]
    fn listings() {
        assert_eq!((N.type_name(), N.range(), N.default_text()), ("uint".into(), Some("[1, 64]".into()), "16".into()));
        assert_eq!(W.range().unwrap(), "[0.001, 86400]");
        assert_eq!(W.explicit_default().unwrap(), "1");
        assert_eq!(ACT.type_name(), "drop|flag");
        assert_eq!(T.default_text(), "none");
        assert_eq!(BURST.default_text(), "= rate");
        assert_eq!(T.range().unwrap(), "[1, 2^64-1]");
        assert_eq!(ADDR.type_name(), "IPv4");
        assert_eq!(ParamSpec::text("f", "", "FILE", "").default_text(), "none");
        assert_eq!(N.to_json()["max"], 64);
        assert_eq!(ACT.to_json()["choices"][1], "flag");
        assert_eq!(N.uint_default(), 16);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_uint("16"), Some(16));
        assert_eq!(parse_uint("2M"), Some(2_000_000));
        assert_eq!(parse_uint("1.5k"), Some(1500));
        assert_eq!(parse_uint("0.001G"), Some(1_000_000));
        assert_eq!(parse_uint("1.50k"), Some(1500));
        assert_eq!(parse_uint("1.0"), Some(1));
        for bad in ["", "k", ".5k", "1.", "1.5", "1.0001k", "-1", "+1", "1e3", "99999999999999999999", "20000000000G"] {
            assert_eq!(parse_uint(bad), None, "{bad}");
        }
        assert_eq!(parse_uint("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_float("0.5"), Some(0.5));
        assert_eq!(parse_float("1.5M"), Some(1_500_000.0));
        assert_eq!(parse_float("1e-3"), Some(0.001));
        for bad in ["", "inf", "nan", "infinity", "1e999", "1.2.3", "0x10", "k"] {
            assert_eq!(parse_float(bad), None, "{bad}");
        }
    }

    proptest! {
        /// Whole numbers round-trip through every suffix form, and nothing panics.
        #[test]
        fn uint_forms(v in 0u64..=u64::MAX / 1_000_000_000, s in "\\PC{0,24}") {
            prop_assert_eq!(parse_uint(&v.to_string()), Some(v));
            prop_assert_eq!(parse_uint(&format!("{v}G")), Some(v * 1_000_000_000));
            prop_assert_eq!(parse_uint(&format!("{}.{:03}k", v / 1000, v % 1000)), Some(v));
            let _ = parse_uint(&s);
            let _ = parse_float(&s);
        }
    }
}

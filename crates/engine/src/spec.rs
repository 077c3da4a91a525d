//! Chain specs: `"lb(backends=16) -> fsc -> ratelimit(pps=1000)"`.
//!
//! Grammar: `chain := nf ('->' nf)*`, `nf := NAME ('(' [param (',' param)*] ')')?`,
//! `param := KEY '=' VALUE`. Names and keys are `[A-Za-z_][A-Za-z0-9_]*`;
//! values are any run of characters other than `,()=` and whitespace
//! (e.g. `10.0.0.0/8`, `2M`, `1.5`). Errors name the offending token and its column.

use std::fmt;

use crate::error::EngineError;

/// One NF in a chain spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NfSpec {
    /// NF name.
    pub name: String,
    /// `key=value` parameters in order.
    pub params: Vec<(String, String)>,
}

/// A parsed chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSpec {
    /// NFs in order.
    pub nfs: Vec<NfSpec>,
}

/// A syntax error: message naming the token, 1-based column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// What is wrong.
    pub message: String,
    /// 1-based character column.
    pub column: usize,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chain spec, column {}: {}", self.column, self.message)
    }
}

impl std::error::Error for SpecError {}

struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn skip_ws(&mut self) {
        while let Some(c) = self.s[self.pos..].chars().next() {
            if !c.is_whitespace() {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.s[self.pos..].chars().next()
    }

    fn col(&self) -> usize {
        self.s[..self.pos].chars().count() + 1
    }

    fn err<T>(&self, message: String) -> Result<T, SpecError> {
        Err(SpecError { message, column: self.col() })
    }

    /// The next token's text, for error messages.
    fn describe_next(&mut self) -> String {
        match self.peek() {
            None => "end of spec".to_string(),
            Some(_) => {
                let rest = &self.s[self.pos..];
                let end = rest
                    .char_indices()
                    .find(|&(i, c)| i > 0 && (c.is_whitespace() || "(),=".contains(c) || rest[i..].starts_with("->")))
                    .map_or(rest.len(), |(i, _)| i);
                format!("'{}'", &rest[..end])
            }
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.skip_ws();
        if self.s[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self, what: &str) -> Result<String, SpecError> {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        let mut end = 0;
        for (i, c) in rest.char_indices() {
            let ok = if i == 0 { c.is_ascii_alphabetic() || c == '_' } else { c.is_ascii_alphanumeric() || c == '_' };
            if !ok {
                break;
            }
            end = i + c.len_utf8();
        }
        if end == 0 {
            let found = self.describe_next();
            return self.err(format!("expected {what}, found {found}"));
        }
        self.pos += end;
        Ok(rest[..end].to_string())
    }

    fn value(&mut self, key: &str) -> Result<String, SpecError> {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        let end =
            rest.char_indices().find(|&(_, c)| c.is_whitespace() || "(),=".contains(c)).map_or(rest.len(), |(i, _)| i);
        if end == 0 {
            let found = self.describe_next();
            return self.err(format!("expected a value for '{key}', found {found}"));
        }
        self.pos += end;
        Ok(rest[..end].to_string())
    }
}

/// Parses a chain spec.
pub fn parse(spec: &str) -> Result<ChainSpec, SpecError> {
    let mut lx = Lexer { s: spec, pos: 0 };
    if lx.peek().is_none() {
        return lx.err("empty chain".to_string());
    }
    let mut nfs = Vec::new();
    loop {
        let name = lx.ident("an NF name")?;
        let mut params = Vec::new();
        if lx.eat("(") && !lx.eat(")") {
            {
                loop {
                    let key = lx.ident("a parameter name")?;
                    if !lx.eat("=") {
                        let found = lx.describe_next();
                        return lx.err(format!("expected '=' after '{key}', found {found}"));
                    }
                    let val = lx.value(&key)?;
                    if params.iter().any(|(k, _): &(String, String)| *k == key) {
                        return lx.err(format!("parameter '{key}' given twice to '{name}'"));
                    }
                    params.push((key, val));
                    if lx.eat(")") {
                        break;
                    }
                    if !lx.eat(",") {
                        let found = lx.describe_next();
                        return lx.err(format!("expected ',' or ')' in '{name}(...)', found {found}"));
                    }
                }
            }
        }
        nfs.push(NfSpec { name, params });
        if lx.peek().is_none() {
            break;
        }
        if !lx.eat("->") {
            let found = lx.describe_next();
            return lx.err(format!("expected '->' between NFs, found {found}"));
        }
    }
    Ok(ChainSpec { nfs })
}

/// Parses a chain from TOML: either `chain = "lb -> fsc"`, or a list of
/// `[[nf]]` tables with a `name` and the NF's parameters as keys:
///
/// ```toml
/// [[nf]]
/// name = "lb"
/// backends = 16
///
/// [[nf]]
/// name = "ratelimit"
/// pps = 1000
/// ```
pub fn parse_toml(text: &str) -> Result<ChainSpec, EngineError> {
    let bad = |m: String| EngineError::ChainFile(m);
    let v: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let msg = e.message().to_string();
        match e.span() {
            Some(sp) => bad(format!("byte {}: {msg}", sp.start)),
            None => bad(msg),
        }
    })?;
    for k in v.keys() {
        if k != "chain" && k != "nf" {
            return Err(bad(format!("unknown key '{k}' (expected 'chain' or [[nf]] tables)")));
        }
    }
    match (v.get("chain"), v.get("nf")) {
        (Some(_), Some(_)) => Err(bad("give either 'chain' or [[nf]] tables, not both".to_string())),
        (Some(toml::Value::String(c)), None) => Ok(parse(c)?),
        (Some(_), None) => Err(bad("'chain' must be a string".to_string())),
        (None, Some(toml::Value::Array(items))) => {
            let mut nfs = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let t = item.as_table().ok_or_else(|| bad(format!("nf #{} is not a table", i + 1)))?;
                let name = match t.get("name") {
                    Some(toml::Value::String(n)) => n.clone(),
                    _ => return Err(bad(format!("nf #{} has no string 'name'", i + 1))),
                };
                let mut params = Vec::new();
                for (k, val) in t {
                    if k == "name" {
                        continue;
                    }
                    let sv = match val {
                        toml::Value::String(x) => x.clone(),
                        toml::Value::Integer(x) => x.to_string(),
                        toml::Value::Float(x) => x.to_string(),
                        toml::Value::Boolean(x) => x.to_string(),
                        _ => return Err(bad(format!("{name}: parameter '{k}' must be a string, number or boolean"))),
                    };
                    params.push((k.clone(), sv));
                }
                nfs.push(NfSpec { name, params });
            }
            if nfs.is_empty() {
                return Err(bad("empty chain".to_string()));
            }
            Ok(ChainSpec { nfs })
        }
        (None, Some(_)) => Err(bad("'nf' must be an array of tables ([[nf]])".to_string())),
        (None, None) => Err(bad("empty chain (no 'chain' and no [[nf]])".to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_chains() {
        let a = parse_toml("[[nf]]\nname = \"lb\"\nbackends = 16\n[[nf]]\nname = \"fsc\"\n").unwrap();
        assert_eq!(a, parse("lb(backends=16) -> fsc").unwrap());
        let b = parse_toml("chain = \"lb -> fsc\"").unwrap();
        assert_eq!(b.nfs.len(), 2);
        assert!(parse_toml("chain = 3").unwrap_err().to_string().contains("must be a string"));
        assert!(parse_toml("[[nf]]\nbackends = 1").unwrap_err().to_string().contains("no string 'name'"));
        assert!(parse_toml("x = 1").unwrap_err().to_string().contains("unknown key 'x'"));
        assert!(parse_toml("[[nf]\n").unwrap_err().to_string().starts_with("chain file"));
        assert!(parse_toml("").unwrap_err().to_string().contains("empty chain"));
        assert!(parse_toml("[[nf]]\nname = \"lb\"\nb = [1]").unwrap_err().to_string().contains("'b'"));
    }

    #[test]
    fn parses_the_brief_example() {
        let c = parse("lb(backends=16) -> fsc -> ratelimit(pps=1000)").unwrap();
        assert_eq!(c.nfs.len(), 3);
        assert_eq!(c.nfs[0].name, "lb");
        assert_eq!(c.nfs[0].params, vec![("backends".to_string(), "16".to_string())]);
        assert_eq!(c.nfs[1].params, vec![]);
        assert_eq!(c.nfs[2].params[0].1, "1000");
        let c = parse("acl(rule=10.0.0.0/8, default=drop)->forward()").unwrap();
        assert_eq!(c.nfs[0].params[0].1, "10.0.0.0/8");
        assert_eq!(c.nfs[1].name, "forward");
    }

    #[test]
    fn errors_name_the_token() {
        let e = parse("lb(backends=16) fsc").unwrap_err();
        assert_eq!(e.to_string(), "chain spec, column 17: expected '->' between NFs, found 'fsc'");
        let e = parse("lb(backends 16)").unwrap_err();
        assert!(e.message.contains("expected '=' after 'backends', found '16'"), "{e}");
        let e = parse("lb(backends=)").unwrap_err();
        assert!(e.message.contains("expected a value for 'backends', found ')'"), "{e}");
        let e = parse("lb -> ").unwrap_err();
        assert!(e.message.contains("found end of spec"), "{e}");
        assert!(parse("").is_err());
        assert!(parse("   ").is_err());
        let e = parse("9lb").unwrap_err();
        assert!(e.message.contains("'9lb'"), "{e}");
        let e = parse("lb(a=1,a=2)").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        assert!(parse("lb(a=1").is_err());
        assert!(parse("é -> lb").is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_string_parses_or_errors(s in "\\PC*") {
            let _ = parse(&s);
        }

        #[test]
        fn arbitrary_ascii_never_panics(s in "[a-z0-9 ()=,>\\-_/.]{0,40}") {
            if let Err(e) = parse(&s) {
                proptest::prop_assert!(e.column >= 1 && e.column <= s.chars().count() + 1);
            }
        }
    }
}

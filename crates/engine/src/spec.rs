//! Chain specs: `"lb(backends=16) -> fsc -> ratelimit(pps=1000)"`, and chain
//! graphs: `"acl(rules=r.txt) -> { allow: lb -> fsc ; deny: count -> port(mirror) }"`.
//!
//! Grammar: `chain := segment`, `segment := item ('->' item)* ['->' branches]`,
//! `item := nf | 'port' '(' PORT ')'` (a `port(...)` ends its segment),
//! `branches := '{' branch (';' branch)* [';'] '}'`, `branch := LABEL ':' segment`,
//! `nf := NAME ('(' [param (',' param)*] ')')?`, `param := KEY '=' VALUE`.
//! Names, keys and port names are `[A-Za-z_][A-Za-z0-9_]*`; values are any
//! run of characters other than `,()=` and whitespace (e.g. `10.0.0.0/8`,
//! `2M`, `1.5`, an ACL's `drop:udp;drop:tcp`: a value is always inside
//! parentheses, so `;` and braces in it never end a branch). Errors name the
//! offending token and its column.
//!
//! A branch point follows the NF that ends a segment and splits the
//! segment's packets by their verdict there. `LABEL` is `allow` (any
//! verdict but drop), `deny` (dropped in the segment), an output port number
//! or an output port's name (`--port NAME=SPEC`): packets the segment sent to
//! that port (NFs with port verdicts: `forward(port=N)`, `route`). A port
//! label wins over `allow`. A packet whose verdict has no branch keeps it (a
//! pass goes to its port, a drop is dropped). A `deny` branch takes the
//! dropped packets back into the graph (verdict 0 before its NFs). `port(P)`
//! at the end of a segment sends the packets that segment passed to output
//! port `P` (a number, or a name bound with [`ChainSpec::bind_ports`]).
//!
//! [`ChainSpec::nfs`] lists every NF of the graph, flat: the root segment's,
//! then each branch's in the order written (depth first), so code that
//! walks "the chain's NFs" (placement, budgets, reports, `flowplane ctl`)
//! sees all of them; [`ChainSpec::segments`] says which NFs form which
//! segment. A chain without branches and ports has no segments: exactly
//! the linear chain of before.

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

/// A parsed chain (or chain graph).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainSpec {
    /// Every NF, flat: the root segment's in order, then each branch's
    /// (depth first, in the order written).
    pub nfs: Vec<NfSpec>,
    /// The graph's segments (root first, each before its branches); empty
    /// for a linear chain without `port(...)`.
    pub segments: Vec<Segment>,
}

/// One linear segment of a chain graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The segment whose branch point leads here (None: the root).
    pub parent: Option<usize>,
    /// The parent's verdict this branch takes (the root's is `Allow`, unused).
    pub on: Label,
    /// Its NFs: `nfs[range]` of the spec.
    pub nfs: std::ops::Range<usize>,
    /// `port(P)` at its end.
    pub port: Option<PortRef>,
}

/// A branch's label: which verdicts of the branching segment it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    /// Every verdict but drop (without a more specific port label).
    Allow,
    /// Dropped packets.
    Deny,
    /// Packets sent to this output port.
    Port(u16),
    /// Packets sent to the output port of this name (until [`ChainSpec::bind_ports`]).
    Named(String),
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Allow => f.write_str("allow"),
            Label::Deny => f.write_str("deny"),
            Label::Port(p) => write!(f, "{p}"),
            Label::Named(n) => f.write_str(n),
        }
    }
}

/// The output port of a `port(...)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortRef {
    /// By number (0 is `--output`).
    Num(u16),
    /// By name (until [`ChainSpec::bind_ports`]).
    Name(String),
}

impl fmt::Display for PortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortRef::Num(p) => write!(f, "{p}"),
            PortRef::Name(n) => f.write_str(n),
        }
    }
}

/// Deepest nesting of branch points.
const MAX_DEPTH: usize = 32;
/// Largest port number (below the drop verdict).
const MAX_PORT: u64 = u16::MAX as u64 - 1;

impl ChainSpec {
    /// A linear chain of these NFs.
    pub fn linear(nfs: Vec<NfSpec>) -> ChainSpec {
        ChainSpec { nfs, segments: Vec::new() }
    }

    /// True for a graph (branch points or `port(...)`).
    pub fn is_graph(&self) -> bool {
        !self.segments.is_empty()
    }

    /// The branches of segment `seg`, in the order written.
    pub fn children(&self, seg: usize) -> impl Iterator<Item = usize> + '_ {
        self.segments.iter().enumerate().filter(move |(_, s)| s.parent == Some(seg)).map(|(i, _)| i)
    }

    /// Segment `seg` alone as a linear chain.
    pub fn segment_spec(&self, seg: usize) -> ChainSpec {
        ChainSpec::linear(self.nfs[self.segments[seg].nfs.clone()].to_vec())
    }

    /// The labels from the root to segment `seg`, joined by `/` (empty for the root).
    pub fn segment_path(&self, seg: usize) -> String {
        let mut labels = Vec::new();
        let mut at = seg;
        while let Some(p) = self.segments[at].parent {
            labels.push(self.segments[at].on.to_string());
            at = p;
        }
        labels.reverse();
        labels.join("/")
    }

    /// Each NF's name with its segment's path (`deny/count`; the root's NFs by name alone), in `nfs` order.
    pub fn nf_paths(&self) -> Vec<String> {
        let mut out: Vec<String> = self.nfs.iter().map(|n| n.name.clone()).collect();
        for (k, seg) in self.segments.iter().enumerate() {
            let path = self.segment_path(k);
            if path.is_empty() {
                continue;
            }
            for i in seg.nfs.clone() {
                out[i] = format!("{path}/{}", self.nfs[i].name);
            }
        }
        out
    }

    /// The NF `name` stands for: its path (`deny/count`), or a name only one
    /// NF of the graph has. `Ok(None)`: no such NF; `Err`: the name is
    /// ambiguous (the message lists the paths to use).
    pub fn find_nf(&self, name: &str) -> Result<Option<usize>, String> {
        let paths = self.nf_paths();
        if let Some(i) = paths.iter().position(|p| p == name) {
            return Ok(Some(i));
        }
        let by_name: Vec<usize> = (0..self.nfs.len()).filter(|&i| self.nfs[i].name == name).collect();
        match by_name.len() {
            0 => Ok(None),
            1 => Ok(Some(by_name[0])),
            _ => {
                let ps: Vec<&str> = by_name.iter().map(|&i| paths[i].as_str()).collect();
                Err(format!(
                    "'{name}' names {} NFs of the chain graph; name one by its path: {}",
                    ps.len(),
                    ps.join(", ")
                ))
            }
        }
    }

    /// Replaces port names (`port(NAME)`, `NAME:` labels) by the numbers of
    /// the output ports `names` gives (`(name, number)`); an unknown name is
    /// an error naming the known ones.
    pub fn bind_ports(&mut self, names: &[(String, u16)]) -> Result<(), String> {
        let find = |n: &str| {
            names.iter().find(|(k, _)| k == n).map(|&(_, v)| v).ok_or_else(|| {
                let known: Vec<&str> = names.iter().map(|(k, _)| k.as_str()).collect();
                if known.is_empty() {
                    format!("no output port is named '{n}' (name one with --port {n}=SPEC)")
                } else {
                    format!("no output port is named '{n}' (named: {})", known.join(", "))
                }
            })
        };
        for s in &mut self.segments {
            if let Label::Named(n) = &s.on {
                s.on = Label::Port(find(n)?);
            }
            if let Some(PortRef::Name(n)) = &s.port {
                s.port = Some(PortRef::Num(find(n)?));
            }
        }
        Ok(())
    }

    /// The first port name not bound yet, if any.
    pub fn unbound_port(&self) -> Option<&str> {
        self.segments.iter().find_map(|s| match (&s.on, &s.port) {
            (Label::Named(n), _) | (_, Some(PortRef::Name(n))) => Some(n.as_str()),
            _ => None,
        })
    }

    fn write_segment(&self, f: &mut fmt::Formatter<'_>, seg: usize) -> fmt::Result {
        let s = &self.segments[seg];
        let mut first = true;
        let mut arrow = |f: &mut fmt::Formatter<'_>| {
            let r = if first { Ok(()) } else { f.write_str(" -> ") };
            first = false;
            r
        };
        for n in &self.nfs[s.nfs.clone()] {
            arrow(f)?;
            write!(f, "{n}")?;
        }
        if let Some(p) = &s.port {
            arrow(f)?;
            write!(f, "port({p})")?;
        }
        let kids: Vec<usize> = self.children(seg).collect();
        if !kids.is_empty() {
            arrow(f)?;
            f.write_str("{ ")?;
            for (j, &k) in kids.iter().enumerate() {
                if j > 0 {
                    f.write_str(" ; ")?;
                }
                write!(f, "{}: ", self.segments[k].on)?;
                self.write_segment(f, k)?;
            }
            f.write_str(" }")?;
        }
        Ok(())
    }
}

impl fmt::Display for NfSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.params.is_empty() {
            let ps: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            write!(f, "({})", ps.join(", "))?;
        }
        Ok(())
    }
}

/// The spec as written (parses back to itself).
impl fmt::Display for ChainSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            let parts: Vec<String> = self.nfs.iter().map(|n| n.to_string()).collect();
            return f.write_str(&parts.join(" -> "));
        }
        self.write_segment(f, 0)
    }
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
                    .find(|&(i, c)| {
                        i > 0 && (c.is_whitespace() || "(),=;:{}".contains(c) || rest[i..].starts_with("->"))
                    })
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

/// Parses a chain spec (or chain graph).
pub fn parse(spec: &str) -> Result<ChainSpec, SpecError> {
    let mut lx = Lexer { s: spec, pos: 0 };
    if lx.peek().is_none() {
        return lx.err("empty chain".to_string());
    }
    let mut out = ChainSpec::default();
    parse_segment(&mut lx, &mut out, None, Label::Allow, 0)?;
    if let Some(c @ (';' | '}')) = lx.peek() {
        return lx.err(format!("'{c}' outside a branch point"));
    }
    if lx.peek().is_some() {
        let found = lx.describe_next();
        return lx.err(format!("expected '->' between NFs, found {found}"));
    }
    if out.segments.len() == 1 && out.segments[0].port.is_none() {
        out.segments.clear();
    }
    Ok(out)
}

fn parse_nf(lx: &mut Lexer<'_>, name: String) -> Result<NfSpec, SpecError> {
    let mut params = Vec::new();
    if lx.eat("(") && !lx.eat(")") {
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
    Ok(NfSpec { name, params })
}

/// A port number or name (`port(...)`'s argument, a branch label).
fn port_ref(lx: &mut Lexer<'_>, what: &str) -> Result<PortRef, SpecError> {
    if lx.peek().is_some_and(|c| c.is_ascii_digit()) {
        let rest = &lx.s[lx.pos..];
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        match rest[..end].parse::<u64>() {
            Ok(n) if n <= MAX_PORT => {
                lx.pos += end;
                Ok(PortRef::Num(n as u16))
            }
            _ => lx.err(format!("port number '{}' out of range 0..={MAX_PORT}", &rest[..end])),
        }
    } else {
        Ok(PortRef::Name(lx.ident(what)?))
    }
}

fn parse_segment(
    lx: &mut Lexer<'_>,
    out: &mut ChainSpec,
    parent: Option<usize>,
    on: Label,
    depth: usize,
) -> Result<(), SpecError> {
    let me = out.segments.len();
    let first = out.nfs.len();
    out.segments.push(Segment { parent, on, nfs: first..first, port: None });
    loop {
        if lx.peek() == Some('{') {
            return lx.err("a branch point '{' must follow an NF".to_string());
        }
        let name = lx.ident("an NF name")?;
        if name == "port" && lx.eat("(") {
            let p = port_ref(lx, "a port number or name")?;
            if !lx.eat(")") {
                let found = lx.describe_next();
                return lx.err(format!("expected ')' after 'port({p}', found {found}"));
            }
            out.segments[me].port = Some(p);
            if lx.peek() == Some('-') && lx.s[lx.pos..].starts_with("->") {
                return lx.err("port(...) ends its segment: nothing may follow it".to_string());
            }
            break;
        }
        out.nfs.push(parse_nf(lx, name)?);
        out.segments[me].nfs.end = out.nfs.len();
        match lx.peek() {
            None | Some(';') | Some('}') => break,
            _ => {}
        }
        if !lx.eat("->") {
            let found = lx.describe_next();
            return lx.err(format!("expected '->' between NFs, found {found}"));
        }
        if lx.eat("{") {
            if depth + 1 >= MAX_DEPTH {
                return lx.err(format!("branch points nested deeper than {MAX_DEPTH}"));
            }
            parse_branches(lx, out, me, depth + 1)?;
            break;
        }
    }
    Ok(())
}

/// After a `{`: the branches up to the matching `}`.
fn parse_branches(lx: &mut Lexer<'_>, out: &mut ChainSpec, me: usize, depth: usize) -> Result<(), SpecError> {
    if lx.peek() == Some('}') {
        return lx.err("a branch point needs at least one branch ('LABEL: NF -> ...')".to_string());
    }
    let mut labels: Vec<Label> = Vec::new();
    loop {
        let label = match port_ref(lx, "a branch label (allow, deny, a port number or name)")? {
            PortRef::Num(n) => Label::Port(n),
            PortRef::Name(n) if n == "allow" => Label::Allow,
            PortRef::Name(n) if n == "deny" => Label::Deny,
            PortRef::Name(n) => Label::Named(n),
        };
        if labels.contains(&label) {
            return lx.err(format!("branch '{label}' given twice at one branch point"));
        }
        if !lx.eat(":") {
            let found = lx.describe_next();
            return lx.err(format!("expected ':' after branch label '{label}', found {found}"));
        }
        labels.push(label.clone());
        parse_segment(lx, out, Some(me), label, depth)?;
        let more = lx.eat(";");
        if lx.eat("}") {
            return Ok(());
        }
        if !more {
            let found = lx.describe_next();
            return lx.err(format!("expected ';' or '}}' after a branch, found {found}"));
        }
    }
}

/// Parses a chain from TOML: either `chain = "lb -> fsc"` (any spec,
/// graphs included), or a list of `[[nf]]` tables with a `name` and the
/// NF's parameters as keys:
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
///
/// A graph in tables: the last NF of a segment may carry `branch.LABEL`
/// tables, each a segment with its own `[[...nf]]` list and an optional
/// `port` (a name or number; a top-level `port` ends the root segment):
///
/// ```toml
/// [[nf]]
/// name = "acl"
/// rules = "rules.txt"
/// [nf.branch.allow]
/// port = "a"
/// [[nf.branch.allow.nf]]
/// name = "fsc"
/// [nf.branch.deny]
/// port = "b"
/// [[nf.branch.deny.nf]]
/// name = "count"
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
        if k != "chain" && k != "nf" && k != "port" {
            return Err(bad(format!("unknown key '{k}' (expected 'chain', 'port' or [[nf]] tables)")));
        }
    }
    match (v.get("chain"), v.get("nf")) {
        (Some(_), Some(_)) => Err(bad("give either 'chain' or [[nf]] tables, not both".to_string())),
        (Some(_), None) if v.contains_key("port") => {
            Err(bad("'port' goes with [[nf]] tables; in 'chain' write '-> port(NAME)'".to_string()))
        }
        (Some(toml::Value::String(c)), None) => Ok(parse(c)?),
        (Some(_), None) => Err(bad("'chain' must be a string".to_string())),
        (None, Some(_)) => {
            let mut out = ChainSpec::default();
            toml_segment(&v, "", &mut out, None, Label::Allow, 0).map_err(bad)?;
            if out.nfs.is_empty() {
                return Err(bad("empty chain".to_string()));
            }
            if out.segments.len() == 1 && out.segments[0].port.is_none() {
                out.segments.clear();
            }
            Ok(out)
        }
        (None, None) => Err(bad("empty chain (no 'chain' and no [[nf]])".to_string())),
    }
}

/// One segment of the tables form: `t` holds `nf` (an array of tables) and maybe `port`; `at` names it in errors.
fn toml_segment(
    t: &toml::Table,
    at: &str,
    out: &mut ChainSpec,
    parent: Option<usize>,
    on: Label,
    depth: usize,
) -> Result<(), String> {
    if depth >= MAX_DEPTH {
        return Err(format!("{at}: branch points nested deeper than {MAX_DEPTH}"));
    }
    let me = out.segments.len();
    let first = out.nfs.len();
    let port = match t.get("port") {
        None => None,
        Some(toml::Value::String(n)) => Some(PortRef::Name(n.clone())),
        Some(toml::Value::Integer(n)) if (0..=MAX_PORT as i64).contains(n) => Some(PortRef::Num(*n as u16)),
        Some(_) => return Err(format!("{at}port must be a port name or a number in 0..={MAX_PORT}")),
    };
    out.segments.push(Segment { parent, on, nfs: first..first, port });
    let items = match t.get("nf") {
        Some(toml::Value::Array(items)) => items.as_slice(),
        None if parent.is_some() => &[],
        _ => return Err(format!("'{at}nf' must be an array of tables ([[{at}nf]])")),
    };
    if items.is_empty() && out.segments[me].port.is_none() {
        return Err(format!("{at}: a branch needs NFs ([[{at}nf]]) or a port"));
    }
    let mut branches = None;
    for (i, item) in items.iter().enumerate() {
        let t = item.as_table().ok_or_else(|| format!("{at}nf #{} is not a table", i + 1))?;
        let name = match t.get("name") {
            Some(toml::Value::String(n)) => n.clone(),
            _ => return Err(format!("{at}nf #{} has no string 'name'", i + 1)),
        };
        let mut params = Vec::new();
        for (k, val) in t {
            if k == "name" {
                continue;
            }
            if k == "branch" {
                if i + 1 != items.len() {
                    return Err(format!("{at}{name}: only the last NF of a segment may branch"));
                }
                if out.segments[me].port.is_some() {
                    return Err(format!("{at}{name}: a segment ends in a port or in branches, not both"));
                }
                let b = val.as_table().ok_or_else(|| format!("{at}{name}: 'branch' must be a table of branches"))?;
                branches = Some((name.clone(), b));
                continue;
            }
            let sv = match val {
                toml::Value::String(x) => x.clone(),
                toml::Value::Integer(x) => x.to_string(),
                toml::Value::Float(x) => x.to_string(),
                toml::Value::Boolean(x) => x.to_string(),
                _ => return Err(format!("{name}: parameter '{k}' must be a string, number or boolean")),
            };
            params.push((k.clone(), sv));
        }
        out.nfs.push(NfSpec { name, params });
    }
    out.segments[me].nfs.end = out.nfs.len();
    if let Some((name, b)) = branches {
        if b.is_empty() {
            return Err(format!("{at}{name}: a branch point needs at least one branch"));
        }
        for (label, seg) in b {
            let l = match label.as_str() {
                "allow" => Label::Allow,
                "deny" => Label::Deny,
                n => match n.parse::<u64>() {
                    Ok(p) if p <= MAX_PORT => Label::Port(p as u16),
                    Ok(_) => return Err(format!("{at}{name}: port label '{n}' out of range 0..={MAX_PORT}")),
                    Err(_) if valid_ident(n) => Label::Named(n.to_string()),
                    Err(_) => return Err(format!("{at}{name}: bad branch label '{n}'")),
                },
            };
            let seg =
                seg.as_table().ok_or_else(|| format!("{at}{name}: branch '{label}' must be a table (nf, port)"))?;
            for k in seg.keys() {
                if k != "nf" && k != "port" {
                    return Err(format!("{at}{name}: branch '{label}': unknown key '{k}' (expected nf, port)"));
                }
            }
            toml_segment(seg, &format!("{at}branch.{label}."), out, Some(me), l, depth + 1)?;
        }
    }
    Ok(())
}

fn valid_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
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

    #[test]
    fn parses_graphs() {
        let g = parse("acl(rules=r.txt) -> { allow: lb -> fsc ; deny: count -> port(mirror) }").unwrap();
        assert!(g.is_graph());
        let inline = parse("acl(rule=drop:udp;drop:tcp:{x}) -> { deny: count }").unwrap();
        assert_eq!(inline.nfs[0].params[0].1, "drop:udp;drop:tcp:{x}");
        let names: Vec<&str> = g.nfs.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["acl", "lb", "fsc", "count"]);
        assert_eq!(g.segments.len(), 3);
        assert_eq!(g.segments[1].on, Label::Allow);
        assert_eq!(g.segments[1].nfs, 1..3);
        assert_eq!(g.segments[2].on, Label::Deny);
        assert_eq!(g.segments[2].port, Some(PortRef::Name("mirror".into())));
        assert_eq!(g.nf_paths(), vec!["acl", "allow/lb", "allow/fsc", "deny/count"]);
        assert_eq!(g.to_string(), "acl(rules=r.txt) -> { allow: lb -> fsc ; deny: count -> port(mirror) }");
        assert_eq!(parse(&g.to_string()).unwrap(), g);
        // Nested, numbered, trailing ';', a port-only branch.
        let n = parse("fsc -> route -> { 1: count -> { deny: port(2) ; allow: fsc }; 3: port(x); }").unwrap();
        assert_eq!(n.nf_paths(), vec!["fsc", "route", "1/count", "1/allow/fsc"]);
        assert_eq!(n.segments.iter().filter(|s| s.nfs.is_empty()).count(), 2);
        assert_eq!(parse(&n.to_string()).unwrap(), n);
        // A root NF's path is its name; two branch NFs of one name need their paths.
        assert_eq!(n.find_nf("fsc"), Ok(Some(0)));
        let two = parse("acl -> { allow: count ; deny: count }").unwrap();
        assert!(two.find_nf("count").unwrap_err().contains("allow/count, deny/count"));
        assert_eq!(n.find_nf("1/allow/fsc"), Ok(Some(3)));
        assert_eq!(n.find_nf("count"), Ok(Some(2)));
        assert_eq!(n.find_nf("lb"), Ok(None));
        // A linear chain stays linear; a final port makes a one-segment graph.
        assert!(!parse("lb -> fsc").unwrap().is_graph());
        let p = parse("fsc -> port(out)").unwrap();
        assert_eq!((p.nfs.len(), p.segments.len()), (1, 1));
        let mut b = p.clone();
        assert!(b.bind_ports(&[]).unwrap_err().contains("--port out=SPEC"));
        b.bind_ports(&[("out".into(), 2)]).unwrap();
        assert_eq!(b.segments[0].port, Some(PortRef::Num(2)));
        assert_eq!(b.unbound_port(), None);
        assert_eq!(p.unbound_port(), Some("out"));
    }

    #[test]
    fn graph_errors_are_one_line() {
        for (s, want) in [
            ("acl -> { }", "at least one branch"),
            ("acl -> { allow fsc }", "expected ':' after branch label 'allow'"),
            ("acl -> { allow: fsc ; allow: lb }", "given twice"),
            ("acl -> { allow: fsc", "expected ';' or '}'"),
            ("acl -> { allow: fsc } -> lb", "expected '->' between NFs"),
            ("acl -> port(a) -> fsc", "nothing may follow"),
            ("{ allow: fsc }", "must follow an NF"),
            ("acl -> { 70000: fsc }", "out of range"),
            ("acl -> { allow: }", "expected an NF name, found '}'"),
            ("acl }", "outside a branch point"),
            ("acl -> port(", "expected a port number or name"),
        ] {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let deep = format!("{}fsc{}", "a -> { allow: ".repeat(40), " }".repeat(40));
        assert!(parse(&deep).unwrap_err().to_string().contains("nested deeper"));
    }

    #[test]
    fn toml_graphs() {
        let t = "[[nf]]\nname = \"acl\"\nrules = \"r.txt\"\n[nf.branch.allow]\n[[nf.branch.allow.nf]]\nname = \"lb\"\n\
                 [[nf.branch.allow.nf]]\nname = \"fsc\"\n[nf.branch.deny]\nport = \"mirror\"\n[[nf.branch.deny.nf]]\nname = \"count\"\n";
        let g = parse_toml(t).unwrap();
        assert_eq!(g, parse("acl(rules=r.txt) -> { allow: lb -> fsc ; deny: count -> port(mirror) }").unwrap());
        let c = parse_toml("chain = \"acl -> { deny: port(2) }\"").unwrap();
        assert_eq!(c.segments[1].port, Some(PortRef::Num(2)));
        let r = parse_toml("port = 1\n[[nf]]\nname = \"fsc\"\n").unwrap();
        assert_eq!(r.segments[0].port, Some(PortRef::Num(1)));
        for (t, want) in [
            ("[[nf]]\nname = \"a\"\nbranch = 1\n", "'branch' must be a table"),
            ("[[nf]]\nname = \"a\"\n[nf.branch]\n", "at least one branch"),
            ("[[nf]]\nname = \"a\"\n[nf.branch.deny]\n", "needs NFs"),
            ("[[nf]]\nname = \"a\"\n[nf.branch.deny]\nx = 1\n", "unknown key 'x'"),
            ("[[nf]]\nname = \"a\"\n[nf.branch.allow]\nport = \"p\"\n[[nf]]\nname = \"b\"\n", "only the last NF"),
            ("[[nf]]\nname = \"a\"\n[nf.branch.\"9x\"]\nport = 1\n", "bad branch label"),
            ("chain = \"a\"\nport = 1\n", "'port' goes with [[nf]]"),
        ] {
            let e = parse_toml(t).unwrap_err().to_string();
            assert!(e.contains(want), "{t}: {e}");
        }
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

//! The NF registry: chain-spec names -> constructors, with parameter docs
//! for `flowplane nfs`.

use crate::{count::Count, forward::Forward, Nf, ParamError, Params};

/// One registered NF kind.
pub struct NfKind {
    /// Name in chain specs.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// Parameters: (name, description with default).
    pub params: &'static [(&'static str, &'static str)],
    /// Constructor (one instance per core).
    pub build: fn(&mut Params) -> Result<Box<dyn Nf>, ParamError>,
}

/// Every NF flowplane knows.
pub static NFS: &[NfKind] = &[
    NfKind {
        name: "forward",
        about: "send every packet to an output port (I/O baseline)",
        params: &[("port", "output port (default 0)")],
        build: |p| Ok(Box::new(Forward::from_params(p)?)),
    },
    NfKind {
        name: "count",
        about: "count packets and bytes",
        params: &[],
        build: |p| Ok(Box::new(Count::from_params(p)?)),
    },
];

/// Looks up an NF kind by name.
pub fn find(name: &str) -> Option<&'static NfKind> {
    NFS.iter().find(|k| k.name == name)
}

/// Builds an NF instance, checking that every parameter was used.
pub fn build(name: &str, mut params: Params) -> Result<Box<dyn Nf>, ParamError> {
    let kind = find(name).ok_or_else(|| {
        let known: Vec<&str> = NFS.iter().map(|k| k.name).collect();
        ParamError(format!("unknown NF '{name}' (known: {})", known.join(", ")))
    })?;
    let nf = (kind.build)(&mut params)?;
    params.finish()?;
    Ok(nf)
}

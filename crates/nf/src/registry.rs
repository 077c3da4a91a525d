//! The NF registry: chain-spec names -> constructors, with parameter docs
//! for `flowplane nfs`. Adding an NF = one file + one entry here.

use crate::count::Count;
use crate::forward::Forward;
use crate::fsc::Fsc;
use crate::lb::Lb;
use crate::ratelimit::RateLimit;
use crate::stateful::DynStateful;
use crate::{Nf, ParamError, Params};

/// A built NF: a stateless batch element or a stateful NF the executor drives.
pub enum NfInstance {
    /// Processes whole batches itself (no per-flow state).
    Stateless(Box<dyn Nf>),
    /// Declares state; the executor looks it up and calls its actions.
    Stateful(Box<dyn DynStateful>),
}

impl NfInstance {
    /// The NF's name.
    pub fn name(&self) -> &'static str {
        match self {
            NfInstance::Stateless(n) => n.name(),
            NfInstance::Stateful(n) => n.name(),
        }
    }
}

/// One registered NF kind.
pub struct NfKind {
    /// Name in chain specs.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// Parameters: (name, description with default).
    pub params: &'static [(&'static str, &'static str)],
    /// Constructor (one instance per core).
    pub build: fn(&mut Params) -> Result<NfInstance, ParamError>,
}

fn stateless(n: impl Nf + 'static) -> NfInstance {
    NfInstance::Stateless(Box::new(n))
}

fn stateful(n: impl DynStateful + 'static) -> NfInstance {
    NfInstance::Stateful(Box::new(n))
}

/// Every NF flowplane knows.
pub static NFS: &[NfKind] = &[
    NfKind {
        name: "forward",
        about: "send every packet to an output port (I/O baseline)",
        params: &[("port", "output port (default 0)")],
        build: |p| Ok(stateless(Forward::from_params(p)?)),
    },
    NfKind {
        name: "count",
        about: "count packets and bytes",
        params: &[],
        build: |p| Ok(stateless(Count::from_params(p)?)),
    },
    NfKind {
        name: "lb",
        about: "stateful round-robin load balancer: rewrites the destination, sticky per 5-tuple",
        params: &[("backends", "backend pool size (default 16)"), ("base", "first backend IPv4 (default 10.10.0.1)")],
        build: |p| Ok(stateful(Lb::from_params(p)?)),
    },
    NfKind {
        name: "fsc",
        about: "flow statistics counter: packets, bytes, first/last seen per 5-tuple (exportable)",
        params: &[],
        build: |p| Ok(stateful(Fsc::from_params(p)?)),
    },
    NfKind {
        name: "ratelimit",
        about: "flow rate limiter: token bucket per 5-tuple",
        params: &[("pps", "tokens per second per flow (default 1000)"), ("burst", "bucket depth (default pps)")],
        build: |p| Ok(stateful(RateLimit::from_params(p)?)),
    },
    // @@ add NF entries above this line @@
];

/// Looks up an NF kind by name.
pub fn find(name: &str) -> Option<&'static NfKind> {
    NFS.iter().find(|k| k.name == name)
}

/// Builds an NF instance, checking that every parameter was used.
pub fn build(name: &str, mut params: Params) -> Result<NfInstance, ParamError> {
    let kind = find(name).ok_or_else(|| {
        let known: Vec<&str> = NFS.iter().map(|k| k.name).collect();
        ParamError(format!("unknown NF '{name}' (known: {})", known.join(", ")))
    })?;
    let nf = (kind.build)(&mut params)?;
    params.finish()?;
    Ok(nf)
}

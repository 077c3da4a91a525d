//! Building a chain's NF instances from a spec.

use flowplane_nf::{registry, Nf, Params};

use crate::spec::ChainSpec;

/// One core's NF instances, in chain order.
pub struct Chain {
    /// The NFs.
    pub nfs: Vec<Box<dyn Nf>>,
}

impl Chain {
    /// Instantiates every NF of `spec`; the error names the offending NF or parameter.
    pub fn build(spec: &ChainSpec) -> Result<Chain, String> {
        let mut nfs = Vec::with_capacity(spec.nfs.len());
        for s in &spec.nfs {
            let nf = registry::build(&s.name, Params::new(&s.name, s.params.clone())).map_err(|e| e.to_string())?;
            nfs.push(nf);
        }
        Ok(Chain { nfs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    #[test]
    fn builds_and_reports_errors() {
        assert_eq!(Chain::build(&parse("forward -> count").unwrap()).unwrap().nfs.len(), 2);
        let e = Chain::build(&parse("forward -> nope").unwrap()).err().unwrap();
        assert!(e.starts_with("unknown NF 'nope'"), "{e}");
        let e = Chain::build(&parse("forward(prot=1)").unwrap()).err().unwrap();
        assert_eq!(e, "forward: unknown parameter 'prot'");
        let e = Chain::build(&parse("forward(port=x)").unwrap()).err().unwrap();
        assert!(e.contains("'port=x'"), "{e}");
    }
}

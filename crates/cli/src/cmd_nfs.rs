//! `flowplane nfs`: the NF library, as usable in chain specs.

use flowplane_nf::registry::NFS;

use crate::error::CliError;

pub fn run() -> Result<(), CliError> {
    for k in NFS {
        println!("{:<12} {}", k.name, k.about);
        for (p, d) in k.params {
            println!("{:<12}   {p}: {d}", "");
        }
    }
    Ok(())
}

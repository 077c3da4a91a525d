//! `afxdp:IFACE[:QUEUE]`: a Linux interface's queues through AF_XDP (worker
//! i on queue QUEUE + i; under kernel steering, flowplane's XDP program sends
//! each frame to its owner's socket on the queue it arrived on). Built where libxdp and libbpf were found at build
//! time (`xsk`, the driver); elsewhere the kind is still named, so the
//! spec parses and opening it says why it is missing.

#[cfg(fp_afxdp)]
mod xsk;

use std::sync::Arc;

#[cfg(fp_afxdp)]
pub use xsk::{release_programs, AfXdpPort, AfXdpRx, AfXdpTx};

use super::{iface_arg, Port, PortCaps, PortError, PortInfo, PortOptions, PortSpec};

/// Registration (see [`super::PORTS`]).
pub const INFO: PortInfo = PortInfo {
    name: "afxdp",
    syntax: "afxdp:IFACE[:QUEUE]",
    about: "a Linux interface's queues through AF_XDP (worker i on queue QUEUE+i; zero copy where the driver has it)",
    caps: PortCaps {
        live: true,
        // fp_xdp_steer (csrc/steer.bpf.c) where clang built it; tables without moves.
        kernel_steering: cfg!(fp_fanout_steer),
        peer: true,
        once_per_process: false,
        needs_root: true,
        options: &[],
        missing: if cfg!(fp_afxdp) {
            None
        } else {
            Some("AF_XDP is not built into this binary (build with libxdp-dev and libbpf-dev installed)")
        },
    },
    parse,
    open,
};

/// `IFACE[:QUEUE]` (queue 0 by default), written back with its queue.
fn parse(arg: &str) -> Result<String, String> {
    let (iface, queue) = split(arg)?;
    Ok(format!("{iface}:{queue}"))
}

fn split(arg: &str) -> Result<(String, u32), String> {
    let (name, q) = match arg.split_once(':') {
        Some((n, q)) => (n, q.parse::<u32>().map_err(|_| "queue must be a number".to_string())?),
        None => (arg, 0),
    };
    Ok((iface_arg(name)?, q))
}

#[cfg(fp_afxdp)]
fn open(spec: &PortSpec, queues: usize, opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    let (iface, queue) = split(spec.arg()).map_err(|why| PortError::Spec(format!("{spec}: {why}")))?;
    Ok(Arc::new(AfXdpPort::open(&iface, queue, queues, opts)?))
}

#[cfg(not(fp_afxdp))]
fn open(spec: &PortSpec, _queues: usize, _opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    Err(PortError::Unsupported(format!("{spec}: {}", INFO.caps.missing.unwrap_or_default())))
}

//! `dpdk:PORT_OR_VDEV`: a DPDK port id or vdev (the `dpdk` cargo feature;
//! the driver is `ethdev`). Without the feature the kind is still named,
//! so the spec parses and opening it says why it is missing.

#[cfg(feature = "dpdk")]
mod ethdev;

use std::sync::Arc;

#[cfg(feature = "dpdk")]
pub use ethdev::{set_eal_args, DpdkPort};

use super::{Port, PortCaps, PortError, PortInfo, PortOptions, PortSpec};

/// Registration (see [`super::PORTS`]).
pub const INFO: PortInfo = PortInfo {
    name: "dpdk",
    syntax: "dpdk:PORT_OR_VDEV",
    about: "a DPDK port id or vdev (net_null0, net_pcap0,rx_pcap=in.pcap, ...); the EAL starts once per process",
    caps: PortCaps {
        live: true,
        kernel_steering: false,
        peer: false,
        once_per_process: true,
        needs_root: false,
        options: &["--eal"],
        missing: if cfg!(feature = "dpdk") {
            None
        } else {
            Some("DPDK ports are not built into this binary (build with --features dpdk and libdpdk-dev)")
        },
    },
    parse,
    open,
};

fn parse(arg: &str) -> Result<String, String> {
    if arg.is_empty() {
        return Err("expected dpdk:PORT_ID or dpdk:VDEV".into());
    }
    Ok(arg.to_string())
}

#[cfg(feature = "dpdk")]
fn open(spec: &PortSpec, queues: usize, opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    Ok(Arc::new(DpdkPort::open(spec.arg(), queues, opts)?))
}

#[cfg(not(feature = "dpdk"))]
fn open(spec: &PortSpec, _queues: usize, _opts: PortOptions) -> Result<Arc<dyn Port>, PortError> {
    Err(PortError::Unsupported(format!("{spec}: {}", INFO.caps.missing.unwrap_or_default())))
}

//! `forward`: passes every packet to output port 0 (the I/O baseline's chain).

use flowplane_packet::{Batch, DROP};

use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::{Nf, NfContext, NfCounters, ParamError, ParamSpec, Params};

const PORT: ParamSpec = ParamSpec::uint("port", 0, 0, (DROP - 1) as u64, "output port");

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "forward",
    about: "send every packet to an output port (I/O baseline)",
    keyed_by: KeyedBy::Stateless,
    params: &[PORT],
};

/// Builds `forward` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateless(Box::new(Forward::from_params(p)?)))
}

/// Sends every live packet to port `port` (default 0).
#[derive(Debug, Default)]
pub struct Forward {
    port: u16,
    counters: NfCounters,
}

impl Forward {
    /// Builds from spec parameters: `forward(port=N)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let port = p.uint(&PORT)? as u16;
        Ok(Forward { port, counters: NfCounters::default() })
    }
}

impl Nf for Forward {
    fn name(&self) -> &'static str {
        INFO.name
    }

    #[inline]
    fn process(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, _ctx: &NfContext) {
        let mut live = 0u64;
        for v in &mut batch.verdicts_mut()[range] {
            if *v != DROP {
                *v = self.port;
                live += 1;
            }
        }
        self.counters.packets_in += live;
        self.counters.packets_out += live;
    }

    fn counters(&self) -> NfCounters {
        self.counters
    }
}

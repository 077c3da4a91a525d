//! `forward`: passes every packet to output port 0 (the I/O baseline's chain).

use flowplane_packet::{Batch, DROP};

use crate::{Nf, NfContext, NfCounters, ParamError, Params};

/// Sends every live packet to port `port` (default 0).
#[derive(Debug, Default)]
pub struct Forward {
    port: u16,
    counters: NfCounters,
}

impl Forward {
    /// Builds from spec parameters: `forward(port=N)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let port = p.u64_in("port", 0, 0, (DROP - 1) as u64)? as u16;
        Ok(Forward { port, counters: NfCounters::default() })
    }
}

impl Nf for Forward {
    fn name(&self) -> &'static str {
        "forward"
    }

    #[inline]
    fn process(&mut self, batch: &mut Batch, _ctx: &NfContext) {
        let mut live = 0u64;
        for v in batch.verdicts_mut() {
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

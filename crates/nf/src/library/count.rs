//! `count`: counts packets and bytes, passes everything on unchanged.
//! `--export count=FILE` writes one row: the totals over every core.

use flowplane_packet::{Batch, DROP};

use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::{Nf, NfContext, NfCounters, ParamError, Params};

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo =
    NfInfo { name: "count", about: "count packets and bytes", keyed_by: KeyedBy::Stateless, params: &[] };

/// Builds `count` and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateless(Box::new(Count::from_params(p)?)))
}

/// Counts live packets and bytes.
#[derive(Debug, Default)]
pub struct Count {
    counters: NfCounters,
}

impl Count {
    /// Builds from spec parameters (none).
    pub fn from_params(_p: &mut Params) -> Result<Self, ParamError> {
        Ok(Count::default())
    }
}

impl Nf for Count {
    fn name(&self) -> &'static str {
        INFO.name
    }

    #[inline]
    fn process(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, _ctx: &NfContext) {
        let (mut n, mut bytes) = (0u64, 0u64);
        for (&v, &len) in batch.verdicts()[range.clone()].iter().zip(&batch.lens()[range]) {
            let live = (v != DROP) as u64;
            n += live;
            bytes += live * len as u64;
        }
        self.counters.packets_in += n;
        self.counters.packets_out += n;
        self.counters.bytes_in += bytes;
    }

    fn counters(&self) -> NfCounters {
        self.counters
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "packets": self.counters.packets_in, "bytes": self.counters.bytes_in }))
    }

    fn export_kind(&self) -> Export {
        Export::Report
    }

    /// One row: the run's totals (the report merged over every core).
    fn export_report_rows(&self, merged: &serde_json::Value) -> Vec<serde_json::Value> {
        vec![serde_json::json!({ "packets": merged["packets"], "bytes": merged["bytes"] })]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_packet::{PacketPool, PoolConfig};

    #[test]
    fn counts_live_packets_only() {
        let mut pool = PacketPool::new(PoolConfig { buffers: 8, ..Default::default() }).unwrap();
        let mut b = Batch::new(&pool);
        for n in [60usize, 100, 1] {
            assert!(b.push_copy(&mut pool, &vec![0; n], 0));
        }
        b.drop_packet(1);
        let mut c = Count::default();
        c.process(&mut b, 0..3, &NfContext::default());
        assert_eq!(c.counters().packets_in, 2);
        assert_eq!(c.counters().bytes_in, 61);
        c.process(&mut b, 2..3, &NfContext::default());
        assert_eq!(c.counters().packets_in, 3, "only the range counts");
        let mut f = Forward::from_params(&mut Params::new("forward", vec![("port".into(), "3".into())])).unwrap();
        f.process(&mut b, 1..3, &NfContext::default());
        assert_eq!(b.verdicts(), &[0, DROP, 3]);
        f.process(&mut b, 0..1, &NfContext::default());
        assert_eq!(b.verdicts(), &[3, DROP, 3]);
        b.free_all(&mut pool).unwrap();
    }

    use crate::forward::Forward;
}

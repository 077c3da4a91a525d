//! RSS: Toeplitz hash over the 5-tuple (addresses only for non-TCP/UDP), then
//! the indirection table (RETA) picks the queue.

use flowplane_wire::flow::extract_five_tuple;
use flowplane_wire::rss::{Reta, Toeplitz, MICROSOFT_KEY, SYMMETRIC_KEY};

use crate::{Dispatch, ScaleError};

/// RETA size used by default (as on many 100G NICs).
pub const DEFAULT_RETA_SIZE: usize = 512;

/// An emulated NIC RSS stage.
#[derive(Debug, Clone)]
pub struct RssDispatcher {
    toeplitz: Toeplitz,
    reta: Reta,
    queues: usize,
}

impl RssDispatcher {
    /// RSS over `queues` queues with a round-robin RETA; `symmetric` selects
    /// the symmetric key (both directions of a connection land together).
    pub fn new(queues: usize, symmetric: bool) -> Result<Self, ScaleError> {
        if queues == 0 || queues > DEFAULT_RETA_SIZE {
            return Err(ScaleError::Queues { got: queues, max: DEFAULT_RETA_SIZE });
        }
        let reta = Reta::round_robin(DEFAULT_RETA_SIZE, queues as u16)?;
        let key = if symmetric { &SYMMETRIC_KEY } else { &MICROSOFT_KEY };
        Ok(RssDispatcher { toeplitz: Toeplitz::new(key), reta, queues })
    }

    /// The indirection table (RSS++/Dyssect rewrite it).
    pub fn reta_mut(&mut self) -> &mut Reta {
        &mut self.reta
    }
}

impl Dispatch for RssDispatcher {
    #[inline]
    fn classify(&self, frame: &[u8]) -> Option<(u16, u32)> {
        let t = extract_five_tuple(frame).ok()?;
        let h = self.toeplitz.hash_five_tuple(&t);
        Some((self.reta.queue(h), h))
    }

    fn queues(&self) -> usize {
        self.queues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        f
    }

    #[test]
    fn spreads_flows_and_keeps_them_together() {
        let d = RssDispatcher::new(4, false).unwrap();
        assert_eq!(d.queues(), 4);
        let mut per_q = [0usize; 4];
        for i in 0..4000u32 {
            let f = udp_frame(i.to_be_bytes(), [10, 0, 0, 1], 1000 + i as u16, 53);
            let (q, h) = d.classify(&f).unwrap();
            assert_eq!(d.classify(&f), Some((q, h)), "deterministic");
            per_q[q as usize] += 1;
        }
        for n in per_q {
            assert!(n > 800, "{per_q:?}");
        }
        assert_eq!(d.classify(&[0u8; 10]), None);
    }

    #[test]
    fn symmetric_key_maps_both_directions_together() {
        let d = RssDispatcher::new(8, true).unwrap();
        for i in 0..100u32 {
            let a = udp_frame(i.to_be_bytes(), [10, 0, 0, 1], 1000, 2000 + i as u16);
            let b = udp_frame([10, 0, 0, 1], i.to_be_bytes(), 2000 + i as u16, 1000);
            assert_eq!(d.classify(&a), d.classify(&b));
        }
        assert!(RssDispatcher::new(0, false).is_err());
        assert!(RssDispatcher::new(100_000, false).is_err());
    }
}

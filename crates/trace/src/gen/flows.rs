//! Flow index -> addresses. Every flow index maps to a distinct 5-tuple whose
//! addresses and ports are spread over their ranges (keyed by the seed), so
//! that RSS, Toeplitz and table hashes see realistic entropy.
//!
//! Layout (IPv4): source 10.0.0.0/8 (24 bits of a keyed bijection of the
//! index), source port 1024 + 251 * (top 8 bits of the bijection) + noise, so
//! (source, source port) is unique per flow; destination 172.16.0.0/12 and a
//! destination port from a list of common services or an ephemeral one.
//! IPv6 embeds the same values in fd00::/16 (source) and fd01::/16 (destination).

use super::frame::{Addrs, GtpuFlow};

/// Keyed bijection on u32 (xor-shift-multiply rounds are each invertible).
#[inline]
pub(crate) fn perm32(x: u32, key: u32) -> u32 {
    let mut x = x ^ key;
    x = x.wrapping_mul(0x9E37_79B1);
    x ^= x >> 16;
    x = x.wrapping_mul(0x85EB_CA6B);
    x ^= x >> 13;
    x = x.wrapping_mul(0xC2B2_AE35);
    x ^= x >> 16;
    x
}

/// Keyed bijection on the low `bits` bits of `x` (1..=32): odd multiplies
/// and xor-shifts stay invertible modulo 2^bits.
#[inline]
pub(crate) fn spread_bits(x: u32, key: u32, bits: u32) -> u32 {
    let mask = if bits >= 32 { u32::MAX } else { (1u32 << bits) - 1 };
    let mut x = (x ^ key) & mask;
    x = x.wrapping_mul(0x9E37_79B1) & mask;
    x ^= x >> (bits / 2).max(1);
    x = x.wrapping_mul(0x85EB_CA6B) & mask;
    x
}

/// A 64-bit hash for per-flow attributes that need not be unique.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

// No DNS, NTP, SMTP or MySQL ports: their dissectors flag synthetic payloads as malformed.
const SERVICE_PORTS: [u16; 8] = [80, 443, 8443, 8080, 22, 8000, 5201, 9090];

/// One flow's 5-tuple (the protocol is global to a trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowAddr {
    pub addrs: Addrs,
    pub sport: u16,
    pub dport: u16,
}

/// Derives flow addresses from flow indices for one seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddrPlan {
    key: u32,
    salt: u64,
    ipv6: bool,
}

impl AddrPlan {
    pub(crate) fn new(seed: u64, ipv6: bool) -> Self {
        let salt = mix64(seed ^ 0x5eed_f10e);
        AddrPlan { key: salt as u32, salt, ipv6 }
    }

    /// Distinct for distinct `flow < 2^32`.
    pub(crate) fn flow(&self, flow: u64) -> FlowAddr {
        let j = perm32(flow as u32, self.key);
        let h = mix64(flow ^ self.salt);
        let sport = 1024 + (j >> 24) as u16 * 251 + (h % 251) as u16;
        let dport = if (h >> 8) % 10 < 6 {
            SERVICE_PORTS[((h >> 16) % SERVICE_PORTS.len() as u64) as usize]
        } else {
            1024 + ((h >> 24) % 64_000) as u16
        };
        let dst_bits = (h >> 32) as u32;
        let addrs = if self.ipv6 {
            let mut src = [0u8; 16];
            src[0] = 0xfd;
            src[8..12].copy_from_slice(&(h as u32).to_be_bytes());
            src[12..16].copy_from_slice(&j.to_be_bytes());
            let mut dst = [0u8; 16];
            dst[0] = 0xfd;
            dst[1] = 0x01;
            dst[12..16].copy_from_slice(&(dst_bits & 0xfffff).to_be_bytes());
            Addrs::V6 { src, dst }
        } else {
            let s = 0x0a00_0000 | (j & 0x00ff_ffff);
            let d = 0xac10_0000 | (dst_bits & 0x000f_ffff);
            Addrs::V4 { src: s.to_be_bytes(), dst: d.to_be_bytes() }
        };
        FlowAddr { addrs, sport, dport }
    }

    /// GTP-U addressing: flows are grouped four per UE; each UE has its own
    /// TEID (unique, non-zero), address in 10.0.0.0/8 and gNB among 256.
    pub(crate) fn gtpu(&self, flow: u64) -> GtpuFlow {
        let ue = (flow / 4) as u32;
        let ue_ip = 0x0a00_0000 | spread_bits(ue, self.key, 24);
        let mut teid = perm32(ue, self.key ^ 0x7e1d_0000);
        if teid == 0 {
            // `ue` never reaches u32::MAX, so this value is free.
            teid = perm32(u32::MAX, self.key ^ 0x7e1d_0000);
        }
        let hu = mix64(ue as u64 ^ self.salt);
        let hf = mix64(flow ^ self.salt.rotate_left(17));
        let gnb = (hu % 256) as u8;
        let server = 0xac10_0000 | ((hf >> 20) as u32 & 0x000f_ffff);
        GtpuFlow {
            gnb: [192, 168, gnb, 1],
            upf: [192, 168, 255, 254],
            teid,
            qfi: 1 + (hf % 9) as u8,
            ue: ue_ip.to_be_bytes(),
            server: server.to_be_bytes(),
            // Same base per UE plus the flow's slot: distinct inner tuples per UE.
            sport: 1024 + (hu >> 8) as u16 % 60_000 + (flow % 4) as u16,
            dport: SERVICE_PORTS[((hf >> 8) % SERVICE_PORTS.len() as u64) as usize],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn flows_are_distinct() {
        for ipv6 in [false, true] {
            let p = AddrPlan::new(7, ipv6);
            let set: HashSet<_> = (0..200_000u64).map(|i| p.flow(i)).map(|f| (f.addrs, f.sport, f.dport)).collect();
            assert_eq!(set.len(), 200_000);
        }
    }

    #[test]
    fn gtpu_teids_unique_and_nonzero() {
        let p = AddrPlan::new(1, false);
        let teids: HashSet<u32> = (0..100_000u64).step_by(4).map(|i| p.gtpu(i).teid).collect();
        assert_eq!(teids.len(), 25_000);
        assert!(!teids.contains(&0));
        let inner: HashSet<_> = (0..40_000u64).map(|i| p.gtpu(i)).map(|g| (g.ue, g.sport, g.server, g.dport)).collect();
        assert_eq!(inner.len(), 40_000);
    }

    #[test]
    fn spread_bits_is_a_bijection() {
        let set: HashSet<u32> = (0..1u32 << 16).map(|x| spread_bits(x, 0xabcd, 16)).collect();
        assert_eq!(set.len(), 1 << 16);
        assert!(set.iter().all(|&v| v < 1 << 16));
    }

    #[test]
    fn seeds_change_addresses() {
        assert_ne!(AddrPlan::new(1, false).flow(0), AddrPlan::new(2, false).flow(0));
    }
}

//! The UPF traffic plan (`--proto gtpu --upf NxM[:ul|dl|both]`): N PFCP
//! sessions with M PDRs each, and the traffic that exercises them. Flow `f`
//! is PDR `j = f % M` of session `k = f / M`; its packets match that PDR's
//! SDF filter and no earlier one (PDR `j` has precedence `10 (j + 1)` and
//! remote ports `5000 + 64 j ..= 5000 + 64 j + 63`, so classifying flow `j`
//! scans `j + 1` PDRs). Uplink packets are G-PDUs on the session's TEID with
//! the PDR's QFI; downlink packets are plain IPv4/UDP to the UE.
//!
//! `flowplane upf sessions` writes the session file from the same functions,
//! so a generated trace and its session file always agree.

use std::fmt;
use std::str::FromStr;

use super::flows::mix64;
use super::frame::GtpuFlow;
use super::{invalid, GenError};

/// Which direction the generated packets take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpfDir {
    /// N3 -> N6: GTP-U G-PDUs.
    Uplink,
    /// N6 -> N3: plain IP to the UEs.
    Downlink,
    /// Each packet either way (by a hash of its index).
    Both,
}

/// N sessions x M PDRs, and the direction of the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpfPlan {
    /// Sessions.
    pub sessions: u32,
    /// PDRs per session and direction.
    pub pdrs: u32,
    /// Direction.
    pub dir: UpfDir,
}

/// Most sessions (UE addresses stay within 10.0.0.0/8).
pub const MAX_SESSIONS: u32 = (1 << 24) - 2;
/// Most PDRs per session and direction (remote port ranges stay below 65536).
pub const MAX_PDRS: u32 = 64;
/// The UPF's N3 address the uplink is sent to.
pub const UPF_N3: [u8; 4] = [192, 168, 255, 254];
/// The remote (data network) prefix of every SDF filter: 172.16.0.0/12.
pub const REMOTE_PREFIX: ([u8; 4], u8) = ([172, 16, 0, 0], 12);

/// One flow of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpfFlow {
    /// Session index.
    pub session: u32,
    /// PDR index within the session.
    pub pdr: u32,
    /// UE address.
    pub ue: [u8; 4],
    /// Remote address.
    pub remote: [u8; 4],
    /// UE port.
    pub ue_port: u16,
    /// Remote port.
    pub remote_port: u16,
}

impl UpfPlan {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), GenError> {
        if self.sessions == 0 || self.sessions > MAX_SESSIONS {
            return Err(invalid(format!("--upf: sessions must be in 1..={MAX_SESSIONS}")));
        }
        if self.pdrs == 0 || self.pdrs > MAX_PDRS {
            return Err(invalid(format!("--upf: PDRs per session must be in 1..={MAX_PDRS}")));
        }
        Ok(())
    }

    /// Flows in the plan: one per (session, PDR).
    pub fn flows(&self) -> u64 {
        u64::from(self.sessions) * u64::from(self.pdrs)
    }

    /// UE address of session `k`: 10.0.0.0/8 + k + 1.
    pub fn ue(k: u32) -> [u8; 4] {
        (0x0a00_0000 + k + 1).to_be_bytes()
    }

    /// Local (UPF) uplink TEID of session `k`.
    pub fn teid(k: u32) -> u32 {
        k + 1
    }

    /// The gNB serving session `k`.
    pub fn gnb(k: u32) -> [u8; 4] {
        [192, 168, (k % 250) as u8, 1]
    }

    /// The gNB's TEID for session `k`'s downlink.
    pub fn peer_teid(k: u32) -> u32 {
        0x4000_0000 | k
    }

    /// QFI of PDR `j`.
    pub fn qfi(j: u32) -> u8 {
        1 + (j % 9) as u8
    }

    /// Precedence of PDR `j`.
    pub fn precedence(j: u32) -> u32 {
        10 * (j + 1)
    }

    /// Remote port range of PDR `j`.
    pub fn remote_ports(j: u32) -> (u16, u16) {
        let lo = 5000 + 64 * j as u16;
        (lo, lo + 63)
    }

    /// The SDF filter of PDR `j` (a TS 29.244 flow description).
    pub fn sdf(j: u32) -> String {
        let (lo, hi) = Self::remote_ports(j);
        let (a, len) = REMOTE_PREFIX;
        format!("permit out 17 from {}.{}.{}.{}/{len} {lo}-{hi} to assigned", a[0], a[1], a[2], a[3])
    }

    /// Flow `f` (`f < flows()`).
    pub fn flow(&self, f: u64) -> UpfFlow {
        let k = (f / u64::from(self.pdrs)) as u32;
        let j = (f % u64::from(self.pdrs)) as u32;
        let h = mix64(f ^ 0x5e55_1d00);
        let remote = 0xac10_0000 | (h as u32 & 0x000f_ffff);
        let (lo, _) = Self::remote_ports(j);
        UpfFlow {
            session: k,
            pdr: j,
            ue: Self::ue(k),
            remote: remote.to_be_bytes(),
            ue_port: 10_000 + j as u16,
            remote_port: lo + ((h >> 32) % 64) as u16,
        }
    }

    /// Whether packet `i` goes uplink.
    pub(crate) fn uplink(&self, i: u64, seed: u64) -> bool {
        match self.dir {
            UpfDir::Uplink => true,
            UpfDir::Downlink => false,
            UpfDir::Both => mix64(i ^ mix64(seed ^ 0xd1e)) & 1 == 0,
        }
    }

    /// The uplink G-PDU addressing of flow `f`.
    pub(crate) fn gtpu(&self, f: u64) -> GtpuFlow {
        let u = self.flow(f);
        GtpuFlow {
            gnb: Self::gnb(u.session),
            upf: UPF_N3,
            teid: Self::teid(u.session),
            qfi: Self::qfi(u.pdr),
            ue: u.ue,
            server: u.remote,
            sport: u.ue_port,
            dport: u.remote_port,
        }
    }
}

impl FromStr for UpfPlan {
    type Err = GenError;

    /// `NxM`, `NxM:ul`, `NxM:dl` or `NxM:both` (default `ul`).
    fn from_str(s: &str) -> Result<Self, GenError> {
        let bad = || invalid(format!("--upf '{s}': expected SESSIONSxPDRS[:ul|dl|both], e.g. 130000x16:ul"));
        let (nm, dir) = s.split_once(':').unwrap_or((s, "ul"));
        let (n, m) = nm.split_once('x').ok_or_else(bad)?;
        let dir = match dir {
            "ul" => UpfDir::Uplink,
            "dl" => UpfDir::Downlink,
            "both" => UpfDir::Both,
            _ => return Err(bad()),
        };
        let p = UpfPlan {
            sessions: n.replace('_', "").parse().map_err(|_| bad())?,
            pdrs: m.parse().map_err(|_| bad())?,
            dir,
        };
        p.validate()?;
        Ok(p)
    }
}

impl fmt::Display for UpfPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self.dir {
            UpfDir::Uplink => "ul",
            UpfDir::Downlink => "dl",
            UpfDir::Both => "both",
        };
        write!(f, "{}x{}:{d}", self.sessions, self.pdrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_land_in_their_pdr_ranges() {
        let p: UpfPlan = "1000x16:both".parse().unwrap();
        assert_eq!(p.flows(), 16_000);
        for f in 0..p.flows() {
            let u = p.flow(f);
            let (lo, hi) = UpfPlan::remote_ports(u.pdr);
            assert!((lo..=hi).contains(&u.remote_port));
            assert_eq!(u.remote[0], 172);
            assert_eq!(u.remote[1] & 0xf0, 16);
            assert_eq!(u64::from(u.session) * 16 + u64::from(u.pdr), f);
        }
        assert!("0x4".parse::<UpfPlan>().is_err() && "4x65".parse::<UpfPlan>().is_err());
        assert!("4x4:sideways".parse::<UpfPlan>().is_err() && "4".parse::<UpfPlan>().is_err());
        assert_eq!("130000x16".parse::<UpfPlan>().unwrap().to_string(), "130000x16:ul");
    }
}

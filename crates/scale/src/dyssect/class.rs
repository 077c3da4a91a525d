//! The priority traffic class (`--priority`): packets matched by
//! destination port (range) or DSCP, parsed straight from the frame
//! (Ethernet, one VLAN tag, IPv4 or IPv6 without extension headers).

/// A class of packets by header fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriorityClass {
    /// Inclusive destination port range (TCP/UDP).
    pub dport: Option<(u16, u16)>,
    /// DSCP value.
    pub dscp: Option<u8>,
}

impl PriorityClass {
    /// Parses `dport=P`, `dport=A-B`, `dscp=D`, or several joined by `,` (all must match).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut c = PriorityClass::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("--priority: `{part}` is not field=value"))?;
            match k.trim() {
                "dport" => {
                    let (a, b) = v.split_once('-').unwrap_or((v, v));
                    let p = |x: &str| x.trim().parse::<u16>().map_err(|_| format!("--priority: bad port `{x}`"));
                    let (a, b) = (p(a)?, p(b)?);
                    if a > b {
                        return Err(format!("--priority: empty port range {a}-{b}"));
                    }
                    c.dport = Some((a, b));
                }
                "dscp" => {
                    let d = v.trim().parse::<u8>().ok().filter(|&d| d < 64);
                    c.dscp = Some(d.ok_or_else(|| format!("--priority: DSCP `{v}` not in 0..=63"))?);
                }
                _ => return Err(format!("--priority: unknown field `{k}` (dport, dscp)")),
            }
        }
        if c.dport.is_none() && c.dscp.is_none() {
            return Err("--priority: give dport=P[-Q] and/or dscp=D".into());
        }
        Ok(c)
    }

    /// True if `frame` belongs to the class (malformed frames do not).
    #[inline]
    pub fn matches(&self, frame: &[u8]) -> bool {
        let at = |o: usize| frame.get(o).copied();
        let be16 = |o: usize| Some(u16::from_be_bytes([at(o)?, at(o + 1)?]));
        let Some(mut et) = be16(12) else { return false };
        let mut l3 = 14;
        if et == 0x8100 {
            et = be16(16).unwrap_or(0);
            l3 = 18;
        }
        let (dscp, proto, l4) = match et {
            0x0800 => {
                let Some(v) = at(l3) else { return false };
                (at(l3 + 1).map(|t| t >> 2), at(l3 + 9), l3 + usize::from(v & 0x0f) * 4)
            }
            0x86dd => {
                let tc = be16(l3).map(|w| ((w >> 4) & 0xff) as u8);
                (tc.map(|t| t >> 2), at(l3 + 6), l3 + 40)
            }
            _ => return false,
        };
        if self.dscp.is_some_and(|d| dscp != Some(d)) {
            return false;
        }
        if let Some((a, b)) = self.dport {
            if !matches!(proto, Some(6 | 17)) {
                return false;
            }
            return be16(l4 + 2).is_some_and(|p| p >= a && p <= b);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[15] = 46 << 2;
        f[23] = 17;
        f[36..38].copy_from_slice(&5000u16.to_be_bytes());
        assert!(PriorityClass::parse("dport=5000").unwrap().matches(&f));
        assert!(PriorityClass::parse("dport=4000-6000, dscp=46").unwrap().matches(&f));
        assert!(!PriorityClass::parse("dscp=10").unwrap().matches(&f));
        assert!(!PriorityClass::parse("dport=80").unwrap().matches(&f));
        assert!(!PriorityClass::parse("dport=5000").unwrap().matches(&f[..30]));
        for bad in ["", "dport", "dport=9-1", "dscp=64", "sport=1", "dport=x"] {
            assert!(PriorityClass::parse(bad).is_err(), "{bad}");
        }
    }
}

//! Address prefixes and port ranges as NFs take them in parameters and rules:
//! [`IpPrefix`] (IPv4 or IPv6 CIDR, `10.0.0.0/8`, `2001:db8::/32`, or a
//! bare address as a host prefix) and [`PortRange`] (`53`, `1024-65535`).
//! One parser for each, so every NF accepts the same spellings.

use core::fmt;
use std::net::IpAddr;

/// An address as a 128-bit number: IPv4 in the low 32 bits, IPv6 as is.
#[inline]
pub fn ip_bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

/// An IPv4 or IPv6 prefix. Keeps the address as written (host bits
/// included, for reports); matching and equality use the network part only.
#[derive(Clone, Copy, Debug)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
    /// Network bits (`ip_bits(addr) & mask`).
    net: u128,
    /// The top `len` bits of the family's width.
    mask: u128,
}

impl IpPrefix {
    /// The prefix `addr/len`; `None` if `len` exceeds the family's width (32 or 128).
    pub fn new(addr: IpAddr, len: u8) -> Option<IpPrefix> {
        (u32::from(len) <= Self::width(addr)).then(|| Self::clamped(addr, len))
    }

    /// The prefix `addr/len` with `len` capped at the family's width.
    pub fn clamped(addr: IpAddr, len: u8) -> IpPrefix {
        let width = Self::width(addr);
        let l = u32::from(len).min(width);
        let full = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
        let mask = if l == 0 { 0 } else { full & !((1u128 << (width - l)) - 1) };
        IpPrefix { addr, len: l as u8, net: ip_bits(addr) & mask, mask }
    }

    fn width(addr: IpAddr) -> u32 {
        if addr.is_ipv4() {
            32
        } else {
            128
        }
    }

    /// Parses `A.B.C.D[/N]` or `X:Y::Z[/N]`; an address alone is a host prefix
    /// (/32 or /128). `None` for anything else (bad address, length past the
    /// family's width, an empty or non-numeric length).
    pub fn parse(s: &str) -> Option<IpPrefix> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        IpPrefix::new(addr, len.unwrap_or(Self::width(addr) as u8))
    }

    /// The address as written (host bits kept).
    #[inline]
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Prefix length in bits.
    #[inline]
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for a zero-length prefix (matches every address of its family).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True for an IPv6 prefix.
    #[inline]
    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }

    /// True if `a` is of the prefix's family and inside it.
    #[inline]
    pub fn contains(&self, a: IpAddr) -> bool {
        self.contains_bits(a.is_ipv6(), ip_bits(a))
    }

    /// [`IpPrefix::contains`] for an address already in [`ip_bits`] form.
    #[inline]
    pub fn contains_bits(&self, v6: bool, bits: u128) -> bool {
        self.is_ipv6() == v6 && bits & self.mask == self.net
    }
}

impl PartialEq for IpPrefix {
    fn eq(&self, o: &IpPrefix) -> bool {
        self.is_ipv6() == o.is_ipv6() && self.net == o.net && self.mask == o.mask
    }
}

impl Eq for IpPrefix {}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// An inclusive port range `lo..=hi` with `lo <= hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (inclusive).
    pub hi: u16,
}

impl PortRange {
    /// Parses `N` (a single port) or `N-M` with `N <= M <= 65535`; blanks
    /// around either number are ignored.
    pub fn parse(s: &str) -> Option<PortRange> {
        let (lo, hi) = s.split_once('-').unwrap_or((s, s));
        let (lo, hi) = (lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?);
        (lo <= hi).then_some(PortRange { lo, hi })
    }

    /// True if `p` is in the range.
    #[inline]
    pub fn contains(&self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(IpPrefix::parse("10.1.2.3/8"), IpPrefix::parse("10.0.0.0/8"));
        let p = IpPrefix::parse("10.1.2.3/8").unwrap();
        assert_eq!((p.addr(), p.len(), p.to_string()), ("10.1.2.3".parse().unwrap(), 8, "10.1.2.3/8".to_string()));
        let any4 = IpPrefix::parse("0.0.0.0/0").unwrap();
        assert!(any4.contains("255.255.255.255".parse().unwrap()) && !any4.contains("::".parse().unwrap()));
        assert!(any4.is_empty());
        let host = IpPrefix::parse("1.2.3.4").unwrap();
        assert_eq!(host.len(), 32);
        assert!(host.contains_bits(false, 0x0102_0304) && !host.contains_bits(false, 0x0102_0305));
        let any6 = IpPrefix::parse("::/0").unwrap();
        assert!(any6.contains_bits(true, u128::MAX) && any6.is_ipv6());
        let v6 = IpPrefix::parse("2001:db8::/32").unwrap();
        assert!(v6.contains("2001:db8:1::5".parse().unwrap()) && !v6.contains("2001:db9::".parse().unwrap()));
        assert_eq!(IpPrefix::parse("ffff::").map(|p| p.len()), Some(128));
        for bad in
            ["10.0.0.0/33", "::/129", "10.0.0/8", "x", "", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/ 8", "1.1.1.1/300"]
        {
            assert!(IpPrefix::parse(bad).is_none(), "{bad}");
        }
        assert!(IpPrefix::new("1.2.3.4".parse().unwrap(), 33).is_none());
        let c = IpPrefix::clamped("1.2.3.4".parse().unwrap(), 40);
        assert_eq!((c.len(), c), (32, IpPrefix::parse("1.2.3.4/32").unwrap()));
    }

    #[test]
    fn port_ranges() {
        assert_eq!(PortRange::parse("53"), Some(PortRange { lo: 53, hi: 53 }));
        assert_eq!(PortRange::parse("1024-65535"), Some(PortRange { lo: 1024, hi: 65535 }));
        assert_eq!(PortRange::parse(" 10 - 20 "), Some(PortRange { lo: 10, hi: 20 }));
        assert_eq!(PortRange::parse("0"), Some(PortRange { lo: 0, hi: 0 }));
        for bad in ["20-10", "70000", "", "x53", "1-", "-1", "1-2-3"] {
            assert_eq!(PortRange::parse(bad), None, "{bad}");
        }
        let r = PortRange::parse("10-20").unwrap();
        assert!(r.contains(10) && r.contains(20) && !r.contains(21) && !r.contains(9));
        assert_eq!(r.to_string(), "10-20");
    }
}

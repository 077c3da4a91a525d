//! Internet checksum (RFC 1071), pseudo-headers for TCP/UDP over IPv4 and IPv6,
//! and incremental updates (RFC 1624) for rewriting addresses and ports.
//!
//! All sums are kept in "folded one's-complement" form: `sum` returns the
//! 16-bit one's-complement sum, `finish` turns it into the value stored on the
//! wire.

/// One's-complement sum of `data` (network byte order), not yet complemented.
/// Folds 8 bytes at a time into a 64-bit accumulator; the tail is padded with
/// zero as RFC 1071 requires for odd lengths.
#[inline]
pub fn sum(data: &[u8]) -> u16 {
    fold(accumulate(0, data))
}

/// Adds `data` to a running 64-bit accumulator (see [`fold`]).
#[inline]
pub fn accumulate(mut acc: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Big-endian 16-bit words summed in 64-bit lanes: the carries are
        // folded at the end, which is equivalent because addition is
        // associative in one's-complement arithmetic.
        let v = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let (s, carry) = acc.overflowing_add(v);
        acc = s + carry as u64;
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 8];
    tail[..rest.len()].copy_from_slice(rest);
    let v = u64::from_be_bytes(tail);
    let (s, carry) = acc.overflowing_add(v);
    s + carry as u64
}

/// Folds a 64-bit accumulator into a 16-bit one's-complement sum.
#[inline]
pub fn fold(mut acc: u64) -> u16 {
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// Combines two folded sums.
#[inline]
pub fn combine(a: u16, b: u16) -> u16 {
    let s = a as u32 + b as u32;
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The value to store in a checksum field: the complement of the sum.
#[inline]
pub fn finish(sum: u16) -> u16 {
    !sum
}

/// Checksum of `data` as stored on the wire (complemented sum).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// Sum of the IPv4 pseudo-header (RFC 793 / RFC 768).
#[inline]
pub fn pseudo_header_v4(src: [u8; 4], dst: [u8; 4], protocol: u8, length: u16) -> u16 {
    let mut acc = u32::from_be_bytes(src) as u64 + u32::from_be_bytes(dst) as u64;
    acc += protocol as u64 + length as u64;
    fold(acc)
}

/// Sum of the IPv6 pseudo-header (RFC 8200 §8.1).
#[inline]
pub fn pseudo_header_v6(src: [u8; 16], dst: [u8; 16], next_header: u8, length: u32) -> u16 {
    let acc = accumulate(accumulate(0, &src), &dst);
    fold(acc + next_header as u64 + (length >> 16) as u64 + (length & 0xffff) as u64)
}

/// RFC 1624 eqn. 3: new checksum after a 16-bit word changes from `old` to `new`.
/// `HC' = ~(~HC + ~m + m')`.
#[inline]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    let s = combine(combine(!check, !old), new);
    !s
}

/// RFC 1624 update for a 32-bit field (e.g. an IPv4 address): one sum of
/// `~HC + ~m_hi + ~m_lo + m'_hi + m'_lo`, folded once.
#[inline]
pub fn update32(check: u16, old: u32, new: u32) -> u16 {
    apply_delta(check, delta32(old, new))
}

/// The part of an RFC 1624 update that depends only on the field: `~m + m'`
/// for a 32-bit field, as an unfolded sum below 2^18. One rewrite of an IPv4
/// address updates two checksums (IPv4 header and TCP/UDP) with the same
/// delta: compute it once, apply it with [`apply_delta`] to each.
#[inline]
pub fn delta32(old: u32, new: u32) -> u32 {
    let nold = !old;
    (nold >> 16) + (nold & 0xffff) + (new >> 16) + (new & 0xffff)
}

/// Applies a [`delta32`] to checksum `check`: `~(~HC + delta)`. The sum is
/// below 2^19, so two 16-bit folds bring it to 16 bits.
#[inline]
pub fn apply_delta(check: u16, delta: u32) -> u16 {
    let s = delta + u32::from(!check);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// RFC 1624 update for an arbitrary even-length byte field (e.g. an IPv6 address).
/// Returns `check` unchanged if the lengths differ or are odd.
#[inline]
pub fn update_bytes(check: u16, old: &[u8], new: &[u8]) -> u16 {
    if old.len() != new.len() || !old.len().is_multiple_of(2) {
        return check;
    }
    let mut c = check;
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        c = update16(c, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([n[0], n[1]]));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
            s += w as u32;
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        assert_eq!(sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0xddf2);
    }

    #[test]
    fn ipv4_header_checksum() {
        // A well-known IPv4 header whose checksum is 0xb861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(sum(&h), 0xffff);
    }

    #[test]
    fn matches_naive_on_all_lengths() {
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(sum(&data[..n]), naive(&data[..n]), "len {n}");
        }
    }

    #[test]
    fn incremental_matches_recompute() {
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        let c = checksum(&h);
        let old = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
        let new = 0x0a00_0203u32;
        h[16..20].copy_from_slice(&new.to_be_bytes());
        assert_eq!(update32(c, old, new), checksum(&h));
        let c2 = checksum(&h);
        let old6 = h[12..16].to_vec();
        h[12..16].copy_from_slice(&[0xff, 0xff, 0, 0]);
        assert_eq!(update_bytes(c2, &old6, &h[12..16]), checksum(&h));
    }

    #[test]
    fn update32_matches_two_update16() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (c, o, n) = (x as u16, (x >> 16) as u32, (x >> 32) as u32);
            let two = update16(update16(c, (o >> 16) as u16, (n >> 16) as u16), o as u16, n as u16);
            // Both are valid one's-complement results; they may differ only in the +0/-0 representation.
            let a = update32(c, o, n);
            assert!(
                a == two || (a == 0xffff && two == 0) || (a == 0 && two == 0xffff),
                "{c:x} {o:x} {n:x}: {a:x} vs {two:x}"
            );
        }
    }

    #[test]
    fn pseudo_headers() {
        let a = pseudo_header_v4([10, 0, 0, 1], [10, 0, 0, 2], 17, 20);
        let mut buf = vec![10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 20];
        assert_eq!(a, sum(&buf));
        let s6 = [1u8; 16];
        let d6 = [2u8; 16];
        let b = pseudo_header_v6(s6, d6, 6, 40);
        buf.clear();
        buf.extend_from_slice(&s6);
        buf.extend_from_slice(&d6);
        buf.extend_from_slice(&[0, 0, 0, 40, 0, 0, 0, 6]);
        assert_eq!(b, sum(&buf));
    }
}

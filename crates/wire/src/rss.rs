//! Toeplitz RSS hash (as computed by NICs) and the RSS redirection table (RETA).
//!
//! This module owns the software model of a NIC's receive-side scaling:
//! [`Toeplitz`] computes the Microsoft RSS hash with a 40-byte key over inputs
//! of up to 36 bytes (IPv6 addresses + ports), and [`Reta`] maps the hash to a
//! queue the way NICs do (low bits index a power-of-two table). The table is
//! mutable entry by entry so that RSS++ / Dyssect can move shards between cores.
//!
//! Speed: instead of walking the input bit by bit, [`Toeplitz::new`]
//! precomputes, for every input byte position and byte value, the 32-bit
//! contribution to the hash (36 x 256 x 4 B = 36 KiB); a hash is then one table
//! load and XOR per input byte. [`reference_hash`] is the literal bit-by-bit
//! definition, kept to verify the tables.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::flow::FiveTuple;

/// The key from Microsoft's "Verifying the RSS hash calculation", the default
/// of many NIC drivers.
pub const MICROSOFT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b,
    0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac,
    0x01, 0xfa,
];

/// `0x6d5a` repeated: the key has period 16 bits, so swapping source and
/// destination (address and port fields are multiples of 16 bits) leaves the
/// hash unchanged and both directions of a connection reach the same queue.
pub const SYMMETRIC_KEY: [u8; 40] = {
    let mut k = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        k[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    k
};

/// A Toeplitz key drawn from `secret` (a run's random secret, issue 33: no
/// one can compute offline which flows share a queue). `symmetric`: a key of
/// period 16 bits, as [`SYMMETRIC_KEY`] (both directions of a connection on
/// one queue), so only 16 of its bits are free. Either way the key is
/// redrawn until the low `reta_bits` bits of the hash take every value over
/// the input words (the RETA index is not confined to a subspace; a key of
/// period 16 has only 16 window positions, so `reta_bits` <= 16 there).
pub fn keyed_key(secret: u64, symmetric: bool, reta_bits: u32) -> [u8; 40] {
    let mut x = secret ^ 0x5851_f42d_4c95_7f2d;
    let mut next = || {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let bits = reta_bits.min(if symmetric { 16 } else { 32 });
    loop {
        let mut k = [0u8; 40];
        if symmetric {
            let p = (next() as u16).to_be_bytes();
            for (i, b) in k.iter_mut().enumerate() {
                *b = p[i % 2];
            }
        } else {
            for c in k.chunks_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
        }
        // GF(2) rank of the low `bits` bits of the first 32 windows: every RETA index reachable.
        let mask = if bits >= 32 { u32::MAX } else { (1u32 << bits) - 1 };
        let mut basis = [0u32; 32];
        let mut rank = 0;
        for bit in 0..32 {
            let mut v = key_window(&k, bit) & mask;
            for b in basis.iter().take(rank) {
                v = v.min(v ^ b);
            }
            if v != 0 {
                basis[rank] = v;
                rank += 1;
                basis[..rank].sort_unstable_by(|a, b| b.cmp(a));
            }
        }
        if rank as u32 == bits {
            return k;
        }
    }
}

/// Longest input a 40-byte key covers: 320 key bits - 32 + 1 window start
/// positions, rounded down to bytes.
pub const MAX_INPUT_LEN: usize = 36;

const TCP: u8 = 6;
const UDP: u8 = 17;

/// 32 key bits starting at bit `bit` (MSB first), zeros past the end of the key.
fn key_window(key: &[u8; 40], bit: usize) -> u32 {
    let byte = bit / 8;
    let mut w = [0u8; 8];
    for (i, b) in w.iter_mut().enumerate() {
        *b = key.get(byte + i).copied().unwrap_or(0);
    }
    (u64::from_be_bytes(w) << (bit % 8) >> 32) as u32
}

/// Literal Toeplitz definition: for every input bit set (MSB of `input[0]`
/// first), XOR the 32 key bits starting at that bit position. Slow; for tests.
/// Bytes beyond [`MAX_INPUT_LEN`] are ignored, as in [`Toeplitz::hash`].
pub fn reference_hash(key: &[u8; 40], input: &[u8]) -> u32 {
    let mut result = 0u32;
    for (i, &byte) in input.iter().take(MAX_INPUT_LEN).enumerate() {
        for j in 0..8 {
            if byte & (0x80 >> j) != 0 {
                result ^= key_window(key, i * 8 + j);
            }
        }
    }
    result
}

/// Toeplitz hasher with per-byte lookup tables for one key.
#[derive(Clone)]
pub struct Toeplitz {
    /// `tables[i][v]`: contribution of byte value `v` at input position `i`.
    tables: Box<[[u32; 256]; MAX_INPUT_LEN]>,
    key: [u8; 40],
}

impl fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toeplitz").field("key", &self.key).finish_non_exhaustive()
    }
}

impl Toeplitz {
    /// Precomputes the lookup tables for `key` (36 KiB, once per key).
    pub fn new(key: &[u8; 40]) -> Self {
        let mut tables = Box::new([[0u32; 256]; MAX_INPUT_LEN]);
        for (pos, table) in tables.iter_mut().enumerate() {
            // Contribution of each single bit, then every byte value as the XOR
            // of its bits (built from the value with its lowest set bit cleared).
            let bits: [u32; 8] = core::array::from_fn(|j| key_window(key, pos * 8 + j));
            for v in 1..256usize {
                let low = v.trailing_zeros() as usize; // bit `low` is MSB-first index 7 - low
                table[v] = table[v & (v - 1)] ^ bits[7 - low];
            }
        }
        Toeplitz { tables, key: *key }
    }

    /// The key this hasher was built for.
    pub fn key(&self) -> &[u8; 40] {
        &self.key
    }

    /// Hash of `input`; bytes beyond [`MAX_INPUT_LEN`] are ignored.
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        let mut h = 0;
        for (table, &b) in self.tables.iter().zip(input) {
            h ^= table[b as usize];
        }
        h
    }

    /// Fixed-length form, unrolled for `N` known at compile time. Two XOR
    /// chains (even / odd positions) halve the dependency length; the cost is
    /// then bound by the two loads per input byte (input byte, table entry).
    #[inline(always)]
    fn hash_fixed<const N: usize>(&self, input: &[u8; N]) -> u32 {
        let (mut even, mut odd) = (0u32, 0u32);
        for (i, (table, &b)) in self.tables.iter().zip(input).enumerate() {
            if i % 2 == 0 {
                even ^= table[b as usize];
            } else {
                odd ^= table[b as usize];
            }
        }
        even ^ odd
    }

    /// IPv4 with ports (NDIS_HASH_TCP_IPV4 / UDP_IPV4): src, dst, sport, dport.
    #[inline]
    pub fn hash_v4(&self, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> u32 {
        let mut input = [0u8; 12];
        input[0..4].copy_from_slice(&src.octets());
        input[4..8].copy_from_slice(&dst.octets());
        input[8..10].copy_from_slice(&sport.to_be_bytes());
        input[10..12].copy_from_slice(&dport.to_be_bytes());
        self.hash_fixed(&input)
    }

    /// IPv4 addresses only (NDIS_HASH_IPV4).
    #[inline]
    pub fn hash_v4_addrs(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
        let mut input = [0u8; 8];
        input[0..4].copy_from_slice(&src.octets());
        input[4..8].copy_from_slice(&dst.octets());
        self.hash_fixed(&input)
    }

    /// IPv6 with ports (NDIS_HASH_TCP_IPV6 / UDP_IPV6).
    #[inline]
    pub fn hash_v6(&self, src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> u32 {
        let mut input = [0u8; 36];
        input[0..16].copy_from_slice(&src.octets());
        input[16..32].copy_from_slice(&dst.octets());
        input[32..34].copy_from_slice(&sport.to_be_bytes());
        input[34..36].copy_from_slice(&dport.to_be_bytes());
        self.hash_fixed(&input)
    }

    /// IPv6 addresses only (NDIS_HASH_IPV6).
    #[inline]
    pub fn hash_v6_addrs(&self, src: Ipv6Addr, dst: Ipv6Addr) -> u32 {
        let mut input = [0u8; 32];
        input[0..16].copy_from_slice(&src.octets());
        input[16..32].copy_from_slice(&dst.octets());
        self.hash_fixed(&input)
    }

    /// Hash a NIC would compute for this flow: with ports for TCP and UDP,
    /// addresses only for other protocols and for non-first fragments (which
    /// have no ports). The tuple's byte layout starts with exactly the RSS input.
    #[inline]
    pub fn hash_five_tuple(&self, t: &FiveTuple) -> u32 {
        let with_ports = matches!(t.proto(), TCP | UDP) && !t.is_non_first_fragment();
        match t {
            FiveTuple::V4(t) => {
                let b = t.as_bytes();
                if with_ports {
                    self.hash_fixed::<12>(b.first_chunk().unwrap_or(&[0; 12]))
                } else {
                    self.hash_fixed::<8>(b.first_chunk().unwrap_or(&[0; 8]))
                }
            }
            FiveTuple::V6(t) => {
                let b = t.as_bytes();
                if with_ports {
                    self.hash_fixed::<36>(b.first_chunk().unwrap_or(&[0; 36]))
                } else {
                    self.hash_fixed::<32>(b.first_chunk().unwrap_or(&[0; 32]))
                }
            }
        }
    }
}

/// Largest RETA accepted (entries); real NICs use 128 to 2048.
pub const MAX_RETA_SIZE: usize = 1 << 16;

/// Why a RETA could not be built or changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetaError {
    /// Size 0.
    ZeroSize,
    /// Size not a power of two.
    NotPowerOfTwo(usize),
    /// Size above [`MAX_RETA_SIZE`].
    TooLarge(usize),
    /// Zero queues.
    ZeroQueues,
    /// Entry index past the end of the table.
    IndexOutOfRange(usize),
}

impl fmt::Display for RetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetaError::ZeroSize => write!(f, "RETA size must not be 0"),
            RetaError::NotPowerOfTwo(n) => write!(f, "RETA size {n} is not a power of two"),
            RetaError::TooLarge(n) => write!(f, "RETA size {n} exceeds {MAX_RETA_SIZE}"),
            RetaError::ZeroQueues => write!(f, "RETA needs at least one queue"),
            RetaError::IndexOutOfRange(i) => write!(f, "RETA index {i} out of range"),
        }
    }
}

impl std::error::Error for RetaError {}

/// RSS redirection table: `queue = table[hash & (size - 1)]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reta {
    table: Vec<u16>,
    mask: u32,
}

impl Reta {
    fn check_size(size: usize) -> Result<(), RetaError> {
        if size == 0 {
            Err(RetaError::ZeroSize)
        } else if !size.is_power_of_two() {
            Err(RetaError::NotPowerOfTwo(size))
        } else if size > MAX_RETA_SIZE {
            Err(RetaError::TooLarge(size))
        } else {
            Ok(())
        }
    }

    /// Entries `0, 1, .., queues-1, 0, 1, ..` (what drivers install by default).
    pub fn round_robin(size: usize, queues: u16) -> Result<Reta, RetaError> {
        Self::check_size(size)?;
        if queues == 0 {
            return Err(RetaError::ZeroQueues);
        }
        let table = (0..size).map(|i| (i % queues as usize) as u16).collect();
        Ok(Reta { table, mask: (size - 1) as u32 })
    }

    /// A table with the given entries (length must be a power of two).
    pub fn from_entries(entries: Vec<u16>) -> Result<Reta, RetaError> {
        Self::check_size(entries.len())?;
        let mask = (entries.len() - 1) as u32;
        Ok(Reta { table: entries, mask })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Always false (a RETA has at least one entry); for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Entry index used for `hash` (its low bits).
    #[inline(always)]
    pub fn index(&self, hash: u32) -> usize {
        (hash & self.mask) as usize
    }

    /// Queue for `hash`.
    #[inline(always)]
    pub fn queue(&self, hash: u32) -> u16 {
        // The mask keeps the index in range; `get` avoids a panic path anyway.
        self.table.get(self.index(hash)).copied().unwrap_or(0)
    }

    /// Points entry `idx` at `queue` (RSS++ / Dyssect rebalancing).
    pub fn set(&mut self, idx: usize, queue: u16) -> Result<(), RetaError> {
        let e = self.table.get_mut(idx).ok_or(RetaError::IndexOutOfRange(idx))?;
        *e = queue;
        Ok(())
    }

    /// All entries.
    pub fn entries(&self) -> &[u16] {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    /// Keyed keys: a function of the secret; symmetric ones keep both directions on one queue; different
    /// secrets give different keys.
    #[test]
    fn keyed_keys_follow_the_secret_and_keep_symmetry() {
        use super::*;
        let (a, b) = (keyed_key(1, false, 9), keyed_key(2, false, 9));
        assert_eq!(a, keyed_key(1, false, 9));
        assert_ne!(a, b);
        let s = keyed_key(3, true, 9);
        assert!(s.chunks(2).all(|c| c == &s[..2]), "period 16 bits: {s:02x?}");
        let t = Toeplitz::new(&s);
        for i in 0..50u16 {
            let f = FiveTuple::new(
                Ipv4Addr::new(10, 0, (i >> 8) as u8, i as u8).into(),
                Ipv4Addr::new(192, 0, 2, 7).into(),
                1000 + i,
                80,
                6,
            )
            .unwrap();
            let r = FiveTuple::new(f.dst_ip(), f.src_ip(), f.dst_port(), f.src_port(), 6).unwrap();
            assert_eq!(t.hash_five_tuple(&f), t.hash_five_tuple(&r));
        }
    }

    use super::*;

    #[test]
    fn reta_errors() {
        assert_eq!(Reta::round_robin(0, 4), Err(RetaError::ZeroSize));
        assert_eq!(Reta::round_robin(100, 4), Err(RetaError::NotPowerOfTwo(100)));
        assert_eq!(Reta::round_robin(128, 0), Err(RetaError::ZeroQueues));
        assert_eq!(Reta::round_robin(1 << 17, 1), Err(RetaError::TooLarge(1 << 17)));
        assert_eq!(Reta::from_entries(vec![0; 3]), Err(RetaError::NotPowerOfTwo(3)));
        let mut r = Reta::round_robin(128, 3).unwrap();
        assert_eq!(r.set(128, 1), Err(RetaError::IndexOutOfRange(128)));
        assert!(RetaError::NotPowerOfTwo(100).to_string().contains("100"));
        r.set(5, 7).unwrap();
        assert_eq!(r.queue(5 + 128 * 9), 7);
    }

    #[test]
    fn reta_round_robin_low_bits() {
        let r = Reta::round_robin(512, 4).unwrap();
        assert_eq!(r.len(), 512);
        assert!(!r.is_empty());
        assert_eq!(r.entries().iter().filter(|&&q| q == 3).count(), 128);
        for h in [0u32, 1, 2, 3, 511, 512, 0xffff_ffff] {
            assert_eq!(r.queue(h), ((h & 511) % 4) as u16);
        }
    }

    #[test]
    fn symmetric_key_pattern() {
        assert_eq!(&SYMMETRIC_KEY[..4], &[0x6d, 0x5a, 0x6d, 0x5a]);
        assert_eq!(SYMMETRIC_KEY[39], 0x5a);
    }

    #[test]
    fn tables_match_reference_on_every_position() {
        let t = Toeplitz::new(&MICROSOFT_KEY);
        let mut input = [0u8; MAX_INPUT_LEN];
        for (i, b) in input.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(73).wrapping_add(11);
        }
        for len in 0..=MAX_INPUT_LEN {
            assert_eq!(t.hash(&input[..len]), reference_hash(&MICROSOFT_KEY, &input[..len]));
        }
        // Longer inputs: trailing bytes are ignored by both.
        let long = [0xffu8; 40];
        assert_eq!(t.hash(&long), reference_hash(&MICROSOFT_KEY, &long[..MAX_INPUT_LEN]));
    }
}

//! Table hash for fixed-size flow keys: seeded CRC32C (Castagnoli).
//!
//! This module owns the hash that flow tables use to pick buckets. It is built
//! on the SSE4.2 `crc32` instruction (one 8-byte word per instruction, 3 cycles
//! latency, 1 per cycle throughput), with a table-driven software fallback that
//! gives bit-identical results on targets without SSE4.2.
//!
//! * [`hash_key`] / [`HashableKey::hash32`]: 32-bit CRC32C of the key bytes,
//!   starting from `seed`. A 16-byte key costs two `crc32` instructions, a
//!   40-byte key five.
//! * [`hash_key64`] / [`HashableKey::hash64`]: 64 bits for tables that want
//!   index and tag bits. The low half is exactly [`hash_key`]; the high half is a
//!   second CRC lane over the words after a seeded multiply, so it is not an
//!   affine function of the low half (two plain CRC lanes with different seeds
//!   would be: `crc(s1, x) ^ crc(s2, x)` depends only on the seeds and length).
//! * [`hash_symmetric`]: equal for both directions of a connection.
//!
//! CRC is linear: the seed changes every value but not *which* keys collide in
//! the 32-bit hash. Tables that rehash on overload (cuckoo) should take their
//! second function from the high half of [`hash_key64`], whose collisions do
//! depend on the seed.

use crate::flow::FiveTuple;

/// Reflected CRC32C (Castagnoli) polynomial, as used by SSE4.2 `crc32`.
const CRC32C_POLY: u32 = 0x82F6_3B78;

/// Byte-wise lookup table for the software CRC32C.
static CRC32C_TABLE: [u32; 256] = build_crc_table();

const fn build_crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ CRC32C_POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// Software CRC32C update with one byte (no pre/post inversion, like `crc32`).
#[inline]
pub fn crc32c_u8_soft(crc: u32, byte: u8) -> u32 {
    CRC32C_TABLE[((crc ^ byte as u32) & 0xff) as usize] ^ (crc >> 8)
}

/// Software CRC32C update with a little-endian 32-bit word.
#[inline]
pub fn crc32c_u32_soft(crc: u32, v: u32) -> u32 {
    v.to_le_bytes().iter().fold(crc, |c, &b| crc32c_u8_soft(c, b))
}

/// Software CRC32C update with a little-endian 64-bit word.
#[inline]
pub fn crc32c_u64_soft(crc: u32, v: u64) -> u32 {
    v.to_le_bytes().iter().fold(crc, |c, &b| crc32c_u8_soft(c, b))
}

/// Hardware CRC32C through the SSE4.2 `crc32` instruction.
#[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
pub mod hw {
    use core::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    /// `crc32` with one byte.
    #[inline(always)]
    pub fn crc32c_u8(crc: u32, v: u8) -> u32 {
        // SAFETY: this module is compiled only when `sse4.2` is enabled for the
        // whole crate at compile time, so every CPU this binary may run on
        // supports the instruction; it has no memory operands.
        unsafe { _mm_crc32_u8(crc, v) }
    }

    /// `crc32` with a 32-bit word.
    #[inline(always)]
    pub fn crc32c_u32(crc: u32, v: u32) -> u32 {
        // SAFETY: as in `crc32c_u8`: sse4.2 is statically enabled; register-only.
        unsafe { _mm_crc32_u32(crc, v) }
    }

    /// `crc32` with a 64-bit word.
    #[inline(always)]
    pub fn crc32c_u64(crc: u32, v: u64) -> u32 {
        // SAFETY: as in `crc32c_u8`: sse4.2 is statically enabled; register-only.
        // The instruction zero-extends its 32-bit result, so the cast is lossless.
        unsafe { _mm_crc32_u64(crc as u64, v) as u32 }
    }
}

/// CRC32C update with one byte (hardware when available).
#[inline(always)]
pub fn crc32c_u8(crc: u32, v: u8) -> u32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
    {
        hw::crc32c_u8(crc, v)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.2")))]
    {
        crc32c_u8_soft(crc, v)
    }
}

/// CRC32C update with a little-endian 32-bit word (hardware when available).
#[inline(always)]
pub fn crc32c_u32(crc: u32, v: u32) -> u32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
    {
        hw::crc32c_u32(crc, v)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.2")))]
    {
        crc32c_u32_soft(crc, v)
    }
}

/// CRC32C update with a little-endian 64-bit word (hardware when available).
#[inline(always)]
pub fn crc32c_u64(crc: u32, v: u64) -> u32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
    {
        hw::crc32c_u64(crc, v)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.2")))]
    {
        crc32c_u64_soft(crc, v)
    }
}

/// True when [`crc32c_u64`] and friends use the SSE4.2 instruction.
pub const HW_CRC32C: bool = cfg!(all(target_arch = "x86_64", target_feature = "sse4.2"));

#[inline(always)]
fn word(b: &[u8], i: usize) -> u64 {
    // Callers pass constant or chunk-bounded offsets, so this compiles to one load.
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// CRC32C of `data` starting from `seed`, 8 bytes at a time, then 4, then 1.
/// Fed the same bytes, this equals byte-by-byte CRC32C (no inversions).
#[inline(always)]
pub fn crc32c_bytes(seed: u32, data: &[u8]) -> u32 {
    let mut crc = seed;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        crc = crc32c_u64(crc, word(c, 0));
    }
    let mut rest = chunks.remainder();
    if let Some((four, tail)) = rest.split_first_chunk::<4>() {
        crc = crc32c_u32(crc, u32::from_le_bytes(*four));
        rest = tail;
    }
    for &b in rest {
        crc = crc32c_u8(crc, b);
    }
    crc
}

/// Software-only [`crc32c_bytes`] (reference for the fallback test).
pub fn crc32c_bytes_soft(seed: u32, data: &[u8]) -> u32 {
    data.iter().fold(seed, |c, &b| crc32c_u8_soft(c, b))
}

/// Multiplier of the second lane (2^64 / golden ratio, odd so it is a bijection).
const LANE_B_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// Distinguishes lane B's starting value from lane A's.
const LANE_B_SEED: u32 = 0x5BD1_E995;

#[inline(always)]
fn lane_b_spread(seed: u32) -> u64 {
    ((seed as u64) << 32 | seed as u64) ^ 0xC2B2_AE3D_27D4_EB4F
}

#[inline(always)]
fn lane_b_word(w: u64, spread: u64) -> u64 {
    // XOR-then-multiply is not GF(2)-linear, so lane B collides on other key
    // pairs than lane A and its collisions move with the seed.
    (w ^ spread).wrapping_mul(LANE_B_MUL)
}

/// 64-bit hash of arbitrary bytes: low half = [`crc32c_bytes`], high half = lane B.
#[inline(always)]
pub fn hash_bytes64(data: &[u8], seed: u32) -> u64 {
    let spread = lane_b_spread(seed);
    let mut a = seed;
    let mut b = seed ^ LANE_B_SEED;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = word(c, 0);
        a = crc32c_u64(a, w);
        b = crc32c_u64(b, lane_b_word(w, spread));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        // Lane A must equal crc32c_bytes; lane B may pad (length is fixed per key type).
        a = crc32c_bytes(a, rest);
        b = crc32c_u64(b, lane_b_word(u64::from_le_bytes(tail), spread));
    }
    (b as u64) << 32 | a as u64
}

/// 32-bit table hash of a 16-byte key (two `crc32` instructions).
#[inline(always)]
pub fn hash16(key: &[u8; 16], seed: u32) -> u32 {
    crc32c_u64(crc32c_u64(seed, word(key, 0)), word(key, 8))
}

/// 32-bit table hash of a 40-byte key (five `crc32` instructions).
#[inline(always)]
pub fn hash40(key: &[u8; 40], seed: u32) -> u32 {
    let mut crc = seed;
    for i in 0..5 {
        crc = crc32c_u64(crc, word(key, i * 8));
    }
    crc
}

/// 64-bit hash of a 16-byte key; low half equals [`hash16`].
#[inline(always)]
pub fn hash16_64(key: &[u8; 16], seed: u32) -> u64 {
    hash_bytes64(key, seed)
}

/// 64-bit hash of a 40-byte key; low half equals [`hash40`].
#[inline(always)]
pub fn hash40_64(key: &[u8; 40], seed: u32) -> u64 {
    hash_bytes64(key, seed)
}

/// A fixed-size key that flow tables can hash.
///
/// Implementors expose their canonical byte representation (padding zeroed, so
/// equal keys have equal bytes); the default methods hash those bytes.
pub trait HashableKey {
    /// The key's bytes, identical for equal keys.
    fn key_bytes(&self) -> &[u8];

    /// 32-bit table hash (CRC32C from `seed`).
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        crc32c_bytes(seed, self.key_bytes())
    }

    /// 64-bit table hash; the low 32 bits equal [`HashableKey::hash32`].
    #[inline(always)]
    fn hash64(&self, seed: u32) -> u64 {
        hash_bytes64(self.key_bytes(), seed)
    }
}

/// 32-bit table hash of `key` with `seed`.
#[inline(always)]
pub fn hash_key<K: HashableKey + ?Sized>(key: &K, seed: u32) -> u32 {
    key.hash32(seed)
}

/// 64-bit table hash of `key` with `seed` (low half = [`hash_key`]).
#[inline(always)]
pub fn hash_key64<K: HashableKey + ?Sized>(key: &K, seed: u32) -> u64 {
    key.hash64(seed)
}

/// Direction-independent hash: `hash_symmetric(t) == hash_symmetric(t.reversed())`.
/// Hashes [`FiveTuple::canonical`], so it is also a valid hash for tables keyed
/// by canonical tuples.
#[inline(always)]
pub fn hash_symmetric(tuple: &FiveTuple, seed: u32) -> u32 {
    hash_key(&tuple.canonical(), seed)
}

/// 64-bit variant of [`hash_symmetric`].
#[inline(always)]
pub fn hash_symmetric64(tuple: &FiveTuple, seed: u32) -> u64 {
    hash_key64(&tuple.canonical(), seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // Standard CRC-32C check: init !0, final xor !0, input "123456789".
        let data = b"123456789";
        assert_eq!(!crc32c_bytes_soft(!0, data), 0xE306_9283);
        assert_eq!(!crc32c_bytes(!0, data), 0xE306_9283);
    }

    #[test]
    fn word_forms_match_bytewise() {
        let v = 0x0123_4567_89AB_CDEFu64;
        let bytes = v.to_le_bytes();
        assert_eq!(crc32c_u64(7, v), crc32c_bytes_soft(7, &bytes));
        assert_eq!(crc32c_u64_soft(7, v), crc32c_bytes_soft(7, &bytes));
        assert_eq!(crc32c_u32(7, v as u32), crc32c_bytes_soft(7, &bytes[..4]));
        assert_eq!(crc32c_u32_soft(7, v as u32), crc32c_bytes_soft(7, &bytes[..4]));
    }

    #[test]
    fn fixed_size_forms_match_generic() {
        let k16: [u8; 16] = core::array::from_fn(|i| (i * 37 + 1) as u8);
        let k40: [u8; 40] = core::array::from_fn(|i| (i * 91 + 5) as u8);
        assert_eq!(hash16(&k16, 9), crc32c_bytes(9, &k16));
        assert_eq!(hash40(&k40, 9), crc32c_bytes(9, &k40));
        assert_eq!(hash16_64(&k16, 9) as u32, hash16(&k16, 9));
        assert_eq!(hash40_64(&k40, 9) as u32, hash40(&k40, 9));
        // Odd lengths go through the 4-byte and 1-byte tails.
        for len in 0..40 {
            assert_eq!(crc32c_bytes(3, &k40[..len]), crc32c_bytes_soft(3, &k40[..len]), "len {len}");
            assert_eq!(hash_bytes64(&k40[..len], 3) as u32, crc32c_bytes_soft(3, &k40[..len]));
        }
    }

    #[test]
    fn lane_b_is_not_affine_in_lane_a() {
        // For plain CRC, h(x) ^ h(y) ^ h(z) ^ h(x^y^z) == 0 for equal-length inputs.
        // Lane A must show that (it is CRC), lane B must not (seeded multiply).
        let x = [1u8; 16];
        let y: [u8; 16] = core::array::from_fn(|i| i as u8);
        let z: [u8; 16] = core::array::from_fn(|i| (i * 13 + 7) as u8);
        let xyz: [u8; 16] = core::array::from_fn(|i| x[i] ^ y[i] ^ z[i]);
        let h = |k: &[u8; 16]| hash16_64(k, 0);
        let combo = h(&x) ^ h(&y) ^ h(&z) ^ h(&xyz);
        assert_eq!(combo as u32, 0, "lane A is CRC, hence linear");
        assert_ne!(combo >> 32, 0, "lane B must not be linear");
    }
}

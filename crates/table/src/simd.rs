//! Lane masks: tag comparison over one bucket's 8 tags, and the zero lanes of 8
//! 32-bit words. SSE2 on x86_64 (always available there), a portable loop elsewhere;
//! both return the same 8-bit mask (bit i = lane i matches).

use crate::cuckoo::SLOTS;

/// Bit i set iff `tags[i] == tag`.
#[inline(always)]
pub fn match_tags(tags: &[u16; SLOTS], tag: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        match_tags_sse2(tags, tag)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        match_tags_portable(tags, tag)
    }
}

/// SSE2 version: one 16-byte compare, then pack the 16-bit lanes to bytes so movemask yields one bit per slot.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn match_tags_sse2(tags: &[u16; SLOTS], tag: u16) -> u32 {
    use core::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86_64 baseline; `tags` is 16 readable bytes and `loadu` has no alignment requirement.
    unsafe {
        let v = _mm_loadu_si128(tags.as_ptr().cast::<__m128i>());
        let eq = _mm_cmpeq_epi16(v, _mm_set1_epi16(tag as i16));
        _mm_movemask_epi8(_mm_packs_epi16(eq, _mm_setzero_si128())) as u32
    }
}

/// Portable version with results identical to the SIMD one.
#[inline]
pub fn match_tags_portable(tags: &[u16; SLOTS], tag: u16) -> u32 {
    let mut m = 0u32;
    for (i, t) in tags.iter().enumerate() {
        m |= u32::from(*t == tag) << i;
    }
    m
}

/// Bit i set iff `words[i] == 0` (8 lanes): the last step of an 8-lane
/// match whose lanes OR their mismatches into one word each (the UPF's
/// compiled PDR classifier). SSE2 on x86_64, the portable loop elsewhere.
#[inline(always)]
pub fn zero_lanes_u32x8(words: &[u32; 8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86_64 baseline; `words` is 32 readable bytes and `loadu` has no alignment requirement.
        unsafe {
            let lo = _mm_loadu_si128(words.as_ptr().cast::<__m128i>());
            let hi = _mm_loadu_si128(words.as_ptr().add(4).cast::<__m128i>());
            let z = _mm_setzero_si128();
            let eq = _mm_packs_epi32(_mm_cmpeq_epi32(lo, z), _mm_cmpeq_epi32(hi, z));
            _mm_movemask_epi8(_mm_packs_epi16(eq, z)) as u32
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        zero_lanes_u32x8_portable(words)
    }
}

/// Portable version of [`zero_lanes_u32x8`] (identical results).
#[inline]
pub fn zero_lanes_u32x8_portable(words: &[u32; 8]) -> u32 {
    let mut m = 0u32;
    for (i, w) in words.iter().enumerate() {
        m |= u32::from(*w == 0) << i;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_portable_agree() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..if cfg!(miri) { 1_000 } else { 20_000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct values so matches (incl. the sign bit and 0) are frequent.
            let mut tags = [0u16; SLOTS];
            for (i, t) in tags.iter_mut().enumerate() {
                *t = [0u16, 1, 0x8000, 0xFFFF][((x >> (2 * i)) & 3) as usize];
            }
            let tag = [0u16, 1, 0x8000, 0xFFFF][((x >> 40) & 3) as usize];
            let m = match_tags(&tags, tag);
            assert_eq!(m, match_tags_portable(&tags, tag));
            assert_eq!(m.count_ones() as usize, tags.iter().filter(|t| **t == tag).count());
        }
    }

    #[test]
    fn zero_lanes_simd_and_portable_agree() {
        let vals = [0u32, 1, 0x8000_0000, 0xffff_ffff, 0x0001_0000];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..if cfg!(miri) { 500 } else { 20_000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut w = [0u32; 8];
            for (i, v) in w.iter_mut().enumerate() {
                *v = vals[((x >> (3 * i)) % 5) as usize];
            }
            let m = zero_lanes_u32x8(&w);
            assert_eq!(m, zero_lanes_u32x8_portable(&w));
            assert_eq!(m.count_ones() as usize, w.iter().filter(|v| **v == 0).count());
        }
    }
}

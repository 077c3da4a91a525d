//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
//! Software Network Load Balancer", NSDI 2016, section 3.4): a lookup table
//! of a prime size `M` in which every backend owns about `M / N` entries
//! (weighted: in proportion to its weight), filled so that a change of the
//! backend set moves few entries between the backends that stay.
//!
//! Each backend has a preference list, the permutation `(offset + j * skip)
//! mod M` of the table's entries, with `offset = h1(name) mod M` and `skip =
//! h2(name) mod (M - 1) + 1` (`M` prime: every skip visits every entry). The
//! table is filled in rounds: in each round every backend takes, once per
//! unit of weight, its next preferred entry that is still empty. `h1` and
//! `h2` are 64-bit FNV-1a over the backend's name (its address as text) from
//! two different offset bases, so any implementation of this documented rule
//! builds the same table (`crates/nf/tests/models/maglev.py` does).
//!
//! Building costs O(M log M) at most and happens off the data path (at start
//! and when the backend set changes); a lookup is one table read.

/// An entry no backend owns (every weight is 0).
pub const NONE: u32 = u32::MAX;

/// The FNV-1a offset basis of `h1`.
const H1_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// The offset basis of `h2` (the halves of `h1`'s swapped).
const H2_BASIS: u64 = 0x8422_2325_cbf2_9ce4;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(basis: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(basis, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// The smallest prime `>= n` (and >= 2).
pub fn next_prime(n: usize) -> usize {
    let is_prime = |p: usize| p >= 2 && (2..).take_while(|d| d * d <= p).all(|d| !p.is_multiple_of(d));
    (n.max(2)..).find(|&p| is_prime(p)).unwrap_or(2)
}

/// The table size for `backends` backends: the smallest prime at least 100 times
/// their number (`M >> N` bounds the imbalance) and at least 65,537 (the paper's
/// size). Smaller tables disrupt more: removing one of 10 backends moves at most
/// 10.3% of the entries at 65,537 (the ideal is 10%), 11.3% at 4,099 and 12.6% at
/// 1,009 (worst over which one is removed; `tests/models/maglev.py`).
pub fn table_size(backends: usize) -> usize {
    next_prime(backends.saturating_mul(100).max(MIN_TABLE))
}

/// The smallest table (a prime).
pub const MIN_TABLE: usize = 65_537;

/// `(offset, skip)` of a backend named `name` in a table of prime size `m`.
pub fn offset_skip(name: &[u8], m: usize) -> (usize, usize) {
    let m64 = m as u64;
    let offset = fnv1a(H1_BASIS, name) % m64;
    let skip = fnv1a(H2_BASIS, name) % (m64 - 1).max(1) + 1;
    (offset as usize, skip as usize)
}

/// The lookup table of prime size `m` for `backends` (name, weight): entry `e` holds the
/// index of its backend in `backends`, or [`NONE`] when every weight is 0.
pub fn populate(backends: &[(&[u8], u32)], m: usize) -> Vec<u32> {
    let mut table = vec![NONE; m];
    if m == 0 || backends.iter().all(|&(_, w)| w == 0) {
        return table;
    }
    let perm: Vec<(usize, usize)> = backends.iter().map(|&(n, _)| offset_skip(n, m)).collect();
    let mut next = vec![0usize; backends.len()];
    let mut filled = 0;
    'rounds: loop {
        for (i, &(_, weight)) in backends.iter().enumerate() {
            for _ in 0..weight {
                let (offset, skip) = perm[i];
                // The next entry of i's preference list still empty (one exists: filled < m).
                let mut e = (offset + next[i] * skip) % m;
                while table[e] != NONE {
                    next[i] += 1;
                    e = (offset + next[i] * skip) % m;
                }
                table[e] = i as u32;
                next[i] += 1;
                filled += 1;
                if filled == m {
                    break 'rounds;
                }
            }
        }
    }
    table
}

/// The entry of `table` a 64-bit flow hash selects (multiply-shift: no division).
#[inline]
pub fn entry(hash: u64, m: usize) -> usize {
    ((u128::from(hash) * m as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.10.0.{}", i + 1)).collect()
    }

    fn table_of(names: &[String], weights: &[u32], m: usize) -> Vec<u32> {
        let b: Vec<(&[u8], u32)> = names.iter().zip(weights).map(|(n, &w)| (n.as_bytes(), w)).collect();
        populate(&b, m)
    }

    #[test]
    fn primes_and_sizes() {
        assert_eq!(next_prime(0), 2);
        assert_eq!(next_prime(100), 101);
        assert_eq!(next_prime(1000), 1009);
        assert_eq!(table_size(10), 65_537);
        assert_eq!(table_size(0), 65_537);
        assert_eq!(table_size(1000), 100_003);
    }

    #[test]
    fn every_backend_owns_about_its_share() {
        let n = names(10);
        let m = table_size(10);
        let t = table_of(&n, &[1; 10], m);
        let mut per = [0usize; 10];
        for &b in &t {
            per[b as usize] += 1;
        }
        // Round-robin filling: shares differ by at most one entry per backend and round's end.
        assert!(per.iter().all(|&c| c == m / 10 || c == m / 10 + 1), "{per:?}");
    }

    #[test]
    fn weights_give_proportional_shares() {
        let n = names(3);
        let m = 3001;
        let t = table_of(&n, &[1, 2, 0], m);
        let count = |b: u32| t.iter().filter(|&&x| x == b).count();
        assert_eq!(count(2), 0, "weight 0 owns nothing");
        assert!((count(1) as i64 - 2 * count(0) as i64).abs() <= 2, "{} {}", count(0), count(1));
        assert!(table_of(&n, &[0, 0, 0], 101).iter().all(|&x| x == NONE));
    }

    #[test]
    fn removing_one_of_ten_moves_at_most_1_1_times_the_ideal() {
        let n = names(10);
        let m = table_size(10);
        let before = table_of(&n, &[1; 10], m);
        for r in 0..10u32 {
            // Backend r removed: the others keep their names, not their indices in the list.
            let kept: Vec<String> =
                n.iter().enumerate().filter(|&(i, _)| i != r as usize).map(|(_, s)| s.clone()).collect();
            let after = table_of(&kept, &[1; 9], m);
            let remap = |b: u32| if b >= r { b + 1 } else { b };
            let moved = before.iter().zip(&after).filter(|&(&b, &a)| b != remap(a)).count();
            let frac = moved as f64 / m as f64;
            assert!(frac <= 0.11, "removing {r}: moved {frac:.4} of the entries (ideal 0.10)");
            assert!(frac >= 0.099, "at least the removed backend's own entries: {frac:.4}");
        }
    }

    #[test]
    fn entries_scale_hashes_over_the_table() {
        assert_eq!(entry(0, 101), 0);
        assert_eq!(entry(u64::MAX, 101), 100);
        assert_eq!(entry(1 << 63, 101), 50);
    }
}

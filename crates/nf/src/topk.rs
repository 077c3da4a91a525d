//! A bounded "who is doing this" summary for attribution (issue 33 item 4):
//! the Space-Saving algorithm over 32-bit keys (IPv4 addresses) with
//! [`TOPK_SLOTS`] counters, no allocation after construction.
//!
//! Every key whose true count exceeds `total / TOPK_SLOTS` is held; a held
//! key's count overestimates its true count by at most the count of the
//! entry it replaced (`error`), so `count - error` is a lower bound. A new
//! key takes the smallest counter's place: O(slots) per new key, O(slots) per
//! known key in the worst case — paid only on the events counted (nat's
//! refusals), never per packet.

use serde_json::{json, Value};

/// Counters kept.
pub const TOPK_SLOTS: usize = 16;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    key: u32,
    count: u64,
    error: u64,
}

/// The summary.
#[derive(Clone, Debug, Default)]
pub struct TopK {
    slots: [Slot; TOPK_SLOTS],
    used: usize,
    total: u64,
}

impl TopK {
    /// Counts one event of `key`.
    #[inline]
    pub fn add(&mut self, key: u32) {
        self.total += 1;
        let used = &mut self.slots[..self.used];
        if let Some(s) = used.iter_mut().find(|s| s.key == key) {
            s.count += 1;
            return;
        }
        if self.used < TOPK_SLOTS {
            self.slots[self.used] = Slot { key, count: 1, error: 0 };
            self.used += 1;
            return;
        }
        if let Some(min) = self.slots.iter_mut().min_by_key(|s| s.count) {
            *min = Slot { key, count: min.count + 1, error: min.count };
        }
    }

    /// Events counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The held keys in no particular order: (key, count, error). No allocation.
    pub fn entries(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.slots[..self.used].iter().map(|s| (s.key, s.count, s.error))
    }

    /// The held keys, largest count first (ties: smaller key first): (key, count, error).
    pub fn top(&self) -> Vec<(u32, u64, u64)> {
        let mut v: Vec<(u32, u64, u64)> = self.slots[..self.used].iter().map(|s| (s.key, s.count, s.error)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// `[{name: "a.b.c.d", what: n}, ...]`: the first `n` of `(address, count)` pairs, largest count first.
pub fn rows_v4(pairs: &[(u32, u64)], name: &str, what: &str, n: usize) -> Value {
    let mut v = pairs.to_vec();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    Value::Array(
        v.into_iter().map(|(a, c)| json!({ name: std::net::Ipv4Addr::from(a).to_string(), what: c })).collect(),
    )
}

/// Merges two cores' `rows_v4` lists: sums by address, keeps the first `n`.
pub fn merge_rows_v4(into: &mut Value, other: &Value, name: &str, what: &str, n: usize) {
    let mut acc: Vec<(u32, u64)> = Vec::new();
    for v in [&*into, other] {
        for r in v.as_array().into_iter().flatten() {
            let Some(a) = r[name].as_str().and_then(|s| s.parse::<std::net::Ipv4Addr>().ok()) else { continue };
            let c = r[what].as_u64().unwrap_or(0);
            match acc.iter_mut().find(|x| x.0 == u32::from(a)) {
                Some(x) => x.1 += c,
                None => acc.push((u32::from(a), c)),
            }
        }
    }
    *into = rows_v4(&acc, name, what, n);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heavy keys among many light ones are held, with counts no lower than the truth and no higher than
    /// truth + error (a small model: exact counts in a map).
    #[test]
    fn heavy_keys_are_held_with_bounded_counts() {
        let mut t = TopK::default();
        let mut truth = std::collections::HashMap::<u32, u64>::new();
        let mut x = 7u64;
        for i in 0..20_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Keys 1..=3 take a third of the events; the rest spread over 5,000 keys.
            let k = if i % 3 == 0 { 1 + (i / 3 % 3) as u32 } else { 100 + (x >> 33) as u32 % 5000 };
            t.add(k);
            *truth.entry(k).or_default() += 1;
        }
        let top = t.top();
        assert_eq!(t.total(), 20_000);
        for k in 1..=3u32 {
            let (_, c, e) = *top.iter().find(|r| r.0 == k).unwrap_or_else(|| panic!("{k} held: {top:?}"));
            assert!(c >= truth[&k] && c - e <= truth[&k], "{k}: {c} (err {e}) vs {}", truth[&k]);
        }
        assert!(top[..3].iter().all(|r| r.0 <= 3), "{top:?}");
    }

    #[test]
    fn rows_merge_by_address() {
        let mut a = rows_v4(&[(0x0a00_0001, 5), (0x0a00_0002, 1)], "host", "n", 10);
        let b = rows_v4(&[(0x0a00_0002, 7)], "host", "n", 10);
        merge_rows_v4(&mut a, &b, "host", "n", 1);
        assert_eq!(a, json!([{ "host": "10.0.0.2", "n": 8 }]));
    }
}

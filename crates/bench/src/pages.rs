//! Page backing of benchmark memory: how much of it sits on 2 MiB pages.
//!
//! Owns [`PageBacking`] and the readers of `/proc/self/smaps` behind it. A random access over hundreds of MiB costs
//! a page walk per access on 4 KiB pages and almost none on 2 MiB pages, so a row measured on a table the kernel has
//! not (yet) backed with hugepages is not comparable with one that is: every benchmark row reports the backing of
//! the memory it measured. Counted as 2 MiB-backed: transparent hugepages (`AnonHugePages`) and hugetlb pages
//! (`Private_Hugetlb` + `Shared_Hugetlb`); the total is what is resident (`Rss`) plus the hugetlb pages.

use serde::{Deserialize, Serialize};

/// Resident bytes of some memory and how many of them are on 2 MiB pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageBacking {
    /// Resident bytes (including hugetlb pages).
    pub resident: u64,
    /// Of which on 2 MiB pages.
    pub huge: u64,
}

impl PageBacking {
    /// Fraction on 2 MiB pages; `None` when nothing is resident (or smaps is unavailable).
    pub fn fraction(&self) -> Option<f64> {
        (self.resident > 0).then(|| self.huge as f64 / self.resident as f64)
    }

    fn add(&mut self, v: &Vma) {
        self.resident += v.rss + v.hugetlb;
        self.huge += v.anon_huge + v.hugetlb;
    }
}

/// One mapping of /proc/self/smaps, with the fields used here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Vma {
    start: usize,
    end: usize,
    rss: u64,
    anon_huge: u64,
    hugetlb: u64,
    /// `MADV_HUGEPAGE` advised (`hg`) or hugetlb (`ht`).
    advised: bool,
}

fn parse(text: &str) -> Vec<Vma> {
    let kb = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().map_or(0, |k| k * 1024);
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        // Mapping headers look like "7f12a000-7f12c000 rw-p ..."; field lines like "Rss:  4 kB".
        let head = line
            .split_once(' ')
            .and_then(|(range, _)| range.split_once('-'))
            .and_then(|(lo, hi)| Some((usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?)));
        if let Some((start, end)) = head {
            out.push(Vma { start, end, ..Vma::default() });
            continue;
        }
        let Some(v) = out.last_mut() else { continue };
        if let Some(x) = line.strip_prefix("Rss:") {
            v.rss = kb(x);
        } else if let Some(x) = line.strip_prefix("AnonHugePages:") {
            v.anon_huge = kb(x);
        } else if let Some(x) = line.strip_prefix("Private_Hugetlb:").or_else(|| line.strip_prefix("Shared_Hugetlb:")) {
            v.hugetlb += kb(x);
        } else if let Some(x) = line.strip_prefix("VmFlags:") {
            v.advised = x.split_whitespace().any(|f| f == "hg" || f == "ht");
        }
    }
    out
}

fn vmas() -> Vec<Vma> {
    std::fs::read_to_string("/proc/self/smaps").map(|t| parse(&t)).unwrap_or_default()
}

/// Backing of the mappings that hold any byte of `spans` (start, length). The kernel merges adjacent mappings with
/// the same flags, so a span's mapping may be larger than the span; each mapping counts once.
pub fn of_spans(spans: &[(usize, usize)]) -> PageBacking {
    let mut b = PageBacking::default();
    for v in vmas() {
        if spans.iter().any(|&(s, l)| s < v.end && v.start < s.saturating_add(l)) {
            b.add(&v);
        }
    }
    b
}

/// Backing of the mapping that holds `addr` (e.g. the address of a value inside a heap-allocated table).
pub fn of_addr(addr: usize) -> PageBacking {
    of_spans(&[(addr, 1)])
}

/// Backing of every mapping of the process that asked for hugepages (`MADV_HUGEPAGE` or hugetlb): in the
/// benchmarks, the flow tables' memory.
pub fn of_advised() -> PageBacking {
    let mut b = PageBacking::default();
    for v in vmas().iter().filter(|v| v.advised) {
        b.add(v);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
7f0000000000-7f0040000000 rw-p 00000000 00:00 0
Size:            1048576 kB
Rss:              524288 kB
AnonHugePages:    262144 kB
Private_Hugetlb:       0 kB
VmFlags: rd wr mr mw me ac sd hg
7f0040000000-7f0040200000 rw-p 00000000 00:00 0
Rss:                   0 kB
AnonHugePages:         0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:    2048 kB
VmFlags: rd wr mr mw me de ht sd
55d000000000-55d000100000 rw-p 00000000 00:00 0 [heap]
Rss:                1024 kB
AnonHugePages:         0 kB
VmFlags: rd wr mr mw me ac sd
";

    #[test]
    fn parses_thp_and_hugetlb_mappings() {
        let v = parse(SAMPLE);
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].rss, v[0].anon_huge, v[0].advised), (512 << 20, 256 << 20, true));
        assert_eq!((v[1].hugetlb, v[1].advised), (2 << 20, true));
        assert!(!v[2].advised);
        let mut b = PageBacking::default();
        for m in v.iter().filter(|m| m.advised) {
            b.add(m);
        }
        assert_eq!(b, PageBacking { resident: (512 << 20) + (2 << 20), huge: (256 << 20) + (2 << 20) });
        assert_eq!(PageBacking::default().fraction(), None);
    }

    #[test]
    fn live_mapping_is_found() {
        let v = vec![7u8; 8 << 20];
        let b = of_addr(v.as_ptr() as usize);
        // Touched memory is resident; whether it is on hugepages depends on the kernel's THP mode.
        assert!(b.resident >= 8 << 20, "{b:?}");
        assert!(b.fraction().is_some_and(|f| (0.0..=1.0).contains(&f)));
    }
}

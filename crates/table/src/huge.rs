//! Transparent-hugepage hints for long-lived arrays that live outside the
//! flow tables (an NF's compiled rule set, per-rule counters): randomly
//! indexed arrays of tens or hundreds of MiB on 4 KiB pages miss the TLB
//! on nearly every access, which costs a (nested, under KVM) page walk.

/// 2 MiB: the transparent hugepage size on x86-64.
const HUGE: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside `s` with
/// transparent hugepages (`MADV_HUGEPAGE`) and to collapse them now
/// (`MADV_COLLAPSE`, Linux 6.1+). A hint: the contents never change, and
/// failure (an older kernel, no THP, a small array) only costs TLB misses.
pub fn advise_hugepages<T>(s: &[T]) {
    let start = s.as_ptr() as usize;
    let end = start + std::mem::size_of_val(s);
    let (a, b) = (start.next_multiple_of(HUGE), end & !(HUGE - 1));
    if b <= a || cfg!(miri) {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: [a, b) lies inside the allocation backing `s`, which the borrow
    // keeps alive for the call; MADV_HUGEPAGE and MADV_COLLAPSE change only
    // the size of the pages backing the range, never its contents, mapping or
    // permissions, so no reference into it is invalidated.
    unsafe {
        libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE);
        libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_COLLAPSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_leave_contents_alone() {
        let v: Vec<u64> = (0..(3 << 20) / 8).collect();
        advise_hugepages(&v);
        advise_hugepages(&v[..3]);
        advise_hugepages::<u8>(&[]);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}

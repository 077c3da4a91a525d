//! What several fuzz targets share: making a parsed chain safe to build inside a fuzzer
//! ([`sanitize_chain`]: no file parameters, small allocations) and the record format the
//! engine-level targets read frames in ([`for_each_record`]), which besides raw frames can
//! synthesise well-formed Ethernet/IP/TCP|UDP frames from a few bytes so that the fuzzer
//! reaches many distinct flows (full tables) cheaply.

use flowplane_engine::spec::ChainSpec;

pub mod executor;

/// Most NFs a fuzzed chain may have: enough for every layout and group-limit path, small
/// enough that building the chain stays fast.
pub const MAX_NFS: usize = 16;

/// `(NF, parameter)` pairs whose value is a file the NF reads: stripped, so that no target
/// reads the disk (`acl(rules=/etc/shadow)` would otherwise be a valid fuzz input).
pub const FILE_PARAMS: &[(&str, &str)] = &[("acl", "rules")];

/// `(NF, parameter, cap, set when absent)`: parameters that size an allocation made when the
/// NF is built. Larger values are replaced by the cap; "set when absent" for NFs whose default
/// is itself large (synthetic's 256 MiB array, fw's 1M-connection table).
pub const SIZE_CAPS: &[(&str, &str, u64, bool)] = &[
    ("synthetic", "mem", 64 << 10, true),
    ("fw", "conns", 4096, true),
    ("nat", "addrs", 2, false),
    ("lb", "backends", 1024, false),
    ("hh", "k", 64, false),
];

/// The cap of a parameter declared to size an allocation (`ParamSpec::allocates`).
pub const ALLOC_CAP: u64 = 4096;

/// Strips file parameters and caps allocation sizes; `false` if the chain has more than
/// [`MAX_NFS`] NFs (the caller skips it). Errors in the values are left for the NFs to report.
pub fn sanitize_chain(spec: &mut ChainSpec) -> bool {
    if spec.nfs.len() > MAX_NFS {
        return false;
    }
    for nf in &mut spec.nfs {
        let name = nf.name.as_str();
        nf.params.retain(|(k, _)| !FILE_PARAMS.contains(&(name, k.as_str())));
        // Every parameter the registry says sizes an allocation (`ParamSpec::allocates`: amf's
        // `ues`, conntrack's `conns`, ...) is capped and set when absent, so an NF added later
        // is covered too; SIZE_CAPS adds the ones sized otherwise.
        let declared = flowplane_nf::registry::find(name).into_iter().flat_map(|i| i.params.iter());
        let caps = declared
            .filter(|p| p.bytes_each > 0 && !SIZE_CAPS.iter().any(|c| c.0 == name && c.1 == p.name))
            .map(|p| (p.name, ALLOC_CAP, true))
            .chain(SIZE_CAPS.iter().filter(|c| c.0 == name).map(|c| (c.1, c.2, c.3)));
        for (key, cap, set_absent) in caps.collect::<Vec<_>>() {
            match nf.params.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) if !within(v, cap) => *v = cap.to_string(),
                Some(_) => {}
                None if set_absent => nf.params.push((key.to_string(), cap.to_string())),
                None => {}
            }
        }
    }
    true
}

/// True if `v` is at most `cap` as a number with an optional k/M/G suffix, or cannot be a
/// number at all (no digit: the NF rejects it, which is worth fuzzing). Anything else that
/// does not read as a small number is replaced by the caller, whatever the NF would make of it.
fn within(v: &str, cap: u64) -> bool {
    if !v.bytes().any(|b| b.is_ascii_digit()) {
        return true;
    }
    let t = v.trim();
    let (num, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1e3),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1e6),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    num.parse::<f64>().is_ok_and(|x| x.is_finite() && x * mult <= cap as f64)
}

/// Tags at or above this synthesise a frame; below it, the tag is a raw frame's length.
pub const SYNTH_TAG: u8 = 0xe0;

/// One record's bookkeeping byte: clock advance, core, end of batch.
#[derive(Clone, Copy, Debug)]
pub struct Gap(pub u8);

impl Gap {
    /// Seconds the clock advances after this record (0..=63).
    pub fn seconds(self) -> u64 {
        u64::from(self.0 & 0x3f)
    }

    /// Which of two cores receives the record (multi-core mode).
    pub fn core(self) -> usize {
        usize::from(self.0 >> 6 & 1)
    }

    /// The record closes its batch.
    pub fn flush(self) -> bool {
        self.0 & 0x80 != 0
    }
}

/// Walks `data` as records `[tag][gap][body]` and calls `f(frame, gap)` for each frame, at
/// most `max_frames` times:
///
/// - `tag < 0xe0`: `body` is a raw frame of `tag` bytes (a short last record takes what is left);
/// - `tag >= 0xe0`: `body` is 6 bytes `[a, b, c, d, e, n]`: a burst of `1 + (n & 127)` frames
///   that [`synth_frame`] builds from `[a, b, c + i, d, e]` (tag bits 0-4 choose their shape):
///   up to 128 distinct flows from 8 input bytes, enough to fill a small table.
///
/// The gap byte of a burst applies to each of its frames.
pub fn for_each_record(mut data: &[u8], max_frames: usize, mut f: impl FnMut(&[u8], Gap)) {
    let mut buf = Vec::with_capacity(128);
    let mut left = max_frames;
    while let [tag, gap, rest @ ..] = data {
        let gap = Gap(*gap);
        if *tag >= SYNTH_TAG {
            let Some(([a, b, c, d, e, n], rest)) = rest.split_first_chunk::<6>() else { return };
            for i in 0..=*n & 127 {
                if left == 0 {
                    return;
                }
                left -= 1;
                synth_frame(&mut buf, *tag & 0x1f, [*a, *b, c.wrapping_add(i), *d, *e]);
                f(&buf, gap);
            }
            data = rest;
        } else {
            if left == 0 {
                return;
            }
            left -= 1;
            let (frame, rest) = rest.split_at(usize::from(*tag).min(rest.len()));
            f(frame, gap);
            data = rest;
        }
    }
}

/// Writes a well-formed Ethernet frame into `buf` (cleared first). `shape` bits: 0 TCP (else
/// UDP), 1 IPv6, 2-3 direction (0 inside -> outside, 1 outside -> inside, 2 outside -> NAT
/// external address 203.0.113.1 / 2001:db8:ffff::1, 3 inside -> inside), 4 a VLAN tag.
/// `[a, b, c, d, e]`: inside host `a` (10.0.0.a / fd00::a), other host `b`, client port
/// 1024 + `c`, server port `d`, TCP flags `e` (sequence numbers from all five) or UDP payload
/// length `e & 63`. Inside is 10.0.0.0/8, as `nat` and `fw` assume by default. L4 checksums
/// are left zero: no NF verifies them.
pub fn synth_frame(buf: &mut Vec<u8>, shape: u8, [a, b, c, d, e]: [u8; 5]) {
    let (tcp, v6, dir, vlan) = (shape & 1 != 0, shape & 2 != 0, shape >> 2 & 3, shape & 16 != 0);
    let inside = |h: u8| if v6 { v6_addr(0xfd00, 0, h) } else { v4_addr([10, 0, 0, h]) };
    let other = |h: u8| match (dir, v6) {
        (3, false) => v4_addr([10, 0, 1, h]),
        (3, true) => v6_addr(0xfd00, 1, h),
        (_, false) => v4_addr([198, 51, 100, h]),
        (_, true) => v6_addr(0x2001, 0x0db8, h),
    };
    let nat_ext = if v6 { Addr::V6(0x2001_0db8_ffff_u128 << 80 | 1) } else { v4_addr([203, 0, 113, 1]) };
    let (client, server) = (1024 + u16::from(c), u16::from(d));
    let (src, dst, sport, dport) = match dir {
        1 => (other(b), inside(a), server, client),
        2 => (other(b), nat_ext, server, client),
        _ => (inside(a), other(b), client, server),
    };
    let proto = if tcp { 6u8 } else { 17 };
    let l4_len = if tcp { 20 } else { 8 + usize::from(e & 63) };

    buf.clear();
    buf.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02]);
    if vlan {
        buf.extend_from_slice(&[0x81, 0x00, 0, a]);
    }
    let l3 = buf.len() + 2;
    match (src, dst) {
        (Addr::V4(s), Addr::V4(dd)) => {
            buf.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            buf.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
            buf.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
            buf.extend_from_slice(&s);
            buf.extend_from_slice(&dd);
            let sum = flowplane_wire::checksum::checksum(&buf[l3..l3 + 20]);
            buf[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
        }
        (Addr::V6(s), Addr::V6(dd)) => {
            buf.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            buf.extend_from_slice(&(l4_len as u16).to_be_bytes());
            buf.extend_from_slice(&[proto, 64]);
            buf.extend_from_slice(&s.to_be_bytes());
            buf.extend_from_slice(&dd.to_be_bytes());
        }
        _ => unreachable!("both addresses follow `v6`"),
    }
    buf.extend_from_slice(&sport.to_be_bytes());
    buf.extend_from_slice(&dport.to_be_bytes());
    if tcp {
        let seq = u32::from_be_bytes([e, a, b, c]);
        let ack = if e & 0x10 != 0 { u32::from_be_bytes([d, c, b, a]) } else { 0 };
        buf.extend_from_slice(&seq.to_be_bytes());
        buf.extend_from_slice(&ack.to_be_bytes());
        buf.extend_from_slice(&[0x50, e, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        buf.extend_from_slice(&(l4_len as u16).to_be_bytes());
        buf.extend_from_slice(&[0, 0]);
        buf.resize(buf.len() + usize::from(e & 63), 0);
    }
}

#[derive(Clone, Copy)]
enum Addr {
    V4([u8; 4]),
    V6(u128),
}

fn v4_addr(a: [u8; 4]) -> Addr {
    Addr::V4(a)
}

fn v6_addr(hi: u16, next: u16, host: u8) -> Addr {
    Addr::V6(u128::from(hi) << 112 | u128::from(next) << 96 | u128::from(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_engine::spec;
    use flowplane_nf::PktMeta;

    #[test]
    fn sanitize_strips_files_and_caps_sizes() {
        let mut s =
            spec::parse("acl(rules=/etc/passwd, rule=drop) -> synthetic -> fw(conns=1G) -> nat(addrs=x)").unwrap();
        assert!(sanitize_chain(&mut s));
        assert_eq!(s.nfs[0].params, vec![("rule".to_string(), "drop".to_string())]);
        assert_eq!(s.nfs[1].params, vec![("mem".to_string(), "65536".to_string())]);
        assert_eq!(s.nfs[2].params, vec![("conns".to_string(), "4096".to_string())]);
        assert_eq!(s.nfs[3].params, vec![("addrs".to_string(), "x".to_string())]);
        // Found by the ASan campaign: `amf` alone built 128K UE contexts (201 MB, hugepage
        // collapse under ASan: a 20 s timeout). Every parameter declared to allocate is capped.
        let mut s = spec::parse("amf -> conntrack(conns=1M)").unwrap();
        assert!(sanitize_chain(&mut s));
        assert_eq!(s.nfs[0].params, vec![("ues".to_string(), ALLOC_CAP.to_string())]);
        assert_eq!(s.nfs[1].params, vec![("conns".to_string(), ALLOC_CAP.to_string())]);
        let mut long = spec::parse(&vec!["count"; MAX_NFS + 1].join("->")).unwrap();
        assert!(!sanitize_chain(&mut long));
    }

    #[test]
    fn records_raw_and_bursts() {
        let mut seen = Vec::new();
        let data = [3, 0x81, 1, 2, 3, 0xe0, 0x40, 1, 2, 3, 4, 5, 2, 0xe1, 0, 1, 2];
        for_each_record(&data, 100, |f, g| seen.push((f.len(), g.seconds(), g.core(), g.flush())));
        assert_eq!(seen.len(), 4, "a raw frame, a burst of 3, a short record dropped");
        assert_eq!(seen[0], (3, 1, 0, true));
        assert_eq!(seen[1], (14 + 20 + 8 + 5, 0, 1, false));
        let mut n = 0;
        for_each_record(&[0xe0, 0, 1, 2, 3, 4, 5, 127], 100, |_, _| n += 1);
        assert_eq!(n, 100, "capped");
    }

    #[test]
    fn synthesised_frames_parse() {
        let mut buf = Vec::new();
        for shape in 0..32 {
            synth_frame(&mut buf, shape, [1, 2, 3, 4, 0x12]);
            let m = PktMeta::parse(&buf);
            assert!(m.valid, "shape {shape}: {buf:02x?}");
            assert_eq!(m.proto.0, if shape & 1 != 0 { 6 } else { 17 });
            assert_eq!(m.v6, shape & 2 != 0);
        }
    }
}

//! Trace rewriting tools (`flowplane trace truncate | loadscale`): owns
//! [`truncate`] and [`loadscale`]. Both stream (memory independent of the
//! trace length) and write nanosecond Ethernet pcap; packets of other link
//! types are converted with [`to_ethernet`]; unreadable packets and records
//! are skipped and counted.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use flowplane_wire::checksum;

use crate::{to_ethernet, PcapWriter, TraceError, TraceErrorKind, TraceReader, WriterOptions};

/// What a tool wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolSummary {
    /// Packets written.
    pub packets: u64,
    /// Packets skipped because their link layer could not be read, and records
    /// the reader could not read (see [`TraceReader::unparsed`]).
    pub skipped: u64,
}

fn writer(path: &Path) -> Result<PcapWriter<File>, TraceError> {
    PcapWriter::create(path, WriterOptions { nanosecond: true, ..WriterOptions::default() })
}

/// Cuts every packet to at most `bytes` bytes, FAJITA-style (64-byte packets
/// to stress the packet rate).
///
/// With `keep_orig_len` the cut is a capture snaplen: the bytes are dropped
/// and the record keeps the original wire length. Otherwise the packets
/// become valid shorter packets: the wire length becomes the new length and
/// the IPv4 total length (and header checksum), IPv6 payload length, UDP
/// length and TCP/UDP checksums are rewritten to match.
pub fn truncate(input: &Path, output: &Path, bytes: u32, keep_orig_len: bool) -> Result<ToolSummary, TraceError> {
    if bytes == 0 {
        return Err(TraceErrorKind::InvalidOption("truncate length must be at least 1 byte").into());
    }
    let mut r = TraceReader::open(input)?;
    let mut w = writer(output)?;
    let mut scratch = Vec::new();
    let mut frame = Vec::with_capacity(bytes as usize);
    let mut sum = ToolSummary::default();
    while let Some(pkt) = r.next_packet()? {
        let Ok(data) = to_ethernet(&pkt, &mut scratch) else {
            sum.skipped += 1;
            continue;
        };
        let n = data.len().min(bytes as usize);
        frame.clear();
        frame.extend_from_slice(&data[..n]);
        let orig = if keep_orig_len {
            wire_len(pkt.orig_len, pkt.data.len(), data.len())
        } else {
            fix_lengths(&mut frame);
            frame.len() as u32
        };
        w.write_packet(pkt.ts_ns, &frame, orig)?;
        sum.packets += 1;
    }
    sum.skipped += r.unparsed().total();
    w.finish()?;
    Ok(sum)
}

/// Wire length after link-layer conversion: the header bytes added (raw IP)
/// or removed (Linux cooked capture) by [`to_ethernet`] change it too.
fn wire_len(orig_len: u32, captured: usize, converted: usize) -> u32 {
    let v = orig_len as i64 + converted as i64 - captured as i64;
    v.clamp(converted as i64, u32::MAX as i64) as u32
}

fn get16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn set16(b: &mut [u8], at: usize, v: u16) {
    if let Some(s) = b.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

/// Makes a cut frame self-consistent (see [`truncate`]); leaves frames it does not understand alone.
fn fix_lengths(f: &mut [u8]) {
    let mut off = 12;
    let Some(mut et) = get16(f, off) else { return };
    for _ in 0..2 {
        if et == 0x8100 || et == 0x88a8 {
            off += 4;
            let Some(e) = get16(f, off) else { return };
            et = e;
        }
    }
    let l3 = off + 2;
    let (l4, proto, pseudo) = match et {
        0x0800 => {
            if f.len() < l3 + 20 || f[l3] >> 4 != 4 {
                return;
            }
            let ihl = (f[l3] & 0x0f) as usize * 4;
            let Some(total) = get16(f, l3 + 2) else { return };
            if ihl < 20 || f.len() < l3 + ihl {
                return;
            }
            let new_total = (total as usize).min(f.len() - l3) as u16;
            set16(f, l3 + 2, new_total);
            set16(f, l3 + 10, 0);
            let c = checksum::checksum(&f[l3..l3 + ihl]);
            set16(f, l3 + 10, c);
            // Only unfragmented datagrams carry a whole transport segment to fix.
            if get16(f, l3 + 6).unwrap_or(0) & 0x3fff != 0 {
                return;
            }
            let l4_len = new_total as usize - ihl.min(new_total as usize);
            let src = [f[l3 + 12], f[l3 + 13], f[l3 + 14], f[l3 + 15]];
            let dst = [f[l3 + 16], f[l3 + 17], f[l3 + 18], f[l3 + 19]];
            let proto = f[l3 + 9];
            (l3 + ihl, proto, checksum::pseudo_header_v4(src, dst, proto, l4_len as u16))
        }
        0x86dd => {
            if f.len() < l3 + 40 || f[l3] >> 4 != 6 {
                return;
            }
            let Some(plen) = get16(f, l3 + 4) else { return };
            let new_plen = (plen as usize).min(f.len() - l3 - 40) as u16;
            set16(f, l3 + 4, new_plen);
            let proto = f[l3 + 6];
            let mut src = [0u8; 16];
            let mut dst = [0u8; 16];
            src.copy_from_slice(&f[l3 + 8..l3 + 24]);
            dst.copy_from_slice(&f[l3 + 24..l3 + 40]);
            (l3 + 40, proto, checksum::pseudo_header_v6(src, dst, proto, new_plen as u32))
        }
        _ => return,
    };
    let ip_end = match et {
        0x0800 => l3 + get16(f, l3 + 2).unwrap_or(0) as usize,
        _ => l3 + 40 + get16(f, l3 + 4).unwrap_or(0) as usize,
    };
    let ip_end = ip_end.min(f.len());
    if ip_end < l4 {
        return;
    }
    let seg_len = ip_end - l4;
    let csum_at = match proto {
        17 if seg_len >= 8 => {
            set16(f, l4 + 4, seg_len as u16);
            l4 + 6
        }
        6 if seg_len >= 20 => l4 + 16,
        _ => return,
    };
    let had_udp_zero = proto == 17 && get16(f, csum_at) == Some(0) && et == 0x0800;
    if had_udp_zero {
        return; // IPv4 UDP without checksum stays without.
    }
    set16(f, csum_at, 0);
    let mut c = checksum::finish(checksum::combine(pseudo, checksum::sum(&f[l4..ip_end])));
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    set16(f, csum_at, c);
}

/// Raises the packet rate `factor` times while keeping per-flow behaviour:
/// the trace is split into `factor` windows of equal duration and the windows
/// are replayed in parallel (each shifted to start at the trace's first
/// timestamp) and merged by timestamp, as FAJITA does with CAIDA traces
/// ("split the trace into smaller windows and then replay multiple windows in
/// parallel"). Packets keep their bytes; the duration shrinks by `factor`.
///
/// The input is read `factor + 1` times (once for the time span, then one
/// reader per window), so memory stays O(factor).
pub fn loadscale(input: &Path, output: &Path, factor: u32) -> Result<ToolSummary, TraceError> {
    if factor == 0 || factor > 1024 {
        return Err(TraceErrorKind::InvalidOption("load scale factor must be between 1 and 1024").into());
    }
    let (mut first, mut last, mut n) = (u64::MAX, 0u64, 0u64);
    let mut sum = ToolSummary::default();
    {
        let mut r = TraceReader::open(input)?;
        while let Some(p) = r.next_packet()? {
            first = first.min(p.ts_ns);
            last = last.max(p.ts_ns);
            n += 1;
        }
        // Counted once, here; the window readers see the same records.
        sum.skipped += r.unparsed().total();
    }
    let mut w = writer(output)?;
    if n == 0 {
        w.finish()?;
        return Ok(sum);
    }
    let k = factor as u64;
    // Window length rounded up so that the last timestamp falls in window k-1.
    let span = last - first + 1;
    let win = span.div_ceil(k);
    let window_of = |ts: u64| (ts.saturating_sub(first) / win).min(k - 1);
    let mut readers: Vec<Window> = Vec::with_capacity(factor as usize);
    for i in 0..k {
        let mut wdw = Window {
            reader: TraceReader::open(input)?,
            index: i,
            shift: i * win,
            head: None,
            scratch: Vec::new(),
            conv: Vec::new(),
        };
        wdw.advance(&window_of, &mut sum)?;
        readers.push(wdw);
    }
    loop {
        // Smallest shifted timestamp first; ties go to the earlier window (deterministic).
        let mut best: Option<(u64, usize)> = None;
        for (j, r) in readers.iter().enumerate() {
            if let Some((ts, _, _)) = &r.head {
                if best.is_none_or(|(b, _)| *ts < b) {
                    best = Some((*ts, j));
                }
            }
        }
        let Some((_, j)) = best else { break };
        let r = &mut readers[j];
        if let Some((ts, orig, data)) = r.head.take() {
            w.write_packet(ts, &data, orig)?;
            sum.packets += 1;
            r.scratch = data;
        }
        r.advance(&window_of, &mut sum)?;
    }
    w.finish()?;
    Ok(sum)
}

/// One window's reader and its next packet (shifted timestamp, wire length, frame).
struct Window {
    reader: TraceReader<BufReader<File>>,
    index: u64,
    /// Subtracted from the window's timestamps: its start minus the trace's.
    shift: u64,
    head: Option<(u64, u32, Vec<u8>)>,
    /// Reused buffers: no allocation per packet once grown.
    scratch: Vec<u8>,
    conv: Vec<u8>,
}

impl Window {
    /// Loads the window's next packet into `head` (none at the end of the input).
    fn advance(&mut self, window_of: &dyn Fn(u64) -> u64, sum: &mut ToolSummary) -> Result<(), TraceError> {
        while let Some(pkt) = self.reader.next_packet()? {
            if window_of(pkt.ts_ns) != self.index {
                continue;
            }
            let Ok(frame) = to_ethernet(&pkt, &mut self.conv) else {
                // Counted once: only the packet's own window sees it.
                sum.skipped += 1;
                continue;
            };
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.extend_from_slice(frame);
            let orig = wire_len(pkt.orig_len, pkt.data.len(), frame.len());
            self.head = Some((pkt.ts_ns.saturating_sub(self.shift), orig, buf));
            return Ok(());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fix_lengths_never_panics_on_cut_or_garbage_frames() {
        // IPv4/UDP frame with a bogus total length, cut at every length.
        let mut f = vec![0u8; 128];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&[0xff, 0xff]);
        f[23] = 17;
        for n in 0..f.len() {
            let mut g = f[..n].to_vec();
            fix_lengths(&mut g);
        }
        let mut g = f[..60].to_vec();
        fix_lengths(&mut g);
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), 46, "total length clamped to the frame");
        let mut h = f.clone();
        h[12..14].copy_from_slice(&[0x86, 0xdd]);
        h[14] = 0x60;
        for n in 0..h.len() {
            fix_lengths(&mut h[..n].to_vec());
        }
        assert_eq!(wire_len(10, 30, 44), 44, "never below the converted frame");
        assert_eq!(wire_len(100, 100, 84), 84);
    }
}

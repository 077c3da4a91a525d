//! Cycles per packet of the flow-key fast path, measured with the TSC.
//!
//! `cargo run --release -p flowplane-wire --example parse_hash_bench [-- PACKETS_MILLIONS]`
//!
//! Builds 64-byte UDP/IPv4, TCP/IPv4 and UDP/IPv6 frames with random flows in
//! an L1-sized set (256 frames), an L2-sized set (4096 frames, 256 KiB) and a
//! DRAM-sized set (1M frames, 64 MiB, walked sequentially), plus a randomly
//! mixed stream, and times per packet:
//! * `extract_five_tuple` + CRC32C table hash (target: <= 15 cycles);
//! * Toeplitz RSS hash of an already-extracted tuple;
//! * the CRC table hash alone of an already-extracted tuple.
//!
//! The machine is shared, so time is taken over 16K-packet blocks and the
//! minimum (undisturbed) and median blocks are printed. The per-packet body is
//! an out-of-line call here, so the figures include call overhead.

#[cfg(target_arch = "x86_64")]
mod bench {
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FiveTupleV4};
    use flowplane_wire::hash::hash_key;
    use flowplane_wire::rss::{Toeplitz, MICROSOFT_KEY};

    const FRAME: usize = 64;

    #[inline(always)]
    fn tsc() -> u64 {
        // SAFETY: `rdtsc` exists on every x86_64 CPU and only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// TSC ticks per second, against the monotonic clock over ~200 ms.
    fn tsc_hz() -> f64 {
        let (t0, c0) = (Instant::now(), tsc());
        while t0.elapsed() < Duration::from_millis(200) {}
        let (t1, c1) = (Instant::now(), tsc());
        (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*: enough for distinct flows.
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[derive(Clone, Copy)]
    enum Kind {
        UdpV4,
        TcpV4,
        UdpV6,
    }

    impl Kind {
        fn name(self) -> &'static str {
            match self {
                Kind::UdpV4 => "UDP/IPv4",
                Kind::TcpV4 => "TCP/IPv4",
                Kind::UdpV6 => "UDP/IPv6",
            }
        }
    }

    fn write_frame(f: &mut [u8], kind: Kind, rng: &mut Rng) {
        f[..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2]);
        let r = rng.next();
        let (sp, dp) = ((r >> 16) as u16, (r >> 32) as u16);
        match kind {
            Kind::UdpV4 | Kind::TcpV4 => {
                let proto = if matches!(kind, Kind::UdpV4) { 17 } else { 6 };
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14..24].copy_from_slice(&[0x45, 0, 0, 50, 0, 0, 0x40, 0, 64, proto]);
                f[26..30].copy_from_slice(&(rng.next() as u32).to_be_bytes());
                f[30..34].copy_from_slice(&(rng.next() as u32).to_be_bytes());
                f[34..36].copy_from_slice(&sp.to_be_bytes());
                f[36..38].copy_from_slice(&dp.to_be_bytes());
            }
            Kind::UdpV6 => {
                // 14 + 40 + 8 = 62 bytes of headers in a 64-byte frame.
                f[12..14].copy_from_slice(&[0x86, 0xDD]);
                f[14..22].copy_from_slice(&[0x60, 0, 0, 0, 0, 10, 17, 64]);
                for a in f[22..54].chunks_exact_mut(8) {
                    a.copy_from_slice(&rng.next().to_be_bytes());
                }
                f[54..56].copy_from_slice(&sp.to_be_bytes());
                f[56..58].copy_from_slice(&dp.to_be_bytes());
            }
        }
    }

    fn frames(n: usize, kind: Kind) -> Vec<u8> {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ n as u64);
        let mut buf = vec![0u8; n * FRAME];
        for f in buf.chunks_exact_mut(FRAME) {
            write_frame(f, kind, &mut rng);
        }
        buf
    }

    /// Packets per timed block: short enough (~0.1-1 ms) that some blocks run
    /// without being descheduled on this shared 2-vCPU machine.
    const BLOCK: usize = 16 * 1024;

    /// (min, median) TSC ticks per item over blocks of [`BLOCK`] items, until
    /// `total` items are done. The minimum is the undisturbed cost.
    fn blocks<T>(items: &[T], stride: usize, total: usize, mut body: impl FnMut(&T) -> u32) -> (f64, f64) {
        let mut acc = 0u32;
        for it in items.iter().step_by(stride) {
            acc ^= body(it); // warm-up: page faults, caches, predictors
        }
        let n = items.len().div_ceil(stride);
        let per_block = BLOCK.min(n);
        let mut samples = Vec::with_capacity(total / per_block + 1);
        let mut done = 0;
        let mut pos = 0;
        while done < total {
            let start = tsc();
            for _ in 0..per_block {
                acc = acc.wrapping_add(body(black_box(&items[pos * stride])));
                pos += 1;
                if pos == n {
                    pos = 0;
                }
            }
            samples.push((tsc() - start) as f64 / per_block as f64);
            done += per_block;
        }
        black_box(acc);
        samples.sort_by(f64::total_cmp);
        (samples[0], samples[samples.len() / 2])
    }

    fn measure(buf: &[u8], total: usize, body: impl Fn(&[u8]) -> u32) -> (f64, f64) {
        // One item per frame: index the 64-byte chunks.
        let frames: Vec<&[u8]> = buf.chunks_exact(FRAME).collect();
        blocks(&frames, 1, total, |f| body(f))
    }

    /// Out-of-line copy for reading the generated code (`objdump -d`).
    #[inline(never)]
    pub fn parse_hash_probe(f: &[u8]) -> u32 {
        parse_hash(f)
    }

    #[inline(always)]
    fn parse_hash(f: &[u8]) -> u32 {
        match extract_five_tuple(f) {
            Ok(t) => hash_key(&t, 0x1234_5678),
            Err(_) => 0,
        }
    }

    pub fn main() {
        let millions: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
        let total = millions * 1_000_000;
        let hz = tsc_hz();
        println!("TSC frequency: {:.3} GHz (calibrated against Instant over 200 ms)", hz / 1e9);
        println!("{} M packets per measurement; cycles are TSC ticks per packet", millions);
        let rss = Toeplitz::new(&MICROSOFT_KEY);
        println!("min / median over {BLOCK}-packet blocks (the machine is shared: min = undisturbed)");
        println!(
            "{:<10} {:>10} {:>24} {:>10} {:>16} {:>16}",
            "frames", "set", "parse+crc hash cyc/pkt", "Mpps@min", "toeplitz", "crc alone"
        );
        let row = |name: &str, label: &str, buf: &[u8]| {
            let ph = measure(buf, total, parse_hash);
            // Tuples pre-extracted so the next two isolate the hash.
            let tuples: Vec<FiveTuple> = buf
                .chunks_exact(FRAME)
                .map(|f| extract_five_tuple(f).unwrap_or_else(|_| FiveTupleV4::default().into()))
                .collect();
            let toe = blocks(&tuples, 1, total, |t| rss.hash_five_tuple(t));
            let crc = blocks(&tuples, 1, total, |t| hash_key(t, 0x1234_5678));
            println!(
                "{:<10} {:>10} {:>11.2} / {:>10.2} {:>10.1} {:>7.2} / {:>6.2} {:>7.2} / {:>6.2}",
                name,
                label,
                ph.0,
                ph.1,
                hz / ph.0 / 1e6,
                toe.0,
                toe.1,
                crc.0,
                crc.1
            );
        };
        for kind in [Kind::UdpV4, Kind::TcpV4, Kind::UdpV6] {
            for (label, n) in [("256 (L1)", 256usize), ("4K (L2)", 4096), ("1M (DRAM)", 1 << 20)] {
                row(kind.name(), label, &frames(n, kind));
            }
        }
        // A mixed stream defeats per-type branch prediction: the realistic worst case.
        let mut mixed = Vec::with_capacity(3 * 4096 * FRAME);
        let mut rng = Rng(42);
        for _ in 0..3 * 4096 {
            let mut f = [0u8; FRAME];
            let kind = [Kind::UdpV4, Kind::TcpV4, Kind::UdpV6][(rng.next() % 3) as usize];
            write_frame(&mut f, kind, &mut rng);
            mixed.extend_from_slice(&f);
        }
        row("mixed 3", "12K (L2)", &mixed);
        black_box(parse_hash_probe(&mixed[..FRAME]));
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    bench::main();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("parse_hash_bench needs x86_64 (it reads the TSC)");
}

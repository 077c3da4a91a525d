//! Every registered NF, built with its defaults, takes truncated, corrupted
//! and random frames without panicking — through the same entry points the
//! executors use (default action, per-packet action, unparsed path, release).

use flowplane_nf::registry::{build_with, NfSink, NFS};
use flowplane_nf::testutil::{tcp4, udp4};
use flowplane_nf::{Nf, NfContext, Params, Pkt, PktMeta, StatefulNf};
use flowplane_packet::{Batch, PacketPool, PoolConfig};

fn frames() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let valid = [
        udp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 2000),
        tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 22, 0x02, 1, 0),
        tcp4([192, 0, 2, 9], [10, 0, 0, 1], 80, 1000, 0x12, 5, 2),
        tcp4([10, 0, 0, 1], [203, 0, 113, 1], 1000, 80, 0x11, 7, 9),
    ];
    for f in &valid {
        for cut in 0..=f.len() {
            out.push(f[..cut].to_vec());
        }
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0xff;
            out.push(g);
        }
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for len in 0..300 {
        let mut g = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            g.push(x as u8);
        }
        // Half of them look like IPv4 so they get past the EtherType check.
        if len > 14 && len % 2 == 0 {
            g[12] = 0x08;
            g[13] = 0x00;
            g[14] = 0x45;
        }
        out.push(g);
    }
    out
}

fn params_for(name: &str) -> Vec<(String, String)> {
    match name {
        // Keep the synthetic NF's private array small in tests.
        "synthetic" => vec![("mem".into(), "65536".into())],
        _ => Vec::new(),
    }
}

/// Drives one NF through the entry points the executors use.
struct Survive<'a> {
    frames: &'a [Vec<u8>],
}

impl NfSink for Survive<'_> {
    /// Per-packet actions run.
    type Out = usize;

    fn stateful<T: StatefulNf>(self, mut nf: T) -> usize {
        let mut actions = 0;
        let mut state: T::State = bytemuck::Zeroable::zeroed();
        for (k, f) in self.frames.iter().enumerate() {
            let mut data = f.clone();
            let meta = PktMeta::parse(&data);
            // Clocks that jump: forwards, backwards, to zero.
            let now = [0, u64::MAX / 2, 5, 1_000_000_000][k % 4];
            let ctx = NfContext { now_tsc: 0, now_ns: now };
            if !meta.valid {
                nf.on_unparsed();
                continue;
            }
            if k % 3 == 0 {
                state = nf.init(&Pkt::new(&mut data, &meta), &ctx);
            }
            nf.process(&mut Pkt::new(&mut data, &meta), &mut state, &ctx);
            actions += 1;
            if k % 7 == 0 {
                nf.release(&meta.tuple, &state);
            }
        }
        let _ = nf.report();
        actions
    }

    fn stateless(self, mut nf: Box<dyn Nf>) -> usize {
        let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        for chunk in self.frames.chunks(64) {
            for f in chunk {
                assert!(batch.push_copy(&mut pool, f, 0));
            }
            let n = batch.len();
            nf.process(&mut batch, 0..n, &NfContext::default());
            batch.free_all(&mut pool).unwrap();
        }
        0
    }
}

#[test]
fn every_nf_survives_bad_packets() {
    let frames = frames();
    let mut actions = 0usize;
    for kind in NFS {
        let params = Params::new(kind.name, params_for(kind.name));
        actions += build_with(kind.name, params, Survive { frames: &frames }).expect(kind.name);
    }
    // The corpus must reach the per-packet actions, not only the unparsed path.
    assert!(actions > 1000, "{actions} actions");
}

//! Every registered NF, built with its defaults, takes truncated, corrupted
//! and random frames without panicking — through the same entry points the
//! executors use (default action, per-packet action, unparsed path, release).

use flowplane_nf::registry::{build, NfInstance, NFS};
use flowplane_nf::testutil::{tcp4, udp4};
use flowplane_nf::{NfContext, Params, Pkt, PktMeta};
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

#[test]
fn every_nf_survives_bad_packets() {
    let frames = frames();
    let mut actions = 0usize;
    for kind in NFS {
        let nf = build(kind.name, Params::new(kind.name, params_for(kind.name))).expect(kind.name);
        match nf {
            NfInstance::Stateful(mut nf) => {
                let mut block = vec![0u8; nf.state_size().max(1) + 16];
                for (k, f) in frames.iter().enumerate() {
                    let mut data = f.clone();
                    let meta = PktMeta::parse(&data);
                    // Clocks that jump: forwards, backwards, to zero.
                    let now = [0, u64::MAX / 2, 5, 1_000_000_000][k % 4];
                    let ctx = NfContext { now_tsc: 0, now_ns: now };
                    if !meta.valid {
                        nf.on_unparsed();
                        continue;
                    }
                    let sz = nf.state_size();
                    if k % 3 == 0 {
                        block.iter_mut().for_each(|b| *b = 0);
                        nf.init_into(&Pkt::new(&mut data, &meta), &ctx, &mut block[..sz]);
                    }
                    nf.process_bytes(&mut Pkt::new(&mut data, &meta), &mut block[..sz], &ctx);
                    actions += 1;
                    if k % 7 == 0 {
                        nf.release_bytes(&meta.tuple, &block[..sz]);
                    }
                }
                let _ = nf.report();
            }
            NfInstance::Stateless(mut nf) => {
                let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
                let mut batch = Batch::new(&pool);
                for chunk in frames.chunks(64) {
                    for f in chunk {
                        assert!(batch.push_copy(&mut pool, f, 0));
                    }
                    nf.process(&mut batch, &NfContext::default());
                    batch.free_all(&mut pool).unwrap();
                }
            }
        }
    }
    // The corpus must reach the per-packet actions, not only the unparsed path.
    assert!(actions > 1000, "{actions} actions");
}

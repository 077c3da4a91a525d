//! Every registered NF, built through the registry with its defaults, takes
//! truncated, corrupted and random frames without panicking — through the
//! same entry points the executors use (default action, per-packet action,
//! unparsed path, release). And every NF's declaration holds: it is keyed as
//! its descriptor says, and each declared default, written out, is accepted.

use bytemuck::Zeroable;
use flowplane_nf::registry::{build_with, KeyedBy, NfInfo, NfSink, NFS};
use flowplane_nf::testutil::{tcp4, udp4};
use flowplane_nf::{Granularity, Nf, NfContext, Params, Pkt, PktMeta, StatefulNf};
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
        // A route table the test frames' destinations partly match.
        "route" => {
            let path = std::env::temp_dir().join(format!("fp-every-nf-routes-{}.txt", std::process::id()));
            std::fs::write(&path, "10.0.0.0/24 1\n10.0.0.2/32 2\n0.0.0.0/1 3\n2001:db8::/32 4\n").unwrap();
            vec![("routes".into(), path.display().to_string())]
        }
        _ => Vec::new(),
    }
}

/// Runs the frames through whatever NF the registry builds; returns the
/// number of per-packet actions and, for a stateful NF, its granularity.
struct Survive<'a> {
    frames: &'a [Vec<u8>],
}

impl NfSink for Survive<'_> {
    type Out = (usize, Option<Granularity>);

    fn stateless(self, mut nf: Box<dyn Nf>) -> Self::Out {
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
        if let Some(r) = nf.report() {
            let mut merged = r.clone();
            nf.merge_report(&mut merged, &r);
            let _ = nf.export_report_rows(&merged);
        }
        (0, None)
    }

    fn stateful<T: StatefulNf>(self, mut nf: T) -> Self::Out {
        // Until the first default action, `process` sees a zeroed state (a fresh table block).
        let mut state = T::State::zeroed();
        let mut actions = 0;
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
            // Every third frame starts a new flow (the default action); the
            // others find whatever state the previous frames left.
            if k % 3 == 0 {
                state = nf.init(&Pkt::new(&mut data, &meta), &ctx);
            }
            nf.process(&mut Pkt::new(&mut data, &meta), &mut state, &ctx);
            actions += 1;
            if k % 7 == 0 {
                nf.release(&meta.tuple, &state);
            }
            let _ = nf.export_row(&meta.tuple, &state);
            let _ = nf.export_raw_row(k as u128, &state);
        }
        if let Some(r) = nf.report() {
            // Merging another core's report keeps the shape (and never panics).
            let mut merged = r.clone();
            nf.merge_report(&mut merged, &r);
            let keys = |v: &serde_json::Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
            assert_eq!(keys(&merged), keys(&r), "{}", nf.name());
            let _ = nf.export_report_rows(&merged);
        }
        (actions, Some(nf.granularity()))
    }
}

#[test]
fn every_nf_survives_bad_packets() {
    let frames = frames();
    let mut actions = 0usize;
    for kind in NFS {
        let params = Params::new(kind.name, params_for(kind.name));
        let (n, granularity) = build_with(kind.name, params, Survive { frames: &frames }).expect(kind.name);
        actions += n;
        // The descriptor says what the NF is keyed by without building it: check it against the instance.
        match kind.keyed_by {
            // Its own table: nothing in the flow table.
            KeyedBy::Stateless | KeyedBy::Own(_) => assert_eq!(granularity, None, "{}", kind.name),
            KeyedBy::Fixed(g) => assert_eq!(granularity, Some(g), "{}", kind.name),
            KeyedBy::Param(_) => assert!(granularity.is_some(), "{}", kind.name),
        }
    }
    // The corpus must reach the per-packet actions, not only the unparsed path.
    assert!(actions > 1000, "{actions} actions");
}

/// Builds nothing: checks only that the registry accepted the parameters.
struct Accept;

impl NfSink for Accept {
    type Out = ();
    fn stateless(self, _nf: Box<dyn Nf>) {}
    fn stateful<T: StatefulNf>(self, _nf: T) {}
}

/// Each declared default, written out explicitly, is accepted — and read:
/// the registry refuses a given parameter that `from_params` never asked for.
#[test]
fn declared_defaults_parse_and_every_declared_parameter_is_read() {
    for kind in NFS {
        let small = params_for(kind.name);
        for spec in kind.params {
            let Some(v) = spec.explicit_default() else { continue };
            let mut pairs: Vec<(String, String)> = small.iter().filter(|(k, _)| k != spec.name).cloned().collect();
            if pairs.len() < small.len() {
                continue; // a default this test keeps small on purpose (synthetic's 256 MiB)
            }
            pairs.push((spec.name.to_string(), v.clone()));
            build_with(kind.name, Params::new(kind.name, pairs), Accept)
                .unwrap_or_else(|e| panic!("{}({}={v}): {e}", kind.name, spec.name));
        }
    }
}

/// `flowplane nfs` and the docs show what `NFS` holds: spot-check the declarations against the behaviour.
#[test]
fn descriptors_describe_the_nfs() {
    let d = |n: &str| -> &'static NfInfo { NFS.iter().find(|k| k.name == n).unwrap() };
    assert_eq!(d("forward").keyed_by, KeyedBy::Stateless);
    assert_eq!(d("srcctr").keyed_by.describe(), "src-ip");
    assert_eq!(d("policer").keyed_by.describe(), "dst-ip");
    assert_eq!(d("keyctr").keyed_by.describe(), "param key");
    // Fractional windows are accepted where a window is meant.
    for nf in ["psd", "ddos"] {
        let p = Params::new(nf, vec![("window".into(), "0.5".into())]);
        build_with(nf, p, Accept).unwrap_or_else(|e| panic!("{e}"));
    }
    let p = Params::new("ddos", vec![("window".into(), "0".into())]);
    assert_eq!(build_with("ddos", p, Accept).unwrap_err().0, "ddos: parameter 'window=0' out of range [0.001, 86400]");
}

//! Kernel steering of an AF_PACKET port against its oracle (root: CI runs as
//! root; a machine where the namespace, the veth pair or the program cannot
//! be made fails loudly, never passes without running).
//!
//! scapy crafts the frames (`tests/fanout/make_frames.py`: IPv4 and IPv6
//! TCP/UDP, extension headers, fragments, ICMP echo, ICMP errors quoting a
//! flow, VLAN tags, a nat-like destination-port rule, a flow rule's flow,
//! other protocols, ARP, malformed IPv4). They go through a veth pair in a
//! namespace the test creates into a port of 3 queues steered by the
//! program; each frame must arrive on the queue that flowplane's own
//! `Classifier` and table pick in Rust (as the software dispatcher steers),
//! which shares no code with the BPF program. Then RETA entries and a flow
//! rule change live and the frames are sent again: each must follow its
//! key's new owner.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowplane_io::port::afpacket::AfPacketPort;
use flowplane_io::port::fanout_steer::{self, KernelSteer};
use flowplane_io::port::{self, netns, Port, PortOptions, PortSpec, RxQueue};
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use flowplane_scale::fragsteer::FragSteer;
use flowplane_scale::steer::{Classifier, FdirRule, FlowRule, HashOn, Steering};
use flowplane_trace::TraceReader;
use flowplane_wire::flow::{FiveTuple, FiveTupleV4};

const QUEUES: usize = 3;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn must(args: &[&str]) {
    let o = run(args);
    assert!(o.status.success(), "{args:?} (needs root and iproute2): {}", String::from_utf8_lossy(&o.stderr));
}

/// A namespace holding a veth pair; deleted (with the pair) on drop.
struct Ns(String);

impl Ns {
    fn new() -> Ns {
        let name = format!("fpks{}", std::process::id() % 100_000);
        let _ = run(&["ip", "netns", "del", &name]);
        must(&["ip", "netns", "add", &name]);
        let ns = Ns(name);
        must(&["ip", "-n", &ns.0, "link", "add", "ksa", "type", "veth", "peer", "name", "ksb"]);
        must(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        for i in ["ksa", "ksb"] {
            must(&["ip", "-n", &ns.0, "link", "set", i, "up"]);
        }
        ns
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.0]);
    }
}

fn python() -> String {
    let candidates = std::env::var("FLOWPLANE_PYTHON").into_iter().chain(["python3".into(), "/usr/bin/python3".into()]);
    for py in candidates {
        if Command::new(&py).args(["-c", "import scapy.all"]).output().is_ok_and(|o| o.status.success()) {
            return py;
        }
    }
    panic!("no Python with scapy: install python3-scapy (apt-get) or set FLOWPLANE_PYTHON");
}

fn frames() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fanout");
    // One file per call: the tests of this file run at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("fp-fanout-{}-{call}.pcap", std::process::id()));
    let o = run(&[&python(), dir.join("make_frames.py").to_str().unwrap(), out.to_str().unwrap()]);
    assert!(o.status.success(), "make_frames.py: {}", String::from_utf8_lossy(&o.stderr));
    let mut r = TraceReader::open(&out).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet().unwrap() {
        v.push(p.data.to_vec());
    }
    let _ = std::fs::remove_file(&out);
    v
}

/// The key the software dispatcher picks for `frame` (crates/io/src/dispatch.rs): the classifier's key
/// (0 when unclassified), an exact-match flow rule bound to that entry, and for a later fragment its first
/// fragment's key (`frags`, fed every frame in arrival order).
fn oracle_key(c: &Classifier, rules: &[(u16, FlowRule)], frags: &mut FragSteer, frame: &[u8]) -> u16 {
    let Some((mut key, h)) = c.classify(frame) else { return 0 };
    if (key as usize) < c.reta_size() {
        if let Some((slot, _)) = rules.iter().find(|(_, r)| r.entry == key && r.matches_frame(frame)) {
            key = *slot;
        }
    }
    frags.follow(frame, (key, h)).0
}

/// The worker the software dispatcher picks for `frame`: its key's owner.
fn oracle(c: &Classifier, owners: &[u16], rules: &[(u16, FlowRule)], frags: &mut FragSteer, frame: &[u8]) -> u16 {
    owners[oracle_key(c, rules, frags, frame) as usize]
}

/// Sends every frame into `ksb`, returns where each arrived (by frame index) on the 3 steered queues of `ksa`.
fn send_and_collect(
    tx: &mut dyn port::TxQueue,
    rxs: &mut [Box<dyn RxQueue>],
    frames: &[Vec<u8>],
) -> HashMap<usize, Vec<usize>> {
    let index: HashMap<&[u8], usize> = frames.iter().enumerate().map(|(i, f)| (f.as_slice(), i)).collect();
    assert_eq!(index.len(), frames.len(), "the frames are unique");
    let mut pool = PacketPool::new(PoolConfig { buffers: 4096, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for chunk in frames.chunks(32) {
        for f in chunk {
            assert!(b.push_copy(&mut pool, f, 0));
        }
        let (sent, _, lost) = tx.tx_batch(&b, 0);
        assert_eq!((sent, lost), (chunk.len() as u64, 0));
        b.free_all(&mut pool).unwrap();
        // veth's backlog is small: do not outrun it.
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut got: HashMap<usize, Vec<usize>> = HashMap::new();
    let (t0, mut seen) = (Instant::now(), 0);
    while seen < frames.len() && t0.elapsed() < Duration::from_secs(5) {
        let mut any = false;
        for (q, rx) in rxs.iter_mut().enumerate() {
            let k = rx.rx_burst(&mut pool, &mut b, 64);
            any |= k > 0;
            for i in 0..k {
                if let Some(&f) = index.get(b.data(i)) {
                    got.entry(f).or_default().push(q);
                    seen += 1;
                }
            }
            b.free_all(&mut pool).unwrap();
        }
        if !any {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

fn check(
    what: &str,
    c: &Classifier,
    owners: &[u16],
    rules: &[(u16, FlowRule)],
    frames: &[Vec<u8>],
    got: &HashMap<usize, Vec<usize>>,
    frags: &mut FragSteer,
) {
    let mut wrong = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let want = oracle(c, owners, rules, frags, f) as usize;
        match got.get(&i).map(Vec::as_slice) {
            Some([q]) if *q == want => {}
            other => wrong.push(format!("frame {i} ({} bytes): want queue {want}, got {other:?}", f.len())),
        }
    }
    assert!(wrong.is_empty(), "{what}: {} of {} frames mis-steered:\n{}", wrong.len(), frames.len(), wrong.join("\n"));
}

/// One configuration: load, open the steered port, send, check; then live changes, send, check.
fn round(frames: &[Vec<u8>], c: Classifier, with_rule: bool) {
    let slots = 4;
    let st = Steering::with_flow_slots(QUEUES, &c, &[], slots).unwrap();
    let flow = FiveTupleV4::new(Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2), 1111, 2222, 17);
    if with_rule {
        let entry = c.entry_of(&FiveTuple::V4(flow));
        let hash = c.hash_tuple(&FiveTuple::V4(flow));
        let slot = st.install_flow_rule(FlowRule { entry, hash, tuple: flow }).unwrap();
        // Off the entry's owner, so the rule visibly matters.
        let other = (st.owners()[entry as usize] + 1) % QUEUES as u16;
        st.start_move(slot, other).unwrap();
    }
    let steer = Arc::new(KernelSteer::for_steering(&c, &st).unwrap());
    steer.start_counting().unwrap();
    let rx_port =
        AfPacketPort::open("ksa", QUEUES, PortOptions::default()).unwrap().with_kernel_steering(steer.clone());
    let mut rxs: Vec<Box<dyn RxQueue>> = (0..QUEUES).map(|q| rx_port.open_rx(q).unwrap()).collect();
    let tx_port = port::open(&PortSpec::parse("afpacket:ksb").unwrap(), 1, PortOptions::default()).unwrap();
    let mut tx = tx_port.open_tx(0).unwrap();

    let got = send_and_collect(&mut *tx, &mut rxs, frames);
    let mut owners = st.owners();
    // Remembers first fragments across both sends, as the kernel's fp_frags does.
    let mut frags = FragSteer::new();
    check("initial table", &c, &owners, &st.flow_rules(), frames, &got, &mut frags);
    // The per-(worker, key) counts a moving strategy reads: each frame once, on its owner's row.
    let mut counts = Vec::new();
    steer.counts(&mut counts);
    let keys = steer.keys();
    let mut want = vec![vec![0u64; keys]; QUEUES];
    let mut counted = FragSteer::new();
    for f in frames {
        let key = oracle_key(&c, &st.flow_rules(), &mut counted, f) as usize;
        want[owners[key] as usize][key] += 1;
    }
    assert_eq!(counts, want.concat(), "per-(worker, key) counts");
    let s = steer.stats();
    assert!(s.reta > 0 && s.unclassified > 0 && (s.fdir > 0) != c.rules().is_empty(), "{s:?}");
    assert_eq!(s.frag, counted.followed, "later fragments that followed their first: {s:?}");
    assert!(s.frag >= 32, "{s:?}");
    assert_eq!(s.flow > 0, with_rule, "{s:?}");

    // Live: a new RETA (every entry moves), one entry set alone, the flow rule removed.
    let n = c.reta_size();
    owners[..n].iter_mut().enumerate().for_each(|(i, o)| *o = ((i * 7 + 2) % QUEUES) as u16);
    steer.set_reta(&owners[..n]).unwrap();
    owners[0] = (owners[0] + 1) % QUEUES as u16;
    steer.set_entry(0, owners[0]).unwrap();
    let mut rules = st.flow_rules();
    if let Some((slot, _)) = rules.pop() {
        steer.remove_flow_rule(slot).unwrap();
    }
    let got = send_and_collect(&mut *tx, &mut rxs, frames);
    check("after live RETA and rule changes", &c, &owners, &rules, frames, &got, &mut frags);
}

#[test]
fn kernel_fanout_steering_puts_every_frame_where_the_classifier_says() {
    assert!(fanout_steer::available(), "built without clang: apt-get install clang (scripts/test.sh does)");
    let frames = frames();
    assert!(frames.len() > 400);
    let ns = Ns::new();
    let name = ns.0.clone();
    // Only this thread enters the namespace; the sockets it opens live there.
    std::thread::spawn(move || {
        netns::enter(&name).unwrap();
        let nat = FdirRule {
            proto: None,
            dst: Some((Ipv4Addr::new(203, 0, 113, 1), 32)),
            dst_ports: (20000, 29999),
            queue: 2,
        };
        // As the runner builds it for nat/fw: symmetric, five-tuple, ICMP errors by quoted flow, the reply rule.
        let c = Classifier::new(512, true, HashOn::FiveTuple, true, vec![nat]).unwrap();
        round(&frames, c, true);
        // Microsoft's key, one address, no ICMP inner lookup, no rules.
        for on in [HashOn::SrcIp, HashOn::DstIp] {
            let c = Classifier::new(128, false, on, false, Vec::new()).unwrap();
            round(&frames, c, false);
        }
    })
    .join()
    .unwrap();
}

/// An untagged IPv4 or IPv6 frame without a whole fixed IP header.
fn short_ip(f: &[u8]) -> bool {
    match (f[12], f[13]) {
        (0x08, 0x00) => f.len() < 14 + 20,
        (0x86, 0xdd) => f.len() < 14 + 40,
        _ => false,
    }
}

/// A small deterministic generator (xorshift64*) for the mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The program against the classifier frame by frame, without a network: every scapy frame
/// and 24 mutations of each (bytes of the headers changed at random, frames cut short) run
/// once through the kernel (BPF_PROG_TEST_RUN) with each key owned by itself, so what the
/// program returns is the key it computed; it must be the key the Rust classifier and the
/// dispatcher's flow-rule lookup give, under four configurations.
#[test]
fn the_program_computes_the_classifiers_key_on_crafted_and_mutated_frames() {
    assert!(fanout_steer::available(), "built without clang: apt-get install clang (scripts/test.sh does)");
    let mut corpus = frames();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let n = corpus.len();
    for i in 0..n {
        for _ in 0..24 {
            let mut f = corpus[i].clone();
            match rng.below(3) {
                0 => f.truncate(14 + rng.below(f.len() - 13)),
                _ => {
                    for _ in 0..1 + rng.below(3) {
                        let at = 12 + rng.below(f.len().min(96) - 12);
                        f[at] = rng.next() as u8;
                    }
                }
            }
            corpus.push(f);
        }
    }
    let nat = FdirRule {
        proto: Some(17),
        dst: Some((Ipv4Addr::new(203, 0, 113, 0), 24)),
        dst_ports: (20000, 29999),
        queue: 0,
    };
    let any = FdirRule { proto: None, dst: None, dst_ports: (9, 9), queue: 0 };
    let configs = [
        Classifier::new(512, true, HashOn::FiveTuple, true, vec![nat, any]).unwrap(),
        Classifier::new(512, true, HashOn::FiveTuple, false, vec![nat]).unwrap(),
        Classifier::new(64, false, HashOn::SrcIp, true, Vec::new()).unwrap(),
        Classifier::new(256, false, HashOn::DstIp, false, Vec::new()).unwrap(),
    ];
    let flow = FiveTupleV4::new(Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2), 1111, 2222, 17);
    for c in configs {
        let slots = 2;
        let keys = c.keys() + slots;
        let identity: Vec<u16> = (0..keys as u16).collect();
        let k = KernelSteer::load(&c, keys, &identity, slots).unwrap();
        let rule = FlowRule { entry: c.entry_of(&FiveTuple::V4(flow)), hash: 0, tuple: flow };
        let slot = c.keys() as u16 + 1;
        k.add_flow_rule(slot, &rule).unwrap();
        let rules = [(slot, rule)];
        let (mut wrong, mut skipped) = (Vec::new(), 0u64);
        let mut frags = FragSteer::new();
        for (i, f) in corpus.iter().enumerate() {
            let want = oracle(&c, &identity, &rules, &mut frags, f) as u32;
            let got = match k.run_once(f) {
                Ok(got) => got,
                // The kernel refuses to test-run an IP ethertype with a header cut short
                // (net/bpf/test_run.c); the classifier must refuse those too.
                Err(_) if short_ip(f) => {
                    assert_eq!(c.classify(f), None, "frame {i}");
                    skipped += 1;
                    continue;
                }
                Err(e) => panic!("frame {i} ({} bytes): {e}", f.len()),
            };
            if got != want {
                wrong.push(format!("frame {i}: key {got}, classifier {want}: {:02x?}", &f[..f.len().min(80)]));
            }
        }
        assert!(
            wrong.is_empty(),
            "{c:?}: {} of {} frames differ:\n{}",
            wrong.len(),
            corpus.len(),
            wrong[..wrong.len().min(10)].join("\n")
        );
        let s = k.stats();
        assert_eq!(s.reta + s.fdir + s.flow + s.unclassified + s.frag + skipped, corpus.len() as u64, "{s:?}");
        assert_eq!(s.frag, frags.followed, "{s:?}");
        assert!(skipped < corpus.len() as u64 / 4, "{skipped} frames not run");
        assert!(s.flow > 0 && s.unclassified > 0, "{s:?}");
    }
}

//! Chain graphs on a live port (issue 31 item 4), as root on a 2-queue veth
//! the test makes: `acl -> { allow: fsc -> port(a) ; deny: count -> port(b) }`
//! runs on `afpacket:` with 2 workers, its named ports written as pcap files,
//! while the trace of `tests/captures/graph_model.py` (scapy; the ACL's
//! documented rule language applied by the script) is sent into the veth's
//! peer. Each branch's file must hold exactly the model's packets of that
//! branch, each flow's in the order sent, and the branch NFs' figures must be
//! the model's (fsc's flows, count's totals).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod ports_common;

use ports_common::{ctl, wait_ready, Proc, Veth};

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");
const CHAIN: &str =
    "acl(rule=drop:udp:10.0.0.0/8;drop:tcp:any:any:any:9000) -> { allow: fsc -> port(a) ; deny: count -> port(b) }";

fn frames(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let (mut out, mut off) = (Vec::new(), 24);
    while off + 16 <= d.len() {
        let len = le(off + 8);
        out.push(d[off + 16..off + 16 + len].to_vec());
        off += 16 + len;
    }
    out
}

/// Frames by flow (IPv4 protocol, addresses, ports), each flow's in file order.
fn by_flow(frames: &[Vec<u8>]) -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    let mut m: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for f in frames {
        m.entry([&f[23..24], &f[26..38]].concat()).or_default().push(f.clone());
    }
    m
}

#[test]
fn a_chain_graph_on_a_live_port_sends_each_branch_to_its_port() {
    let v = Veth::with_queues("gr", 2);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ports-graph{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let g = Command::new("/usr/bin/python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/graph_model.py"))
        .arg(&dir)
        .arg("600")
        .output()
        .expect("graph_model.py (python3-scapy)");
    assert!(g.status.success(), "graph_model.py: {}", String::from_utf8_lossy(&g.stderr));
    let model: Value = serde_json::from_slice(&std::fs::read(p("model.json")).unwrap()).unwrap();
    let (allow, deny) = (frames(Path::new(&p("allow.pcap"))), frames(Path::new(&p("deny.pcap"))));
    let total = model["packets"].as_u64().unwrap();
    assert!(allow.len() > 100 && deny.len() > 100 && (allow.len() + deny.len()) as u64 == total);
    let sock = p("fp.sock");
    let iface = format!("afpacket:{}", v.0);
    let (pa, pb) = (format!("a={}", p("a.pcap")), format!("b={}", p("b.pcap")));
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &iface,
        "--output",
        &p("o.pcap"),
        "--port",
        &pa,
        "--port",
        &pb,
        "--chain",
        CHAIN,
        "--cores",
        "2",
        "--table-capacity",
        "4096",
        "--no-pin",
        "--json",
        "--ctl",
        &sock,
    ]);
    wait_ready(Path::new(&sock), &mut fp);
    let send = Command::new(BIN)
        .args(["run", "--input", &p("in.pcap"), "--output", &format!("afpacket:{}", v.peer())])
        .args(["--chain", "forward", "--rate", "5000", "--cores", "1", "--no-pin"])
        .output()
        .unwrap();
    assert!(send.status.success(), "sender: {}", String::from_utf8_lossy(&send.stderr));
    let t0 = Instant::now();
    while ctl(Path::new(&sock), &["show", "ports"]).1[0]["rx_packets"].as_u64().unwrap_or(0) < total {
        assert!(t0.elapsed() < Duration::from_secs(15), "the port did not count every packet");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(400));
    let out = fp.interrupt_and_wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["packets"].as_u64(), Some(total), "{}", r["packets"]);
    let (a, b) = (frames(Path::new(&p("a.pcap"))), frames(Path::new(&p("b.pcap"))));
    assert_eq!((a.len(), b.len()), (allow.len(), deny.len()), "packets per branch port");
    assert!(by_flow(&a) == by_flow(&allow), "port a: packets or per-flow order differ from the model");
    assert!(by_flow(&b) == by_flow(&deny), "port b: packets or per-flow order differ from the model");
    assert!(frames(Path::new(&p("o.pcap"))).is_empty(), "nothing on --output");
    let nf = |name: &str| r["nfs"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap().clone();
    assert_eq!(nf("deny/count")["details"], model["deny"], "deny/count: the model's totals");
    assert_eq!(nf("allow/fsc")["packets_in"].as_u64(), Some(allow.len() as u64));
    let fsc_flows = nf("allow/fsc")["details"]["flows_seen"].as_u64();
    assert_eq!(fsc_flows, Some(model["allow_flows"].as_array().unwrap().len() as u64), "allow/fsc: the model's flows");
    let _ = std::fs::remove_dir_all(&dir);
}

//! Timers on an idle live port (issue 31, item 5), as root on a veth pair the
//! test makes: with no packet arriving, the packet clock still advances (the
//! port's receive clock, ten ticks a second), so flows expire from the flow
//! table and fw's connections leave its table at their timeout, as `flowplane
//! ctl` shows while the run goes on. Before timers both stayed until the next
//! packet.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod ports_common;

use ports_common::{ctl_ok, wait_ready, Proc, Veth};

/// Sends one UDP packet on each of `n` flows (source ports 4000..) from 10.0.0.1 (scapy).
fn send(iface: &str, n: usize) {
    let script = format!(
        "from scapy.all import Ether, IP, UDP, Raw, sendp\n\
         pk=[Ether(src='02:00:00:00:00:01',dst='02:00:00:00:00:02')/IP(src='10.0.0.1',dst='10.0.0.2')/\
         UDP(sport=4000+i,dport=53)/Raw(b'x'*20) for i in range({n})]\n\
         sendp(pk, iface='{iface}', verbose=False)\n"
    );
    let st = std::process::Command::new("/usr/bin/python3").args(["-c", &script]).status().expect("python3 with scapy");
    assert!(st.success(), "scapy sender");
}

const METRICS: u16 = 19_621;

/// fw's `conns_live` on core 0, from the metrics endpoint (each NF's report field as a gauge).
fn fw_conns_live() -> Option<u64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", METRICS)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let line = text.lines().find(|l| {
        l.starts_with("flowplane_nf_stat{") && l.contains("nf=\"fw\"") && l.contains("name=\"conns_live\"")
    })?;
    line.rsplit(' ').next()?.parse::<f64>().ok().map(|v| v as u64)
}

#[test]
fn an_idle_port_expires_flows_and_fw_connections_at_their_timeout() {
    let v = Veth::new("tm");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("timers{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (sock, out) = (dir.join("fp.sock"), dir.join("out.pcap"));
    let mut fp = Proc::spawn(&[
        "run",
        "--input",
        &format!("afpacket:{}", v.0),
        "--output",
        out.to_str().unwrap(),
        "--chain",
        "fw(timeout=1,inside=10.0.0.0/24) -> fsc",
        "--idle-timeout",
        "1",
        "--cores",
        "1",
        "--no-pin",
        "--ctl",
        sock.to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{METRICS}"),
        "--json",
    ]);
    wait_ready(&sock, &mut fp);
    let n = 20u64;
    send(&v.peer(), n as usize);
    // Every flow in (fw's connections, published about twice a second), then no packet at all.
    let t1 = Instant::now();
    while fw_conns_live() != Some(n) {
        assert!(t1.elapsed() < Duration::from_secs(10), "fw holds one connection per flow: {:?}", fw_conns_live());
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = ctl_ok(&sock, &["show", "tables"]);
    // The veth's own IPv6 chatter (router solicitations, MLD) may add flows of its own.
    assert!(t[0]["insertions"].as_u64().unwrap() >= n, "{t}");
    // The timeout (1 s), the sweep's period (a quarter of it) and a tick later: all gone.
    std::thread::sleep(Duration::from_millis(2500));
    let t = ctl_ok(&sock, &["show", "tables"]);
    assert_eq!(t[0]["flows"].as_u64(), Some(0), "idle flows expire without packets: {t}");
    assert_eq!(t[0]["expiries"], t[0]["insertions"], "{t}");
    assert_eq!(fw_conns_live(), Some(0), "fw's idle connections leave its table without packets");
    // ctl shows the same report fields as the metrics.
    let nfs = ctl_ok(&sock, &["show", "nfs"]);
    assert_eq!(nfs[0]["stats"][0]["fields"]["conns_live"].as_u64(), Some(0), "{nfs}");
    assert_eq!(nfs[0]["stats"][0]["fields"]["opened"].as_u64(), Some(n), "{nfs}");
    assert_eq!(nfs[0]["stats"][0]["fields"]["swept"].as_u64(), Some(n), "the timer's sweep freed them: {nfs}");
    let outp = fp.interrupt_and_wait();
    assert!(outp.status.success(), "{}", String::from_utf8_lossy(&outp.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

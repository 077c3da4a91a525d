//! AF_PACKET over a veth pair (root: CI runs as root; without the rights
//! to create the pair this test fails loudly rather than passing).

use std::process::Command;

use flowplane_io::port::{self, PortOptions, PortSpec};
use flowplane_packet::{Batch, PacketPool, PoolConfig};

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false)
}

/// A veth pair removed on drop, even when the test fails.
struct Veth(String, String);

impl Veth {
    fn new(tag: &str) -> Veth {
        let a = format!("fpa{tag}{}", std::process::id() % 100_000);
        let b = format!("fpb{tag}{}", std::process::id() % 100_000);
        let _ = ip(&["link", "del", &a]);
        assert!(
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]),
            "cannot create a veth pair (this test needs root and iproute2)"
        );
        let v = Veth(a, b);
        for n in [&v.0, &v.1] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{n}/disable_ipv6"), "1");
            assert!(ip(&["link", "set", n, "up"]));
        }
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.0]);
    }
}

fn frame(i: u16) -> Vec<u8> {
    let mut f = vec![0u8; 60 + (i % 50) as usize];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    f[14..16].copy_from_slice(&i.to_be_bytes());
    f
}

#[test]
fn veth_round_trip_in_order_with_counters() {
    let v = Veth::new("p");
    let rx_port =
        port::open(&PortSpec::parse(&format!("afpacket:{}", v.0)).unwrap(), 1, PortOptions::default()).unwrap();
    let tx_port =
        port::open(&PortSpec::parse(&format!("afpacket:{}", v.1)).unwrap(), 1, PortOptions::default()).unwrap();
    let mut rxq = rx_port.open_rx(0).unwrap();
    let mut txq = tx_port.open_tx(0).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    let n = 200u16;
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        for &i in chunk {
            assert!(b.push_copy(&mut pool, &frame(i), 0));
        }
        let (sent, _, lost) = txq.tx_batch(&b, 0);
        assert_eq!((sent, lost), (chunk.len() as u64, 0));
        b.free_all(&mut pool).unwrap();
    }
    let mut got = Vec::new();
    let t0 = std::time::Instant::now();
    while got.len() < n as usize && t0.elapsed().as_secs() < 5 {
        let k = rxq.rx_burst(&mut pool, &mut b, 64);
        for i in 0..k {
            let d = b.data(i);
            if d.len() >= 16 && d[12..14] == [0x88, 0xb5] {
                got.push(d.to_vec());
            }
        }
        b.free_all(&mut pool).unwrap();
        if k == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(got.len(), n as usize, "every frame arrives");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &frame(i as u16), "frame {i} intact and in order");
    }
    assert_eq!(pool.stats().free, 1024, "every buffer back in the pool");
    let s = rx_port.stats();
    assert!(s.rx_packets >= n as u64 && s.rx_overrun == 0 && s.rx_pool_empty == 0);
    assert_eq!(tx_port.stats().tx_full, 0);
}

/// A port of several queues (a fanout group) sending on its own interface does not receive
/// what it sent. The per-socket PACKET_IGNORE_OUTGOING does not apply inside a fanout group
/// (the group's hook receives, as the kernel's selftest for PACKET_FANOUT_FLAG_IGNORE_OUTGOING
/// notes); what keeps them out is the transmit socket's PACKET_QDISC_BYPASS, whose direct
/// transmit skips the taps. This guards that property.
#[test]
fn a_fanout_group_does_not_receive_its_own_transmissions() {
    let v = Veth::new("o");
    let port = port::open(&PortSpec::parse(&format!("afpacket:{}", v.0)).unwrap(), 2, PortOptions::default()).unwrap();
    let mut rxs: Vec<_> = (0..2).map(|q| port.open_rx(q).unwrap()).collect();
    let mut txq = port.open_tx(0).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for i in 0..50u16 {
        assert!(b.push_copy(&mut pool, &frame(i), 0));
    }
    assert_eq!(txq.tx_batch(&b, 0).0, 50);
    b.free_all(&mut pool).unwrap();
    let mut own = 0;
    let t0 = std::time::Instant::now();
    while t0.elapsed().as_millis() < 300 {
        for rx in rxs.iter_mut() {
            let k = rx.rx_burst(&mut pool, &mut b, 64);
            own += (0..k).filter(|&i| b.data(i).len() >= 16 && b.data(i)[12..14] == [0x88, 0xb5]).count();
            b.free_all(&mut pool).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(own, 0, "the port's own transmissions came back as input");
}

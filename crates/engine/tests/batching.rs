//! What an NF does with a packet does not depend on how packets were grouped
//! into batches: every registered executor, at batch sizes 1, 4, 64 and 256,
//! gives the verdicts, rewritten bytes, counters and exports of per-packet
//! run-to-completion with batches of one — on traces where flows end mid-batch
//! (RST, FIN handshakes), ports are reused after release, and ICMP errors
//! refer to known flows.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline, StateLayout};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::{ipv4_frame, tcp4, udp4};
use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};
use flowplane_wire::checksum;

/// Every registered executor, and the interleaved one at several task counts.
fn kinds() -> Vec<ExecKind> {
    let mut v: Vec<ExecKind> = ExecKind::all().collect();
    v.extend(["interleaved:1", "interleaved:4", "interleaved:64"].map(|s| ExecKind::parse(s).unwrap()));
    v
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;

/// What a run produced, per packet and at the end.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// Verdict and bytes of every packet, in trace order.
    packets: Vec<(u16, Vec<u8>)>,
    counters: Vec<(String, NfCounters)>,
    /// The report of the NF under test (the exported one). Other NFs' reports
    /// may count default actions, which the aggregated layout runs for every
    /// 5-tuple NF when a flow enters the chain (see `StatefulNf::init`).
    details: Option<serde_json::Value>,
    ended: u64,
    export: Vec<String>,
}

/// Runs frames with their timestamps (the packet clock), `batch_size` at a time.
fn run_timed(chain: &str, kind: ExecKind, batch_size: usize, frames: &[(u64, Vec<u8>)], export: &str) -> Outcome {
    let c = Chain::build(&parse(chain).unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
    let mut p = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut packets = Vec::new();
    for chunk in frames.chunks(batch_size) {
        for (ts, f) in chunk {
            assert!(batch.push_copy(&mut pool, f, *ts));
        }
        // As the worker does: table bookkeeping sees the batch's latest time.
        let now_ns = chunk.iter().map(|(ts, _)| *ts).max().unwrap_or(0).max(1_000);
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns });
        for i in 0..batch.len() {
            packets.push((batch.verdicts()[i], batch.data(i).to_vec()));
        }
        batch.free_all(&mut pool).unwrap();
    }
    let counters = p.nf_results().into_iter().map(|(n, c, _)| (n, c)).collect();
    let details = p.nf_results().into_iter().find(|(n, _, _)| n == export).and_then(|(_, _, d)| d);
    let mut export: Vec<String> = p.export(export, true).unwrap_or_default().iter().map(|r| r.to_string()).collect();
    export.sort();
    Outcome { packets, counters, details, ended: p.store_report().ended, export }
}

/// Runs `chain` under every executor and batch size; all must equal rtc with batches of one.
fn all_agree(chain: &str, frames: &[Vec<u8>], export: &str) -> Outcome {
    let timed: Vec<(u64, Vec<u8>)> = frames.iter().map(|f| (0, f.clone())).collect();
    all_agree_timed(chain, &timed, export)
}

/// [`all_agree`] for frames with timestamps.
fn all_agree_timed(chain: &str, frames: &[(u64, Vec<u8>)], export: &str) -> Outcome {
    let rtc = ExecKind::parse("rtc").unwrap();
    let reference = run_timed(chain, rtc, 1, frames, export);
    for kind in kinds() {
        for size in [1, 4, 64, 256] {
            let o = run_timed(chain, kind, size, frames, export);
            for (i, (a, b)) in o.packets.iter().zip(&reference.packets).enumerate() {
                assert_eq!(a, b, "{chain}: packet {i} under {kind} at batch size {size}");
            }
            assert_eq!(o.counters, reference.counters, "{chain}: counters under {kind} at batch size {size}");
            assert_eq!(o.details, reference.details, "{chain}: NF reports under {kind} at batch size {size}");
            // `ended` counts entries: under pernf an ended flow leaves each per-NF table that held it.
            if kind.info().layout == StateLayout::Aggregated {
                assert_eq!(o.ended, reference.ended, "{chain}: ended flows under {kind} at batch size {size}");
            } else {
                assert!(o.ended >= reference.ended, "{chain}: ended entries under {kind} at batch size {size}");
            }
            assert_eq!(o.export, reference.export, "{chain}: export under {kind} at batch size {size}");
        }
    }
    reference
}

#[test]
fn nat_release_takes_effect_at_the_rst() {
    // The trace: one external port; the RST frees it for the second host.
    let frames = vec![
        tcp4([10, 0, 0, 1], [198, 51, 100, 7], 1000, 80, SYN, 1, 0),
        tcp4([10, 0, 0, 1], [198, 51, 100, 7], 1000, 80, RST, 2, 0),
        tcp4([10, 0, 0, 2], [198, 51, 100, 7], 1000, 80, SYN, 9, 0),
    ];
    let o = all_agree("nat(ports=1024-1024)", &frames, "nat");
    assert!(o.packets.iter().all(|(v, _)| *v != DROP), "all three pass: {:?}", o.counters);
    // The second host got the released port 1024 (TCP source port at 34..36).
    assert_eq!(u16::from_be_bytes([o.packets[2].1[34], o.packets[2].1[35]]), 1024);
}

/// TCP connections from inside hosts, interleaved: handshakes, data, FIN
/// teardowns, RSTs, a client port reused after its connection closed, stray
/// packets of no connection, and a UDP flow with an ICMP error about it.
fn tcp_trace() -> Vec<Vec<u8>> {
    let server = [198, 51, 100, 7];
    let mut conns: Vec<Vec<Vec<u8>>> = Vec::new();
    for c in 0..24u32 {
        let client = [10, 0, 0, 1 + (c % 4) as u8];
        // Connections 12.. reuse the client ports of 0..: port reuse after release.
        let port = 2000 + (c % 12) as u16;
        let (ci, si) = (1000 * c + 7, 500_000 + 1000 * c);
        let mut p = vec![
            tcp4(client, server, port, 80, SYN, ci, 0),
            tcp4(server, client, 80, port, SYN | ACK, si, ci + 1),
            tcp4(client, server, port, 80, ACK, ci + 1, si + 1),
            tcp4(client, server, port, 80, ACK | PSH, ci + 1, si + 1),
        ];
        if c % 3 == 0 {
            p.push(tcp4(client, server, port, 80, RST, ci + 1, 0));
        } else {
            p.push(tcp4(client, server, port, 80, FIN | ACK, ci + 1, si + 1));
            p.push(tcp4(server, client, 80, port, FIN | ACK, si + 1, ci + 2));
            p.push(tcp4(client, server, port, 80, ACK, ci + 2, si + 2));
        }
        // Late packets after the end, both directions: fresh state must judge them.
        p.push(tcp4(client, server, port, 80, ACK, ci + 2, si + 2));
        p.push(tcp4(server, client, 80, port, ACK, si + 2, ci + 2));
        conns.push(p);
    }
    // Interleave: connection c starts at step c/2, so its packets mix with its neighbours'.
    let mut frames = Vec::new();
    let steps = conns.iter().map(Vec::len).max().unwrap() + conns.len();
    for step in 0..steps {
        for (c, p) in conns.iter().enumerate() {
            if step >= c / 2 {
                if let Some(f) = p.get(step - c / 2) {
                    frames.push(f.clone());
                }
            }
        }
        if step == 3 {
            // A UDP exchange and an ICMP port-unreachable about it, and a stray ACK.
            let out = udp4([10, 0, 0, 9], server, 5353, 53);
            frames.push(out.clone());
            frames.push(icmp_unreachable(server, [10, 0, 0, 9], &out[14..42]));
            frames.push(tcp4(server, [10, 0, 0, 3], 80, 4444, ACK, 1, 1));
        }
    }
    frames
}

/// ICMP destination unreachable (port) from `src` to `dst`, quoting `quoted` (IP header + 8 bytes).
fn icmp_unreachable(src: [u8; 4], dst: [u8; 4], quoted: &[u8]) -> Vec<u8> {
    let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(quoted);
    let c = checksum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(src, dst, 1, &icmp)
}

#[test]
fn firewall_ends_and_port_reuse_agree_across_batching() {
    let frames = tcp_trace();
    let o = all_agree("fsc -> fw -> count", &frames, "fsc");
    assert!(o.ended >= 24, "every connection ended ({} flows ended)", o.ended);
    let fw = &o.counters[1].1;
    assert!(fw.dropped > 0 && fw.packets_out > fw.dropped, "{fw:?}");
}

#[test]
fn chains_of_nat_and_fw_agree_across_batching() {
    // nat holds ports that fw's ends release: the per-packet fallback.
    let frames = tcp_trace();
    all_agree("nat(ports=1024-1027) -> fw(allow_new=any) -> fsc", &frames, "fsc");
    all_agree("fw(allow_new=any) -> nat(ports=1024-1027) -> count", &frames, "nat");
}

#[test]
fn nat_with_a_small_pool_agrees_across_batching() {
    // Four external ports for 24 connections: releases (RST) and exhaustion both happen mid-batch.
    let frames = tcp_trace();
    let o = all_agree("nat(ports=1024-1027) -> fsc", &frames, "fsc");
    let nat = &o.counters[0].1;
    assert!(nat.dropped > 0, "the pool runs out at times: {nat:?}");
}

/// TCP connections through a NAT with replies addressed to its external
/// port: filter probes from the server's other port and from another host,
/// RSTs from either side, FIN closes in either order with TIME_WAIT
/// (`fin_timeout`) ending mid-trace, packets during and after TIME_WAIT, and
/// a pool smaller than the connections so released ports are reused. The
/// external ports come from a reference NAT run packet by packet while the
/// trace is written (`nat_params` must be the chain's).
fn nat_trace(nat_params: &[(&str, &str)]) -> Vec<(u64, Vec<u8>)> {
    use flowplane_nf::nat::{kind, Nat};
    use flowplane_nf::testutil::Harness;
    use flowplane_nf::Params;
    const MS: u64 = 1_000_000;
    let ext = [203, 0, 113, 1];
    // (time, connection, step, outbound?, flags, remote host, remote port)
    type Event = (u64, usize, usize, bool, u8, [u8; 4], u16);
    let mut events: Vec<Event> = Vec::new();
    for c in 0..16usize {
        let server = [198, 51, 100, 1 + (c % 3) as u8];
        let t0 = c as u64 * 150 * MS;
        let mut script: Vec<(u64, bool, u8, [u8; 4], u16)> = vec![
            (0, true, SYN, server, 80),
            (1, false, SYN | ACK, server, 80),
            (2, true, ACK, server, 80),
            (3, false, ACK | PSH, server, 81), // the server's other port: adf only
            (4, false, ACK | PSH, [192, 0, 2, 66], 80), // another host: eif only
            (5, false, ACK | PSH, server, 80),
        ];
        match c % 4 {
            0 => script.extend([(6, true, RST, server, 80), (8, false, ACK, server, 80)]),
            1 => script.extend([
                (6, true, FIN | ACK, server, 80),
                (7, false, FIN | ACK, server, 80),
                (8, true, ACK, server, 80),
                (500, false, FIN | ACK, server, 80), // retransmitted during TIME_WAIT
                (1300, false, ACK, server, 80),      // after it: stale
                (1400, true, ACK, server, 80),       // after it: a new mapping
            ]),
            2 => script.extend([
                (6, false, FIN | ACK, server, 80),
                (7, true, FIN | ACK, server, 80),
                (8, false, ACK, server, 80),
                (1200, true, ACK, server, 80),
            ]),
            _ => script.extend([
                (6, false, RST, server, 80),
                (7, true, ACK | PSH, server, 80), // the port is still held
                (9, true, RST, server, 80),
            ]),
        }
        for (k, (dt, out, flags, host, port)) in script.into_iter().enumerate() {
            events.push((t0 + dt * MS, c, k, out, flags, host, port));
        }
    }
    events.sort();
    let params = nat_params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut h = Harness::new(Nat::from_params(&mut Params::new("nat", params)).unwrap());
    let mut last_port = [1024u16; 16];
    let mut frames = Vec::new();
    for (t, c, k, out, flags, host, port) in events {
        let client = [10, 0, 0, 1 + (c % 4) as u8];
        let cport = 2000 + c as u16;
        let seq = 1000 * c as u32 + k as u32;
        h.now_ns = t;
        let f = if out {
            tcp4(client, host, cport, port, flags, seq, 1)
        } else {
            // The port the reference NAT maps this connection to now (or last did).
            if let Some(st) = h.state_of(&tcp4(client, [198, 51, 100, 1 + (c % 3) as u8], cport, 80, ACK, 0, 0)) {
                if st.kind == kind::OUTBOUND || st.kind == kind::OUTBOUND_CLOSING {
                    last_port[c] = st.port;
                }
            }
            tcp4(host, ext, port, last_port[c], flags, seq, 1)
        };
        h.run(&f);
        frames.push((t, f));
    }
    frames
}

fn nat_report(o: &Outcome) -> &serde_json::Value {
    o.details.as_ref().expect("nat reports")
}

#[test]
fn nat_filtering_and_fin_release_agree_across_batching() {
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    let mut filtered = Vec::new();
    for filter in ["eif", "adf", "apdf"] {
        let params = [("ports", "1024-1029"), ("fin_timeout", "1"), ("filter", filter)];
        let frames = nat_trace(&params);
        let chain = format!("nat(ports=1024-1029, fin_timeout=1, filter={filter}) -> fsc");
        let o = all_agree_timed(&chain, &frames, "nat");
        let r = nat_report(&o);
        assert!(u(r, "time_wait_released") >= 4, "TIME_WAITs end mid-trace: {r}");
        assert!(u(r, "fin_closed_connections") >= 4, "{r}");
        assert!(u(r, "dropped_stale") > 0 && u(r, "remapped_after_time_wait") > 0, "{r}");
        assert!(u(r, "dropped_pool_exhausted") > 0, "6 ports for 16 connections: {r}");
        assert!(u(r, "rst_ended_flows") > 0, "{r}");
        filtered.push(u(r, "dropped_filtered"));
    }
    // eif lets both probes in, adf the server's other port, apdf neither.
    assert_eq!(filtered[0], 0);
    assert!(filtered[1] > 0 && filtered[2] > filtered[1], "{filtered:?}");
}

/// Idle expiry mid-trace: a flow idle past its timeout is expired on lookup
/// at its packet's time (or earlier by the sweep: the same release either
/// way), so its next packet starts fresh state and a fresh mapping whatever
/// the batching; the reply to the new mapping is translated back.
#[test]
fn idle_expiry_mid_trace_agrees_across_batching() {
    const S: u64 = 1_000_000_000;
    let server = [198, 51, 100, 7];
    let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    let mut frames: Vec<(u64, Vec<u8>)> =
        vec![(S, udp4(a, server, 1000, 53)), (S + 10_000_000, udp4(b, server, 1000, 53))];
    // b stays active every 0.4 s; a is idle for 2 s (timeout 1 s).
    for k in 1..=5u64 {
        frames.push((S + k * 400_000_000, udp4(b, server, 1000, 53)));
    }
    frames.push((3 * S, udp4(a, server, 1000, 53)));
    let mapped = |o: &Outcome, i: usize| u16::from_be_bytes([o.packets[i].1[34], o.packets[i].1[35]]);
    // Two ports: a's old port is the only one free once a is released.
    let chain = "nat(ports=1024-1025, timeout=1) -> fsc";
    let probe = run_timed(chain, ExecKind::parse("rtc").unwrap(), 1, &frames, "nat");
    let port_a = mapped(&probe, frames.len() - 1);
    frames.push((3 * S + 1_000_000, udp4(server, [203, 0, 113, 1], 53, port_a)));
    frames.push((3 * S + 2_000_000, udp4(a, server, 1000, 53)));
    let o = all_agree_timed(chain, &frames, "fsc");
    let n = frames.len();
    assert!(o.packets.iter().all(|(v, _)| *v != DROP), "every packet passes: {:?}", o.counters);
    assert_eq!(mapped(&o, n - 3), mapped(&o, 0), "a's released port is the only free one");
    // The reply reaches a again (destination rewritten to 10.0.0.1:1000).
    assert_eq!(o.packets[n - 2].1[30..34], a);
    assert_eq!(u16::from_be_bytes([o.packets[n - 2].1[36], o.packets[n - 2].1[37]]), 1000);
    // fsc restarted a's flow: 2 packets since it came back, not 3.
    let a_row = o.export.iter().find(|r| r.contains("10.0.0.1") && r.contains("\"packets\":2")).cloned();
    assert!(a_row.is_some(), "fsc export: {:?}", o.export);
}

/// Flows dropped upstream never reach lb: its per-backend counts, hh's flow
/// count and acl's per-rule flow counts advance at a flow's first packet
/// that reaches the NF, not when the aggregated layout inserts the flow
/// (which runs every NF's default action) — so the figures are the same
/// under every layout and executor.
#[test]
fn flows_dropped_upstream_do_not_move_lb_or_counts() {
    let mut frames = Vec::new();
    for k in 0..40u8 {
        // Every third client is denied by the acl.
        let src = [10, 0, 1, k];
        frames.push(udp4(src, [198, 51, 100, 7], 4000 + u16::from(k), 80));
        frames.push(udp4(src, [198, 51, 100, 7], 4000 + u16::from(k), 80));
    }
    let rule: String =
        (0..40u8).filter(|k| k % 3 == 0).map(|k| format!("drop:udp:10.0.1.{k}/32")).collect::<Vec<_>>().join(";");
    let chain = format!("acl(rule={rule}) -> lb(backends=3) -> hh(k=4)");
    let o = all_agree(&chain, &frames, "lb");
    let denied = (0..40).filter(|k| k % 3 == 0).count();
    assert_eq!(o.export.len(), 40 - denied, "one lb row per admitted flow: {:?}", o.export);
    // Each admitted flow's backend by lb's rule (the flow's hash scaled to the pool), counted once.
    let mut want = [0u64; 3];
    for k in (0..40u8).filter(|k| k % 3 != 0) {
        let f = udp4([10, 0, 1, k], [198, 51, 100, 7], 4000 + u16::from(k), 80);
        want[flowplane_nf::lb::backend_for(&flowplane_nf::PktMeta::parse(&f).tuple, 3) as usize] += 1;
    }
    let lb = o.details.as_ref().expect("lb reports");
    assert_eq!(lb["ipv4"]["flows_per_backend"], serde_json::json!(want));
    assert_eq!(want.iter().sum::<u64>(), (40 - denied) as u64);
}

#[test]
fn resumable_actions_agree_across_batching_with_back_to_back_packets() {
    // Runs of 1..=4 back-to-back packets per flow, flows revisited later:
    // the interleaved executor must keep each flow's packets in order while
    // the synthetic chase (k steps), nat, fw and acl take their steps.
    let mut frames = Vec::new();
    for round in 0..3u32 {
        for f in 0..40u32 {
            let client = [10, 0, (f >> 4) as u8, 1 + (f & 15) as u8];
            for r in 0..=(f + round) % 4 {
                frames.push(udp4(client, [198, 51, 100, 7], 3000 + f as u16, 53 + r as u16 % 2));
            }
        }
    }
    frames.extend(tcp_trace());
    let o = all_agree("synthetic(k=4, mem=64k) -> fsc", &frames, "synthetic");
    assert_eq!(o.counters[0].1.packets_in, frames.len() as u64);
    assert_eq!(o.details.as_ref().unwrap()["indirect_reads"], 4 * frames.len() as u64);
    all_agree(
        "nat(ports=1024-1100) -> synthetic(k=2, mem=4k) -> acl(rule=drop:udp:any:any:any:54) -> fsc",
        &frames,
        "fsc",
    );
    all_agree("fw(allow_new=any) -> synthetic(k=3, mem=64k) -> fsc", &frames, "synthetic");
    // LPM steps (tbl24, tbl8) on the destination NAT leaves or rewrites.
    let routes = std::env::temp_dir().join(format!("fp-batching-routes-{}.txt", std::process::id()));
    std::fs::write(&routes, "198.51.100.0/24 1\n198.51.100.7/32 2\n10.0.0.0/8 3\n0.0.0.0/0 4\n").unwrap();
    let chain = format!("nat(ports=1024-1100) -> route(routes={}) -> fsc", routes.display());
    let o = all_agree(&chain, &frames, "route");
    let taken: std::collections::BTreeSet<u16> = o.packets.iter().map(|(v, _)| *v).collect();
    assert!(taken.contains(&2) && taken.contains(&3), "routes taken: {taken:?} {:?}", o.details);
    let _ = std::fs::remove_file(&routes);
}

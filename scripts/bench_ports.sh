#!/usr/bin/env bash
# Port figures (root; a release build with --features dpdk for the DPDK parts):
#   scripts/bench_ports.sh veth      # per backend on one veth pair: loss vs offered rate, busy cycles/packet
#   scripts/bench_ports.sh null      # DPDK net_null forward vs dpdk-testpmd --forward-mode=io, one core
#   scripts/bench_ports.sh pcap      # DPDK net_pcap infinite_rx, 1M flows, 64 B, random: forward, fsc, lb -> fsc -> ratelimit
# Env: BACKENDS="afpacket afxdp dpdk_af_packet", RATES="50000 100000 150000 200000", FP=target/release/flowplane.
set -euo pipefail
cd "$(dirname "$0")/.."
FP=${FP:-target/release/flowplane}
EAL="--no-huge --no-pci -m 1024 --no-shconf --no-telemetry"
tmp=$(mktemp -d)
ID=bp$$
cleanup() { ip netns del fA$ID 2>/dev/null || true; ip netns del fB$ID 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

pn() { case $1 in dpdk_af_packet) echo "dpdk:net_af_packet$3,iface=$2,qdisc_bypass=1,framecnt=16384";; *) echo "$1:$2";; esac; }

veth() {
    ip netns add fA$ID; ip netns add fB$ID
    ip link add fa$ID type veth peer name v0 netns fA$ID
    ip link add fb$ID type veth peer name v0 netns fB$ID
    for n in fa$ID fb$ID; do sysctl -qw net.ipv6.conf.$n.disable_ipv6=1; ip link set $n up; done
    for ns in fA$ID fB$ID; do ip netns exec $ns sh -c "sysctl -qw net.ipv6.conf.all.disable_ipv6=1; ip link set v0 up"; done
    "$FP" gen --flows 1000 --packets 200000 --size 64 --proto udp --seed 1 -o "$tmp/t.pcap" >/dev/null
    echo "replay baseline (in memory, forward, 1 core):"
    "$FP" run --input "$tmp/t.pcap" --chain forward --cores 1 --loops 20 --json |
        python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  {j['mpps']:.1f} Mpps, {j['cycles_per_packet']:.1f} cycles/packet\")"
    for be in ${BACKENDS:-afpacket afxdp dpdk_af_packet}; do
        for r in ${RATES:-50000 100000 150000 200000}; do
            "$FP" run --input "$(pn $be fa$ID 0)" --output "$(pn $be fb$ID 1)" --chain forward --cores 1 --pool 16384 --json >"$tmp/fp.json" 2>/dev/null &
            pid=$!
            sleep 2
            sent=$(ip netns exec fA$ID taskset -c 1 "$FP" run --input "$tmp/t.pcap" --output afpacket:v0 --chain forward \
                --rate "$r" --duration 3 --cores 1 --no-pin --json | python3 -c "import json,sys; print(json.load(sys.stdin)['packets_out'])")
            sleep 0.5
            kill -INT $pid; wait $pid || true
            python3 - "$be" "$r" "$sent" "$tmp/fp.json" <<'PY'
import json, sys
be, r, sent, f = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
j = json.load(open(f)); p = j['ports']
lost = sent - p[1]['tx_packets']
print(f"{be:15} offered {r/1e3:6.0f} kpps (sent {sent/3e3:5.0f} kpps): lost {lost} ({lost/max(sent,1)*100:.3f}%), "
      f"rx_overrun {p[0]['rx_overrun']}, tx_full {p[1]['tx_full']}, busy cycles/packet {j['cycles_per_packet']:.0f}")
PY
        done
    done
}

null() {
    echo "dpdk-testpmd io, net_null0 <-> net_null1, one forwarding core (Rx-pps per port; both directions on the core):"
    timeout -s INT 12 dpdk-testpmd $EAL --vdev net_null0 --vdev net_null1 -l 0,1 -- --forward-mode=io --nb-cores=1 \
        --auto-start --stats-period 3 2>&1 | grep -E "Rx-pps" | tail -2 || true
    for b in 32 64; do
        "$FP" run --input dpdk:net_null0 --output dpdk:net_null1 --chain forward --cores 1 --batch $b --duration 5 --warmup 1 --json |
            python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"flowplane forward, batch $b: {j['mpps']:.2f} Mpps, {j['cycles_per_packet']:.1f} busy cycles/packet\")"
    done
}

pcap() {
    "$FP" gen --flows 1000000 --packets 1000000 --size 64 --dist uniform --order random --proto udp --seed 1 -o "$tmp/m1.pcap" >/dev/null
    for c in "forward" "fsc" "lb -> fsc -> ratelimit"; do
        "$FP" run --input "dpdk:net_pcap0,rx_pcap=$tmp/m1.pcap,infinite_rx=1" --output dpdk:net_null0 --chain "$c" --cores 1 \
            --pool 1100000 --eal "--no-huge --no-pci -m 8192 --no-shconf --no-telemetry" --duration 5 --warmup 2 --json 2>/dev/null |
            python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"net_pcap infinite_rx, 1M flows: {'$c':24} {j['mpps']:.2f} Mpps, {j['cycles_per_packet']:.0f} busy cycles/packet\")"
    done
}

case "${1:-veth}" in
    veth) veth ;;
    null) null ;;
    pcap) pcap ;;
    *) echo "usage: $0 veth|null|pcap" >&2; exit 2 ;;
esac

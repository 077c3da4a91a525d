#!/usr/bin/env bash
# Port figures (root; a release build with --features dpdk for the DPDK parts):
#   scripts/bench_ports.sh veth      # per backend on one veth pair: loss vs offered rate, busy cycles/packet
#   scripts/bench_ports.sh mlffr     # per backend on one veth pair: the highest loss-free rate (flowplane mlffr)
#   scripts/bench_ports.sh null      # DPDK net_null forward vs dpdk-testpmd --forward-mode=io, one core: the ratio
#   scripts/bench_ports.sh pcap      # DPDK net_pcap infinite_rx, 1M flows, 64 B, random: forward, fsc, lb -> fsc -> ratelimit
# Env: BACKENDS="afpacket afxdp dpdk_af_packet", RATES="50000 100000 150000 200000", FP=target/release/flowplane;
#      mlffr: LOSS=0.1 RES=1 TRIAL=1 SENDER=afpacket RT=1 CHAIN=forward;
#      null: ROUNDS=5 SECS=5 BURST=32; null and pcap: RT=1 (a real-time priority for the measured runs; RT=0: none).
set -euo pipefail
cd "$(dirname "$0")/.."
FP=${FP:-target/release/flowplane}
EAL="--no-huge --no-pci -m 1024 --no-shconf --no-telemetry"
tmp=$(mktemp -d)
ID=bp$$
cleanup() { ip netns del fA$ID 2>/dev/null || true; ip netns del fB$ID 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

pn() { case $1 in dpdk_af_packet) echo "dpdk:net_af_packet$3,iface=$2,qdisc_bypass=1,framecnt=16384";; *) echo "$1:$2";; esac; }

veth_setup() {
    ip netns add fA$ID; ip netns add fB$ID
    ip link add fa$ID type veth peer name v0 netns fA$ID
    ip link add fb$ID type veth peer name v0 netns fB$ID
    for n in fa$ID fb$ID; do sysctl -qw net.ipv6.conf.$n.disable_ipv6=1; ip link set $n up; done
    for ns in fA$ID fB$ID; do ip netns exec $ns sh -c "sysctl -qw net.ipv6.conf.all.disable_ipv6=1; ip link set v0 up"; done
    "$FP" gen --flows 1000 --packets 200000 --size 64 --proto udp --seed 1 -o "$tmp/t.pcap" >/dev/null
    echo "replay baseline (in memory, forward, 1 core):"
    "$FP" run --input "$tmp/t.pcap" --chain forward --cores 1 --loops 20 --json |
        python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"  {j['mpps']:.1f} Mpps, {j['cycles_per_packet']:.1f} cycles/packet\")"
}

# One trial: flowplane forwards fa -> fb with backend $1 while a sender in namespace fA offers $2 packets/s for
# 3 s (CPU 1). Prints "offered sent lost_percent": lost = sent - what flowplane transmitted on fb.
trial() {
    local be=$1 r=$2 pid sent
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
print(r, sent / 3, lost / max(sent, 1) * 100, file=open(f + ".trial", "w"))
print(f"{be:15} offered {r/1e3:6.0f} kpps (sent {sent/3e3:5.0f} kpps): lost {lost} ({lost/max(sent,1)*100:.3f}%), "
      f"rx_overrun {p[0]['rx_overrun']}, tx_full {p[1]['tx_full']}, busy cycles/packet {j['cycles_per_packet']:.0f}")
PY
}

veth() {
    veth_setup
    for be in ${BACKENDS:-afpacket afxdp dpdk_af_packet}; do
        for r in ${RATES:-50000 100000 150000 200000}; do
            trial "$be" "$r"
        done
    done
}

# The highest loss-free rate per backend: `flowplane mlffr` on the ports, which sends the trace itself (a paced
# sender on the far end of fa's link, in namespace fA; SENDER=afpacket|afxdp picks its socket), counts what leaves
# fb's link in namespace fB, and binary-searches below the sender's own maximum (its flat-out first trial). Prints
# every trial, the MLFFR, the sender's maximum (which of the two was the limit) and busy cycles/packet beside the
# in-memory replay's. At a real-time priority (RT=1, as null and pcap): on a shared machine, other processes would
# otherwise preempt the sender and the worker, and both the rates and the busy cycles would be theirs.
# Env: LOSS=0.1 (%), RES=1 (% of the bracket), TRIAL=1 (s), SENDER=afpacket, RT=1, CHAIN=forward (a slower chain,
# e.g. "burn(iters=1000)", makes flowplane rather than the sender the limit).
mlffr() {
    veth_setup
    local s=${SENDER:-afpacket} rt=()
    [[ ${RT:-1} == 1 ]] && chrt -f 50 true 2>/dev/null && rt=(chrt -f 50)
    for be in ${BACKENDS:-afpacket afxdp dpdk_af_packet}; do
        echo "$be:${rt:+ (${rt[*]})}"
        "${rt[@]}" "$FP" mlffr --input "$(pn $be fa$ID 0)" --output "$(pn $be fb$ID 1)" --send "$s:v0@fA$ID" --recv "afpacket:v0@fB$ID" \
            --trace "$tmp/t.pcap" --chain "${CHAIN:-forward}" --cores 1 --pool 65536 \
            --loss "${LOSS:-0.1}" --resolution "${RES:-1}" --trial "${TRIAL:-1}" | sed 's/^/  /'
    done
}

# The net_null figure: flowplane `forward` vs dpdk-testpmd io forwarding, both on one forwarding core (CPU 0,
# where flowplane pins its worker; testpmd's main lcore, which only prints, on CPU 1),
# interleaved over $ROUNDS rounds of $SECS s, at the same burst ($BURST: testpmd's default 32). testpmd forwards
# net_null0 -> net_null1 and back on its one core, so its packet rate is the sum of both ports' Rx-pps (median of
# the per-second samples after the first two); flowplane forwards net_null0 -> net_null1 (--warmup 1, then $SECS s).
# cycles/packet = TSC Hz / rate: on net_null a forwarding core is never idle. Prints each round, then the medians
# and the ratio. Both run at a real-time priority (chrt -f 50, RT=0 to turn off): on a shared machine other
# processes then keep off the forwarding core, and rounds agree within a few % instead of +-30%.
# Env: ROUNDS=5 SECS=5 BURST=32 RT=1.
null() {
    local rounds=${ROUNDS:-5} secs=${SECS:-5} burst=${BURST:-32} rt=()
    [[ ${RT:-1} == 1 ]] && chrt -f 50 true 2>/dev/null && rt=(chrt -f 50)
    echo "net_null forward, one core (CPU 0), burst $burst, $rounds rounds of ${secs}s, testpmd and flowplane" \
        "interleaved${rt:+, ${rt[*]}}"
    for r in $(seq 1 "$rounds"); do
        timeout -s INT $((secs + 4)) "${rt[@]}" dpdk-testpmd $EAL --vdev net_null0 --vdev net_null1 -l 0,1 --main-lcore 1 \
            -- --forward-mode=io --nb-cores=1 --burst="$burst" --auto-start --stats-period 1 \
            >"$tmp/testpmd.$r" 2>&1 || true
        "${rt[@]}" "$FP" run --input dpdk:net_null0 --output dpdk:net_null1 --chain forward --cores 1 --batch "$burst" \
            --duration "$secs" --warmup 1 --json >"$tmp/fp.$r" 2>"$tmp/fp.$r.err" ||
            { cat "$tmp/fp.$r.err" >&2; exit 1; }
    done
    python3 - "$tmp" "$rounds" <<'PY'
import json, re, statistics as st, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
tp, fp, ghz = [], [], []
for r in range(1, rounds + 1):
    pps = [int(x) for x in re.findall(r"Rx-pps:\s+(\d+)", open(f"{tmp}/testpmd.{r}", errors="replace").read())]
    sums = [pps[i] + pps[i + 1] for i in range(0, len(pps) - 1, 2)][2:]
    if not sums:
        sys.exit(f"round {r}: no testpmd Rx-pps samples (see dpdk-testpmd's output)")
    j = json.load(open(f"{tmp}/fp.{r}"))
    tp.append(st.median(sums) / 1e6); fp.append(j["mpps"]); ghz.append(j["tsc_ghz"])
    print(f"round {r}: testpmd io {tp[-1]:6.2f} Mpps   flowplane forward {fp[-1]:6.2f} Mpps   ratio {fp[-1] / tp[-1]:.3f}")
t, f, g = st.median(tp), st.median(fp), st.median(ghz)
print(f"median:  testpmd io {t:6.2f} Mpps ({g * 1e3 / t:5.1f} cycles/packet)   "
      f"flowplane forward {f:6.2f} Mpps ({g * 1e3 / f:5.1f} cycles/packet)")
print(f"ratio flowplane/testpmd: {f / t:.3f} (median of rates; per-round ratios {min(a / b for a, b in zip(fp, tp)):.3f}"
      f"..{max(a / b for a, b in zip(fp, tp)):.3f}; target >= 0.9)")
PY
}

pcap() {
    local rt=()
    [[ ${RT:-1} == 1 ]] && chrt -f 50 true 2>/dev/null && rt=(chrt -f 50)
    "$FP" gen --flows 1000000 --packets 1000000 --size 64 --dist uniform --order random --proto udp --seed 1 -o "$tmp/m1.pcap" >/dev/null
    for c in "forward" "fsc" "lb -> fsc -> ratelimit"; do
        "${rt[@]}" "$FP" run --input "dpdk:net_pcap0,rx_pcap=$tmp/m1.pcap,infinite_rx=1" --output dpdk:net_null0 --chain "$c" --cores 1 \
            --pool 1100000 --eal "--no-huge --no-pci -m 8192 --no-shconf --no-telemetry" --duration 5 --warmup 2 --json 2>/dev/null |
            python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"net_pcap infinite_rx, 1M flows: {'$c':24} {j['mpps']:.2f} Mpps, {j['cycles_per_packet']:.0f} busy cycles/packet\")"
    done
}

case "${1:-veth}" in
    veth) veth ;;
    mlffr) mlffr ;;
    null) null ;;
    pcap) pcap ;;
    *) echo "usage: $0 veth|mlffr|null|pcap" >&2; exit 2 ;;
esac

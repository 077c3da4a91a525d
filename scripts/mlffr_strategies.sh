#!/usr/bin/env bash
# MLFFR on live ports per strategy and backend, 2 workers, over 2-queue veth pairs in two network
# namespaces (as root). Strategies are every value of `flowplane run --scale` (rss on the port's own
# queues, plus rss by flowplane's symmetric table) — a new strategy is measured without editing this
# file; backends: AF_PACKET (kernel steering: the fanout program, no dispatcher core, where the strategy
# allows it) and AF_XDP (kernel steering by flowplane's XDP program for tables that do not move, else the
# dispatcher core). Who steered is printed from the report. One line
# per (backend, strategy), or the one-line refusal.
#   scripts/mlffr_strategies.sh
#   CHAIN="hh -> burn(iters=400)" BACKENDS=afpacket scripts/mlffr_strategies.sh   (default chain: hh, which every strategy runs)
# On a 2-vCPU machine the sender, receiver, dispatcher and workers share two CPUs: the figures
# there say every strategy runs on ports, not which is faster (see "sender max" beside each MLFFR).
set -u
B=${B:-$(dirname "$0")/../target/release/flowplane}
ID=ms$$
tmp=$(mktemp -d)
cleanup() { ip netns del A$ID 2>/dev/null; ip netns del B$ID 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
ip netns add A$ID; ip netns add B$ID
ip link add name a$ID numrxqueues 2 numtxqueues 2 type veth peer name v0 numrxqueues 2 numtxqueues 2 netns A$ID
ip link add name b$ID numrxqueues 2 numtxqueues 2 type veth peer name v0 numrxqueues 2 numtxqueues 2 netns B$ID
for x in a$ID b$ID; do ip link set $x up; echo 1 > /proc/sys/net/ipv6/conf/$x/disable_ipv6; done
for n in A$ID B$ID; do ip netns exec $n ip link set v0 up; ip netns exec $n sysctl -qw net.ipv6.conf.all.disable_ipv6=1; done
scales=$("$B" run --help | grep -A6 -- '--scale <SCALE>' | sed -n 's/.*possible values: \([^]]*\)].*/\1/p' | tr -d ',')
[ -n "$scales" ] || { echo "could not read --scale's values from flowplane run --help" >&2; exit 1; }
for be in ${BACKENDS:-afpacket afxdp}; do
  for s in $scales "rss --symmetric-rss"; do
    # shellcheck disable=SC2086
    if "$B" mlffr --input $be:a$ID --output $be:b$ID --send afpacket:v0@A$ID --recv afpacket:v0@B$ID \
        --trace-gen "--flows 256 --packets 20000 --size 64 --proto udp --seed 3" --chain "${CHAIN:-hh}" --cores 2 --no-pin \
        --scale $s --trial "${TRIAL:-0.5}" --warmup 0.2 --resolution "${RES:-20}" --json 2>"$tmp/err" >"$tmp/r.json"; then
      python3 - "$tmp/r.json" "$be" "$s" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); be, s = sys.argv[2], sys.argv[3]
print('%-9s %-20s mlffr %9.0f pps  sender max %9.0f pps  busy cycles/pkt %7.1f  steered by %s' % (
    be, s, r['mlffr_pps'], r['sender_max_pps'], r['cycles_per_packet'], r['steered_by'] or '?'))
PY
    else
      printf '%-9s %-20s refused: %s\n' "$be" "$s" "$(tail -1 "$tmp/err")"
    fi
  done
done

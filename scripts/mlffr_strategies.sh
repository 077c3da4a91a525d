#!/usr/bin/env bash
# MLFFR on live ports per strategy, 2 workers, over veth pairs in two network namespaces (as root):
# rss on the port's own queues, rss by flowplane's symmetric table (--symmetric-rss: on AF_PACKET
# the kernel's fanout program steers, no dispatcher core), shared (the dispatcher's spray), rsspp
# (RETA moves through the dispatcher). One line per strategy.
#   scripts/mlffr_strategies.sh                      CHAIN="fsc -> burn(iters=400)" scripts/mlffr_strategies.sh
# On a 2-vCPU machine the sender, receiver, dispatcher and workers share two CPUs: the figures
# there say every strategy runs on ports, not which is faster.
set -u
B=${B:-$(dirname "$0")/../target/release/flowplane}
ip netns add mA; ip netns add mB
ip link add name mfa numrxqueues 2 numtxqueues 2 type veth peer name v0 numrxqueues 2 numtxqueues 2 netns mA
ip link add name mfb numrxqueues 2 numtxqueues 2 type veth peer name v0 numrxqueues 2 numtxqueues 2 netns mB
for x in mfa mfb; do ip link set $x up; echo 1 > /proc/sys/net/ipv6/conf/$x/disable_ipv6; done
for n in mA mB; do ip netns exec $n ip link set v0 up; ip netns exec $n sysctl -qw net.ipv6.conf.all.disable_ipv6=1; done
for s in "rss" "rss --symmetric-rss" "shared" "rsspp"; do
  $B mlffr --input afpacket:mfa --output afpacket:mfb --send afpacket:v0@mA --recv afpacket:v0@mB \
    --trace-gen "--flows 256 --packets 20000 --size 64 --proto udp --seed 3" --chain "${CHAIN:-fsc}" --cores 2 --no-pin \
    --scale $s --trial 0.5 --warmup 0.2 --resolution 20 --json 2>/tmp/fp-mlffr.err > /tmp/fp-mlffr.json
  python3 -c "
import json; r=json.load(open('/tmp/fp-mlffr.json'))
print('%-22s mlffr %9.0f pps  sender max %9.0f pps  cycles/pkt %7.1f' % ('$s', r['mlffr_pps'], r['sender_max_pps'], r['cycles_per_packet']))" || head -3 /tmp/fp-mlffr.err
done
ip netns del mA; ip netns del mB

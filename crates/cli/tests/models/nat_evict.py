#!/usr/bin/env python3
"""A new-flow flood through nat with a small flow table and `--table-full evict` (issue 33), written with scapy.

usage: nat_evict.py OUT.pcap PAIRS FLOOD

The trace: PAIRS inside flows (10.9.0.1, source ports 2000..) each send one UDP packet to 198.51.100.7:53 and
get one reply to their translated port (a fresh pool hands out its ports in order from the range's first,
1024); then FLOOD new UDP flows from 10.9.1.x to 198.51.100.8:80, one packet each; then the PAIRS remotes reply
again. The documented rules (from the docs, not the code): under evict a NAT pair goes as a whole; evicting its
outbound entry frees its port and its later replies are dropped; a flood of new flows many times the table's
capacity evicts every entry older than the flood. So the first replies pass, the last ones are all dropped,
every outbound packet passes (freed ports are reused: the pool never runs dry while the table holds fewer
mappings than the pool has ports).

prints JSON: {"packets", "passed", "dropped", "outbound_flows", "first_replies"}
"""
import json
import sys

from scapy.all import IP, UDP, Ether, wrpcap

INSIDE = "10.9.0.1"
REMOTE, FLOOD_REMOTE, EXT = "198.51.100.7", "198.51.100.8", "203.0.113.1"
MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def main():
    path, pairs, flood = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    frames = []
    for i in range(pairs):
        frames.append(IP(src=INSIDE, dst=REMOTE) / UDP(sport=2000 + i, dport=53))
        frames.append(IP(src=REMOTE, dst=EXT) / UDP(sport=53, dport=1024 + i))
    for k in range(flood):
        frames.append(IP(src=f"10.9.1.{1 + k % 200}", dst=FLOOD_REMOTE) / UDP(sport=10000 + k, dport=80))
    for i in range(pairs):
        frames.append(IP(src=REMOTE, dst=EXT) / UDP(sport=53, dport=1024 + i))
    frames = [Ether(**MAC) / f / (b"x" * 18) for f in frames]
    for k, f in enumerate(frames):
        f.time = 1_700_000_000 + k * 1e-6
    wrpcap(path, frames)
    print(json.dumps({
        "packets": len(frames),
        "passed": len(frames) - pairs,
        "dropped": pairs,
        "outbound_flows": pairs + flood,
        "first_replies": pairs,
    }))


main()

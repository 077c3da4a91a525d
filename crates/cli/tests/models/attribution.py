#!/usr/bin/env python3
"""Attribution traces (issue 33 item 4) and what the documented rules say about them, written with scapy.

usage: attribution.py nat OUT.pcap POOL      (nat with a POOL-port UDP pool, one external address)
       attribution.py full OUT.pcap CAPACITY (a CAPACITY-entry flow table, --table-full reject)

Every packet is a new UDP flow (its own source port) from one of a few inside hosts; hosts take turns in
blocks. The rules (from the docs, not the code): nat gives each new flow the next free port until the pool is
exhausted, then refuses every new flow (a refused flow keeps nothing); a full flow table refuses every new
flow past its capacity. So the model walks the packets in order: the first POOL (CAPACITY) flows are admitted,
every later one is refused and counted against its source.

prints JSON: {"held": {host: n}, "refused": {host: n}}
"""
import json
import sys

from scapy.all import IP, UDP, Ether, wrpcap

REMOTE = "198.51.100.9"
MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def main():
    mode, path, room = sys.argv[1], sys.argv[2], int(sys.argv[3])
    a, b, c = "10.7.0.1", "10.7.0.2", "10.7.0.3"
    # Blocks of (host, flows): the admitted part first, then the part past the pool or table.
    first = room * 3 // 4
    blocks = [(a, first), (b, room - first - room // 16), (c, room // 16), (a, 300), (b, 40), (c, 7), (a, 20)]
    flows, sport = [], {a: 1024, b: 1024, c: 1024}
    for host, n in blocks:
        for _ in range(n):
            flows.append((host, sport[host]))
            sport[host] += 1
    held, refused = {}, {}
    for k, (host, _) in enumerate(flows):
        d = held if k < room else refused
        d[host] = d.get(host, 0) + 1
    frames = [Ether(**MAC) / IP(src=h, dst=REMOTE) / UDP(sport=p, dport=53) / (b"x" * 18) for h, p in flows]
    for k, f in enumerate(frames):
        f.time = 1_700_000_000 + k * 1e-6
    wrpcap(path, frames)
    print(json.dumps({"held": held, "refused": refused, "mode": mode}))


main()

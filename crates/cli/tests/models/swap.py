#!/usr/bin/env python3
"""Traces for live swaps (issue 31: `ctl load route FILE`, `ctl set nat external ...`) and what the
documented rules say about them, written with scapy; every packet carries `seq=NNNNNN` as its payload.

usage: swap.py route-trace OUT.pcap N
         N UDP packets of 16 flows (sport 4000 + i % 16) to the flow's destination DSTS[flow % len(DSTS)].
       swap.py route-judge OLD.routes NEW.routes PORT0.pcap [PORT1.pcap ...]
         prints JSON [[seq, port the packet left on or null, port by OLD or null, port by NEW or null], ...]
         for every packet of the trace (argument N of route-trace read from the files' seqs). A route file is
         'PREFIX/LEN PORT' per line, '#' comments; the longest prefix containing the destination wins, the
         last listed among equal prefixes; no route: null (dropped).
       swap.py nat-trace OUT.pcap N
         N packets, 1 ms apart: 8 "old" UDP flows from 10.0.0.1 (sport 5000 + k) to 198.51.100.9:53 start the
         trace and send throughout; 64 "new" flows from 10.0.0.2 (sport 6000 + j) start at an even spread over
         the trace and send again once started; replies come from 198.51.100.9:53 to 203.0.113.1:(40000 + k)
         (the old flows' documented mappings: one core, one address, ports from 40000, the free list in port
         order) and to 203.0.113.1:40090 (unmapped).
       swap.py nat-read TRACE.pcap OUT.pcap
         prints JSON [[seq, src, sport, dst, dport, out_src, out_sport, out_dst, out_dport], ...] for every
         packet of the trace: as sent, then as written to OUT (nulls: not written).
"""
import ipaddress
import json
import re
import sys

from scapy.all import IP, UDP, Ether, Raw, rdpcap, wrpcap

MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
DSTS = ["10.1.2.5", "10.1.2.200", "10.1.9.9", "10.2.3.4", "10.3.3.3", "11.0.0.1"]
REMOTE = "198.51.100.9"


def seq_of(p):
    # Searched in the raw bytes: scapy decodes a payload to or from port 53 as DNS, not Raw.
    m = re.search(rb"seq=(\d{6})", bytes(p))
    return int(m.group(1)) if m else None


def frame(src, dst, sport, dport, i):
    return Ether(**MAC) / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / Raw(b"seq=%06d" % i)


def write(path, frames):
    for k, f in enumerate(frames):
        f.time = 1_700_000_000 + k * 1e-3
    wrpcap(path, frames)


def routes(path):
    out = []
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            pfx, port = line.split()
            out.append((ipaddress.ip_network(pfx, strict=False), int(port)))
    return out


def lookup(table, dst):
    best = None
    for net, port in table:
        if ipaddress.ip_address(dst) in net and (best is None or net.prefixlen >= best[0]):
            best = (net.prefixlen, port)
    return None if best is None else best[1]


def main():
    mode = sys.argv[1]
    if mode == "route-trace":
        n = int(sys.argv[3])
        write(sys.argv[2], [frame("10.0.0.1", DSTS[(i % 16) % len(DSTS)], 4000 + i % 16, 53, i) for i in range(n)])
    elif mode == "route-judge":
        old, new = routes(sys.argv[2]), routes(sys.argv[3])
        left = {}
        for port, path in enumerate(sys.argv[4:]):
            for p in rdpcap(path):
                left[seq_of(p)] = port
        n = max(left) + 1 if left else 0
        rows = []
        for i in range(n):
            dst = DSTS[(i % 16) % len(DSTS)]
            rows.append([i, left.get(i), lookup(old, dst), lookup(new, dst)])
        print(json.dumps(rows))
    elif mode == "nat-trace":
        n = int(sys.argv[3])
        new_at = {n * j // 64 + 8: j for j in range(64)}
        frames, started = [], 0
        for i in range(n):
            if i < 8:
                frames.append(frame("10.0.0.1", REMOTE, 5000 + i, 53, i))
            elif i in new_at:
                frames.append(frame("10.0.0.2", REMOTE, 6000 + new_at[i], 53, i))
                started += 1
            elif i % 50 == 3:
                frames.append(frame(REMOTE, "203.0.113.1", 53, 40090, i))
            elif i % 4 == 1:
                frames.append(frame(REMOTE, "203.0.113.1", 53, 40000 + (i // 4) % 8, i))
            elif i % 4 == 2:
                frames.append(frame("10.0.0.2", REMOTE, 6000 + (i // 4) % started, 53, i))
            else:
                frames.append(frame("10.0.0.1", REMOTE, 5000 + (i // 4) % 8, 53, i))
        write(sys.argv[2], frames)
    elif mode == "nat-read":
        out = {seq_of(p): [p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport] for p in rdpcap(sys.argv[3])}
        rows = []
        for p in rdpcap(sys.argv[2]):
            i = seq_of(p)
            rows.append([i, p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport] + out.get(i, [None] * 4))
        print(json.dumps(rows))
    else:
        sys.exit(f"unknown mode {mode}")


main()

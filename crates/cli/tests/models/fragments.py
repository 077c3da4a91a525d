#!/usr/bin/env python3
"""Fragmented UDP traffic for the fragment path (issue 33 item 5), written with scapy, not flowplane.

Ten inside hosts 10.1.0.1-10 (source port 5000+i) each send two 3000-byte UDP datagrams to 198.51.100.7:9000,
each cut by scapy into three IPv4 fragments (1480, 1480, 48 bytes of IP payload); the fragments of all
datagrams are interleaved round robin (each datagram's in order). Then:
* 10.1.0.60 sends the two later fragments of a datagram whose first fragment never comes (orphans);
* 10.1.0.50 sends a datagram whose second fragment starts 8 bytes in, inside the first fragment (an overlap).

usage: fragments.py OUT.pcap [v6]
prints JSON: what the trace holds by the rule of the fragment table (see crates/engine/src/frag.rs docs).

With `v6` the same over IPv6 (a Fragment extension header, scapy's fragment6 at a 1280-byte MTU): six inside
hosts fd00::1-6 (source port 5000+i) each send two 3000-byte UDP datagrams to 2001:db8::7 port 9000, the odd
hosts' with a hop-by-hop and a destination-options header before the Fragment header (the unfragmentable
part, repeated in every fragment); interleaved round robin; fd00::60 sends a datagram's later fragments only
(orphans); fd00::50 a datagram whose second fragment starts 8 bytes in (an overlap).
"""
import json
import sys

from scapy.all import (IP, UDP, Ether, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, Raw,
                       fragment, fragment6, wrpcap)

REMOTE = "198.51.100.7"
MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def frags(src, sport, ident, seed):
    payload = bytes((seed * 31 + k) % 251 for k in range(3000))
    dgram = IP(src=src, dst=REMOTE, id=ident) / UDP(sport=sport, dport=9000) / Raw(payload)
    out = []
    for f in fragment(dgram, fragsize=1480):
        del f.chksum
        out.append(f)
    return out


def frags6(host, sport, ident, seed, ext):
    payload = bytes((seed * 37 + k) % 251 for k in range(3000))
    head = IPv6(src=f"fd00::{host:x}", dst="2001:db8::7")
    if ext:
        head = head / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt()
    return list(fragment6(head / IPv6ExtHdrFragment(id=ident) / UDP(sport=sport, dport=9000) / Raw(payload), 1280))


def main_v6(path):
    datagrams = [frags6(h + 1, 5000 + h, 100 + 2 * h + d, 2 * h + d, h % 2 == 1) for h in range(6) for d in range(2)]
    n = max(len(d) for d in datagrams)
    pkts = [d[k] for k in range(n) for d in datagrams if k < len(d)]
    orphan = frags6(0x60, 6000, 999, 99, False)
    pkts += orphan[1:]
    over = frags6(0x50, 6001, 777, 77, False)
    over[1][IPv6ExtHdrFragment].offset = 1  # 8 bytes in: inside the first fragment's data
    pkts += over
    frames = [Ether(**MAC) / p for p in pkts]
    wrpcap(path, frames)
    later = sum(len(d) - 1 for d in datagrams)
    print(json.dumps({
        "packets": len(frames),
        "datagrams": len(datagrams),
        "first": len(datagrams) + 1,
        "followed": later + len(over) - 2,
        "orphans": len(orphan) - 1,
        "overlaps": 1,
        "v6": len(frames),
    }))


def main():
    path = sys.argv[1]
    if sys.argv[2:] == ["v6"]:
        return main_v6(path)
    datagrams = [frags(f"10.1.0.{f + 1}", 5000 + f, 100 + 2 * f + d, 2 * f + d) for f in range(10) for d in range(2)]
    pkts = []
    for k in range(3):
        for d in datagrams:
            pkts.append(d[k])
    orphan = frags("10.1.0.60", 6000, 999, 99)
    pkts += orphan[1:]
    over = frags("10.1.0.50", 6001, 777, 77)
    over[1].frag = 1  # 8 bytes in: inside the first fragment's 1480
    pkts += over
    frames = [Ether(**MAC) / p for p in pkts]
    wrpcap(path, frames)
    print(
        json.dumps(
            {
                "packets": len(frames),
                "datagrams": len(datagrams),
                # Recorded first fragments: every datagram's and the overlapping one's.
                "first": len(datagrams) + 1,
                # Later fragments that follow: two per datagram, and the overlapping datagram's last.
                "followed": 2 * len(datagrams) + 1,
                "orphans": len(orphan) - 1,
                "overlaps": 1,
            }
        )
    )


main()

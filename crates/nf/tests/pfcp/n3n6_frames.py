#!/usr/bin/env python3
"""Frames (built with scapy) that exercise a flowplane UPF's N3/N6
networking, written to a pcap in this order:

 0  G-PDU to an unknown TEID 0xdead          -> GTP-U Error Indication
 1  GTP-U Echo Request, sequence 0x1234      -> Echo Response
 2  ARP who-has N3 from the gNB              -> ARP reply
 3  ARP who-has N6 from the DN router        -> ARP reply
 4  ARP who-has another address              -> dropped
 5  downlink UDP to the UE, TTL 1            -> ICMP Time Exceeded to the sender
 6  downlink 1,472-byte IP packet, DF        -> ICMP Fragmentation Needed (MTU 1,456)
 7  downlink 1,472-byte IP packet, no DF     -> forwarded, outer DF clear
 8  downlink UDP, TTL 64                     -> forwarded, inner TTL 63
 9  uplink G-PDU, inner TTL 1                -> dropped
10  uplink G-PDU, inner TTL 64               -> forwarded, TTL 63
11  downlink ICMP Time Exceeded, TTL 1       -> dropped (no error about an error)

With a third argument "v6", IPv6 frames instead (UPF addresses 2001:db8:3::1
on N3 and 2001:db8:6::1 on N6, UE 2001:db8:1::1):

 0  Neighbor Solicitation for N3 from the gNB -> Neighbor Advertisement (S, R, O)
 1  Neighbor Solicitation for N6, from :: (DAD) -> Advertisement to all nodes (R, O)
 2  Neighbor Solicitation for another address  -> dropped
 3  downlink 1,480-byte IPv6 packet            -> ICMPv6 Packet Too Big (MTU 1,456)
 4  downlink IPv6, hop limit 1                 -> ICMPv6 Time Exceeded to the sender
 5  downlink IPv6, hop limit 64                -> forwarded, hop limit 63

Usage: n3n6_frames.py OUT_PCAP TEID [v6]
"""
import sys

from scapy.contrib.gtp import GTPEchoRequest, GTPHeader, GTP_U_Header, GTPPDUSessionContainer
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

out, teid = sys.argv[1], int(sys.argv[2])
UE, DN, GNB, N3, N6 = "10.45.0.1", "203.0.113.5", "198.51.100.10", "192.0.2.1", "192.0.2.6"
GNB_MAC, DN_MAC, BCAST = "02:00:00:00:00:0a", "02:00:00:00:00:0d", "ff:ff:ff:ff:ff:ff"


def up(inner, t=teid):
    return (Ether(src=GNB_MAC, dst="02:00:00:00:00:01") / IP(src=GNB, dst=N3) / UDP(sport=2152, dport=2152)
            / GTP_U_Header(teid=t, E=1, next_ex=0x85) / GTPPDUSessionContainer(type=1, QFI=9) / inner)


def down(ip, payload):
    return Ether(src=DN_MAC, dst="02:00:00:00:00:01") / ip / payload


frames = [
    up(IP(src=UE, dst=DN) / UDP(sport=40000, dport=9001) / Raw(b"x" * 20), t=0xdead),
    Ether(src=GNB_MAC) / IP(src=GNB, dst=N3) / UDP(sport=2152, dport=2152) / GTPHeader(seq=0x1234, S=1)
    / GTPEchoRequest(),
    Ether(src=GNB_MAC, dst=BCAST) / ARP(op=1, hwsrc=GNB_MAC, psrc=GNB, pdst=N3),
    Ether(src=DN_MAC, dst=BCAST) / ARP(op=1, hwsrc=DN_MAC, psrc=DN, pdst=N6),
    Ether(src=DN_MAC, dst=BCAST) / ARP(op=1, hwsrc=DN_MAC, psrc=DN, pdst="192.0.2.99"),
    down(IP(src=DN, dst=UE, ttl=1), UDP(sport=9001, dport=40000) / Raw(b"t" * 30)),
    down(IP(src=DN, dst=UE, flags="DF"), UDP(sport=9001, dport=40000) / Raw(b"b" * 1444)),
    down(IP(src=DN, dst=UE, flags=0), UDP(sport=9001, dport=40000) / Raw(b"f" * 1444)),
    down(IP(src=DN, dst=UE, ttl=64), UDP(sport=9001, dport=40000) / Raw(b"s" * 30)),
    up(IP(src=UE, dst=DN, ttl=1) / UDP(sport=40000, dport=9001) / Raw(b"e" * 20)),
    up(IP(src=UE, dst=DN, ttl=64) / UDP(sport=40000, dport=9001) / Raw(b"l" * 20)),
    down(IP(src=DN, dst=UE, ttl=1), ICMP(type=11, code=0) / Raw(bytes(IP(src=UE, dst=DN) / UDP())[:28])),
]
if len(sys.argv) > 3 and sys.argv[3] == "v6":
    from scapy.layers.inet6 import ICMPv6ND_NS, ICMPv6NDOptSrcLLAddr, IPv6
    UE6, DN6, GNB6, N36, N66 = "2001:db8:1::1", "2001:db8:9::5", "2001:db8:3::a", "2001:db8:3::1", "2001:db8:6::1"
    frames = [
        Ether(src=GNB_MAC, dst="33:33:ff:00:00:01") / IPv6(src=GNB6, dst="ff02::1:ff00:1", hlim=255)
        / ICMPv6ND_NS(tgt=N36) / ICMPv6NDOptSrcLLAddr(lladdr=GNB_MAC),
        Ether(src=DN_MAC, dst="33:33:ff:00:00:01") / IPv6(src="::", dst="ff02::1:ff00:1", hlim=255)
        / ICMPv6ND_NS(tgt=N66),
        Ether(src=DN_MAC, dst="33:33:ff:00:00:99") / IPv6(src=DN6, dst="ff02::1:ff00:99", hlim=255)
        / ICMPv6ND_NS(tgt="2001:db8:6::99"),
        down(IPv6(src=DN6, dst=UE6), UDP(sport=9001, dport=40000) / Raw(b"b" * 1432)),
        down(IPv6(src=DN6, dst=UE6, hlim=1), UDP(sport=9001, dport=40000) / Raw(b"t" * 30)),
        down(IPv6(src=DN6, dst=UE6, hlim=64), UDP(sport=9001, dport=40000) / Raw(b"s" * 30)),
    ]
wrpcap(out, frames)
print("OK %d" % len(frames))

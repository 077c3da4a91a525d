#!/usr/bin/env python3
"""Frames for crates/io/tests/fanout_steer.rs, crafted by scapy (not by flowplane):
every case the kernel steering program distinguishes. Usage: make_frames.py OUT.pcap
Every frame is unique (a counter in its payload or addresses), so the test can
find each one on the socket it arrived at."""
import random
import struct
import sys

from scapy.all import (ARP, ICMP, IP, TCP, UDP, Dot1AD, Dot1Q, Ether, IPv6, IPv6ExtHdrDestOpt,
                       IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, ICMPv6EchoRequest, Raw, SCTP, wrpcap)

rnd = random.Random(30)
frames = []
n = [0]


def tag():
    n[0] += 1
    return Raw(struct.pack(">I", n[0]))


def ip4():
    return "10.%d.%d.%d" % (rnd.randrange(256), rnd.randrange(256), rnd.randrange(1, 255))


def ip6():
    return "2001:db8::%x:%x" % (rnd.randrange(65536), rnd.randrange(1, 65536))


E = Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01")
for _ in range(150):  # IPv4 TCP/UDP flows
    l4 = TCP if rnd.random() < 0.5 else UDP
    frames.append(E / IP(src=ip4(), dst=ip4()) / l4(sport=rnd.randrange(1024, 65536), dport=rnd.randrange(1, 65536)) / tag())
for _ in range(60):  # IPv6 TCP/UDP flows
    l4 = TCP if rnd.random() < 0.5 else UDP
    frames.append(E / IPv6(src=ip6(), dst=ip6()) / l4(sport=rnd.randrange(1024, 65536), dport=443) / tag())
for _ in range(8):  # IPv6 extension headers before UDP; first and later fragments
    frames.append(E / IPv6(src=ip6(), dst=ip6()) / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / UDP(sport=5000, dport=53) / tag())
    frames.append(E / IPv6(src=ip6(), dst=ip6()) / IPv6ExtHdrFragment(m=1, offset=0, id=7) / UDP(sport=5001, dport=53) / tag())
    frames.append(E / IPv6(src=ip6(), dst=ip6()) / IPv6ExtHdrFragment(m=0, offset=100, id=7, nh=17) / tag())
for _ in range(10):  # IPv4 first and later fragments
    frames.append(E / IP(src=ip4(), dst=ip4(), flags="MF", id=9) / UDP(sport=7000, dport=7001) / tag())
    frames.append(E / IP(src=ip4(), dst=ip4(), frag=100, proto=17, id=9) / tag())
for i in range(10):  # ICMP echo (identifier as ports), ICMPv6 echo
    frames.append(E / IP(src=ip4(), dst=ip4()) / ICMP(type=8, id=1000 + i) / tag())
    frames.append(E / IPv6(src=ip6(), dst=ip6()) / ICMPv6EchoRequest(id=2000 + i) / tag())
flows = []
for i in range(20):  # ICMP errors quoting a flow, and that flow's own reply direction
    a, b = ip4(), ip4()
    l4 = UDP(sport=4000 + i, dport=53) if i % 2 else TCP(sport=4000 + i, dport=80)
    quoted = IP(src=a, dst=b) / l4
    err = ICMP(type=3, code=3) if i % 2 else ICMP(type=11, code=0)
    frames.append(E / IP(src="192.0.2.%d" % (i + 1), dst=a) / err / bytes(quoted)[:28])
    frames.append(E / IP(src=b, dst=a) / (UDP(sport=53, dport=4000 + i) if i % 2 else TCP(sport=80, dport=4000 + i)) / tag())
for ihl in (0, 4):  # an ICMP error quoting a header shorter than 20 bytes: no quoted flow
    bad = bytearray(bytes(IP(src="10.9.9.9", dst="10.8.8.8") / UDP(sport=1, dport=2)))
    bad[0] = 0x40 | ihl
    frames.append(E / IP(src="192.0.2.200", dst="10.9.9.%d" % (ihl + 1)) / ICMP(type=3, code=1) / bytes(bad))
for i in range(10):  # 802.1Q; 802.1ad + 802.1Q; three tags (refused: key 0)
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1Q(vlan=10 + i) / IP(src=ip4(), dst=ip4()) / UDP(sport=6000 + i, dport=9) / tag())
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1AD(vlan=100) / Dot1Q(vlan=10 + i) / IP(src=ip4(), dst=ip4()) / TCP(sport=6100 + i, dport=9) / tag())
for i in range(3):
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1AD(vlan=1) / Dot1Q(vlan=2) / Dot1Q(vlan=3) / IP(src=ip4(), dst=ip4()) / UDP() / tag())
for i in range(6):  # ICMP errors inside one 802.1Q tag (quoted flow), two tags or one 802.1ad (own addresses)
    quoted = bytes(IP(src="10.7.0.%d" % (i + 1), dst="10.6.0.1") / UDP(sport=3000 + i, dport=53))[:28]
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1Q(vlan=5) / IP(src="192.0.2.50", dst="10.7.0.%d" % (i + 1)) / ICMP(type=3, code=3) / quoted)
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1AD(vlan=6) / Dot1Q(vlan=5) / IP(src="192.0.2.51", dst="10.7.0.%d" % (i + 1)) / ICMP(type=3, code=3) / quoted)
    # One 802.1ad tag: flowplane looks inside ICMP errors under no tag or one 802.1Q tag only.
    frames.append(Ether(src=E.src, dst=E.dst) / Dot1AD(vlan=7) / IP(src="192.0.2.52", dst="10.7.0.%d" % (i + 1)) / ICMP(type=3, code=3) / quoted)
for i in range(40):  # nat-like replies: 203.0.113.1 ports 20000-29999 match the rule; 30000+ and .2 do not
    dport = 20000 + rnd.randrange(10000) if i < 25 else 30000 + i
    dst = "203.0.113.1" if i < 35 else "203.0.113.2"
    l4 = UDP if i % 2 else TCP
    frames.append(E / IP(src=ip4(), dst=dst) / l4(sport=80, dport=dport) / tag())
for i in range(5):  # the flow rule's flow, both directions
    frames.append(E / IP(src="10.200.0.1", dst="10.200.0.2") / UDP(sport=1111, dport=2222) / tag())
    frames.append(E / IP(src="10.200.0.2", dst="10.200.0.1") / UDP(sport=2222, dport=1111) / tag())
for i in range(5):  # other protocols: addresses only (GRE), SCTP ports, ARP (not IP: key 0)
    frames.append(E / IP(src=ip4(), dst=ip4(), proto=47) / tag())
    frames.append(E / IP(src=ip4(), dst=ip4()) / SCTP(sport=9000 + i, dport=9) / tag())
    frames.append(Ether(src=E.src, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.0.%d" % (i + 1), pdst="10.0.0.254"))
# Malformed IPv4: total length below the header (refused: key 0).
frames.append(E / IP(src="10.1.1.1", dst="10.1.1.2", len=12) / UDP() / tag())
# Fragmented datagrams whose later fragments must go where their first one went (fp_frags): a nat-like
# reply (the first fragment matches the rule), the flow rule's flow, plain IPv4, IPv6 behind a hop-by-hop
# header; each first fragment, then two later ones; a later fragment of an unseen datagram (its addresses).
for i in range(4):
    frames.append(E / IP(src="10.77.0.%d" % (i + 1), dst="203.0.113.1", flags="MF", id=300 + i) / UDP(sport=80, dport=20100 + i) / tag())
    frames.append(E / IP(src="10.200.0.1", dst="10.200.0.2", flags="MF", id=400 + i) / UDP(sport=1111, dport=2222) / tag())
    frames.append(E / IP(src="10.78.0.%d" % (i + 1), dst="10.79.0.1", flags="MF", id=500 + i) / UDP(sport=40000 + i, dport=53) / tag())
    frames.append(E / IPv6(src="2001:db8::77:%x" % (i + 1), dst="2001:db8::1") / IPv6ExtHdrHopByHop() / IPv6ExtHdrFragment(m=1, offset=0, id=600 + i) / UDP(sport=40000 + i, dport=53) / tag())
    for k in range(2):
        frames.append(E / IP(src="10.77.0.%d" % (i + 1), dst="203.0.113.1", flags="MF" if k == 0 else 0, frag=3 + k, proto=17, id=300 + i) / tag())
        frames.append(E / IP(src="10.200.0.1", dst="10.200.0.2", frag=3 + k, proto=17, id=400 + i) / tag())
        frames.append(E / IP(src="10.78.0.%d" % (i + 1), dst="10.79.0.1", frag=3 + k, proto=17, id=500 + i) / tag())
        frames.append(E / IPv6(src="2001:db8::77:%x" % (i + 1), dst="2001:db8::1") / IPv6ExtHdrHopByHop() / IPv6ExtHdrFragment(m=k == 0, offset=3 + k, id=600 + i, nh=17) / tag())
    frames.append(E / IP(src="10.78.1.%d" % (i + 1), dst="10.79.0.1", frag=3, proto=17, id=700 + i) / tag())
wrpcap(sys.argv[1], frames)

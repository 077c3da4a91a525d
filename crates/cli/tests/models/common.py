"""Helpers the models share: address normalisation and a small deterministic traffic mixer."""
import ipaddress
import random

from scapy.all import IP, IPv6, TCP, UDP, Ether, Raw

MS = 1_000_000
S = 1_000_000_000


def addr(a):
    return str(ipaddress.ip_address(a))


def flow_of(row):
    """An export row's 5-tuple, comparable with `Rec.flow`."""
    return (row["proto"], addr(row["src"]), addr(row["dst"]), row["sport"], row["dport"])


def rec_flow(r):
    return (r.proto, addr(r.src), addr(r.dst), r.sport, r.dport)


def pkt(src, dst, proto="udp", sport=1000, dport=2000, size=0, flags="S"):
    """An Ethernet frame with an IPv4 or IPv6 header (by the address) and `size` payload bytes."""
    ip = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    l4 = UDP(sport=sport, dport=dport) if proto == "udp" else TCP(sport=sport, dport=dport, flags=flags)
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip / l4 / Raw(b"x" * size)


def rng(seed):
    return random.Random(seed)

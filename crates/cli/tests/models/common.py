"""Helpers the models share: address normalisation and a small deterministic traffic mixer."""
import ipaddress
import random
import struct

import functools

from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

MS = 1_000_000
S = 1_000_000_000


@functools.lru_cache(maxsize=None)
def addr(a):
    return str(ipaddress.ip_address(a))


def flow_of(row):
    """An export row's 5-tuple, comparable with `Rec.flow`."""
    return (row["proto"], addr(row["src"]), addr(row["dst"]), row["sport"], row["dport"])


def rec_flow(r):
    return r.nflow


# The harness tags a frame by rewriting its last 8 bytes to (tag, ~tag): the one's-complement sum
# of the trailer stays 0xffff + 0xffff, so scapy's checksums stay valid without a rebuild.
TRAILER = b"\x00" * 4 + b"\xff" * 4


class Tmpl:
    """A crafted frame (scapy-built, with the tag trailer) and the header fields a model reads."""

    def __init__(self, p):
        self.frame = bytes(p)
        ip = p[IPv6] if IPv6 in p else p[IP]
        self.v6 = IPv6 in p
        self.src, self.dst = addr(ip.src), addr(ip.dst)
        self.proto = ip.nh if self.v6 else ip.proto
        l4 = p[TCP] if TCP in p else p[UDP] if UDP in p else None
        self.sport, self.dport = (l4.sport, l4.dport) if l4 is not None else (0, 0)
        self.flags = int(p[TCP].flags) if TCP in p else 0


@functools.lru_cache(maxsize=None)
def pkt(src, dst, proto="udp", sport=1000, dport=2000, size=0, flags="S"):
    """An Ethernet frame with an IPv4 or IPv6 header (by the address) and `size` payload bytes
    (plus the 8-byte tag trailer); built once per distinct set of arguments."""
    ip = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    if proto == "icmp":
        l4 = ICMPv6EchoRequest() if ":" in src else ICMP()
    else:
        l4 = UDP(sport=sport, dport=dport) if proto == "udp" else TCP(sport=sport, dport=dport, flags=flags)
    return Tmpl(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip / l4 / Raw(b"x" * size + TRAILER))


def rng(seed):
    return random.Random(seed)


def bucket_model(recs, key, cost, rate, burst, pick=lambda r: True):
    """The documented token bucket, exact in integers: tokens scaled by 1e9, `rate` tokens per
    second (so `rate` scaled units per ns), full (`burst`) at a key's first packet, capped at
    `burst`; a packet passes and takes `cost` if the bucket holds at least `cost`."""
    state, out = {}, []
    for r in recs:
        if not pick(r):
            out.append(True)
            continue
        k, c = key(r), cost(r) * S
        units, last = state.get(k, (burst * S, r.t))
        units = min(burst * S, units + max(0, r.t - last) * rate)
        ok = units >= c
        state[k] = (units - c if ok else units, max(last, r.t))
        out.append(ok)
    return out


def bucket_bound_errors(recs, passed, key, cost, rate, burst):
    """What holds in any processing order (cores sharing a bucket): a key never gets more than
    `burst` plus what accrues over its packets' time span."""
    errs, span, got = [], {}, {}
    for r in recs:
        lo, hi = span.get(key(r), (r.t, r.t))
        span[key(r)] = (min(lo, r.t), max(hi, r.t))
        if r.i in passed:
            got[key(r)] = got.get(key(r), 0) + cost(r)
    for k, (lo, hi) in span.items():
        if got.get(k, 0) * S > burst * S + (hi - lo) * rate:
            errs.append(f"{k}: {got[k]} passed, more than burst {burst} + {rate}/s over {(hi - lo) / S:.3f} s")
    return errs


def checksums_ok(frame):
    """The IPv4 header and TCP/UDP checksums of an Ethernet frame verify (RFC 1071)."""
    def fold(b):
        b += b"\0" * (len(b) % 2)
        s = sum(struct.unpack(f">{len(b) // 2}H", b))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return s

    if frame[12:14] == b"\x08\x00":
        ihl = (frame[14] & 15) * 4
        ip, l4 = frame[14 : 14 + ihl], frame[14 + ihl :]
        if fold(ip) != 0xFFFF:
            return False
        pseudo = ip[12:20] + bytes([0, ip[9]]) + struct.pack(">H", len(l4))
    else:
        ip, l4 = frame[14:54], frame[54:]
        pseudo = ip[8:40] + struct.pack(">I", len(l4)) + bytes([0, 0, 0, ip[6]])
    return fold(pseudo + l4) == 0xFFFF


def dst_of(frame):
    return addr(frame[30:34] if frame[12:14] == b"\x08\x00" else frame[38:54])

"""Helpers the models share: address normalisation and a small deterministic traffic mixer."""
import ipaddress
import random
import struct

from scapy.all import ICMP, IP, TCP, UDP, Ether, ICMPv6EchoRequest, IPv6, Raw

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
    if proto == "icmp":
        l4 = ICMPv6EchoRequest() if ":" in src else ICMP()
    else:
        l4 = UDP(sport=sport, dport=dport) if proto == "udp" else TCP(sport=sport, dport=dport, flags=flags)
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip / l4 / Raw(b"x" * size)


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

#!/usr/bin/env python3
"""A model of ddos's declared rule (crates/nf/src/library/ddos.rs), written from its documentation, not its code.

Every source not in the admit prefix gets at most `threshold` packets per window through, whether the shared
table holds it (exact per-source count) or not (count-min sketch: never undercounts, so it drops at least as
much). For a trace shorter than one window each source's drops are therefore at least max(0, n - threshold):
the sum is the fewest drops the rule allows. Admitted sources are never dropped.

usage: ddos_model.py TRACE.pcap THRESHOLD WINDOW_S [ADMIT_PREFIX|none] [OUTPUT.pcap]
prints JSON: {"min_drops": N, "admitted_in": K, "admitted_out": K2 (with OUTPUT)}
"""
import ipaddress
import json
import struct
import sys


def packets(path):
    """(time in ns, IPv4 source) of every IPv4 packet of a classic pcap (Ethernet, optional one VLAN tag)."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        end = "<"
    else:
        end = ">"
        magic = struct.unpack_from(">I", data, 0)[0]
    nano = magic == 0xA1B23C4D
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack_from(end + "IIII", data, off)
        frame = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        t = sec * 1_000_000_000 + (frac if nano else frac * 1000)
        et, ip = struct.unpack_from(">H", frame, 12)[0], 14
        if et == 0x8100:
            et, ip = struct.unpack_from(">H", frame, 16)[0], 18
        if et != 0x0800 or len(frame) < ip + 20:
            continue
        yield t, ipaddress.IPv4Address(frame[ip + 12 : ip + 16])


def main():
    trace, threshold, window_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    admit = sys.argv[4] if len(sys.argv) > 4 else "none"
    net = None if admit == "none" else ipaddress.ip_network(admit, strict=False)
    counts, times, admitted_in = {}, [], 0
    for t, src in packets(trace):
        times.append(t)
        if net is not None and src in net:
            admitted_in += 1
            continue
        counts[src] = counts.get(src, 0) + 1
    if times and max(times) - min(times) >= window_s * 1e9:
        sys.exit("the model covers traces shorter than one window")
    out = {"min_drops": sum(max(0, n - threshold) for n in counts.values()), "admitted_in": admitted_in}
    if len(sys.argv) > 5:
        out["admitted_out"] = sum(1 for _, src in packets(sys.argv[5]) if net is not None and src in net)
    print(json.dumps(out))


main()

#!/usr/bin/env python3
"""Chain-graph oracle (issue 31): a scapy-crafted trace and what each branch of

    acl(rule=drop:udp:10.0.0.0/8;drop:tcp:any:any:any:9000) -> { allow: fsc -> port(a) ; deny: count -> port(b) }

must see, from the ACL's documented rule language (first matching rule decides, no match: allow):
drop UDP from 10.0.0.0/8, drop TCP to port 9000, allow the rest.

Writes into OUTDIR: in.pcap (the input), allow.pcap and deny.pcap (the input filtered by the
model, in input order) and model.json: per allowed flow what `fsc` exports (packets, frame bytes,
first/last packet time after the input's first packet) and what `count` reports for the denied
packets.
"""
import ipaddress
import json
import random
import sys

from scapy.all import IP, TCP, UDP, Ether, wrpcap

STEP_NS = 10_000  # packet spacing: 10 us, exact in a microsecond pcap


def denied(src, proto, dport):
    if proto == "udp" and ipaddress.ip_address(src) in ipaddress.ip_network("10.0.0.0/8"):
        return True
    if proto == "tcp" and dport == 9000:
        return True
    return False


def main(outdir, n):
    rnd = random.Random(31)
    flows = []
    for _ in range(150):
        if rnd.random() < 0.5:
            src = "10.%d.%d.%d" % (rnd.randrange(256), rnd.randrange(256), rnd.randrange(1, 255))
        else:
            src = "192.168.%d.%d" % (rnd.randrange(256), rnd.randrange(1, 255))
        dst = "172.16.0.%d" % rnd.randrange(1, 255)
        flows.append((src, dst, rnd.choice(["udp", "tcp"]), rnd.randrange(1024, 65000), rnd.choice([53, 80, 443, 9000])))
    pkts, allow, deny = [], [], []
    model = {}
    deny_packets = deny_bytes = 0
    for k in range(n):
        src, dst, proto, sport, dport = flows[rnd.randrange(len(flows)) if rnd.random() < 0.7 else rnd.randrange(10)]
        l4 = UDP(sport=sport, dport=dport) if proto == "udp" else TCP(sport=sport, dport=dport, flags="A")
        p = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src=src, dst=dst) / l4 / (b"y" * rnd.randrange(0, 300))
        p.time = 1 + k * STEP_NS / 1e9
        pkts.append(p)
        size = len(bytes(p))
        if denied(src, proto, dport):
            deny.append(p)
            deny_packets += 1
            deny_bytes += size
        else:
            allow.append(p)
            key = (6 if proto == "tcp" else 17, src, dst, sport, dport)
            row = model.setdefault(key, {"packets": 0, "bytes": 0, "first_ns": k * STEP_NS})
            row["packets"] += 1
            row["bytes"] += size
            row["last_ns"] = k * STEP_NS
    wrpcap(f"{outdir}/in.pcap", pkts)
    wrpcap(f"{outdir}/allow.pcap", allow)
    wrpcap(f"{outdir}/deny.pcap", deny)
    rows = [
        {"proto": k[0], "src": k[1], "dst": k[2], "sport": k[3], "dport": k[4], **v}
        for k, v in sorted(model.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][4], kv[0][0]))
    ]
    json.dump(
        {
            "packets": n,
            "allow_flows": rows,
            "allow_packets": len(allow),
            "deny": {"packets": deny_packets, "bytes": deny_bytes},
            # Packet time 0 of a run over allow.pcap alone, in the input's packet time.
            "allow_first_ns": min(r["first_ns"] for r in rows),
        },
        open(f"{outdir}/model.json", "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3000)

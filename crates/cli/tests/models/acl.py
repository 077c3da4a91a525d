"""acl model (module doc): ordered rules, file rules first then inline ones; the first rule whose
protocol (`icmp` = ICMP or ICMPv6), prefixes (of the packet's own family only) and port ranges
(only TCP/UDP with ports) all match decides; `default` when none does."""
import ipaddress
import os

from common import pkt, rng

FILE_RULES = """# file rules come first
drop proto udp src 10.0.0.0/8 dport 53
allow proto tcp dst 192.0.2.0/24 dport 443
drop src 172.16.0.0/12   # any protocol
allow proto 17 src 2001:db8::/32 sport 1000-1999
"""
INLINE = ("drop:tcp:10.0.0.0/8:any:any:22;allow:udp:any:192.0.2.0/24:any:1000-2000;drop:udp:any:192.0.2.0/24;"
          "drop:icmp:[2001:db8::]/32;allow:any:[2001:db8::]/32:any:any:80-90;drop:any:any:[2001:db8::]/32;"
          "allow:icmp:any:198.51.100.0/24;allow:6:any:198.51.100.0/24:any:79-91")
CHAIN = f"acl(rules={{tmp}}/rules.txt,rule={INLINE},default=drop)"


def files(tmp):
    with open(os.path.join(tmp, "rules.txt"), "w") as f:
        f.write(FILE_RULES)


def parse_rules():
    """Both forms as (action, proto, src, dst, sport, dport); None = any."""
    out, names = [], {"tcp": 6, "udp": 17, "icmp": "icmp", "any": None}
    for line in FILE_RULES.splitlines():
        w = line.split("#")[0].split()
        if w:
            kv = dict(zip(w[1::2], w[2::2]))
            out.append([w[0]] + [kv.get(k, "any") for k in ("proto", "src", "dst", "sport", "dport")])
    for r in INLINE.split(";"):
        out.append(inline(r))
    conv = lambda v, kind: None if v == "any" else (names[v] if v in names else int(v)) if kind == "p" else (
        ipaddress.ip_network(v) if kind == "n" else tuple(map(int, (v + "-" + v).split("-")[:2])))
    return [(r[0],) + tuple(conv(v, k) for v, k in zip(r[1:], "pnnrr")) for r in out]


def inline(r):
    """ACTION[:PROTO[:SRC[:DST[:SPORT[:DPORT]]]]], splitting on ':' outside brackets (IPv6)."""
    fields, cur, depth = [], "", 0
    for ch in r:
        depth += ch == "["
        depth -= ch == "]"
        if ch == ":" and not depth:
            fields.append(cur)
            cur = ""
        elif ch not in "[]":
            cur += ch
    fields.append(cur)
    return fields + ["any"] * (6 - len(fields))


RULES = parse_rules()


def matches(rule, p):
    _, proto, src, dst, sport, dport = rule
    if proto == "icmp" and p.proto not in (1, 58) or proto not in (None, "icmp") and proto != p.proto:
        return False
    for net, a in ((src, p.src), (dst, p.dst)):
        if net is not None and (ipaddress.ip_address(a).version != net.version or ipaddress.ip_address(a) not in net):
            return False
    for rng_, port in ((sport, p.sport), (dport, p.dport)):
        if rng_ is not None and (p.proto not in (6, 17) or not rng_[0] <= port <= rng_[1]):
            return False
    return True


def expect(recs):
    return [next((r[0] == "allow" for r in RULES if matches(r, p)), False) for p in recs]


def craft():
    r, flows = rng(9), []
    srcs = ["10.1.2.3", "10.200.0.1", "172.16.5.5", "172.32.0.1", "192.168.1.1", "2001:db8::5", "2001:db9::5"]
    dsts = ["192.0.2.7", "198.51.100.7", "203.0.113.7", "2001:db8::77", "2001:dba::77"]
    ports = [22, 52, 53, 54, 78, 79, 80, 90, 91, 92, 443, 999, 1000, 1500, 1999, 2000, 2001]
    for _ in range(300):
        s = r.choice(srcs)
        d = r.choice([x for x in dsts if (":" in x) == (":" in s)])
        flows.append((s, d, r.choice(["tcp", "udp", "udp", "icmp"]), r.choice(ports), r.choice(ports)))
    flows += [("10.1.2.3", "192.0.2.7", "tcp", 5, 443), ("10.1.2.3", "192.0.2.7", "tcp", 5, 444),
              ("2001:db8::5", "2001:dba::77", "udp", 999, 7), ("2001:db8::5", "2001:dba::77", "udp", 1999, 7)]
    return [(n * 100_000, pkt(*r.choice(flows))) for n in range(1500)]

"""lb model (module doc): a flow's first packet picks a backend of its family's pool
(IPv4: base, base+1, ... `backends`; IPv6: base6, ... `backends6`) as a function of its 5-tuple
alone (a keyed hash: which backend is the NF's business, but it must not depend on the executor,
batch size, core count or strategy); every later packet goes to the same backend; the destination
is rewritten with valid checksums and nothing else changes; the export has one row per flow: its
5-tuple as received and its backend. The model checks stickiness, the pools, the export, and that
every run of the matrix assigns every flow the backend the first run checked gave it."""
import functools
import ipaddress

from common import addr, checksums_ok, dst_of, flow_of, pkt, rec_flow, rng

B4, B6 = 5, 3
BASE, BASE6 = "10.10.0.1", "2001:db8:b::1"
CHAIN = f"lb(backends={B4},base={BASE},base6={BASE6},backends6={B6})"
EXPORT = True


def craft():
    r, out = rng(8), []
    flows = [(f"10.0.{i}.2", "192.0.2.100", "tcp" if i % 2 else "udp", 3000 + i, 80) for i in range(41)]
    flows += [(f"2001:db8:c::{i:x}", "2001:db8::100", "udp" if i % 3 else "tcp", 4000 + i, 443) for i in range(16)]
    for n in range(1500):
        f = flows[n] if n < len(flows) // 2 else r.choice(flows)  # staggered first packets
        out.append((n * 1000 + r.randrange(1000), pkt(*f, size=r.randrange(0, 200))))
    return out


def expect(recs):
    return [True] * len(recs)


def mask(frame, p):
    """The frame without the destination address and the checksums a rewrite changes."""
    l4 = 54 if p.v6 else 34
    cut = [(38, 54)] if p.v6 else [(24, 26), (30, 34)]
    cut.append((l4 + (16 if p.proto == 6 else 6), l4 + (18 if p.proto == 6 else 8)))
    b = bytearray(frame)
    for lo, hi in cut:
        b[lo:hi] = bytes(hi - lo)
    return bytes(b)


@functools.lru_cache(maxsize=None)
def pool(base, n):
    return tuple(addr(ipaddress.ip_address(base) + i) for i in range(n))


# flow -> backend, from the first run checked; every later run must agree (one process runs them all).
ASSIGNED = {}


def check(recs, run, expect, verdicts):
    errs = verdicts(None, recs, run, expect)
    by_tag = {t: f for t, (_, f) in zip(run.tags, run.out)}
    flows, seen = {rec_flow(p) for p in recs}, {}
    exported = {flow_of(x): addr(x["backend"]) for x in run.export}
    for p in recs:
        out = by_tag.get(p.i)
        if out is None:
            continue
        if len(out) != len(p.frame) or not checksums_ok(out):
            errs.append(f"{p.i}: rewritten frame has a bad length or checksum")
        if mask(out, p) != mask(p.frame, p):
            errs.append(f"{p.i}: bytes other than the destination and checksums changed")
        to, f = dst_of(out), rec_flow(p)
        first = seen.setdefault(f, to)
        want = ASSIGNED.setdefault(f, to)
        if to not in (pool(BASE6, B6) if p.v6 else pool(BASE, B4)):
            errs.append(f"{p.i} {f}: sent to {to}, outside its family's pool")
        if to != first or to != exported.get(f, "no row") or to != want:
            errs.append(f"{p.i} {f}: sent to {to}, first {first}, exported {exported.get(f)}, other runs {want}")
    if set(exported) != flows or len(exported) != len(run.export):
        errs.append(f"export: {len(run.export)} rows for {len(flows)} flows")
    return errs

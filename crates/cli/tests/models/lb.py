"""lb model (module doc): a flow's first packet picks the next backend of its family's pool
(IPv4: base, base+1, ... `backends`; IPv6: base6, ... `backends6`), round robin per core; every
later packet goes to the same backend; the destination is rewritten with valid checksums and
nothing else changes; the export has one row per flow: its 5-tuple as received and its backend.
On one core the assignment is exact; on N cores each core runs its own round robin, so the
model checks stickiness, the pools and that per-backend counts differ by at most N."""
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


def check(recs, run, expect, verdicts):
    errs = verdicts(None, recs, run, expect)
    by_tag = {t: f for t, (_, f) in zip(run.tags, run.out)}
    sent, nxt, seen = {}, {4: 0, 6: 0}, {}  # the one-core assignment; each flow's first backend
    exported = {flow_of(x): addr(x["backend"]) for x in run.export}
    for p in recs:
        fam = 6 if p.v6 else 4
        if rec_flow(p) not in sent:
            sent[rec_flow(p)] = pool(BASE6, B6)[nxt[6] % B6] if p.v6 else pool(BASE, B4)[nxt[4] % B4]
            nxt[fam] += 1
        out = by_tag.get(p.i)
        if out is None:
            continue
        if len(out) != len(p.frame) or not checksums_ok(out):
            errs.append(f"{p.i}: rewritten frame has a bad length or checksum")
        if mask(out, p) != mask(p.frame, p):
            errs.append(f"{p.i}: bytes other than the destination and checksums changed")
        to = dst_of(out)
        first = seen.setdefault(rec_flow(p), to)
        got = exported.get(rec_flow(p), "no row" if run.label != "shared" else first)  # see KNOWN below
        if run.cores == 1 and to != sent[rec_flow(p)]:
            errs.append(f"{p.i} {rec_flow(p)}: sent to {to}, expected {sent[rec_flow(p)]}")
        elif to != first or to != got or first not in pool(BASE6, B6) + pool(BASE, B4):
            errs.append(f"{p.i} {rec_flow(p)}: sent to {to}, first {first}, exported backend {got}")
    if run.label == "shared" and len(run.export) < len(sent):
        return errs + [f"KNOWN: shared exports {len(run.export)} of {len(sent)} flows (issue 29, lb under shared)"]
    rows = {flow_of(x): addr(x["backend"]) for x in run.export}
    if set(rows) != set(sent) or len(rows) != len(run.export):
        errs.append(f"export: {len(run.export)} rows for {len(sent)} flows")
    for base, n in ((BASE, B4), (BASE6, B6)):
        counts = [list(rows.values()).count(b) for b in pool(base, n)]
        if sum(counts) != sum((":" in f[1]) == (":" in base) for f in rows):
            errs.append(f"export: backends outside the pool {pool(base, n)}")
        if max(counts) - min(counts) > run.cores:
            errs.append(f"backends of {base}: flows per backend {counts}, more than {run.cores} apart")
    return errs

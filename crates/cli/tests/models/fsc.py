"""fsc model (module doc + README): every packet passes; the export has one row per 5-tuple with
its packets, bytes (the frame length), first and last seen (ns after the capture's first packet)."""
from common import MS, flow_of, pkt, rec_flow, rng

CHAIN = "fsc"
EXPORT = True


def craft():
    r = rng(1)
    flows = [(f"10.0.{i}.1", f"192.0.2.{i % 7}", "tcp" if i % 3 else "udp", 1024 + i, 80 + i % 2) for i in range(24)]
    flows += [(f"2001:db8::{i:x}", "2001:db8:1::1", "udp" if i % 2 else "tcp", 5000 + i, 53) for i in range(8)]
    out = []
    for n in range(1500):
        f = flows[min(int(r.expovariate(0.15)), len(flows) - 1)]  # skewed flow sizes
        out.append((n * 2 * MS + r.randrange(MS), pkt(f[0], f[1], f[2], f[3], f[4], size=r.randrange(0, 400))))
    return out


def expect(recs):
    return [True] * len(recs)


def check(recs, run, expect, verdicts):
    errs = verdicts(None, recs, run, expect)
    want = {}
    for p in recs:
        w = want.setdefault(rec_flow(p), [0, 0, p.t, p.t])
        w[0], w[1], w[3] = w[0] + 1, w[1] + len(p.frame), p.t
    got = {flow_of(x): [x["packets"], x["bytes"], x["first_ns"], x["last_ns"]] for x in run.export}
    if len(got) != len(run.export):
        errs.append(f"export has {len(run.export) - len(got)} duplicate rows")
    for f in sorted(set(want) | set(got), key=str):
        if want.get(f) != got.get(f):
            errs.append(f"flow {f}: expected [packets, bytes, first, last] {want.get(f)}, exported {got.get(f)}")
    return errs

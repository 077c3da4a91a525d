"""ratelimit model (module doc): a token bucket per 5-tuple, `pps` tokens per second up to
`burst`; a packet that finds less than one token is dropped (a passing one takes one token).
Not stated in the doc, assumed: a flow's bucket starts full. Under `--scale shared` the README
lists ratelimit as order-dependent: there only the bucket's bound is checked."""
from common import MS, S, bucket_bound_errors, bucket_model, pkt, rng

PPS, BURST = 100, 5
CHAIN = f"ratelimit(pps={PPS},burst={BURST})"
TICK = S // PPS  # one token's worth of time: 10 ms


def craft():
    r, out = rng(2), []
    # Exactly one token per packet after the burst is spent (passes), and 1 ns short of it (drops).
    for n in range(60):
        out.append((n * TICK, pkt("10.0.0.1", "192.0.2.1", "udp", 1, 2)))
        out.append((n * TICK - (1 if n > 8 else 0), pkt("10.0.0.2", "192.0.2.1", "udp", 1, 2)))
    # Twice the rate, fractional tokens, over IPv6 and TCP.
    for n in range(200):
        out.append((n * TICK // 2 + 3, pkt("2001:db8::1", "2001:db8::2", "tcp", 443, 5000 + n % 2)))
    # Bursts after idle gaps that refill part of, or the whole, bucket.
    t = 0
    for gap in (0, 3 * TICK, 5 * TICK, 50 * TICK, TICK + 1, 7 * TICK - 1):
        t += gap
        out += [(t + k, pkt("10.0.0.3", "198.51.100.9", "udp", 7, 7)) for k in range(BURST + 2)]
    # Poisson flows at about the rate.
    for f in range(30):
        t = r.randrange(S)
        for _ in range(40):
            t += int(r.expovariate(PPS * 1.2) * S)
            out.append((t, pkt(f"10.1.{f}.1", "192.0.2.80", "tcp" if f % 2 else "udp", 2000 + f, 80)))
    return sorted(out, key=lambda x: x[0])


def key(r):
    return r.flow


def expect(recs):
    return bucket_model(recs, key, lambda r: 1, PPS, BURST)


def check(recs, run, expect, verdicts):
    if run.label == "shared":
        errs = [] if "ratelimit" in run.order_not_guaranteed() else ["shared: not in order_not_guaranteed"]
        return errs + bucket_bound_errors(recs, set(run.tags), key, lambda r: 1, PPS, BURST)
    return verdicts(None, recs, run, expect)

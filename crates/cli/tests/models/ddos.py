"""ddos model (module doc): per source address, a tumbling window of `window` anchored at the
source's first packet after the previous window ended; every packet counts (dropped ones too)
and once the count exceeds `threshold` the rest of the window is dropped. Assumed where the doc
is silent: a window anchored at a covers [a, a + window), so a packet at exactly a + window
starts the next one; the export's columns (window_start_ns, window_packets, blocked,
blocked_windows) are the current window's start and count, whether it is over the threshold,
and in how many windows the source went over."""
from common import MS, S, addr, pkt, rng

W, T = S // 2, 20
CHAIN = f"ddos(window=0.5,threshold={T})"
EXPORT = True


def craft():
    r, out = rng(5), []
    for n in range(700):  # one attacker, many flows, 200 packets/s: 20 pass per window
        out.append((n * 5 * MS, pkt("10.0.0.66", f"192.0.2.{n % 9}", "tcp" if n % 2 else "udp", 1000 + n % 13, 80)))
    for n in range(25 * 3):  # 25 packets per window in bursts on the window's edges
        w, k = divmod(n, 25)
        t = w * W + (k if k < 24 else W - 1)
        out.append((t + w, pkt("10.0.0.7", "192.0.2.1", "udp", 5, 5)))  # anchors drift by 1 ns per window
    for n in range(300):  # IPv6 source just over the threshold, gaps that re-anchor later
        out.append((n * 11 * MS + (n // 30) * 300 * MS, pkt("2001:db8::bad", "2001:db8::1", "udp", n, 53)))
    for s in range(40):  # light sources
        t = r.randrange(3 * S)
        out += [(t + k * 30 * MS, pkt(f"10.1.0.{s}", "192.0.2.9", "tcp", 2000 + s, 443)) for k in range(r.randrange(1, 30))]
    return sorted(out, key=lambda x: x[0])


def run_model(recs):
    state, verdict = {}, []
    for r in recs:
        ws, c, blocked = state.get(r.src, (None, 0, 0))
        if ws is None or r.t >= ws + W:
            ws, c = r.t, 0
        c += 1
        blocked += c == T + 1
        state[r.src] = (ws, c, blocked)
        verdict.append(c <= T)
    return verdict, state


def expect(recs):
    return run_model(recs)[0]


def check(recs, run, expect, verdicts):
    if run.label == "shared":
        return shared_bound(recs, run)
    errs = verdicts(None, recs, run, expect)
    want = {addr(s): (ws, c, c > T, b) for s, (ws, c, b) in run_model(recs)[1].items()}
    got = {addr(x["src"]): (x["window_start_ns"], x["window_packets"], x["blocked"], x["blocked_windows"]) for x in run.export}
    for s in sorted(set(want) | set(got)):
        if want.get(s) != got.get(s):
            errs.append(f"export {s}: expected (start, packets, blocked, windows) {want.get(s)}, got {got.get(s)}")
    return errs


def shared_bound(recs, run):
    """Any order: windows are anchored at packets at least `window` apart, so a source gets at
    most `threshold` packets per `window` of its time span, plus one window."""
    errs = [] if "ddos" in run.order_not_guaranteed() else ["shared: ddos not in order_not_guaranteed"]
    span, passed = {}, {}
    for r in recs:
        lo, hi = span.get(r.src, (r.t, r.t))
        span[r.src] = (min(lo, r.t), max(hi, r.t))
        passed[r.src] = passed.get(r.src, 0) + (r.i in set(run.tags))
    for s, (lo, hi) in span.items():
        if passed[s] > T * ((hi - lo) // W + 1):
            # Bug (reported): cores far apart in packet time re-anchor the window back and forth,
            # each forward step opening a fresh window (1.2-3.3x the bound seen on 2 cores,
            # depending on the interleaving): listed, not failed, until shared refuses or bounds it.
            errs.append(f"KNOWN: shared over-admits (window re-anchoring): {s}: {passed[s]} passed over "
                        f"{(hi - lo) / S:.3f} s, more than {T} per window")
    return errs

"""psd model (module doc): per source, distinct destination ports probed in a tumbling window
(anchored at the source's first packet after the previous window ended); probes are UDP packets
and TCP packets without ACK (`tcp=noack`); once the estimate reaches `ports` the source's packets
are dropped for the rest of the window (probes or not). The sketch's hash is unspecified, so the
model brackets the flip: never before the distinct ports reach the set bits the estimate needs
(set bits <= distinct ports), always by twice `ports` distinct ports; in between either, but
the flip is on a probe of a new port and lasts to the window's end."""
import math

from common import MS, S, addr, pkt, rng

W, PORTS, M = S, 20, 512
CHAIN = f"psd(window=1,ports={PORTS})"
EXPORT = True
# Fewest set bits whose linear-counting estimate -m ln(1 - z/m) reaches `ports`.
ZMIN = next(z for z in range(1, M) if -M * math.log(1 - z / M) >= PORTS)
ACK = 0x10


def craft():
    r, out = rng(6), []
    for n in range(120):  # SYN scan, sequential, revisits and ACKs mixed in, ICMP follows the verdict
        port = [1 + n // 2, 1 + n // 4, 7][n % 3]
        out.append((n * 5 * MS, pkt("10.0.0.5", "192.0.2.1", "tcp", 40000, port, flags="SA" if n % 7 == 0 else "S")))
        if n % 10 == 0:
            out.append((n * 5 * MS + 1, pkt("10.0.0.5", "192.0.2.1", "icmp")))
    for n in range(200):  # UDP scan of random ports from IPv6, over two windows
        out.append((n * 10 * MS, pkt("2001:db8::5", "2001:db8::1", "udp", 5353, r.randrange(1, 65536))))
    for n in range(200):  # a busy server: replies to many client ports, all with ACK
        out.append((n * 9 * MS, pkt("192.0.2.80", f"10.2.0.{n % 50}", "tcp", 80, 30000 + n, flags="A")))
    for w in range(3):  # 15 new ports per window, windows back to back: never flagged
        out += [(w * W + k * 20 * MS, pkt("10.0.0.9", "192.0.2.1", "udp", 9, 100 * w + k)) for k in range(15)]
    for s in range(30):
        t = r.randrange(3 * S)
        out += [(t + k * 40 * MS, pkt(f"10.1.0.{s}", "192.0.2.9", "udp", 2000, 53 + k % 3)) for k in range(r.randrange(1, 12))]
    return sorted(out, key=lambda x: x[0])


def is_probe(r):
    return r.proto == 17 or (r.proto == 6 and not r.flags & ACK)


def run_model(recs):
    """Per packet: True (must pass), False (must drop) or None; per source: (window start, ports)."""
    state, out = {}, []
    for r in recs:
        ws, ports, flip = state.get(r.src, (None, set(), None))
        if ws is None or r.t >= ws + W:
            ws, ports, flip = r.t, set(), None
        new = is_probe(r) and r.dport not in ports
        if new:
            ports.add(r.dport)
        v = False if flip == "sure" else None if flip == "maybe" or (new and len(ports) >= ZMIN) else True
        if new and len(ports) >= 2 * PORTS:
            v, flip = False, "sure"
        elif v is None:
            flip = "maybe"
        state[r.src] = (ws, ports, flip)
        r.window, r.new = (r.src, ws), new
        out.append(v)
    return out, state


def expect(recs):
    return run_model(recs)[0]


def check(recs, run, expect, verdicts):
    got = set(run.tags)
    if run.label == "shared":  # order not guaranteed; set bits never exceed the distinct ports
        errs = [] if "psd" in run.order_not_guaranteed() else ["shared: psd not in order_not_guaranteed"]
        ports = {}
        for r in recs:
            ports.setdefault(r.src, set()).update([r.dport] if is_probe(r) else [])
        return errs + [f"{r.i} of {r.src} dropped" for r in recs if len(ports[r.src]) < ZMIN and r.i not in got]
    errs = verdicts(None, recs, run, expect)
    dropped = {}
    for r in recs:  # the flip: at a new port's probe, then to the window's end
        if r.i not in got and r.window not in dropped:
            dropped[r.window] = r.i
            errs += [] if r.new else [f"{r.i}: first drop of {r.window} is not a new port's probe"]
        elif r.i in got and r.window in dropped:
            errs.append(f"{r.i}: passed after {dropped[r.window]} was dropped in window {r.window}")
    _, state = run_model(recs)
    rows = {addr(x["src"]): x for x in run.export}
    for src, (ws, ports, _) in state.items():
        x = rows.pop(addr(src), None)
        flagged = (src, ws) in dropped
        est_max = -M * math.log(1 - len(ports) / M) + 1
        if x is None or (x["window_start_ns"], x["flagged"]) != (ws, flagged) or not 0 <= x["ports_estimate"] <= est_max:
            errs.append(f"export {src}: expected start {ws}, flagged {flagged}, estimate <= {est_max:.1f}: {x}")
    return errs + [f"export: unexpected row {x}" for x in rows.values()]

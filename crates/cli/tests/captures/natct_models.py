"""Models of `nat` and `conntrack`, written from the rules in the module docs of
crates/nf/src/library/nat.rs and conntrack.rs (not from their code).

Each model takes the input packets (see `read`) and returns, per packet (by IP ID), None for a
drop or the (src, sport, dst, dport) it leaves with, plus counters (nat: export rows too).
"""

from collections import deque

from scapy.all import IP, TCP, UDP, rdpcap

FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10
M = 1 << 32


def read(path):
    """Packets as dicts: id, t (integer microseconds), frame length, 5-tuple, TCP fields."""
    out = []
    for p in rdpcap(path):
        ip = p[IP]
        l4 = p[TCP] if TCP in p else p[UDP] if UDP in p else None
        out.append({
            "id": ip.id, "t": round(float(p.time) * 1e6), "len": len(bytes(p)), "proto": ip.proto,
            "src": ip.src, "dst": ip.dst, "sport": l4.sport if l4 else 0, "dport": l4.dport if l4 else 0,
            "flags": int(p[TCP].flags) if TCP in p else 0, "seq": p[TCP].seq if TCP in p else 0,
            "ack": p[TCP].ack if TCP in p else 0,
        })
    return out


def nat(pkts, lo, hi, timeout, fin_timeout=4.0, filt="apdf", ext="203.0.113.1", observed=None):
    """One external address, inside 10.0.0.0/8; a pool per protocol (TCP, UDP). `observed`:
    id -> external port the run gave that outbound packet (several cores: which port of the pool
    is each core's choice)."""
    T, FT, n = timeout * 10**6, round(fin_timeout * 10**6), hi - lo + 1
    # Slots are (proto, port offset): each protocol has its own pool.
    free = {pr: deque((pr, i) for i in range(n)) for pr in (6, 17)}
    gen, maps, tw = {}, {}, deque()
    out, inn, res, c = {}, {}, {}, {"mappings_created": 0, "dropped_pool_exhausted": 0}
    scan = {6: 0, 17: 0}

    def alive(m, t):  # live at t (a last-seen time in the future is rebased to t)
        m["last"] = min(m["last"], t)
        return t - m["last"] <= T

    def held(f, t):
        return f is not None and f[0] in maps and maps[f[0]]["gen"] == f[1] and alive(maps[f[0]], t)

    def drop(s):
        del maps[s]
        gen[s] = gen.get(s, 0) + 1

    def release(s):
        drop(s)
        free[s[0]].append(s)

    def alloc(t, pr):
        if free[pr]:
            return free[pr].popleft()
        for k in range(n):
            s = (pr, (scan[pr] + k) % n)
            if s in maps and not alive(maps[s], t):
                drop(s)
                scan[pr] = (s[1] + 1) % n
                return s
        return None

    def fin(s, bit, t):
        m = maps[s]
        m["fin"] |= bit
        if m["fin"] == 3 and not m["queued"]:
            m["queued"] = True
            tw.append((t + FT, s, m["gen"]))

    def expire_tw(t):  # TIME_WAITs over at t release their port (if still held by that connection)
        while tw and tw[0][0] <= t:
            _, s, g = tw.popleft()
            if s in maps and maps[s]["gen"] == g:
                release(s)

    for p in pkts:
        t, key, tcp = p["t"], (p["src"], p["sport"], p["dst"], p["dport"], p["proto"]), p["proto"] == 6
        expire_tw(t)
        if p["proto"] not in (6, 17) or not (p["src"].startswith("10.") or p["dst"] == ext):
            res[p["id"]] = (p["src"], p["sport"], p["dst"], p["dport"])
        elif p["src"].startswith("10."):
            if not held(out.get(key), t):
                s = alloc(t, p["proto"]) if observed is None else (p["proto"], observed[p["id"]] - lo)
                if s is None:
                    c["dropped_pool_exhausted"] += 1
                    out.pop(key, None)
                    res[p["id"]] = None
                    continue
                if s in maps:  # (observed ports only: alloc never returns a held slot)
                    assert not alive(maps[s], t), "two live mappings on one port"
                    drop(s)
                maps[s] = {"gen": gen.get(s, 0), "last": t, "in": (p["src"], p["sport"]),
                           "remote": (p["dst"], p["dport"]), "fin": 0, "queued": False}
                out[key] = (s, maps[s]["gen"])
                c["mappings_created"] += 1
            s = out[key][0]
            maps[s]["last"] = t
            res[p["id"]] = (ext, lo + s[1], p["dst"], p["dport"])
            if tcp and p["flags"] & RST:
                release(s)
                del out[key]
            elif tcp and p["flags"] & FIN:
                fin(s, 1, t)
        else:
            if not held(inn.get(key), t):
                s = (p["proto"], p["dport"] - lo)
                m = maps.get(s) if 0 <= s[1] < n else None
                ok = m is not None and alive(m, t) and (filt == "eif" or (
                    m["remote"][0] == p["src"] and (filt == "adf" or m["remote"][1] == p["sport"])))
                if not ok:  # unmapped, filtered or stale: dropped
                    res[p["id"]] = None
                    continue
                inn[key] = (s, m["gen"])
            s = inn[key][0]
            res[p["id"]] = (p["src"], p["sport"]) + maps[s]["in"]
            if tcp and p["flags"] & RST:
                del inn[key]
            elif tcp and p["flags"] & FIN:
                fin(s, 2, t)
    # The report and the export judge at the run's end, the last packet's time (no rebase:
    # read-only), whichever core saw it: mappings live then, TIME_WAITs not yet over then.
    end = pkts[-1]["t"]
    expire_tw(end)
    for pr, name in ((6, "tcp"), (17, "udp")):
        c[f"{name}_ports_in_use"] = sum(1 for s, m in maps.items() if s[0] == pr and end - m["last"] <= T)
    c["tcp_ports_in_time_wait"] = sum(1 for _, s, g in tw if s in maps and maps[s]["gen"] == g)
    rows = []
    for table, d in ((out, "out"), (inn, "in")):
        for k, (s, g) in table.items():
            m = maps.get(s)
            if m and m["gen"] == g and end - m["last"] <= T:
                tr = (ext, lo + s[1]) if d == "out" else m["in"]
                rows.append((d, k[4], k[0], k[1], k[2], k[3], tr[0], tr[1]))
    return res, c, sorted(rows)


def after(a, b):
    return 0 < (a - b) % M < 1 << 31


def conntrack(pkts, window=1 << 24, timeout=300):
    W, conns, res = window, {}, {}
    c = {"new": 0, "established": 0, "closed": 0, "reset": 0, "rst_in_window": 0, "out_of_window": 0}
    for p in pkts:
        ident = (p["src"], p["sport"], p["dst"], p["dport"])
        res[p["id"]] = ident
        if p["proto"] != 6:
            continue
        t, f, seq, ack, me = p["t"], p["flags"], p["seq"], p["ack"], (p["src"], p["sport"])
        key = (frozenset([me, (p["dst"], p["dport"])]), 6)
        end = (seq + max(0, p["len"] - 54) + (f & SYN != 0) + (f & FIN != 0)) % M
        k = conns.get(key)
        if k:
            k["last"] = min(k["last"], t)
            if t - k["last"] > (timeout if k["st"] == "EST" else min(30, timeout)) * 10**6:
                del conns[key]
                k = None
        syn_only = f & (SYN | ACK | RST | FIN) == SYN
        if k is None or (k["st"] == "TW" and syn_only):
            if syn_only:
                conns[key] = {"st": "SS", "init": me, "isn": {me: seq}, "end": {me: end}, "acked": {}, "fin": set(), "last": t}
                c["new"] += 1
            else:
                res[p["id"]] = None
            continue
        other = [e for e in k["end"] if e != me] or [None]
        o, init = other[0], k["init"]

        def inwin(rst):
            if not (not after(seq, (k["acked"][me] + W) % M) and not after((k["end"][me] - W) % M, end)):
                return False
            return rst or not f & ACK or (not after(ack, k["end"][o]) and not after((k["end"][o] - W) % M, ack))

        ok = adv = False
        if k["st"] == "SS":
            if me != init and f & (SYN | ACK) == SYN | ACK and ack == (k["isn"][init] + 1) % M:
                k["st"], k["isn"][me], k["end"][me] = "SR", seq, end
                k["acked"][init], k["acked"][me] = ack, (seq + 1) % M
                ok = True
            elif f & RST:
                ok = (me != init and f & ACK and ack == (k["isn"][init] + 1) % M) or (
                    me == init and seq == (k["isn"][init] + 1) % M)
                if ok:
                    del conns[key]
                    c["reset"] += 1
            else:
                ok = me == init and syn_only and seq == k["isn"][init]
        elif f & RST:
            ok = inwin(True)
            if not ok:
                c["out_of_window"] += 1
            elif k["st"] == "SR" or seq == k["acked"][me]:
                del conns[key]
                c["reset"] += 1
            else:
                c["rst_in_window"] += 1
        elif k["st"] == "SR":
            if me == init and f & (SYN | ACK) == ACK and ack == (k["isn"][o] + 1) % M:
                ok = adv = inwin(False)
                c["out_of_window"] += not ok
                if ok:
                    k["st"] = "EST"
                    c["established"] += 1
            else:
                ok = me != init and f & (SYN | ACK) == SYN | ACK and seq == k["isn"][me]
        elif not f & SYN:
            ok = adv = inwin(False)
            c["out_of_window"] += not ok
            if ok and f & FIN:
                k["fin"].add(me)
                k["st"] = "CL" if len(k["fin"]) == 2 else "FW"
            elif ok and k["st"] == "CL" and f & ACK:
                k["st"] = "TW"
                c["closed"] += 1
        if ok and key in conns:
            k["last"] = t
        if adv:
            if after(end, k["end"][me]):
                k["end"][me] = end
            if f & ACK and after(ack, k["acked"][o]):
                k["acked"][o] = ack
        res[p["id"]] = ident if ok else None
    return res, c

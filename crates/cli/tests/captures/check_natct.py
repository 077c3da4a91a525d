#!/usr/bin/python3
"""Runs `flowplane` over the nat and conntrack captures (make_natct.py) under the executor x
batch x cores matrix and compares every packet's verdict and rewritten addresses, the counters
and the nat export with the models in natct_models.py (written from the module docs).

Usage: check_natct.py --bin FLOWPLANE --tmp DIR [--only nat|conntrack]
Prints "planned P checked C failed F" last; exits 1 if a case failed.
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import natct_models as models  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXECS = ["rtc", "batch", "microbatch", "pernf", "interleaved"]
BATCHES = [1, 4, 64, 256]
# nat's report counters judged at the run's end (the trace's last packet), on any core count.
END_KEYS = ("tcp_ports_in_use", "udp_ports_in_use", "tcp_ports_in_time_wait")
# A small table: the default one (2^20 connections) costs more to allocate than the run.
CT = "conntrack(conns=1024)"


def read_out(path):
    """IP ID -> (src, sport, dst, dport) of every IPv4 frame in a pcap (Ethernet)."""
    with open(path, "rb") as f:
        data = f.read()
    # Microsecond or nanosecond pcap, either byte order.
    end = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out, off = {}, 24
    while off + 16 <= len(data):
        incl = struct.unpack(end + "I", data[off + 8:off + 12])[0]
        fr = data[off + 16:off + 16 + incl]
        off += 16 + incl
        ip = fr[14:]
        ihl = (ip[0] & 15) * 4
        ports = struct.unpack("!HH", ip[ihl:ihl + 4]) if ip[9] in (6, 17) else (0, 0)
        pid = struct.unpack("!H", ip[4:6])[0]
        assert pid not in out, f"packet {pid} sent twice"
        out[pid] = (socket.inet_ntoa(ip[12:16]), ports[0], socket.inet_ntoa(ip[16:20]), ports[1])
    return out


def run(args, tmp, name, chain, cap, extra, export=False):
    o = os.path.join(tmp, name + ".pcap")
    cmd = [args.bin, "run", "--input", os.path.join(HERE, cap), "--chain", chain, "--table-capacity", "1024",
           "--output", o, "--json"] + extra
    if export:
        cmd += ["--export", "nat=" + os.path.join(tmp, name + ".json")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr.strip()}"
    rows = None
    if export:
        with open(os.path.join(tmp, name + ".json")) as f:
            rows = sorted(tuple(r[k] for k in ("direction", "proto", "src", "sport", "dst", "dport",
                                               "translated_addr", "translated_port")) for r in json.load(f))
    return (json.loads(p.stdout)["nfs"][0]["details"], read_out(o), rows), None


def compare(got, want):
    errs = [f"packet {i}: want {'drop' if w is None else w}, got {got.get(i, 'drop')}"
            for i, w in sorted(want.items()) if got.get(i) != w]
    return errs[:4]


def cases(only):
    """(name, capture, chain, flowplane args, model) for every cell of the matrix."""
    out = []
    one = [(e, b) for e in EXECS for b in BATCHES]
    if only in (None, "nat"):
        for filt in ["apdf", "eif", "adf"]:
            chain = f"nat(ports=7000-7000, timeout=10, fin_timeout=2, filter={filt})"
            model = ("nat", dict(lo=7000, hi=7000, timeout=10, fin_timeout=2, filt=filt))
            # Every executor and batch size for the default filter; the others at batch 64.
            for e, b in one if filt == "apdf" else [(e, 64) for e in EXECS]:
                out.append((f"reuse-{filt}-{e}-{b}", "nat_reuse.pcap", chain, ["--exec", e, "--batch", str(b)], model))
        model = ("nat", dict(lo=7000, hi=7000, timeout=10))
        for e, b in one:
            out.append((f"idle-{e}-{b}", "nat_idle.pcap", "nat(ports=7000-7000, timeout=10)",
                        ["--exec", e, "--batch", str(b)], model))
        chain = "nat(ports=7000-7007, timeout=10)"
        for e, b in one:
            for cores in (1, 2):
                m = ("nat", dict(lo=7000, hi=7007, timeout=10, observe=cores > 1))
                out.append((f"exec-{e}-{b}-{cores}c", "nat_exec.pcap", chain,
                            ["--exec", e, "--batch", str(b), "--cores", str(cores)], m))
        # Ports in use and the export at the trace's end: 1 core and 2 (rss), every executor.
        end = "nat(ports=7000-7015, timeout=10, fin_timeout=2)"
        for i, e in enumerate(EXECS):
            for cores in (1, 2):
                m = ("nat", dict(lo=7000, hi=7015, timeout=10, fin_timeout=2, observe=cores > 1))
                out.append((f"end-{e}-{cores}c", "nat_end.pcap", end,
                            ["--exec", e, "--batch", str(BATCHES[i % 4]), "--cores", str(cores), "--scale", "rss"], m))
        for e in ["batch", "rtc"]:
            out.append((f"exec-{e}-8v", "nat_exec.pcap", chain, ["--exec", e, "--virtual-cores", "8"],
                        ("nat", dict(lo=7000, hi=7007, timeout=10, observe=True))))
    if only in (None, "conntrack"):
        model = ("conntrack", {})
        for e, b in one:
            for cores in (1, 2):
                out.append((f"ct-{e}-{b}-{cores}c", "conntrack_seq.pcap", CT,
                            ["--exec", e, "--batch", str(b), "--cores", str(cores)], model))
        out.append(("ct-scr-2c", "conntrack_seq.pcap", CT, ["--scale", "scr", "--cores", "2"], model))
        out.append(("ct-8v", "conntrack_seq.pcap", CT, ["--virtual-cores", "8"], model))
    return out


def check(args, tmp, inputs, case):
    name, cap, chain, extra, (kind, params) = case
    nat = kind == "nat"
    if "--cores" not in extra and "--virtual-cores" not in extra:
        extra = extra + ["--cores", "1"]
    got, err = run(args, tmp, name, chain, cap, extra, export=nat)
    if err:
        return [f"{name}: {err}"]
    details, out, rows = got
    pkts = inputs[cap]
    if nat:
        p = {k: v for k, v in params.items() if k != "observe"}
        observed = None
        if params.get("observe"):
            # Several cores: which port of the pool a flow gets is its core's; take it from the run.
            observed = {q["id"]: out[q["id"]][1] for q in pkts if q["src"].startswith("10.") and q["id"] in out}
            if not all(params["lo"] <= port <= params["hi"] for port in observed.values()):
                return [f"{name}: ports outside the pool: {observed}"]
        try:
            want, counters, want_rows = models.nat(pkts, observed=observed, **p)
        except (KeyError, AssertionError) as e:
            return [f"{name}: the run's ports contradict the model: {e!r}"]
        # Several cores: what is judged at the run's end is the same as on one (the rest depends
        # on which core's share of the pool a flow got).
        keys = counters if observed is None else {k: counters[k] for k in END_KEYS}
    else:
        want, counters = models.conntrack(pkts, **params)
        keys = counters
    errs = compare(out, want)
    errs += [f"counter {k}: want {v}, got {details.get(k)}" for k, v in keys.items() if details.get(k) != v]
    if rows is not None and rows != want_rows:
        errs.append(f"export: want {want_rows}, got {rows}")
    return [f"{name}: {e}" for e in errs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--only", choices=["nat", "conntrack"])
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    plan = cases(args.only)
    inputs = {cap: models.read(os.path.join(HERE, cap)) for cap in {c[1] for c in plan}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: check(args, args.tmp, inputs, c), plan))
    failed = [r for r in results if r]
    for r in failed:
        print("\n".join(r))
    print(f"planned {len(plan)} checked {len(results)} failed {len(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Runs one NF's independent Python model against the `flowplane` binary over a run matrix.

Usage: harness.py FLOWPLANE_BIN NF TMPDIR [--full]

The model (`<NF>.py` beside this file, written from the NF's documented rule, not its code)
crafts a capture with scapy and says, packet by packet, what a serial run must forward.
The harness tags every packet (its index in 4 of the frame's last 8 bytes), writes a
nanosecond pcap, runs flowplane over the matrix (executor x batch x placement) and
compares the forwarded tags, the `--json` counters and the export with the model.

Matrix: executors x placements (1 core; 2 cores under rss, shared, rsspp, scr, dyssect;
8 virtual cores under rss), each at one batch size chosen so that every (executor, batch)
and (placement, batch) pair is covered too (a pairwise design, 35 runs per NF);
`--full` runs the whole product (140 runs per NF). Prints `checked N of N` at the end.
"""
import concurrent.futures
import importlib
import json
import os
import struct
import subprocess
import sys
import time


EXECS = ["rtc", "batch", "microbatch", "pernf", "interleaved"]
BATCHES = [1, 4, 64, 256]
# (label, extra args, cores) in plan order.
PLACEMENTS = [
    ("1core", ["--cores", "1"], 1),
    ("rss", ["--cores", "2", "--scale", "rss"], 2),
    ("shared", ["--cores", "2", "--scale", "shared"], 2),
    ("rsspp", ["--cores", "2", "--scale", "rsspp"], 2),
    ("scr", ["--cores", "2", "--scale", "scr"], 2),
    ("dyssect", ["--cores", "2", "--scale", "dyssect"], 2),
    ("vc8", ["--virtual-cores", "8", "--scale", "rss"], 8),
]
# The README's list of SCR-aware NFs; every other NF must refuse `--scale scr` in one line.
SCR_AWARE = {"ddos", "hh", "portknock", "ratelimit", "conntrack", "burn"}


class Rec:
    """One crafted packet as a model sees it: time (ns after the first packet), header fields
    (`common.Tmpl`), the tagged frame."""

    def __init__(self, i, t, tmpl):
        self.i, self.t = i, t
        self.v6, self.src, self.dst, self.proto = tmpl.v6, tmpl.src, tmpl.dst, tmpl.proto
        self.sport, self.dport, self.flags = tmpl.sport, tmpl.dport, tmpl.flags
        self.flow = self.nflow = (self.proto, self.src, self.dst, self.sport, self.dport)
        tag = struct.pack(">I", i)
        self.frame = tmpl.frame[:-8] + tag + bytes(b ^ 0xFF for b in tag)


class Run:
    """What one flowplane run produced, handed to a model's optional `check(...)`."""

    def __init__(self, label, cores, exe, batch, out_frames, report, export):
        self.label, self.cores, self.exe, self.batch = label, cores, exe, batch
        self.out = out_frames  # [(t_ns, bytes)] as written
        self.tags = [struct.unpack(">I", f[-8:-4])[0] for _, f in out_frames]
        self.report, self.export = report, export

    def nf(self, name):
        return next(n for n in self.report["nfs"] if n["name"] == name)

    def order_not_guaranteed(self):
        return self.report.get("scale", {}).get("order_not_guaranteed", [])


def write_pcap(path, frames):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))  # nanosecond pcap, Ethernet
        for t, b in frames:
            t += 1_700_000_000 * 10**9
            f.write(struct.pack("<IIII", t // 10**9, t % 10**9, len(b), len(b)) + b)


def read_pcap(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    scale = 1 if magic == 0xA1B23C4D else 1000
    assert magic in (0xA1B2C3D4, 0xA1B23C4D), f"{path}: not a little-endian pcap ({magic:#x})"
    out, off = [], 24
    while off < len(data):
        sec, frac, incl, _ = struct.unpack("<IIII", data[off : off + 16])
        out.append((sec * 10**9 + frac * scale, data[off + 16 : off + 16 + incl]))
        off += 16 + incl
    return out


def verdict_errors(model, recs, run, expect):
    """Serial semantics: the forwarded tags are exactly the expected ones (None = either)."""
    errs = []
    got = set(run.tags)
    if len(got) != len(run.tags):
        errs.append(f"{len(run.tags) - len(got)} packets forwarded twice")
    for r in recs:
        e = expect[r.i]
        if e is not None and e != (r.i in got):
            errs.append(f"packet {r.i} t={r.t} {r.flow} flags={r.flags:#x}: expected {'pass' if e else 'drop'}")
    return errs


def main():
    bin_, nf, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
    full = "--full" in sys.argv[4:]
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    model = importlib.import_module(nf)
    os.makedirs(tmp, exist_ok=True)
    if hasattr(model, "files"):
        model.files(tmp)  # e.g. a rule file the chain names
    crafted = model.craft()
    t0 = crafted[0][0]
    recs = [Rec(i, t - t0, p) for i, (t, p) in enumerate(crafted)]
    inp = os.path.join(tmp, "in.pcap")
    write_pcap(inp, [(r.t, r.frame) for r in recs])
    expect = model.expect(recs)
    assert len(expect) == len(recs)
    refuses = set(getattr(model, "REFUSES", ())) | ({"scr"} if nf not in SCR_AWARE else set())

    cells = []
    nf_i = sum(map(ord, nf))
    for e, exe in enumerate(EXECS):
        for p, (label, args, cores) in enumerate(PLACEMENTS):
            batches = BATCHES if full else [BATCHES[(e + p + nf_i) % 4]]
            # scr's replicas run no executor (another --exec is refused): its cells keep their batch sizes.
            run_exe = "batch" if label == "scr" else exe
            cells += [(run_exe, b, label, args, cores) for b in batches]

    failures, checked, drifts, known, spent = [], 0, [], [], {}

    def launch(n, cell):
        """Runs one cell in its own files. A run mostly waits (the runner's control period),
        so a few run at once."""
        exe, batch, label, args, cores = cell
        out, exp_path = os.path.join(tmp, f"out{n}.pcap"), None
        cmd = [bin_, "run", "--input", inp, "--output", out, "--chain", model.CHAIN.format(tmp=tmp), "--exec", exe]
        cmd += ["--batch", str(batch), "--table-capacity", "4096", "--json"] + args + getattr(model, "ARGS", [])
        if getattr(model, "EXPORT", False):
            exp_path = os.path.join(tmp, f"export{n}.json")
            cmd += ["--export", f"{nf}={exp_path}"]
        for f in (out, exp_path):
            if f and os.path.exists(f):
                os.remove(f)  # never read a previous run's files
        t_start = time.monotonic()
        pr = subprocess.run(cmd, capture_output=True, text=True)
        return pr, out, exp_path, time.monotonic() - t_start

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(launch, range(len(cells)), cells))
    for (exe, batch, label, args, cores), (pr, out, exp_path, secs) in zip(cells, results):
        spent[label] = spent.get(label, 0) + secs
        what = f"[{nf} --exec {exe} --batch {batch} {label}]"
        checked += 1
        if label in refuses:
            lines = pr.stderr.strip().splitlines()
            if pr.returncode != 2 or len(lines) != 1:
                failures.append(f"{what} expected a one-line refusal (exit 2), got {pr.returncode}: {pr.stderr}")
            continue
        if pr.returncode != 0:
            failures.append(f"{what} exit {pr.returncode}: {pr.stderr.strip()}")
            continue
        report = json.loads(pr.stdout)
        export = json.load(open(exp_path)) if exp_path else None
        run = Run(label, cores, exe, batch, read_pcap(out), report, export)
        errs = []
        if report["packets"] != len(recs) or report["scale"] and report["scale"].get("rx_ring_full"):
            errs.append(f"input not fully delivered: packets={report['packets']} of {len(recs)}")
        # The model's own check (multi-core rules, exports, counters); serial verdicts otherwise.
        if hasattr(model, "check"):
            errs += model.check(recs, run, expect, verdict_errors)
        else:
            errs += verdict_errors(model, recs, run, expect)
        first = run.nf(nf)
        if report["packets_out"] != len(run.tags) or first["packets_in"] != len(recs):
            errs.append(f"counters: {nf} in={first['packets_in']}, out={report['packets_out']}, pcap has {len(run.tags)}")
        # "KNOWN: ..." marks a reported bug owned elsewhere: listed, not failed (see the model).
        known += [f"{what} {e}" for e in errs if e.startswith("KNOWN")]
        errs = [e for e in errs if not e.startswith("KNOWN")]
        drift = len(verdict_errors(model, recs, run, expect))
        if drift and not errs:
            drifts.append(f"{what} {drift} verdicts differ from the serial model (bound checks passed)")
        if errs:
            failures.append(f"{what} {len(errs)} errors:\n  " + "\n  ".join(errs[:8]))
    for k in known:
        print(k)
    for d in drifts:
        print(f"DRIFT {d}")
    for f in failures:
        print(f"FAIL {f}")
    print("flowplane seconds per placement: " + ", ".join(f"{k} {v:.1f}" for k, v in spent.items()))
    npass, ndrop = sum(e is True for e in expect), sum(e is False for e in expect)
    print(f"model: {npass} pass, {ndrop} drop, {len(recs) - npass - ndrop} either, of {len(recs)} packets")
    print(f"checked {checked} of {len(cells)} runs, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

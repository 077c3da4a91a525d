#!/usr/bin/env bash
# What serving a run costs its data path (issue 31: < 1% when polled 10 times a second).
# An in-memory replay on one worker, run alternately without --ctl and with --ctl while a
# poller asks `show runtime` and `show nfs` 10 times a second; ROUNDS rounds each, medians.
# Prints Mpps and the worker's cycles/packet (TSC) of both and their ratio.
#   scripts/ctl_cost.sh                  ROUNDS=5 SECS=4 CHAIN="lb -> fsc -> ratelimit" scripts/ctl_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FP=${FP:-target/release/flowplane}
ROUNDS=${ROUNDS:-3}; SECS=${SECS:-3}; CHAIN=${CHAIN:-fsc}
GEN=${GEN:---flows 100000 --packets 1000000 --size 64 --seed 1}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
one() { # $1: plain|served -> "mpps cycles"
    local extra=() poller=
    if [[ $1 == served ]]; then
        extra=(--ctl "$tmp/s.sock")
    fi
    "$FP" run --gen "$GEN" --chain "$CHAIN" --cores 1 --duration "$SECS" --json "${extra[@]}" >"$tmp/r.json" &
    local pid=$!
    if [[ $1 == served ]]; then
        # One small client process (the socket's protocol: a JSON array of words, one answer line), so the
        # poller's own CPU is a few connections a second, not 20 process starts on the cores the run uses.
        python3 - "$tmp/s.sock" $pid <<'PY' & poller=$!
import json, os, socket, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
def alive():
    try:
        os.kill(pid, 0); return True
    except OSError:
        return False
while alive():
    for words in (["show", "runtime"], ["show", "nfs"]):
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(path)
            s.sendall((json.dumps(words) + "\n").encode()); s.recv(1 << 20); s.close()
        except OSError:
            pass
    time.sleep(0.1)
PY
    fi
    wait $pid
    [[ -n $poller ]] && wait $poller || true
    python3 -c "import json; j=json.load(open('$tmp/r.json')); print(j['mpps'], j['cycles_per_packet'])"
}
for r in $(seq 1 "$ROUNDS"); do
    p=$(one plain); s=$(one served)
    echo "round $r: plain $p   served $s" | awk '{printf "round %s plain %.2f Mpps %.1f cyc/pkt   served (10 polls/s) %.2f Mpps %.1f cyc/pkt\n", $2, $4, $5, $7, $8}'
    echo "$p $s" >>"$tmp/all"
done
python3 - "$tmp/all" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
pm, pc, sm, sc = (st.median(r[i] for r in rows) for i in range(4))
print(f"median: plain {pm:.2f} Mpps {pc:.1f} cycles/packet; served {sm:.2f} Mpps {sc:.1f} cycles/packet; "
      f"served/plain cycles {sc / pc:.3f} (target <= 1.01)")
PY

#!/usr/bin/python3
"""Captures of issue 29 (idle timeouts at lookup), for crates/cli/tests/cli_timeouts.rs.

Run from this directory: `/usr/bin/python3 make_timeouts.py` (needs python3-scapy). The pcaps are committed,
so the tests do not need scapy.

Every packet carries its expected verdict in its IPv4 identification field: the low 14 bits number the
packet, bit 14 (0x4000) set means "must come out", clear means "must be dropped". The expectations come
from the documented rules, not from flowplane: for fw they are derived by hand below (each line says
why); for portknock a 20-line model of the rule in portknock.rs's module doc computes them.

  fw_issue29.pcap   the issue's reproduction: a TCP connection, 20 s of silence, two segments from the
                    outside host; fw(timeout=6): the first four pass, the last two are dropped.
  fw_idle.pcap      fw(timeout=6) (allow_new=inside): TCP and UDP conversations idle just under and
                    just over the timeout, from either side.
  pk_idle.pcap      portknock(knock=7001-7002-7003,protect=22,timeout=5): open sources that idle out,
                    sources that stay open, a knock sequence that idles out half way.
"""

from scapy.all import Ether, IP, TCP, UDP, Raw, wrpcap

PASS = 0x4000
MAC_IN, MAC_OUT = "02:00:00:00:00:01", "02:00:00:00:00:02"


class Trace:
    def __init__(self):
        self.pkts = []

    def add(self, t, ip, l4, ok, payload=b""):
        n = len(self.pkts)
        assert n < PASS
        p = Ether(src=MAC_IN, dst=MAC_OUT) / IP(id=n | (PASS if ok else 0), **ip) / l4
        if payload:
            p = p / Raw(payload)
        p.time = t
        self.pkts.append(p)

    def write(self, name):
        self.pkts.sort(key=lambda p: float(p.time))
        wrpcap(name, self.pkts)


def tcp(tr, t, src, dst, sport, dport, flags, seq, ack, ok, length=0):
    tr.add(t, dict(src=src, dst=dst), TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=65535),
           ok, b"x" * length)


def udp(tr, t, src, dst, sport, dport, ok):
    tr.add(t, dict(src=src, dst=dst), UDP(sport=sport, dport=dport), ok, b"q" * 32)


IN, OUT = "10.0.0.5", "198.51.100.7"


def conn(tr, t0, cport, sport=80, cli=IN, srv=OUT):
    """Handshake plus 100 bytes from the client at t0 .. t0+0.03 (all pass: allowed SYN from the inside)."""
    tcp(tr, t0, cli, srv, cport, sport, "S", 1000, 0, True)
    tcp(tr, t0 + 0.01, srv, cli, sport, cport, "SA", 5000, 1001, True)
    tcp(tr, t0 + 0.02, cli, srv, cport, sport, "A", 1001, 5001, True)
    tcp(tr, t0 + 0.03, cli, srv, cport, sport, "PA", 1001, 5001, True, 100)


# ---- fw_issue29.pcap: the six packets ----
tr = Trace()
conn(tr, 0.0, 40000)
# 20 s of silence > timeout 6: the connection is gone, an outside packet without one is dropped.
tcp(tr, 20.03, OUT, IN, 80, 40000, "PA", 5001, 1101, False, 100)
tcp(tr, 20.04, OUT, IN, 80, 40000, "PA", 5101, 1101, False, 100)
tr.write("fw_issue29.pcap")

# ---- fw_idle.pcap ----
tr = Trace()
# A: the connection.
conn(tr, 0.0, 40000)
tcp(tr, 20.03, OUT, IN, 80, 40000, "PA", 5001, 1101, False, 100)
# B: the outside answers after 5 s (within 6): passes and refreshes the connection; the client acks at
# once; the outside's next segment comes 6.36 s after that: dropped, and so is the client's retransmission
# (the connection is gone and only a SYN opens one).
conn(tr, 0.1, 40001)
tcp(tr, 5.13, OUT, IN, 80, 40001, "PA", 5001, 1101, True, 100)
tcp(tr, 5.14, IN, OUT, 40001, 80, "A", 1101, 5101, True)
tcp(tr, 11.50, OUT, IN, 80, 40001, "PA", 5101, 1101, False, 100)
tcp(tr, 11.60, IN, OUT, 40001, 80, "A", 1101, 5101, False)
# C: the inside host itself resumes after 29 s of silence (not a SYN): no connection, dropped.
conn(tr, 0.3, 40002, 443, IN, "198.51.100.9")
tcp(tr, 29.33, IN, "198.51.100.9", 40002, 443, "PA", 1101, 5001, False, 100)
# D: UDP. The answer 2.8 s after the query passes; one 6.5 s after that is dropped (unsolicited);
# a new query opens the conversation again and its answer passes.
U_IN, U_OUT = "10.0.0.6", "198.51.100.8"
udp(tr, 0.2, U_IN, U_OUT, 5353, 53, True)
udp(tr, 3.0, U_OUT, U_IN, 53, 5353, True)
udp(tr, 9.5, U_OUT, U_IN, 53, 5353, False)
udp(tr, 9.6, U_IN, U_OUT, 5353, 53, True)
udp(tr, 9.7, U_OUT, U_IN, 53, 5353, True)
# E: a connection kept alive by packets 4-5 s apart, alternating sides, for 20 s: never idle, all pass.
conn(tr, 0.4, 40003)
cseq, sseq = 1101, 5001
for k, t in enumerate([4.9, 9.4, 13.9, 18.4, 22.9]):
    if k % 2 == 0:
        tcp(tr, t, OUT, IN, 80, 40003, "PA", sseq, cseq, True, 10)
        sseq += 10
    else:
        tcp(tr, t, IN, OUT, 40003, 80, "PA", cseq, sseq, True, 10)
        cseq += 10
tr.write("fw_idle.pcap")

# ---- pk_idle.pcap: a model of portknock's documented rule computes the verdicts ----
KNOCK, PROTECT, TIMEOUT = [7001, 7002, 7003], 22, 5.0


def portknock_model(events):
    """events: (t, src, dport) TCP segments in time order -> pass/drop each.

    Per source: a stage (0 .. len(KNOCK), the last = OPEN) and the time of its last TCP packet. A packet
    finding the source idle for more than TIMEOUT finds it at stage 0 (fresh state); then the automaton
    steps (Ki at stage i-1 advances, OPEN stays OPEN, anything else resets to 0); packets to PROTECT pass
    only if the source is OPEN after the step; everything else passes.
    """
    st, out = {}, []
    for t, src, dport in events:
        stage, last = st.get(src, (0, None))
        if last is not None and t - last > TIMEOUT:
            stage = 0
        if stage == len(KNOCK):
            pass
        elif dport == KNOCK[stage]:
            stage += 1
        else:
            stage = 0
        st[src] = (stage, t)
        out.append(dport != PROTECT or stage == len(KNOCK))
    return out


X, Y, Z, SRV = "198.51.100.20", "198.51.100.21", "198.51.100.22", "10.0.0.1"
ev = []
# X: the case (knocks at 1.0-1.2, connects at 1.3 and again at 20), then knocks again and connects.
ev += [(1.0, X, 7001, 41000), (1.1, X, 7002, 41001), (1.2, X, 7003, 41002), (1.3, X, 22, 41003)]
ev += [(20.0, X, 22, 41004)]
ev += [(20.1, X, 7001, 41005), (20.2, X, 7002, 41006), (20.3, X, 7003, 41007), (20.4, X, 22, 41008)]
# Y: stays open with gaps under 5 s (one reuses its earlier connection's 5-tuple), then idles 6 s.
ev += [(1.0, Y, 7001, 42000), (1.1, Y, 7002, 42001), (1.2, Y, 7003, 42002), (1.3, Y, 22, 42003)]
ev += [(5.0, Y, 22, 42004), (9.0, Y, 22, 42004), (13.5, Y, 443, 42005), (18.4, Y, 22, 42006)]
ev += [(24.5, Y, 22, 42007)]
# Z: two knocks, then the third 5.9 s later: the sequence idled out, so the port stays closed.
ev += [(2.0, Z, 7001, 43000), (2.1, Z, 7002, 43001), (8.0, Z, 7003, 43002), (8.1, Z, 22, 43003)]
ev.sort(key=lambda e: e[0])
verdicts = portknock_model([(t, s, d) for t, s, d, _ in ev])
tr = Trace()
for (t, src, dport, sport), ok in zip(ev, verdicts):
    tcp(tr, t, src, SRV, sport, dport, "S", 7, 0, ok)
tr.write("pk_idle.pcap")

#!/usr/bin/python3
"""Writes the nat and conntrack regression captures (issue 29) next to this script.

Every packet carries a unique IP ID (its index + 1), so a test can tell which input packets
came out. Times are seconds from 1000 s (the pcap keeps microseconds).

  nat_reuse.pcap     TCP, one port: an inside RST frees the port, a new connection to the same
                     remote endpoint reuses it (its replies must pass); FINs both ways + TIME_WAIT
                     free it again for a third connection (to another remote port: the old 5-tuple's
                     stray packet then passes or not by the filter); a late packet of the closed
                     connection finds the pool empty.
  nat_idle.pcap      UDP, one port, timeout 10: replies within / past the idle timeout (the boundary
                     to the microsecond), a 100 s quiet gap, then new flows that find the idle
                     mapping free or the pool exhausted.
  nat_exec.pcap      UDP, one flow: a reply 9.06 s into the 10 s timeout, then the flow's next packet
                     past the timeout in the same batch window; every reply is sent to each port of
                     the pool 7000-7007 (on several cores the flow's port is its core's share).
  nat_end.pcap       UDP and TCP flows whose last packets are at ~8 s (idle at the end) and ~16 s
                     (FINs both ways: TIME_WAIT over by the end), and one UDP flow to the end at 25 s:
                     ports in use and the export are judged at the trace's end on 1 and 2 cores.
  conntrack_seq.pcap TCP: a handshake, then segments far outside the window (RST 2^29 behind, data
                     2^28 ahead and 2^27 behind, FIN 2^28 ahead), RSTs in window but not exact, an
                     exact RST, and a connection closed by FINs; legitimate data after each probe.

Run: /usr/bin/python3 make_natct.py  (python3-scapy)
"""

import os

from scapy.all import IP, TCP, UDP, Ether, Raw, wrpcap

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = "203.0.113.1"
R = "198.51.100.7"
T0 = 1000.0


def write(name, events):
    """events: (time s, packet without Ether); IP IDs numbered in order."""
    pkts = []
    for i, (t, p) in enumerate(events):
        p = p.copy()
        p[IP].id = i + 1
        f = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / p
        f.time = T0 + t
        pkts.append(f)
    wrpcap(os.path.join(HERE, name), pkts)


def tcp(src, sport, dst, dport, flags, seq, ack=0, data=b""):
    p = IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=65535)
    return p / Raw(data) if data else p


def udp(src, sport, dst, dport):
    return IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / Raw(b"x" * 8)


def nat_reuse():
    a, b, c = ("10.0.0.1", 3000), ("10.0.0.2", 4000), ("10.0.0.3", 5000)
    ev = []

    def out(t, h, flags, seq, ack=0, data=b"", dport=80):
        ev.append((t, tcp(h[0], h[1], R, dport, flags, seq, ack, data)))

    def back(t, flags, seq, ack=0, data=b"", sport=80):
        ev.append((t, tcp(R, sport, EXT, 7000, flags, seq, ack, data)))

    # A: handshake, data, then an inside RST releases port 7000 at once.
    out(0.00, a, "S", 100)
    back(0.01, "SA", 900, 101)
    out(0.02, a, "A", 101, 901)
    out(0.03, a, "PA", 101, 901, b"hello")
    back(0.04, "PA", 901, 106, b"world")
    out(0.05, a, "R", 106)
    # B to the same remote endpoint gets 7000 again: its three replies must reach B.
    out(0.20, b, "S", 200)
    back(0.21, "SA", 5000, 201)
    out(0.22, b, "A", 201, 5001)
    back(0.23, "PA", 5001, 201, b"r1")
    back(0.24, "PA", 5003, 201, b"r2")
    # B closes: FINs both ways, last ACK; TIME_WAIT (fin_timeout=2) ends at 0.31 + 2.
    out(0.30, b, "FA", 201, 5005)
    back(0.31, "FA", 5005, 202)
    out(0.32, b, "A", 202, 5006)
    back(1.00, "FA", 5005, 202)  # retransmitted during TIME_WAIT: passes
    # C, after TIME_WAIT, to the remote's port 443: takes 7000.
    out(3.00, c, "S", 300, dport=443)
    back(3.01, "SA", 7000, 301, sport=443)
    out(3.02, c, "A", 301, 7001, dport=443)
    back(3.03, "PA", 7001, 301, b"c1", sport=443)
    back(3.04, "PA", 7003, 301, b"c2", sport=443)
    # B's old 5-tuple again: a new connection, the pool (one port) is C's: dropped.
    out(3.05, b, "A", 202, 5006)
    # A stray packet from R:80 (the old connections' endpoint) to 7000: eif and adf let it
    # reach C, apdf does not (C's mapping is to R:443).
    back(3.06, "A", 5006, 202)
    back(3.07, "PA", 7005, 301, b"c3", sport=443)
    write("nat_reuse.pcap", ev)


def nat_idle():
    a, b, c = ("10.0.0.1", 1000), ("10.0.0.2", 1001), ("10.0.0.3", 1002)
    ev = []

    def out(t, h):
        ev.append((t, udp(h[0], h[1], R, 53)))

    def back(t):
        ev.append((t, udp(R, 53, EXT, 7000)))

    out(0.0, a)
    back(1.0)  # pass
    out(5.0, a)  # refresh
    back(14.0)  # 9 s after the last outbound packet: pass
    back(15.000001)  # 10.000001 s: past the timeout, dropped
    back(30.0)  # dropped
    out(130.0, b)  # after a 100 s gap: A's idle mapping is free, B takes 7000
    out(130.5, c)  # exhausted (B holds the only port)
    back(131.0)  # to B
    out(135.0, c)  # still exhausted
    out(141.5, c)  # B idle since 130: C takes 7000
    back(142.0)  # to C
    out(142.5, b)  # B's mapping is gone: a new flow, exhausted
    back(151.5)  # exactly 10 s after C's last outbound packet: pass
    back(151.500001)  # past it: dropped
    out(152.0, b)  # C idle: B takes 7000
    back(152.5)  # to B
    write("nat_idle.pcap", ev)


def nat_exec():
    a = ("10.0.0.1", 1000)
    ev = []

    def out(t):
        ev.append((t, udp(a[0], a[1], R, 53)))

    def back(t):
        for port in range(7000, 7008):
            ev.append((t, udp(R, 53, EXT, port)))

    # Transit filler (neither inside nor to the external address) keeps the batches full.
    def filler(t, k):
        ev.append((t, udp("192.0.2.%d" % (k % 200 + 1), 2000 + k, "198.18.0.%d" % (k % 50 + 1), 9)))

    out(0.0)
    back(0.5)
    for k in range(40):
        filler(1.0 + k * 0.2, k)
    back(9.06)  # 9.06 s into the 10 s timeout: pass
    out(10.5)  # past the timeout: a new mapping (the idle one is reclaimed)
    back(10.6)  # pass
    for k in range(40, 60):
        filler(10.7 + (k - 40) * 0.01, k)
    back(21.0)  # 10.5 s after the last outbound packet: dropped
    write("nat_exec.pcap", ev)


def nat_end():
    """Flows whose last packet is long before the trace's end, and one flow to the end: on two
    cores the core without it stops early, yet its ports count at the trace's end."""
    ev = []
    # A: 6 UDP mappings and 2 open TCP connections, last packets at ~8 s (live at 16 s, idle at 25 s).
    for k in range(6):
        h = ("10.0.0.%d" % (k + 1), 1000 + k)
        for t in (0.1 * k, 7.5 + 0.05 * k):
            ev.append((t, udp(h[0], h[1], R, 53)))
    for port in range(7000, 7016):  # the remote's replies, to each port of the pool
        ev.append((7.9, udp(R, 53, EXT, port)))
    for k in range(2):
        h, seq = ("10.0.1.%d" % (k + 1), 2000 + k), 100 + k
        ev.append((0.5 + k * 0.1, tcp(h[0], h[1], R, 80, "S", seq)))
        ev.append((8.0 + k * 0.1, tcp(h[0], h[1], R, 80, "A", seq + 1, 1, b"data")))
    # B: 4 TCP connections closed by FINs both ways at ~16 s: TIME_WAIT (2 s) over at ~18 s.
    for k in range(4):
        h, seq, rp = ("10.0.2.%d" % (k + 1), 3000 + k), 500 + k, 8080 + k
        t = 15.5 + 0.1 * k
        ev.append((t, tcp(h[0], h[1], R, rp, "S", seq)))
        ev.append((t + 0.2, tcp(h[0], h[1], R, rp, "FA", seq + 1, 1)))
        for port in range(7000, 7016):  # the remote's FIN, to each port of the pool
            ev.append((t + 0.25, tcp(R, rp, EXT, port, "FA", 900, seq + 2)))
        ev.append((t + 0.3, tcp(h[0], h[1], R, rp, "A", seq + 2, 901)))
    # L: one UDP flow to the end (every 2 s, live at 25 s; to another remote port, so the 7.9 s
    # replies are filtered on its port). Nothing else comes after 16 s: the core without L stops there.
    for k in range(13):
        ev.append((2.0 * k + 0.01, udp("10.0.3.1", 4000, R, 5353)))
    ev.append((25.0, udp("10.0.3.1", 4000, R, 5353)))
    ev.sort(key=lambda e: e[0])
    write("nat_end.pcap", ev)


def conntrack_seq():
    cl, sv = ("10.0.0.5", 40000), ("198.51.100.7", 80)
    ev = []
    m = 1 << 32

    def c(t, flags, seq, ack=0, data=b""):
        ev.append((t, tcp(cl[0], cl[1], sv[0], sv[1], flags, seq % m, ack % m, data)))

    def s(t, flags, seq, ack=0, data=b""):
        ev.append((t, tcp(sv[0], sv[1], cl[0], cl[1], flags, seq % m, ack % m, data)))

    ci, si = 1_000_000, 3_000_000_000  # the server's numbers wrap past 2^32
    c(0.00, "S", ci)
    s(0.01, "SA", si, ci + 1)
    c(0.02, "A", ci + 1, si + 1)
    c(0.03, "PA", ci + 1, si + 1, b"a" * 100)
    s(0.04, "PA", si + 1, ci + 101, b"b" * 1000)
    c(0.05, "R", ci + 101 - (1 << 29))  # RST 2^29 behind: dropped, connection kept
    c(0.06, "PA", ci + 101, si + 1001, b"c" * 10)  # the next 3 legitimate packets pass
    s(0.07, "A", si + 1001, ci + 111)
    c(0.08, "PA", ci + 111, si + 1001, b"d" * 10)
    c(0.09, "PA", ci + 121 + (1 << 28), si + 1001, b"e" * 10)  # 2^28 ahead: dropped
    c(0.10, "PA", ci + 121 - (1 << 27), si + 1001, b"f" * 10)  # 2^27 behind: dropped
    s(0.11, "PA", si + 1001 + (1 << 28), ci + 121, b"g")  # server data 2^28 ahead: dropped
    c(0.12, "A", ci + 121, si + 1001 + (1 << 20))  # acks data never sent: dropped
    c(0.13, "FA", ci + 121 + (1 << 28), si + 1001)  # FIN far ahead: dropped, not closing
    c(0.14, "PA", ci + 121, si + 1001, b"h" * 10)  # passes: still established
    s(0.15, "A", si + 1001, ci + 131)
    c(0.16, "PA", ci + 121, si + 1001, b"h" * 10)  # a retransmission (in window): passes
    s(0.17, "R", si + 1001 + 500)  # server RST in window, not exact: passes, kept
    c(0.18, "PA", ci + 131, si + 1001, b"i" * 10)  # passes
    s(0.19, "A", si + 1001, ci + 141)
    c(0.20, "R", ci + 141)  # exact RST: passes, connection reset
    c(0.21, "PA", ci + 141, si + 1001, b"j" * 10)  # no connection: dropped
    s(0.22, "A", si + 1001, ci + 151)  # dropped
    # A second connection closed by FINs; packets after the close.
    c2 = ("10.0.0.6", 40001)

    def c_(t, flags, seq, ack=0, data=b""):
        ev.append((t, tcp(c2[0], c2[1], sv[0], sv[1], flags, seq % m, ack % m, data)))

    def s_(t, flags, seq, ack=0, data=b""):
        ev.append((t, tcp(sv[0], sv[1], c2[0], c2[1], flags, seq % m, ack % m, data)))

    c_(0.30, "S", 7)
    s_(0.31, "SA", 70, 8)
    c_(0.32, "A", 8, 71)
    c_(0.33, "PA", 8, 71, b"k" * 20)
    s_(0.34, "FA", 71 - (1 << 27), 28)  # far out-of-window FIN: dropped
    s_(0.35, "PA", 71, 28, b"l" * 5)  # passes
    c_(0.36, "FA", 28, 76)
    s_(0.37, "FA", 76, 29)
    c_(0.38, "A", 29, 77)  # closes
    c_(0.39, "S", 5000)  # a new connection on the closed tuple
    s_(0.40, "SA", 9000, 5001)
    write("conntrack_seq.pcap", ev)


if __name__ == "__main__":
    nat_reuse()
    nat_idle()
    nat_exec()
    nat_end()
    conntrack_seq()

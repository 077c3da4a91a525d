#!/usr/bin/env python3
"""An SMF written with scapy's PFCP layer provisioning QERs on a flowplane
UPF (TS 29.244 5.4.2, QER IEs 7.5.2.5: Gate Status, MBR, GBR, QFI; FAR
Transport Level Marking 8.2.12), the traffic to test them with, and a model
of the rule the UPF documents, written here from that text:

  A QER rate is a token bucket per direction on the packet clock: tokens in
  1/8,000,000 byte, capacity 100 ms of the rate and at least 3,000 bytes,
  full at the QER's first packet; a packet adds (its time - the bucket's
  last time, at most 1 s) x kbit/s tokens, capped. A packet passes if every
  closed-gate-free QER of its PDR has room for its IP bytes in each MBR
  bucket; then each MBR bucket is charged, and each GBR bucket is charged if
  it has room (the bytes count "within" the GBR) else they count "above".

Usage: smf_qos.py UPF_PORT PCAP_OUT TRAFFIC_PCAP

Session (the UPF chooses the uplink F-TEID):
  PDR 1 uplink, UDP to port 5001: QER 1 (MBR UL 4 Mbit/s) and QER 9 (session AMBR)
  PDR 2 uplink, UDP to port 5002: QER 2 (GBR UL 2 Mbit/s) and QER 9
  PDR 3 uplink, UDP to port 5003: QER 3 (UL gate closed)
  PDR 4 downlink: QER 4 (MBR DL 2 Mbit/s, QFI 5) and QER 9; FAR 2 to the
        gNB with Transport Level Marking DSCP 46 (ToS 0xb8)
  QER 9: AMBR UL 6 Mbit/s, DL 50 Mbit/s.
Traffic: 1.5 s of packet time, flows 1 and 2 offered 8 Mbit/s each, flow 3
a few packets, downlink 4 Mbit/s offered (1,200-byte IP packets).
Prints "SESSION teid", then "FATE 0110..." (one digit per frame of
TRAFFIC_PCAP: the model passes it), "FLOWS 1214..." (each frame's flow, 4:
downlink), then "BYTES f1 f2 f3 dl" (IP bytes the
model passes per flow) and "GBR within above" (QER 2, uplink), then "OK n"
with the PFCP exchange in PCAP_OUT.
"""
import random
import socket
import struct
import sys

from scapy.contrib.gtp import GTP_U_Header, GTPPDUSessionContainer
from scapy.contrib.pfcp import (
    PFCP, IE_ApplyAction, IE_Cause, IE_CreateFAR, IE_CreatePDR, IE_CreatedPDR, IE_CreateQER,
    IE_DestinationInterface, IE_FAR_Id, IE_ForwardingParameters, IE_FSEID, IE_FTEID, IE_GateStatus, IE_GBR,
    IE_MBR, IE_NodeId, IE_OuterHeaderCreation, IE_OuterHeaderRemoval, IE_PDI, IE_PDR_Id, IE_Precedence,
    IE_QER_Id, IE_QFI, IE_RecoveryTimeStamp, IE_SDF_Filter, IE_SourceInterface, IE_TransportLevelMarking,
    IE_UE_IP_Address, PFCPAssociationSetupRequest, PFCPSessionEstablishmentRequest,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

port, pcap, traffic_pcap = int(sys.argv[1]), sys.argv[2], sys.argv[3]
upf = ("127.0.0.1", port)
smf = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
smf.bind(("127.0.0.1", 0))
smf.settimeout(3)
frames = []
SMF_IP, UPF_IP, UE, DN, GNB, N3 = "10.0.0.1", "10.0.0.2", "10.45.0.1", "203.0.113.5", "198.51.100.10", "192.0.2.1"
random.seed(11)


def fail(what):
    print("FAIL: " + what, flush=True)
    sys.exit(1)


def record(src, dst, data):
    frames.append(IP(src=src, dst=dst) / UDP(sport=8805, dport=8805) / Raw(data))


def exchange(pkt):
    data = bytes(pkt)
    smf.sendto(data, upf)
    record(SMF_IP, UPF_IP, data)
    try:
        rsp, _ = smf.recvfrom(65535)
    except socket.timeout:
        fail("no response to %s" % pkt.payload.name)
    record(UPF_IP, SMF_IP, rsp)
    return PFCP(rsp)


def ie(p, cls):
    return next((i for i in p.payload.IE_list if isinstance(i, cls)), None)


def qer(qid, ul=0, dl=0, mbr=None, gbr=None, qfi=None):
    ies = [IE_QER_Id(id=qid), IE_GateStatus(ul=ul, dl=dl)]
    if mbr:
        ies.append(IE_MBR(ul=mbr[0], dl=mbr[1]))
    if gbr:
        ies.append(IE_GBR(ul=gbr[0], dl=gbr[1]))
    if qfi is not None:
        ies.append(IE_QFI(QFI=qfi))
    return IE_CreateQER(IE_list=ies)


def ul_pdr(pid, dport, qers):
    return IE_CreatePDR(IE_list=[
        IE_PDR_Id(id=pid), IE_Precedence(precedence=10 + pid),
        IE_PDI(IE_list=[IE_SourceInterface(interface="Access"), IE_FTEID(CH=1, CHID=1, choose_id=1, V4=1),
                        IE_UE_IP_Address(V4=1, ipv4=UE),
                        IE_SDF_Filter(FD=1, flow_description="permit out 17 from any %d to assigned" % dport)]),
        IE_OuterHeaderRemoval(header="GTP-U/UDP/IPv4"), IE_FAR_Id(id=1),
    ] + [IE_QER_Id(id=q) for q in qers])


NODE = IE_NodeId(id_type="IPv4", ipv4="127.0.0.1")
r = exchange(PFCP(version=1, S=0, seq=1) / PFCPAssociationSetupRequest(
    IE_list=[NODE, IE_RecoveryTimeStamp(timestamp=3_900_000_000)]))
if ie(r, IE_Cause).cause != 1:
    fail("association setup")
r = exchange(PFCP(version=1, S=1, seid=0, seq=2) / PFCPSessionEstablishmentRequest(IE_list=[
    NODE,
    IE_FSEID(v4=1, seid=0x51, ipv4="127.0.0.1"),
    ul_pdr(1, 5001, [1, 9]),
    ul_pdr(2, 5002, [2, 9]),
    ul_pdr(3, 5003, [3]),
    IE_CreatePDR(IE_list=[
        IE_PDR_Id(id=4), IE_Precedence(precedence=10),
        IE_PDI(IE_list=[IE_SourceInterface(interface="Core"), IE_UE_IP_Address(V4=1, SD=1, ipv4=UE)]),
        IE_FAR_Id(id=2), IE_QER_Id(id=4), IE_QER_Id(id=9),
    ]),
    IE_CreateFAR(IE_list=[IE_FAR_Id(id=1), IE_ApplyAction(FORW=1),
                          IE_ForwardingParameters(IE_list=[IE_DestinationInterface(interface="Core")])]),
    IE_CreateFAR(IE_list=[IE_FAR_Id(id=2), IE_ApplyAction(FORW=1),
                          IE_ForwardingParameters(IE_list=[
                              IE_DestinationInterface(interface="Access"),
                              IE_OuterHeaderCreation(GTPUUDPIPV4=1, TEID=0x99, ipv4=GNB),
                              IE_TransportLevelMarking(tos=0xb8, traffic_class=0xfc)])]),
    qer(1, mbr=(4000, 0)),
    qer(2, gbr=(2000, 0)),
    qer(3, ul=1),
    qer(4, mbr=(0, 2000), qfi=5),
    qer(9, mbr=(6000, 50000)),
]))
if ie(r, IE_Cause).cause != 1:
    fail("establishment: cause %d" % ie(r, IE_Cause).cause)
teid = [i for i in ie(r, IE_CreatedPDR).IE_list if isinstance(i, IE_FTEID)][0].TEID
print("SESSION %d" % teid, flush=True)

# The traffic: (time ns, flow, IP bytes); a flow's frames are all alike (built once).
SIZE = 1200


def ul_frame(dport, psc):
    inner = IP(src=UE, dst=DN) / UDP(sport=40000, dport=dport) / Raw(b"u" * (SIZE - 28))
    g = GTP_U_Header(teid=teid, E=1, next_ex=0x85) / GTPPDUSessionContainer(type=1, QFI=9) if psc else GTP_U_Header(teid=teid)
    return bytes(Ether() / IP(src=GNB, dst=N3) / UDP(sport=2152, dport=2152) / g / inner)


frame = {1: ul_frame(5001, True), 2: ul_frame(5002, True), 3: ul_frame(5003, False),
         4: bytes(Ether() / IP(src=DN, dst=UE) / UDP(sport=80, dport=40000) / Raw(b"d" * (SIZE - 28)))}
pkts = []
for k in range(1250):  # 8 Mbit/s each: a 1,200-byte packet every 1.2 ms
    for flow in (1, 2):
        pkts.append((k * 1_200_000 + (0 if flow == 1 else 600_000) + random.randint(0, 5000), flow, SIZE))
for k in range(20):
    pkts.append((k * 75_000_000 + 333, 3, SIZE))
for k in range(625):  # 4 Mbit/s downlink
    pkts.append((k * 2_400_000 + 1_000, 4, SIZE))
pkts.sort(key=lambda p: p[0])

UNITS = 8_000_000


class Bucket:
    def __init__(self, kbps):
        # 100 ms of the rate in bytes (kbit/s x 1000 / 8 x 0.1 s), at least 3,000 bytes, in tokens.
        burst = max(kbps * 1000 / 8 * 0.1, 3_000)
        self.kbps, self.cap, self.tokens, self.last = kbps, int(burst * UNITS), None, 0

    def room(self, now, nbytes):
        if self.tokens is None:
            self.tokens, self.last = self.cap, now
        dt = min(max(now - self.last, 0), 1_000_000_000)
        self.last = max(self.last, now)
        self.tokens = min(self.tokens + dt * self.kbps, self.cap)
        return self.tokens >= nbytes * UNITS

    def take(self, nbytes):
        self.tokens -= nbytes * UNITS


# Per flow: (gate open, [MBR buckets], [GBR buckets]); QER 9 (the AMBR) is one bucket per direction.
ambr_ul, ambr_dl = Bucket(6000), Bucket(50000)
mbr1, gbr2, mbr4 = Bucket(4000), Bucket(2000), Bucket(2000)
rules = {1: (True, [mbr1, ambr_ul], []), 2: (True, [ambr_ul], [gbr2]), 3: (False, [], []), 4: (True, [mbr4, ambr_dl], [])}
fate, passed, within, above = [], {1: 0, 2: 0, 3: 0, 4: 0}, 0, 0
for t, flow, n in pkts:
    gate, mbrs, gbrs = rules[flow]
    ok = gate and all([b.room(t, n) for b in mbrs])
    if ok:
        for b in mbrs:
            b.take(n)
        for b in gbrs:
            if b.room(t, n):
                b.take(n)
                within += n
            else:
                above += n
        passed[flow] += n
    fate.append("1" if ok else "0")

# A nanosecond pcap, written directly (scapy's writer would rebuild every frame).
with open(traffic_pcap, "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
    for t, flow, _ in pkts:
        b = frame[flow]
        f.write(struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, len(b), len(b)) + b)
print("FATE " + "".join(fate), flush=True)
print("FLOWS " + "".join(str(p[1]) for p in pkts), flush=True)
print("BYTES %d %d %d %d" % (passed[1], passed[2], passed[3], passed[4]), flush=True)
print("GBR %d %d" % (within, above), flush=True)
wrpcap(pcap, frames)
print("OK %d" % len(frames), flush=True)

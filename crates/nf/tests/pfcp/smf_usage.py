#!/usr/bin/env python3
"""An SMF written with scapy's PFCP layer checking a flowplane UPF's usage
reporting (TS 29.244 5.2.2, 7.5.5.2, 7.5.7.2, 7.5.8).

Usage: smf_usage.py UPF_PORT PCAP_OUT TRAFFIC_DIR T1_MS N1

Establishes a session whose URR 1 measures both directions with a volume
threshold, then three phases; before each, writes the phase's packets
(scapy's GTP-U uplink to the UPF-chosen TEID, plain downlink to the UE) to
TRAFFIC_DIR/phaseN.pcap, prints "TRAFFIC N PATH" and waits for a line on
stdin (the test has run them through the UPF):
1. past the threshold: the UPF's Session Report Request is left unanswered;
   it must come N1 + 1 times, the same bytes, about T1 apart;
2. a Session Modification with Query URR: the Usage Report in the response;
3. a Session Deletion: the final Usage Report in the response.
Each report's usage is printed as "USAGE N total ul dl packets ul_packets
dl_packets" (bytes and packets since the previous report, decoded by scapy;
the packet counts from the IE's bytes after the volumes). The PFCP exchange
goes to PCAP_OUT. Exit status 0: all checks passed.
"""
import random
import socket
import struct
import sys
import time

from scapy.contrib.gtp import GTP_U_Header
from scapy.contrib.pfcp import (
    PFCP, IE_ApplyAction, IE_Cause, IE_CreateFAR, IE_CreatePDR, IE_CreatedPDR, IE_CreateURR,
    IE_DestinationInterface, IE_FAR_Id, IE_ForwardingParameters, IE_FSEID, IE_FTEID, IE_MeasurementMethod,
    IE_NodeId, IE_OuterHeaderCreation, IE_OuterHeaderRemoval, IE_PDI, IE_PDR_Id, IE_Precedence, IE_QueryURR,
    IE_RecoveryTimeStamp, IE_ReportingTriggers, IE_SourceInterface, IE_UE_IP_Address, IE_URR_Id,
    IE_UsageReport_SDR, IE_UsageReport_SMR, IE_UsageReport_SRR, IE_UsageReportTrigger, IE_VolumeMeasurement,
    IE_VolumeThreshold, PFCPAssociationSetupRequest, PFCPSessionDeletionRequest,
    PFCPSessionEstablishmentRequest, PFCPSessionModificationRequest,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

port, pcap, tdir, t1, n1 = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]) / 1000, int(sys.argv[5])
upf = ("127.0.0.1", port)
smf = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
smf.bind(("127.0.0.1", 0))
smf.settimeout(3)
frames = []
SMF_IP, UPF_IP, UE, DN, GNB, N3 = "10.0.0.1", "10.0.0.2", "10.45.0.1", "203.0.113.5", "198.51.100.10", "192.0.2.1"
THRESHOLD = 3000
random.seed(7)


def fail(what):
    print("FAIL: " + what, flush=True)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def record(src, dst, data):
    frames.append(IP(src=src, dst=dst) / UDP(sport=8805, dport=8805) / Raw(data))


def exchange(pkt):
    data = bytes(pkt)
    smf.sendto(data, upf)
    record(SMF_IP, UPF_IP, data)
    while True:
        try:
            rsp, _ = smf.recvfrom(65535)
        except socket.timeout:
            fail("no response to %s" % pkt.payload.name)
        record(UPF_IP, SMF_IP, rsp)
        p = PFCP(rsp)
        if p.seq == pkt.seq and p.message_type == pkt.message_type + 1:
            return p


def ie(p, cls):
    for i in p.payload.IE_list:
        if isinstance(i, cls):
            return i
    return None


def sub(g, cls):
    for i in g.IE_list:
        if isinstance(i, cls):
            return i
    return None


seq = [0]


def hdr(seid=None):
    seq[0] += 1
    if seid is None:
        return PFCP(version=1, S=0, seq=seq[0])
    return PFCP(version=1, S=1, seid=seid, seq=seq[0])


def usage(phase, report, trigger):
    t = sub(report, IE_UsageReportTrigger)
    check(t is not None and getattr(t, trigger) == 1, "phase %d: trigger %s" % (phase, trigger))
    v = sub(report, IE_VolumeMeasurement)
    check(v is not None and v.TOVOL == 1 and v.ULVOL == 1 and v.DLVOL == 1, "phase %d: volumes" % phase)
    extra = bytes(v.extra_data)
    check(len(extra) >= 24, "phase %d: packet counts after the volumes" % phase)
    tp, up, dp = struct.unpack("!QQQ", extra[:24])
    print("USAGE %d %d %d %d %d %d %d" % (phase, v.total, v.uplink, v.downlink, tp, up, dp), flush=True)


def traffic(phase, teid, ul, dl):
    pkts = []
    for _ in range(ul):
        inner = IP(src=UE, dst=DN) / UDP(sport=4000, dport=53) / Raw(b"u" * random.randint(10, 400))
        pkts.append(Ether() / IP(src=GNB, dst=N3) / UDP(sport=2152, dport=2152) / GTP_U_Header(teid=teid) / inner)
    for _ in range(dl):
        pkts.append(Ether() / IP(src=DN, dst=UE) / UDP(sport=53, dport=4000) / Raw(b"d" * random.randint(10, 400)))
    random.shuffle(pkts)
    path = "%s/phase%d.pcap" % (tdir, phase)
    wrpcap(path, pkts)
    print("TRAFFIC %d %s" % (phase, path), flush=True)
    check(sys.stdin.readline().strip() == "done", "the test ran phase %d" % phase)


NODE = IE_NodeId(id_type="IPv4", ipv4="127.0.0.1")
r = exchange(hdr() / PFCPAssociationSetupRequest(IE_list=[NODE, IE_RecoveryTimeStamp(timestamp=3_900_000_000)]))
check(ie(r, IE_Cause).cause == 1, "association setup")
r = exchange(hdr(0) / PFCPSessionEstablishmentRequest(IE_list=[
    NODE,
    IE_FSEID(v4=1, seid=0x77, ipv4="127.0.0.1"),
    IE_CreatePDR(IE_list=[
        IE_PDR_Id(id=1), IE_Precedence(precedence=10),
        IE_PDI(IE_list=[IE_SourceInterface(interface="Access"), IE_FTEID(CH=1, V4=1),
                        IE_UE_IP_Address(V4=1, ipv4=UE)]),
        IE_OuterHeaderRemoval(header="GTP-U/UDP/IPv4"), IE_FAR_Id(id=1), IE_URR_Id(id=1),
    ]),
    IE_CreatePDR(IE_list=[
        IE_PDR_Id(id=2), IE_Precedence(precedence=10),
        IE_PDI(IE_list=[IE_SourceInterface(interface="Core"), IE_UE_IP_Address(V4=1, SD=1, ipv4=UE)]),
        IE_FAR_Id(id=2), IE_URR_Id(id=1),
    ]),
    IE_CreateFAR(IE_list=[IE_FAR_Id(id=1), IE_ApplyAction(FORW=1),
                          IE_ForwardingParameters(IE_list=[IE_DestinationInterface(interface="Core")])]),
    IE_CreateFAR(IE_list=[IE_FAR_Id(id=2), IE_ApplyAction(FORW=1),
                          IE_ForwardingParameters(IE_list=[
                              IE_DestinationInterface(interface="Access"),
                              IE_OuterHeaderCreation(GTPUUDPIPV4=1, TEID=0x99, ipv4=GNB)])]),
    IE_CreateURR(IE_list=[IE_URR_Id(id=1), IE_MeasurementMethod(VOLUM=1), IE_ReportingTriggers(volume_threshold=1),
                          IE_VolumeThreshold(TOVOL=1, total=THRESHOLD)]),
]))
check(ie(r, IE_Cause).cause == 1, "establishment: cause %d" % ie(r, IE_Cause).cause)
up_seid = ie(r, IE_FSEID).seid
teid = [i for i in ie(r, IE_CreatedPDR).IE_list if isinstance(i, IE_FTEID)][0].TEID
print("SESSION %d" % teid, flush=True)

# Phase 1: past the threshold; the report is not answered: N1 + 1 sends, T1 apart.
traffic(1, teid, 12, 10)
sends = []
deadline = time.time() + t1 * (n1 + 1) + 0.4
while time.time() < deadline:
    smf.settimeout(max(0.01, deadline - time.time()))
    try:
        data, _ = smf.recvfrom(65535)
    except socket.timeout:
        break
    record(UPF_IP, SMF_IP, data)
    p = PFCP(data)
    if p.message_type == 56:
        sends.append((time.time(), data, p))
check(len(sends) == n1 + 1, "%d Session Report Requests, expected N1 + 1 = %d" % (len(sends), n1 + 1))
check(all(s[1] == sends[0][1] for s in sends), "retransmissions are the same request")
gaps = [b[0] - a[0] for a, b in zip(sends, sends[1:])]
check(all(g >= 0.8 * t1 for g in gaps), "retransmissions T1 apart: %s" % gaps)
p = sends[0][2]
check(p.seid == 0x77, "the report names the CP SEID")
usage(1, ie(p, IE_UsageReport_SRR), "VOLTH")
smf.settimeout(3)

# Phase 2: Query URR.
traffic(2, teid, 5, 4)
r = exchange(hdr(up_seid) / PFCPSessionModificationRequest(IE_list=[IE_QueryURR(IE_list=[IE_URR_Id(id=1)])]))
check(ie(r, IE_Cause).cause == 1, "query: cause")
usage(2, ie(r, IE_UsageReport_SMR), "IMMER")

# Phase 3: deletion with the final report.
traffic(3, teid, 4, 6)
r = exchange(hdr(up_seid) / PFCPSessionDeletionRequest())
check(ie(r, IE_Cause).cause == 1, "deletion: cause")
usage(3, ie(r, IE_UsageReport_SDR), "TERMR")

wrpcap(pcap, frames)
print("OK %d datagrams" % len(frames), flush=True)

#!/usr/bin/env python3
"""An SMF written with scapy's PFCP layer checking a flowplane UPF's
downlink buffering (TS 29.244 5.2.4, 7.5.2.6, 7.5.4.11, 7.5.9.2).

Usage: smf_buffer.py UPF_PORT PCAP_OUT TRAFFIC_DIR

Establishes a session whose downlink FAR buffers (BUFF|NOCP, BAR 1 with a
Suggested Buffering Packets Count of 8), then:
1. writes 12 downlink packets (UDP payload "seq N", N = 1..12; 1-4 at 0 s,
   5-12 at 1.5 s) to TRAFFIC_DIR/phase1.pcap, prints "TRAFFIC 1 PATH" and
   waits for "done" on stdin (the test has run them through the UPF);
2. waits for the UPF's Session Report Request (Report Type DLDR, a Downlink
   Data Report naming PDR 2) and answers it with an Update BAR carrying a DL
   Buffering Duration of 2 s (timer unit 2 s, value 1);
3. modifies the session: FAR 2 forwards (Update FAR, FORW);
4. writes 3 more (N = 13..15, at 3 s) as phase 2 and waits for "done".
The PFCP exchange goes to PCAP_OUT. Exit status 0: all checks passed.
"""
import socket
import sys

from scapy.contrib.pfcp import (
    PFCP, IE_ApplyAction, IE_BAR_Id, IE_Cause, IE_Create_BAR, IE_CreateFAR, IE_CreatePDR, IE_CreateURR,
    IE_DestinationInterface, IE_DLBufferingDuration, IE_DownlinkDataReport, IE_FAR_Id, IE_ForwardingParameters,
    IE_FSEID, IE_FTEID, IE_MeasurementMethod, IE_NodeId, IE_OuterHeaderCreation, IE_OuterHeaderRemoval, IE_PDI,
    IE_PDR_Id, IE_Precedence, IE_RecoveryTimeStamp, IE_ReportType, IE_SourceInterface,
    IE_SuggestedBufferingPacketsCount, IE_UE_IP_Address, IE_UpdateBAR_SRR, IE_UpdateFAR, IE_URR_Id,
    PFCPAssociationSetupRequest, PFCPSessionEstablishmentRequest, PFCPSessionModificationRequest,
    PFCPSessionReportResponse,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

port, pcap, tdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
upf = ("127.0.0.1", port)
smf = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
smf.bind(("127.0.0.1", 0))
smf.settimeout(3)
frames = []
SMF_IP, UPF_IP, UE, DN, GNB = "10.0.0.1", "10.0.0.2", "10.45.0.1", "203.0.113.5", "198.51.100.10"


def fail(what):
    print("FAIL: " + what, flush=True)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def record(src, dst, data):
    frames.append(IP(src=src, dst=dst) / UDP(sport=8805, dport=8805) / Raw(data))


def receive():
    try:
        rsp, _ = smf.recvfrom(65535)
    except socket.timeout:
        fail("nothing from the UPF")
    record(UPF_IP, SMF_IP, rsp)
    return PFCP(rsp)


def exchange(pkt):
    data = bytes(pkt)
    smf.sendto(data, upf)
    record(SMF_IP, UPF_IP, data)
    while True:
        p = receive()
        if p.seq == pkt.seq and p.message_type == pkt.message_type + 1:
            return p


def ie(p, cls):
    for i in p.payload.IE_list:
        if isinstance(i, cls):
            return i
    return None


seq = [0]


def hdr(seid=None):
    seq[0] += 1
    if seid is None:
        return PFCP(version=1, S=0, seq=seq[0])
    return PFCP(version=1, S=1, seid=seid, seq=seq[0])


def traffic(phase, numbers, times):
    pkts = []
    for n, t in zip(numbers, times):
        p = Ether() / IP(src=DN, dst=UE) / UDP(sport=33333, dport=44444) / Raw(b"seq %d" % n)
        p.time = t
        pkts.append(p)
    path = "%s/phase%d.pcap" % (tdir, phase)
    wrpcap(path, pkts)
    print("TRAFFIC %d %s" % (phase, path), flush=True)
    check(sys.stdin.readline().strip() == "done", "the test ran phase %d" % phase)


NODE = IE_NodeId(id_type="IPv4", ipv4="127.0.0.1")
r = exchange(hdr() / PFCPAssociationSetupRequest(IE_list=[NODE, IE_RecoveryTimeStamp(timestamp=3_900_000_000)]))
check(ie(r, IE_Cause).cause == 1, "association setup")
r = exchange(hdr(0) / PFCPSessionEstablishmentRequest(IE_list=[
    NODE,
    IE_FSEID(v4=1, seid=0x78, ipv4="127.0.0.1"),
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
    IE_CreateFAR(IE_list=[IE_FAR_Id(id=2), IE_ApplyAction(BUFF=1, NOCP=1),
                          IE_ForwardingParameters(IE_list=[
                              IE_DestinationInterface(interface="Access"),
                              IE_OuterHeaderCreation(GTPUUDPIPV4=1, TEID=0x99, ipv4=GNB)]),
                          IE_BAR_Id(id=1)]),
    IE_CreateURR(IE_list=[IE_URR_Id(id=1), IE_MeasurementMethod(VOLUM=1)]),
    IE_Create_BAR(IE_list=[IE_BAR_Id(id=1), IE_SuggestedBufferingPacketsCount(count=8)]),
]))
check(ie(r, IE_Cause).cause == 1, "establishment: cause %d" % ie(r, IE_Cause).cause)
up_seid = ie(r, IE_FSEID).seid
print("SESSION %d" % up_seid, flush=True)

# 1. Twelve packets while the FAR buffers: 8 held (the BAR's count), 4 over it.
traffic(1, range(1, 13), [0.0] * 4 + [1.5] * 8)

# 2. The Downlink Data Report; the answer sets a DL Buffering Duration of 2 s.
p = receive()
check(p.message_type == 56, "a Session Report Request, got type %d" % p.message_type)
check(p.seid == 0x78, "the report names the CP SEID")
rt = ie(p, IE_ReportType)
check(rt is not None and rt.DLDR == 1, "Report Type DLDR")
ddr = ie(p, IE_DownlinkDataReport)
check(ddr is not None and any(isinstance(i, IE_PDR_Id) and i.id == 2 for i in ddr.IE_list), "DDR names PDR 2")
rsp = PFCP(version=1, S=1, seid=up_seid, seq=p.seq) / PFCPSessionReportResponse(IE_list=[
    IE_Cause(cause=1),
    IE_UpdateBAR_SRR(IE_list=[IE_BAR_Id(id=1), IE_DLBufferingDuration(timer_unit=0, timer_value=1)]),
])
data = bytes(rsp)
smf.sendto(data, upf)
record(SMF_IP, UPF_IP, data)

# 3. Paging done: the FAR forwards.
r = exchange(hdr(up_seid) / PFCPSessionModificationRequest(IE_list=[
    IE_UpdateFAR(IE_list=[IE_FAR_Id(id=2), IE_ApplyAction(FORW=1)]),
]))
check(ie(r, IE_Cause).cause == 1, "modification: cause %d" % ie(r, IE_Cause).cause)

# 4. Three more, after the update.
traffic(2, range(13, 16), [3.0] * 3)

wrpcap(pcap, frames)
print("OK %d datagrams" % len(frames), flush=True)

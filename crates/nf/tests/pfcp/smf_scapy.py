#!/usr/bin/env python3
"""An SMF written with scapy's PFCP layer (scapy.contrib.pfcp), not with
flowplane's codec, driving a flowplane UPF's N4 endpoint on loopback.

Usage: smf_scapy.py UPF_PORT N3_ADDR UPF_NODE_FQDN PCAP_OUT

Every request is built, and every response decoded, by scapy. The script
checks the causes TS 29.244 prescribes (association setup, establishment,
a retransmitted establishment answered from the cache, a spoofed release
and deletion from an unassociated source refused with cause 72, a
UPF-initiated heartbeat, a heartbeat carrying a newer Recovery Time Stamp
removing the SMF's sessions, Association Update, Session Set Deletion,
release) and writes every datagram exchanged to PCAP_OUT (UDP 8805 on both
sides, so tshark dissects them as PFCP). Exit status 0: all checks passed;
a failed check prints one line and exits 1.
"""
import socket
import sys

from scapy.contrib.pfcp import (
    PFCP, IE_ApplyAction, IE_Cause, IE_CreateFAR, IE_CreatePDR, IE_CreatedPDR,
    IE_DestinationInterface, IE_FAR_Id, IE_FqCSID, IE_ForwardingParameters,
    IE_FSEID, IE_FTEID, IE_NodeId, IE_OuterHeaderRemoval, IE_PDI, IE_PDR_Id,
    IE_Precedence, IE_RecoveryTimeStamp, IE_SourceInterface, IE_UE_IP_Address,
    IE_UPFunctionFeatures, IE_UpdateFAR, IE_UserPlaneIPResourceInformation,
    PFCPAssociationReleaseRequest, PFCPAssociationSetupRequest,
    PFCPAssociationUpdateRequest, PFCPHeartbeatRequest, PFCPHeartbeatResponse,
    PFCPSessionDeletionRequest, PFCPSessionEstablishmentRequest,
    PFCPSessionModificationRequest, PFCPSessionSetDeletionRequest,
)
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw
from scapy.utils import wrpcap

ACCEPTED, NOT_FOUND, NO_ASSOCIATION = 1, 65, 72

port, n3, fqdn, pcap = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
upf = ("127.0.0.1", port)
smf = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
smf.bind(("127.0.0.1", 0))
smf.settimeout(3)
spoofer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
spoofer.bind(("127.0.0.1", 0))
spoofer.settimeout(3)
frames = []  # (src, dst, bytes) for the pcap
SMF_IP, SPOOF_IP, UPF_IP = "10.0.0.1", "10.0.0.66", "10.0.0.2"


def fail(what):
    print("FAIL: " + what)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def record(src, dst, data):
    frames.append(IP(src=src, dst=dst) / UDP(sport=8805, dport=8805) / Raw(data))


def exchange(pkt, sock=smf, src=SMF_IP, want=None):
    """Sends `pkt`, returns the response to it (skipping UPF-initiated requests)."""
    data = bytes(pkt)
    sock.sendto(data, upf)
    record(src, UPF_IP, data)
    while True:
        try:
            rsp, _ = sock.recvfrom(65535)
        except socket.timeout:
            fail("no response to %s" % pkt.payload.name)
        record(UPF_IP, src, rsp)
        p = PFCP(rsp)
        if p.seq == pkt.seq and p.message_type == pkt.message_type + 1:
            return rsp, p


def ie(p, cls):
    for i in p.payload.IE_list:
        if isinstance(i, cls):
            return i
    return None


def cause(p):
    c = ie(p, IE_Cause)
    check(c is not None, "%s without a Cause" % p.payload.name)
    return c.cause


seq = [0]


def hdr(seid=None):
    seq[0] += 1
    if seid is None:
        return PFCP(version=1, S=0, seq=seq[0])
    return PFCP(version=1, S=1, seid=seid, seq=seq[0])


NODE = IE_NodeId(id_type="IPv4", ipv4="127.0.0.1")
RECOVERY = 3_900_000_000

# Association Setup: accepted; the UPF's Node ID (FQDN), UP Function Features, UP IP resources.
_, r = exchange(hdr() / PFCPAssociationSetupRequest(IE_list=[NODE, IE_RecoveryTimeStamp(timestamp=RECOVERY)]))
check(r.message_type == 6 and cause(r) == ACCEPTED, "association setup: cause %s" % cause(r))
node = ie(r, IE_NodeId)
check(node is not None and node.id_type == 2, "Node ID is an FQDN")
check(node.id.decode().rstrip(".") == fqdn, "Node ID %r, expected %r" % (node.id, fqdn))
feat = ie(r, IE_UPFunctionFeatures)
check(feat is not None and feat.FTUP == 1, "UP Function Features with FTUP")
res = ie(r, IE_UserPlaneIPResourceInformation)
check(res is not None and res.V4 == 1 and res.ipv4 == n3, "UP IP Resource Information with the N3 address")
check(ie(r, IE_RecoveryTimeStamp) is not None, "Recovery Time Stamp in the setup response")


def establishment(ue, csid):
    return hdr(0) / PFCPSessionEstablishmentRequest(IE_list=[
        NODE,
        IE_FSEID(v4=1, seid=0x1000 + ue, ipv4="127.0.0.1"),
        IE_CreatePDR(IE_list=[
            IE_PDR_Id(id=1), IE_Precedence(precedence=10),
            IE_PDI(IE_list=[IE_SourceInterface(interface="Access"), IE_FTEID(CH=1, V4=1),
                            IE_UE_IP_Address(V4=1, ipv4="10.45.0.%d" % ue)]),
            IE_OuterHeaderRemoval(header="GTP-U/UDP/IPv4"), IE_FAR_Id(id=1),
        ]),
        IE_CreateFAR(IE_list=[IE_FAR_Id(id=1), IE_ApplyAction(FORW=1),
                              IE_ForwardingParameters(IE_list=[IE_DestinationInterface(interface="Core")])]),
        IE_FqCSID(node_id_type="IPv4", ipv4="127.0.0.1", csids=[csid]),
    ])


# Establishment: accepted, a non-zero UP SEID and a chosen F-TEID on the N3 address.
est = establishment(1, 7)
raw1, r = exchange(est)
check(cause(r) == ACCEPTED and r.seid == 0x1001, "establishment: cause %s, SEID %x" % (cause(r), r.seid))
up_seid = ie(r, IE_FSEID).seid
check(up_seid != 0, "a UP SEID")
created = ie(r, IE_CreatedPDR)
fteid = [i for i in created.IE_list if isinstance(i, IE_FTEID)][0]
check(fteid.ipv4 == n3 and fteid.TEID != 0, "Created PDR F-TEID %s/%x" % (fteid.ipv4, fteid.TEID))

# The same request again (same sequence number): the identical response, no second session.
raw2, r2 = exchange(est)
check(raw2 == raw1, "a retransmitted establishment gets the cached response")
check(ie(r2, IE_FSEID).seid == up_seid, "the same UP SEID")

# Spoofed requests from a source without an association: cause 72, nothing changes.
_, r = exchange(hdr() / PFCPAssociationReleaseRequest(IE_list=[NODE]), sock=spoofer, src=SPOOF_IP)
check(r.message_type == 10 and cause(r) == NO_ASSOCIATION, "spoofed release: cause %s" % cause(r))
_, r = exchange(hdr(up_seid) / PFCPSessionDeletionRequest(), sock=spoofer, src=SPOOF_IP)
check(cause(r) == NO_ASSOCIATION, "spoofed deletion: cause %s" % cause(r))
_, r = exchange(establishment(2, 7), sock=spoofer, src=SPOOF_IP)
check(cause(r) == NO_ASSOCIATION, "establishment from an unassociated source: cause %s" % cause(r))

# The session survived: a modification (FAR to drop) is accepted.
_, r = exchange(hdr(up_seid) / PFCPSessionModificationRequest(IE_list=[
    IE_UpdateFAR(IE_list=[IE_FAR_Id(id=1), IE_ApplyAction(DROP=1)])]))
check(cause(r) == ACCEPTED and r.seid == 0x1001, "modification after the spoofs: cause %s" % cause(r))

_, r = exchange(hdr() / PFCPAssociationUpdateRequest(IE_list=[NODE]))
check(r.message_type == 8 and cause(r) == ACCEPTED, "association update: cause %s" % cause(r))

# A second session in another CSID, then Session Set Deletion of that CSID: only it goes.
_, r = exchange(establishment(3, 9))
check(cause(r) == ACCEPTED, "second establishment")
seid3 = ie(r, IE_FSEID).seid
_, r = exchange(hdr() / PFCPSessionSetDeletionRequest(IE_list=[
    NODE, IE_FqCSID(node_id_type="IPv4", ipv4="127.0.0.1", csids=[9])]))
check(r.message_type == 15 and cause(r) == ACCEPTED, "session set deletion: cause %s" % cause(r))
_, r = exchange(hdr(seid3) / PFCPSessionModificationRequest())
check(cause(r) == NOT_FOUND, "the set's session is gone: cause %s" % cause(r))

# The UPF's own heartbeat (it runs with a short interval): answered with our Recovery Time Stamp.
while True:
    try:
        data, _ = smf.recvfrom(65535)
    except socket.timeout:
        fail("no Heartbeat Request from the UPF")
    record(UPF_IP, SMF_IP, data)
    p = PFCP(data)
    if p.message_type == 1:
        check(ie(p, IE_RecoveryTimeStamp) is not None, "the UPF's heartbeat carries its Recovery Time Stamp")
        rsp = bytes(PFCP(version=1, S=0, seq=p.seq) / PFCPHeartbeatResponse(
            IE_list=[IE_RecoveryTimeStamp(timestamp=RECOVERY)]))
        smf.sendto(rsp, upf)
        record(SMF_IP, UPF_IP, rsp)
        break

# The SMF restarted: a heartbeat with a newer Recovery Time Stamp removes its sessions.
_, r = exchange(hdr() / PFCPHeartbeatRequest(IE_list=[IE_RecoveryTimeStamp(timestamp=RECOVERY + 10)]))
check(r.message_type == 2 and ie(r, IE_RecoveryTimeStamp) is not None, "heartbeat response")
_, r = exchange(hdr(up_seid) / PFCPSessionModificationRequest())
check(cause(r) == NOT_FOUND, "after the restart the session is gone: cause %s" % cause(r))

# Release: accepted; afterwards session requests need a new association.
_, r = exchange(hdr() / PFCPAssociationReleaseRequest(IE_list=[NODE]))
check(cause(r) == ACCEPTED, "release: cause %s" % cause(r))
_, r = exchange(establishment(4, 7))
check(cause(r) == NO_ASSOCIATION, "establishment after release: cause %s" % cause(r))

wrpcap(pcap, frames)
print("OK %d datagrams" % len(frames))

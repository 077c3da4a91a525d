//! flowplane on veth interfaces through AF_XDP (root; copy mode on veth;
//! libxdp's redirect program must be gone after the run). Fails loudly where
//! AF_XDP was not built in (libxdp-dev/libbpf-dev missing at build time).

mod ports_common;

#[test]
fn afxdp_forward_between_veths_delivers_every_packet_in_order() {
    ports_common::check_forward("afxdp", 19_541);
}

#[test]
fn afxdp_nat_between_veths_rewrites_with_valid_checksums() {
    ports_common::check_nat("afxdp", 19_542);
}

#[test]
fn afxdp_nat_on_two_cores_steers_every_reply_to_its_owner() {
    ports_common::check_nat_two_cores("afxdp", 19_543);
}

#[test]
fn afxdp_rsspp_moves_entries_under_traffic_losing_and_reordering_nothing() {
    ports_common::check_moves("afxdp", "rsspp", 19_544);
}

#[test]
fn afxdp_exports_equal_the_replays_under_every_steering() {
    ports_common::check_same_exports_as_replay("afxdp", 19_545);
}

#[test]
fn afxdp_fw_on_two_cores_passes_replies_and_related_icmp_errors() {
    ports_common::check_fw_icmp_two_cores("afxdp", 19_546);
}

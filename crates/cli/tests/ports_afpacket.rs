//! flowplane on veth interfaces through AF_PACKET (root; see `ports_common`).

mod ports_common;

#[test]
fn afpacket_forward_between_veths_delivers_every_packet_in_order() {
    ports_common::check_forward("afpacket", 19_531);
}

#[test]
fn afpacket_nat_between_veths_rewrites_with_valid_checksums() {
    ports_common::check_nat("afpacket", 19_532);
}

#[test]
fn afpacket_nat_on_two_cores_steers_every_reply_to_its_owner() {
    ports_common::check_nat_two_cores("afpacket", 19_533);
}

#[test]
fn afpacket_rsspp_moves_entries_under_traffic_losing_and_reordering_nothing() {
    ports_common::check_moves("afpacket", "rsspp", 19_534);
}

#[test]
fn afpacket_exports_equal_the_replays_under_every_steering() {
    ports_common::check_same_exports_as_replay("afpacket", 19_535);
}

#[test]
fn afpacket_fw_on_two_cores_passes_replies_and_related_icmp_errors() {
    ports_common::check_fw_icmp_two_cores("afpacket", 19_536);
}

#[test]
fn afpacket_dyssect_moves_shards_and_flows_under_traffic_losing_and_reordering_nothing() {
    ports_common::check_moves("afpacket", "dyssect", 19_537);
}

//! `--scale scr` on veth ports: the dispatcher core as the SCR software sequencer (root; see `ports_common`).

mod ports_common;

#[test]
fn afpacket_scr_one_flow_over_two_workers_replicas_agree_with_the_model() {
    ports_common::check_scr_one_flow("afpacket", 19_553);
}

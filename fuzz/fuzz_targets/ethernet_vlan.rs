//! Ethernet header and VLAN tag stack: no panic, and a parsed header re-emits identically.
#![no_main]

use flowplane_wire::ethernet::{EthernetFrame, EthernetRepr, HEADER_LEN};
use flowplane_wire::vlan::{skip_vlan_tags, VlanRepr, VlanTag, MAX_VLAN_TAGS, TAG_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = EthernetFrame::new_checked(data) else { return };
    let repr = EthernetRepr::parse(&frame).expect("checked frame parses");
    let mut out = [0u8; HEADER_LEN];
    repr.emit(&mut EthernetFrame::new_unchecked(&mut out[..])).expect("fits");
    assert_eq!(&out[..], &data[..HEADER_LEN]);
    if let Ok(stack) = skip_vlan_tags(frame.payload(), frame.ethertype(), MAX_VLAN_TAGS) {
        assert_eq!(stack.offset, stack.count as usize * TAG_LEN);
        assert!(stack.offset <= frame.payload().len());
        assert!(!stack.ethertype.is_vlan());
    }
    if let Ok(tag) = VlanTag::new_checked(frame.payload()) {
        let r = VlanRepr::parse(&tag).expect("checked tag parses");
        let mut t = [0u8; TAG_LEN];
        r.emit(&mut VlanTag::new_unchecked(&mut t[..])).expect("valid repr");
        assert_eq!(&t[..], &frame.payload()[..TAG_LEN]);
    }
});

//! Trace reader (pcap both byte orders and resolutions, pcapng, every link type) and the
//! conversion to Ethernet: no panic, no endless loop, whatever the file holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flowplane_trace::fuzz_read_all(data);
});

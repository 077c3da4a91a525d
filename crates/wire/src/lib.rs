//! `flowplane-wire`: zero-copy, bounds-checked views of packet headers
//! (Ethernet, VLAN, ARP, IPv4, IPv6, TCP, UDP, ICMP, GTP-U), the one frame
//! parser ([`frame`]: what executors and NFs know of a packet), frame
//! emission ([`packet_repr`]), IPFIX messages ([`ipfix`]), checksums, flow keys and hashes (table hash,
//! Toeplitz RSS, RETA), and the address prefixes and port ranges NFs take as
//! parameters ([`prefix`]).
//!
//! Every view follows one pattern (after smoltcp's `wire`): `Xxx::new_checked(buf)`
//! validates lengths once and returns a typed error on malformed input, field
//! accessors then read without further checks that could fail, and a `XxxRepr`
//! parses to / emits from a plain struct. No input may panic.
//!
//! No `unsafe` outside [`hash`] (its CRC32C uses the SSE4.2 `crc32` instruction when the build enables it).
#![deny(unsafe_code)]

pub mod arp;
pub mod checksum;
pub mod error;
pub mod ethernet;
pub mod flow;
pub mod frame;
pub mod gtpu;
#[allow(unsafe_code)]
pub mod hash;
pub mod icmp;
pub mod ipfix;
pub mod ipv4;
pub mod ipv6;
pub mod packet_repr;
pub mod prefix;
pub mod repl;
pub mod rss;
pub mod scr;
pub mod tcp;
pub mod udp;
pub mod vlan;

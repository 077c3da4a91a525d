//! flowplane-trace: trace files (pcap/pcapng), traffic generation, trace statistics and tools.
//!
//! Trace file I/O: [`TraceReader`] streams pcap (microsecond or nanosecond, either byte order) and pcapng files with
//! constant memory, [`PcapWriter`] writes pcap, and [`to_ethernet`] presents every supported link type (raw IP, Linux
//! cooked, loopback, PPP, Cisco HDLC) as Ethernet frames. Bad records and packets are counted ([`UnparsedCounts`]) and
//! skipped, never the end of a run. [`progress`] draws the bars of long steps (on a terminal, unless `--quiet`).

#![forbid(unsafe_code)]

pub mod error;
pub mod gen;
pub mod linktype;
pub mod pcap;
pub mod pcapng;
pub mod progress;
pub mod reader;
pub mod stats;
pub mod tools;
pub mod unparsed;
pub mod writer;

pub use error::{TraceError, TraceErrorKind};
pub use linktype::{to_ethernet, LinkType};
pub use reader::{fuzz_read_all, PacketRef, TraceFormat, TraceReader};
pub use unparsed::{Unparsed, UnparsedCounts};
pub use writer::{ErrorHook, PcapWriter, WriteOutcome, WriterOptions};

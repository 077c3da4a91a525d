//! Every NF of the library, in one of eight chains (5-tuple, firewalling/NAT, coarse state in
//! shared tables, synthetic, field-set keys, stateless, a tiny NAT pool, mixed), under every
//! registered executor, on arbitrary and synthesised frames, batch after batch with the clock
//! jumping so that state expires; with a flow table of 1024 or of 64 flows (full-table
//! rejects or LRU evictions), on one core or on two threads sharing the coarse tables. Checks:
//! no panic, every batch keeps its packets, each NF forwards or drops what it was given, each
//! NF is given what the one before forwarded, the chain's output is what left the batches
//! undropped, and the tables' counters add up.
//!
//! Input layout: byte 0 picks the executor (bits 0-1), the chain (bits 2-4), NF prefetch hooks
//! off (bit 5), the auxiliary table off (bit 6) and prefetch off (bit 7); byte 1 the tiny table
//! (bit 0), the evict policy (bit 1), two cores (bit 2) and the default idle timeout (bits 3-4:
//! 1, 5, 30 or 300 s); then records as `flowplane_fuzz::for_each_record` reads them (raw or
//! synthesised frames; the gap byte advances the clock, picks the core and closes the batch;
//! a batch also closes every 32 frames; at most 2048 frames). `FLOWPLANE_FUZZ_VERBOSE=1` prints
//! each core's figures when reproducing an input.
//!
//! The harness is `flowplane_fuzz::executor` (a library module, so its regression inputs run as unit tests).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowplane_fuzz::executor::run(data));

//! DPDK ports (the `dpdk` cargo feature; Debian's DPDK 22.11 through
//! `csrc/dpdk_shim.c`, which holds DPDK's inline burst functions). The EAL
//! starts once per process with the arguments given to [`set_eal_args`]
//! (default: `--no-huge --no-pci -m 1024 --no-shconf`); a `dpdk:` name is a
//! port id or a vdev (`net_null0`, `net_pcap0,rx_pcap=in.pcap`,
//! `net_af_packet0,iface=eth0`), probed when first named. One RX/TX queue
//! pair per worker, RSS over the queues, one mbuf pool per queue.
//!
//! Mbufs are processed in place: a worker's packet pool *is* its queue's
//! mempool (`PacketPool::from_device_region` over the mempool's contiguous
//! objects, every buffer in device until received), the shim writes a
//! received burst's buffer indices, offsets, lengths and hashes straight into
//! the batch (`Batch::rx_from_device`, which checks each one), and transmit
//! gives the same mbufs to `rte_eth_tx_burst` (`Batch::lend_all_to_device`):
//! no copy and no per-packet call on either side. Dropped and refused
//! buffers go back to the mempool at the next receive. When the worker's
//! pool is not a DPDK one (another port type in front), transmit copies
//! into mbufs of a TX pool.

use std::ffi::{c_char, c_int, CString};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use flowplane_packet::{Batch, PacketPool, Verdict, MAX_BATCH};

use crate::port::{Port, PortError, PortOptions, QueueCounters, RxQueue, TxQueue};

#[repr(C)]
struct RteMempool {
    _p: [u8; 0],
}

extern "C" {
    fn fp_dpdk_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn fp_dpdk_port(name: *const c_char, devargs: *const c_char, port: *mut u16) -> c_int;
    fn fp_dpdk_thread_register() -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn fp_dpdk_setup(
        port: u16,
        nq: u16,
        mbufs: u32,
        desc: u16,
        pools: *mut *mut RteMempool,
        base: *mut usize,
        stride: *mut u32,
        count: *mut u32,
        floor: *mut u32,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn fp_dpdk_rx(
        port: u16,
        q: u16,
        base: usize,
        stride: u32,
        magic: u64,
        count: u32,
        idx: *mut u32,
        off: *mut u16,
        len: *mut u16,
        hash: *mut u32,
        max: u16,
        dropped: *mut u32,
    ) -> u16;
    #[allow(clippy::too_many_arguments)]
    fn fp_dpdk_tx(
        port: u16,
        q: u16,
        base: usize,
        stride: u32,
        idx: *const u32,
        off: *const u16,
        len: *const u16,
        n: u16,
    ) -> u16;
    fn fp_dpdk_tx_copy(
        port: u16,
        q: u16,
        mp: *mut RteMempool,
        data: *const *const u8,
        len: *const u16,
        n: u16,
        nombuf: *mut u32,
    ) -> u16;
    fn fp_dpdk_put(base: usize, stride: u32, idx: *const u32, n: u32);
    fn fp_dpdk_tx_pool(port: u16, q: u16, mbufs: u32) -> *mut RteMempool;
    fn fp_dpdk_stats(port: u16, imissed: *mut u64, rx_nombuf: *mut u64, oerrors: *mut u64) -> c_int;
    fn fp_dpdk_close(port: u16);
}

static EAL_ARGS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static EAL: OnceLock<Result<(), String>> = OnceLock::new();

/// EAL arguments for this process (before the first `dpdk:` port opens).
pub fn set_eal_args(args: Vec<String>) {
    if let Ok(mut a) = EAL_ARGS.lock() {
        *a = args;
    }
}

fn eal() -> Result<(), PortError> {
    let r = EAL.get_or_init(|| {
        let mut args = vec!["flowplane".to_string()];
        let user = EAL_ARGS.lock().map(|a| a.clone()).unwrap_or_default();
        if user.is_empty() {
            args.extend(
                ["--no-huge", "--no-pci", "-m", "1024", "--no-shconf", "--no-telemetry", "--log-level", "*:warning"]
                    .map(String::from),
            );
        } else {
            args.extend(user);
        }
        let cs: Vec<CString> = match args.iter().map(|a| CString::new(a.as_str())).collect() {
            Ok(v) => v,
            Err(_) => return Err("EAL argument with a NUL byte".to_string()),
        };
        let mut ptrs: Vec<*mut c_char> = cs.iter().map(|c| c.as_ptr() as *mut c_char).collect();
        // SAFETY: argv points to argc NUL-terminated strings that outlive the
        // call (rte_eal_init may permute the pointer array, not the strings; it
        // keeps no pointer into them after returning in DPDK 22.11).
        let r = unsafe { fp_dpdk_init(ptrs.len() as c_int, ptrs.as_mut_ptr()) };
        if r < 0 {
            return Err(format!(
                "DPDK EAL init failed ({}) with {:?}",
                std::io::Error::from_raw_os_error(-r),
                &args[1..]
            ));
        }
        Ok(())
    });
    r.clone().map_err(PortError::Unsupported)
}

/// The shim's divide-free `n / stride` (receive: an mbuf's index from its address): ceil(2^64 / stride), exact for
/// every n < 2^64 / stride (`csrc/dpdk_shim.c`, div_stride).
fn recip(stride: u32) -> u64 {
    (u64::MAX / u64::from(stride.max(2))) + 1
}

/// Largest region the reciprocal covers exactly (far beyond any mempool).
const MAX_REGION: u64 = 1 << 48;

/// One queue's mempool region.
#[derive(Clone, Copy)]
struct QueuePool {
    base: usize,
    stride: u32,
    count: u32,
    floor: u32,
}

/// A DPDK port opened for N queue pairs.
pub struct DpdkPort {
    name: String,
    port: u16,
    pools: Vec<QueuePool>,
    counters: Vec<Arc<QueueCounters>>,
}

impl DpdkPort {
    /// Starts the EAL if needed, finds (or probes) `spec`'s device and starts it with `queues` queue pairs.
    pub fn open(spec: &str, queues: usize, opts: PortOptions) -> Result<Self, PortError> {
        eal()?;
        if queues == 0 || queues > 128 {
            return Err(PortError::Spec(format!("dpdk:{spec}: {queues} queues (1..=128)")));
        }
        let mut port: u16 = 0;
        if let Ok(id) = spec.parse::<u16>() {
            port = id;
        } else {
            let name = spec.split(',').next().unwrap_or(spec);
            let (cn, cd) = match (CString::new(name), CString::new(spec)) {
                (Ok(a), Ok(b)) => (a, b),
                _ => return Err(PortError::Spec(format!("dpdk:{spec}: NUL byte"))),
            };
            // SAFETY: NUL-terminated strings that outlive the call; `port` is a valid out-pointer.
            let r = unsafe { fp_dpdk_port(cn.as_ptr(), cd.as_ptr(), &mut port) };
            if r < 0 {
                return Err(PortError::Os(format!("dpdk:{spec}"), std::io::Error::from_raw_os_error(-r)));
            }
        }
        let nq = queues as u16;
        let mut mps = vec![std::ptr::null_mut(); queues];
        let (mut base, mut stride, mut count, mut floor) =
            (vec![0usize; queues], vec![0u32; queues], vec![0u32; queues], vec![0u32; queues]);
        // SAFETY: every array holds `queues` entries, as the shim writes for nq queues.
        let r = unsafe {
            fp_dpdk_setup(
                port,
                nq,
                opts.buffers.clamp(1023, u32::MAX as usize) as u32,
                1024,
                mps.as_mut_ptr(),
                base.as_mut_ptr(),
                stride.as_mut_ptr(),
                count.as_mut_ptr(),
                floor.as_mut_ptr(),
            )
        };
        if r < 0 {
            return Err(PortError::Os(
                format!("dpdk:{spec}: port {port} set-up (-E2BIG: mempool not contiguous; give the EAL more -m)"),
                std::io::Error::from_raw_os_error(-r),
            ));
        }
        if (0..queues).any(|q| u64::from(count[q]) * u64::from(stride[q]) >= MAX_REGION) {
            return Err(PortError::Unsupported(format!("dpdk:{spec}: mempool region over {MAX_REGION} bytes")));
        }
        let pools = (0..queues)
            .map(|q| QueuePool { base: base[q], stride: stride[q], count: count[q], floor: floor[q] })
            .collect();
        Ok(DpdkPort {
            name: format!("dpdk:{spec}"),
            port,
            pools,
            counters: (0..queues).map(|_| Arc::new(QueueCounters::default())).collect(),
        })
    }
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        // Every queue handle is gone (they hold the port through the workers, which have ended).
        // SAFETY: the port was started by `open`; stopping and closing it once is its teardown.
        unsafe { fp_dpdk_close(self.port) }
    }
}

impl Port for DpdkPort {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn queues(&self) -> usize {
        self.pools.len()
    }

    fn counters(&self) -> &[Arc<QueueCounters>] {
        &self.counters
    }

    fn open_rx(&self, _q: usize) -> Result<Box<dyn RxQueue>, PortError> {
        Err(PortError::Unsupported(format!("{}: DPDK receives into the worker's pool (open_rx_into)", self.name)))
    }

    fn open_rx_into(&self, q: usize, pool: &mut PacketPool) -> Result<Box<dyn RxQueue>, PortError> {
        let qp = *self.pools.get(q).ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        // SAFETY: a plain call; it registers the calling (worker) thread as an lcore.
        unsafe { fp_dpdk_thread_register() };
        let base = NonNull::new(qp.base as *mut u8).ok_or_else(|| PortError::Unsupported("empty mempool".into()))?;
        let ceil = qp.floor as usize + 2048 + 128;
        // SAFETY: the mempool's objects are one region of count * stride bytes
        // from `base` (checked by the shim), never freed while the process
        // runs; Rust touches it only through this pool, within floor..ceil of
        // each mbuf (its data buffer), and only buffers DPDK handed over.
        *pool = unsafe {
            PacketPool::from_device_region(base, qp.count as usize, qp.stride as usize, qp.floor as usize, ceil)
        }
        .map_err(|e| PortError::Unsupported(format!("{}: mempool as a packet pool: {e}", self.name)))?;
        Ok(Box::new(DpdkRx {
            port: self.port,
            q: q as u16,
            base: qp.base,
            stride: qp.stride,
            magic: recip(qp.stride),
            count: qp.count,
            idx: Box::new([0; MAX_BATCH]),
            polls: 0,
            t0: flowplane_packet::tsc::rdtsc(),
            ns_per_tick: 1e9 / flowplane_packet::tsc::hz().max(1.0),
            counters: Arc::clone(&self.counters[q]),
        }))
    }

    fn open_tx(&self, q: usize) -> Result<Box<dyn TxQueue>, PortError> {
        let counters = self.counters.get(q).cloned().ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        Ok(Box::new(DpdkTx {
            port: self.port,
            q: q as u16,
            copy_pool: std::ptr::null_mut(),
            len: Box::new([0; MAX_BATCH]),
            data: Box::new([std::ptr::null(); MAX_BATCH]),
            counters,
        }))
    }
}

/// One RX queue; the worker's pool is its mempool.
struct DpdkRx {
    port: u16,
    q: u16,
    base: usize,
    stride: u32,
    magic: u64,
    count: u32,
    /// Scratch: buffers going back to the mempool, or refused at receive.
    idx: Box<[u32; MAX_BATCH]>,
    polls: u32,
    t0: u64,
    ns_per_tick: f64,
    counters: Arc<QueueCounters>,
}

impl DpdkRx {
    fn read_stats(&self) {
        let (mut missed, mut nombuf, mut oerr) = (0, 0, 0);
        // SAFETY: valid out-pointers.
        if self.q == 0 && unsafe { fp_dpdk_stats(self.port, &mut missed, &mut nombuf, &mut oerr) } == 0 {
            // Port-wide totals, kept on queue 0.
            use std::sync::atomic::Ordering::Relaxed;
            self.counters.rx_overrun.store(missed, Relaxed);
            self.counters.rx_pool_empty.store(nombuf, Relaxed);
            self.counters.tx_errors.store(oerr, Relaxed);
        }
    }
}

impl RxQueue for DpdkRx {
    fn clock_ns(&self) -> Option<u64> {
        Some((flowplane_packet::tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64)
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
        self.rx_burst_at(pool, batch, max, flowplane_packet::tsc::rdtsc())
    }

    fn rx_burst_at(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, now_tsc: u64) -> usize {
        // Buffers the worker freed (dropped packets) go back to the mempool.
        loop {
            let k = pool.lend(&mut self.idx[..]);
            if k == 0 {
                break;
            }
            // SAFETY: idx[..k] are buffers of this mempool region now lent back to DPDK.
            unsafe { fp_dpdk_put(self.base, self.stride, self.idx.as_ptr(), k as u32) };
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(4096) {
            self.read_stats();
        }
        let (port, q, base, stride, magic, count) = (self.port, self.q, self.base, self.stride, self.magic, self.count);
        // The worker's reading for this burst (no second clock read per burst).
        let ts = (now_tsc.saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64;
        let start = batch.len();
        let (mut dropped, mut refused) = (0u32, 0usize);
        let scratch = &mut self.idx;
        // The shim writes each mbuf's (index, data offset, length, hash) straight into the
        // batch, which then checks each one (lent, data inside the mbuf's buffer).
        let got = batch.rx_from_device(
            pool,
            max,
            ts,
            |idx, off, len, hash| {
                let room = idx.len().min(MAX_BATCH) as u16;
                // SAFETY: the shim writes at most `room` entries to each array, and each
                // slice is at least that long.
                let n = unsafe {
                    fp_dpdk_rx(
                        port,
                        q,
                        base,
                        stride,
                        magic,
                        count,
                        idx.as_mut_ptr(),
                        off.as_mut_ptr(),
                        len.as_mut_ptr(),
                        hash.as_mut_ptr(),
                        room,
                        &mut dropped,
                    )
                };
                n as usize
            },
            |i| {
                if let Some(slot) = scratch.get_mut(refused) {
                    *slot = i;
                    refused += 1;
                }
            },
        );
        // Refused ones (data outside the buffer: never expected) were lent: reclaimed now,
        // they go back to the mempool at the next receive; counted.
        for &i in &self.idx[..refused] {
            pool.reclaim(i);
        }
        dropped += refused as u32;
        let bytes: u64 = batch.lens()[start..].iter().map(|&l| l as u64).sum();
        let c = &self.counters;
        QueueCounters::add(&c.rx_packets, got as u64);
        QueueCounters::add(&c.rx_bytes, bytes);
        QueueCounters::add(&c.rx_oversize, dropped as u64);
        got
    }
}

/// One TX queue.
struct DpdkTx {
    port: u16,
    q: u16,
    copy_pool: *mut RteMempool,
    len: Box<[u16; MAX_BATCH]>,
    data: Box<[*const u8; MAX_BATCH]>,
    counters: Arc<QueueCounters>,
}

// SAFETY: the raw pointers are a DPDK mempool handle (thread-safe) and
// scratch entries valid only during one call.
unsafe impl Send for DpdkTx {}

impl TxQueue for DpdkTx {
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
        // The copy path: the worker's buffers are not mbufs.
        if self.copy_pool.is_null() {
            // SAFETY: a plain call creating (or finding) this queue's TX pool.
            self.copy_pool = unsafe { fp_dpdk_tx_pool(self.port, self.q, 8191) };
            if self.copy_pool.is_null() {
                let n = batch.verdicts().iter().filter(|&&v| v == port).count() as u64;
                QueueCounters::add(&self.counters.tx_full, n);
                return (0, 0, n);
            }
        }
        let mut k = 0;
        let mut bytes = 0;
        for (i, &v) in batch.verdicts().iter().enumerate() {
            if v == port {
                let d = batch.data(i);
                self.data[k] = d.as_ptr();
                self.len[k] = d.len() as u16;
                bytes += d.len() as u64;
                k += 1;
            }
        }
        let mut nombuf = 0u32;
        // SAFETY: data/len[..k] describe packet bytes of `batch`, borrowed for this call.
        let sent = unsafe {
            fp_dpdk_tx_copy(
                self.port,
                self.q,
                self.copy_pool,
                self.data.as_ptr(),
                self.len.as_ptr(),
                k as u16,
                &mut nombuf,
            )
        } as usize;
        if sent < k {
            bytes = self.len[..sent].iter().map(|&l| l as u64).sum();
        }
        let lost = (k - sent) as u64;
        QueueCounters::add(&self.counters.tx_full, lost);
        (sent as u64, bytes, lost)
    }

    fn tx_lend(&mut self, pool: &mut PacketPool, batch: &mut Batch) -> Option<(u64, u64, u64, u64)> {
        if !pool.is_device_region() {
            return None;
        }
        let (base, _) = pool.region();
        let stride = pool.buf_size() as u32;
        let (port, q) = (self.port, self.q);
        let ((sent, bytes, n), dropped) = batch
            .lend_all_to_device(pool, |idx, off, len| {
                let n = idx.len().min(MAX_BATCH);
                // SAFETY: idx/off/len[..n] name mbufs of the worker's DPDK region (its
                // queue's mempool), just lent to the device: the shim sends them or
                // returns them to their mempool.
                let sent = unsafe {
                    fp_dpdk_tx(port, q, base as usize, stride, idx.as_ptr(), off.as_ptr(), len.as_ptr(), n as u16)
                } as usize;
                (sent, len[..sent].iter().map(|&l| l as u64).sum::<u64>(), n)
            })
            .ok()?;
        let full = (n - sent) as u64;
        QueueCounters::add(&self.counters.tx_full, full);
        Some((sent as u64, bytes, dropped as u64, full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim's `div_stride` (a 128-bit multiply-high by `recip`) is an exact division.
    #[test]
    fn reciprocal_divides_exactly() {
        let div = |n: u64, m: u64| ((u128::from(n) * u128::from(m)) >> 64) as u64;
        for stride in [64u32, 128, 2304, 2368, 2432, 4096, 9344, 65472] {
            let m = recip(stride);
            let s = u64::from(stride);
            for i in (0..200_000u64).chain([(MAX_REGION / s) - 2, (MAX_REGION / s) - 1]) {
                for n in [i * s, i * s + 1, i * s + s / 2, i * s + s - 1] {
                    assert_eq!(div(n, m), n / s, "stride {stride}, n {n}");
                }
            }
        }
    }
}

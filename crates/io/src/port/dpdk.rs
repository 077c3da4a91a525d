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
//! objects, every buffer in device until received), a received mbuf enters
//! the batch as its buffer index, and transmit gives the same mbufs to
//! `rte_eth_tx_burst` (`Batch::lend_to_device`). Dropped and refused
//! buffers go back to the mempool at the next receive. When the worker's
//! pool is not a DPDK one (another port type in front), transmit copies
//! into mbufs of a TX pool.

use std::ffi::{c_char, c_int, CString};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use flowplane_packet::{Batch, PacketPool, Verdict, MAX_BATCH};

use super::{Port, PortError, PortOptions, QueueCounters, RxQueue, TxQueue};

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
        idx: *mut u32,
        off: *mut u16,
        len: *mut u16,
        hash: *mut u32,
        max: u16,
        dropped: *mut u32,
    ) -> u16;
    fn fp_dpdk_tx(port: u16, q: u16, base: usize, stride: u32, addr: *const u64, len: *const u16, n: u16) -> u16;
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
            idx: Box::new([0; MAX_BATCH]),
            off: Box::new([0; MAX_BATCH]),
            len: Box::new([0; MAX_BATCH]),
            hash: Box::new([0; MAX_BATCH]),
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
            addr: Box::new([0; MAX_BATCH]),
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
    idx: Box<[u32; MAX_BATCH]>,
    off: Box<[u16; MAX_BATCH]>,
    len: Box<[u16; MAX_BATCH]>,
    hash: Box<[u32; MAX_BATCH]>,
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
    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
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
        let max = max.min(batch.room()).min(MAX_BATCH) as u16;
        let mut dropped = 0u32;
        // SAFETY: the arrays hold MAX_BATCH >= max entries.
        let n = unsafe {
            fp_dpdk_rx(
                self.port,
                self.q,
                self.base,
                self.stride,
                self.idx.as_mut_ptr(),
                self.off.as_mut_ptr(),
                self.len.as_mut_ptr(),
                self.hash.as_mut_ptr(),
                max,
                &mut dropped,
            )
        } as usize;
        if n == 0 {
            QueueCounters::add(&self.counters.rx_oversize, dropped as u64);
            return 0;
        }
        let ts = (flowplane_packet::tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64;
        let (mut got, mut bytes) = (0usize, 0u64);
        for i in 0..n {
            if batch.push_from_device(pool, self.idx[i], self.off[i], self.len[i], self.hash[i], ts) {
                got += 1;
                bytes += self.len[i] as u64;
            } else {
                // Outside the data area (never expected): back to the mempool, counted.
                if pool.reclaim(self.idx[i]) {
                    let mut one = [0u32; 1];
                    if pool.lend(&mut one) == 1 {
                        // SAFETY: one buffer of this region, lent back to DPDK.
                        unsafe { fp_dpdk_put(self.base, self.stride, one.as_ptr(), 1) };
                    }
                }
                dropped += 1;
            }
        }
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
    addr: Box<[u64; MAX_BATCH]>,
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
        let mut k = 0;
        let (addr, len) = (&mut self.addr, &mut self.len);
        let Ok((_, _, dropped)) = batch.lend_to_device(pool, |_, a, l| {
            addr[k] = a;
            len[k] = l;
            k += 1;
            true
        }) else {
            return None;
        };
        // SAFETY: addr/len[..k] name mbufs of the worker's DPDK region, just lent to the device.
        let sent = unsafe {
            fp_dpdk_tx(self.port, self.q, base as usize, stride, self.addr.as_ptr(), self.len.as_ptr(), k as u16)
        } as usize;
        let bytes = self.len[..sent].iter().map(|&l| l as u64).sum();
        let full = (k - sent) as u64;
        QueueCounters::add(&self.counters.tx_full, full);
        Some((sent as u64, bytes, dropped as u64, full))
    }
}

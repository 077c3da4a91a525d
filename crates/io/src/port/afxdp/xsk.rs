//! AF_XDP ports through Debian's libxdp (`csrc/xsk_shim.c`): one socket per
//! queue, libxdp's default redirect program loaded with the first RX socket
//! and removed with the last. The UMEM of an RX socket *is* the worker's
//! packet pool (its page-aligned region): free buffers are lent to the fill
//! ring, the kernel writes packets into them, and the RX ring's descriptors
//! come back into the batch as owned buffers (`Batch::push_from_device`) —
//! no copy in flowplane. Native XDP with zero copy is tried first; where the
//! driver lacks it (veth), generic XDP in copy mode.
//!
//! Transmit copies each packet into a frame of the TX socket's own UMEM (a
//! small pool of its own) and lends that frame to the TX ring; completed
//! frames are reclaimed at the next transmit. One ring operation and at most
//! one system call (the kick) per batch.
//!
//! XDP programs: libxdp detaches the program it loaded with the last socket,
//! but a run that dies (`kill -9`, a second Ctrl-C) leaves it attached, and
//! libxdp then reuses it on the next start without ever detaching it. So the
//! port records each program it gets (a marker file per program under
//! `/run/flowplane`, naming the run's pid), detaches it when the port and its
//! queues are gone (every exit path that unwinds), and on open detaches a
//! program whose marker names a run that is no longer alive. A program
//! without a marker is someone else's: left in place, with a one-line notice.
//! A process that must exit without unwinding (a second Ctrl-C during
//! shutdown) calls [`release_programs`] first: every program this process
//! still owns is detached from wherever its thread can reach it.
//!
//! A re-created interface (see [`LinkWatch`]): each queue closes its socket and
//! opens a new one on the new interface (RX: the pool's lent buffers are
//! taken back first), checked when idle (RX) or once per batch (TX).

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{tsc, Batch, PacketPool, PoolConfig, RegionGuard, Verdict, MAX_BATCH};

use crate::port::{LinkWatch, Port, PortError, PortOptions, QueueCounters, RxQueue, TxQueue};

/// The shim's socket (opaque).
#[repr(C)]
struct FpXsk {
    _p: [u8; 0],
}

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn fp_xsk_open(
        ifname: *const c_char,
        queue: u32,
        area: *mut c_void,
        size: u64,
        frame_size: u32,
        ring: u32,
        rx: c_int,
        tx: c_int,
        mode: *mut c_int,
        out: *mut *mut FpXsk,
    ) -> c_int;
    fn fp_xsk_close(x: *mut FpXsk);
    fn fp_xsk_fill(x: *mut FpXsk, addr: *const u64, n: u32) -> u32;
    fn fp_xsk_rx_wakeup(x: *mut FpXsk);
    fn fp_xsk_rx(x: *mut FpXsk, addr: *mut u64, len: *mut u32, max: u32) -> u32;
    fn fp_xsk_tx(x: *mut FpXsk, addr: *const u64, len: *const u32, n: u32) -> u32;
    fn fp_xsk_complete(x: *mut FpXsk, addr: *mut u64, max: u32) -> u32;
    fn fp_xsk_stats(x: *mut FpXsk, rx_dropped: *mut u64, rx_ring_full: *mut u64, fill_empty: *mut u64) -> c_int;
    fn fp_xdp_find(ifindex: c_int, name: *const c_char) -> u32;
    fn fp_xdp_detach(ifindex: c_int, id: u32) -> c_int;
}

/// The name of libxdp's default AF_XDP redirect program (what an RX socket loads).
const XSK_PROG: &str = "xsk_def_prog";
/// Where runs record the XDP programs they attached (one file per program: the run's pid).
const MARKER_DIR: &str = "/run/flowplane";

/// The id of the program named [`XSK_PROG`] on `ifindex`, 0 if none.
fn xsk_prog_on(ifindex: i32) -> u32 {
    let name = CString::new(XSK_PROG).unwrap_or_default();
    // SAFETY: `name` is NUL-terminated and outlives the call; the shim only reads it.
    unsafe { fp_xdp_find(ifindex, name.as_ptr()) }
}

/// Detaches program `id` from `ifindex` (and nothing else): Ok(true) if it was attached.
fn detach_prog(ifindex: i32, id: u32) -> Result<bool, std::io::Error> {
    // SAFETY: plain integer arguments; the shim matches the program by id before detaching.
    match unsafe { fp_xdp_detach(ifindex, id) } {
        r if r < 0 => Err(std::io::Error::from_raw_os_error(-r)),
        r => Ok(r == 1),
    }
}

/// True if `pid` is a running flowplane process.
fn flowplane_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "flowplane")
}

/// Every (netns, ifindex, program id, marker) this process owns, whichever port claimed it:
/// what [`release_programs`] detaches when the process exits without unwinding.
static PROCESS_OWNED: Mutex<Vec<(u64, i32, u32, PathBuf)>> = Mutex::new(Vec::new());

/// The calling thread's network namespace inode (0 if unknown).
fn thread_netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino())
}

/// Detaches every XDP program this process attached and still owns, and removes their
/// markers: for an exit that skips the ports' destructors (a second Ctrl-C while stopping).
/// Programs in another network namespace than the caller's are left to the next start's
/// stale-marker check. Returns how many were removed. Only for an exit: ports dropped
/// after it block (their programs are already gone).
pub fn release_programs() -> usize {
    let here = thread_netns();
    let mut owned = PROCESS_OWNED.lock().unwrap_or_else(|p| p.into_inner());
    let mut removed = 0;
    for (netns, ifindex, id, marker) in std::mem::take(&mut *owned) {
        if netns != here {
            continue;
        }
        if xsk_prog_on(ifindex) == id && detach_prog(ifindex, id).is_ok() {
            removed += 1;
        }
        let _ = std::fs::remove_file(marker);
    }
    // Left locked for good: the process is about to exit, and a port destructor on another
    // thread must not start a detach it cannot finish.
    std::mem::forget(owned);
    removed
}

/// The XDP programs a port attached, recorded by marker files and detached when
/// the port and all its queues are gone (the last `Arc` dropped).
struct XdpOwner {
    port: String,
    /// The network namespace's inode: interface indices are per namespace.
    netns: u64,
    /// (ifindex, program id) recorded by this run.
    owned: Mutex<Vec<(i32, u32)>>,
    /// Programs found attached and left alone (someone else's or another live run's).
    foreign: Mutex<Vec<u32>>,
}

impl XdpOwner {
    fn new(port: String) -> XdpOwner {
        let netns = thread_netns();
        XdpOwner { port, netns, owned: Mutex::new(Vec::new()), foreign: Mutex::new(Vec::new()) }
    }

    fn marker(&self, ifindex: i32, id: u32) -> PathBuf {
        PathBuf::from(format!("{MARKER_DIR}/xdp-{}-{ifindex}-{id}", self.netns))
    }

    /// At open: detaches a program a dead flowplane run left on `ifindex`; leaves any other.
    fn clear_stale(&self, ifindex: i32) {
        let id = xsk_prog_on(ifindex);
        if id == 0 {
            return;
        }
        let m = self.marker(ifindex, id);
        let pid = std::fs::read_to_string(&m).ok().and_then(|s| s.trim().parse::<u32>().ok());
        match pid {
            Some(pid) if pid != std::process::id() && !flowplane_alive(pid) => match detach_prog(ifindex, id) {
                Ok(_) => {
                    let _ = std::fs::remove_file(&m);
                    eprintln!(
                        "flowplane: {}: removed XDP program {XSK_PROG} (id {id}) left attached by flowplane run {pid}, which died",
                        self.port
                    );
                }
                Err(e) => eprintln!(
                    "flowplane: {}: XDP program {XSK_PROG} (id {id}) left by flowplane run {pid} could not be removed: {e}",
                    self.port
                ),
            },
            Some(_) => self.foreign.lock().map(|mut f| f.push(id)).unwrap_or(()),
            None => {
                self.foreign.lock().map(|mut f| f.push(id)).unwrap_or(());
                eprintln!(
                    "flowplane: {}: XDP program {XSK_PROG} (id {id}) is attached and was not loaded by flowplane: left in place (shared)",
                    self.port
                );
            }
        }
    }

    /// After an RX socket opened on `ifindex`: records the program it uses if this run attached it.
    fn claim(&self, ifindex: i32) {
        let id = xsk_prog_on(ifindex);
        if id == 0 || self.foreign.lock().is_ok_and(|f| f.contains(&id)) {
            return;
        }
        let Ok(mut owned) = self.owned.lock() else { return };
        if owned.contains(&(ifindex, id)) {
            return;
        }
        owned.push((ifindex, id));
        // Best effort: without the marker a dead run's program is only reported, not removed.
        let _ = std::fs::create_dir_all(MARKER_DIR);
        let _ = std::fs::write(self.marker(ifindex, id), format!("{}\n", std::process::id()));
        if let Ok(mut p) = PROCESS_OWNED.lock() {
            p.push((self.netns, ifindex, id, self.marker(ifindex, id)));
        }
    }
}

impl Drop for XdpOwner {
    fn drop(&mut self) {
        let owned = self.owned.get_mut().map(std::mem::take).unwrap_or_default();
        // Held while detaching: an emergency `release_programs` either runs first (and this
        // finds nothing left to detach) or waits until these are gone and unlisted.
        let mut process = PROCESS_OWNED.lock();
        for &(ifindex, id) in &owned {
            // libxdp detaches what it loaded with the last socket, but not a program it
            // found and reused: whatever of ours is still there goes now.
            if xsk_prog_on(ifindex) == id {
                if let Err(e) = detach_prog(ifindex, id) {
                    eprintln!("flowplane: {}: could not remove XDP program {XSK_PROG} (id {id}): {e}", self.port);
                    continue;
                }
            }
            let _ = std::fs::remove_file(self.marker(ifindex, id));
        }
        if let Ok(p) = process.as_mut() {
            p.retain(|&(n, i, d, _)| !(n == self.netns && owned.contains(&(i, d))));
        }
    }
}

/// An open shim socket, closed on drop.
struct Xsk(*mut FpXsk);

/// Held while a socket is set up (see [`Xsk::open`]).
static OPENING: Mutex<()> = Mutex::new(());

impl Xsk {
    /// Opens a socket whose UMEM is `region` (page-aligned, `frame`-byte frames).
    fn open(
        iface: &str,
        queue: u32,
        region: (*mut u8, usize),
        frame: usize,
        ring: u32,
        rx: bool,
        tx: bool,
    ) -> Result<(Xsk, bool), PortError> {
        let name = CString::new(iface).map_err(|_| PortError::Spec(format!("{iface}: bad interface name")))?;
        let mut x = std::ptr::null_mut();
        let mut zc: c_int = 0;
        // One socket set-up at a time in the process: each tries native mode first and falls back to
        // generic, loading or reusing the interface's one XDP program; two workers doing that at once
        // could each find the program in the other's mode (EBUSY, 1 run in 4 on a 2-queue veth).
        let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `name` is NUL-terminated and outlives the call; `region` is a
        // live, page-aligned allocation of region.1 bytes that the caller keeps
        // alive until this socket is closed (a RegionGuard or an owned pool,
        // dropped after `Xsk`); out-pointers are valid locals.
        let r = unsafe {
            fp_xsk_open(
                name.as_ptr(),
                queue,
                region.0 as *mut c_void,
                region.1 as u64,
                frame as u32,
                ring,
                rx as c_int,
                tx as c_int,
                &mut zc,
                &mut x,
            )
        };
        if r != 0 || x.is_null() {
            return Err(PortError::Os(
                format!("AF_XDP socket on {iface} queue {queue} (needs root, an XDP-capable kernel and libxdp)"),
                std::io::Error::from_raw_os_error(-r),
            ));
        }
        Ok((Xsk(x), zc != 0))
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: the socket was opened by fp_xsk_open and is closed once.
        unsafe { fp_xsk_close(self.0) }
    }
}

// SAFETY: the shim socket is used by one thread at a time (its owner), and
// libxdp's socket state has no thread affinity.
unsafe impl Send for Xsk {}

/// An interface queue range opened through AF_XDP.
pub struct AfXdpPort {
    iface: String,
    queue0: u32,
    queues: usize,
    counters: Vec<Arc<QueueCounters>>,
    zerocopy: Arc<AtomicBool>,
    watch: Arc<LinkWatch>,
    owner: Arc<XdpOwner>,
}

impl AfXdpPort {
    /// `iface` queues `queue0 .. queue0 + queues` (sockets open per worker).
    pub fn open(iface: &str, queue0: u32, queues: usize, _opts: PortOptions) -> Result<Self, PortError> {
        let name = CString::new(iface).map_err(|_| PortError::Spec(format!("{iface}: bad interface name")))?;
        // SAFETY: `name` is NUL-terminated and outlives the call.
        if unsafe { libc::if_nametoindex(name.as_ptr()) } == 0 {
            return Err(PortError::Os(format!("interface {iface}"), std::io::Error::last_os_error()));
        }
        let port = format!("afxdp:{iface}:{queue0}");
        let watch = Arc::new(LinkWatch::new(&port, iface)?);
        let owner = Arc::new(XdpOwner::new(port));
        owner.clear_stale(watch.ifindex());
        Ok(AfXdpPort {
            iface: iface.to_string(),
            queue0,
            queues,
            counters: (0..queues).map(|_| Arc::new(QueueCounters::default())).collect(),
            zerocopy: Arc::new(AtomicBool::new(false)),
            watch,
            owner,
        })
    }

    /// True once an RX socket got native zero-copy mode.
    pub fn zerocopy(&self) -> bool {
        self.zerocopy.load(Ordering::Relaxed)
    }
}

/// Ring entries per socket ring: half the pool (the rest carries batches), at most 32768 (a
/// 50-ms scheduling stall at 600 kpps: a worker at a real-time priority is throttled that long per second).
fn ring_for(buffers: usize) -> u32 {
    let half = (buffers / 2).clamp(64, 32768);
    1u32 << (31 - (half as u32).leading_zeros())
}

impl Port for AfXdpPort {
    fn name(&self) -> String {
        format!("afxdp:{}:{}", self.iface, self.queue0)
    }

    fn queues(&self) -> usize {
        self.queues
    }

    fn counters(&self) -> &[Arc<QueueCounters>] {
        &self.counters
    }

    fn link(&self) -> Option<&LinkWatch> {
        Some(&self.watch)
    }

    fn open_rx(&self, _q: usize) -> Result<Box<dyn RxQueue>, PortError> {
        Err(PortError::Unsupported(format!("{}: AF_XDP receives into the worker's pool (open_rx_into)", self.name())))
    }

    fn open_rx_into(&self, q: usize, pool: &mut PacketPool) -> Result<Box<dyn RxQueue>, PortError> {
        let counters = self.counters.get(q).cloned().ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        let ring = ring_for(pool.stats().buffers);
        let region = pool.region();
        let guard = pool.region_guard();
        let epoch = self.watch.epoch();
        let (xsk, zc) = Xsk::open(&self.iface, self.queue0 + q as u32, region, pool.buf_size(), ring, true, false)?;
        self.owner.claim(self.watch.ifindex());
        if zc {
            self.zerocopy.store(true, Ordering::Relaxed);
        }
        let hz = tsc::hz().max(1.0);
        let mut rx = AfXdpRx {
            xsk,
            _region: guard,
            iface: self.iface.clone(),
            queue: self.queue0 + q as u32,
            ring,
            epoch,
            watch: Arc::clone(&self.watch),
            owner: Arc::clone(&self.owner),
            buf_size: pool.buf_size() as u64,
            addrs: Box::new([0; MAX_BATCH]),
            lens: Box::new([0; MAX_BATCH]),
            idx: Box::new([0; MAX_BATCH]),
            deficit: ring as usize,
            polls: 0,
            t0: tsc::rdtsc(),
            ns_per_tick: 1e9 / hz,
            counters,
        };
        while rx.deficit > 0 && rx.refill(pool) > 0 {}
        Ok(Box::new(rx))
    }

    fn open_tx(&self, q: usize) -> Result<Box<dyn TxQueue>, PortError> {
        let counters = self.counters.get(q).cloned().ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        let epoch = self.watch.epoch();
        let queue = self.queue0 + q as u32;
        let (xsk, pool) = AfXdpTx::socket(&self.iface, queue)?;
        let batch = Batch::new(&pool);
        Ok(Box::new(AfXdpTx {
            xsk,
            pool,
            batch,
            addrs: Box::new([0; MAX_BATCH]),
            lens: Box::new([0; MAX_BATCH]),
            comp: Box::new([0; 2 * MAX_BATCH]),
            counters,
            iface: self.iface.clone(),
            queue,
            epoch,
            watch: Arc::clone(&self.watch),
        }))
    }
}

/// An RX socket whose UMEM is a worker's pool.
pub struct AfXdpRx {
    xsk: Xsk,
    /// Keeps the pool's region mapped until the socket is closed (declared after `xsk`: dropped after it).
    _region: RegionGuard,
    iface: String,
    queue: u32,
    ring: u32,
    /// The interface generation the socket is bound to (the watch's epoch then).
    epoch: u32,
    watch: Arc<LinkWatch>,
    owner: Arc<XdpOwner>,
    buf_size: u64,
    addrs: Box<[u64; MAX_BATCH]>,
    lens: Box<[u32; MAX_BATCH]>,
    idx: Box<[u32; MAX_BATCH]>,
    /// Fill-ring entries owed (packets received and not yet replaced).
    deficit: usize,
    polls: u32,
    t0: u64,
    ns_per_tick: f64,
    counters: Arc<QueueCounters>,
}

impl AfXdpRx {
    /// Lends up to one burst of free buffers to the fill ring; returns how many went.
    fn refill(&mut self, pool: &mut PacketPool) -> usize {
        let want = self.deficit.min(MAX_BATCH);
        let k = pool.lend(&mut self.idx[..want]);
        for i in 0..k {
            self.addrs[i] = self.idx[i] as u64 * self.buf_size;
        }
        // SAFETY: addrs[..k] are initialised; the shim reads k entries.
        let f = unsafe { fp_xsk_fill(self.xsk.0, self.addrs.as_ptr(), k as u32) } as usize;
        for &i in &self.idx[f..k] {
            pool.reclaim(i);
        }
        self.deficit -= f;
        f
    }

    /// The interface came back with a new index: the old socket closed, the buffers
    /// lent to it taken back, a new socket on the new interface given a full fill ring.
    #[cold]
    fn reattach(&mut self, pool: &mut PacketPool) {
        self.read_stats();
        self.epoch = self.watch.epoch();
        // Closing the old socket first frees the queue; its buffers are then no one's but ours.
        self.xsk = Xsk(std::ptr::null_mut());
        for i in 0..pool.stats().buffers {
            pool.reclaim(i as u32);
        }
        self.deficit = self.ring as usize;
        match Xsk::open(&self.iface, self.queue, pool.region(), pool.buf_size(), self.ring, true, false) {
            Ok((xsk, _)) => {
                self.xsk = xsk;
                self.owner.claim(self.watch.ifindex());
                while self.deficit > 0 && self.refill(pool) > 0 {}
            }
            Err(e) => self.watch.fail(format!(
                "afxdp:{}:{}: cannot re-attach to the re-created interface: {e}",
                self.iface, self.queue
            )),
        }
    }

    fn read_stats(&mut self) {
        if self.xsk.0.is_null() {
            return;
        }
        let (mut d, mut full, mut empty) = (0u64, 0u64, 0u64);
        // SAFETY: out-pointers are valid locals.
        if unsafe { fp_xsk_stats(self.xsk.0, &mut d, &mut full, &mut empty) } == 0 {
            // The kernel's counters are totals: store, not add.
            self.counters.rx_overrun.store(d + full, Ordering::Relaxed);
        }
    }
}

impl RxQueue for AfXdpRx {
    fn clock_ns(&self) -> Option<u64> {
        Some((tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64)
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
        if self.xsk.0.is_null() {
            // No socket since a failed re-attach (the run is stopping).
            return 0;
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(1024) {
            self.read_stats();
        }
        if self.deficit > 0 {
            self.refill(pool);
        }
        let max = max.min(batch.room()).min(MAX_BATCH);
        // SAFETY: addrs/lens hold MAX_BATCH >= max entries.
        let n = unsafe { fp_xsk_rx(self.xsk.0, self.addrs.as_mut_ptr(), self.lens.as_mut_ptr(), max as u32) } as usize;
        if n == 0 {
            // Idle: the place to notice a re-created interface (one relaxed load).
            if self.watch.epoch() != self.epoch {
                self.reattach(pool);
                return 0;
            }
            // SAFETY: a live socket.
            unsafe { fp_xsk_rx_wakeup(self.xsk.0) };
            return 0;
        }
        let ts = (tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64;
        let (mut got, mut bytes, mut bad) = (0usize, 0u64, 0u64);
        for i in 0..n {
            let addr = self.addrs[i];
            let Some(idx) = pool.index_of(addr) else {
                bad += 1;
                continue;
            };
            let off = (addr - idx as u64 * self.buf_size) as u16;
            let len = self.lens[i].min(u16::MAX as u32) as u16;
            if batch.push_from_device(pool, idx, off, len, 0, ts) {
                got += 1;
                bytes += len as u64;
            } else {
                // Not a lent buffer (never expected from the kernel) or too long: back to the pool, counted.
                pool.reclaim(idx);
                bad += 1;
            }
        }
        self.deficit += n;
        self.refill(pool);
        let c = &self.counters;
        QueueCounters::add(&c.rx_packets, got as u64);
        QueueCounters::add(&c.rx_bytes, bytes);
        QueueCounters::add(&c.rx_oversize, bad);
        got
    }
}

impl Drop for AfXdpRx {
    fn drop(&mut self) {
        self.read_stats();
    }
}

/// A TX socket with its own frames.
pub struct AfXdpTx {
    xsk: Xsk,
    /// The TX socket's UMEM (dropped after `xsk`, by field order).
    pool: PacketPool,
    batch: Box<Batch>,
    addrs: Box<[u64; MAX_BATCH]>,
    lens: Box<[u32; MAX_BATCH]>,
    comp: Box<[u64; 2 * MAX_BATCH]>,
    counters: Arc<QueueCounters>,
    iface: String,
    queue: u32,
    /// The interface generation the socket is bound to.
    epoch: u32,
    watch: Arc<LinkWatch>,
}

impl AfXdpTx {
    /// A TX socket on `iface` queue `queue` with a UMEM of its own frames.
    fn socket(iface: &str, queue: u32) -> Result<(Xsk, PacketPool), PortError> {
        let frames = 2048;
        let pool = PacketPool::new(PoolConfig { buffers: frames, headroom: 0, ..PoolConfig::default() })
            .map_err(|e| PortError::Unsupported(format!("AF_XDP TX frames: {e}")))?;
        let ring = ring_for(frames);
        let (xsk, _) = Xsk::open(iface, queue, pool.region(), pool.buf_size(), ring, false, true)?;
        Ok((xsk, pool))
    }

    /// The interface came back with a new index: a new socket and frames on it (frames in
    /// flight on the old socket are gone with it).
    #[cold]
    fn reattach(&mut self) {
        self.epoch = self.watch.epoch();
        self.xsk = Xsk(std::ptr::null_mut());
        match Self::socket(&self.iface, self.queue) {
            Ok((xsk, pool)) => {
                self.batch = Batch::new(&pool);
                self.pool = pool;
                self.xsk = xsk;
            }
            Err(e) => self.watch.fail(format!(
                "afxdp:{}:{}: cannot re-attach to the re-created interface: {e}",
                self.iface, self.queue
            )),
        }
    }

    /// Reclaims the frames the kernel has sent.
    fn complete(&mut self) {
        loop {
            // SAFETY: comp holds 2 * MAX_BATCH entries.
            let c = unsafe { fp_xsk_complete(self.xsk.0, self.comp.as_mut_ptr(), self.comp.len() as u32) } as usize;
            for &a in &self.comp[..c] {
                if let Some(i) = self.pool.index_of(a) {
                    self.pool.reclaim(i);
                }
            }
            if c < self.comp.len() {
                break;
            }
        }
    }
}

impl TxQueue for AfXdpTx {
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
        // One relaxed load per batch: a re-created interface gets a new socket.
        if self.watch.epoch() != self.epoch {
            self.reattach();
        }
        if self.xsk.0.is_null() {
            let n = batch.verdicts().iter().filter(|&&v| v == port).count() as u64;
            QueueCounters::add(&self.counters.tx_errors, n);
            return (0, 0, n);
        }
        self.complete();
        let mut full = 0u64;
        for (i, &v) in batch.verdicts().iter().enumerate() {
            if v == port && !self.batch.push_copy(&mut self.pool, batch.data(i), 0) {
                // No free frame (the kernel has not completed enough yet).
                full += 1;
            }
        }
        let mut k = 0;
        let (addrs, lens) = (&mut self.addrs, &mut self.lens);
        let _ = self.batch.lend_to_device(&mut self.pool, |_, addr, len| {
            addrs[k] = addr;
            lens[k] = len as u32;
            k += 1;
            true
        });
        // SAFETY: addrs/lens[..k] are initialised and name frames of this socket's UMEM now lent to it.
        let sent = unsafe { fp_xsk_tx(self.xsk.0, self.addrs.as_ptr(), self.lens.as_ptr(), k as u32) } as usize;
        let mut bytes = 0;
        for i in 0..k {
            if i < sent {
                bytes += self.lens[i] as u64;
            } else if let Some(f) = self.pool.index_of(self.addrs[i]) {
                self.pool.reclaim(f);
                full += 1;
            }
        }
        QueueCounters::add(&self.counters.tx_full, full);
        (sent as u64, bytes, full)
    }
}

//! AF_XDP ports through Debian's libxdp (`csrc/xsk_shim.c`): one socket per
//! queue, libxdp's default redirect program loaded with the first RX socket
//! and removed with the last (without kernel steering). The UMEM of an RX socket *is* the worker's
//! packet pool (its page-aligned region): free buffers are lent to the fill
//! ring, the kernel writes packets into them, and the RX ring's descriptors
//! come back into the batch as owned buffers (`Batch::push_from_device`) —
//! no copy in flowplane. Native XDP with zero copy is tried first; where the
//! driver lacks it (veth), generic XDP in copy mode.
//!
//! Kernel steering ([`Port::steer_in_kernel`], 2+ workers, a table without
//! moves): no libxdp program; flowplane's `fp_xdp_steer` (see
//! [`crate::port::fanout_steer`]) redirects each frame to its owner's socket
//! on the queue it arrived on. The kernel binds one UMEM (and one fill ring)
//! per queue, so queue `q`'s UMEM is worker `q`'s pool and every other worker
//! has a socket on `q` sharing it ([`SteerShare`]): those frames are copied
//! into the receiving worker's pool and their buffers handed back to worker
//! `q` through a return ring (an `rtrb` ring per pair), since only `q` fills
//! its queue's fill ring. The worker that opens last attaches the program.
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
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{tsc, Batch, PacketPool, PoolConfig, RegionGuard, Verdict, MAX_BATCH};
use rtrb::RingBuffer;

use crate::port::fanout_steer::KernelSteer;
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
    #[allow(clippy::too_many_arguments)]
    fn fp_xsk_open_steered(
        ifname: *const c_char,
        queue: u32,
        area: *mut c_void,
        size: u64,
        frame_size: u32,
        ring: u32,
        first: *mut FpXsk,
        mode: *mut c_int,
        out: *mut *mut FpXsk,
    ) -> c_int;
    fn fp_xsk_fd(x: *mut FpXsk) -> c_int;
    fn fp_xdp_attach(ifindex: c_int, prog_fd: c_int, native: *mut c_int) -> c_int;
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
/// The name of flowplane's steering program (`csrc/steer.bpf.c`), attached under kernel steering.
const STEER_PROG: &str = "fp_xdp_steer";
/// The XDP programs a run attaches, by name.
const PROGS: [&str; 2] = [XSK_PROG, STEER_PROG];
/// Where runs record the XDP programs they attached (one file per program: the run's pid).
const MARKER_DIR: &str = "/run/flowplane";

/// The id of the program named `prog` on `ifindex`, 0 if none.
fn prog_on(ifindex: i32, prog: &str) -> u32 {
    let name = CString::new(prog).unwrap_or_default();
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
        // Detaches by id: only if that program is still there.
        if detach_prog(ifindex, id).is_ok_and(|gone| gone) {
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
        for prog in PROGS {
            self.clear_stale_prog(ifindex, prog);
        }
    }

    fn clear_stale_prog(&self, ifindex: i32, prog: &str) {
        let id = prog_on(ifindex, prog);
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
                        "flowplane: {}: removed XDP program {prog} (id {id}) left attached by flowplane run {pid}, which died",
                        self.port
                    );
                }
                Err(e) => eprintln!(
                    "flowplane: {}: XDP program {prog} (id {id}) left by flowplane run {pid} could not be removed: {e}",
                    self.port
                ),
            },
            Some(_) => self.foreign.lock().map(|mut f| f.push(id)).unwrap_or(()),
            None => {
                self.foreign.lock().map(|mut f| f.push(id)).unwrap_or(());
                eprintln!(
                    "flowplane: {}: XDP program {prog} (id {id}) is attached and was not loaded by flowplane: left in place (shared)",
                    self.port
                );
            }
        }
    }

    /// After an RX socket opened (or the steering program was attached) on `ifindex`:
    /// records the program named `prog` if this run attached it.
    fn claim(&self, ifindex: i32, prog: &str) {
        let id = prog_on(ifindex, prog);
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
            // found and reused, nor flowplane's steering program: whatever of ours is
            // still there goes now (by id: only if it is still attached).
            if let Err(e) = detach_prog(ifindex, id) {
                eprintln!("flowplane: {}: could not remove XDP program (id {id}): {e}", self.port);
                continue;
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
        let what = || format!("AF_XDP socket on {iface} queue {queue} (needs root, an XDP-capable kernel and libxdp)");
        Xsk::open_with(iface, what, |name, zc, x| {
            // SAFETY: `name` is NUL-terminated and outlives the call; `region` is a
            // live, page-aligned allocation of region.1 bytes that the caller keeps
            // alive until this socket is closed (a RegionGuard or an owned pool,
            // dropped after `Xsk`); out-pointers are valid locals.
            unsafe {
                fp_xsk_open(
                    name,
                    queue,
                    region.0 as *mut c_void,
                    region.1 as u64,
                    frame as u32,
                    ring,
                    rx as c_int,
                    tx as c_int,
                    zc,
                    x,
                )
            }
        })
    }

    /// One socket set-up through the shim: `open(name, &mut zero_copy, &mut socket)` returns 0 or -errno.
    fn open_with(
        iface: &str,
        what: impl Fn() -> String,
        open: impl FnOnce(*const c_char, &mut c_int, &mut *mut FpXsk) -> c_int,
    ) -> Result<(Xsk, bool), PortError> {
        let name = CString::new(iface).map_err(|_| PortError::Spec(format!("{iface}: bad interface name")))?;
        let mut x = std::ptr::null_mut();
        let mut zc: c_int = 0;
        // One socket set-up at a time in the process: each tries native mode first and falls back to
        // generic, loading or reusing the interface's one XDP program; two workers doing that at once
        // could each find the program in the other's mode (EBUSY, 1 run in 4 on a 2-queue veth).
        let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
        let r = open(name.as_ptr(), &mut zc, &mut x);
        Xsk::opened(r, x, zc, what)
    }

    /// The shim's answer as a socket (and whether it is zero copy), or the error `what` names.
    fn opened(r: c_int, x: *mut FpXsk, zc: c_int, what: impl Fn() -> String) -> Result<(Xsk, bool), PortError> {
        if r != 0 || x.is_null() {
            return Err(PortError::Os(what(), std::io::Error::from_raw_os_error(-r)));
        }
        Ok((Xsk(x), zc != 0))
    }

    /// A receive socket for kernel steering on `iface` queue `queue`: a new UMEM over
    /// `region`, or the UMEM of `first` (the queue's own socket) shared.
    fn open_steered(
        iface: &str,
        queue: u32,
        region: (*mut u8, usize),
        frame: usize,
        ring: u32,
        first: Option<&Xsk>,
    ) -> Result<(Xsk, bool), PortError> {
        let what = || format!("AF_XDP socket on {iface} queue {queue} (kernel steering: needs root and libxdp)");
        Xsk::open_with(iface, what, |name, zc, x| {
            // SAFETY: as in `Xsk::open`; `first`, when given, is a live socket of this shim whose
            // UMEM (and region) outlive the new socket: the caller closes sockets sharing it first.
            unsafe {
                fp_xsk_open_steered(
                    name,
                    queue,
                    region.0 as *mut c_void,
                    region.1 as u64,
                    frame as u32,
                    ring,
                    first.map_or(std::ptr::null_mut(), |f| f.0),
                    zc,
                    x,
                )
            }
        })
    }

    /// The socket's descriptor.
    fn fd(&self) -> c_int {
        // SAFETY: a live socket of the shim.
        unsafe { fp_xsk_fd(self.0) }
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // Closing a socket that shares a UMEM changes libxdp's count of its users.
        let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the socket was opened by fp_xsk_open and is closed once.
        unsafe { fp_xsk_close(self.0) }
    }
}

// SAFETY: the shim socket is used by one thread at a time (its owner), and
// libxdp's socket state has no thread affinity.
unsafe impl Send for Xsk {}
// SAFETY: shared (`Arc<Xsk>`, kernel steering) only to keep a queue's UMEM alive
// while other workers' sockets share it: through `&Xsk` the others read nothing
// but the descriptor (`fd`); ring operations stay with the owning worker, and
// opening and closing are serialised by `OPENING`.
unsafe impl Sync for Xsk {}

/// An interface queue range opened through AF_XDP.
pub struct AfXdpPort {
    iface: String,
    queue0: u32,
    queues: usize,
    counters: Vec<Arc<QueueCounters>>,
    zerocopy: Arc<AtomicBool>,
    watch: Arc<LinkWatch>,
    owner: Arc<XdpOwner>,
    /// Kernel steering ([`Port::steer_in_kernel`]): the program, and what the workers'
    /// receive sides share (see [`SteerShare`]).
    steer: Mutex<Option<Arc<KernelSteer>>>,
    share: Arc<SteerShare>,
    rx_opened: AtomicBool,
}

/// Kernel steering over an AF_XDP port: the sockets of one queue must share one UMEM
/// and its fill ring (the kernel refuses a second UMEM on a bound queue), so queue `q`'s
/// UMEM is worker `q`'s pool and every other worker `w` has a socket `(q, w)` on that
/// queue sharing it. `w` copies what it receives there into its own pool and hands the
/// buffer back to `q` through a return ring (`q` alone fills its queue's fill ring).
/// Sockets of a pair are made by whichever of the two workers opens later; the one made
/// for the other worker waits in its mailbox until that worker's next burst takes it.
struct SteerShare {
    reg: Mutex<SteerReg>,
    /// Per worker: bumped when its mailbox gets something (one relaxed load per burst).
    mail: Vec<AtomicU32>,
}

#[derive(Default)]
struct SteerReg {
    /// Per queue: its worker's own socket (the UMEM) and pool region, once opened.
    owners: Vec<Option<QueueOwner>>,
    /// Per worker: sockets and return-ring ends made for it by other workers.
    mailbox: Vec<Vec<Handed>>,
    /// Workers whose sockets are all made (the program is attached at `queues`).
    complete: usize,
}

/// A queue's UMEM: its worker's own socket and pool region.
struct QueueOwner {
    sock: Arc<Xsk>,
    /// The region's address (a usize: shared across threads, read only through a
    /// socket's descriptors) and length, and the buffer size.
    base: usize,
    len: usize,
    buf: u64,
    /// Guards keeping the region mapped, one for each other worker's socket on the queue.
    guards: Vec<RegionGuard>,
}

/// What one worker makes for another.
enum Handed {
    /// A socket on another worker's queue (its UMEM) and the ring returning its buffers.
    Socket(ForeignSock),
    /// The consumer of a return ring into this worker's fill ring.
    Returns(rtrb::Consumer<u64>),
}

impl SteerShare {
    fn new(queues: usize) -> SteerShare {
        SteerShare {
            reg: Mutex::new(SteerReg {
                owners: (0..queues).map(|_| None).collect(),
                mailbox: (0..queues).map(|_| Vec::new()).collect(),
                complete: 0,
            }),
            mail: (0..queues).map(|_| AtomicU32::new(0)).collect(),
        }
    }
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
            steer: Mutex::new(None),
            share: Arc::new(SteerShare::new(queues)),
            rx_opened: AtomicBool::new(false),
        })
    }

    /// True once an RX socket got native zero-copy mode.
    pub fn zerocopy(&self) -> bool {
        self.zerocopy.load(Ordering::Relaxed)
    }
}

impl AfXdpPort {
    /// Kernel steering: opens worker `w`'s own socket (queue `w`, its pool the queue's UMEM),
    /// then, with every worker already open, the pair of sockets between them: `(q, w)` for
    /// itself and `(w, q)` for `q` (into `q`'s mailbox), with their return rings. The worker
    /// that completes the set attaches the program.
    fn open_steered(
        &self,
        w: usize,
        pool: &mut PacketPool,
        k: &KernelSteer,
        ring: u32,
    ) -> Result<(RxSock, Vec<Handed>), PortError> {
        let err = |e: crate::port::fanout_steer::SteerError| PortError::Spec(format!("{}: {e}", self.name()));
        let n = self.queues;
        let region = pool.region();
        let (own, zc) = Xsk::open_steered(&self.iface, self.queue0 + w as u32, region, pool.buf_size(), ring, None)?;
        self.zerocopy.fetch_or(zc, Ordering::Relaxed);
        k.set_xsk(w, w, own.fd()).map_err(err)?;
        let own = Arc::new(own);
        let mut reg = self.share.reg.lock().map_err(|_| PortError::Spec("afxdp: poisoned".into()))?;
        let mut mine = Vec::new();
        let mut me = QueueOwner {
            sock: Arc::clone(&own),
            base: region.0 as usize,
            len: region.1,
            buf: pool.buf_size() as u64,
            guards: (1..n).map(|_| pool.region_guard()).collect(),
        };
        for q in 0..n {
            let Some(other) = reg.owners[q].as_mut() else { continue };
            // (q, w): w receives on q's queue, from q's UMEM; w returns the buffers to q.
            let (x, _) = Xsk::open_steered(&self.iface, self.queue0 + q as u32, region, 0, ring, Some(other.sock.as_ref()))?;
            k.set_xsk(q, w, x.fd()).map_err(err)?;
            let (tx, rx) = RingBuffer::new(ring as usize);
            let guard = other.guards.pop().ok_or_else(|| PortError::Spec("afxdp: region guards".into()))?;
            mine.push(Handed::Socket(ForeignSock {
                xsk: x,
                base: other.base,
                len: other.len,
                buf: other.buf,
                back: tx,
                _umem: Arc::clone(&other.sock),
                _region: guard,
            }));
            reg.mailbox[q].push(Handed::Returns(rx));
            // (w, q): q receives on w's queue, from w's UMEM; q returns the buffers to w.
            let (x, _) = Xsk::open_steered(&self.iface, self.queue0 + w as u32, region, 0, ring, Some(own.as_ref()))?;
            k.set_xsk(w, q, x.fd()).map_err(err)?;
            let (tx, rx) = RingBuffer::new(ring as usize);
            let guard = me.guards.pop().ok_or_else(|| PortError::Spec("afxdp: region guards".into()))?;
            reg.mailbox[q].push(Handed::Socket(ForeignSock {
                xsk: x,
                base: me.base,
                len: me.len,
                buf: me.buf,
                back: tx,
                _umem: Arc::clone(&own),
                _region: guard,
            }));
            mine.push(Handed::Returns(rx));
            self.share.mail[q].fetch_add(1, Ordering::Release);
        }
        reg.owners[w] = Some(me);
        reg.complete += 1;
        if reg.complete == n {
            self.attach(k)?;
        }
        Ok((RxSock { xsk: own, queue: self.queue0 + w as u32, deficit: ring as usize }, mine))
    }

    /// Attaches the steering program (every socket is in its map).
    fn attach(&self, k: &KernelSteer) -> Result<(), PortError> {
        let ifindex = self.watch.ifindex();
        let mut native: c_int = 0;
        // SAFETY: plain integer arguments and a valid out-pointer; the program descriptor lives
        // as long as `k` (the attachment keeps its own reference to the program).
        let r = unsafe { fp_xdp_attach(ifindex, k.xdp_prog_fd(), &mut native) };
        if r != 0 {
            return Err(PortError::Os(
                format!("{}: attaching the steering XDP program (another XDP program attached?)", self.name()),
                std::io::Error::from_raw_os_error(-r),
            ));
        }
        self.owner.claim(ifindex, STEER_PROG);
        Ok(())
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
        self.rx_opened.store(true, Ordering::Relaxed);
        let steer = self.steer.lock().ok().and_then(|s| s.clone());
        let guard = pool.region_guard();
        let epoch = self.watch.epoch();
        let ring = ring_for(pool.stats().buffers);
        let (own, handed, share) = match &steer {
            None => {
                let (xsk, zc) =
                    Xsk::open(&self.iface, self.queue0 + q as u32, pool.region(), pool.buf_size(), ring, true, false)?;
                self.owner.claim(self.watch.ifindex(), XSK_PROG);
                self.zerocopy.fetch_or(zc, Ordering::Relaxed);
                (RxSock { xsk: Arc::new(xsk), queue: self.queue0 + q as u32, deficit: ring as usize }, Vec::new(), None)
            }
            Some(k) => {
                let (own, handed) = self.open_steered(q, pool, k, ring)?;
                (own, handed, Some(Arc::clone(&self.share)))
            }
        };
        let hz = tsc::hz().max(1.0);
        let mut rx = AfXdpRx {
            own,
            foreign: Vec::new(),
            returns: Vec::new(),
            backlog: Vec::with_capacity(ring as usize * self.queues),
            share,
            worker: q,
            mail_seen: 0,
            _region: guard,
            iface: self.iface.clone(),
            ring,
            epoch,
            watch: Arc::clone(&self.watch),
            owner: Arc::clone(&self.owner),
            buf_size: pool.buf_size() as u64,
            addrs: Box::new([0; MAX_BATCH]),
            lens: Box::new([0; MAX_BATCH]),
            idx: Box::new([0; MAX_BATCH]),
            next: 0,
            polls: 0,
            t0: tsc::rdtsc(),
            ns_per_tick: 1e9 / hz,
            counters,
        };
        rx.adopt(handed);
        while rx.own.deficit > 0 && rx.refill(pool) > 0 {}
        Ok(Box::new(rx))
    }

    fn steer_in_kernel(&self, steer: Arc<KernelSteer>) -> Result<(), PortError> {
        if self.rx_opened.load(Ordering::Relaxed) {
            return Err(PortError::Spec(format!("{}: kernel steering after a queue was opened", self.name())));
        }
        if steer.counting() {
            // The move protocol (crate::steered) compares each frame's kernel receive time with the
            // switch time and leaves held frames in the ring: AF_XDP descriptors carry neither.
            return Err(PortError::Unsupported(format!(
                "{}: kernel steering with moves needs per-frame receive times, which AF_XDP does not give",
                self.name()
            )));
        }
        if steer.queues() != self.queues {
            return Err(PortError::Spec(format!(
                "{}: kernel steering for {} workers on {} queues",
                self.name(),
                steer.queues(),
                self.queues
            )));
        }
        steer.bind_xsks(self.queue0).map_err(|e| PortError::Spec(format!("{}: {e}", self.name())))?;
        *self.steer.lock().map_err(|_| PortError::Spec("afxdp: poisoned".into()))? = Some(steer);
        Ok(())
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

/// A worker's socket on its own queue, whose UMEM is the worker's pool.
struct RxSock {
    /// Shared with the other workers' sockets on this queue (they keep the UMEM alive).
    xsk: Arc<Xsk>,
    queue: u32,
    /// Fill-ring entries owed (packets received and not yet replaced).
    deficit: usize,
}

/// Kernel steering: a worker's socket on another worker's queue, sharing that queue's
/// UMEM: what arrives is copied into this worker's pool and the buffer handed back.
struct ForeignSock {
    xsk: Xsk,
    /// The UMEM's region (address as usize, length) and buffer size.
    base: usize,
    len: usize,
    buf: u64,
    /// Buffers back to the queue's worker, who alone fills the queue's fill ring.
    back: rtrb::Producer<u64>,
    /// The queue's own socket: the UMEM outlives this socket (declared after `xsk`).
    _umem: Arc<Xsk>,
    _region: RegionGuard,
}

/// A worker's receive side over AF_XDP: its socket on its own queue (the UMEM is its
/// pool), and under kernel steering a socket on every other queue (see the module doc).
pub struct AfXdpRx {
    own: RxSock,
    foreign: Vec<ForeignSock>,
    /// Buffers other workers received from this worker's queue, coming back.
    returns: Vec<rtrb::Consumer<u64>>,
    /// Returned buffers the fill ring had no room for yet (never expected: what is out
    /// never exceeds the ring).
    backlog: Vec<u64>,
    share: Option<Arc<SteerShare>>,
    worker: usize,
    mail_seen: u32,
    /// Keeps the pool's region mapped until the sockets are closed (declared after them).
    _region: RegionGuard,
    iface: String,
    ring: u32,
    /// The interface generation the sockets are bound to (the watch's epoch then).
    epoch: u32,
    watch: Arc<LinkWatch>,
    owner: Arc<XdpOwner>,
    buf_size: u64,
    addrs: Box<[u64; MAX_BATCH]>,
    lens: Box<[u32; MAX_BATCH]>,
    idx: Box<[u32; MAX_BATCH]>,
    /// The socket the next burst reads first (rotates: no queue starves the others).
    next: usize,
    polls: u32,
    t0: u64,
    ns_per_tick: f64,
    counters: Arc<QueueCounters>,
}

impl AfXdpRx {
    /// Takes sockets and return rings other workers made for this one.
    fn adopt(&mut self, handed: Vec<Handed>) {
        for h in handed {
            match h {
                Handed::Socket(f) => self.foreign.push(f),
                Handed::Returns(r) => self.returns.push(r),
            }
        }
    }

    /// Kernel steering: one relaxed load per burst; the mailbox when it changed.
    fn check_mail(&mut self) {
        let Some(share) = &self.share else { return };
        let now = share.mail[self.worker].load(Ordering::Acquire);
        if now == self.mail_seen {
            return;
        }
        self.mail_seen = now;
        let handed = share.reg.lock().map(|mut r| std::mem::take(&mut r.mailbox[self.worker])).unwrap_or_default();
        self.adopt(handed);
    }

    /// Lends up to one burst of free buffers to the own socket's fill ring; returns how many went.
    fn refill(&mut self, pool: &mut PacketPool) -> usize {
        let want = self.own.deficit.min(MAX_BATCH);
        let k = pool.lend(&mut self.idx[..want]);
        for i in 0..k {
            self.addrs[i] = self.idx[i] as u64 * self.buf_size;
        }
        // SAFETY: addrs[..k] are initialised; the shim reads k entries.
        let f = unsafe { fp_xsk_fill(self.own.xsk.0, self.addrs.as_ptr(), k as u32) } as usize;
        for &i in &self.idx[f..k] {
            pool.reclaim(i);
        }
        self.own.deficit -= f;
        f
    }

    /// Puts the buffers other workers handed back on the own fill ring (they stay lent).
    fn take_returns(&mut self) {
        for r in &mut self.returns {
            while let Ok(a) = r.pop() {
                self.backlog.push(a);
                if self.backlog.len() == self.backlog.capacity() {
                    break;
                }
            }
        }
        if self.backlog.is_empty() {
            return;
        }
        // SAFETY: backlog holds backlog.len() initialised addresses of this socket's UMEM.
        let f =
            unsafe { fp_xsk_fill(self.own.xsk.0, self.backlog.as_ptr(), self.backlog.len() as u32) } as usize;
        self.backlog.drain(..f);
    }

    /// The interface came back with a new index: the old socket closed, the buffers
    /// lent to it taken back, a new socket on the new interface given a full fill ring.
    /// Under kernel steering the program and its map were the old interface's: the run
    /// stops, saying so.
    #[cold]
    fn reattach(&mut self, pool: &mut PacketPool) {
        self.read_stats();
        self.epoch = self.watch.epoch();
        if self.share.is_some() {
            self.foreign.clear();
            self.watch.fail(format!(
                "afxdp:{}: the interface was re-created under kernel steering (its program went with it): restart the run",
                self.iface
            ));
            return;
        }
        // Closing the old socket first frees the queue; its buffers are then no one's but ours.
        self.own.xsk = Arc::new(Xsk(std::ptr::null_mut()));
        for i in 0..pool.stats().buffers {
            pool.reclaim(i as u32);
        }
        self.own.deficit = self.ring as usize;
        match Xsk::open(&self.iface, self.own.queue, pool.region(), pool.buf_size(), self.ring, true, false) {
            Ok((xsk, _)) => {
                self.own.xsk = Arc::new(xsk);
                self.owner.claim(self.watch.ifindex(), XSK_PROG);
                while self.own.deficit > 0 && self.refill(pool) > 0 {}
            }
            Err(e) => self.watch.fail(format!(
                "afxdp:{}:{}: cannot re-attach to the re-created interface: {e}",
                self.iface, self.own.queue
            )),
        }
    }

    fn read_stats(&mut self) {
        let socks = std::iter::once(self.own.xsk.0).chain(self.foreign.iter().map(|f| f.xsk.0));
        let mut sum = 0u64;
        for x in socks.filter(|x| !x.is_null()) {
            let (mut d, mut full, mut empty) = (0u64, 0u64, 0u64);
            // SAFETY: out-pointers are valid locals; a live socket.
            if unsafe { fp_xsk_stats(x, &mut d, &mut full, &mut empty) } == 0 {
                sum += d + full;
            }
        }
        // The kernel's counters are totals: store, not add.
        self.counters.rx_overrun.store(sum, Ordering::Relaxed);
    }

    /// Takes up to `max` frames from the own socket into `batch`: (taken, bytes, refused).
    fn take_own(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize, ts: u64) -> (usize, u64, u64) {
        // SAFETY: addrs/lens hold MAX_BATCH >= max entries; a live socket.
        let n = unsafe { fp_xsk_rx(self.own.xsk.0, self.addrs.as_mut_ptr(), self.lens.as_mut_ptr(), max as u32) }
            as usize;
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
        if n > 0 {
            self.own.deficit += n;
            self.refill(pool);
        }
        (got, bytes, bad)
    }

    /// Takes up to `max` frames from foreign socket `s`, copying each into `pool` and
    /// handing its buffer back: (taken, bytes, refused). A frame the pool had no buffer
    /// for counts as `rx_pool_empty`; one too long for it or outside the UMEM (never
    /// expected) is refused (`rx_oversize`).
    fn take_foreign(
        &mut self,
        s: usize,
        pool: &mut PacketPool,
        batch: &mut Batch,
        max: usize,
        ts: u64,
    ) -> (usize, u64, u64) {
        let f = &mut self.foreign[s];
        // SAFETY: addrs/lens hold MAX_BATCH >= max entries; a live socket.
        let n = unsafe { fp_xsk_rx(f.xsk.0, self.addrs.as_mut_ptr(), self.lens.as_mut_ptr(), max as u32) } as usize;
        let (mut got, mut bytes, mut bad) = (0usize, 0u64, 0u64);
        for i in 0..n {
            let (addr, len) = (self.addrs[i], self.lens[i] as usize);
            let start = addr as usize;
            if start.checked_add(len).is_some_and(|end| end <= f.len) {
                // SAFETY: [start, start + len) lies inside the queue's UMEM region (checked), kept
                // mapped by `_region`; the kernel wrote the frame there and handed the descriptor to
                // this socket, so no one writes it until the buffer is handed back below.
                let frame = unsafe { std::slice::from_raw_parts((f.base + start) as *const u8, len) };
                if batch.push_copy(pool, frame, ts) {
                    got += 1;
                    bytes += len as u64;
                } else if len > pool.data_room() {
                    bad += 1;
                } else {
                    QueueCounters::add(&self.counters.rx_pool_empty, 1);
                }
            } else {
                bad += 1;
            }
            // Back to the fill ring's owner, at the start of its buffer. The ring holds as many
            // entries as that fill ring, which bounds the buffers out: never full.
            let _ = f.back.push(addr - addr % f.buf);
        }
        (got, bytes, bad)
    }
}

impl RxQueue for AfXdpRx {
    fn clock_ns(&self) -> Option<u64> {
        Some((tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64)
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
        if self.own.xsk.0.is_null() {
            // No socket since a failed re-attach (the run is stopping).
            return 0;
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(1024) {
            self.read_stats();
        }
        if self.share.is_some() {
            self.check_mail();
            self.take_returns();
        }
        if self.own.deficit > 0 {
            self.refill(pool);
        }
        let max = max.min(batch.room()).min(MAX_BATCH);
        let ts = (tsc::rdtsc().saturating_sub(self.t0) as f64 * self.ns_per_tick) as u64;
        // The own socket, then the others from a rotating start.
        let (mut got, mut bytes, mut bad) = self.take_own(pool, batch, max, ts);
        let k = self.foreign.len();
        if k > 0 {
            let first = self.next % k;
            self.next = self.next.wrapping_add(1);
            for j in 0..k {
                if got >= max {
                    break;
                }
                let (g, b, x) = self.take_foreign((first + j) % k, pool, batch, max - got, ts);
                got += g;
                bytes += b;
                bad += x;
            }
        }
        if got == 0 && bad == 0 {
            // Idle: the place to notice a re-created interface (one relaxed load).
            if self.watch.epoch() != self.epoch {
                self.reattach(pool);
                return 0;
            }
            // SAFETY: live sockets.
            unsafe { fp_xsk_rx_wakeup(self.own.xsk.0) };
            return 0;
        }
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

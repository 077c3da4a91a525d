//! AF_PACKET ports: a TPACKET_V3 RX ring per queue (mmap'ed blocks the
//! kernel fills and hands over whole), PACKET_FANOUT (hash, defragmenting)
//! spreading one interface over the queues, and transmit by `sendmmsg` on a
//! PACKET_QDISC_BYPASS socket: one system call per batch and port, none per
//! packet. Receive copies each packet from the ring into a pool buffer (the
//! ring is the kernel's memory; the copy is the "DMA"); RX ring overruns
//! are the kernel's `tp_drops`, read every few hundred polls.
//!
//! Kernel steering ([`AfPacketPort::with_kernel_steering`]): instead of the
//! fanout hash, the group runs flowplane's steering program
//! ([`super::fanout_steer`]), which returns the worker a frame belongs to;
//! the kernel delivers it to the socket at that index in the group, which is
//! the order sockets joined. So the port opens every receive socket at the
//! first `open_rx` and joins them in queue order; each `open_rx(q)` takes its
//! own. Such a group cannot be rebuilt in order by queues re-attaching one by
//! one: a re-created interface stops the run (one line) instead.
//!
//! The port's [`LinkWatch`] follows the interface: when it is deleted and
//! created again under the same name, each queue re-opens its socket on the
//! new index (checked when the queue is idle and once per transmit batch).
//! A transmit refused because the link is down counts the batch's packets as
//! `tx_errors` with one system call, and only bytes the kernel accepted are
//! counted as sent.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use flowplane_packet::{Batch, PacketPool, Verdict, MAX_BATCH};

use super::fanout_steer::KernelSteer;
use super::{iface_arg, LinkWatch, Port, PortCaps, PortError, PortInfo, PortOptions, PortSpec, QueueCounters, RxQueue, TxQueue};

/// Registration (see [`super::PORTS`]).
pub const INFO: PortInfo = PortInfo {
    name: "afpacket",
    syntax: "afpacket:IFACE",
    about: "a Linux interface through AF_PACKET (TPACKET_V3 ring and fanout per queue, sendmmsg)",
    caps: PortCaps {
        live: true,
        kernel_steering: true,
        peer: true,
        once_per_process: false,
        needs_root: true,
        options: &["--promisc"],
        missing: None,
    },
    parse: iface_arg,
    open: |spec: &PortSpec, queues, opts| Ok(Arc::new(AfPacketPort::open(spec.arg(), queues, opts)?)),
};

const TPACKET_V3: libc::c_int = 2;

fn os(what: impl Into<String>) -> PortError {
    PortError::Os(what.into(), io::Error::last_os_error())
}

/// An owned file descriptor, closed on drop.
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed once.
        unsafe { libc::close(self.0) };
    }
}

fn setsockopt<T>(fd: &Fd, level: libc::c_int, name: libc::c_int, val: &T, what: &str) -> Result<(), PortError> {
    // SAFETY: `val` points to a live `T` of `size_of::<T>()` bytes, which is what the option expects
    // (each caller passes the kernel's structure or int for `name`).
    let r = unsafe {
        libc::setsockopt(fd.0, level, name, val as *const T as *const libc::c_void, size_of::<T>() as libc::socklen_t)
    };
    if r != 0 {
        return Err(os(what));
    }
    Ok(())
}

fn packet_socket() -> Result<Fd, PortError> {
    // Protocol 0: the socket receives nothing until it is bound to one interface.
    // SAFETY: a plain system call with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os("AF_PACKET socket (needs root or CAP_NET_RAW)"));
    }
    Ok(Fd(fd))
}

fn bind(fd: &Fd, ifindex: i32, protocol: u16, iface: &str) -> Result<(), PortError> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = protocol.to_be();
    sa.sll_ifindex = ifindex;
    // SAFETY: `sa` is a valid sockaddr_ll and its exact size is passed.
    let r = unsafe {
        libc::bind(
            fd.0,
            &sa as *const libc::sockaddr_ll as *const libc::sockaddr,
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(os(format!("bind to {iface}")));
    }
    Ok(())
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Fanout group ids handed out by this process (distinct per opened port).
static NEXT_GROUP: AtomicU16 = AtomicU16::new(0);

/// Ring block bytes on a kernel-steered port whose keys move (one page: a 16 MiB ring is
/// 4096 blocks, ~4 s of 1 ms blocks while a worker holds frames for a move).
const HOLD_BLOCK: usize = 4096;

/// An interface opened through AF_PACKET for N queue pairs.
pub struct AfPacketPort {
    iface: String,
    watch: Arc<LinkWatch>,
    queues: usize,
    opts: PortOptions,
    group: u16,
    counters: Vec<Arc<QueueCounters>>,
    base_ns: u64,
    /// Kernel steering: the program, and the receive queues opened (in order) but not yet taken.
    steer: Mutex<Option<Arc<KernelSteer>>>,
    opened: Mutex<Vec<Option<AfPacketRx>>>,
    /// An RX queue was opened (kernel steering can no longer be set up).
    rx_opened: std::sync::atomic::AtomicBool,
}

impl AfPacketPort {
    /// Opens `iface` for `queues` queue pairs (sockets are made per queue by
    /// `open_rx`/`open_tx`, on the threads that use them).
    pub fn open(iface: &str, queues: usize, opts: PortOptions) -> Result<Self, PortError> {
        let name = CString::new(iface).map_err(|_| PortError::Spec(format!("{iface}: bad interface name")))?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(os(format!("interface {iface}")));
        }
        if queues == 0 || queues > 1024 {
            return Err(PortError::Spec(format!("afpacket:{iface}: {queues} queues (1..=1024)")));
        }
        let page = 4096;
        if opts.block_size < page || !opts.block_size.is_multiple_of(page) || opts.ring_bytes < opts.block_size {
            return Err(PortError::Spec(format!("afpacket:{iface}: bad ring geometry")));
        }
        // Probe: fail here (one line), not on a worker thread, without root.
        packet_socket()?;
        let group =
            (std::process::id() as u16).wrapping_mul(31).wrapping_add(NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
        let watch = Arc::new(LinkWatch::new(&format!("afpacket:{iface}"), iface)?);
        Ok(AfPacketPort {
            iface: iface.to_string(),
            watch,
            queues,
            opts,
            group,
            counters: (0..queues).map(|_| Arc::new(QueueCounters::default())).collect(),
            base_ns: realtime_ns(),
            steer: Mutex::new(None),
            opened: Mutex::new(Vec::new()),
            rx_opened: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Steers received frames to the queues with `steer` (worker `i` = queue `i`) instead of the fanout hash.
    pub fn with_kernel_steering(self, steer: Arc<KernelSteer>) -> Self {
        if let Ok(mut s) = self.steer.lock() {
            *s = Some(steer);
        }
        self
    }

    fn steering(&self) -> Option<Arc<KernelSteer>> {
        self.steer.lock().ok().and_then(|s| s.clone())
    }

    fn rx_cfg(&self) -> RxCfg {
        RxCfg {
            iface: self.iface.clone(),
            opts: self.opts,
            queues: self.queues,
            group: self.group,
            base_ns: self.base_ns,
            watch: Arc::clone(&self.watch),
            steered: self.steering().is_some(),
        }
    }

    /// Kernel steering: the first call opens every queue's socket and joins them in order; each takes its own.
    fn take_steered(&self, q: usize, steer: &KernelSteer) -> Result<AfPacketRx, PortError> {
        let mut opened = self.opened.lock().map_err(|_| PortError::Spec("afpacket: poisoned queue list".into()))?;
        if opened.is_empty() {
            let epoch = self.watch.epoch();
            let mut cfg = self.rx_cfg();
            if steer.counting() {
                // Moves: a new owner leaves a key's frames (and all behind them) in its ring until
                // the key's state is in, and a block is retired every timeout with however few
                // frames it holds: small blocks make that wait last 16 times longer at low rates.
                cfg.opts.block_size = cfg.opts.block_size.min(HOLD_BLOCK);
            }
            let mut rxs = Vec::with_capacity(self.queues);
            for c in &self.counters {
                rxs.push(AfPacketRx::open(cfg.clone(), epoch, Arc::clone(c))?);
            }
            let fds: Vec<libc::c_int> = rxs.iter().map(|r| r.fd.0).collect();
            steer
                .join(&fds, self.group.wrapping_add(epoch as u16))
                .map_err(|e| PortError::Spec(format!("afpacket:{}: {e}", self.iface)))?;
            *opened = rxs.into_iter().map(Some).collect();
        }
        opened
            .get_mut(q)
            .and_then(Option::take)
            .ok_or_else(|| PortError::Spec(format!("afpacket:{}: queue {q} opened twice", self.iface)))
    }
}

impl Port for AfPacketPort {
    fn name(&self) -> String {
        format!("afpacket:{}", self.iface)
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

    fn open_rx(&self, q: usize) -> Result<Box<dyn RxQueue>, PortError> {
        let counters = self.counters.get(q).cloned().ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        self.rx_opened.store(true, Ordering::Relaxed);
        let rx = match self.steering() {
            Some(steer) => self.take_steered(q, &steer)?,
            None => AfPacketRx::open(self.rx_cfg(), self.watch.epoch(), counters)?,
        };
        // Packets dropped before the run are not the run's.
        rx.counters.rx_overrun.store(0, Ordering::Relaxed);
        Ok(Box::new(rx))
    }

    fn steer_in_kernel(&self, steer: Arc<KernelSteer>) -> Result<(), PortError> {
        if self.rx_opened.load(Ordering::Relaxed) {
            return Err(PortError::Spec(format!("afpacket:{}: kernel steering after a queue was opened", self.iface)));
        }
        let mut s = self.steer.lock().map_err(|_| PortError::Spec("afpacket: poisoned".into()))?;
        *s = Some(steer);
        Ok(())
    }

    fn open_tx(&self, q: usize) -> Result<Box<dyn TxQueue>, PortError> {
        let counters = self.counters.get(q).cloned().ok_or_else(|| PortError::Spec(format!("queue {q}")))?;
        Ok(Box::new(AfPacketTx::open(self, counters)?))
    }
}

/// What a receive queue needs to open (and re-open) its socket.
#[derive(Clone)]
struct RxCfg {
    iface: String,
    opts: PortOptions,
    queues: usize,
    group: u16,
    base_ns: u64,
    watch: Arc<LinkWatch>,
    /// The socket joins a kernel-steered group (by the port, in order), not the hash group.
    steered: bool,
}

/// A TPACKET_V3 receive ring.
pub struct AfPacketRx {
    ring: *mut u8,
    ring_len: usize,
    block_size: usize,
    blocks: usize,
    /// The block being read and, while it is open, the packets left in it and the next one's offset.
    cur: usize,
    left: u32,
    off: usize,
    polls: u32,
    base_ns: u64,
    /// The interface generation this socket is bound to (the watch's epoch then).
    epoch: u32,
    cfg: RxCfg,
    counters: Arc<QueueCounters>,
    fd: Fd,
}

// SAFETY: the ring mapping is owned by this value alone (no other user-space
// reference to it exists); moving it to another thread moves that ownership.
unsafe impl Send for AfPacketRx {}

impl AfPacketRx {
    /// A socket and ring on the interface's index of generation `epoch`.
    fn open(port: RxCfg, epoch: u32, counters: Arc<QueueCounters>) -> Result<Self, PortError> {
        let ifindex = port.watch.ifindex();
        let fd = packet_socket()?;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V3, "PACKET_VERSION v3")?;
        // Our own transmissions on this interface are not input.
        let one: libc::c_int = 1;
        let _ = setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one, "PACKET_IGNORE_OUTGOING");
        let o = port.opts;
        let blocks = (o.ring_bytes / o.block_size).max(2);
        let frame = 2048;
        let req = libc::tpacket_req3 {
            tp_block_size: o.block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame as u32,
            tp_frame_nr: (o.block_size / frame * blocks) as u32,
            tp_retire_blk_tov: o.block_timeout_ms.max(1),
            tp_sizeof_priv: 0,
            tp_feature_req_word: libc::TP_FT_REQ_FILL_RXHASH,
        };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req, "PACKET_RX_RING")?;
        let ring_len = o.block_size * blocks;
        // SAFETY: maps the ring the kernel just allocated for this socket;
        // length and offset are the ones PACKET_RX_RING defined.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.0,
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(os("mmap of the RX ring"));
        }
        let mut rx = AfPacketRx {
            ring: ring as *mut u8,
            ring_len,
            block_size: o.block_size,
            blocks,
            cur: 0,
            left: 0,
            off: 0,
            polls: 0,
            base_ns: port.base_ns,
            epoch,
            counters,
            fd,
            cfg: port,
        };
        let port = &rx.cfg;
        bind(&rx.fd, ifindex, libc::ETH_P_ALL as u16, &port.iface)?;
        if o.promisc {
            // SAFETY: packet_mreq is plain data; all-zero is valid.
            let mut mr: libc::packet_mreq = unsafe { zeroed() };
            mr.mr_ifindex = ifindex;
            mr.mr_type = libc::PACKET_MR_PROMISC as u16;
            // The kernel drops the membership when the socket closes: promiscuity ends with the port.
            setsockopt(&rx.fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mr, "promiscuous mode")?;
        }
        if port.queues > 1 && !port.steered {
            // A fanout group belongs to one device: each interface generation gets its own.
            let group = port.group.wrapping_add(epoch as u16);
            let arg: libc::c_int =
                (group as u32 | ((libc::PACKET_FANOUT_HASH | libc::PACKET_FANOUT_FLAG_DEFRAG) << 16)) as i32;
            setsockopt(&rx.fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg, "PACKET_FANOUT hash")?;
        }
        rx.read_drops();
        Ok(rx)
    }

    /// The interface came back with a new index: a new socket and ring on it (the old
    /// ones are closed after; the counters go on). A failure stops the run through the watch.
    #[cold]
    fn reattach(&mut self) {
        let epoch = self.cfg.watch.epoch();
        if self.cfg.steered {
            self.epoch = epoch;
            self.cfg.watch.fail(format!(
                "afpacket:{}: the interface was re-created; a kernel-steered fanout group cannot be rebuilt \
                 in queue order while the run goes on",
                self.cfg.iface
            ));
            return;
        }
        let cfg = RxCfg {
            iface: self.cfg.iface.clone(),
            opts: self.cfg.opts,
            queues: self.cfg.queues,
            group: self.cfg.group,
            base_ns: self.cfg.base_ns,
            watch: Arc::clone(&self.cfg.watch),
            steered: false,
        };
        match AfPacketRx::open(cfg, epoch, Arc::clone(&self.counters)) {
            Ok(rx) => *self = rx,
            Err(e) => {
                self.epoch = epoch;
                self.cfg
                    .watch
                    .fail(format!("afpacket:{}: cannot re-attach to the re-created interface: {e}", self.cfg.iface));
            }
        }
    }

    /// Adds the kernel's ring-full drops since the last read (the read resets them).
    fn read_drops(&mut self) {
        // SAFETY: plain data; all-zero is valid.
        let mut st: libc::tpacket_stats_v3 = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` and `len` are live and sized for PACKET_STATISTICS on a v3 socket.
        let r = unsafe {
            libc::getsockopt(
                self.fd.0,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r == 0 {
            QueueCounters::add(&self.counters.rx_overrun, st.tp_drops as u64);
        }
    }

    /// The status word of block `b`, shared with the kernel.
    fn status(&self, b: usize) -> &AtomicU32 {
        // SAFETY: block b < blocks lies inside the mapping, starts page-aligned,
        // and its first bytes are a tpacket_block_desc whose block_status (at
        // offset 8: version, offset_to_priv, then hdr.bh1.block_status) is a
        // u32 the kernel and we access only atomically; the mapping lives as long as `self`.
        unsafe { AtomicU32::from_ptr(self.ring.add(b * self.block_size + 8) as *mut u32) }
    }

    /// Gives the current block back to the kernel and moves to the next.
    fn release(&mut self) {
        self.status(self.cur).store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.cur = (self.cur + 1) % self.blocks;
        self.left = 0;
    }
}

impl RxQueue for AfPacketRx {
    fn clock_ns(&self) -> Option<u64> {
        // The kernel stamps frames with CLOCK_REALTIME.
        Some(realtime_ns().saturating_sub(self.base_ns))
    }

    fn rx_burst(&mut self, pool: &mut PacketPool, batch: &mut Batch, max: usize) -> usize {
        self.receive(pool, batch, max, None)
    }

    fn rx_burst_gated(
        &mut self,
        pool: &mut PacketPool,
        batch: &mut Batch,
        max: usize,
        gate: &mut dyn FnMut(&[u8], u64) -> bool,
    ) -> usize {
        self.receive(pool, batch, max, Some(gate))
    }
}

/// A receive gate: a frame's bytes and receive time (ns since the Unix epoch); false holds it back.
type Gate<'a> = dyn FnMut(&[u8], u64) -> bool + 'a;

/// Longest frame prefix a gate sees with its 802.1Q tag put back.
const GATE_ROOM: usize = 512;

impl AfPacketRx {
    /// Receives up to `max` frames; `gate` (when given) sees each one first, as the worker
    /// will (tag put back, up to [`GATE_ROOM`] bytes) with its receive time (ns since the
    /// Unix epoch), and a `false` leaves it and what follows in the ring.
    fn receive(
        &mut self,
        pool: &mut PacketPool,
        batch: &mut Batch,
        max: usize,
        mut gate: Option<&mut Gate<'_>>,
    ) -> usize {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(512) {
            self.read_drops();
        }
        let (mut n, mut bytes, mut no_buf, mut oversize) = (0usize, 0u64, 0u64, 0u64);
        let max = max.min(batch.room());
        while n < max {
            if self.left == 0 {
                if self.status(self.cur).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                    break;
                }
                // SAFETY: the kernel handed this block to user space (status
                // USER, acquired above): its descriptor is ours to read until release.
                let bh = unsafe {
                    (*(self.ring.add(self.cur * self.block_size) as *const libc::tpacket_block_desc)).hdr.bh1
                };
                self.left = bh.num_pkts;
                self.off = bh.offset_to_first_pkt as usize;
                if self.left == 0 {
                    self.release();
                    continue;
                }
            }
            let bs = self.block_size;
            let hsz = size_of::<libc::tpacket3_hdr>();
            if self.off + hsz > bs {
                // A corrupt descriptor chain: give the block back rather than read past it.
                self.release();
                continue;
            }
            // SAFETY: off + header size <= block size (checked), inside a block we own.
            let h = unsafe {
                std::ptr::read_unaligned(self.ring.add(self.cur * bs + self.off) as *const libc::tpacket3_hdr)
            };
            let start = self.off + h.tp_mac as usize;
            let len = h.tp_snaplen as usize;
            if start + len <= bs {
                // SAFETY: start + len <= block size (checked), inside the owned block;
                // the kernel does not write it until release.
                let data = unsafe { std::slice::from_raw_parts(self.ring.add(self.cur * bs + start), len) };
                let abs = h.tp_sec as u64 * 1_000_000_000 + h.tp_nsec as u64;
                let ts = abs.saturating_sub(self.base_ns);
                let vlan = h.tp_status & libc::TP_STATUS_VLAN_VALID != 0 && len >= 12;
                if let Some(g) = gate.as_mut() {
                    let take = if vlan {
                        let mut f = [0u8; GATE_ROOM];
                        let n = (len + 4).min(GATE_ROOM);
                        f[..12].copy_from_slice(&data[..12]);
                        let tpid = if h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                            h.hv1.tp_vlan_tpid
                        } else {
                            0x8100
                        };
                        f[12..14].copy_from_slice(&tpid.to_be_bytes());
                        f[14..16].copy_from_slice(&(h.hv1.tp_vlan_tci as u16).to_be_bytes());
                        f[16..n].copy_from_slice(&data[12..n - 4]);
                        g(&f[..n], abs)
                    } else {
                        g(data, abs)
                    };
                    if !take {
                        // Left where it is: the next burst starts at this frame.
                        break;
                    }
                }
                let room = pool.data_room();
                if len + 4 * vlan as usize > room {
                    oversize += 1;
                } else if !batch.push_copy(pool, data, ts) {
                    no_buf += 1;
                } else {
                    let i = batch.len() - 1;
                    batch.rss_hashes_mut()[i] = h.hv1.tp_rxhash;
                    if vlan {
                        // The kernel took the 802.1Q tag out of the frame: put it back after the MACs.
                        let tpid = if h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                            h.hv1.tp_vlan_tpid
                        } else {
                            0x8100
                        };
                        let _ = batch.set_len(i, len + 4);
                        let d = batch.data_mut(i);
                        d.copy_within(12..len, 16);
                        d[12..14].copy_from_slice(&tpid.to_be_bytes());
                        d[14..16].copy_from_slice(&(h.hv1.tp_vlan_tci as u16).to_be_bytes());
                    }
                    n += 1;
                    bytes += batch.lens()[i] as u64;
                }
            }
            self.left -= 1;
            self.off += h.tp_next_offset as usize;
            if self.left == 0 {
                self.release();
            }
        }
        let c = &self.counters;
        QueueCounters::add(&c.rx_packets, n as u64);
        QueueCounters::add(&c.rx_bytes, bytes);
        QueueCounters::add(&c.rx_pool_empty, no_buf);
        QueueCounters::add(&c.rx_oversize, oversize);
        if n == 0 && self.cfg.watch.epoch() != self.epoch {
            self.reattach();
        }
        n
    }
}

impl Drop for AfPacketRx {
    fn drop(&mut self) {
        self.read_drops();
        // SAFETY: the mapping was made in `open` with this length and is unmapped once;
        // no reference into it outlives `self`. The socket closes after (field order).
        unsafe { libc::munmap(self.ring as *mut libc::c_void, self.ring_len) };
    }
}

/// Transmit through `sendmmsg` on a qdisc-bypassing socket.
pub struct AfPacketTx {
    iov: Box<[libc::iovec; MAX_BATCH]>,
    msgs: Box<[libc::mmsghdr; MAX_BATCH]>,
    counters: Arc<QueueCounters>,
    iface: String,
    watch: Arc<LinkWatch>,
    /// The interface generation this socket is bound to.
    epoch: u32,
    fd: Fd,
}

// SAFETY: the iovec/mmsghdr arrays hold pointers only during `tx_batch`
// (into the batch it borrows); between calls they are dead data.
unsafe impl Send for AfPacketTx {}

impl AfPacketTx {
    fn open(port: &AfPacketPort, counters: Arc<QueueCounters>) -> Result<Self, PortError> {
        let epoch = port.watch.epoch();
        let fd = Self::socket(&port.iface, port.watch.ifindex())?;
        // SAFETY: iovec and mmsghdr are plain data (pointers and lengths); all-zero is valid.
        let (iov, msgs) = unsafe { (Box::new(zeroed()), Box::new(zeroed())) };
        Ok(AfPacketTx { iov, msgs, counters, iface: port.iface.clone(), watch: Arc::clone(&port.watch), epoch, fd })
    }

    fn socket(iface: &str, ifindex: i32) -> Result<Fd, PortError> {
        let fd = packet_socket()?;
        let one: libc::c_int = 1;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one, "PACKET_QDISC_BYPASS")?;
        let sndbuf: libc::c_int = 4 << 20;
        let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &sndbuf, "SO_SNDBUF");
        bind(&fd, ifindex, 0, iface)?;
        Ok(fd)
    }

    /// The interface came back with a new index: a socket bound to it.
    #[cold]
    fn reattach(&mut self) {
        self.epoch = self.watch.epoch();
        match Self::socket(&self.iface, self.watch.ifindex()) {
            Ok(fd) => self.fd = fd,
            Err(e) => {
                self.watch.fail(format!("afpacket:{}: cannot re-attach to the re-created interface: {e}", self.iface))
            }
        }
    }
}

impl TxQueue for AfPacketTx {
    fn tx_batch(&mut self, batch: &Batch, port: Verdict) -> (u64, u64, u64) {
        // One relaxed load per batch: a re-created interface gets a new socket.
        if self.watch.epoch() != self.epoch {
            self.reattach();
        }
        let mut k = 0;
        for (i, &v) in batch.verdicts().iter().enumerate() {
            if v != port {
                continue;
            }
            let d = batch.data(i);
            self.iov[k] = libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() };
            k += 1;
        }
        for j in 0..k {
            let h = &mut self.msgs[j].msg_hdr;
            h.msg_iov = &mut self.iov[j];
            h.msg_iovlen = 1;
        }
        // `done` messages are dealt with: sent (their bytes counted) or refused (errors).
        let (mut done, mut bytes, mut errors, mut full) = (0usize, 0u64, 0u64, 0u64);
        while done < k {
            // SAFETY: msgs[done..k] are initialised above and point at iovecs
            // describing packet data of `batch`, which is borrowed for this call;
            // the kernel only reads them.
            let r = unsafe {
                libc::sendmmsg(self.fd.0, self.msgs.as_mut_ptr().add(done), (k - done) as u32, libc::MSG_DONTWAIT)
            };
            if r > 0 {
                // Only what the kernel accepted is sent, and only its bytes are counted.
                for j in done..done + r as usize {
                    bytes += self.iov[j].iov_len as u64;
                }
                done += r as usize;
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ENOBUFS) => {
                    full = (k - done) as u64;
                    break;
                }
                // Link down or interface gone: the rest fails alike (one call, not one per packet).
                Some(libc::ENETDOWN | libc::ENXIO | libc::ENODEV) => {
                    errors += (k - done) as u64;
                    break;
                }
                // This message is refused (too long): count it and go on.
                _ => {
                    errors += 1;
                    done += 1;
                }
            }
        }
        QueueCounters::add(&self.counters.tx_full, full);
        QueueCounters::add(&self.counters.tx_errors, errors);
        (k as u64 - full - errors, bytes, full + errors)
    }
}

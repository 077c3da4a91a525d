//! Kernel steering for AF_PACKET and AF_XDP ports: flowplane's [`Classifier`]
//! and steering table run inside the kernel as a `PACKET_FANOUT_EBPF` program
//! (`fp_steer`) or an XDP program (`fp_xdp_steer`), so a multi-core run on
//! such a port needs no dispatcher core.
//!
//! This module owns the program (`csrc/steer.bpf.c`, built by `build.rs`
//! with clang and embedded here), its maps, and joining a fanout group.
//! The program computes, per received frame, exactly what the dispatcher
//! computes with [`Classifier::classify`] and the exact-match flow rules:
//! the steering key (a RETA entry from flowplane's Toeplitz hash with the
//! run's key and [`HashOn`] input, `reta_size + r` for the first matching
//! flow-director rule, a flow slot for an offloaded flow, key 0 for a frame
//! it cannot classify), then returns the key's owner from the `fp_reta` map.
//! The return value is the index of the socket in the fanout group, which
//! is the order the sockets joined: [`KernelSteer::join`] joins them in
//! worker order, and the port opens all its receive sockets at once, in
//! order, for that reason.
//!
//! Maps (layouts written by the `*_bytes` functions below, tested):
//! - `fp_cfg` (one entry): RETA mask and size, number of fixed rules and of
//!   installed flow rules, [`HashOn`], `icmp_inner`.
//! - `fp_toep` (one 36 KiB entry): for every input byte position (36) and
//!   value (256) its 32-bit Toeplitz contribution for the run's key; the
//!   hash is then one XOR per input byte, as [`flowplane_wire::rss::Toeplitz`].
//! - `fp_reta`: the owner of every steering key (RETA entries, fixed rules,
//!   flow slots): [`KernelSteer::set_entry`] / [`KernelSteer::set_reta`]
//!   change it live (one map write per entry; the next frame sees it).
//! - `fp_fdir`: the fixed flow-director rules, in order (at most [`MAX_FDIR`]).
//! - `fp_flows`: exact-match flow rules (Dyssect's offloaded flows), both
//!   directions of each, to their slot key and the entry they are bound to.
//! - `fp_stats` (per CPU): frames steered by the RETA, by a rule, by a flow
//!   rule, frames not classified, and later fragments that followed their first.
//! - `fp_frags` (LRU hash, 4,096): a first fragment's steering key by its
//!   datagram (addresses, identification, protocol), which the datagram's later
//!   fragments take (as [`flowplane_scale::fragsteer::FragSteer`] does).
//! - `fp_counts` (mmap'ed, from [`KernelSteer::start_counting`] on): frames per
//!   (worker, key), one atomic add per frame: the loads a strategy that moves
//!   keys reads. Moves themselves: [`crate::steered`].
//!
//! - `fp_xsks` (an XSKMAP of workers x workers): for AF_XDP, worker `w`'s
//!   socket on the port's queue `q` at `q * workers + w`
//!   ([`KernelSteer::set_xsk`]); `fp_xdp_steer` redirects each frame to its
//!   owner's socket on the queue it arrived on (an XSK receives only from the
//!   queue it is bound to, so every worker has a socket on every queue, all
//!   sharing the worker's UMEM). `fp_cfg` says which queues
//!   ([`KernelSteer::bind_xsks`]). Moves are AF_PACKET's only: their protocol
//!   reads each frame's kernel receive time, which AF_XDP does not give.
//!
//! The kernel drops nothing here: it only picks the socket. Fragments are
//! not reassembled (no `PACKET_FANOUT_FLAG_DEFRAG`): each is steered as the
//! emulated NIC steers it. Detaching is closing: the group keeps the program
//! while a member socket is open, and [`KernelSteer`]'s drop closes its maps
//! and its descriptor of the program.
//!
//! Without clang at build time (`cfg(fp_fanout_steer)` unset) [`KernelSteer::load`]
//! says so in one line and callers take the software dispatcher.

use std::os::fd::RawFd;

use flowplane_scale::steer::{Classifier, FdirRule, FlowRule, HashOn, Steering};
use flowplane_wire::flow::FiveTupleV4;
use flowplane_wire::rss::{Toeplitz, MAX_INPUT_LEN};

/// Most fixed flow-director rules the program checks (its `MAX_FDIR`).
pub const MAX_FDIR: usize = 64;

/// Why kernel steering is not available or an operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerError(pub String);

impl std::fmt::Display for SteerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SteerError {}

/// Frames the program steered, by way (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerStats {
    /// By the RETA.
    pub reta: u64,
    /// By a fixed flow-director rule.
    pub fdir: u64,
    /// By an exact-match flow rule.
    pub flow: u64,
    /// Not classified (key 0).
    pub unclassified: u64,
    /// Later fragments steered by their first fragment's key (`fp_frags`).
    pub frag: u64,
}

/// Whether this build carries the kernel steering program.
pub fn available() -> bool {
    cfg!(fp_fanout_steer)
}

#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn hash_on_code(on: HashOn) -> u8 {
    match on {
        HashOn::FiveTuple => 0,
        HashOn::SrcIp => 1,
        HashOn::DstIp => 2,
    }
}

/// Where an AF_XDP port's frames go ([`KernelSteer::bind_xsks`]): its first queue, its
/// queues, the workers with a socket on each (all 0: no AF_XDP port).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct XskLayout {
    queue0: u32,
    queues: u32,
    workers: u32,
}

/// `fp_cfg`'s value: reta_mask, reta_size, nrules, nflows, keys (host order u32), hash_on,
/// icmp_inner, count, 1 pad, then the AF_XDP layout (queue0, queues, workers: host order
/// u32) and 4 pad bytes.
#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn cfg_bytes(c: &Classifier, nflows: u32, keys: u32, count: bool, xsk: XskLayout) -> [u8; 40] {
    let mut b = [0u8; 40];
    let n = c.reta_size() as u32;
    b[0..4].copy_from_slice(&(n - 1).to_ne_bytes());
    b[4..8].copy_from_slice(&n.to_ne_bytes());
    b[8..12].copy_from_slice(&(c.rules().len() as u32).to_ne_bytes());
    b[12..16].copy_from_slice(&nflows.to_ne_bytes());
    b[16..20].copy_from_slice(&keys.to_ne_bytes());
    b[20] = hash_on_code(c.hash_on());
    b[21] = c.icmp_inner() as u8;
    b[22] = count as u8;
    b[24..28].copy_from_slice(&xsk.queue0.to_ne_bytes());
    b[28..32].copy_from_slice(&xsk.queues.to_ne_bytes());
    b[32..36].copy_from_slice(&xsk.workers.to_ne_bytes());
    b
}

/// `fp_fdir`'s value: prefix and mask as wire bytes, port range in host order, proto, any-proto flag.
#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn fdir_bytes(r: &FdirRule) -> [u8; 16] {
    let mut b = [0u8; 16];
    let (net, len) = r.dst.map_or(([0u8; 4], 0u8), |(a, l)| (a.octets(), l.min(32)));
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    b[0..4].copy_from_slice(&net);
    b[4..8].copy_from_slice(&mask.to_be_bytes());
    b[8..10].copy_from_slice(&r.dst_ports.0.to_ne_bytes());
    b[10..12].copy_from_slice(&r.dst_ports.1.to_ne_bytes());
    b[12] = r.proto.unwrap_or(0);
    b[13] = r.proto.is_none() as u8;
    b
}

/// `fp_flows`' key: addresses and ports as on the wire, proto, zero padding (hashed by the map).
#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn flow_key_bytes(t: &FiveTupleV4) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&t.src().octets());
    b[4..8].copy_from_slice(&t.dst().octets());
    b[8..10].copy_from_slice(&t.src_port().to_be_bytes());
    b[10..12].copy_from_slice(&t.dst_port().to_be_bytes());
    b[12] = t.proto();
    b
}

/// `fp_flows`' value: the RETA entry the rule is bound to, its slot key.
#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn slot_bytes(entry: u16, slot: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    b[0..2].copy_from_slice(&entry.to_ne_bytes());
    b[2..4].copy_from_slice(&slot.to_ne_bytes());
    b
}

/// `fp_toep`'s value: per input position and byte value, its contribution to the hash.
#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn toeplitz_bytes(key: &[u8; 40]) -> Vec<u8> {
    let t = Toeplitz::new(key);
    let mut out = Vec::with_capacity(MAX_INPUT_LEN * 256 * 4);
    let mut input = [0u8; MAX_INPUT_LEN];
    for pos in 0..MAX_INPUT_LEN {
        for v in 0..=255u8 {
            // Zero bytes contribute nothing: the hash of `v` alone at `pos` is its contribution.
            input[pos] = v;
            out.extend_from_slice(&t.hash(&input[..=pos]).to_ne_bytes());
        }
        input[pos] = 0;
    }
    out
}

#[cfg(fp_fanout_steer)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    #[repr(C)]
    pub struct BpfObject {
        _p: [u8; 0],
    }
    #[repr(C)]
    pub struct BpfMap {
        _p: [u8; 0],
    }
    #[repr(C)]
    pub struct BpfProgram {
        _p: [u8; 0],
    }

    // libbpf (linked by build.rs with the AF_XDP shim); 1.x reports errors as NULL / -errno.
    extern "C" {
        pub fn bpf_object__open_mem(buf: *const c_void, sz: usize, opts: *const c_void) -> *mut BpfObject;
        pub fn bpf_object__load(o: *mut BpfObject) -> c_int;
        pub fn bpf_object__close(o: *mut BpfObject);
        pub fn bpf_object__find_map_by_name(o: *const BpfObject, name: *const c_char) -> *mut BpfMap;
        pub fn bpf_object__find_program_by_name(o: *const BpfObject, name: *const c_char) -> *mut BpfProgram;
        pub fn bpf_map__set_max_entries(m: *mut BpfMap, n: u32) -> c_int;
        pub fn bpf_map__fd(m: *const BpfMap) -> c_int;
        pub fn bpf_program__fd(p: *const BpfProgram) -> c_int;
        pub fn bpf_map_update_elem(fd: c_int, key: *const c_void, value: *const c_void, flags: u64) -> c_int;
        pub fn bpf_map_delete_elem(fd: c_int, key: *const c_void) -> c_int;
        pub fn bpf_map_lookup_elem(fd: c_int, key: *const c_void, value: *mut c_void) -> c_int;
        pub fn libbpf_num_possible_cpus() -> c_int;
        pub fn bpf_prog_test_run_opts(fd: c_int, opts: *mut TestRunOpts) -> c_int;
    }

    /// libbpf's `struct bpf_test_run_opts` (1.x).
    #[repr(C)]
    pub struct TestRunOpts {
        pub sz: usize,
        pub data_in: *const c_void,
        pub data_out: *mut c_void,
        pub data_size_in: u32,
        pub data_size_out: u32,
        pub ctx_in: *const c_void,
        pub ctx_out: *mut c_void,
        pub ctx_size_in: u32,
        pub ctx_size_out: u32,
        pub retval: u32,
        pub repeat: c_int,
        pub duration: u32,
        pub flags: u32,
        pub cpu: u32,
        pub batch_size: u32,
    }
}

/// The object file `build.rs` compiled from `csrc/steer.bpf.c`.
#[cfg(fp_fanout_steer)]
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer.bpf.o"));

/// The loaded steering program and its maps.
pub struct KernelSteer {
    #[cfg(fp_fanout_steer)]
    obj: *mut ffi::BpfObject,
    prog: RawFd,
    /// The AF_XDP program (`fp_xdp_steer`) and its socket map (`fp_xsks`).
    xdp_prog: RawFd,
    xsks: RawFd,
    xsk: std::sync::Mutex<XskLayout>,
    cfg: RawFd,
    reta: RawFd,
    flows: RawFd,
    stats: RawFd,
    classifier: Classifier,
    keys: usize,
    queues: usize,
    /// fp_counts mapped read-only (queues * keys u64 the program adds to), and its length in bytes.
    counts: *const u64,
    counts_len: usize,
    counting: std::sync::atomic::AtomicBool,
    /// Flow rules installed: (slot key, rule).
    flow_rules: std::sync::Mutex<Vec<(u16, FlowRule)>>,
    flow_slots: usize,
}

// SAFETY: the libbpf object is only touched at load and at drop (both with
// `&mut`/ownership); the map operations go through plain file descriptors,
// and the kernel serialises concurrent updates of one map.
unsafe impl Send for KernelSteer {}
// SAFETY: as above: shared use is map system calls on descriptors; the one
// piece of user-space state shared (`flow_rules`) is behind a mutex.
unsafe impl Sync for KernelSteer {}

impl std::fmt::Debug for KernelSteer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelSteer").field("prog", &self.prog).field("keys", &self.keys).finish_non_exhaustive()
    }
}

#[cfg_attr(not(fp_fanout_steer), allow(dead_code))]
fn sys_err(what: &str, r: i32) -> SteerError {
    let e = if r < 0 { std::io::Error::from_raw_os_error(-r) } else { std::io::Error::last_os_error() };
    SteerError(format!("kernel steering: {what}: {e}"))
}

impl KernelSteer {
    /// Loads the program for `classifier` over `keys` steering keys (the
    /// table's [`Steering::keys`]: RETA, fixed rules, `flow_slots` flow slots)
    /// owned as `owners` says (one owner per key).
    pub fn load(
        classifier: &Classifier,
        keys: usize,
        owners: &[u16],
        flow_slots: usize,
    ) -> Result<KernelSteer, SteerError> {
        let queues = owners.iter().map(|&q| q as usize + 1).max().unwrap_or(1);
        Self::load_for(classifier, keys, owners, flow_slots, queues)
    }

    /// [`KernelSteer::load`] for `queues` workers (the size of the per-(worker, key) counts).
    fn load_for(
        classifier: &Classifier,
        keys: usize,
        owners: &[u16],
        flow_slots: usize,
        queues: usize,
    ) -> Result<KernelSteer, SteerError> {
        if classifier.rules().len() > MAX_FDIR {
            return Err(SteerError(format!(
                "kernel steering: {} flow-director rules (at most {MAX_FDIR})",
                classifier.rules().len()
            )));
        }
        let fixed = classifier.reta_size() + classifier.rules().len();
        if keys != fixed + flow_slots || owners.len() != keys {
            return Err(SteerError(format!(
                "kernel steering: {keys} keys, {} owners for {fixed} fixed keys and {flow_slots} slots",
                owners.len()
            )));
        }
        if queues == 0 || owners.iter().any(|&q| q as usize >= queues) {
            return Err(SteerError(format!("kernel steering: owners beyond {queues} workers")));
        }
        Self::load_impl(classifier, keys, owners, flow_slots, queues)
    }

    /// [`KernelSteer::load`] for a live table: its keys, owners and flow rules as they stand.
    pub fn for_steering(classifier: &Classifier, steering: &Steering) -> Result<KernelSteer, SteerError> {
        let k =
            Self::load_for(classifier, steering.keys(), &steering.owners(), steering.flow_slots(), steering.queues())?;
        for (slot, rule) in steering.flow_rules() {
            k.add_flow_rule(slot, &rule)?;
        }
        Ok(k)
    }

    #[cfg(not(fp_fanout_steer))]
    fn load_impl(_: &Classifier, _: usize, _: &[u16], _: usize, _: usize) -> Result<KernelSteer, SteerError> {
        Err(SteerError(
            "kernel steering not built in (clang was missing when flowplane was built: apt-get install clang)".into(),
        ))
    }

    #[cfg(fp_fanout_steer)]
    fn load_impl(
        classifier: &Classifier,
        keys: usize,
        owners: &[u16],
        flow_slots: usize,
        queues: usize,
    ) -> Result<KernelSteer, SteerError> {
        use std::ffi::CString;
        // libelf reads the ELF headers in place: give it 8-byte aligned memory.
        let mut buf = vec![0u64; OBJECT.len().div_ceil(8)];
        let bytes: &mut [u8] = {
            // SAFETY: the Vec<u64> owns len*8 initialised bytes; u8 has no alignment or validity requirement.
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 8) }
        };
        bytes[..OBJECT.len()].copy_from_slice(OBJECT);
        // SAFETY: the buffer is valid for OBJECT.len() bytes and outlives the load below (libbpf
        // parses it during open and load only); NULL options are allowed.
        let obj = unsafe { ffi::bpf_object__open_mem(buf.as_ptr() as *const _, OBJECT.len(), std::ptr::null()) };
        if obj.is_null() {
            return Err(sys_err("opening the embedded program", 0));
        }
        // From here `guard` closes the object on every error path.
        struct Guard(*mut ffi::BpfObject);
        impl Drop for Guard {
            fn drop(&mut self) {
                if !self.0.is_null() {
                    // SAFETY: an object from bpf_object__open_mem, closed once.
                    unsafe { ffi::bpf_object__close(self.0) };
                }
            }
        }
        let mut guard = Guard(obj);
        let map = |name: &str| -> Result<*mut ffi::BpfMap, SteerError> {
            let c = CString::new(name).map_err(|_| SteerError(name.into()))?;
            // SAFETY: `obj` is a live object; `c` is NUL-terminated.
            let m = unsafe { ffi::bpf_object__find_map_by_name(obj, c.as_ptr()) };
            if m.is_null() {
                return Err(SteerError(format!("kernel steering: map {name} missing from the program")));
            }
            Ok(m)
        };
        let (m_cfg, m_toep, m_reta, m_fdir, m_flows, m_stats) =
            (map("fp_cfg")?, map("fp_toep")?, map("fp_reta")?, map("fp_fdir")?, map("fp_flows")?, map("fp_stats")?);
        let m_counts = map("fp_counts")?;
        let m_xsks = map("fp_xsks")?;
        // SAFETY: maps of the live, not yet loaded object.
        unsafe {
            let r = ffi::bpf_map__set_max_entries(m_reta, keys.max(1) as u32);
            if r != 0 {
                return Err(sys_err("sizing fp_reta", r));
            }
            // Both directions of every slot's rule.
            let r = ffi::bpf_map__set_max_entries(m_flows, (2 * flow_slots).max(1) as u32);
            if r != 0 {
                return Err(sys_err("sizing fp_flows", r));
            }
            let r = ffi::bpf_map__set_max_entries(m_counts, (queues * keys).max(1) as u32);
            if r != 0 {
                return Err(sys_err("sizing fp_counts", r));
            }
            // A socket per (queue, worker) of an AF_XDP port with one queue per worker.
            let r = ffi::bpf_map__set_max_entries(m_xsks, (queues * queues).max(1) as u32);
            if r != 0 {
                return Err(sys_err("sizing fp_xsks", r));
            }
        }
        // SAFETY: a live object, opened above.
        let r = unsafe { ffi::bpf_object__load(obj) };
        if r != 0 {
            return Err(sys_err("loading the program (needs root or CAP_BPF)", r));
        }
        drop(buf);
        let program = |name: &str| -> Result<*mut ffi::BpfProgram, SteerError> {
            let c = CString::new(name).map_err(|_| SteerError(name.into()))?;
            // SAFETY: the object is loaded; the program name is NUL-terminated.
            let p = unsafe { ffi::bpf_object__find_program_by_name(obj, c.as_ptr()) };
            if p.is_null() {
                return Err(SteerError(format!("kernel steering: program {name} missing")));
            }
            Ok(p)
        };
        let (prog, xdp_prog) = (program("fp_steer")?, program("fp_xdp_steer")?);
        // SAFETY: program and maps belong to the loaded object; their descriptors live as long as it.
        let (prog, xdp_prog, xsks, cfg, toep, reta, fdir, flows, stats, counts_fd) = unsafe {
            (
                ffi::bpf_program__fd(prog),
                ffi::bpf_program__fd(xdp_prog),
                ffi::bpf_map__fd(m_xsks),
                ffi::bpf_map__fd(m_cfg),
                ffi::bpf_map__fd(m_toep),
                ffi::bpf_map__fd(m_reta),
                ffi::bpf_map__fd(m_fdir),
                ffi::bpf_map__fd(m_flows),
                ffi::bpf_map__fd(m_stats),
                ffi::bpf_map__fd(m_counts),
            )
        };
        let counts_len = ((queues * keys).max(1) * 8).div_ceil(4096) * 4096;
        // SAFETY: maps the BPF_F_MMAPABLE array fp_counts read-only, its whole (page-rounded)
        // size; the mapping lives until drop, after which nothing reads it.
        let counts =
            unsafe { libc::mmap(std::ptr::null_mut(), counts_len, libc::PROT_READ, libc::MAP_SHARED, counts_fd, 0) };
        if counts == libc::MAP_FAILED {
            return Err(SteerError(format!("kernel steering: mmap of fp_counts: {}", std::io::Error::last_os_error())));
        }
        let obj = std::mem::replace(&mut guard.0, std::ptr::null_mut());
        let k = KernelSteer {
            obj,
            prog,
            xdp_prog,
            xsks,
            xsk: std::sync::Mutex::new(XskLayout::default()),
            cfg,
            reta,
            flows,
            stats,
            classifier: classifier.clone(),
            keys,
            queues,
            counts: counts as *const u64,
            counts_len,
            counting: std::sync::atomic::AtomicBool::new(false),
            flow_rules: std::sync::Mutex::new(Vec::new()),
            flow_slots,
        };
        update(toep, &0u32.to_ne_bytes(), &toeplitz_bytes(classifier.toeplitz_key()), "fp_toep")?;
        for (i, r) in classifier.rules().iter().enumerate() {
            update(fdir, &(i as u32).to_ne_bytes(), &fdir_bytes(r), "fp_fdir")?;
        }
        k.set_reta(owners)?;
        // Configuration last: until it is written the program reads no rules and a zero mask.
        k.write_cfg(0)?;
        Ok(k)
    }

    /// The program's descriptor (what `PACKET_FANOUT_DATA` takes).
    pub fn prog_fd(&self) -> RawFd {
        self.prog
    }

    /// The AF_XDP program's descriptor (`fp_xdp_steer`: what an AF_XDP port attaches).
    pub fn xdp_prog_fd(&self) -> RawFd {
        self.xdp_prog
    }

    /// Steers an AF_XDP port's frames from now on: its queues `queue0 ..
    /// queue0 + queues()` (one per worker), each frame to the socket
    /// [`KernelSteer::set_xsk`] put at (its queue, its owner).
    pub fn bind_xsks(&self, queue0: u32) -> Result<(), SteerError> {
        let n = self.queues as u32;
        *self.xsk.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))? =
            XskLayout { queue0, queues: n, workers: n };
        let rules = self.flow_rules.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))?.len();
        self.write_cfg(rules)
    }

    /// Puts AF_XDP socket `fd` at (port queue `queue` counted from the first, worker `worker`).
    pub fn set_xsk(&self, queue: usize, worker: usize, fd: RawFd) -> Result<(), SteerError> {
        if queue >= self.queues || worker >= self.queues {
            return Err(SteerError(format!(
                "kernel steering: socket of queue {queue}, worker {worker} beyond {} workers",
                self.queues
            )));
        }
        let slot = (queue * self.queues + worker) as u32;
        update(self.xsks, &slot.to_ne_bytes(), &(fd as u32).to_ne_bytes(), "fp_xsks")
    }

    /// Steering keys the table holds.
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Joins the AF_PACKET sockets `fds` (bound, rings set up) to fanout
    /// group `group` in this order, steered by this program: socket `i`
    /// receives what the table gives worker `i`. The group must be new.
    pub fn join(&self, fds: &[RawFd], group: u16) -> Result<(), SteerError> {
        let arg = (group as u32 | (libc::PACKET_FANOUT_EBPF << 16)) as libc::c_int;
        for (i, &fd) in fds.iter().enumerate() {
            setsockopt_int(fd, libc::PACKET_FANOUT, arg, "PACKET_FANOUT ebpf")?;
            if i == 0 {
                // The program steers from the first member on (before it, the group sends all to socket 0).
                setsockopt_int(fd, libc::PACKET_FANOUT_DATA, self.prog, "PACKET_FANOUT_DATA")?;
            }
        }
        Ok(())
    }

    /// Sets the owners of keys `0..owners.len()` (RETA entries first), one map write each.
    pub fn set_reta(&self, owners: &[u16]) -> Result<(), SteerError> {
        if owners.len() > self.keys {
            return Err(SteerError(format!("kernel steering: {} owners for {} keys", owners.len(), self.keys)));
        }
        for (k, &q) in owners.iter().enumerate() {
            self.set_entry(k as u16, q)?;
        }
        Ok(())
    }

    /// Steers key `key` to worker `q` from the next frame on.
    pub fn set_entry(&self, key: u16, q: u16) -> Result<(), SteerError> {
        if key as usize >= self.keys {
            return Err(SteerError(format!("kernel steering: key {key} out of range ({} keys)", self.keys)));
        }
        update(self.reta, &(key as u32).to_ne_bytes(), &(q as u32).to_ne_bytes(), "fp_reta")
    }

    /// Sends `rule`'s flow (both directions) to slot key `slot` while it hashes to `rule.entry`.
    pub fn add_flow_rule(&self, slot: u16, rule: &FlowRule) -> Result<(), SteerError> {
        let first = self.keys - self.flow_slots;
        if (slot as usize) < first || slot as usize >= self.keys {
            return Err(SteerError(format!("kernel steering: {slot} is not a flow slot")));
        }
        let mut rules = self.flow_rules.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))?;
        let v = slot_bytes(rule.entry, slot);
        update(self.flows, &flow_key_bytes(&rule.tuple), &v, "fp_flows")?;
        update(self.flows, &flow_key_bytes(&rule.tuple.reversed()), &v, "fp_flows")?;
        rules.retain(|(s, _)| *s != slot);
        rules.push((slot, *rule));
        self.write_cfg(rules.len())
    }

    /// Removes the flow rule of slot `slot` (no-op when none).
    pub fn remove_flow_rule(&self, slot: u16) -> Result<(), SteerError> {
        let mut rules = self.flow_rules.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))?;
        let Some(i) = rules.iter().position(|(s, _)| *s == slot) else { return Ok(()) };
        let (_, rule) = rules.swap_remove(i);
        for t in [rule.tuple, rule.tuple.reversed()] {
            // A flow that is its own reverse was written once: a second delete finds nothing.
            let _ = delete(self.flows, &flow_key_bytes(&t));
        }
        self.write_cfg(rules.len())
    }

    /// Brings the program's owners and flow rules to `steering`'s as landed (after moves, rule changes).
    pub fn sync(&self, steering: &Steering) -> Result<(), SteerError> {
        self.set_reta(&steering.owners())?;
        self.sync_rules(steering)
    }

    /// Brings the program's exact-match flow rules to `steering`'s as landed.
    pub fn sync_rules(&self, steering: &Steering) -> Result<(), SteerError> {
        let want = steering.flow_rules();
        let have: Vec<(u16, FlowRule)> =
            self.flow_rules.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))?.clone();
        for (slot, r) in &have {
            if !want.iter().any(|(s, w)| s == slot && w == r) {
                self.remove_flow_rule(*slot)?;
            }
        }
        for (slot, r) in &want {
            if !have.iter().any(|(s, h)| s == slot && h == r) {
                self.add_flow_rule(*slot, r)?;
            }
        }
        Ok(())
    }

    /// Waits for an RCU grace period after table writes: when it returns, every frame
    /// the program steered by the old table is in its socket's ring. Returns the real
    /// time (ns since the Unix epoch) after which every frame received is steered by
    /// the new table.
    pub fn grace_period(&self) -> u64 {
        // The program runs, and its frame is queued, inside the receive path's RCU read
        // section; MEMBARRIER_CMD_GLOBAL (1) returns after synchronize_rcu().
        // SAFETY: a plain system call with constant arguments.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, 1 as libc::c_int, 0 as libc::c_uint, 0 as libc::c_int) };
        if r != 0 {
            // nohz_full CPUs refuse it: a grace period is a few ms at most.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    }

    fn write_cfg(&self, nflows: usize) -> Result<(), SteerError> {
        let count = self.counting.load(std::sync::atomic::Ordering::Relaxed);
        let xsk = self.xsk.lock().map(|x| *x).unwrap_or_default();
        let b = cfg_bytes(&self.classifier, nflows as u32, self.keys as u32, count, xsk);
        update(self.cfg, &0u32.to_ne_bytes(), &b, "fp_cfg")
    }

    /// Counts every frame against its (worker, key) from now on ([`KernelSteer::counts`]):
    /// what a strategy that moves keys reads as loads (one atomic add per frame).
    pub fn start_counting(&self) -> Result<(), SteerError> {
        self.counting.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = self.flow_rules.lock().map_err(|_| SteerError("kernel steering: poisoned".into()))?.len();
        self.write_cfg(n)
    }

    /// Frames are counted: the program serves a strategy that moves keys.
    pub fn counting(&self) -> bool {
        self.counting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Workers the counts are kept for.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// Frames steered so far per (worker, key), at `worker * keys() + key` (empty before
    /// [`KernelSteer::start_counting`] or without the program).
    pub fn counts(&self, out: &mut Vec<u64>) {
        out.clear();
        if self.counts.is_null() {
            return;
        }
        let n = self.queues * self.keys;
        out.extend((0..n).map(|i| {
            // SAFETY: i < queues * keys entries of the read-only mapping of fp_counts, which
            // lives as long as `self`; the program adds to them atomically, so an atomic load
            // of an aligned u64 is a valid read.
            unsafe {
                (*(self.counts.add(i) as *const std::sync::atomic::AtomicU64))
                    .load(std::sync::atomic::Ordering::Relaxed)
            }
        }));
    }

    /// Runs the program once on `frame` (Ethernet, at least 14 bytes) as the kernel
    /// receives it (`BPF_PROG_TEST_RUN`: the MAC header pulled, VLAN tags left in the
    /// data) and returns what it returned: the owner of the frame's key. For tests of
    /// the program against [`Classifier`]; the frame counts in [`KernelSteer::stats`].
    #[cfg(fp_fanout_steer)]
    pub fn run_once(&self, frame: &[u8]) -> Result<u32, SteerError> {
        let mut o = ffi::TestRunOpts {
            sz: std::mem::size_of::<ffi::TestRunOpts>(),
            data_in: frame.as_ptr() as *const _,
            data_out: std::ptr::null_mut(),
            data_size_in: frame.len() as u32,
            data_size_out: 0,
            ctx_in: std::ptr::null(),
            ctx_out: std::ptr::null_mut(),
            ctx_size_in: 0,
            ctx_size_out: 0,
            retval: 0,
            repeat: 1,
            duration: 0,
            flags: 0,
            cpu: 0,
            batch_size: 0,
        };
        // SAFETY: `o` is a fully initialised bpf_test_run_opts whose data_in points to
        // `frame`'s bytes for the call; no output buffers are given.
        let r = unsafe { ffi::bpf_prog_test_run_opts(self.prog, &mut o) };
        if r != 0 {
            return Err(sys_err("BPF_PROG_TEST_RUN", r));
        }
        Ok(o.retval)
    }

    /// [`KernelSteer::run_once`] without the program built in.
    #[cfg(not(fp_fanout_steer))]
    pub fn run_once(&self, _frame: &[u8]) -> Result<u32, SteerError> {
        Err(SteerError("kernel steering not built in".into()))
    }

    /// What the program has steered so far.
    pub fn stats(&self) -> SteerStats {
        let mut s = SteerStats::default();
        for (i, out) in
            [&mut s.reta, &mut s.fdir, &mut s.flow, &mut s.unclassified, &mut s.frag].into_iter().enumerate()
        {
            *out = self.stat(i as u32);
        }
        s
    }

    #[cfg(fp_fanout_steer)]
    fn stat(&self, i: u32) -> u64 {
        // SAFETY: a plain libbpf query.
        let cpus = unsafe { ffi::libbpf_num_possible_cpus() }.max(1) as usize;
        let mut v = vec![0u64; cpus];
        // SAFETY: a per-CPU array of u64 fills one u64 per possible CPU: `v` holds exactly that.
        let r = unsafe { ffi::bpf_map_lookup_elem(self.stats, &i as *const u32 as *const _, v.as_mut_ptr() as *mut _) };
        if r != 0 {
            return 0;
        }
        v.iter().sum()
    }

    #[cfg(not(fp_fanout_steer))]
    fn stat(&self, _: u32) -> u64 {
        let _ = (self.stats, self.flows, self.reta, self.cfg, self.counts_len);
        0
    }
}

#[cfg(fp_fanout_steer)]
impl Drop for KernelSteer {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `load_impl` with this length and is unmapped once.
        unsafe { libc::munmap(self.counts as *mut libc::c_void, self.counts_len) };
        // SAFETY: the object was loaded in `load_impl` and is closed once; the fanout
        // groups holding the program keep their own reference to it.
        unsafe { ffi::bpf_object__close(self.obj) };
    }
}

fn setsockopt_int(fd: RawFd, name: libc::c_int, v: libc::c_int, what: &str) -> Result<(), SteerError> {
    // SAFETY: `v` is a live c_int and its size is passed; `fd` is the caller's socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(SteerError(format!("kernel steering: {what}: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

#[cfg(fp_fanout_steer)]
fn update(fd: RawFd, key: &[u8], value: &[u8], what: &str) -> Result<(), SteerError> {
    // SAFETY: key and value point to live bytes of the map's key and value sizes (the callers
    // pass the `*_bytes` layouts of that map); the kernel copies them.
    let r = unsafe { ffi::bpf_map_update_elem(fd, key.as_ptr() as *const _, value.as_ptr() as *const _, 0) };
    if r != 0 {
        return Err(sys_err(&format!("updating {what}"), r));
    }
    Ok(())
}

#[cfg(not(fp_fanout_steer))]
fn update(_: RawFd, _: &[u8], _: &[u8], what: &str) -> Result<(), SteerError> {
    Err(SteerError(format!("kernel steering not built in ({what})")))
}

#[cfg(fp_fanout_steer)]
fn delete(fd: RawFd, key: &[u8]) -> Result<(), SteerError> {
    // SAFETY: `key` points to a live key of the map's key size.
    let r = unsafe { ffi::bpf_map_delete_elem(fd, key.as_ptr() as *const _) };
    if r != 0 {
        return Err(sys_err("deleting from fp_flows", r));
    }
    Ok(())
}

#[cfg(not(fp_fanout_steer))]
fn delete(_: RawFd, _: &[u8]) -> Result<(), SteerError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_wire::rss::{reference_hash, MICROSOFT_KEY, SYMMETRIC_KEY};
    use std::net::Ipv4Addr;

    #[test]
    fn the_toeplitz_table_sums_to_the_reference_hash() {
        for key in [&MICROSOFT_KEY, &SYMMETRIC_KEY] {
            let t = toeplitz_bytes(key);
            assert_eq!(t.len(), 36 * 256 * 4);
            let at = |pos: usize, v: u8| {
                let i = (pos * 256 + v as usize) * 4;
                u32::from_ne_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]])
            };
            // Microsoft's published vector: 66.9.149.187:2794 -> 161.142.100.80:1766 is 0x51ccc178.
            let input = [66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6];
            let h = input.iter().enumerate().fold(0, |h, (p, &b)| h ^ at(p, b));
            assert_eq!(h, reference_hash(key, &input));
            if key == &MICROSOFT_KEY {
                assert_eq!(h, 0x51cc_c178);
            }
            let v6: Vec<u8> = (0..36).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(v6.iter().enumerate().fold(0, |h, (p, &b)| h ^ at(p, b)), reference_hash(key, &v6));
        }
    }

    #[test]
    fn config_and_rule_layouts_match_the_program() {
        let rule = FdirRule {
            proto: Some(17),
            dst: Some((Ipv4Addr::new(203, 0, 113, 1), 24)),
            dst_ports: (20000, 29999),
            queue: 1,
        };
        let c = Classifier::new(512, true, HashOn::DstIp, true, vec![rule]).unwrap();
        let b = cfg_bytes(&c, 3, 515, true, XskLayout { queue0: 4, queues: 2, workers: 3 });
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 511);
        assert_eq!(u32::from_ne_bytes(b[4..8].try_into().unwrap()), 512);
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(b[12..16].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(b[16..20].try_into().unwrap()), 515);
        assert_eq!((b[20], b[21], b[22]), (2, 1, 1));
        let at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
        assert_eq!((at(24), at(28), at(32)), (4, 2, 3));
        let f = fdir_bytes(&rule);
        // The program compares raw wire words: prefix and mask are network-order bytes.
        assert_eq!(&f[0..8], &[203, 0, 113, 1, 255, 255, 255, 0]);
        assert_eq!(u16::from_ne_bytes([f[8], f[9]]), 20000);
        assert_eq!(u16::from_ne_bytes([f[10], f[11]]), 29999);
        assert_eq!((f[12], f[13]), (17, 0));
        let any = fdir_bytes(&FdirRule { proto: None, dst: None, dst_ports: (0, 65535), queue: 0 });
        assert_eq!((&any[4..8], any[13]), (&[0u8, 0, 0, 0][..], 1));
    }

    #[test]
    fn a_flow_rule_key_is_the_wire_tuple_and_its_reverse() {
        let t = FiveTupleV4::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 1234, 80, 6);
        let k = flow_key_bytes(&t);
        assert_eq!(k, [10, 0, 0, 1, 10, 0, 0, 2, 0x04, 0xd2, 0, 80, 6, 0, 0, 0]);
        assert_eq!(flow_key_bytes(&t.reversed()), [10, 0, 0, 2, 10, 0, 0, 1, 0, 80, 0x04, 0xd2, 6, 0, 0, 0]);
        assert_eq!(slot_bytes(7, 600), [7u16.to_ne_bytes(), 600u16.to_ne_bytes()].concat()[..]);
    }

    #[test]
    fn a_table_that_does_not_fit_is_refused_in_one_line() {
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, Vec::new()).unwrap();
        let e = KernelSteer::load(&c, 8, &[0; 7], 0).unwrap_err();
        assert!(e.0.contains("owners") && !e.0.contains('\n'), "{e}");
        let many = vec![FdirRule { proto: None, dst: None, dst_ports: (1, 1), queue: 0 }; MAX_FDIR + 1];
        let c = Classifier::new(8, false, HashOn::FiveTuple, false, many).unwrap();
        assert!(KernelSteer::load(&c, 8 + MAX_FDIR + 1, &[0; 8 + MAX_FDIR + 1], 0).is_err());
    }
}

//! An interface's presence and link state, watched off the packet path.
//!
//! A [`LinkWatch`] belongs to a port on a Linux interface (AF_PACKET, AF_XDP).
//! The run's control loop calls [`LinkWatch::poll`] every ~200 ms: two
//! `ioctl`s on a socket of the port's network namespace (the interface's
//! index by name, then its flags), never a system call per packet. It
//! reports each change once, as one line: link down (not up, or no
//! carrier), link up, interface gone (deleted), interface re-created (the
//! name is back with another index). A re-created interface bumps the
//! watch's *epoch*: each queue of the port compares the epoch with its own
//! when it is idle or at a batch (one relaxed atomic load) and re-opens its
//! socket on the new index. A queue that cannot re-attach records why
//! ([`LinkWatch::fail`]) and the run stops with that one-line error.

use std::ffi::CString;
use std::io;
use std::mem::zeroed;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use super::PortError;

/// The interface's state as last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Up and running (carrier).
    Up,
    /// Present but administratively down or without carrier.
    Down,
    /// No interface of that name.
    Gone,
}

impl LinkState {
    /// `up`, `down` or `gone`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Down => "down",
            LinkState::Gone => "gone",
        }
    }

    fn from_u8(v: u8) -> LinkState {
        match v {
            0 => LinkState::Up,
            1 => LinkState::Down,
            _ => LinkState::Gone,
        }
    }
}

/// A watch's figures: the state now and the events seen so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkStats {
    /// The state at the last poll.
    pub state: LinkState,
    /// Times the link went down.
    pub downs: u64,
    /// Times the interface disappeared.
    pub gone: u64,
    /// Times it came back with a new index (the queues re-attach to it).
    pub reattached: u64,
}

/// Watches one interface by name (see the module doc).
pub struct LinkWatch {
    port: String,
    name: CString,
    /// A datagram socket in the namespace the port was opened in (ioctls only).
    ctl: libc::c_int,
    ifindex: AtomicI32,
    epoch: AtomicU32,
    state: AtomicU8,
    downs: AtomicU64,
    gone: AtomicU64,
    reattached: AtomicU64,
    failed: Mutex<Option<String>>,
}

impl LinkWatch {
    /// Watches `iface` (present now: its index is returned by [`LinkWatch::ifindex`]) for the port named `port`.
    pub fn new(port: &str, iface: &str) -> Result<LinkWatch, PortError> {
        let name = CString::new(iface).map_err(|_| PortError::Spec(format!("{iface}: bad interface name")))?;
        if iface.len() >= libc::IFNAMSIZ {
            return Err(PortError::Spec(format!("{iface}: interface name too long")));
        }
        // SAFETY: a plain system call with constant arguments.
        let mut ctl = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if ctl < 0 {
            // SAFETY: as above (a namespace without IPv4 still has packet sockets).
            ctl = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        }
        if ctl < 0 {
            return Err(PortError::Os(format!("{port}: control socket"), io::Error::last_os_error()));
        }
        let w = LinkWatch {
            port: port.to_string(),
            name,
            ctl,
            ifindex: AtomicI32::new(0),
            epoch: AtomicU32::new(0),
            state: AtomicU8::new(0),
            downs: AtomicU64::new(0),
            gone: AtomicU64::new(0),
            reattached: AtomicU64::new(0),
            failed: Mutex::new(None),
        };
        let (idx, up) = w
            .query()
            .ok_or_else(|| PortError::Os(format!("interface {iface}"), io::Error::from_raw_os_error(libc::ENODEV)))?;
        w.ifindex.store(idx, Ordering::Relaxed);
        w.state.store(if up { 0 } else { 1 }, Ordering::Relaxed);
        Ok(w)
    }

    /// An `ifreq` naming the interface.
    fn ifreq(&self) -> libc::ifreq {
        // SAFETY: ifreq is plain data; all-zero is valid.
        let mut r: libc::ifreq = unsafe { zeroed() };
        for (d, &s) in r.ifr_name.iter_mut().zip(self.name.as_bytes()) {
            *d = s as libc::c_char;
        }
        r
    }

    /// The interface's index and whether it is up with carrier; None if there is none of that name.
    fn query(&self) -> Option<(i32, bool)> {
        let mut r = self.ifreq();
        // SAFETY: `r` is a live ifreq naming the interface (NUL-terminated: the name is shorter
        // than IFNAMSIZ); SIOCGIFINDEX writes its index into the union.
        if unsafe { libc::ioctl(self.ctl, libc::SIOCGIFINDEX, &mut r) } != 0 {
            return None;
        }
        // SAFETY: SIOCGIFINDEX succeeded: the union holds the index.
        let idx = unsafe { r.ifr_ifru.ifru_ifindex };
        let mut f = self.ifreq();
        // SAFETY: as above; SIOCGIFFLAGS writes the flags into the union.
        if unsafe { libc::ioctl(self.ctl, libc::SIOCGIFFLAGS, &mut f) } != 0 {
            return None;
        }
        // SAFETY: SIOCGIFFLAGS succeeded: the union holds the flags.
        let flags = unsafe { f.ifr_ifru.ifru_flags } as libc::c_int;
        Some((idx, flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0))
    }

    /// The index the queues should be bound to.
    #[inline]
    pub fn ifindex(&self) -> i32 {
        self.ifindex.load(Ordering::Acquire)
    }

    /// Bumped each time the interface comes back with a new index.
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Looks at the interface now; one line describing the change, if any (the control loop's call).
    pub fn poll(&self) -> Option<String> {
        let old = LinkState::from_u8(self.state.load(Ordering::Relaxed));
        let now = self.query();
        let (new, line) = match now {
            None if old == LinkState::Gone => return None,
            None => {
                self.gone.fetch_add(1, Ordering::Relaxed);
                (LinkState::Gone, format!("{}: interface gone (deleted); waiting for it to come back", self.port))
            }
            Some((idx, up)) => {
                let st = if up { LinkState::Up } else { LinkState::Down };
                let was = self.ifindex.load(Ordering::Relaxed);
                if idx != was {
                    // A new interface of the same name: the queues re-open on it.
                    self.ifindex.store(idx, Ordering::Release);
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                    self.reattached.fetch_add(1, Ordering::Relaxed);
                    if st == LinkState::Down {
                        self.downs.fetch_add(1, Ordering::Relaxed);
                    }
                    (
                        st,
                        format!(
                            "{}: interface re-created (index {was} -> {idx}, link {}); re-attaching",
                            self.port,
                            st.as_str()
                        ),
                    )
                } else if st == old {
                    return None;
                } else {
                    if st == LinkState::Down {
                        self.downs.fetch_add(1, Ordering::Relaxed);
                    }
                    (st, format!("{}: link {}", self.port, st.as_str()))
                }
            }
        };
        self.state.store(new as u8, Ordering::Relaxed);
        Some(line)
    }

    /// The state and the events so far.
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            state: LinkState::from_u8(self.state.load(Ordering::Relaxed)),
            downs: self.downs.load(Ordering::Relaxed),
            gone: self.gone.load(Ordering::Relaxed),
            reattached: self.reattached.load(Ordering::Relaxed),
        }
    }

    /// A queue could not re-attach: the run stops with `why` (the first one recorded).
    pub fn fail(&self, why: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(why);
        }
    }

    /// Why a queue could not re-attach, if one could not.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }
}

impl Drop for LinkWatch {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this value and closed once.
        unsafe { libc::close(self.ctl) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_is_an_error_and_loopback_is_watched_without_events() {
        assert!(LinkWatch::new("afpacket:fp-nosuch0", "fp-nosuch0").is_err());
        assert!(LinkWatch::new("afpacket:x", "0123456789abcdefg").is_err());
        let w = LinkWatch::new("afpacket:lo", "lo").expect("lo exists in every namespace");
        assert!(w.ifindex() > 0);
        assert_eq!(w.epoch(), 0);
        assert_eq!(w.poll(), None, "no change, no line");
        let s = w.stats();
        assert_eq!((s.state, s.downs, s.gone, s.reattached), (LinkState::Up, 0, 0, 0));
        w.fail("first".into());
        w.fail("second".into());
        assert_eq!(w.failure().as_deref(), Some("first"));
    }
}

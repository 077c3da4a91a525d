//! Network namespaces by name (`ip netns add NAME`): a thread enters one to
//! open sockets on interfaces that live there (the peer ends of veth pairs
//! in `flowplane mlffr`'s sender and receiver). Only the calling thread
//! moves; sockets it opens stay in that namespace for their whole life.

use std::ffi::CString;
use std::io;

use super::PortError;

/// Moves the calling thread into the network namespace `name` (a file under
/// /run/netns, as `ip netns` makes them; or a path such as /proc/PID/ns/net).
pub fn enter(name: &str) -> Result<(), PortError> {
    if name.is_empty() || name.contains('\0') {
        return Err(PortError::Spec(format!("netns {name:?}: bad name")));
    }
    let path = if name.contains('/') { name.to_string() } else { format!("/run/netns/{name}") };
    let c = CString::new(path.clone()).map_err(|_| PortError::Spec(format!("netns {name:?}: bad name")))?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(PortError::Os(
            format!("network namespace {path} (ip netns add {name})"),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` is an open descriptor of a namespace file; setns moves only this thread.
    let r = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    if r != 0 {
        return Err(PortError::Os(format!("entering network namespace {path} (needs root)"), err));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_namespace_is_an_error_not_a_panic() {
        assert!(super::enter("fp-no-such-netns").is_err());
        assert!(super::enter("").is_err());
    }
}

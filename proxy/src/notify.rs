//! systemd's readiness protocol (`sd_notify(3)`), written out rather than linked from libsystemd:
//! it is one datagram of `KEY=VALUE` lines to the Unix socket named by `$NOTIFY_SOCKET`, and the
//! packaged unit is `Type=notify`, so systemd starts dependent units only once the cache index is
//! rebuilt and the listeners are bound, and `systemctl reload` returns only once the reload is
//! done.
//!
//! Outside systemd (`$NOTIFY_SOCKET` unset) every call does nothing. A failure to send is logged
//! at debug level and never stops the proxy: readiness is a courtesy to the service manager, and
//! serving traffic matters more.

use std::io;
use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Start-up is complete: the cache index is rebuilt and the listeners are bound.
pub fn ready() {
    send("READY=1");
}

/// A configuration reload starts. systemd ≥ 253 wants the `CLOCK_MONOTONIC` time of the request
/// with it (to tell this reload from an earlier one); older versions ignore the extra line.
/// [`ready`] must follow once the reload is over, whether it was accepted or rejected.
pub fn reloading() {
    send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
}

/// The drain starts: systemd shows the unit as deactivating from now on.
pub fn stopping() {
    send("STOPPING=1");
}

/// Sends `state` to `$NOTIFY_SOCKET` if it is set; errors are logged at debug level only.
pub fn send(state: &str) {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    let Some(path) = path.to_str() else {
        tracing::debug!(socket = ?path, "NOTIFY_SOCKET is not UTF-8; not notifying systemd");
        return;
    };
    if let Err(e) = send_to(path, state) {
        tracing::debug!(socket = path, state, error = %e, "cannot notify systemd");
    }
}

/// Sends one datagram of `state` to the socket `path`; a leading `@` names an abstract socket.
pub fn send_to(path: &str, state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::SocketAddr;
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None if path.starts_with('/') => SocketAddr::from_pathname(path)?,
        // systemd also allows vsock:CID:PORT (for VMs); this proxy runs on the host.
        None => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only absolute paths and @abstract names are supported",
            ));
        }
    };
    let socket = UnixDatagram::unbound()?;
    let sent = socket.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes", state.len()),
        ));
    }
    Ok(())
}

/// Waits, at most `timeout`, until systemd has read every message sent before
/// (`sd_notify_barrier(3)`): a `BARRIER=1` datagram carries the write end of a pipe, which
/// systemd closes once it has processed what came before, so the read end sees end-of-file.
/// Outside systemd it returns at once; a failure is logged at debug level.
pub fn barrier(timeout: std::time::Duration) {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    let Some(path) = path.to_str() else {
        return;
    };
    if let Err(e) = barrier_at(path, timeout) {
        tracing::debug!(socket = path, error = %e, "systemd notify barrier failed");
    }
}

fn barrier_at(path: &str, timeout: std::time::Duration) -> io::Result<()> {
    use nix::sys::socket::{
        AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, sendmsg, socket,
    };
    use std::os::fd::AsRawFd;
    let addr = match path.strip_prefix('@') {
        Some(name) => UnixAddr::new_abstract(name.as_bytes())?,
        None => UnixAddr::new(path)?,
    };
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let sock = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let fds = [write.as_raw_fd()];
    let msg = b"BARRIER=1";
    sendmsg(
        sock.as_raw_fd(),
        &[std::io::IoSlice::new(msg)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        Some(&addr),
    )?;
    drop(write);
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut pfd = [PollFd::new(read.as_fd(), PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match poll(&mut pfd, wait) {
        Ok(1) => Ok(()),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "systemd did not close the barrier",
        )),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Microseconds of `CLOCK_MONOTONIC`, the clock systemd compares `MONOTONIC_USEC` with.
pub fn monotonic_usec() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    // CLOCK_MONOTONIC always exists on Linux; a zero would only make systemd's reload check fail.
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
        (ts.tv_sec() as u64) * 1_000_000 + (ts.tv_nsec() as u64) / 1_000
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn recv(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_one_datagram_to_a_path_socket() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind");
        send_to(path.to_str().expect("utf8"), "READY=1").expect("send");
        assert_eq!(recv(&socket), "READY=1");
    }

    #[test]
    fn sends_to_an_abstract_socket_named_with_at() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("zerocache-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract address");
        let socket = UnixDatagram::bind_addr(&addr).expect("bind");
        send_to(&format!("@{name}"), "STOPPING=1").expect("send");
        assert_eq!(recv(&socket), "STOPPING=1");
    }

    #[test]
    fn a_relative_path_or_a_missing_socket_is_an_error_not_a_panic() {
        assert_eq!(
            send_to("relative/notify", "READY=1")
                .expect_err("relative")
                .kind(),
            io::ErrorKind::Unsupported
        );
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("missing");
        assert_eq!(
            send_to(missing.to_str().expect("utf8"), "READY=1")
                .expect_err("missing")
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn monotonic_usec_advances_with_the_clock() {
        let a = monotonic_usec();
        std::thread::sleep(Duration::from_millis(20));
        let b = monotonic_usec();
        assert!(b - a >= 20_000, "{a} then {b}");
        assert!(b - a < 5_000_000, "{a} then {b}");
    }
}

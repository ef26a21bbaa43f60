//! No latency cliffs, asserted by their causes rather than by a clock (a shared 2-core machine
//! makes every wall-clock bound a coin toss; `cargo xtask bench` measures the latencies, as
//! ratios against nginx).
//!
//! The cliff this guards against is the ~40 ms stall nginx shows with `tcp_nopush` at 64 KiB: a
//! corked or Nagle-held tail waits for the peer's delayed ACK. Its causes are socket state and
//! syscall shape, both exact: the accepted socket has `TCP_NODELAY` and no `TCP_CORK`, each hit
//! is one head send followed by sendfile for the whole body, and nothing else writes to the
//! socket. A small hit leaving as one segment shows the head's `MSG_MORE` at work. The other
//! cliff, a cold hit read from disk on the event loop, is `cold_hits.rs`'s offload counter.

use crate::support::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// An integer socket option of `fd`.
fn sockopt_int(fd: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
    let mut v: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and an out-buffer of the stated length.
    let r = unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&raw mut v).cast(), &mut len) };
    assert_eq!(r, 0, "getsockopt: {}", std::io::Error::last_os_error());
    v
}

/// A duplicate of the proxy's end of the connection whose peer is `client` (pidfd_getfd: root).
fn proxy_side_socket(pid: u32, client: std::net::SocketAddr) -> OwnedFd {
    use nix::sys::socket::{SockaddrStorage, getpeername};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let want = SockaddrStorage::from(client);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fd dir") {
        let entry = entry.expect("fd entry");
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue; // closed meanwhile
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: pidfd_getfd takes a pidfd, an fd number of that process and flags.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if getpeername::<SockaddrStorage>(fd.as_raw_fd()).is_ok_and(|p| p == want) {
            return fd;
        }
    }
    panic!("the proxy holds no socket whose peer is {client}");
}

#[test]
fn keep_alive_hits_are_pushed_at_once_one_head_send_then_sendfile() {
    if !require::root("loads the eBPF probe and reads the proxy's socket with pidfd_getfd") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            ..Opts::default()
        },
    );
    let sizes = [1024usize, 65_536, 65_537, 1_000_000, 1_048_576];
    {
        let mut fill = proxy.client();
        for size in sizes {
            let path = format!("/obj/{size}");
            assert_eq!(fill.get(&path, &[]).x_cache(), "MISS");
            // The entry is committed once the fill ends, which can be just after the client
            // has the whole response.
            assert_eventually_eq(
                "the entry is stored",
                Duration::from_secs(5),
                || fill.get(&path, &[]).x_cache().to_string(),
                "HIT".to_string(),
            );
        }
    }
    let mut c = proxy.client();
    let local = c.sock.local_addr().expect("local");
    let mut heads = 0u64;
    let mut bodies = 0u64;
    for size in sizes {
        let want = body(size);
        for _ in 0..50 {
            let r = c.get(&format!("/obj/{size}"), &[]);
            assert_eq!(r.x_cache(), "HIT");
            assert!(r.body == want, "{size} B hit: body bytes differ");
            heads += r.head_len as u64;
            bodies += size as u64;
        }
    }
    // The socket state that keeps a tail from waiting for the peer's delayed ACK.
    let server = proxy_side_socket(proxy.child.id(), local);
    assert_eq!(
        sockopt_int(&server, libc::IPPROTO_TCP, libc::TCP_NODELAY),
        1,
        "TCP_NODELAY"
    );
    assert_eq!(
        sockopt_int(&server, libc::IPPROTO_TCP, libc::TCP_CORK),
        0,
        "TCP_CORK"
    );
    drop(server);
    drop(c);
    // The syscall shape, exact, as the kernel saw it on this connection.
    let conn = closed_conn(&proxy, |c| c["peer"] == local.to_string().as_str());
    let k = &conn["kernel"];
    let by_kind = &k["counts"]["by_kind"];
    assert_eq!(
        u(&by_kind[4]["calls"]),
        250,
        "one head send per hit: {by_kind}"
    );
    assert_eq!(u(&by_kind[4]["bytes"]), heads, "{by_kind}");
    assert_eq!(
        u(&by_kind[0]["bytes"]),
        bodies,
        "every body byte by sendfile: {by_kind}"
    );
    for (kind, name) in [
        (1, "splice"),
        (2, "write"),
        (3, "writev"),
        (5, "sendmsg"),
        (6, "sendmmsg"),
    ] {
        assert_eq!(u(&by_kind[kind]["calls"]), 0, "{name}: {by_kind}");
    }
    assert_eq!(
        u(&by_kind[4]["short"]),
        0,
        "a head left in one piece: {by_kind}"
    );
    assert_eq!(conn["verdict"], "zero-copy");
}

/// Data segments the client's socket has received (TCP_INFO `tcpi_data_segs_in`).
fn data_segments_in(sock: &std::net::TcpStream) -> u32 {
    // SAFETY: tcp_info is plain integers, so all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket and an out-buffer of the stated length.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_data_segs_in
}

/// A small hit leaves as one TCP segment: the head is sent with MSG_MORE and joins the sendfile
/// body. Sent apart, every hit costs two transmits, two receives and two client wake-ups.
#[test]
fn a_small_hit_arrives_as_one_segment() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for size in [1usize, 1024, 16_384] {
        let path = format!("/obj/{size}");
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS");
        for _ in 0..20 {
            let before = data_segments_in(&c.sock);
            let r = c.get(&path, &[]);
            assert_eq!((r.x_cache(), r.body.len()), ("HIT", size));
            assert_eq!(data_segments_in(&c.sock) - before, 1, "{size} B hit");
        }
    }
}

//! A test fixture for the probe's tests: a separate process that writes known byte counts through
//! each syscall, to a socket and to a file, closes one counted socket by dup2-ing over it, and
//! exits with another still open. Usage: `probe-fixture ADDR`; it prints `ready`, waits for a
//! line on stdin, does its work, prints `done`, waits for another line and exits.

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, IntoRawFd};

fn check(what: &str, r: isize, want: usize) {
    if r != want as isize {
        eprintln!(
            "probe-fixture: {what} returned {r}, wanted {want}: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(2);
    }
}

fn sendfile_all(sock: i32, file: i32, len: usize) {
    let mut off: libc::off_t = 0;
    while (off as usize) < len {
        // SAFETY: valid fds and offset pointer.
        let n = unsafe { libc::sendfile(sock, file, &mut off, len - off as usize) };
        if n <= 0 {
            check("sendfile", n, len);
        }
    }
}

fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: probe-fixture ADDR");
        std::process::exit(2)
    });
    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("ready");
    let _ = std::io::stdout().flush();
    let _ = stdin.lock().read_line(&mut line);

    let mut file = tempfile::tempfile().unwrap_or_else(|e| {
        eprintln!("probe-fixture: tempfile: {e}");
        std::process::exit(2)
    });
    let _ = file.write_all(&vec![7u8; 60_000]);
    let buf = [1u8; 1000];

    // Connection A: every copying path plus sendfile, then dup2 over it.
    let a = TcpStream::connect(&addr).unwrap_or_else(|e| {
        eprintln!("probe-fixture: connect: {e}");
        std::process::exit(2)
    });
    let a = a.into_raw_fd();
    // SAFETY: valid fd and buffer.
    check(
        "write",
        unsafe { libc::write(a, buf.as_ptr().cast(), 1000) },
        1000,
    );
    sendfile_all(a, file.as_raw_fd(), 50_000);
    let iov = [
        libc::iovec {
            iov_base: buf.as_ptr() as *mut _,
            iov_len: 100,
        },
        libc::iovec {
            iov_base: buf.as_ptr() as *mut _,
            iov_len: 200,
        },
    ];
    // SAFETY: valid iovecs over a live buffer.
    check("writev", unsafe { libc::writev(a, iov.as_ptr(), 2) }, 300);
    // SAFETY: valid fd and buffer.
    check(
        "send",
        unsafe { libc::send(a, buf.as_ptr().cast(), 200, 0) },
        200,
    );

    // A log file: not a socket, kept apart.
    let log = tempfile::tempfile().unwrap_or_else(|e| {
        eprintln!("probe-fixture: tempfile: {e}");
        std::process::exit(2)
    });
    // SAFETY: valid fd and buffer.
    check(
        "write log",
        unsafe { libc::write(log.as_raw_fd(), buf.as_ptr().cast(), 123) },
        123,
    );

    // io_uring_enter on a bad fd: fails, but the probe must still count the attempt.
    // SAFETY: a syscall with harmless arguments.
    unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            -1i32,
            0u32,
            0u32,
            0u32,
            std::ptr::null::<u8>(),
            0usize,
        )
    };

    // dup2 over A closes A: its record must be flushed by the dup2, not lost.
    let devnull = std::fs::File::open("/dev/null").unwrap_or_else(|e| {
        eprintln!("probe-fixture: /dev/null: {e}");
        std::process::exit(2)
    });
    // SAFETY: both fds are valid.
    check(
        "dup2",
        unsafe { libc::dup2(devnull.as_raw_fd(), a) } as isize,
        a as usize,
    );

    // Connection B: left open; the process exit must flush it.
    let b = TcpStream::connect(&addr).unwrap_or_else(|e| {
        eprintln!("probe-fixture: connect: {e}");
        std::process::exit(2)
    });
    sendfile_all(b.as_raw_fd(), file.as_raw_fd(), 7_000);
    std::mem::forget(b);

    println!("done {a}");
    let _ = std::io::stdout().flush();
    line.clear();
    let _ = stdin.lock().read_line(&mut line);
    std::process::exit(0);
}

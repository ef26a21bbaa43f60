//! The probe counts this test process's own syscalls exactly: sendfile bytes, write bytes, and one
//! record per connection even when the fd number is reused. Needs root (CI runs as root).

#[path = "../../../proxy/tests/it/support/require.rs"]
#[allow(dead_code)]
mod require;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;
use zerocache_probe::{ClosedFd, Probe, ProbeOptions, WatchTarget, kind};

fn sendfile_all(sock: &TcpStream, file: &std::fs::File, len: usize) {
    let mut off: libc::off_t = 0;
    while (off as usize) < len {
        // SAFETY: valid fds and offset pointer.
        let n = unsafe {
            libc::sendfile(
                sock.as_raw_fd(),
                file.as_raw_fd(),
                &mut off,
                len - off as usize,
            )
        };
        assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
    }
}

async fn next_accepted(rx: &mut tokio::sync::broadcast::Receiver<ClosedFd>, fd: u32) -> ClosedFd {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let r = rx.recv().await.expect("closed record");
            if r.fd == fd && r.accepted {
                return r;
            }
        }
    })
    .await
    .expect("close event within 5 s")
}

/// Serves two connections in a row, each a head and a 100,000-byte sendfile body, and returns
/// their fd numbers once the client has read both whole.
fn serve_two(file: &std::fs::File, body: &[u8]) -> Vec<u32> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let reader = std::thread::spawn(move || {
        let mut total = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).expect("connect");
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).expect("read");
            total.push(buf.len());
        }
        total
    });
    let mut fds = Vec::new();
    for _ in 0..2 {
        let (mut sock, _) = listener.accept().expect("accept");
        (&sock).write_all(b"HTTP/1.1 200 OK\r\n\r\n").expect("head");
        sendfile_all(&sock, file, body.len());
        sock.flush().expect("flush");
        fds.push(sock.as_raw_fd() as u32);
        drop(sock);
    }
    assert_eq!(
        reader.join().expect("reader"),
        vec![19 + body.len(), 19 + body.len()]
    );
    fds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_sendfile_and_write_per_connection() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let probe = Probe::start(ProbeOptions {
        enabled: true,
        watch: vec![WatchTarget::SelfProcess],
        closed_capacity: 100,
    });
    assert!(probe.status().is_attached(), "{:?}", probe.status());
    let mut file = tempfile::tempfile().expect("tempfile");
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    file.write_all(&body).expect("write body");

    // The kernel hands the lowest free number to the next accept, so two connections in a row
    // usually get the same fd; another thread of this process (the probe's reader, tokio) may
    // take that number in between, so a pair that did not reuse it is tried again.
    let mut attempt = 0;
    let (first, second) = loop {
        attempt += 1;
        let mut rx = probe.subscribe_closed();
        let fds = serve_two(&file, &body);
        let first = next_accepted(&mut rx, fds[0]).await;
        let second = next_accepted(&mut rx, fds[1]).await;
        if fds[0] == fds[1] {
            break (first, second);
        }
        assert!(attempt < 10, "no fd number was reused in 10 pairs: {fds:?}");
    };
    assert_ne!(first.generation, second.generation);
    assert!(first.generation != 0 && second.generation != 0);
    for r in [&first, &second] {
        assert!(r.socket);
        assert_eq!(r.counts.by_kind[kind::SENDFILE as usize].bytes, 100_000);
        // std's TcpStream::write is send(2), which the kernel runs as sendto.
        assert_eq!(r.counts.by_kind[kind::SENDTO as usize].bytes, 19);
        assert_eq!(r.counts.by_kind[kind::SENDTO as usize].calls, 1);
        assert_eq!(r.counts.by_kind[kind::SENDFILE as usize].errors, 0);
        assert_eq!(r.counts.zero_copy_bytes(), 100_000);
        assert_eq!(r.counts.copy_bytes(), 19);
    }
    let me = probe
        .snapshot()
        .processes
        .into_iter()
        .find(|p| p.pid == std::process::id())
        .expect("self watched");
    assert!(me.socket.by_kind[kind::SENDFILE as usize].bytes >= 200_000);
}

//! Watching processes other than zerocache, by PID and by name: exact counts per syscall, sockets
//! kept apart from files, records flushed by dup2 and by process exit, and nginx serving a file.
//! Needs root (CI runs as root).

#[path = "../../../proxy/tests/it/support/require.rs"]
#[allow(dead_code)]
mod require;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_probe::{ClosedFd, Probe, ProbeOptions, WatchTarget, kind};

fn probe() -> Probe {
    let p = Probe::start(ProbeOptions {
        enabled: true,
        watch: Vec::new(),
        closed_capacity: 1000,
    });
    assert!(p.status().is_attached(), "{:?}", p.status());
    p
}

async fn wait_closed(
    rx: &mut tokio::sync::broadcast::Receiver<ClosedFd>,
    pred: impl Fn(&ClosedFd) -> bool,
) -> ClosedFd {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = rx.recv().await.expect("closed record");
            if pred(&r) {
                return r;
            }
        }
    })
    .await
    .expect("closed record within 10 s")
}

/// The totals the probe keeps for `pid` once it has seen the process exit.
async fn exited_totals(probe: &Probe, pid: u32) -> zerocache_probe::ProcessTotals {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = probe.snapshot();
        if let Some(p) = snap.processes.iter().find(|p| p.pid == pid && !p.alive) {
            return p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "exit of {pid} not seen: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn bytes(c: &zerocache_probe::FdCounts, k: u32) -> (u64, u64) {
    (c.by_kind[k as usize].calls, c.by_kind[k as usize].bytes)
}

/// Kills its processes when dropped, so a failing test leaves none behind.
struct Crowd(Vec<std::process::Child>);

impl Drop for Crowd {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the fixture and checks every count. `crowd` idle processes are watched first: with
/// `FAST_WATCHED` of them holding the watch indexes that keep records in the kernel's direct fd
/// table, the fixture's records all go through the `FD_RECORDS` hash instead.
async fn fixture_counts(by_name: bool, crowd: u32) {
    let probe = probe();
    let mut rx = probe.subscribe_closed();
    let crowd = Crowd(
        (0..crowd)
            .map(|_| {
                let c = Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .expect("spawn sleep");
                probe.watch(WatchTarget::Pid(c.id()));
                c
            })
            .collect(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sink = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = Vec::new();
            // B is never closed before exit; exit closes it.
            let _ = s.read_to_end(&mut buf);
            got.push(buf.len());
        }
        got
    });
    if by_name {
        // Watch the name before the process exists: the periodic re-resolution must find it, as
        // it finds restarted nginx workers.
        probe.watch(WatchTarget::Comm("probe-fixture".into()));
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_probe-fixture"))
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn fixture");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("ready");
    assert_eq!(line, "ready\n");
    if by_name {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !probe.watched_pids().contains(&pid) {
            assert!(Instant::now() < deadline, "comm target not re-resolved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    } else {
        probe.watch(WatchTarget::Pid(pid));
        assert!(probe.watched_pids().contains(&pid));
    }
    stdin.write_all(b"go\n").expect("go");
    line.clear();
    stdout.read_line(&mut line).expect("done");
    let a_fd: u32 = line
        .trim()
        .strip_prefix("done ")
        .expect("done line")
        .parse()
        .expect("fd");

    // A was closed by dup2.
    let a = wait_closed(&mut rx, |r| r.pid == pid && r.fd == a_fd).await;
    assert!(a.socket && !a.accepted);
    assert_ne!(a.generation, 0);
    assert_eq!(bytes(&a.counts, kind::WRITE), (1, 1000));
    assert_eq!(bytes(&a.counts, kind::SENDFILE).1, 50_000);
    assert_eq!(bytes(&a.counts, kind::WRITEV), (1, 300));
    assert_eq!(bytes(&a.counts, kind::SENDTO), (1, 200));
    assert_eq!(a.counts.zero_copy_bytes(), 50_000);
    assert_eq!(a.counts.copy_bytes(), 1500);

    // Exit flushes B and the files.
    stdin.write_all(b"exit\n").expect("exit");
    assert!(child.wait().expect("wait").success());
    let b = wait_closed(&mut rx, |r| r.pid == pid && r.socket && r.fd != a_fd).await;
    assert_eq!(bytes(&b.counts, kind::SENDFILE).1, 7_000);
    assert_eq!(sink.join().expect("sink"), vec![51_500, 7_000]);

    let totals = exited_totals(&probe, pid).await;
    assert_eq!(totals.comm, "probe-fixture");
    assert_eq!(totals.socket.by_kind[kind::SENDFILE as usize].bytes, 57_000);
    assert_eq!(totals.socket.by_kind[kind::WRITE as usize].bytes, 1000);
    assert_eq!(totals.socket.by_kind[kind::WRITEV as usize].bytes, 300);
    assert_eq!(totals.socket.by_kind[kind::SENDTO as usize].bytes, 200);
    // Files and pipes: the 60,000-byte temp file, the 123-byte log and the "done N" line on
    // stdout. None of it dilutes the socket figures.
    let other = totals.other.by_kind[kind::WRITE as usize].bytes;
    assert_eq!(other, 60_000 + 123 + line.len() as u64);
    assert_eq!(totals.socket.zero_copy_bytes(), 57_000);
    assert_eq!(totals.socket.copy_bytes(), 1500);
    assert_eq!(totals.io_uring_enter, 1);
    assert!(!probe.watched_pids().contains(&pid));
    for c in &crowd.0 {
        assert!(probe.watched_pids().contains(&c.id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_another_process_by_pid() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    fixture_counts(false, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_another_process_by_name() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    fixture_counts(true, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_another_process_through_the_record_hash() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    fixture_counts(false, zerocache_probe::FAST_WATCHED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_nginx_serving_a_file_with_sendfile() {
    if !require::root("loads the eBPF probe") || !require::command("nginx") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("file.bin"), vec![42u8; 100_000]).expect("file");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("b")
        .local_addr()
        .expect("a")
        .port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ }}
http {{ access_log off; sendfile on; tcp_nopush off; keepalive_timeout 5;
  client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft; uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
  server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}
"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("conf");
    let mut nginx = Command::new("nginx")
        .args(["-e", &format!("{d}/error.log"), "-p", &d.to_string(), "-c"])
        .arg(&conf_path)
        .spawn()
        .expect("nginx (installed by cargo xtask setup)");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = nginx.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not start");
        assert!(
            nginx.try_wait().expect("try_wait").is_none(),
            "nginx exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _nginx = Kill(nginx);
    let probe = probe();
    let mut rx = probe.subscribe_closed();
    probe.watch(WatchTarget::Comm("nginx".into()));
    assert!(probe.watched_pids().contains(&pid));

    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut heads = 0u64;
    for i in 0..3 {
        let close = if i == 2 { "Connection: close\r\n" } else { "" };
        s.write_all(format!("GET /file.bin HTTP/1.1\r\nHost: x\r\n{close}\r\n").as_bytes())
            .expect("req");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        let head_len = loop {
            let n = s.read(&mut chunk).expect("read");
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        while buf.len() < head_len + 100_000 {
            let n = s.read(&mut chunk).expect("read");
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(buf.len(), head_len + 100_000);
        heads += head_len as u64;
    }
    let r = wait_closed(&mut rx, |r| r.pid == pid && r.accepted).await;
    assert_eq!(r.counts.zero_copy_bytes(), 300_000);
    assert_eq!(bytes(&r.counts, kind::SENDFILE).1, 300_000);
    assert_eq!(r.counts.copy_bytes(), heads);
    let snap = probe.snapshot();
    let p = snap
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("nginx watched");
    assert_eq!(p.socket.zero_copy_bytes(), 300_000);
    assert_eq!(p.socket.copy_bytes(), heads);
}

/// Watch indexes are reused once more than `MAX_WATCHED` processes have come and gone: every
/// process, the ones given a recycled index included, must show exactly its own bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_watch_indexes_start_from_zero() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let probe = probe();
    for i in 0..zerocache_probe::MAX_WATCHED as usize + 4 {
        let mut cat = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn cat");
        let pid = cat.id();
        probe.watch(WatchTarget::Pid(pid));
        assert!(
            probe.watched_pids().contains(&pid),
            "process {i} not watched"
        );
        let sent = vec![b'x'; 1000 + i];
        let mut stdin = cat.stdin.take().expect("stdin");
        stdin.write_all(&sent).expect("feed cat");
        drop(stdin);
        let mut echoed = Vec::new();
        cat.stdout
            .take()
            .expect("stdout")
            .read_to_end(&mut echoed)
            .expect("read cat");
        assert_eq!(echoed, sent);
        assert!(cat.wait().expect("wait").success());
        let totals = exited_totals(&probe, pid).await;
        let write = &totals.other.by_kind[kind::WRITE as usize];
        assert_eq!(write.bytes, 1000 + i as u64, "process {i}");
        assert_eq!(
            totals.socket.copy_bytes() + totals.socket.zero_copy_bytes(),
            0
        );
    }
}

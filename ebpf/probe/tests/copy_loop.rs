//! The copy-loop rule itself, on a scripted process: bytes read from a sysfs file are not file
//! bytes (excluded by superblock magic), pending bytes decay after 1 s without a file read, a
//! send takes `min(pending, sent)`, read, readv, preadv, preadv2 and pread64 all count, and each
//! connection gets its own copy-loop bytes. And the read
//! programs are attached only while detection is on and something is watched. Needs root.

#[path = "../../../proxy/tests/it/support/require.rs"]
#[allow(dead_code)]
mod require;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_probe::{ClosedFd, Probe, ProbeOptions, WatchTarget};

/// Connects A, B, C, D; reads 100,000 bytes of sysfs and sends them on A; reads 50,000 file
/// bytes, waits 1.2 s and sends 50,000 on B; reads 30,000 file bytes and sends 20,000 twice on C;
/// reads 10,000 file bytes each with readv, preadv, preadv2 and pread64 and sends 40,000 on D.
const SCRIPT: &str = r#"
import os, socket, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
a, b, c, d = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
print("ready", flush=True)
sys.stdin.readline()
def read(p, n):
    fd = os.open(p, os.O_RDONLY)
    got = 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            break
        got += len(chunk)
    os.close(fd)
    return got
assert read("/sys/kernel/btf/vmlinux", 100000) == 100000
a.sendall(b"a" * 100000)
assert read(path, 50000) == 50000
time.sleep(1.2)
b.sendall(b"b" * 50000)
assert read(path, 30000) == 30000
c.sendall(b"c" * 20000)
c.sendall(b"c" * 20000)
fd = os.open(path, os.O_RDONLY)
assert os.readv(fd, [bytearray(10000)]) == 10000
assert os.preadv(fd, [bytearray(10000)], 0) == 10000
assert os.preadv(fd, [bytearray(10000)], 0, os.RWF_NOWAIT) == 10000
assert len(os.pread(fd, 10000, 0)) == 10000
os.close(fd)
d.sendall(b"d" * 40000)
for s in (a, b, c, d):
    s.close()
print("done", flush=True)
sys.stdin.readline()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysfs_is_not_a_file_pending_decays_and_sends_take_the_minimum() {
    if !require::root("loads the eBPF probe") || !require::command("python3") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("data.bin");
    std::fs::write(&file, vec![9u8; 100_000]).expect("file");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let probe = Probe::start(ProbeOptions {
        enabled: true,
        watch: Vec::new(),
        closed_capacity: 100,
    });
    assert!(probe.status().is_attached(), "{:?}", probe.status());
    probe.set_copy_loop(true);
    assert!(!probe.copy_loop().attached, "nothing watched yet");
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, &port.to_string()])
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let sinks: Vec<_> = (0..4)
        .map(|_| {
            let (mut s, _) = listener.accept().expect("accept");
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = s.read_to_end(&mut v);
                v.len()
            })
        })
        .collect();
    let mut line = String::new();
    stdout.read_line(&mut line).expect("ready");
    assert_eq!(line, "ready\n");
    let mut rx = probe.subscribe_closed();
    probe.watch(WatchTarget::Pid(pid));
    assert!(probe.copy_loop().attached, "{:?}", probe.copy_loop());
    stdin.write_all(b"go\n").expect("go");
    line.clear();
    stdout.read_line(&mut line).expect("done");
    assert_eq!(line, "done\n");
    let mut closed: Vec<ClosedFd> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while closed.len() < 4 {
        let r = tokio::time::timeout_at(deadline.into(), rx.recv())
            .await
            .expect("four closed sockets within 10 s")
            .expect("closed record");
        if r.pid == pid && r.socket {
            closed.push(r);
        }
    }
    closed.sort_by_key(|r| r.fd);
    let sent: Vec<u64> = closed.iter().map(|r| r.counts.copy_bytes()).collect();
    assert_eq!(sent, vec![100_000, 50_000, 40_000, 40_000]);
    let looped: Vec<u64> = closed.iter().map(|r| r.counts.copy_loop_bytes).collect();
    assert_eq!(
        looped,
        vec![0, 0, 30_000, 40_000],
        "sysfs, decayed, min(30,000, 40,000), the four other reads"
    );
    let totals = probe
        .snapshot()
        .processes
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("totals");
    assert_eq!(totals.file_read_bytes, 120_000);
    assert_eq!(totals.file_read_calls, 6);
    assert_eq!(totals.copy_loop_bytes, 70_000);
    stdin.write_all(b"exit\n").expect("exit");
    assert!(child.wait().expect("wait").success());
    let got: Vec<usize> = sinks.into_iter().map(|t| t.join().expect("sink")).collect();
    assert_eq!(got, vec![100_000, 50_000, 40_000, 40_000]);
    // The process is gone: nothing is watched, and the read programs come off.
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe.copy_loop().attached {
        assert!(Instant::now() < deadline, "read programs still attached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(probe.watched_pids().is_empty());
}

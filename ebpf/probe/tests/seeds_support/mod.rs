//! What the seed tests share: a seed server in its own directory with the 16 MiB file, a client
//! that sends requests one after another on one connection, and the exact expectations.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_probe::{ClosedFd, Probe, WatchTarget, kind};

/// The file every seed serves: 16 MiB, as in the issue (Go's 16 MB transfer).
pub const FILE_SIZE: u64 = 16 << 20;
/// Requests per connection, sent one after another.
pub const REQUESTS: u64 = 3;

/// xtask/seeds/.
pub fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../xtask/seeds")
}

/// Which path the server's body bytes must have taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every body byte via sendfile, 0 copy-loop bytes.
    ZeroCopy,
    /// Every body byte a copy-loop byte.
    CopyLoop,
}

/// A running seed server; killed when dropped.
pub struct Seed {
    pub name: String,
    pub child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Seed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Seed {
    /// Makes a directory with www/file.bin (16 MiB), picks a port, runs `command(port, file, dir)`
    /// and waits until the port accepts.
    pub fn spawn(name: &str, command: impl FnOnce(u16, &Path, &Path) -> Command) -> Seed {
        let dir = tempfile::tempdir().expect("tempdir");
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).expect("www");
        let file = www.join("file.bin");
        let body: Vec<u8> = (0..FILE_SIZE).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, body).expect("file");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut cmd = command(port, &file, dir.path());
        cmd.stdout(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("{name}: spawn: {e}"));
        let mut seed = Seed {
            name: name.to_string(),
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{name} did not listen");
            if let Ok(Some(st)) = seed.child.try_wait() {
                panic!("{name} exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        seed
    }
}

/// Sends `requests` GETs one after another on one connection (the last with
/// `Connection: close`), checks each body, and returns the response head bytes received and the
/// client's address.
pub fn client(port: u16, requests: u64) -> (u64, std::net::SocketAddr) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let me = s.local_addr().expect("local addr");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut heads = 0;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..requests {
        let close = if i + 1 == requests {
            "Connection: close\r\n"
        } else {
            ""
        };
        s.write_all(format!("GET /file.bin HTTP/1.1\r\nHost: seed\r\n{close}\r\n").as_bytes())
            .expect("request");
        let mut got: Vec<u8> = Vec::new();
        let head_len = loop {
            let n = s.read(&mut buf).expect("read head");
            assert!(n > 0, "closed before the head");
            got.extend_from_slice(&buf[..n]);
            if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&got[..head_len]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(
            head.contains(&format!("content-length: {FILE_SIZE}\r\n")),
            "{head}"
        );
        let mut body = (got.len() - head_len) as u64;
        let mut sum: u64 = got[head_len..].iter().map(|b| *b as u64).sum();
        let mut offset = body;
        let mut first_bad = None;
        for (i, b) in got[head_len..].iter().enumerate() {
            if *b as u64 != i as u64 % 251 && first_bad.is_none() {
                first_bad = Some(i as u64);
            }
        }
        while body < FILE_SIZE {
            let n = s.read(&mut buf).expect("read body");
            assert!(n > 0, "closed after {body} body bytes");
            for (i, b) in buf[..n].iter().enumerate() {
                if *b as u64 != (offset + i as u64) % 251 && first_bad.is_none() {
                    first_bad = Some(offset + i as u64);
                }
            }
            sum += buf[..n].iter().map(|b| *b as u64).sum::<u64>();
            body += n as u64;
            offset += n as u64;
        }
        assert_eq!(body, FILE_SIZE, "no bytes beyond the body");
        assert_eq!(first_bad, None, "body differs from the file");
        let _ = sum;
        heads += head_len as u64;
    }
    (heads, me)
}

/// Watches the seed, runs the client, and checks the connection's closed record.
pub async fn exchange(probe: &Probe, seed: &Seed, expect: Expect) -> ClosedFd {
    let pid = seed.child.id();
    let port = seed.port;
    // One request before watching: a JVM loads the classes of its first response from
    // lib/modules with pread64, file bytes that the first head would otherwise match. Reads
    // before the watch starts never count.
    tokio::task::spawn_blocking(move || client(port, 1))
        .await
        .expect("warm-up client");
    let mut rx = probe.subscribe_closed();
    probe.watch(WatchTarget::Pid(pid));
    assert!(
        probe.watched_pids().contains(&pid),
        "{} not watched",
        seed.name
    );
    let (heads, me) = tokio::task::spawn_blocking(move || client(port, REQUESTS))
        .await
        .expect("client");
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = rx.recv().await.expect("closed record");
            if r.pid == pid && r.accepted && r.counts.calls() > 0 {
                return r;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{}: no closed connection record", seed.name));
    // The peer, read from /proc when the kernel reported the accept.
    assert_eq!(
        probe.take_peer(pid, r.fd, r.generation),
        Some(me),
        "{}: peer",
        seed.name
    );
    let body = REQUESTS * FILE_SIZE;
    let sendfile = r.counts.by_kind[kind::SENDFILE as usize].bytes;
    let name = &seed.name;
    match expect {
        Expect::ZeroCopy => {
            assert_eq!(sendfile, body, "{name}: body bytes via sendfile");
            assert_eq!(r.counts.copy_loop_bytes, 0, "{name}: copy-loop bytes");
            assert_eq!(
                r.counts.copy_bytes(),
                heads,
                "{name}: copied bytes are the heads"
            );
        }
        Expect::CopyLoop => {
            assert_eq!(sendfile, 0, "{name}: no sendfile");
            // One CI run under a foreign load saw 0 copy-loop bytes here once; the process's
            // file reads and the read side's state say which half of the rule missed next time.
            let totals = probe
                .snapshot()
                .processes
                .into_iter()
                .find(|p| p.pid == pid);
            assert_eq!(
                r.counts.copy_loop_bytes,
                body,
                "{name}: copy-loop bytes; read side {:?}; process {:?}",
                probe.copy_loop(),
                totals
            );
            assert_eq!(r.counts.copy_bytes(), body + heads, "{name}: copied bytes");
        }
    }
    r
}

/// Builds a seed once per test run into `CARGO_TARGET_TMPDIR/seeds/NAME` and returns its path.
/// `build(out)` returns the command that writes it.
pub fn build_once(name: &str, build: impl Fn(&Path) -> Command) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("seeds")
        .join(name);
    std::fs::create_dir_all(out.parent().expect("parent")).expect("seeds dir");
    // The build's output is captured, never inherited: a compiler writing to the test binary's
    // stdout would cut libtest's "test NAME ... ok" line (a JVM's fatal-error report did, in a
    // 2 GiB emulated guest). A toolchain that crashed (a signal, or a JVM's fatal error) is run
    // once more, its first output printed; a build that fails twice, or on its merits, fails.
    let mut first_crash = None;
    for attempt in 0..2 {
        let o = build(&out)
            .output()
            .unwrap_or_else(|e| panic!("building seed {name}: {e}"));
        if o.status.success() {
            if let Some(c) = first_crash {
                eprintln!("building seed {name}: the first attempt crashed, the second built: {c}");
            }
            return out;
        }
        let text = format!(
            "{}; stdout: {}; stderr: {}",
            o.status,
            tail(&o.stdout),
            tail(&o.stderr)
        );
        let crashed = o.status.code().is_none()
            || [&o.stdout, &o.stderr].iter().any(|b| {
                let t = String::from_utf8_lossy(b);
                t.contains("# A fatal error") || t.contains("insufficient memory")
            });
        if !crashed || attempt == 1 {
            panic!("building seed {name}: {text}");
        }
        first_crash = Some(text);
    }
    unreachable!("the loop returns or panics")
}

/// The last 1,000 bytes of a tool's output, for a failure message.
fn tail(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(&b[b.len().saturating_sub(1000)..]);
    t.trim().replace('\n', " / ")
}

/// The JDK the Java seed is tested with: OpenJDK 17, Debian bookworm's default-jdk-headless.
/// Pinned because newer JDKs add fast paths to transferTo and Files.copy.
pub const JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

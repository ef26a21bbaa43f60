//! User-space instructions per request, counted by callgrind: what a config adds to a hit's
//! own work, the same on every run. The CPU time of a run on a shared 2-core VM moves by more
//! than the 5% `bench --rules` looks for (two identical proxies read 3% apart in one run, and
//! one config 1.13× and 1.21× in two), while an instruction count moves by a few in 10,000.
//! The kernel's part is not in it: a rule adds no syscall (the same `recvfrom`, `sendto` and
//! `sendfile` a hit, `perf stat` on the syscall tracepoints), so what it costs is here.

use anyhow::Context;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Requests counted, after as many again to warm up.
pub(crate) const COUNTED: usize = 3000;

/// Runs `bin` with `conf` (listening on `addr`) under callgrind on CPU 0 and answers its
/// instructions per `GET path` over one keep-alive connection, the count zeroed after a warm-up.
pub(crate) fn per_request(
    bin: &Path,
    conf: &Path,
    addr: SocketAddr,
    path: &str,
) -> anyhow::Result<f64> {
    let out = conf.with_file_name("callgrind.out");
    let dump = conf.with_file_name("callgrind.out.1");
    let _ = std::fs::remove_file(&dump);
    let mut child = Command::new("taskset")
        .args(["-c", "0", "valgrind", "--tool=callgrind"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin)
        .args(["run", "--config"])
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("running valgrind (installed by cargo xtask setup)")?;
    let result = (|| {
        // Under callgrind the proxy starts some 50 times slower.
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut sock = loop {
            if let Ok(s) = TcpStream::connect(addr) {
                break s;
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("zerocache under callgrind exited before listening ({status})");
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no listener on {addr} under callgrind"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut buf = Vec::new();
        get(&mut sock, path, COUNTED, &mut buf)?;
        control(&["-z", &child.id().to_string()])?;
        get(&mut sock, path, COUNTED, &mut buf)?;
        control(&["-d", &child.id().to_string()])?;
        let text = std::fs::read_to_string(&dump)
            .with_context(|| format!("reading {}", dump.display()))?;
        let total: u64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("totals:")
                    .or_else(|| l.strip_prefix("summary:"))
            })
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no totals in the callgrind dump")?;
        Ok(total as f64 / COUNTED as f64)
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn control(args: &[&str]) -> anyhow::Result<()> {
    let s = Command::new("callgrind_control")
        .args(args)
        .stdout(Stdio::null())
        .status()
        .context("running callgrind_control")?;
    anyhow::ensure!(s.success(), "callgrind_control {args:?}: {s}");
    Ok(())
}

/// `n` GETs of `path` on `sock`, each answer read whole (by its `Content-Length`), 200 or fail.
fn get(sock: &mut TcpStream, path: &str, n: usize, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench.example\r\n\r\n");
    let mut chunk = [0u8; 16384];
    for _ in 0..n {
        sock.write_all(req.as_bytes())?;
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                anyhow::ensure!(head.starts_with("http/1.1 200"), "not a 200: {head}");
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .context("no content-length")?;
                if buf.len() >= end + 4 + len {
                    buf.drain(..end + 4 + len);
                    break;
                }
            }
            let got = sock.read(&mut chunk)?;
            anyhow::ensure!(got > 0, "the proxy closed the connection");
            buf.extend_from_slice(&chunk[..got]);
        }
    }
    Ok(())
}

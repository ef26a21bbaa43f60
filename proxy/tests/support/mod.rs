//! Test support: a real origin, the real `zerocache` binary with a generated config, and a small
//! raw HTTP/1.1 client that keeps the exact bytes it received.
#![allow(dead_code, unused_imports)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use zerocache_origin::{Framing, Origin, Reply, body};

/// Polls `read` every 10 ms for up to `within` until it returns `want`, then asserts that it
/// does: for what the proxy does just after the client has its answer (accounting, metrics,
/// committing an entry, releasing a connection, re-pinning a worker).
pub fn assert_eventually_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    within: Duration,
    mut read: impl FnMut() -> T,
    want: T,
) {
    let deadline = Instant::now() + within;
    let mut got = read();
    while got != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        got = read();
    }
    assert_eq!(got, want, "{what}");
}

/// Runs `start` up to three times, for a proxy that exited before listening because a port was
/// taken between `free_port` and its bind.
fn retry_on_other_ports(mut start: impl FnMut() -> Option<Proxy>) -> Proxy {
    for _ in 0..3 {
        if let Some(p) = start() {
            return p;
        }
    }
    panic!("zerocache exited before listening three times (see its errors above)");
}

/// A port free right now on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A running zerocache process; killed on drop.
pub struct Proxy {
    pub child: Child,
    pub addr: SocketAddr,
    pub dashboard: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// Options for a test proxy's config.
#[derive(Clone, Default)]
pub struct Opts {
    pub extra_yaml: String,
    pub cache_yaml: String,
    pub upstream_yaml: String,
    pub dashboard_yaml: String,
    /// Extra keys of the one route (indented 4 spaces).
    pub route_yaml: String,
    pub probe: bool,
    /// Run as nobody with no capabilities at all.
    pub run_as: Option<&'static str>,
    /// Run as nobody with exactly these capabilities (setpriv syntax: `+bpf,+perfmon`).
    pub run_as_caps: Option<String>,
    /// Run under this RLIMIT_NOFILE, soft and hard (through util-linux's `prlimit`).
    pub nofile: Option<u64>,
}

impl Proxy {
    /// Starts zerocache in front of `origin` with a fresh cache directory.
    pub fn start(origin: SocketAddr, opts: Opts) -> Proxy {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        let mut p = Proxy::start_in(origin, &dir, tmp.path(), opts);
        p._tmp = Some(tmp);
        p
    }

    /// Starts zerocache with the cache in `dir` (kept by the caller, for restart tests).
    pub fn start_in(origin: SocketAddr, dir: &Path, config_dir: &Path, opts: Opts) -> Proxy {
        retry_on_other_ports(|| Proxy::try_start_in(origin, dir, config_dir, &opts))
    }

    /// One try of [`Proxy::start_in`]: `None` if zerocache exited before listening.
    fn try_start_in(
        origin: SocketAddr,
        dir: &Path,
        config_dir: &Path,
        opts: &Opts,
    ) -> Option<Proxy> {
        let port = free_port();
        let dport = free_port();
        let config = config_dir.join(format!("zerocache-{port}.yaml"));
        let yaml = format!(
            "listen: 127.0.0.1:{port}\ncache:\n  path: {dir}\n  max_size: 1GiB\n{cache}upstreams:\n  origin:\n    servers: [\"{origin}\"]\n{up}routes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n{route}dashboard:\n  listen: 127.0.0.1:{dport}\n{dash}probe:\n  enabled: {probe}\n{extra}",
            dir = dir.display(),
            cache = opts.cache_yaml,
            up = opts.upstream_yaml,
            probe = opts.probe,
            extra = opts.extra_yaml,
            dash = opts.dashboard_yaml,
            route = opts.route_yaml,
        );
        std::fs::write(&config, yaml).expect("write config");
        let bin = env!("CARGO_BIN_EXE_zerocache");
        let mut cmd = match (opts.run_as, &opts.run_as_caps) {
            (None, Some(caps)) => {
                let mut c = Command::new("setpriv");
                c.args([
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    &format!("--inh-caps=-all,{caps}"),
                    &format!("--ambient-caps=-all,{caps}"),
                    &format!("--bounding-set=-all,{caps}"),
                    bin,
                ]);
                c
            }
            (Some(user), _) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={user}"),
                    "--regid=nogroup",
                    "--clear-groups",
                    "--inh-caps=-all",
                    "--bounding-set=-all",
                    bin,
                ]);
                c
            }
            (None, None) => Command::new(bin),
        };
        if let Some(n) = opts.nofile {
            // prlimit execs the command: the child is still zerocache itself.
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}"))
                .arg(cmd.get_program())
                .args(cmd.get_args());
            cmd = c;
        }
        let child = cmd
            .args(["run", "--config"])
            .arg(&config)
            .env(
                "RUST_LOG",
                std::env::var("ZEROCACHE_TEST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn zerocache");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let dashboard: SocketAddr = format!("127.0.0.1:{dport}").parse().expect("addr");
        let mut p = Proxy {
            child,
            addr,
            dashboard,
            dir: dir.to_path_buf(),
            config,
            _tmp: None,
        };
        p.wait_ready().then_some(p)
    }

    /// Starts zerocache with a hand-written config; `{port}` and `{dport}` in `yaml` become the
    /// proxy's and the dashboard's ports.
    pub fn from_yaml(yaml: &str, dir: &Path) -> Proxy {
        retry_on_other_ports(|| Proxy::try_from_yaml(yaml, dir))
    }

    /// One try of [`Proxy::from_yaml`]: `None` if zerocache exited before listening.
    fn try_from_yaml(yaml: &str, dir: &Path) -> Option<Proxy> {
        let port = free_port();
        let dport = free_port();
        let config = dir.join(format!("zerocache-{port}.yaml"));
        let yaml = yaml
            .replace("{port}", &port.to_string())
            .replace("{dport}", &dport.to_string());
        std::fs::write(&config, yaml).expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args(["run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn zerocache");
        let mut p = Proxy {
            child,
            addr: format!("127.0.0.1:{port}").parse().expect("addr"),
            dashboard: format!("127.0.0.1:{dport}").parse().expect("addr"),
            dir: dir.join("cache"),
            config,
            _tmp: None,
        };
        p.wait_ready().then_some(p)
    }

    /// Waits until both ports accept connections (true), or the process exits first (false: a
    /// port picked by `free_port` was taken in between, by another test or by an outgoing
    /// connection's ephemeral port; its error is on stderr).
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                eprintln!(
                    "zerocache on {} exited before listening: {status}",
                    self.addr
                );
                return false;
            }
            if TcpStream::connect(self.addr).is_ok() && TcpStream::connect(self.dashboard).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("zerocache did not start listening on {}", self.addr);
    }

    /// A new client connection to the proxy.
    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// GET `path` on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        self.client().get(path, &[])
    }

    /// GETs a dashboard path and parses JSON.
    pub fn api(&self, path: &str) -> serde_json::Value {
        let mut c = Client::connect_dashboard(self.dashboard);
        let r = c.get(path, &[("Connection", "close")]);
        assert_eq!(r.status, 200, "{path}");
        serde_json::from_slice(&r.body).expect("json")
    }

    /// POSTs `{"url": ...}` or `{"prefix": ...}` to the purge API; returns (status, JSON).
    pub fn purge(&self, json: &str) -> (u16, serde_json::Value) {
        let mut c = Client::connect_dashboard(self.dashboard);
        let r = c.send_with_body(
            "POST",
            "/api/purge",
            &[
                ("Content-Type", "application/json"),
                ("Connection", "close"),
            ],
            json.as_bytes(),
        );
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> String {
        let mut c = Client::connect_dashboard(self.dashboard);
        let r = c.get("/metrics", &[("Connection", "close")]);
        String::from_utf8(r.body).expect("utf8")
    }

    /// SIGKILL and wait.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as received.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Bytes of the head (status line through the blank line).
    pub head_len: usize,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// `Cache-Status` without its `ttl` parameter (which moves with the clock).
    pub fn cache_status(&self) -> Option<String> {
        self.header("cache-status").map(|v| {
            v.split("; ")
                .filter(|p| !p.starts_with("ttl="))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    pub fn x_cache(&self) -> &str {
        self.header("x-cache").unwrap_or("")
    }
}

/// A raw keep-alive HTTP/1.1 client.
pub struct Client {
    pub sock: TcpStream,
    buf: Vec<u8>,
    /// The `Host` it sends: `test.example`, or the dashboard's own address (which only answers
    /// to its own names).
    pub host: String,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        sock.set_nodelay(true).expect("nodelay");
        Client {
            sock,
            buf: Vec::new(),
            host: "test.example".into(),
        }
    }

    /// A client for the dashboard at `addr`, sending `Host: addr` as a browser would.
    pub fn connect_dashboard(addr: SocketAddr) -> Client {
        let mut c = Client::connect(addr);
        c.host = addr.to_string();
        c
    }

    /// Sends raw bytes.
    pub fn send(&mut self, raw: &[u8]) {
        self.sock.write_all(raw).expect("send");
    }

    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.send(req.as_bytes());
        self.read_response(method == "HEAD")
    }

    /// Sends a request with a body.
    pub fn send_with_body(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut raw = req.into_bytes();
        raw.extend_from_slice(body);
        self.send(&raw);
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.request("GET", path, headers)
    }

    fn fill(&mut self) -> usize {
        // Read straight into the buffer's spare capacity: no intermediate copy.
        let len = self.buf.len();
        self.buf.resize(len + 256 * 1024, 0);
        let n = self.sock.read(&mut self.buf[len..]).expect("read");
        self.buf.truncate(len + n);
        n
    }

    /// Reads one response; `Ok(None)`-like panics are test failures.
    pub fn read_response(&mut self, head_only: bool) -> Response {
        self.try_read_response(head_only)
            .expect("complete response")
    }

    /// Reads one final response (skipping 1xx), or None if the connection closed first.
    pub fn try_read_response(&mut self, head_only: bool) -> Option<Response> {
        loop {
            let (status, headers, n) = loop {
                let mut h = [httparse::EMPTY_HEADER; 64];
                let mut r = httparse::Response::new(&mut h);
                if let Ok(httparse::Status::Complete(n)) = r.parse(&self.buf) {
                    let headers: Vec<(String, String)> = r
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    break (r.code.unwrap_or(0), headers, n);
                }
                if self.fill() == 0 {
                    return None;
                }
            };
            self.buf.drain(..n);
            let mut resp = Response {
                status,
                headers,
                body: Vec::new(),
                head_len: n,
                chunked: false,
            };
            if (100..200).contains(&status) {
                continue;
            }
            if head_only || status == 204 || status == 304 {
                return Some(resp);
            }
            if let Some(cl) = resp.header("content-length") {
                let cl: usize = cl.parse().expect("content-length");
                while self.buf.len() < cl {
                    if self.fill() == 0 {
                        return None;
                    }
                }
                // split_off + swap are memcpy; drain().collect() goes byte by byte in a debug
                // build and would put milliseconds of test-client time into latency figures.
                let rest = self.buf.split_off(cl);
                resp.body = std::mem::replace(&mut self.buf, rest);
            } else if resp
                .header("transfer-encoding")
                .is_some_and(|t| t.contains("chunked"))
            {
                resp.chunked = true;
                loop {
                    let line_end = loop {
                        if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                            break p;
                        }
                        if self.fill() == 0 {
                            return None;
                        }
                    };
                    let size = usize::from_str_radix(
                        std::str::from_utf8(&self.buf[..line_end])
                            .expect("utf8")
                            .trim(),
                        16,
                    )
                    .expect("chunk size");
                    self.buf.drain(..line_end + 2);
                    while self.buf.len() < size + 2 {
                        if self.fill() == 0 {
                            return None;
                        }
                    }
                    resp.body.extend_from_slice(&self.buf[..size]);
                    self.buf.drain(..size + 2);
                    if size == 0 {
                        break;
                    }
                }
            } else {
                loop {
                    if self.fill() == 0 {
                        break;
                    }
                }
                resp.body = std::mem::take(&mut self.buf);
            }
            return Some(resp);
        }
    }

    /// True if the server has closed the connection (read returns EOF).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.sock.read(&mut b), Ok(0) | Err(_))
    }
}

/// Asks for the 64 MiB object with `Connection: close` and reads it slowly on a thread, so the
/// transfer stays in flight for a while; the thread returns every byte received, head included.
pub fn slow_64mib_hit(proxy: &Proxy, pause: Duration) -> std::thread::JoinHandle<Vec<u8>> {
    let mut c = proxy.client();
    c.send(b"GET /obj/67108864 HTTP/1.1\r\nHost: test.example\r\nConnection: close\r\n\r\n");
    std::thread::spawn(move || {
        let mut all = Vec::with_capacity((64 << 20) + 1024);
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = c.sock.read(&mut chunk).expect("read");
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&chunk[..n]);
            std::thread::sleep(pause);
        }
    })
}

/// Asserts that `all` is a complete 64 MiB hit: head, then every body byte exact.
pub fn assert_complete_64mib_hit(all: &[u8]) {
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let head = String::from_utf8_lossy(&all[..head_end]);
    assert!(head.contains("X-Cache: HIT"), "{head}");
    assert_eq!(
        all.len() - head_end,
        64 << 20,
        "the in-flight transfer must finish intact"
    );
    assert!(all[head_end..] == body(64 << 20)[..], "body bytes differ");
}

/// The value of one series (name and labels exactly as printed) in a `/metrics` text.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

/// How many data-plane workers `/metrics` lists.
pub fn worker_count(proxy: &Proxy) -> usize {
    let m = proxy.metrics();
    m.lines()
        .filter(|l| l.starts_with("zerocache_worker_connections{"))
        .count()
}

/// Open connections per worker, from `/metrics`.
pub fn worker_loads(proxy: &Proxy, workers: usize) -> Vec<usize> {
    let m = proxy.metrics();
    assert!(!m.contains(&format!("worker=\"{workers}\"")), "{m}");
    (0..workers)
        .map(|w| {
            let series = format!("zerocache_worker_connections{{worker=\"{w}\"}} ");
            let line = m.lines().find(|l| l.starts_with(&series));
            let line = line.unwrap_or_else(|| panic!("no {series}in\n{m}"));
            line[series.len()..].parse().expect("count")
        })
        .collect()
}

/// The allowed-CPU list (`0-1`, `1`) of each data-plane worker thread of `pid`, by worker number.
pub fn worker_cpu_lists(pid: u32) -> Vec<String> {
    let mut out: Vec<(usize, String)> = thread_cpu_lists(pid)
        .into_iter()
        .filter_map(|(name, list)| {
            let w = name.strip_prefix("zerocache-w")?;
            Some((w.parse().expect("worker number"), list))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, l)| l).collect()
}

/// Waits until every worker's count is back to zero.
pub fn assert_workers_drain(proxy: &Proxy, workers: usize) {
    assert_eventually_eq(
        "connections released",
        Duration::from_secs(5),
        || worker_loads(proxy, workers),
        vec![0; workers],
    );
}

/// Each thread of process `pid` as (name, allowed-CPU list such as `0-1`), sorted. Threads that
/// exit while being read are skipped.
pub fn thread_cpu_lists(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let Ok(t) = t else { continue };
        let t = t.path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(t.join("comm")),
            std::fs::read_to_string(t.join("status")),
        ) else {
            continue;
        };
        out.push((comm.trim().to_string(), cpus_allowed(&status)));
    }
    out.sort();
    out
}

/// The allowed-CPU list of process `pid` itself.
pub fn process_cpu_list(pid: u32) -> String {
    cpus_allowed(&std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status"))
}

/// The `Cpus_allowed_list` field of a `/proc/.../status` text.
fn cpus_allowed(status: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

/// Starts a tokio runtime on a background thread for the origin; returns the origin.
pub fn origin() -> (Origin, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let o = rt.block_on(Origin::start()).expect("origin");
    (o, rt)
}

/// Body bytes the proxy sent through sendfile so far (hits, stale hits, revalidated hits).
pub fn zero_copy_bytes(proxy: &Proxy) -> u64 {
    let s = proxy.api("/api/stats?history=false");
    ["HIT", "STALE", "REVALIDATED"]
        .iter()
        .map(|c| {
            s["body_bytes"][format!("{c}/zerocopy")]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// A response that must be a hit of `body`, sent through sendfile.
pub fn assert_hit(proxy: &Proxy, r: &Response, x_cache: &str, body: &[u8], before: u64) {
    assert_eq!(r.x_cache(), x_cache, "{:?}", r.headers);
    assert_eq!(r.body, body);
    // The worker records a response once its last send returns, which can be just after the
    // client has read it all: wait for the count, then require it exactly.
    assert_eventually_eq(
        "the hit's body went through sendfile",
        Duration::from_secs(5),
        || zero_copy_bytes(proxy) - before,
        body.len() as u64,
    );
}

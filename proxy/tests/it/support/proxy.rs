//! The real `zerocache` binary with a generated config, and the origin it fronts.

use super::{Client, Response};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_origin::Origin;

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

/// A port below the kernel's ephemeral range (32768-60999 here), free on `ip` now, and never
/// given twice by this process: for a node a test stops and starts again at the same address.
/// An ephemeral port from [`free_port`] can be taken while such a node is down, as another
/// test's `free_port` or as an outgoing connection's source port, and the node then exits at
/// its restart ("exited before listening", seen in CI).
pub fn restartable_port(ip: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919) % 20_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 20_000, "no free port below the ephemeral range on {ip}");
        let port = 10_000 + (start + n) % 20_000;
        let port = u16::try_from(port).expect("below 30000");
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
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
    /// Keys of `debug:` (indented 2 spaces). `debug.adjustable_clock` is always on, so a test
    /// can age entries with [`Proxy::advance_clock`] instead of sleeping.
    pub debug_yaml: String,
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
    /// Options of the `listen` entry (`proxy_protocol: true, ...`), written as a map with them.
    pub listen_options: String,
    /// Extra environment (`NOTIFY_SOCKET`, ...).
    pub env: Vec<(&'static str, String)>,
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
        // A test that sizes the cache says so in its cache keys.
        let max_size = if opts.cache_yaml.contains("max_size:") {
            ""
        } else {
            "  max_size: 1GiB\n"
        };
        let listen = if opts.listen_options.is_empty() {
            format!("127.0.0.1:{port}")
        } else {
            format!("{{ addr: \"127.0.0.1:{port}\", {} }}", opts.listen_options)
        };
        let yaml = format!(
            "listen: {listen}\ncache:\n  path: {dir}\n{max_size}{cache}upstreams:\n  origin:\n    servers: [\"{origin}\"]\n{up}routes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n{route}dashboard:\n  listen: 127.0.0.1:{dport}\n{dash}probe:\n  enabled: {probe}\ndebug:\n  adjustable_clock: true\n{debug}{extra}",
            dir = dir.display(),
            cache = opts.cache_yaml,
            up = opts.upstream_yaml,
            probe = opts.probe,
            extra = opts.extra_yaml,
            dash = opts.dashboard_yaml,
            route = opts.route_yaml,
            debug = opts.debug_yaml,
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
            .env("ZEROCACHE_TEST_CLOCK", "1")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
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

    /// Ages every cached response by `secs` seconds (`POST /api/debug/clock`), so a test of
    /// freshness need not sleep. Returns the clock's whole offset.
    pub fn advance_clock(&self, secs: u64) -> u64 {
        let mut c = Client::connect_dashboard(self.dashboard);
        let r = c.send_with_body(
            "POST",
            "/api/debug/clock",
            &[
                ("Content-Type", "application/json"),
                ("Connection", "close"),
            ],
            format!("{{\"advance_secs\": {secs}}}").as_bytes(),
        );
        assert_eq!(
            r.status,
            200,
            "advance the clock: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        v["offset_secs"].as_u64().expect("offset_secs")
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

/// Waits until `pid_file` names `pid`: the proxy writes it once its workers accept, a moment
/// after its ports (which the kernel accepts on from bind) answer a connect.
pub fn wait_pid_file(pid_file: &Path, pid: u32) {
    let want = format!("{pid}\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(pid_file).ok().as_deref() != Some(want.as_str()) {
        assert!(
            Instant::now() < deadline,
            "{} never named pid {pid}",
            pid_file.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

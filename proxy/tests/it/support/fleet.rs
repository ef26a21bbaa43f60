//! A fleet of real zerocache processes on distinct loopback addresses (127.0.0.2, .3, ...: the
//! whole 127.0.0.0/8 is local), all in front of one origin, each with its own cache directory
//! and dashboard. Nodes can be killed and started again on the same address, port and cache.

use super::{Client, free_port, restartable_port};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The secret every test fleet shares.
pub const FLEET_SECRET: &str = "fleet-test-secret-0123456789";

/// One member.
pub struct FleetNode {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub dashboard: SocketAddr,
    pub config: PathBuf,
    pub cache: PathBuf,
    /// The node's `pid_file`.
    pub pid_file: PathBuf,
    /// A process that an upgrade of this node started (nobody's child once its parent exits):
    /// killed with the node.
    pub successor: Option<u32>,
}

/// The members and the directory that holds their caches and configs.
pub struct TestFleet {
    pub nodes: Vec<FleetNode>,
    pub dir: tempfile::TempDir,
}

impl TestFleet {
    /// Starts `n` nodes in front of `origin`. `fleet_extra` is added to each node's `fleet:`
    /// section (indented 2 spaces); `probe` enables the probe on every node.
    pub fn start(origin: SocketAddr, n: usize, fleet_extra: &str, probe: bool) -> TestFleet {
        TestFleet::start_with(origin, n, fleet_extra, probe, "")
    }

    /// [`TestFleet::start`] with `upstream_extra` added to the origin's upstream group
    /// (indented 4 spaces).
    pub fn start_with(
        origin: SocketAddr,
        n: usize,
        fleet_extra: &str,
        probe: bool,
        upstream_extra: &str,
    ) -> TestFleet {
        TestFleet::start_routed(origin, n, fleet_extra, probe, upstream_extra, "")
    }

    /// [`TestFleet::start_with`] with `route_extra` added to the one route (indented 4 spaces).
    pub fn start_routed(
        origin: SocketAddr,
        n: usize,
        fleet_extra: &str,
        probe: bool,
        upstream_extra: &str,
        route_extra: &str,
    ) -> TestFleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| {
                let ip = format!("127.0.0.{}", i + 2);
                let port = restartable_port(&ip);
                format!("{ip}:{port}").parse().expect("addr")
            })
            .collect();
        let peers = addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let dashboard: SocketAddr = format!("127.0.0.1:{}", restartable_port("127.0.0.1"))
                .parse()
                .expect("a");
            let cache = dir.path().join(format!("cache-{i}"));
            let config = dir.path().join(format!("node-{i}.yaml"));
            let pid_file = dir.path().join(format!("node-{i}.pid"));
            let yaml = format!(
                "pid_file: {pid}\nlisten: {addr}\ncache:\n  path: {cache}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\n{upstream_extra}routes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\n{route_extra}dashboard:\n  listen: {dashboard}\nprobe:\n  enabled: {probe}\nfleet:\n  self: {addr}\n  peers: [{peers}]\n  secret: {FLEET_SECRET}\n  health_interval: 200ms\n  health_timeout: 500ms\n{fleet_extra}",
                cache = cache.display(),
                pid = pid_file.display(),
            );
            std::fs::write(&config, yaml).expect("write config");
            nodes.push(FleetNode {
                child: None,
                addr: *addr,
                dashboard,
                config,
                cache,
                pid_file,
                successor: None,
            });
        }
        let mut f = TestFleet { nodes, dir };
        for i in 0..n {
            f.start_node(i);
        }
        for i in 0..n {
            f.wait_peers_up(i, n - 1);
        }
        f
    }

    /// Starts node `i` (again) with its config and cache; waits until it listens.
    pub fn start_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let child = Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args(["run", "--config"])
            .arg(&node.config)
            // The catch-up's warnings too: one that failed or wiped says why in CI's log.
            .env(
                "RUST_LOG",
                std::env::var("ZEROCACHE_TEST_LOG").unwrap_or_else(|_| {
                    "error,zerocache::fleet::health=warn,zerocache::fleet::epoch=warn".into()
                }),
            )
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn zerocache");
        node.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(node.addr).is_err() || TcpStream::connect(node.dashboard).is_err()
        {
            if let Some(Ok(Some(status))) = node.child.as_mut().map(|c| c.try_wait()) {
                panic!("fleet node {} exited before listening: {status}", node.addr);
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not listen",
                node.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Started once its pid file names it (written after the listeners): an upgrade reads
        // the file for the successor's pid, and took a killed predecessor's stale one for it
        // once, so the real successor outlived the test's `kill` and applied purges meant to be
        // missed.
        let me = node.child.as_ref().map(|c| c.id());
        while std::fs::read_to_string(&node.pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            != me
        {
            assert!(
                Instant::now() < deadline,
                "node {} never wrote its pid file",
                node.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(pid) = self.nodes[i].successor.take() {
            // SAFETY: the successor this test's upgrade started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            wait_gone(pid);
        }
    }

    /// Stops node `i` as `systemctl stop` does (SIGTERM: the drain), and waits for it to exit.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            // SAFETY: our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    /// Upgrades node `i` in place (SIGUSR2, as `zerocache upgrade` sends it): returns once the
    /// new process wrote its pid and the old one exited.
    pub fn upgrade(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut old = node.child.take().expect("node runs as our child");
        // SAFETY: our own child.
        unsafe { libc::kill(old.id() as i32, libc::SIGUSR2) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let new = loop {
            let pid = std::fs::read_to_string(&node.pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok());
            if let Some(pid) = pid.filter(|p| *p != old.id()) {
                break pid;
            }
            assert!(Instant::now() < deadline, "node {i} was not upgraded");
            std::thread::sleep(Duration::from_millis(20));
        };
        node.successor = Some(new);
        let _ = old.wait();
    }

    /// `/api/fleet` of node `i`.
    pub fn api_fleet(&self, i: usize) -> serde_json::Value {
        self.api(i, "/api/fleet")
    }

    /// A dashboard JSON path of node `i`.
    pub fn api(&self, i: usize, path: &str) -> serde_json::Value {
        let mut c = Client::connect_dashboard(self.nodes[i].dashboard);
        let r = c.get(path, &[("Connection", "close")]);
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        serde_json::from_slice(&r.body).expect("json")
    }

    /// `/metrics` of node `i`.
    pub fn metrics(&self, i: usize) -> String {
        let mut c = Client::connect_dashboard(self.nodes[i].dashboard);
        let r = c.get("/metrics", &[("Connection", "close")]);
        String::from_utf8(r.body).expect("utf8")
    }

    /// Waits until node `i` sees `up` of its peers up.
    pub fn wait_peers_up(&self, i: usize, up: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.api_fleet(i);
            let n = v["peers"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|p| p["up"] == true).count());
            if n == up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {i} sees {n} peers up, not {up}: {v}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `i`'s member id, as the others name it (and as hop headers address it).
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].addr.to_string()
    }

    /// A client of node `i`.
    pub fn client(&self, i: usize) -> Client {
        Client::connect(self.nodes[i].addr)
    }

    /// Objects stored on node `i`.
    pub fn objects(&self, i: usize) -> u64 {
        self.api(i, "/api/stats?history=false")["cache"]["objects"]
            .as_u64()
            .expect("cache.objects")
    }
}

/// Waits until process `pid` is gone (a successor is not our child: it is reaped by init).
fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for TestFleet {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// A `Zerocache-Fleet` header value as a member signs it for member `to` (the wire format,
/// written out here independently of the proxy's code): HMAC-SHA256 with `secret` over the
/// header's fields and the request's method, target, `Host` and body. `to` empty: a version-2
/// header, as releases before 2026-12-05 sign (no `to`).
#[allow(clippy::too_many_arguments)]
pub fn signed_hop(
    secret: &str,
    to: &str,
    op: &str,
    method: &str,
    target: &str,
    host: &str,
    body: &[u8],
    ts: u64,
    nonce: u128,
) -> String {
    use ring::{digest, hmac};
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (from, cfg) = ("127.0.0.9:1", 0u64);
    let bh = hex(digest::digest(&digest::SHA256, body).as_ref());
    let (version, signed_to, sent_to) = if to.is_empty() {
        ("v2", String::new(), String::new())
    } else {
        ("v3", format!("\n{to}"), format!(" to={to}"))
    };
    let msg = format!(
        "zerocache-fleet {version}\n{from}{signed_to}\n{cfg:016x}\n{op}\n{ts}\n{nonce:032x}\n{bh}\n{method}\n{target}\n{host}"
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let sig = hex(hmac::sign(&key, msg.as_bytes()).as_ref());
    format!(
        "{version} from={from}{sent_to} cfg={cfg:016x} op={op} ts={ts} nonce={nonce:032x} bh={bh} sig={sig}"
    )
}

/// Seconds since the Unix epoch now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

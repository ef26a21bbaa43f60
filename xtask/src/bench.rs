//! `cargo xtask bench`: zerocache against nginx on the same machine, in the same run, as ratios.
//!
//! Servers: zerocache (probe attached), nginx `proxy_cache` with `tcp_nopush on` and with it off,
//! and nginx serving the objects as static files (the bare-sendfile ceiling), each with as many
//! workers as cores. Every cache is warmed and every warm body checked byte for byte first. Then
//! wrk drives each server on loopback for a bounded time, in rotated order over several
//! repetitions, and the medians go into one table. zerocache runs only during its own slots: the
//! probe's tracepoints tax every process on the machine, and nginx must not pay for them.
//!
//! CPU is read from `/proc/PID/task/*/schedstat` (nanoseconds on CPU), summed over the server's
//! processes and threads; the 250 Hz tick accounting of `/proc/PID/stat` is too coarse. With
//! `--pin`, wrk runs on CPU 1 and the servers on CPU 0, which steadies the CPU-per-GB figure.
//! By default each server runs with its own default placement: zerocache's
//! `workers.cpu_affinity: auto` pins its workers (and lets one off a CPU it cannot get), nginx's
//! workers are unpinned. With `--affinity`, every server pins its workers one per CPU (zerocache's
//! `cpu_affinity: true`, nginx's `worker_cpu_affinity auto`); with `--unpinned`, none does
//! (zerocache's `cpu_affinity: false`): both compared like for like.

use crate::{free_port, root, run};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerocache_origin::client::SimpleClient;

/// Object sizes measured.
const SIZES: [usize; 7] = [
    1024,
    65_536,
    65_537,
    1_000_000,
    1_048_576,
    16 << 20,
    64 << 20,
];

/// Benchmark settings.
pub struct Options {
    /// Seconds per wrk run.
    pub duration: u64,
    /// Repetitions (medians are reported).
    pub reps: usize,
    /// Pin wrk to CPU 1 and the servers to CPU 0.
    pub pin: bool,
    /// Only these sizes (all when empty).
    pub sizes: Vec<usize>,
    /// Pin each server's workers one per CPU (zerocache `workers.cpu_affinity: true`, nginx
    /// `worker_cpu_affinity auto`).
    pub affinity: bool,
    /// Leave every server's workers unpinned (zerocache `workers.cpu_affinity: false`).
    pub unpinned: bool,
    /// Run the cold-cache mode instead: hot 1 KiB hits while cold 16 MiB hits run beside them.
    pub cold: bool,
    /// Measure only the watch-mode probe cost per syscall (`bench_watch`).
    pub watch_cost: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Server {
    Zerocache,
    NginxNopush,
    NginxNoNopush,
    NginxStatic,
    ZerocacheNoProbe,
}

impl Server {
    const ALL: [Server; 5] = [
        Server::Zerocache,
        Server::NginxNopush,
        Server::NginxNoNopush,
        Server::NginxStatic,
        Server::ZerocacheNoProbe,
    ];
    fn name(self) -> &'static str {
        match self {
            Server::Zerocache => "zerocache",
            Server::ZerocacheNoProbe => "zerocache (probe off)",
            Server::NginxNopush => "nginx proxy_cache (tcp_nopush on)",
            Server::NginxNoNopush => "nginx proxy_cache (tcp_nopush off)",
            Server::NginxStatic => "nginx static",
        }
    }
    fn short(self) -> &'static str {
        match self {
            Server::Zerocache => "zc",
            Server::ZerocacheNoProbe => "zc",
            Server::NginxNopush => "ngx-np",
            Server::NginxNoNopush => "ngx",
            Server::NginxStatic => "static",
        }
    }
}

/// One wrk run's figures.
#[derive(Clone, Debug, Default)]
struct Sample {
    rps: f64,
    mbps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    cpu_s_per_gb: f64,
    /// Server CPU per request, ns.
    cpu_ns_per_req: f64,
    /// BPF program run time per request, ns, all programs and all processes (0 when no probe).
    probe_ns_per_req: f64,
    /// Per probe program: (runs per request, ns per run), from the kernel's BPF statistics.
    programs: BTreeMap<String, (f64, f64)>,
    /// zerocache's own output syscalls per request, by syscall name, as its probe counted them.
    own_calls: BTreeMap<String, f64>,
}

impl Sample {
    /// The probe's run time on zerocache's own syscalls per request: each syscall's exit program
    /// (ns per run) times zerocache's calls of it per request, the definition.
    fn own_probe_ns_per_req(&self) -> f64 {
        self.own_calls
            .iter()
            .map(|(syscall, calls)| {
                let ns = self
                    .programs
                    .get(&format!("exit_{syscall}"))
                    .map_or(0.0, |p| p.1);
                ns * calls
            })
            .sum()
    }
}

pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    /// zerocache's dashboard (for its /metrics); None for nginx.
    pub(crate) dashboard: Option<SocketAddr>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening ({status})");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The demo origin as its own process, on a free port.
pub(crate) fn start_origin() -> anyhow::Result<Running> {
    let port = free_port()?;
    let mut child = Command::new(root().join("target/release/zerocache-origin"))
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, "origin")?;
    Ok(Running {
        child,
        addr,
        dashboard: None,
    })
}

fn nginx_conf(
    dir: &Path,
    port: u16,
    origin: SocketAddr,
    server: Server,
    workers: usize,
    affinity: bool,
) -> String {
    let d = dir.display();
    let affinity = if affinity {
        "worker_cpu_affinity auto; "
    } else {
        ""
    };
    let common = format!(
        "user root root; worker_processes {workers}; {affinity}daemon off; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; sendfile on; tcp_nodelay on; keepalive_requests 10000000; keepalive_timeout 60;
  client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft; uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
"
    );
    let body = match server {
        Server::NginxStatic => {
            format!("  server {{ listen 127.0.0.1:{port}; root {d}/www; tcp_nopush off; }}\n}}\n")
        }
        _ => {
            let nopush = if server == Server::NginxNopush {
                "on"
            } else {
                "off"
            };
            format!(
                "  tcp_nopush {nopush};
  proxy_cache_path {d}/cache levels=1:2 keys_zone=zc:10m max_size=4g inactive=60m use_temp_path=off;
  upstream origin {{ server {origin}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";
      proxy_cache zc; proxy_cache_valid 200 60m; add_header X-Cache $upstream_cache_status; }} }}
}}
"
            )
        }
    };
    common + &body
}

fn start_nginx(
    base: &Path,
    origin: SocketAddr,
    server: Server,
    workers: usize,
    affinity: bool,
) -> anyhow::Result<Running> {
    let dir = base.join(server.short());
    std::fs::create_dir_all(dir.join("www/obj"))?;
    if server == Server::NginxStatic {
        for s in SIZES {
            let f = dir.join(format!("www/obj/{s}"));
            if !f.exists() {
                std::fs::write(&f, zerocache_origin::body(s))?;
            }
        }
    }
    let port = free_port()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        nginx_conf(&dir, port, origin, server, workers, affinity),
    )?;
    let mut child = Command::new("nginx")
        .args(["-e", &format!("{}/error.log", dir.display()), "-p"])
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .spawn()
        .context("starting nginx (installed by cargo xtask setup)")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, server.name())?;
    Ok(Running {
        child,
        addr,
        dashboard: None,
    })
}

/// zerocache's `workers.cpu_affinity` for the mode: its default, or like nginx's workers. With
/// `--pin`, taskset puts every server thread on CPU 0, so zerocache must not pin (or steer by)
/// CPUs of its own.
fn zc_affinity(opts: &Options) -> &'static str {
    match (opts.affinity, opts.unpinned || opts.pin) {
        (true, _) => "true",
        (false, true) => "false",
        (false, false) => "auto",
    }
}

fn start_zerocache(
    base: &Path,
    port: u16,
    origin: SocketAddr,
    probe: bool,
    affinity: &str,
) -> anyhow::Result<Running> {
    start_zerocache_with(base, port, origin, probe, true, affinity)
}

fn start_zerocache_with(
    base: &Path,
    port: u16,
    origin: SocketAddr,
    probe: bool,
    offload: bool,
    affinity: &str,
) -> anyhow::Result<Running> {
    let dir = base.join("zc");
    std::fs::create_dir_all(&dir)?;
    let dport = free_port()?;
    let conf = dir.join("zerocache.yaml");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\ncache:\n  path: {}\n  max_size: 4GiB\n  offload_cold_hits: {offload}\nupstreams:\n  origin:\n    servers: [\"{origin}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: {probe}\nworkers:\n  cpu_affinity: {affinity}\nlogging:\n  level: warn\n",
            dir.join("cache").display()
        ),
    )?;
    let mut child = Command::new(root().join("target/release/zerocache"))
        .args(["run", "--config"])
        .arg(&conf)
        .spawn()
        .context("starting zerocache")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child, "zerocache")?;
    Ok(Running {
        child,
        addr,
        dashboard: Some(format!("127.0.0.1:{dport}").parse()?),
    })
}

/// Run time and run count of each BPF program `pid` holds, by program name (needs
/// `kernel.bpf_stats_enabled=1`). The ids come from /proc/PID/fdinfo, the names from the kernel's
/// program list.
pub(crate) fn bpf_programs(pid: u32) -> BTreeMap<String, (u64, u64)> {
    let mut ids = std::collections::BTreeSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let is_prog = std::fs::read_link(fd.path())
                .map(|t| t.to_string_lossy() == "anon_inode:bpf-prog")
                .unwrap_or(false);
            if !is_prog {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ));
            if let Ok(info) = info {
                ids.extend(
                    info.lines()
                        .find_map(|l| l.strip_prefix("prog_id:"))
                        .and_then(|v| v.trim().parse::<u32>().ok()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    for p in aya::programs::loaded_programs().flatten() {
        if ids.contains(&p.id()) {
            let name = p.name_as_str().unwrap_or("?").to_string();
            let e = out.entry(name).or_insert((0, 0));
            e.0 += p.run_time().as_nanos() as u64;
            e.1 += p.run_count();
        }
    }
    out
}

/// zerocache's /metrics text; empty if it cannot be read.
fn metrics_text(dashboard: SocketAddr) -> String {
    SimpleClient::connect(dashboard)
        .and_then(|mut c| c.get(&dashboard.to_string(), "/metrics", true))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default()
}

/// How many times zerocache's valve has moved a worker off its CPU (`workers.cpu_affinity:
/// auto`), if /metrics says.
fn worker_unpins(dashboard: SocketAddr) -> Option<u64> {
    metrics_text(dashboard).lines().find_map(|l| {
        l.strip_prefix("zerocache_worker_unpins_total ")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    })
}

/// zerocache's own output syscalls so far, by syscall name, from its /metrics (socket and other
/// fds together).
fn own_syscalls(dashboard: SocketAddr) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics_text(dashboard).lines() {
        let Some(rest) = line.strip_prefix("zerocache_syscalls_total{") else {
            continue;
        };
        if !rest.contains("process=\"zerocache\"") {
            continue;
        }
        let syscall = rest
            .split("syscall=\"")
            .nth(1)
            .and_then(|v| v.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(syscall), Some(value)) = (syscall, value) {
            *out.entry(syscall.to_string()).or_insert(0) += value as u64;
        }
    }
    out
}

/// Warms `addr` for every size and checks the warm bodies byte for byte.
fn warm(addr: SocketAddr, server: Server, sizes: &[usize]) -> anyhow::Result<()> {
    let mut c = SimpleClient::connect(addr)?;
    for &s in sizes {
        let path = format!("/obj/{s}");
        let expected = zerocache_origin::body(s);
        for attempt in 0..3 {
            let r = c.get("bench", &path, false)?;
            anyhow::ensure!(
                r.status == 200,
                "{}: {path} answered {}",
                server.name(),
                r.status
            );
            anyhow::ensure!(
                r.body == expected,
                "{}: {path} body differs from the origin's",
                server.name()
            );
            let hit = server == Server::NginxStatic || r.header("x-cache") == Some("HIT");
            if hit {
                break;
            }
            anyhow::ensure!(
                attempt < 2,
                "{}: {path} is not a cache hit when warm",
                server.name()
            );
        }
    }
    Ok(())
}

/// PIDs of a server: the process and (for nginx) its workers.
pub(crate) fn pids(root_pid: u32) -> Vec<u32> {
    let mut out = vec![root_pid];
    if let Ok(children) =
        std::fs::read_to_string(format!("/proc/{root_pid}/task/{root_pid}/children"))
    {
        out.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

/// Nanoseconds on CPU of all threads of these processes.
pub(crate) fn cpu_ns(pids: &[u32]) -> u64 {
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

fn pin(pids: &[u32], cpu: &str) {
    for pid in pids {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", cpu, &pid.to_string()])
            .stdout(Stdio::null())
            .status();
    }
}

pub(crate) fn parse_duration_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (s, 1.0)
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

fn connections(size: usize) -> usize {
    if size < 1_000_000 { 32 } else { 8 }
}

fn wrk(
    addr: SocketAddr,
    size: usize,
    secs: u64,
    pin_cpu: bool,
    server_pids: &[u32],
    dashboard: Option<SocketAddr>,
) -> anyhow::Result<Sample> {
    let conns = connections(size);
    let mut cmd = if pin_cpu {
        let mut c = Command::new("taskset");
        c.args(["-c", "1", "wrk"]);
        c
    } else {
        Command::new("wrk")
    };
    let url = format!("http://{addr}/obj/{size}");
    // The /metrics fetch and the BPF listing go before the CPU reading, outside the window.
    let own_before = dashboard.map(own_syscalls).unwrap_or_default();
    let programs_before = bpf_programs(server_pids[0]);
    let before = cpu_ns(server_pids);
    let out = cmd
        .args([
            "-t2",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
            "--timeout",
            "10s",
            &url,
        ])
        .output()
        .context("running wrk (installed by cargo xtask setup)")?;
    let cpu = cpu_ns(server_pids).saturating_sub(before) as f64 / 1e9;
    let programs_after = bpf_programs(server_pids[0]);
    let own_after = dashboard.map(own_syscalls).unwrap_or_default();
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = Sample::default();
    let mut total_bytes = 0f64;
    for line in text.lines() {
        let l = line.trim();
        if let Some(v) = l.strip_prefix("Requests/sec:") {
            s.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("50%") {
            s.p50_ms = parse_duration_ms(v).unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("99%") {
            s.p99_ms = parse_duration_ms(v).unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("Non-2xx or 3xx responses:") {
            s.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(v) = l.strip_prefix("Socket errors:") {
            s.errors += v
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if l.contains("requests in") && l.contains(" read") {
            // "123 requests in 10.00s, 1.23GB read"
            if let Some(read) = l.split(", ").nth(1).and_then(|r| r.strip_suffix(" read")) {
                total_bytes = parse_bytes(read);
            }
        }
    }
    s.mbps = total_bytes / secs as f64 / 1e6;
    let requests = (s.rps * secs as f64).max(1.0);
    s.cpu_ns_per_req = cpu * 1e9 / requests;
    let mut probe_ns = 0.0;
    for (name, (ns, runs)) in &programs_after {
        let (ns0, runs0) = programs_before.get(name).copied().unwrap_or((0, 0));
        let (ns, runs) = (
            ns.saturating_sub(ns0) as f64,
            runs.saturating_sub(runs0) as f64,
        );
        probe_ns += ns;
        if runs > 0.0 {
            s.programs
                .insert(name.clone(), (runs / requests, ns / runs));
        }
    }
    s.probe_ns_per_req = probe_ns / requests;
    for (syscall, calls) in &own_after {
        let calls = calls.saturating_sub(own_before.get(syscall).copied().unwrap_or(0));
        if calls > 0 {
            s.own_calls.insert(syscall.clone(), calls as f64 / requests);
        }
    }
    s.cpu_s_per_gb = if total_bytes > 0.0 {
        cpu / (total_bytes / 1e9)
    } else {
        0.0
    };
    Ok(s)
}

pub(crate) fn parse_bytes(s: &str) -> f64 {
    let s = s.trim();
    for (suffix, mult) in [
        ("GB", 1024f64.powi(3)),
        ("MB", 1024f64.powi(2)),
        ("KB", 1024.0),
        ("B", 1.0),
    ] {
        if let Some(v) = s.strip_suffix(suffix) {
            return v.parse::<f64>().unwrap_or(0.0) * mult;
        }
    }
    0.0
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

pub(crate) fn size_name(s: usize) -> String {
    match s {
        1024 => "1 KiB".into(),
        65_536 => "64 KiB".into(),
        1_048_576 => "1 MiB".into(),
        x if x == 16 << 20 => "16 MiB".into(),
        x if x == 64 << 20 => "64 MiB".into(),
        x => format!("{x} B"),
    }
}

/// Runs the benchmark and writes `xtask/bench/results/latest.md` (`pinned.md`, `affinity.md`,
/// `unpinned.md` or `cold.md` in those modes).
pub fn bench(opts: Options) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(opts.pin && (opts.affinity || opts.unpinned)) && !(opts.affinity && opts.unpinned),
        "--pin, --affinity and --unpinned each place the workers differently: use one"
    );
    anyhow::ensure!(
        !(opts.cold && (opts.affinity || opts.pin || opts.unpinned)),
        "--cold measures the cold-hit offload with default workers; it has no --pin, --affinity or --unpinned variant"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args([
        "build",
        "--release",
        "-p",
        "zerocache",
        "-p",
        "zerocache-origin",
    ]))?;
    if opts.watch_cost {
        let section = crate::bench_watch::watch_cost()?;
        let out = root().join("xtask/bench/results");
        std::fs::create_dir_all(&out)?;
        std::fs::write(out.join("watch-cost.md"), &section)?;
        println!("{section}\nxtask: bench: written to xtask/bench/results/watch-cost.md");
        return Ok(());
    }
    if opts.cold {
        return cold(&opts);
    }
    let sizes: Vec<usize> = if opts.sizes.is_empty() {
        SIZES.to_vec()
    } else {
        opts.sizes.clone()
    };
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let base = root().join("target/bench");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;

    let origin_server = start_origin()?;
    let origin = origin_server.addr;

    let nginx: Vec<(Server, Running)> = [
        Server::NginxNopush,
        Server::NginxNoNopush,
        Server::NginxStatic,
    ]
    .into_iter()
    .map(|s| start_nginx(&base, origin, s, workers, opts.affinity).map(|r| (s, r)))
    .collect::<anyhow::Result<_>>()?;
    for (s, r) in &nginx {
        warm(r.addr, *s, &sizes)?;
        println!("xtask: bench: {} warm, bodies checked", s.name());
    }
    let zc_port = free_port()?;
    {
        let z = start_zerocache(&base, zc_port, origin, true, zc_affinity(&opts))?;
        warm(z.addr, Server::Zerocache, &sizes)?;
        println!("xtask: bench: zerocache warm, bodies checked");
    }
    // Per-program BPF run time, for the probe's own cost; restored afterwards.
    let stats_path = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(stats_path).unwrap_or_default();
    let _ = std::fs::write(stats_path, "1");

    // results[server][size] = samples
    let mut results: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); sizes.len()]; Server::ALL.len()];
    let started = Instant::now();
    // None once a read of zerocache's /metrics failed: the count is then unknown.
    let mut unpins = Some(0);
    for rep in 0..opts.reps {
        let mut order = Server::ALL.to_vec();
        order.rotate_left(rep % Server::ALL.len());
        for server in order {
            let zc_guard;
            let (addr, server_pids, dashboard) = match server {
                Server::Zerocache | Server::ZerocacheNoProbe => {
                    let probe = server == Server::Zerocache;
                    zc_guard = Some(start_zerocache(
                        &base,
                        zc_port,
                        origin,
                        probe,
                        zc_affinity(&opts),
                    )?);
                    let z = zc_guard.as_ref().context("zerocache")?;
                    (z.addr, pids(z.child.id()), z.dashboard)
                }
                s => {
                    zc_guard = None;
                    let r = &nginx.iter().find(|(n, _)| *n == s).context("nginx")?.1;
                    (r.addr, pids(r.child.id()), None)
                }
            };
            if opts.pin {
                pin(&server_pids, "0");
            }
            for (i, &size) in sizes.iter().enumerate() {
                // One second of warm-up per run: connection set-up, page cache, open-file cache.
                wrk(addr, size, 1, opts.pin, &server_pids, dashboard)?;
                let s = wrk(addr, size, opts.duration, opts.pin, &server_pids, dashboard)?;
                println!(
                    "xtask: bench: rep {} {:<36} {:>8}  {:>10.0} req/s {:>9.1} MB/s  p99 {:>7.2} ms  {:.3} CPU-s/GB  errors {}",
                    rep + 1,
                    server.name(),
                    size_name(size),
                    s.rps,
                    s.mbps,
                    s.p99_ms,
                    s.cpu_s_per_gb,
                    s.errors
                );
                results[Server::ALL.iter().position(|x| *x == server).unwrap_or(0)][i].push(s);
            }
            // A run in which the valve moved a worker measured partly unpinned: say so.
            if let Some(d) = dashboard {
                let n = worker_unpins(d);
                unpins = unpins.zip(n).map(|(a, b)| a + b);
                if let Some(n) = n.filter(|n| *n > 0) {
                    println!(
                        "xtask: bench: rep {} {}: the valve moved a worker {n} times",
                        rep + 1,
                        server.name()
                    );
                }
            }
            drop(zc_guard);
        }
    }
    if !stats_before.trim().is_empty() {
        let _ = std::fs::write(stats_path, stats_before.trim());
    }
    let mut report = report(&opts, &sizes, &results, unpins, started.elapsed())?;
    report.push_str(&crate::bench_watch::watch_cost()?);
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    // Pinned runs answer a different question (steady CPU per GB), so they keep their own file.
    let name = match (opts.pin, opts.affinity, opts.unpinned) {
        (true, _, _) => "pinned.md",
        (false, true, _) => "affinity.md",
        (false, false, true) => "unpinned.md",
        (false, false, false) => "latest.md",
    };
    std::fs::write(out.join(name), &report)?;
    println!("\n{report}");
    println!("xtask: bench: written to xtask/bench/results/{name}");
    Ok(())
}

fn med(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(samples.iter().map(f).collect())
}

fn report(
    opts: &Options,
    sizes: &[usize],
    results: &[Vec<Vec<Sample>>],
    unpins: Option<u64>,
    took: Duration,
) -> anyhow::Result<String> {
    let mut r = String::new();
    writeln!(r, "# zerocache vs nginx: `cargo xtask bench`\n")?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let nginx_v = Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    writeln!(
        r,
        "Machine: {} cores, kernel {}, {}. wrk -t2, {} s per run, {} repetitions in rotated order, medians; {} connections below 1 MB, {} from 1 MB up. Mode: {}. zerocache runs with the probe attached and is stopped while nginx is measured. CPU from /proc/PID/task/*/schedstat. Took {:.0} s.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim(),
        nginx_v,
        opts.duration,
        opts.reps,
        connections(1024),
        connections(1 << 20),
        match (opts.pin, opts.affinity, opts.unpinned) {
            (true, _, _) => "pinned (wrk on CPU 1, servers on CPU 0)",
            (false, true, _) => {
                "worker affinity (each server's workers pinned one per CPU: zerocache workers.cpu_affinity: true, nginx worker_cpu_affinity auto; wrk unpinned)"
            }
            (false, false, true) => {
                "unpinned (no server pins its workers: zerocache workers.cpu_affinity: false, nginx's default)"
            }
            (false, false, false) => {
                "defaults (wrk and servers on both cores; zerocache workers.cpu_affinity: auto pins its workers, nginx's are unpinned)"
            }
        },
        took.as_secs_f64()
    )?;
    writeln!(
        r,
        "| size | server | req/s | MB/s | p50 ms | p99 ms | errors | CPU-s/GB |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        for (k, server) in Server::ALL.iter().enumerate() {
            let s = &results[k][i];
            writeln!(
                r,
                "| {} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {} | {:.3} |",
                size_name(size),
                server.name(),
                med(s, |x| x.rps),
                med(s, |x| x.mbps),
                med(s, |x| x.p50_ms),
                med(s, |x| x.p99_ms),
                s.iter().map(|x| x.errors).sum::<u64>(),
                med(s, |x| x.cpu_s_per_gb),
            )?;
        }
    }
    writeln!(r, "\n## zerocache against the better nginx proxy_cache\n")?;
    writeln!(
        r,
        "| size | req/s ratio | CPU-s/GB ratio (lower is better) | p99 zerocache / better nginx |"
    )?;
    writeln!(r, "|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let zc = &results[0][i];
        let a = &results[1][i];
        let b = &results[2][i];
        let best_rps = med(a, |x| x.rps).max(med(b, |x| x.rps));
        let best_cpu = med(a, |x| x.cpu_s_per_gb).min(med(b, |x| x.cpu_s_per_gb));
        let best_p99 = med(a, |x| x.p99_ms).min(med(b, |x| x.p99_ms));
        writeln!(
            r,
            "| {} | {:.2}× | {:.2}× | {:.2} ms / {:.2} ms |",
            size_name(size),
            med(zc, |x| x.rps) / best_rps.max(1e-9),
            med(zc, |x| x.cpu_s_per_gb) / best_cpu.max(1e-12),
            med(zc, |x| x.p99_ms),
            best_p99
        )?;
    }
    if zc_affinity(opts) == "auto" {
        let n = unpins.map_or("unknown (a /metrics read failed)".to_string(), |n| {
            n.to_string()
        });
        writeln!(
            r,
            "\nzerocache workers moved off their CPU by `workers.cpu_affinity: auto` during the runs: {n}."
        )?;
    }
    writeln!(r, "\n## The probe's own cost\n")?;
    writeln!(
        r,
        "From the kernel's BPF statistics (kernel.bpf_stats_enabled=1): run_time_ns / run_cnt per program, times the syscall rate of the run. *On zerocache's syscalls* is the issue's figure: each output syscall's exit program (ns per run) times zerocache's calls of that syscall per request, as its own probe counted them, against zerocache's CPU time per request. *All processes* adds the runs that return early on everybody else's syscalls (wrk's writes here): a cost the probe puts on the machine rather than on zerocache. Every run includes the method's floor: bpf_stats reads the clock around each run, and a program that only returns measures ~60 ns on this machine.\n"
    )?;
    writeln!(
        r,
        "| size | zerocache syscalls/request | probe ns/request on them | zerocache CPU ns/request | share | all processes: probe ns/request | share | req/s probe on / off |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let on = &results[0][i];
        let off = &results[4][i];
        let own = med(on, |x| x.own_probe_ns_per_req());
        let all = med(on, |x| x.probe_ns_per_req);
        let cpu = med(on, |x| x.cpu_ns_per_req);
        let calls = on
            .first()
            .map(|x| x.own_calls.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|k| (med(on, |x| x.own_calls.get(&k).copied().unwrap_or(0.0)), k))
            .filter(|(n, _)| *n >= 0.005)
            .map(|(n, k)| format!("{n:.2} {k}"))
            .collect::<Vec<_>>()
            .join(" + ");
        writeln!(
            r,
            "| {} | {} | {:.0} | {:.0} | {:.1}% | {:.0} | {:.1}% | {:.2} |",
            size_name(size),
            calls,
            own,
            cpu,
            100.0 * own / cpu.max(1.0),
            all,
            100.0 * all / cpu.max(1.0),
            med(on, |x| x.rps) / med(off, |x| x.rps).max(1e-9)
        )?;
    }
    writeln!(
        r,
        "\nPer program (medians; programs that ran less than once per 100 requests left out):\n"
    )?;
    writeln!(r, "| size | program | runs/request | ns/run | ns/request |")?;
    writeln!(r, "|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let on = &results[0][i];
        let names: std::collections::BTreeSet<String> =
            on.iter().flat_map(|x| x.programs.keys().cloned()).collect();
        for name in names {
            let runs = med(on, |x| x.programs.get(&name).map_or(0.0, |p| p.0));
            let ns = med(on, |x| x.programs.get(&name).map_or(0.0, |p| p.1));
            if runs >= 0.01 {
                writeln!(
                    r,
                    "| {} | {name} | {runs:.2} | {ns:.0} | {:.0} |",
                    size_name(size),
                    runs * ns
                )?;
            }
        }
    }
    Ok(r)
}

/// Drops every cache file under `dir` larger than `min` bytes from the page cache.
fn evict_large(dir: &Path, min: u64) {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if e.metadata().map(|m| m.len() > min).unwrap_or(false)
                && let Ok(f) = std::fs::File::open(&p)
            {
                use std::os::fd::AsRawFd;
                let _ = f.sync_all();
                // SAFETY: valid fd; advice only.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

/// The cold-cache mode: hot 1 KiB hits under wrk while another client keeps asking for 16 MiB
/// objects whose cache files are evicted from the page cache before each request. With the
/// offload the disk reads run on the blocking pool; without it, sendfile waits for the disk on
/// a runtime thread and the hot hits behind it wait too.
fn cold(opts: &Options) -> anyhow::Result<()> {
    let base = root().join("target/bench-cold");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let origin_server = start_origin()?;
    let origin = origin_server.addr;
    const COLD_OBJECTS: usize = 16;
    let mut rows = Vec::new();
    for rep in 0..opts.reps {
        for offload in [true, false] {
            let port = free_port()?;
            let z = start_zerocache_with(&base, port, origin, true, offload, "auto")?;
            {
                let mut c = SimpleClient::connect(z.addr)?;
                c.get("bench", "/obj/1024", false)?;
                for i in 0..COLD_OBJECTS {
                    c.get("bench", &format!("/obj/16777216?cold={i}"), false)?;
                }
            }
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            let dir = base.join("zc/cache");
            let addr = z.addr;
            let coldies = std::thread::spawn(move || -> u64 {
                let mut n = 0;
                let Ok(mut c) = SimpleClient::connect(addr) else {
                    return 0;
                };
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    evict_large(&dir, 1 << 20);
                    for i in 0..COLD_OBJECTS {
                        if c.get("bench", &format!("/obj/16777216?cold={i}"), false)
                            .is_ok()
                        {
                            n += 1;
                        }
                    }
                }
                n
            });
            let hot = wrk(
                z.addr,
                1024,
                opts.duration,
                false,
                &pids(z.child.id()),
                None,
            )?;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let cold_hits = coldies.join().unwrap_or(0);
            println!(
                "xtask: bench: cold rep {} offload {:<5} hot 1 KiB: {:.0} req/s p50 {:.2} ms p99 {:.2} ms; cold 16 MiB hits: {}",
                rep + 1,
                offload,
                hot.rps,
                hot.p50_ms,
                hot.p99_ms,
                cold_hits
            );
            rows.push((offload, hot, cold_hits));
        }
    }
    let mut r = String::new();
    writeln!(r, "# Cold hits: `cargo xtask bench --cold`\n")?;
    writeln!(
        r,
        "Hot 1 KiB hits (wrk, 32 connections, {} s) while one client keeps fetching {COLD_OBJECTS} objects of 16 MiB whose cache files are evicted from the page cache (POSIX_FADV_DONTNEED) before every round. {} repetitions, medians, probe attached.\n",
        opts.duration, opts.reps
    )?;
    writeln!(
        r,
        "| cold-hit offload | hot req/s | hot p50 ms | hot p99 ms | cold hits served |"
    )?;
    writeln!(r, "|---|---|---|---|---|")?;
    for offload in [true, false] {
        let s: Vec<&(bool, Sample, u64)> = rows.iter().filter(|x| x.0 == offload).collect();
        writeln!(
            r,
            "| {} | {:.0} | {:.2} | {:.2} | {:.0} |",
            if offload { "on (default)" } else { "off" },
            median(s.iter().map(|x| x.1.rps).collect()),
            median(s.iter().map(|x| x.1.p50_ms).collect()),
            median(s.iter().map(|x| x.1.p99_ms).collect()),
            median(s.iter().map(|x| x.2 as f64).collect()),
        )?;
    }
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("cold.md"), &r)?;
    println!("\n{r}");
    println!("xtask: bench: written to xtask/bench/results/cold.md");
    Ok(())
}

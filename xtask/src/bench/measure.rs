//! What a bench measures and how: wrk runs, CPU from schedstat, the probe's own programs and
//! syscalls, and the small parsers for wrk's output.

use super::*;

/// One wrk run's figures.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    pub(crate) rps: f64,
    pub(crate) mbps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) errors: u64,
    pub(crate) cpu_s_per_gb: f64,
    /// Server CPU per request, ns.
    pub(crate) cpu_ns_per_req: f64,
    /// BPF program run time per request, ns, all programs and all processes (0 when no probe).
    pub(crate) probe_ns_per_req: f64,
    /// Per probe program: (runs per request, ns per run), from the kernel's BPF statistics.
    pub(crate) programs: BTreeMap<String, (f64, f64)>,
    /// zerocache's own output syscalls per request, by syscall name, as its probe counted them.
    pub(crate) own_calls: BTreeMap<String, f64>,
}

impl Sample {
    /// The probe's run time on zerocache's own syscalls per request: each syscall's exit program
    /// (ns per run) times zerocache's calls of it per request, the definition.
    pub(crate) fn own_probe_ns_per_req(&self) -> f64 {
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
pub(crate) fn metrics_text(dashboard: SocketAddr) -> String {
    SimpleClient::connect(dashboard)
        .and_then(|mut c| c.get(&dashboard.to_string(), "/metrics", true))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default()
}

/// How many times zerocache's valve has moved a worker off its CPU (`workers.cpu_affinity:
/// auto`), if /metrics says.
pub(crate) fn worker_unpins(dashboard: SocketAddr) -> Option<u64> {
    metrics_text(dashboard).lines().find_map(|l| {
        l.strip_prefix("zerocache_worker_unpins_total ")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    })
}

/// zerocache's own output syscalls so far, by syscall name, from its /metrics (socket and other
/// fds together).
pub(crate) fn own_syscalls(dashboard: SocketAddr) -> BTreeMap<String, u64> {
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

/// The user and system CPU time (clock ticks) of `pids`' threads so far (`/proc/PID/stat`'s
/// `utime` and `stime`): which side of the system call boundary a server's CPU went to.
pub(crate) fn user_sys_ticks(pids: &[u32]) -> (u64, u64) {
    let (mut user, mut sys) = (0, 0);
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command's `)`: state is field 3, utime 14 and stime 15.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        user += num(11);
        sys += num(12);
    }
    (user, sys)
}

pub(crate) fn pin(pids: &[u32], cpu: &str) {
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

pub(crate) fn connections(size: usize) -> usize {
    if size < 1_000_000 { 32 } else { 8 }
}

pub(crate) fn wrk(
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

//! What the proxy reports about itself: `/metrics` series, per-worker loads, CPU placement of
//! its threads, how many body bytes went through sendfile, and the
//! probe's joined record of a closed connection.

use super::{Proxy, Response, assert_eventually_eq};
use serde_json::Value;
use std::time::{Duration, Instant};

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

/// Waits until the dashboard lists connection `id` as closed and joined with the kernel record.
pub fn closed_conn(proxy: &Proxy, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let conns = proxy.api("/api/connections?limit=1000");
        if let Some(c) = conns["closed"]
            .as_array()
            .and_then(|a| a.iter().find(|c| !c["kernel"].is_null() && pred(c)))
        {
            return c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no joined closed connection: {conns}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The access log's lines once it has at least `n` (the writer thread flushes within 200 ms).
pub fn log_lines(log: &std::path::Path, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().count() >= n {
            return text.lines().map(str::to_string).collect();
        }
        assert!(std::time::Instant::now() < deadline, "access log: {text:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

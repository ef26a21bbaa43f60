//! The dashboard as a person sees it (headless Chromium through chromedriver, both from Debian),
//! `/metrics` as Prometheus sees it (promtool), and the API's authentication.

use crate::support::*;
use fantoccini::{ClientBuilder, Locator};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn artifacts() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// Requests in a loop on fresh connections until stopped.
fn traffic(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    miss: bool,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut c = Client::connect(addr);
            let path = if miss {
                format!("/obj/1048576?miss={n}")
            } else {
                "/obj/1048576".into()
            };
            // A miss that may not be stored is streamed through the proxy (a stored one is read
            // behind its fill with sendfile).
            let headers: &[(&str, &str)] = if miss {
                &[("Connection", "close"), ("Cache-Control", "no-store")]
            } else {
                &[("Connection", "close")]
            };
            let r = c.get(&path, headers);
            assert_eq!(r.body.len(), 1_048_576);
            n += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        n
    })
}

struct Driver(std::process::Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn page_state(c: &fantoccini::Client) -> Value {
    c.execute(
        "return { ratio: document.getElementById('ratio').textContent,
                  state: document.getElementById('hero').dataset.state,
                  violation: document.getElementById('violation').textContent,
                  errors5xx: document.getElementById('errors-5xx').textContent,
                  upstreams: [...document.querySelectorAll('#upstreams tbody tr')].map(r =>
                      [...r.querySelectorAll('td')].map(d => d.textContent)),
                  rows: [...document.querySelectorAll('#conns tbody tr')].map(r => ({
                      active: r.dataset.active, sf: r.querySelector('.sf').textContent })) };",
        vec![],
    )
    .await
    .expect("script")
}

async fn wait_for(c: &fantoccini::Client, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = page_state(c).await;
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "page never showed {what}: {s}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn the_page_shows_zero_copy_green_then_red() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    if !require::chromium("drives the dashboard page in headless Chromium") {
        return;
    }
    let (origin, _rt) = origin();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(browse(origin));
}

async fn browse(origin: Origin) {
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/1048576").x_cache(), "MISS");

    let port = free_port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver (Debian chromium-driver, installed by cargo xtask setup)");
    let _driver = Driver(driver);
    let profile = tempfile::tempdir().expect("profile");
    let caps = json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--window-size=1400,1700",
                     format!("--user-data-dir={}", profile.path().display())]
        }
    });
    let caps = match caps {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    };
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let browser = loop {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "chromedriver: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    // Hits only: green, above 0.9, and connection rows with exactly the object's size via sendfile.
    let stop = Arc::new(AtomicBool::new(false));
    let hits = traffic(proxy.addr, stop.clone(), false);
    browser
        .goto(&format!("http://{}/", proxy.dashboard))
        .await
        .expect("open dashboard");
    let s = wait_for(&browser, "green with a 1 MiB sendfile row", |s| {
        s["state"] == "ok"
            && s["ratio"]
                .as_str()
                .and_then(|r| r.parse::<f64>().ok())
                .is_some_and(|r| r > 0.9)
            && s["rows"].as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|r| r["active"] == "false" && r["sf"] == "1048576")
            })
    })
    .await;
    let ratio: f64 = s["ratio"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("ratio");
    assert!(ratio > 0.9, "{s}");
    // The upstream card: the one origin server, up, with the miss it answered and no 5xx.
    assert_eq!(
        (s["upstreams"].clone(), s["errors5xx"].clone()),
        (
            json!([["origin", origin.addr().to_string(), "up", "1", "0"]]),
            json!("0")
        ),
        "{s}"
    );
    let shot = browser.screenshot().await.expect("screenshot");
    std::fs::write(artifacts().join("dashboard-zero-copy.png"), shot).expect("save");
    stop.store(true, Ordering::Relaxed);
    assert!(hits.join().expect("hits") > 0);

    // Uncacheable misses only: every body copied, but by design (relayed as it arrives), so the
    // hero ratio, which counts only bytes meant for sendfile, has nothing to say: idle, never red.
    // (The planted bug turns it red: see the next test.)
    let stop = Arc::new(AtomicBool::new(false));
    let misses = traffic(proxy.addr, stop.clone(), true);
    wait_for(&browser, "idle", |s| s["state"] == "idle").await;
    let shot = browser.screenshot().await.expect("screenshot");
    std::fs::write(artifacts().join("dashboard-copied.png"), shot).expect("save");
    stop.store(true, Ordering::Relaxed);
    assert!(misses.join().expect("misses") > 0);
    let _ = browser
        .find(Locator::Id("probe"))
        .await
        .expect("probe pill");
    browser.close().await.expect("close browser");
}

#[test]
fn the_page_turns_red_with_the_request_on_the_planted_bug() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            debug_yaml: "  copy_hits: true\n".into(),
            ..Opts::default()
        },
    );
    proxy.get("/obj/1048576");
    let stop = Arc::new(AtomicBool::new(false));
    let hits = traffic(proxy.addr, stop.clone(), false);
    // The API side of the same page: violations named with their request.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = proxy.api("/api/stats");
        if s["violations_recent"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(s["recent_violations"][0]["request"], "GET /obj/1048576");
            assert!(
                s["body_zero_copy_ratio_recent"]
                    .as_f64()
                    .is_some_and(|r| r < 0.1),
                "{s}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no violation reported: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    hits.join().expect("hits");
}

#[test]
fn metrics_are_complete_from_start_valid_for_promtool_and_agree_with_the_api() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    if !require::command("promtool") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            ..Opts::default()
        },
    );
    let idle = proxy.metrics();
    for family in [
        "zerocache_syscalls_total{fd_class=\"socket\",process=\"zerocache\",syscall=\"sendfile\"} 0",
        "zerocache_syscall_bytes_total{fd_class=\"socket\",process=\"zerocache\",syscall=\"writev\"} 0",
        "zerocache_response_body_bytes_total{cache_status=\"HIT\",path=\"zerocopy\"} 0",
        "zerocache_zero_copy_violations_total 0",
        "zerocache_requests_total{cache_status=\"MISS\",protocol=\"http/1.1\",route=\"0\",source=\"client\"} 0",
        "zerocache_cache_size_bytes 0",
        "zerocache_cache_objects 0",
        "zerocache_upstream_errors_total{kind=\"connect\",upstream=\"origin\"} 0",
        "zerocache_probe_up 1",
        "zerocache_request_duration_seconds_count{cache_status=\"MISS\",route=\"0\"} 0",
        "zerocache_responses_total{cache_status=\"MISS\",code=\"200\",protocol=\"http/1.1\",route=\"0\"} 0",
        "zerocache_build_info{commit=\"",
        "zerocache_upstream_response_seconds_count{upstream=\"origin\"} 0",
        "zerocache_connections_rejected_total{reason=\"max_connections\"} 0",
        "zerocache_connections_rejected_total{reason=\"out_of_fds\"} 0",
        "zerocache_config_reloads_total{result=\"accepted\"} 0",
        "zerocache_access_log_dropped_total 0",
        "zerocache_cache_evictions_total 0",
        "zerocache_cache_max_size_bytes ",
        "zerocache_probe_lost_total{what=\"events\"} 0",
        "zerocache_probe_programs{program=\"exit_sendfile\",state=\"attached\"} 1",
        "zerocache_probe_programs{program=\"sched_exit\",state=\"attached\"} 1",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "zerocache_worker_unpins_total 0",
        // Its value: 1 once worker 0's thread has pinned itself, which may be after this scrape.
        "zerocache_worker_pinned{worker=\"0\"} ",
    ] {
        assert!(
            idle.contains(family),
            "idle scrape lacks `{family}`:\n{idle}"
        );
    }
    assert!(!idle.contains("state=\"missing\""), "{idle}");
    // /api/probe: the kernel, the floor and all 14 programs, each attached on this kernel.
    let report = proxy.api("/api/probe");
    assert_eq!(report["minimum_kernel"], "5.15", "{report}");
    assert_eq!(report["status"]["state"], "attached", "{report}");
    let programs = report["programs"].as_array().expect("programs");
    assert_eq!(programs.len(), 14, "{report}");
    assert!(programs.iter().all(|p| p["attached"] == true), "{report}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_eq!(report["kernel"], kernel.trim());
    let mut c = proxy.client();
    for s in [1000, 2000, 1000, 3000, 1000] {
        c.get(&format!("/obj/{s}"), &[]);
    }
    drop(c);
    // Let everything settle before the two snapshots are compared: the last response is recorded
    // once its send returns (which can be after the client has read it), and the kernel's record
    // of the connection once it is closed. The proxy's side of the connection must be closed
    // too: while it is open its bytes are counted live, from the probe's map, and in the moment
    // between the close (which drops the map entry) and the closed record's arrival they are
    // counted nowhere. A scrape in that moment read 0 where the API had just read 8000.
    let settled = |s: &serde_json::Value| {
        let requests: u64 = s["requests"]
            .as_object()
            .map(|r| r.values().filter_map(|v| v.as_u64()).sum())
            .unwrap_or(0);
        requests == 5
            && s["kernel_body"]["connections"].as_u64().unwrap_or(0) >= 1
            && s["kernel_body"]["zerocopy_bytes"].as_u64() == Some(8000)
    };
    let closed = |m: &str| {
        m.lines()
            .filter(|l| l.starts_with("zerocache_worker_connections{"))
            .all(|l| l.ends_with(" 0"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(closed(&proxy.metrics()) && settled(&proxy.api("/api/stats"))) {
        assert!(Instant::now() < deadline, "{}", proxy.api("/api/stats"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = proxy.metrics();
    let stats = proxy.api("/api/stats");
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write;
            p.stdin.take().expect("stdin").write_all(text.as_bytes())?;
            p.wait_with_output()
        })
        .expect("promtool (Debian prometheus, installed by cargo xtask setup)");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_requests_total{cache_status=\"HIT\",protocol=\"http/1.1\",route=\"0\",source=\"client\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_requests_total{cache_status=\"MISS\",protocol=\"http/1.1\",route=\"0\",source=\"client\"}"
        ),
        3
    );
    for (status, v) in stats["requests"].as_object().expect("requests") {
        assert_eq!(
            metric(
                &text,
                &format!(
                    "zerocache_requests_total{{cache_status=\"{status}\",protocol=\"http/1.1\",route=\"0\",source=\"client\"}}"
                )
            ),
            v.as_u64().expect("n")
        );
    }
    assert_eq!(
        metric(
            &text,
            "zerocache_response_body_bytes_total{cache_status=\"HIT\",path=\"zerocopy\"}"
        ),
        2000
    );
    assert_eq!(stats["body_bytes"]["HIT/zerocopy"], 2000);
    // Misses are read behind their fill with sendfile too.
    assert_eq!(
        metric(
            &text,
            "zerocache_response_body_bytes_total{cache_status=\"MISS\",path=\"zerocopy\"}"
        ),
        6000
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_kernel_body_bytes_total{path=\"zerocopy\"}"
        ),
        stats["kernel_body"]["zerocopy_bytes"].as_u64().expect("n")
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_kernel_body_bytes_total{path=\"zerocopy\"}"
        ),
        8000
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_syscall_bytes_total{fd_class=\"socket\",process=\"zerocache\",syscall=\"sendfile\"}"
        ),
        stats["syscalls"]["sendfile"]["bytes"].as_u64().expect("n")
    );
    assert_eq!(
        metric(&text, "zerocache_cache_objects"),
        stats["cache"]["objects"].as_u64().expect("n")
    );
    assert_eq!(metric(&text, "zerocache_cache_objects"), 3);
    assert_eq!(metric(&text, "zerocache_zero_copy_violations_total"), 0);
    assert_eq!(
        metric(
            &text,
            "zerocache_request_duration_seconds_count{cache_status=\"MISS\",route=\"0\"}"
        ),
        3
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_request_duration_seconds_count{cache_status=\"HIT\",route=\"0\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_responses_total{cache_status=\"MISS\",code=\"200\",protocol=\"http/1.1\",route=\"0\"}"
        ),
        3
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_responses_total{cache_status=\"HIT\",code=\"200\",protocol=\"http/1.1\",route=\"0\"}"
        ),
        2
    );
    // The three misses went upstream: by server and code, and timed.
    assert_eq!(
        metric(
            &text,
            &format!(
                "zerocache_upstream_requests_total{{code=\"200\",server=\"{}\",upstream=\"origin\"}}",
                origin.addr()
            )
        ),
        3
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_upstream_response_seconds_count{upstream=\"origin\"}"
        ),
        3
    );
}

#[test]
fn a_token_guards_the_page_and_api_and_optionally_metrics() {
    let (origin, _rt) = origin();
    for require_metrics in [false, true] {
        let proxy = Proxy::start(
            origin.addr(),
            Opts {
                extra_yaml: String::new(),
                dashboard_yaml: format!(
                    "  token: s3cret\n  metrics_require_token: {require_metrics}\n"
                ),
                ..Opts::default()
            },
        );
        let get = |path: &str, auth: Option<&str>| {
            let mut c = Client::connect_dashboard(proxy.dashboard);
            let mut h = vec![("Connection", "close")];
            if let Some(a) = auth {
                h.push(("Authorization", a));
            }
            c.get(path, &h).status
        };
        assert_eq!(get("/api/stats", None), 401);
        assert_eq!(get("/", None), 401);
        assert_eq!(get("/api/stats", Some("Bearer wrong")), 401);
        assert_eq!(get("/api/stats", Some("Bearer s3cret")), 200);
        assert_eq!(get("/?token=s3cret", None), 200);
        assert_eq!(
            get("/metrics", None),
            if require_metrics { 401 } else { 200 }
        );
        assert_eq!(get("/metrics", Some("Bearer s3cret")), 200);
        // The health check needs no token, and answers whatever Host a prober sends.
        assert_eq!(get("/healthz", None), 200);
        let r = Client::connect(proxy.dashboard).get("/healthz", &[("Host", "10.1.2.3:9180")]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));
        assert_eq!(get("/api/stats", None), 401, "only /healthz is open");
    }
}

#[test]
fn a_dead_upstream_is_counted_by_status_code_as_a_502() {
    // An origin address nobody listens on: every miss is a 502 the proxy generates.
    let dead: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let proxy = Proxy::start(dead, Opts::default());
    let mut c = proxy.client();
    for i in 0..3 {
        assert_eq!(c.get(&format!("/gone/{i}"), &[]).status, 502);
    }
    let series = "zerocache_responses_total{cache_status=\"ERROR\",code=\"502\",protocol=\"http/1.1\",route=\"0\"}";
    assert_eventually_eq(
        "three 502s counted",
        Duration::from_secs(5),
        || metric(&proxy.metrics(), series),
        3,
    );
    let text = proxy.metrics();
    assert_eq!(
        text.lines().filter(|l| l.contains("code=\"502\"")).count(),
        1,
        "502s are counted once, as upstream errors, not as misses: {text}"
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_requests_total{cache_status=\"MISS\",protocol=\"http/1.1\",route=\"0\",source=\"client\"}"
        ),
        0
    );
    assert_eq!(
        metric(
            &text,
            "zerocache_requests_total{cache_status=\"ERROR\",protocol=\"http/1.1\",route=\"0\",source=\"client\"}"
        ),
        3
    );
}

#[test]
fn the_grafana_dashboard_and_scrape_config_use_only_real_metrics() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    // One miss, so the families whose series appear as upstream servers answer are there too.
    assert_eq!(proxy.get("/obj/10").status, 200);
    let metrics = proxy.metrics();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboard/grafana");
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("zerocache.json")).expect("read"))
            .expect("json");
    // A fleet is viewed per node or summed: job and instance variables, used by every query.
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance"]);
    let mut exprs = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        assert!(
            panel["fieldConfig"]["defaults"]["unit"].is_string(),
            "panel {} has no unit",
            panel["title"]
        );
        for t in panel["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            exprs += 1;
            let mut names = 0;
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("zerocache_") || w.starts_with("process_"))
            {
                names += 1;
                let base = name.trim_end_matches("_bucket");
                assert!(
                    metrics.contains(&format!("# TYPE {base} ")),
                    "panel {} uses unknown metric {name}",
                    panel["title"]
                );
            }
            assert_eq!(
                expr.matches("{job=~\"$job\",instance=~\"$instance\"")
                    .count(),
                names,
                "panel {}: every metric scoped to $job and $instance: {expr}",
                panel["title"]
            );
        }
    }
    assert!(exprs >= 20, "{exprs}");
    // The scrape config, checked by Prometheus itself when it is here.
    if !require::command("promtool") {
        return;
    }
    let out = Command::new("promtool")
        .args(["check", "config"])
        .arg(root.join("prometheus.yml"))
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_origin_answering_5xx_shows_by_server_and_code() {
    let (origin, _rt) = origin();
    origin.script(
        "/boom",
        Reply::ok(b"down".to_vec())
            .status(503)
            .headers(&[("Cache-Control", "no-store")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for _ in 0..2 {
        assert_eq!(c.get("/boom", &[]).status, 503);
    }
    let upstream = format!(
        "zerocache_upstream_requests_total{{code=\"503\",server=\"{}\",upstream=\"origin\"}}",
        origin.addr()
    );
    assert_eventually_eq(
        "two 503s from the origin",
        Duration::from_secs(5),
        || {
            let m = proxy.metrics();
            (
                metric(&m, &upstream),
                metric(
                    &m,
                    "zerocache_responses_total{cache_status=\"MISS\",code=\"503\",protocol=\"http/1.1\",route=\"0\"}",
                ),
            )
        },
        (2, 2),
    );
}

#[test]
fn every_metric_family_is_documented() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    // One miss, so the families that appear as upstream servers answer are there too.
    assert_eq!(proxy.get("/obj/10").status, 200);
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard-and-metrics.md"),
    )
    .expect("docs");
    let text = proxy.metrics();
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|n| n.starts_with("zerocache_"))
        .collect();
    let missing: Vec<&&str> = families
        .iter()
        .filter(|name| !docs.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/dashboard-and-metrics.md: {missing:?}"
    );
    assert!(families.len() >= 25, "{families:?}");
    assert!(docs.contains("`process_*`"));
}

/// `routes[].name` labels `zerocache_requests_total`, `zerocache_responses_total` and
/// `zerocache_request_duration_seconds`: an unnamed route goes by its index, a request that
/// matched no route by `-`, and a reload that keeps a name keeps its counts (the indexes move).
#[test]
fn metrics_say_which_route_answered_and_a_reload_keeps_a_names_counts() {
    let (origin, _rt) = origin();
    origin.script(
        "/api/v",
        Reply::ok(b"v1".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let routes = "routes:\n  - name: api\n    match: { host: \"*\", path_prefix: /api/ }\n    upstream: origin\n  - match: { host: a.example, path_prefix: / }\n    upstream: origin\n";
    let yaml = |routes: &str| {
        format!(
            "listen: 127.0.0.1:{{port}}\ncache:\n  path: {}\n  max_size: 64MiB\nupstreams:\n  origin:\n    servers: [\"{}\"]\n{routes}dashboard:\n  listen: 127.0.0.1:{{dport}}\nprobe:\n  enabled: false\n",
            tmp.path().join("cache").display(),
            origin.addr()
        )
    };
    let proxy = Proxy::from_yaml(&yaml(routes), tmp.path());
    let mut c = proxy.client();
    c.host = "a.example".into();
    assert_eq!(c.get("/api/v", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/api/v", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "MISS");
    c.host = "b.example".into();
    assert_eq!(c.get("/obj/10", &[]).status, 404);
    drop(c);
    let requests = |cs: &str, route: &str| {
        format!(
            "zerocache_requests_total{{cache_status=\"{cs}\",protocol=\"http/1.1\",route=\"{route}\",source=\"client\"}}"
        )
    };
    let counted = |m: &str| {
        [
            metric(m, &requests("MISS", "api")),
            metric(m, &requests("HIT", "api")),
            metric(m, &requests("MISS", "1")),
            metric(m, &requests("HIT", "1")),
            metric(m, &requests("ERROR", "-")),
            metric(
                m,
                "zerocache_responses_total{cache_status=\"ERROR\",code=\"404\",protocol=\"http/1.1\",route=\"-\"}",
            ),
            metric(
                m,
                "zerocache_request_duration_seconds_count{cache_status=\"HIT\",route=\"api\"}",
            ),
        ]
    };
    assert_eventually_eq(
        "responses by route",
        Duration::from_secs(5),
        || counted(&proxy.metrics()),
        [1, 1, 1, 0, 1, 1, 1],
    );
    // A route inserted first: the unnamed one is `2` now, `api` is still `api`, with its counts.
    let text = std::fs::read_to_string(&proxy.config).expect("config");
    std::fs::write(
        &proxy.config,
        text.replace(
            "routes:\n",
            "routes:\n  - name: static\n    match: { host: \"*\", path_prefix: /static/ }\n    upstream: origin\n",
        ),
    )
    .expect("rewrite");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(proxy.child.id() as i32, libc::SIGHUP) };
    assert_eventually_eq(
        "the reload",
        Duration::from_secs(10),
        || {
            metric(
                &proxy.metrics(),
                "zerocache_config_reloads_total{result=\"accepted\"}",
            )
        },
        1,
    );
    let mut c = proxy.client();
    c.host = "a.example".into();
    assert_eq!(c.get("/api/v", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/obj/10", &[]).x_cache(), "HIT");
    drop(c);
    assert_eventually_eq(
        "counts kept by name",
        Duration::from_secs(5),
        || {
            let m = proxy.metrics();
            [
                metric(&m, &requests("HIT", "api")),
                metric(&m, &requests("HIT", "2")),
                metric(&m, &requests("MISS", "1")),
            ]
        },
        [2, 1, 1],
    );
}

//! `zerocache watch`: the probe without the proxy, pointed at another process. An idle run prints
//! an empty table and exits 0; a copy-loop server shows its copy-loop bytes in the table, the
//! JSON, `/api/processes`, `/api/process_connections` and `/metrics` (promtool-clean); missing
//! capabilities and bad config files are named. The probe parts need root.

use crate::support::require;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_zerocache");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn idle_once_prints_an_empty_table_and_exits_0() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let (code, out, err) = run(&["watch", "--once", "--duration", "0.2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "PID  PROCESS  STATE  CONNS  SENDFILE  SPLICE  COPIED  FILE READ  COPY-LOOP  ZERO-COPY  LOOP SHARE  VERDICT\n(no process watched)\n"
    );
    let (code, out, err) = run(&["watch", "--once", "--duration", "0", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "[]\n");
}

#[test]
fn without_capabilities_it_names_each_missing_one() {
    if !require::root("drops to nobody with setpriv") || !require::command("setpriv") {
        return;
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["watch", "--once", "--duration", "0"])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_DAC_READ_SEARCH"] {
        assert!(err.contains(cap), "{err}");
    }
    assert!(out.stdout.is_empty());
}

#[test]
fn a_bad_config_file_is_named_with_line_and_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("watch.yaml");
    std::fs::write(
        &path,
        "watch:\n  - comm: java\ndashboard:\n  listen: nowhere\n",
    )
    .expect("w");
    let (code, out, err) = run(&["watch", "--config", path.to_str().expect("utf-8"), "--once"]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    let want = format!("error: {}:4:", path.display());
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("dashboard.listen"), "{err}");
    let (code, _, err) = run(&["watch", "--comm", "a-name-longer-than-15", "--once"]);
    assert_eq!(code, 2, "{err}");
}

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect dashboard");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("req");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    body.to_string()
}

/// Two 1 MiB responses of the Python copy-loop seed on one connection, 300 ms apart (the peer is
/// read from /proc while the connection is open); returns the client's address.
fn fetch_twice(port: u16) -> std::net::SocketAddr {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("seed");
    let me = s.local_addr().expect("local addr");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut all = Vec::new();
    for (i, req) in [
        "GET /a HTTP/1.1\r\nHost: s\r\n\r\n",
        "GET /b HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n",
    ]
    .iter()
    .enumerate()
    {
        s.write_all(req.as_bytes()).expect("request");
        let want = (i + 1) * (1 << 20);
        let mut buf = vec![0u8; 1 << 16];
        while all.len() < want {
            let n = s.read(&mut buf).expect("response");
            assert!(n > 0, "closed after {} bytes", all.len());
            all.extend_from_slice(&buf[..n]);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    s.read_to_end(&mut all).expect("responses");
    assert!(all.len() > 2 << 20, "{} bytes", all.len());
    me
}

#[test]
fn watches_a_copy_loop_in_the_table_json_api_and_metrics() {
    if !require::root("loads the eBPF probe")
        || !require::command("python3")
        || !require::command("promtool")
    {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("file.bin");
    std::fs::write(&file, vec![7u8; 1 << 20]).expect("file");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/seeds/python/server.py");
    let seed = Kill(
        Command::new("python3")
            .arg(script)
            .args(["copy", &port.to_string()])
            .arg(&file)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let pid = seed.0.id();
    let mut seed = seed;
    let mut line = String::new();
    BufReader::new(seed.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready");
    assert_eq!(line, "ready\n");

    let mut watch = Kill(
        Command::new(BIN)
            .args(["watch", "--pid", &pid.to_string(), "--json"])
            .args(["--dashboard", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("zerocache watch"),
    );
    let mut err = BufReader::new(watch.0.stderr.take().expect("stderr"));
    let addr = loop {
        let mut l = String::new();
        assert!(err.read_line(&mut l).expect("stderr") > 0, "watch exited");
        if let Some(rest) = l.strip_prefix("dashboard: http://") {
            break rest.split('/').next().expect("addr").to_string();
        }
    };
    let mut out = BufReader::new(watch.0.stdout.take().expect("stdout"));
    // The first JSON line: the seed is watched, nothing sent yet.
    let mut first = String::new();
    out.read_line(&mut first).expect("json line");
    let rows: serde_json::Value = serde_json::from_str(&first).expect("json");
    assert_eq!(rows[0]["pid"], pid);
    assert_eq!(rows[0]["copy_loop_bytes"], 0);

    let client = fetch_twice(port);
    let body = 2u64 << 20;
    let deadline = Instant::now() + Duration::from_secs(10);
    let conns = loop {
        let c: serde_json::Value =
            serde_json::from_str(&get(&addr, "/api/process_connections")).expect("json");
        if c["closed"].as_array().is_some_and(|a| !a.is_empty()) {
            break c;
        }
        assert!(Instant::now() < deadline, "no closed connection: {c}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let conn = &conns["closed"][0];
    assert_eq!(conn["pid"], pid);
    assert_eq!(conn["peer"], client.to_string());
    assert_eq!(conn["copy_loop_bytes"], body);
    assert_eq!(conn["zero_copy_bytes"], 0);
    assert_eq!(conn["verdict"], "copy-loop");
    let heads = conn["copied_bytes"].as_u64().expect("copied") - body;
    assert!(heads > 0 && heads < 400, "{conn}");

    let procs: serde_json::Value =
        serde_json::from_str(&get(&addr, "/api/processes")).expect("json");
    let p = &procs[0];
    assert_eq!(p["comm"], "python3");
    assert_eq!(p["copy_loop_bytes"], body);
    assert_eq!(p["file_read_bytes"], body);
    assert_eq!(p["verdict"], "copy-loop");
    let share = p["copy_loop_share"].as_f64().expect("share");
    assert!((share - body as f64 / (body + heads) as f64).abs() < 1e-12);
    // The --json lines are the same objects.
    let mut next = String::new();
    loop {
        next.clear();
        out.read_line(&mut next).expect("json line");
        let rows: serde_json::Value = serde_json::from_str(&next).expect("json");
        if rows[0]["copy_loop_bytes"] == body {
            assert_eq!(rows[0]["verdict"], "copy-loop");
            break;
        }
        assert!(Instant::now() < deadline, "{next}");
    }

    let metrics = get(&addr, "/metrics");
    assert!(
        metrics.contains(&format!(
            "zerocache_copy_loop_bytes_total{{process=\"python3\"}} {body}\n"
        )),
        "{metrics}"
    );
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            p.stdin
                .take()
                .expect("stdin")
                .write_all(metrics.as_bytes())?;
            p.wait_with_output()
        })
        .expect("promtool");
    assert!(
        check.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // SIGTERM ends it with 0.
    let killed = Command::new("kill")
        .args(["-TERM", &watch.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = watch.0.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}

/// One raw request to the dashboard; returns the status code.
fn status_of(addr: &str, path: &str, host: &str, auth: Option<&str>) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect dashboard");
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("req");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text.get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{text}"))
}

#[test]
fn the_watch_dashboard_keeps_the_proxy_dashboards_rules() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("watch.yaml");
    std::fs::write(
        &path,
        "dashboard:\n  listen: 127.0.0.1:0\n  token: s3cret\n  metrics_require_token: true\n",
    )
    .expect("w");
    let mut watch = Kill(
        Command::new(BIN)
            .args(["watch", "--config", path.to_str().expect("utf-8")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("zerocache watch"),
    );
    let mut err = BufReader::new(watch.0.stderr.take().expect("stderr"));
    let addr = loop {
        let mut l = String::new();
        assert!(err.read_line(&mut l).expect("stderr") > 0, "watch exited");
        if let Some(rest) = l.strip_prefix("dashboard: http://") {
            break rest.split('/').next().expect("addr").to_string();
        }
    };
    for path in [
        "/",
        "/api/processes",
        "/api/status",
        "/api/process_connections",
        "/metrics",
    ] {
        assert_eq!(status_of(&addr, path, &addr, None), 401, "{path}");
        assert_eq!(status_of(&addr, path, &addr, Some("s3cret")), 200, "{path}");
        assert_eq!(status_of(&addr, path, &addr, Some("wrong")), 401, "{path}");
        assert_eq!(
            status_of(&addr, path, "rebind.example", Some("s3cret")),
            421,
            "{path}"
        );
    }
    assert_eq!(status_of(&addr, "/healthz", "any.example", None), 200);
    let status: serde_json::Value = {
        let mut s = TcpStream::connect(&addr).expect("connect");
        write!(
            s,
            "GET /api/status HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n"
        )
        .expect("req");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        serde_json::from_str(text.split_once("\r\n\r\n").expect("head").1).expect("json")
    };
    assert_eq!(status["probe"]["state"], "attached");
    assert_eq!(status["copy_loop"]["wanted"], true);
    // Nothing watched: the read programs stay off.
    assert_eq!(status["copy_loop"]["attached"], false);
    assert!(
        status["blind_spots"].as_array().is_some_and(|b| b
            .iter()
            .any(|s| s.as_str().is_some_and(|s| s.contains("mmap")))),
        "{status}"
    );
}

#[test]
fn as_nobody_with_the_three_capabilities_it_watches_and_warns_about_ptrace() {
    if !require::root("drops to nobody with setpriv") || !require::command("setpriv") {
        return;
    }
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let caps = "+bpf,+perfmon,+dac_read_search";
    let sleeper = Kill(
        Command::new("setpriv")
            .args(nobody)
            .args(["sleep", "30"])
            .spawn()
            .expect("sleep as nobody"),
    );
    let out = Command::new("setpriv")
        .args(nobody)
        .args([
            &format!("--inh-caps={caps}"),
            &format!("--ambient-caps={caps}"),
        ])
        .arg(BIN)
        .args(["watch", "--pid", &sleeper.0.id().to_string()])
        .args(["--once", "--duration", "0.3", "--json"])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE"), "{err}");
    // The read programs loaded and attached with these capabilities (a failure is a warning).
    assert!(!err.contains("copy-loop detection unavailable"), "{err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows[0]["pid"], sleeper.0.id());
    assert_eq!(rows[0]["comm"], "sleep");
    assert_eq!(rows[0]["alive"], true);
}

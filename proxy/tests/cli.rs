//! The `zerocache` command line: `check` validates without connecting, `run` fails fast.

use std::process::Command;

fn zerocache(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(args)
        .output()
        .expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &std::path::Path, text: &str) -> String {
    let p = dir.join("zc.yaml");
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

#[test]
fn check_accepts_a_valid_config_and_prints_it_with_defaults() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Each way of writing workers.cpu_affinity prints the way it reads back.
    for (workers, affinity) in [
        ("", serde_json::json!("auto")),
        ("workers: {cpu_affinity: true}\n", serde_json::json!(true)),
        ("workers: {cpu_affinity: false}\n", serde_json::json!(false)),
    ] {
        let cfg = write(
            tmp.path(),
            &format!(
                "listen: 127.0.0.1:1\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\n{workers}",
                tmp.path().join("c").display()
            ),
        );
        let (code, out, err) = zerocache(&["check", "-c", &cfg, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["dashboard"]["listen"], "127.0.0.1:9180");
        assert_eq!(v["routes"][0]["match"]["path_prefix"], "/");
        assert_eq!(v["workers"]["cpu_affinity"], affinity);
        // The effective config is itself a valid config.
        let again = write(tmp.path(), &out);
        let (code, _, err) = zerocache(&["check", "--config", &again]);
        assert_eq!(code, 0, "{err}");
    }
}

#[test]
fn check_rejects_with_location_and_exit_1() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = write(
        tmp.path(),
        "listen: 127.0.0.1:1\ncache: {path: /tmp/x, max_size: 1MiB}\nupstreams:\n  o: {servers: [\"127.0.0.1:2\"]}\nroutes:\n  - match: {host: \"*\"}\n    upstream: orgin\n",
    );
    let (code, _, err) = zerocache(&["check", "-c", &cfg]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        format!(
            "error: {cfg}:7:5: routes[0].upstream: upstream `orgin` is not defined; defined: o"
        )
    );
}

#[test]
fn run_fails_fast_when_the_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = write(
        tmp.path(),
        &format!(
            "listen: 127.0.0.1:{port}\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\nprobe: {{enabled: false}}\n",
            tmp.path().join("c").display()
        ),
    );
    let (code, _, err) = zerocache(&["run", "-c", &cfg]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port} (listen)")),
        "{err}"
    );
    assert!(err.contains("Address already in use"), "{err}");
    // stderr is a pipe here, as under systemd: log lines, and no colour codes in them.
    assert!(err.contains("cache index rebuilt"), "{err}");
    assert!(
        !err.contains('\x1b'),
        "ANSI escapes on a non-terminal: {err:?}"
    );
}

#[test]
fn check_quiet_prints_nothing_on_success_and_the_error_on_failure() {
    let tmp = tempfile::tempdir().expect("tmp");
    let valid = format!(
        "listen: 127.0.0.1:1\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\n",
        tmp.path().join("c").display()
    );
    let cfg = write(tmp.path(), &valid);
    for flag in ["-q", "--quiet"] {
        assert_eq!(
            zerocache(&["check", flag, "-c", &cfg]),
            (0, String::new(), String::new()),
            "{flag}"
        );
    }
    let cfg = write(tmp.path(), &valid.replace("upstream: o", "upstream: orgin"));
    assert_eq!(
        zerocache(&["check", "-q", "--config", &cfg]),
        (
            1,
            String::new(),
            format!(
                "error: {cfg}:7:5: routes[0].upstream: upstream `orgin` is not defined; defined: o\n"
            )
        )
    );
    // -q and --json ask for opposite things.
    assert_eq!(zerocache(&["check", "-q", "--json", "-c", &cfg]).0, 2);
}

#[test]
fn max_connections_above_the_fd_limit_is_clamped_with_a_warning() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    // The port is taken so `run` stops right after start-up, with its log on stderr.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = write(
        tmp.path(),
        &format!(
            "listen: 127.0.0.1:{port}\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\nprobe: {{enabled: false}}\nlimits: {{max_connections: 100000}}\n",
            tmp.path().join("c").display()
        ),
    );
    let out = std::process::Command::new("prlimit")
        .args(["--nofile=256:256", "--"])
        .arg(env!("CARGO_BIN_EXE_zerocache"))
        .args(["run", "-c", &cfg])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("limits.max_connections is above what RLIMIT_NOFILE allows; clamped max_connections=100000 nofile=256 clamped_to=256"),
        "{err}"
    );
}

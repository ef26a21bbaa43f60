//! The `zerocache` command line: `check` validates without connecting, `run` fails fast.

use crate::support::require;
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
    assert!(
        err.contains("cache index loading in the background"),
        "{err}"
    );
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
    // -q with --json: nothing on success, the errors as JSON (for machines) on failure.
    let (code, out, err) = zerocache(&["check", "-q", "--json", "-c", &cfg]);
    assert_eq!((code, err.as_str()), (1, ""));
    let v: serde_json::Value = serde_json::from_str(&out).expect("json errors");
    assert_eq!(v["valid"], false, "{v}");
    assert_eq!(v["errors"][0]["line"], 7, "{v}");
    let good = write(tmp.path(), &valid);
    assert_eq!(
        zerocache(&["check", "--json", "-q", "-c", &good]),
        (0, String::new(), String::new())
    );
}

#[test]
fn max_connections_above_the_fd_limit_is_clamped_with_a_warning() {
    if !require::command("prlimit") {
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

#[test]
fn check_reports_every_error_in_the_file_and_json_too() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Three sections that do not fit the schema: each is named, in file order.
    let cfg = write(
        tmp.path(),
        "listen: 127.0.0.1:1\ncache:\n  path: /tmp/x\n  max_size: lots\nupstreams:\n  o: {servers: [\"127.0.0.1:2\"]}\nroutes:\n  - match: {host: \"*\"}\n    upstream: o\nlimits:\n  max_connections: many\nlogging:\n  levle: info\n",
    );
    let (code, out, err) = zerocache(&["check", "-c", &cfg]);
    assert_eq!((code, out.as_str()), (1, ""));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].starts_with(&format!(
            "error: {cfg}:4:13: cache.max_size: `lots` is not a size"
        )),
        "{err}"
    );
    assert_eq!(
        lines[1],
        format!(
            "error: {cfg}:11:20: limits.max_connections: invalid type: string \"many\", expected a whole number (0 or more)"
        )
    );
    assert!(
        lines[2].starts_with(&format!(
            "error: {cfg}:13:3: logging: unknown field `levle`"
        )),
        "{err}"
    );
    assert!(lines[2].ends_with("did you mean `level`?"), "{err}");

    // Once the schema fits, every validation error at once.
    let cfg = write(
        tmp.path(),
        "listen: 127.0.0.1:1\ncache: {path: /tmp/x, max_size: 1MiB, max_entries: 0}\nupstreams:\n  o: {servers: [\"127.0.0.1:2\"]}\nroutes:\n  - match: {host: \"*\"}\n    upstream: orgin\nworkers: {count: 0}\n",
    );
    let (code, _, err) = zerocache(&["check", "-c", &cfg]);
    assert_eq!(code, 1);
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            format!("error: {cfg}:2:1: cache.max_entries: must be positive"),
            format!(
                "error: {cfg}:7:5: routes[0].upstream: upstream `orgin` is not defined; defined: o"
            ),
            format!(
                "error: {cfg}:8:1: workers.count: 0 workers: use 1 to 1024, or leave it out for one per CPU"
            ),
        ]
    );
    let (code, out, _) = zerocache(&["check", "-c", &cfg, "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["errors"][1]["line"], 7);
    assert_eq!(v["errors"][1]["column"], 5);
    assert_eq!(
        v["errors"][1]["message"],
        "routes[0].upstream: upstream `orgin` is not defined; defined: o"
    );
}

#[test]
fn check_prints_every_size_in_bytes_and_binary() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = write(
        tmp.path(),
        &format!(
            "listen: 127.0.0.1:1\ncache: {{path: {}, max_size: 1g, scrub_rate: 10MB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\n",
            tmp.path().join("c").display()
        ),
    );
    let (code, out, err) = zerocache(&["check", "-c", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("#   cache.max_size: 1073741824 (1 GiB)\n"),
        "{out}"
    );
    assert!(
        out.contains("#   cache.scrub_rate: 10000000 (9.53 MiB)\n"),
        "{out}"
    );
    let (_, json, _) = zerocache(&["check", "-c", &cfg, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["cache"]["max_size"], 1_073_741_824u64);
}

/// `check` prints the effective config for terminals, CI logs and the journal: the dashboard token
/// and the fleet secret appear as `<redacted>`, in YAML and in JSON.
#[test]
fn check_redacts_the_dashboard_token_and_the_fleet_secret() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = write(
        tmp.path(),
        &format!(
            "listen: 127.0.0.1:7001\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\ndashboard: {{token: tok-3f9a1c7e-secret}}\nfleet:\n  self: 127.0.0.1:7001\n  peers: [127.0.0.1:7001, 127.0.0.2:7001]\n  secret: fleet-8d2b44aa-secret\n",
            tmp.path().join("c").display()
        ),
    );
    for args in [
        &["check", "-c", &cfg][..],
        &["check", "-c", &cfg, "--json"][..],
    ] {
        let (code, out, err) = zerocache(args);
        assert_eq!(code, 0, "{err}");
        assert!(
            !out.contains("tok-3f9a1c7e") && !err.contains("tok-3f9a1c7e"),
            "{out}"
        );
        assert!(
            !out.contains("fleet-8d2b44aa") && !err.contains("fleet-8d2b44aa"),
            "{out}"
        );
        assert_eq!(out.matches("<redacted>").count(), 2, "{out}");
    }
}

/// `probe-check` as root: one `ok` line per program, the copy-loop read side, exit 0; as nobody:
/// the reason (with the kernel's release) and exit 1, having written nothing.
#[test]
fn probe_check_lists_every_program_and_fails_where_accounting_would_be_incomplete() {
    if !require::root("loads the eBPF probe and drops to nobody with setpriv")
        || !require::command("setpriv")
    {
        return;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let release = release.trim();
    let (code, out, err) = zerocache(&["probe-check"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("kernel {release} (the probe needs 5.15 or later)")
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("ok ")).count(),
        15,
        "{out}"
    );
    assert!(
        lines.contains(&"ok       exit_sendfile (accounting): syscalls/sys_exit_sendfile64"),
        "{out}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("probe: complete (16 attachments): the proxy's accounting is whole on this kernel")
    );
    let (code, json, _) = zerocache(&["probe-check", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["programs"].as_array().map(Vec::len), Some(14), "{v}");
    assert_eq!(v["copy_loop"]["attached"], true, "{v}");

    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_zerocache"))
        .arg("probe-check")
        .output()
        .expect("setpriv");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "probe: unavailable: loading the BPF object failed on kernel {release}: "
        )),
        "{text}"
    );
    assert!(!text.contains("ok "), "{text}");
}

/// The manual pages under `docs/man/` (what the package installs) are what the binary generates
/// now: an option added or changed without `zerocache man --out docs/man` fails here. One page
/// per visible subcommand, and the configuration's page holds the annotated example whole.
#[test]
fn the_manual_pages_are_up_to_date() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["man", "--out"])
        .arg(dir.path())
        .output()
        .expect("zerocache man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/man");
    let names = |d: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(dir.path()),
        [
            "zerocache-check-cache.8",
            "zerocache-check.8",
            "zerocache-probe-check.8",
            "zerocache-run.8",
            "zerocache-upgrade.8",
            "zerocache-watch.8",
            "zerocache.8",
            "zerocache.yaml.5",
        ]
    );
    assert_eq!(names(&committed), names(dir.path()));
    for name in names(dir.path()) {
        let fresh = std::fs::read(dir.path().join(&name)).expect("fresh");
        let kept = std::fs::read(committed.join(&name)).expect("committed");
        assert!(
            fresh == kept,
            "docs/man/{name} is stale: run `cargo run -p zerocache -- man --out docs/man`"
        );
    }
    let yaml5 = std::fs::read_to_string(dir.path().join("zerocache.yaml.5")).expect("page");
    for line in include_str!("../../../config/zerocache.example.yaml").lines() {
        let escaped = line.replace('\\', "\\e");
        assert!(
            yaml5.contains(&escaped),
            "missing from zerocache.yaml(5): {line}"
        );
    }
    // man(1) itself renders them without a warning, where it is installed (a check beside the
    // test's subject, so its absence is no skip).
    if require::on_path("man") {
        for name in ["zerocache.8", "zerocache-upgrade.8", "zerocache.yaml.5"] {
            let out = Command::new("man")
                .args(["--warnings", "-l"])
                .arg(dir.path().join(name))
                .env("MANWIDTH", "100")
                .output()
                .expect("man");
            assert!(out.status.success(), "{name}");
            assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{name}");
        }
    }
}

/// `zerocache check` created the cache directory: a check says whether a start would work and
/// leaves the disk as it was. A directory that does not exist yet is fine where it could be
/// created; under a file, or (as another user) under a directory it may not write, it is an
/// error naming `cache.path`.
#[test]
fn check_creates_nothing_and_says_where_the_cache_directory_could_not_be_made() {
    let tmp = tempfile::tempdir().expect("tmp");
    let config = |path: &std::path::Path| {
        write(
            tmp.path(),
            &format!(
                "listen: 127.0.0.1:1\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\n",
                path.display()
            ),
        )
    };
    let deep = tmp.path().join("a/b/cache");
    let (code, _, err) = zerocache(&["check", "-q", "-c", &config(&deep)]);
    assert_eq!(code, 0, "{err}");
    assert!(!tmp.path().join("a").exists(), "check created a directory");

    // A link to nothing: run's create_dir_all would fail with EEXIST.
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("gone"), &dangling).expect("symlink");
    let (code, _, err) = zerocache(&["check", "-q", "-c", &config(&dangling)]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "cache.path: `{}` is a symbolic link to a path that does not exist",
            dangling.display()
        )),
        "{err}"
    );

    std::fs::write(tmp.path().join("file"), b"").expect("file");
    let (code, _, err) = zerocache(&["check", "-q", "-c", &config(&tmp.path().join("file/cache"))]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cache.path")
            && err.contains(&format!(
                "`{}` is not a directory, so the cache directory cannot be created",
                tmp.path().join("file").display()
            )),
        "{err}"
    );

    if !require::root("checks as nobody a cache directory under one only root may write") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = config(&deep);
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-q", "-c", &cfg])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot create `{}` in `{}`: EACCES",
            deep.display(),
            tmp.path().display()
        )),
        "{err}"
    );
}

//! The Debian package, for real: `cargo xtask package` builds it, dpkg installs it, the installed
//! binary checks the installed config, and `dpkg -r` / `dpkg -P` remove it as dpkg promises
//! (conffiles kept on remove, gone on purge). Needs root, dpkg and cargo-deb (which
//! `cargo xtask setup` installs); skips with the reason otherwise (fails under
//! `ZEROCACHE_REQUIRE_PRIVILEGED=1`). The release build makes it the slowest test (minutes on a
//! fresh target directory), so it builds once and checks everything on that one package.

use crate::support::require;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// (exit code, stdout, stderr) of a command; panics if it cannot start.
fn run(program: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// stdout of a command that must succeed.
fn ok(program: &str, args: &[&str]) -> String {
    let (code, out, err) = run(program, args);
    assert_eq!(code, 0, "{program} {args:?}: {err}{out}");
    out
}

fn works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// dpkg's status of a package ("install ok installed", "deinstall ok config-files"), or None.
fn status(package: &str) -> Option<String> {
    let (code, out, _) = run("dpkg-query", &["-W", "-f=${Status}", package]);
    (code == 0).then_some(out)
}

/// True if this machine can run the test; otherwise the skip (or, under
/// `ZEROCACHE_REQUIRE_PRIVILEGED=1`, the failure) says why.
fn can_run() -> bool {
    if !require::root("installs a package with dpkg") {
        return false;
    }
    if !["dpkg", "dpkg-deb", "dpkg-query", "readelf"]
        .iter()
        .all(|tool| require::command(tool))
    {
        return false;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !require::that(
        works(&cargo, &["deb", "--version"]),
        "cargo-deb (`cargo xtask setup` installs it)",
    ) {
        return false;
    }
    ["zerocache", "zerocache-dbgsym"].iter().all(|package| {
        let installed = status(package).filter(|s| !s.ends_with("not-installed"));
        require::that(
            installed.is_none(),
            &format!(
                "no `{package}` package on this machine (it is {}; the test would replace it)",
                installed.as_deref().unwrap_or("")
            ),
        )
    })
}

/// Purges what the test installed and the cache directory `check` created, even when an
/// assertion failed half-way.
struct Cleanup {
    cache_dir_existed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("dpkg", &["-P", "zerocache-dbgsym", "zerocache"]);
        if !self.cache_dir_existed {
            let _ = std::fs::remove_dir_all("/var/cache/zerocache");
        }
    }
}

/// ELF section names, from `readelf -S --wide`.
fn sections(file: &str) -> Vec<String> {
    ok("readelf", &["-S", "--wide", file])
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(']')?;
            let name = rest.split_whitespace().next()?;
            name.starts_with('.').then(|| name.to_string())
        })
        .collect()
}

/// The GNU build id of an ELF file, in hex.
fn build_id(file: &str) -> String {
    ok("readelf", &["-n", file])
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("{file} has no build id"))
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `apt upgrade` of a running proxy: the package installed again over itself while the packaged
/// config runs (started by hand, as without systemd), and its postinst hands the process to
/// the new binary with `zerocache upgrade`. The pid file then names a new process, which
/// answers, and the old one is gone.
fn upgrade_in_place_while_running(deb: &str) {
    let free = [8080, 9180]
        .iter()
        .all(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok());
    if !require::that(free, "127.0.0.1:8080 and :9180 free (the packaged ports)") {
        return;
    }
    let pid_file = Path::new("/run/zerocache/zerocache.pid");
    // What the unit's RuntimeDirectory= and LogsDirectory= would make.
    std::fs::create_dir_all("/run/zerocache").expect("RuntimeDirectory");
    std::fs::create_dir_all("/var/log/zerocache").expect("LogsDirectory");
    let mut old = Command::new("/usr/bin/zerocache")
        .args(["run", "--config", "/etc/zerocache/zerocache.yaml"])
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("start the packaged proxy");
    let old_pid = old.id();
    struct Stop(Option<u32>);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(pid) = self.0 {
                // SAFETY: the successor this test caused.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = std::fs::remove_dir_all("/run/zerocache");
        }
    }
    let mut stop = Stop(None);
    let pid_of = || {
        std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while pid_of() != Some(old_pid) {
        assert!(
            Instant::now() < deadline,
            "the packaged proxy did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, out, err) = run("dpkg", &["-i", deb]);
    let new_pid = pid_of();
    stop.0 = new_pid.filter(|p| *p != old_pid);
    let _ = old.kill();
    let old_status = old.wait().expect("old process");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("upgraded: pid {old_pid} -> ")),
        "the postinst ran zerocache upgrade: {out}{err}"
    );
    assert!(
        stop.0.is_some(),
        "the pid file names a new process: {new_pid:?}"
    );
    assert_eq!(
        old_status.code(),
        Some(0),
        "the old process drained and exited"
    );
    let health = Command::new("curl")
        .args(["-s", "http://127.0.0.1:9180/healthz"])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&health.stdout), "ok\n");
}

#[test]
fn the_debian_package_installs_checks_its_config_and_removes_cleanly() {
    if !can_run() {
        return;
    }
    let root = workspace();
    let _cleanup = Cleanup {
        cache_dir_existed: Path::new("/var/cache/zerocache").exists(),
    };

    // Build it the way the README says. The outer `cargo test` does not hold the build lock while
    // tests run, and the release build goes to target/release anyway.
    let started = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .args(["xtask", "package"])
        .current_dir(&root)
        .status()
        .expect("cargo xtask package");
    assert!(built.success(), "cargo xtask package: {built}");
    eprintln!("package built in {:.0} s", started.elapsed().as_secs_f64());
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| root.join(t))
        .unwrap_or_else(|| root.join("target"));
    let debian = target.join("debian");
    let deb = debian.join(format!("zerocache_{VERSION}_amd64.deb"));
    let ddeb = debian.join(format!("zerocache-dbgsym_{VERSION}_amd64.ddeb"));
    let (deb_s, ddeb_s) = (deb.to_str().expect("utf8"), ddeb.to_str().expect("utf8"));

    // The control fields: a native amd64 package that needs only the C runtime, no toolchain.
    let fields = ok(
        "dpkg-deb",
        &["-f", deb_s, "Package", "Version", "Architecture"],
    );
    assert_eq!(
        fields,
        format!("Package: zerocache\nVersion: {VERSION}\nArchitecture: amd64\n")
    );
    let depends = ok("dpkg-deb", &["-f", deb_s, "Depends"]);
    let names: Vec<&str> = depends
        .split(',')
        .filter_map(|d| d.split_whitespace().next())
        .collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| ["libc6", "libgcc-s1"].contains(n)),
        "Depends: {depends}"
    );
    let mut conffiles: Vec<String> = ok("dpkg-deb", &["-I", deb_s, "conffiles"])
        .lines()
        .map(str::to_string)
        .collect();
    conffiles.sort();
    assert_eq!(
        conffiles,
        [
            "/etc/logrotate.d/zerocache",
            "/etc/zerocache/zerocache.yaml"
        ]
    );

    // Install.
    ok("dpkg", &["-i", deb_s]);
    assert_eq!(status("zerocache").as_deref(), Some("install ok installed"));
    let bin = "/usr/bin/zerocache";
    assert_eq!(ok(bin, &["--version"]), format!("zerocache {VERSION}\n"));
    for (installed, source) in [
        (
            "/lib/systemd/system/zerocache.service",
            "config/zerocache.service",
        ),
        (
            "/etc/zerocache/zerocache.yaml",
            "config/packaging/zerocache.yaml",
        ),
        ("/etc/logrotate.d/zerocache", "config/packaging/logrotate"),
        (
            "/lib/systemd/system/zerocache.socket",
            "config/packaging/zerocache.socket",
        ),
        (
            "/lib/systemd/system/zerocache-dashboard.socket",
            "config/packaging/zerocache-dashboard.socket",
        ),
        (
            "/usr/share/doc/zerocache/systemd/socket-activation.conf",
            "config/packaging/socket-activation.conf",
        ),
        ("/usr/share/doc/zerocache/README.md", "README.md"),
        (
            "/usr/share/doc/zerocache/zerocache.example.yaml",
            "config/zerocache.example.yaml",
        ),
        (
            "/usr/share/doc/zerocache/grafana/zerocache.json",
            "dashboard/grafana/zerocache.json",
        ),
        (
            "/usr/share/doc/zerocache/grafana/prometheus.yml",
            "dashboard/grafana/prometheus.yml",
        ),
        (
            "/usr/share/doc/zerocache/grafana/zerocache-alerts.yml",
            "dashboard/grafana/zerocache-alerts.yml",
        ),
    ] {
        assert_eq!(
            read(installed),
            read(root.join(source).to_str().expect("utf8")),
            "{installed} is {source}"
        );
    }
    // Every document the installed README links to is beside it, and the fleet's files.
    let mut docs: Vec<(String, String)> = std::fs::read_dir(root.join("docs"))
        .expect("docs")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") || n.ends_with(".png"))
        .map(|n| {
            (
                format!("/usr/share/doc/zerocache/docs/{n}"),
                format!("docs/{n}"),
            )
        })
        .collect();
    docs.sort();
    assert!(docs.len() >= 10, "{docs:?}");
    for (installed, source) in [
        (
            "grafana/zerocache-fleet.json",
            "dashboard/grafana/zerocache-fleet.json",
        ),
        (
            "grafana/fleet-rules.yml",
            "dashboard/grafana/fleet-rules.yml",
        ),
        (
            "grafana/fleet-prometheus.yml",
            "dashboard/grafana/fleet-prometheus.yml",
        ),
        ("fleet/fleet.conf", "config/fleet/fleet.conf"),
        (
            "fleet/zerocache-fleet.example.yaml",
            "config/fleet/zerocache-fleet.example.yaml",
        ),
    ] {
        docs.push((
            format!("/usr/share/doc/zerocache/{installed}"),
            source.to_string(),
        ));
    }
    for (installed, source) in &docs {
        let want = std::fs::read(root.join(source)).expect("source");
        assert!(
            std::fs::read(installed).ok().as_deref() == Some(want.as_slice()),
            "{installed} is not {source}"
        );
    }
    let readme = read("/usr/share/doc/zerocache/README.md");
    for link in readme.split("](docs/").skip(1) {
        let name = link.split([')', '#']).next().unwrap_or_default();
        assert!(
            Path::new(&format!("/usr/share/doc/zerocache/docs/{name}")).is_file(),
            "the installed README links to docs/{name}, which is not installed"
        );
    }
    assert!(Path::new("/usr/share/doc/zerocache/copyright").is_file());
    // The manual pages, as generated into docs/man/ (gzipped by the packager, as Debian wants).
    for entry in std::fs::read_dir(root.join("docs/man")).expect("docs/man") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let section = name.rsplit('.').next().unwrap_or_default();
        let installed = [
            format!("/usr/share/man/man{section}/{name}"),
            format!("/usr/share/man/man{section}/{name}.gz"),
        ];
        let found = installed.iter().find(|p| Path::new(p).is_file());
        let Some(found) = found else {
            panic!("docs/man/{name} is not installed: {installed:?}");
        };
        let text = if found.ends_with(".gz") {
            ok("zcat", &[found])
        } else {
            read(found)
        };
        assert_eq!(
            text,
            read(root.join("docs/man").join(&name).to_str().expect("utf8"))
        );
    }
    // Enabled for boot by the generated postinst (deb-systemd-helper), not started.
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/zerocache.service");
    assert_eq!(
        std::fs::read_link(wants).ok(),
        Some(PathBuf::from("/lib/systemd/system/zerocache.service"))
    );
    // The socket units are there to choose, not enabled.
    for unit in ["zerocache.socket", "zerocache-dashboard.socket"] {
        let link = format!("/etc/systemd/system/sockets.target.wants/{unit}");
        assert!(Path::new(&link).symlink_metadata().is_err(), "{link}");
    }

    // The installed config is valid as shipped, and says what the package promises.
    assert_eq!(
        run(bin, &["check", "-q", "-c", "/etc/zerocache/zerocache.yaml"]),
        (0, String::new(), String::new())
    );
    let effective: serde_json::Value = serde_json::from_str(&ok(
        bin,
        &["check", "--json", "-c", "/etc/zerocache/zerocache.yaml"],
    ))
    .expect("check --json");
    assert_eq!(effective["listen"], "127.0.0.1:8080");
    assert_eq!(effective["cache"]["path"], "/var/cache/zerocache");
    assert_eq!(
        effective["upstreams"]["origin"]["servers"],
        serde_json::json!(["127.0.0.1:8081"])
    );
    assert_eq!(effective["dashboard"]["listen"], "127.0.0.1:9180");
    assert_eq!(
        effective["logging"]["access_log"],
        "/var/log/zerocache/access.log"
    );

    // Stripped, and much smaller than the release build it came from; the debug info is in the
    // dbgsym package, under the binary's build id.
    let names = sections(bin);
    assert!(names.iter().any(|n| n == ".text"), "{names:?}");
    // (.debug_gdb_scripts is rustc's pointer to gdb pretty-printers, not debug info.)
    for debug in [".debug_info", ".debug_line", ".debug_str", ".symtab"] {
        assert!(!names.iter().any(|n| n == debug), "{debug} in {names:?}");
    }
    assert!(names.iter().any(|n| n == ".gnu_debuglink"), "{names:?}");
    let unstripped = target.join("release/zerocache");
    let unstripped_s = unstripped.to_str().expect("utf8");
    assert!(
        sections(unstripped_s).iter().any(|n| n == ".debug_info"),
        "the release build has debug info"
    );
    let (small, big) = (size(Path::new(bin)), size(&unstripped));
    eprintln!(
        "/usr/bin/zerocache: {small} bytes; target/release/zerocache: {big} bytes; .deb {} bytes; .ddeb {} bytes",
        size(&deb),
        size(&ddeb)
    );
    assert!(small * 2 < big, "stripped {small} bytes vs {big}");
    let id = build_id(bin);
    assert_eq!(id, build_id(unstripped_s));
    let debug_file = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    ok("dpkg", &["-i", ddeb_s]);
    assert!(
        sections(&debug_file).iter().any(|n| n == ".debug_info"),
        "{debug_file} holds the debug info"
    );

    // The units and the logrotate snippet parse as what they claim to be.
    if require::command("systemd-analyze") {
        for unit in [
            "zerocache.service",
            "zerocache.socket",
            "zerocache-dashboard.socket",
        ] {
            let (code, out, err) = run(
                "systemd-analyze",
                &["verify", &format!("/lib/systemd/system/{unit}")],
            );
            assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""), "{unit}");
        }
    }

    upgrade_in_place_while_running(deb_s);
    if require::command("logrotate") {
        let (code, _, err) = run("logrotate", &["-d", "/etc/logrotate.d/zerocache"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains("rotating pattern: /var/log/zerocache/*.log  after 1 days (14 rotations)"),
            "{err}"
        );
    }

    // Remove: the program and the unit go, the conffiles stay.
    ok("dpkg", &["-r", "zerocache-dbgsym", "zerocache"]);
    assert_eq!(
        status("zerocache").as_deref(),
        Some("deinstall ok config-files")
    );
    for gone in [
        bin,
        "/lib/systemd/system/zerocache.service",
        debug_file.as_str(),
    ] {
        assert!(!Path::new(gone).exists(), "{gone} after dpkg -r");
    }
    for kept in [
        "/etc/zerocache/zerocache.yaml",
        "/etc/logrotate.d/zerocache",
    ] {
        assert!(Path::new(kept).is_file(), "{kept} after dpkg -r");
    }

    // What the service makes while it runs (DynamicUser: the data under private/, a symlink
    // beside it), made here as systemd would, since the test does not start it.
    // (An earlier step may have made the plain directory, as a service without DynamicUser
    // would: it is filled instead, and must go as well.)
    for base in ["/var/cache", "/var/log"] {
        let link = format!("{base}/zerocache");
        if Path::new(&link).is_dir() && !Path::new(&link).is_symlink() {
            std::fs::write(format!("{link}/data"), b"x").expect("data");
            continue;
        }
        let private = format!("{base}/private/zerocache");
        std::fs::create_dir_all(&private).expect("private dir");
        std::fs::write(format!("{private}/data"), b"x").expect("data");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("private/zerocache", &link).expect("symlink");
    }
    // An admin who enabled socket activation: its link goes with the purge, as the unit did.
    let socket_link = Path::new("/etc/systemd/system/sockets.target.wants/zerocache.socket");
    std::fs::create_dir_all(socket_link.parent().expect("parent")).expect("wants dir");
    let _ = std::fs::remove_file(socket_link);
    std::os::unix::fs::symlink("/lib/systemd/system/zerocache.socket", socket_link)
        .expect("enable the socket unit");
    // Purge: the conffiles, the boot-time symlink, the cache and the logs go too.
    ok("dpkg", &["-P", "zerocache"]);
    assert!(
        socket_link.symlink_metadata().is_err(),
        "{} after dpkg -P",
        socket_link.display()
    );
    let after = status("zerocache");
    assert!(
        after
            .as_deref()
            .is_none_or(|s| s.ends_with("not-installed")),
        "{after:?}"
    );
    for gone in [
        "/etc/zerocache/zerocache.yaml",
        "/etc/zerocache",
        "/etc/logrotate.d/zerocache",
        "/var/cache/private/zerocache",
        "/var/log/private/zerocache",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} after dpkg -P");
    }
    for link in ["/var/cache/zerocache", "/var/log/zerocache"] {
        assert!(
            Path::new(link).symlink_metadata().is_err(),
            "{link} after dpkg -P"
        );
    }
    assert!(
        wants.symlink_metadata().is_err(),
        "{} after dpkg -P",
        wants.display()
    );
}

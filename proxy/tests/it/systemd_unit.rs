//! The systemd unit's own command lines, run as systemd runs them: config/zerocache.service's
//! ExecStartPre=, ExecStart= and ExecReload= lines with the binary and config paths swapped for
//! the test's, and `$NOTIFY_SOCKET` pointing at a socket the test reads, so `Type=notify`,
//! `check -q` and the two-step reload are checked as written in the unit, not as retyped here.

use crate::support::*;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

const UNIT: &str = include_str!("../../../config/zerocache.service");

/// Every `KEY=` line of the unit's [Service] section, in order.
fn unit_lines(key: &str) -> Vec<&'static str> {
    let prefix = format!("{key}=");
    UNIT.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

/// A unit command line as argv, with the packaged paths replaced. The unit's lines use neither
/// quotes nor systemd's `-@+!` prefixes, and systemd runs them without a shell: splitting on
/// whitespace is what systemd does with them.
fn argv(line: &str, bin: &str, config: &str, mainpid: Option<u32>) -> Vec<String> {
    assert!(
        !line.contains(['"', '\'', '\\', ';', '|', '&']),
        "a unit line this test cannot split like systemd: {line}"
    );
    assert!(
        !line.starts_with(['-', '@', '+', '!', ':']),
        "a prefixed unit line: {line}"
    );
    line.split_whitespace()
        .map(|w| match w {
            "/usr/bin/zerocache" => bin.to_string(),
            "/etc/zerocache/zerocache.yaml" => config.to_string(),
            "$MAINPID" => mainpid.expect("$MAINPID outside ExecReload").to_string(),
            w => w.to_string(),
        })
        .collect()
}

/// Runs one unit line to completion: (exit code, stdout, stderr).
fn run_line(argv: &[String]) -> (i32, String, String) {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {argv:?}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the ExecReload= lines in order and stops at the first failure, as systemd does; returns
/// how many ran and the last one's result.
fn reload(lines: &[Vec<String>]) -> (usize, (i32, String, String)) {
    let mut last = (0, String::new(), String::new());
    for (i, line) in lines.iter().enumerate() {
        last = run_line(line);
        if last.0 != 0 {
            return (i + 1, last);
        }
    }
    (lines.len(), last)
}

/// The next notification, or None after `wait`.
fn next(socket: &UnixDatagram, wait: Duration) -> Option<String> {
    socket.set_read_timeout(Some(wait)).expect("timeout");
    let mut buf = [0u8; 4096];
    match socket.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            None
        }
        Err(e) => panic!("notify socket: {e}"),
    }
}

/// The proxy, killed if the test fails before it stops it.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn monotonic_usec() -> u64 {
    zerocache::exports::monotonic_usec()
}

#[test]
fn the_units_exec_lines_check_start_notify_reload_and_stop() {
    // The unit as the package installs it: notify readiness, check before start and reload.
    assert_eq!(unit_lines("Type"), ["notify"]);
    assert_eq!(unit_lines("NotifyAccess"), ["main"]);
    let (pre, start, reloads) = (
        unit_lines("ExecStartPre"),
        unit_lines("ExecStart"),
        unit_lines("ExecReload"),
    );
    assert_eq!((pre.len(), start.len(), reloads.len()), (1, 1, 2));

    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let (port, dport) = (free_port(), free_port());
    let config = tmp.path().join("zerocache.yaml");
    let good = format!(
        "listen: 127.0.0.1:{port}\ncache: {{path: {}, max_size: 64MiB}}\nupstreams:\n  origin: {{servers: [\"{}\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: origin\ndashboard: {{listen: 127.0.0.1:{dport}}}\nprobe: {{enabled: false}}\n",
        tmp.path().join("cache").display(),
        origin.addr()
    );
    std::fs::write(&config, &good).expect("config");
    let (bin, cfg) = (
        env!("CARGO_BIN_EXE_zerocache"),
        config.to_str().expect("utf8 path"),
    );

    // ExecStartPre: valid, so exit 0 and, with -q, not a byte of output.
    assert_eq!(
        run_line(&argv(pre[0], bin, cfg, None)),
        (0, String::new(), String::new())
    );

    // ExecStart under a notify socket: READY=1 once it serves.
    let sock_path = tmp.path().join("notify");
    let socket = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    let start = argv(start[0], bin, cfg, None);
    let mut child = Running(
        Command::new(&start[0])
            .args(&start[1..])
            .env("NOTIFY_SOCKET", &sock_path)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn ExecStart"),
    );
    let pid = child.0.id();
    let ready = next(&socket, Duration::from_secs(20));
    assert_eq!(ready.as_deref(), Some("READY=1"));
    // Both listeners accept the moment READY=1 is sent.
    for addr in [port, dport] {
        std::net::TcpStream::connect(("127.0.0.1", addr))
            .unwrap_or_else(|e| panic!("port {addr} after READY=1: {e}"));
    }
    let proxy_addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let r = Client::connect(proxy_addr).get("/obj/10", &[]);
    assert_eq!((r.status, r.body.clone()), (200, body(10)));

    // ExecReload, valid: both lines run; RELOADING=1 with the time, then READY=1.
    let reload_lines: Vec<Vec<String>> = reloads
        .iter()
        .map(|l| argv(l, bin, cfg, Some(pid)))
        .collect();
    let before = monotonic_usec();
    assert_eq!(
        reload(&reload_lines),
        (2, (0, String::new(), String::new()))
    );
    let reloading = next(&socket, Duration::from_secs(10)).expect("RELOADING=1");
    let after = monotonic_usec();
    let usec: u64 = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .unwrap_or_else(|| panic!("not a reload notification: {reloading:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("MONOTONIC_USEC in {reloading:?}: {e}"));
    assert!(
        (before..=after).contains(&usec),
        "{before} <= {usec} <= {after}"
    );
    assert_eq!(
        next(&socket, Duration::from_secs(10)).as_deref(),
        Some("READY=1")
    );

    // ExecReload, invalid: `check -q` fails naming the file, the kill line never runs, so the
    // proxy gets no signal and says nothing.
    std::fs::write(
        &config,
        good.replace("upstream: origin", "upstream: nowhere"),
    )
    .expect("bad config");
    let (ran, (code, out, err)) = reload(&reload_lines);
    assert_eq!((ran, code, out.as_str()), (1, 1, ""));
    assert_eq!(
        err,
        format!(
            "error: {cfg}:7:5: routes[0].upstream: upstream `nowhere` is not defined; defined: origin\n"
        )
    );
    assert_eq!(next(&socket, Duration::from_millis(500)), None);
    let r = Client::connect(proxy_addr).get("/obj/10", &[]);
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));

    // systemctl stop: SIGTERM, STOPPING=1 as the drain starts, exit 0.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert_eq!(
        next(&socket, Duration::from_secs(10)).as_deref(),
        Some("STOPPING=1")
    );
    assert_eq!(child.0.wait().expect("wait").code(), Some(0));
}

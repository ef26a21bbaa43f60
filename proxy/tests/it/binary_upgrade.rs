//! Restarts that refuse nothing: the SIGUSR2 binary upgrade (through `zerocache upgrade`, as the
//! package runs it), a failed one that leaves the old process serving, and systemd socket
//! activation, where the listening sockets outlive the process.
//!
//! Each test counts every request made across the change on new connections: not one may fail.

use crate::support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_zerocache");

/// Kills the process the pid file names at the end of a test, unless it is `old` (the test's
/// own child, killed by its `Proxy`): a successor is nobody's child once its parent exits.
struct Successor {
    pid_file: PathBuf,
    old: u32,
}

impl Drop for Successor {
    fn drop(&mut self) {
        if let Some(pid) = read_pid(&self.pid_file)
            && pid != self.old
        {
            // SAFETY: the successor this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| !rest.starts_with(['Z', 'X']))
}

/// Requests on new connections, one after another until stopped: (answered 200 with the
/// exact body, anything else with what it was).
struct Loop {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Loop {
    fn start(addr: SocketAddr) -> Loop {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let (s, o) = (stop.clone(), ok.clone());
        let thread = std::thread::spawn(move || {
            let mut failures = Vec::new();
            let expected = body(100);
            while !s.load(Ordering::Relaxed) {
                match one_get(addr, "/obj/100") {
                    Ok((200, b)) if b == expected => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((status, b)) => failures.push(format!("{status} with {} bytes", b.len())),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            failures
        });
        Loop { stop, ok, thread }
    }

    fn answered(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` more requests were answered.
    fn wait_for(&self, n: u64, what: &str) {
        let target = self.answered() + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answered() < target {
            assert!(Instant::now() < deadline, "{what}: no answers");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops; returns (answered, failures).
    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.thread.join().expect("loop");
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

/// One GET on a new connection that closes after it: (status, body).
fn one_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test.example\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no head in {} bytes", all.len())))?;
    let status = std::str::from_utf8(&all[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, all[end + 4..].to_vec()))
}

/// A 1 MiB GET read at about 512 KiB/s through a 16 KiB receive buffer, so the proxy is still
/// sending when the upgrade happens: the whole response.
fn slow_download(addr: SocketAddr) -> std::thread::JoinHandle<Vec<u8>> {
    let mut s = TcpStream::connect(addr).expect("connect");
    nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &16_384).expect("rcvbuf");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(b"GET /obj/1048576 HTTP/1.1\r\nHost: test.example\r\nConnection: close\r\n\r\n")
        .expect("send");
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = s.read(&mut chunk).expect("read");
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&chunk[..n]);
            std::thread::sleep(Duration::from_millis(16));
        }
    })
}

fn assert_whole_mib(all: &[u8]) {
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&all[..end])
    );
    assert_eq!(
        all.len() - end,
        1 << 20,
        "the download in flight must finish whole"
    );
    assert!(all[end..] == body(1 << 20)[..], "body bytes differ");
}

fn wait_exit(proxy: &mut Proxy, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = proxy.child.try_wait().expect("status") {
            return s;
        }
        assert!(Instant::now() < deadline, "the old process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A proxy in front of `origin` with `pid_file` in `dir` (its path returned), and the guard that
/// kills its successor at the end of the test.
fn upgradable(origin: SocketAddr, dir: &Path, opts: Opts) -> (Proxy, PathBuf, Successor) {
    let pid_file = dir.join("zerocache.pid");
    let proxy = Proxy::start(
        origin,
        Opts {
            extra_yaml: format!("pid_file: {}\n{}", pid_file.display(), opts.extra_yaml),
            ..opts
        },
    );
    let successor = Successor {
        pid_file: pid_file.clone(),
        old: proxy.child.id(),
    };
    wait_pid_file(&pid_file, proxy.child.id());
    (proxy, pid_file, successor)
}

/// The test: requests on new connections and a slow 1 MiB download in flight across
/// `zerocache upgrade`; none fails, the download is byte-exact, the old pid is gone and the pid
/// file names the new one, which serves the cache it found (a HIT) and the dashboard. systemd is
/// told the new main pid.
#[test]
fn sigusr2_hands_every_socket_to_the_new_binary_and_refuses_nothing() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let notify = Notify::bind(dir.path());
    let opts = Opts {
        env: vec![("NOTIFY_SOCKET", notify.path.display().to_string())],
        ..Opts::default()
    };
    let (mut proxy, pid_file, _successor) = upgradable(origin.addr(), dir.path(), opts);
    let old = proxy.child.id();
    assert_eq!(proxy.get("/obj/1048576").body.len(), 1 << 20);
    assert_eq!(proxy.get("/obj/100").status, 200);

    let requests = Loop::start(proxy.addr);
    requests.wait_for(20, "before the upgrade");
    let download = slow_download(proxy.addr);
    // Read at the client's pace (about 2 s): still in flight when the upgrade starts.
    assert!(!download.is_finished());
    let out = Command::new(BIN)
        .args(["upgrade", "--config"])
        .arg(&proxy.config)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("zerocache upgrade");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = read_pid(&pid_file).expect("pid file");
    assert_ne!(new, old);
    assert!(
        report.contains(&format!("upgraded: pid {old} -> {new}")),
        "{report}"
    );
    // The old process drained (the download kept it) and exited 0; the new one serves.
    assert_eq!(
        wait_exit(&mut proxy, Duration::from_secs(60)).code(),
        Some(0)
    );
    assert!(alive(new));
    requests.wait_for(20, "after the old process exited");
    let (answered, failures) = requests.finish();
    assert!(
        failures.is_empty(),
        "{} of {answered} failed: {failures:?}",
        failures.len()
    );
    assert_whole_mib(&download.join().expect("download"));
    // READY=1 from the old process only (the successor tells it instead), then the new main
    // pid, and the barrier the old one waited on before it drained and exited.
    assert_eq!(
        notify.finish(),
        vec![
            "READY=1".to_string(),
            format!("MAINPID={new}"),
            "BARRIER=1".to_string()
        ]
    );

    // The successor indexed the cache as it was left, and took the dashboard's socket too.
    assert_eq!(proxy.get("/obj/1048576").x_cache(), "HIT");
    let health = Client::connect(proxy.dashboard).get("/healthz", &[]);
    assert_eq!((health.status, health.body.as_slice()), (200, &b"ok\n"[..]));
    // The new process counts the upgrade that made it (the old one, which exited, never could
    // be scraped with it).
    let m = proxy.metrics();
    assert_eq!(
        metric(&m, "zerocache_binary_upgrades_total{result=\"failed\"}"),
        0
    );
    assert_eq!(
        metric(&m, "zerocache_binary_upgrades_total{result=\"served\"}"),
        1
    );
}

/// The old process writes its index at the hand-over and the successor starts from it: with
/// the successor's own load held, what it counts at once is what the snapshot named. It reads
/// the snapshot once (deleted), and serves from it.
#[test]
fn the_successor_starts_from_the_index_the_old_process_wrote() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let gate = dir.path().join("never");
    let opts = Opts {
        debug_yaml: format!("  hold_index_load: {}\n", gate.display()),
        ..Opts::default()
    };
    let (mut proxy, pid_file, _successor) = upgradable(origin.addr(), dir.path(), opts);
    let old = proxy.child.id();
    for n in [100, 200, 300] {
        assert_eq!(proxy.get(&format!("/obj/{n}")).x_cache(), "MISS");
    }
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(old as i32, libc::SIGUSR2) };
    assert_eq!(
        wait_exit(&mut proxy, Duration::from_secs(60)).code(),
        Some(0)
    );
    assert_ne!(read_pid(&pid_file), Some(old));
    let m = proxy.metrics();
    assert_eq!(
        (
            metric(&m, "zerocache_cache_index_loading"),
            metric(&m, "zerocache_cache_objects")
        ),
        (1, 3),
        "held, yet complete"
    );
    assert!(!proxy.dir.join("state/index.snap").exists(), "read once");
    let r = proxy.get("/obj/200");
    assert_eq!((r.x_cache(), &r.body), ("HIT", &body(200)));
}

/// A successor that cannot start (its config no longer validates, or names a port that is
/// taken) changes nothing: the old process counts the failure, keeps its pid file and serves
/// and stores as before. `zerocache upgrade` refuses a bad config before it signals anything,
/// and reports a failed upgrade with its reason as soon as it is known.
#[test]
fn a_failed_upgrade_leaves_the_old_process_serving_and_storing() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let (proxy, pid_file, _successor) = upgradable(origin.addr(), dir.path(), Opts::default());
    let old = proxy.child.id();
    let good = std::fs::read_to_string(&proxy.config).expect("config");
    std::fs::write(&proxy.config, format!("{good}no_such_key: 1\n")).expect("break it");

    let out = Command::new(BIN)
        .args(["upgrade", "--config"])
        .arg(&proxy.config)
        .output()
        .expect("zerocache upgrade");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was signalled"), "{err}");
    assert!(err.contains("no_such_key"), "{err}");

    let requests = Loop::start(proxy.addr);
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(old as i32, libc::SIGUSR2) };
    assert_eventually_eq(
        "the failed upgrade is counted",
        Duration::from_secs(30),
        || {
            let m = proxy.metrics();
            (
                metric(&m, "zerocache_binary_upgrades_total{result=\"failed\"}"),
                metric(&m, "zerocache_binary_upgrades_total{result=\"served\"}"),
            )
        },
        (1, 0),
    );
    // A config that validates but cannot be served (a new listener on a port that is taken):
    // `zerocache upgrade` signals, the successor fails, and the command says why at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a taken port");
    let taken_addr = taken.local_addr().expect("addr");
    std::fs::write(
        &proxy.config,
        good.replace(
            &format!("listen: {}", proxy.addr),
            &format!("listen: [\"{}\", \"{taken_addr}\"]", proxy.addr),
        ),
    )
    .expect("a second listener");
    let out = Command::new(BIN)
        .args(["upgrade", "--config"])
        .arg(&proxy.config)
        .output()
        .expect("zerocache upgrade");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the new process did not take over"), "{err}");
    // The reason the old process wrote beside the pid file when the successor exited, not the
    // command's own deadline ("no new process within ..."): reported as soon as it was known.
    assert!(err.contains("exited"), "{err}");
    assert!(!err.contains("no new process within"), "{err}");
    // And the new process's own reason, not its exit status alone.
    assert!(
        err.contains(&format!(
            "the new process exited (exit status: 1) before it was ready: cannot listen on {taken_addr} (listen): Address already in use"
        )),
        "{err}"
    );
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_binary_upgrades_total{result=\"failed\"}"
        ),
        2
    );
    drop(taken);
    requests.wait_for(20, "after the failed upgrades");
    let (answered, failures) = requests.finish();
    assert!(
        failures.is_empty(),
        "{} of {answered} failed: {failures:?}",
        failures.len()
    );
    assert_eq!(read_pid(&pid_file), Some(old));
    // Storing again: the hand-over's freeze was lifted.
    assert_eq!(proxy.get("/obj/777").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/777").x_cache(), "HIT");
}

/// Listening sockets bound by this test as systemd binds a `.socket` unit's, and the proxy
/// started on them as systemd starts the service: fds from 3, `LISTEN_PID` its own pid (set by
/// the shell it execs from), `LISTEN_FDNAMES` as the shipped socket units name them.
fn socket_activated(
    listeners: &[(&std::net::TcpListener, &str)],
    config: &Path,
) -> std::process::Child {
    let fds: Vec<i32> = listeners.iter().map(|(l, _)| l.as_raw_fd()).collect();
    let names: Vec<&str> = listeners.iter().map(|(_, n)| *n).collect();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ exec {BIN} run --config {}",
            config.display()
        ))
        .env("LISTEN_FDS", fds.len().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null());
    // SAFETY: dup2 is async-signal-safe; it runs in the forked child before exec. Through a
    // spare range first, so a source fd in 3.. is not overwritten before it is moved.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            for (i, fd) in fds.iter().enumerate() {
                if libc::dup2(*fd, 100 + i as i32) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for i in 0..fds.len() as i32 {
                if libc::dup2(100 + i, 3 + i) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn zerocache")
}

/// The listen line and name of each shipped socket unit, in the order the drop-in lists them.
fn shipped_socket_units() -> Vec<(String, String)> {
    let dropin = include_str!("../../../config/packaging/socket-activation.conf");
    let sockets = dropin
        .lines()
        .find_map(|l| l.strip_prefix("Sockets="))
        .expect("Sockets= in the drop-in");
    sockets
        .split(' ')
        .map(|unit| {
            let text = match unit {
                "zerocache.socket" => include_str!("../../../config/packaging/zerocache.socket"),
                "zerocache-dashboard.socket" => {
                    include_str!("../../../config/packaging/zerocache-dashboard.socket")
                }
                other => panic!("the drop-in names {other}, which is not shipped"),
            };
            let value = |key: &str| {
                let v: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(key)).collect();
                assert_eq!(v.len(), 1, "{unit}: one {key}");
                v[0].to_string()
            };
            assert_eq!(value("Service="), "zerocache.service", "{unit}");
            (value("ListenStream="), value("FileDescriptorName="))
        })
        .collect()
}

/// A socket-activated restart: the sockets stay with "systemd" (this test) while the proxy is
/// stopped and started again, so a request made in between waits in the backlog and is served
/// by the next process. The names are those of the shipped socket units, which the drop-in
/// hands to the service.
#[test]
fn a_socket_activated_restart_loses_nothing_in_the_backlog() {
    let units = shipped_socket_units();
    let packaged = include_str!("../../../config/packaging/zerocache.yaml");
    assert!(
        packaged.contains("\nlisten: 127.0.0.1:8080\n"),
        "the packaged listen"
    );
    assert!(
        packaged.contains("\n  listen: 127.0.0.1:9180\n"),
        "the packaged dashboard.listen"
    );
    assert_eq!(
        units,
        vec![
            ("127.0.0.1:8080".to_string(), "data".to_string()),
            ("127.0.0.1:9180".to_string(), "dashboard".to_string()),
        ],
        "the socket units are the packaged config's listen and dashboard.listen, named for them"
    );
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let data = std::net::TcpListener::bind("127.0.0.1:0").expect("data socket");
    let dash = std::net::TcpListener::bind("127.0.0.1:0").expect("dashboard socket");
    let (addr, daddr) = (
        data.local_addr().expect("addr"),
        dash.local_addr().expect("addr"),
    );
    let config = dir.path().join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {addr}\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: {daddr}\nprobe:\n  enabled: false\nlimits:\n  drain_timeout: 10s\n",
            dir.path().join("cache").display(),
            origin.addr()
        ),
    )
    .expect("config");
    let sockets = [(&data, units[0].1.as_str()), (&dash, units[1].1.as_str())];
    let mut first = socket_activated(&sockets, &config);
    assert_eq!(one_get(addr, "/obj/100").expect("first").0, 200);
    let requests = Loop::start(addr);
    requests.wait_for(20, "the first process");
    // systemctl restart: the service stops (its drain) and starts again; the socket stays.
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    assert_eq!(first.wait().expect("first exit").code(), Some(0));
    // Connections made now wait in the backlog: the first request of the gap is on its way.
    let in_gap = std::thread::spawn(move || one_get(addr, "/obj/100"));
    std::thread::sleep(Duration::from_millis(200));
    let mut second = socket_activated(&sockets, &config);
    requests.wait_for(20, "the second process");
    let (answered, failures) = requests.finish();
    let gap = in_gap.join().expect("gap request");
    // The dashboard's socket was handed over by name too.
    let health = Client::connect(daddr).get("/healthz", &[]);
    // SAFETY: as above.
    unsafe { libc::kill(second.id() as i32, libc::SIGTERM) };
    let _ = second.wait();
    assert!(
        failures.is_empty(),
        "{} of {answered} failed: {failures:?}",
        failures.len()
    );
    let (status, b) = gap.expect("the request made while no process ran");
    assert_eq!((status, b), (200, body(100)));
    assert_eq!((health.status, health.body.as_slice()), (200, &b"ok\n"[..]));
}

/// A notify socket as systemd's, recording every message in order.
struct Notify {
    path: PathBuf,
    said: Arc<std::sync::Mutex<Vec<String>>>,
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let path = dir.join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let said = Arc::new(std::sync::Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let (heard, finished) = (said.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !finished.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    heard.lock().expect("lock").push(text);
                }
            }
        });
        Notify {
            path,
            said,
            done,
            thread,
        }
    }

    /// Everything said so far, in order; stops listening.
    fn finish(self) -> Vec<String> {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().expect("notify listener");
        self.said.lock().expect("lock").clone()
    }
}

/// Live processes an upgrade of `old` started (their environment names it).
fn successors_of(old: u32) -> Vec<u32> {
    let marker = format!("ZEROCACHE_UPGRADE_FROM={old}");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// SIGTERM while a successor starts: the old process drains and exits, and leaves no process
/// behind that nobody supervises. Either it stopped (STOPPING=1) and its successor is gone, or
/// the successor served first (a start faster than the signal): then the old process handed
/// over (MAINPID=) and the successor is the one the pid file names, serving.
#[test]
fn a_stop_during_an_upgrade_leaves_no_unsupervised_successor() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let notify = Notify::bind(dir.path());
    // With the probe (as root), the successor takes its load time to start: the stop comes
    // first.
    let opts = Opts {
        probe: require::is_root(),
        env: vec![("NOTIFY_SOCKET", notify.path.display().to_string())],
        ..Opts::default()
    };
    let (mut proxy, pid_file, _successor) = upgradable(origin.addr(), dir.path(), opts);
    let old = proxy.child.id();
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(old as i32, libc::SIGUSR2) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while successors_of(old).is_empty() {
        assert!(Instant::now() < deadline, "no successor started");
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: as above.
    unsafe { libc::kill(old as i32, libc::SIGTERM) };
    assert_eq!(
        wait_exit(&mut proxy, Duration::from_secs(60)).code(),
        Some(0)
    );
    // Long enough for a successor left running to finish its start.
    std::thread::sleep(Duration::from_secs(3));
    let left = successors_of(old);
    let said = notify.finish();
    if said.iter().any(|s| s == "STOPPING=1") {
        assert_eq!(
            left,
            Vec::<u32>::new(),
            "a successor outlived the stop: {said:?}"
        );
    } else {
        let new = read_pid(&pid_file).expect("the successor's pid");
        assert!(said.contains(&format!("MAINPID={new}")), "{said:?}");
        assert_eq!(left, vec![new], "only the successor that took over");
        assert_eq!(proxy.get("/obj/100").status, 200);
    }
}

/// systemd's own `systemd-socket-activate` (what PID 1 does for a `.socket` unit, where PID 1 is
/// not systemd), with the names of the shipped units: the proxy serves on the sockets it was
/// given (binding them itself would fail, they are taken), and refuses to start, naming both,
/// when a socket's name says another role than the config's listener on its address.
#[test]
fn systemd_socket_activate_hands_the_sockets_by_name() {
    if !require::command("systemd-socket-activate") {
        return;
    }
    let units = shipped_socket_units();
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let (port, dport) = (free_port(), free_port());
    let config = dir.path().join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: false\n",
            dir.path().join("cache").display(),
            origin.addr()
        ),
    )
    .expect("config");
    let activate = |data_name: &str, dash_name: &str| {
        Command::new("systemd-socket-activate")
            .args(["-l", &format!("127.0.0.1:{port}")])
            .arg(format!("--fdname={data_name}"))
            .args(["-l", &format!("127.0.0.1:{dport}")])
            .arg(format!("--fdname={dash_name}"))
            .args([BIN, "run", "--config"])
            .arg(&config)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("systemd-socket-activate")
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    // Until the tool has bound both sockets.
    let bound = |dport: u16| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", dport)).is_err() {
            assert!(
                Instant::now() < deadline,
                "systemd-socket-activate did not listen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut child = activate(&units[0].1, &units[1].1);
    bound(dport);
    let served = one_get(addr, "/obj/100");
    let health = one_get(
        format!("127.0.0.1:{dport}").parse().expect("addr"),
        "/healthz",
    );
    // SAFETY: signalling the test's own child (systemd-socket-activate exec'd the proxy).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("exit");
    assert_eq!(served.expect("served").0, 200);
    assert_eq!(health.expect("dashboard").1, b"ok\n");
    assert_eq!(status.code(), Some(0));

    // The names swapped: the unit and the config disagree, and the proxy says so.
    let child = activate(&units[1].1, &units[0].1);
    bound(dport);
    let out = child.wait_with_output().expect("exit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("a socket on 127.0.0.1:{port} named \"dashboard\", but the config listens there as \"data\"")),
        "{err}"
    );
}

/// `n` keep-alive connections that each had one answer (`/obj/100`) and now sit idle.
fn idle_keep_alive(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            let answer = exchange_on(&mut s).expect("first answer");
            assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
            s
        })
        .collect()
}

/// One `GET /obj/100` on `s`: the response head, once its whole body has come; Err with what
/// happened if the connection closed or failed first.
fn exchange_on(s: &mut TcpStream) -> Result<String, String> {
    s.write_all(b"GET /obj/100 HTTP/1.1\r\nHost: test.example\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
            if got.len() >= end + 4 + 100 {
                return Ok(head);
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return Err(format!("closed after {} bytes", got.len())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read after {} bytes: {e}", got.len())),
        }
    }
}

/// An upgrade closed idle keep-alive connections under their clients at the moment the old
/// process began to drain, so the next request on each got no response (54 in 20 upgrades), and
/// a stop did the same. Now each connection's next request within the drain's grace is
/// answered, with `Connection: close`: 0 of 50 fail across an upgrade, and across a stop.
#[test]
fn the_next_request_on_an_idle_keep_alive_connection_is_answered_across_an_upgrade_and_a_stop() {
    let (origin, _rt) = origin();
    let dir = tempfile::tempdir().expect("tmp");
    let (mut proxy, pid_file, _successor) = upgradable(origin.addr(), dir.path(), Opts::default());
    let old = proxy.child.id();
    let next_requests = |conns: Vec<TcpStream>| -> Vec<String> {
        conns
            .into_iter()
            .filter_map(|mut s| match exchange_on(&mut s) {
                Ok(head)
                    if head
                        .to_ascii_lowercase()
                        .contains("\r\nconnection: close\r\n") =>
                {
                    None
                }
                Ok(head) => Some(format!("answered without Connection: close: {head}")),
                Err(e) => Some(e),
            })
            .collect()
    };
    let conns = idle_keep_alive(proxy.addr, 50);
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(old as i32, libc::SIGUSR2) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_pid(&pid_file) == Some(old) {
        assert!(Instant::now() < deadline, "no successor");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The old process drains from the moment its successor serves: its idle connections are
    // now in their grace (they were closed at once).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        next_requests(conns),
        Vec::<String>::new(),
        "across the upgrade"
    );
    assert_eq!(
        wait_exit(&mut proxy, Duration::from_secs(60)).code(),
        Some(0)
    );
    let new = read_pid(&pid_file).expect("pid file");
    let conns = idle_keep_alive(proxy.addr, 50);
    // SAFETY: the successor this test started.
    unsafe { libc::kill(new as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(next_requests(conns), Vec::<String>::new(), "across a stop");
}

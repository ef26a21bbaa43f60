//! At the file-descriptor limit the proxy degrades and recovers; it never deletes its cache.
//!
//! Once, under `ulimit -n 256`, the open-file cache (10,000 files by default) took every
//! descriptor, each failed open(2) was taken for a vanished file and deleted its entry (234 of 400
//! were lost), and the accept loop logged "accept failed" 178 times a second.

use crate::support::*;
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Exactly what a connection refused for want of fds receives.
const CANNED_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nContent-Length: 24\r\nConnection: close\r\n\r\n503 Service Unavailable\n";

/// Objects filled and hit again under the fd limit.
const OBJECTS: usize = 400;

/// A body unique to object `i`.
fn content(i: usize) -> Vec<u8> {
    let mut b = format!("object {i}: ").into_bytes();
    b.extend_from_slice(&body(100 + i));
    b
}

/// Fills [`OBJECTS`] objects through a proxy limited to 256 fds with `cache_yaml`, then asks for
/// every one again: all must be hits with their exact bodies, and all must still be indexed.
/// Returns the proxy's `/metrics` text.
fn every_entry_survives_256_fds(cache_yaml: &str) -> String {
    let (origin, _rt) = origin();
    for i in 0..OBJECTS {
        origin.script(&format!("/fd/{i}"), Reply::ok(content(i)));
    }
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            nofile: Some(256),
            cache_yaml: cache_yaml.into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for i in 0..OBJECTS {
        let r = c.get(&format!("/fd/{i}"), &[]);
        assert_eq!((r.status, r.x_cache()), (200, "MISS"), "fill of /fd/{i}");
        assert!(r.body == content(i), "fill of /fd/{i}: body differs");
    }
    // Twice: the second round goes through a full open-file cache.
    for round in 0..2 {
        for i in 0..OBJECTS {
            // Half on fresh connections, as the bug report's client did.
            let r = if i % 2 == 0 {
                c.get(&format!("/fd/{i}"), &[])
            } else {
                proxy.get(&format!("/fd/{i}"))
            };
            assert_eq!(
                (r.status, r.x_cache()),
                (200, "HIT"),
                "round {round}: /fd/{i}"
            );
            assert!(r.body == content(i), "round {round}: /fd/{i}: body differs");
        }
    }
    for i in 0..OBJECTS {
        assert_eq!(origin.hits(&format!("/fd/{i}")), 1, "/fd/{i} refetched");
    }
    let m = proxy.metrics();
    assert_eq!(
        metric(&m, "zerocache_cache_objects"),
        OBJECTS as u64,
        "entries lost"
    );
    m
}

#[test]
fn an_explicit_open_files_above_the_fd_limit_is_clamped_and_no_entry_is_lost() {
    if !require::command("prlimit") {
        return;
    }
    let m = every_entry_survives_256_fds("  open_files: 10000\n");
    // Clamped to RLIMIT_NOFILE / 2.
    let open = metric(&m, "zerocache_cache_open_files");
    assert!((1..=128).contains(&open), "{open} files held open");
}

#[test]
fn auto_open_files_keeps_three_quarters_of_the_fds_free_and_no_entry_is_lost() {
    if !require::command("prlimit") {
        return;
    }
    let m = every_entry_survives_256_fds("");
    // auto: RLIMIT_NOFILE / 4.
    let open = metric(&m, "zerocache_cache_open_files");
    assert!((1..=64).contains(&open), "{open} files held open");
}

/// What a new connection receives until the proxy closes it or, if the proxy sends nothing within
/// `wait`, the connection itself (accepted, it then holds one of the proxy's fds).
fn answer_within(proxy: &Proxy, wait: Duration) -> Result<Vec<u8>, TcpStream> {
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    s.set_read_timeout(Some(wait)).expect("timeout");
    let mut first = [0u8; 1];
    match s.read(&mut first) {
        Ok(0) => Ok(Vec::new()),
        Ok(_) => {
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut got = first.to_vec();
            s.read_to_end(&mut got)
                .expect("the proxy closes a refused connection");
            Ok(got)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(s),
        Err(e) => panic!("{e}"),
    }
}

/// Opens idle connections (each holds a proxy fd until the header timeout) until the proxy
/// refuses three new ones in a row; every refusal must be exactly the canned 503. Returns the idle
/// connections. Three in a row, since one refusal can be a brief shortage (the worker-placement
/// valve reads /proc now and then) with fds still to spare.
fn exhaust_fds(proxy: &Proxy, idle: &mut Vec<TcpStream>) {
    // Quickly at first: a batch at a time until the first refusal.
    'batches: while idle.len() < 1000 {
        let batch: Vec<TcpStream> = (0..8)
            .map(|_| TcpStream::connect(proxy.addr).expect("connect"))
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        for s in batch {
            s.set_nonblocking(true).expect("nonblocking");
            match s.peek(&mut [0u8; 1]) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => idle.push(s),
                _ => break 'batches,
            }
        }
    }
    // Connections of the last batch still in the backlog are refused within a few ms.
    std::thread::sleep(Duration::from_millis(200));
    let mut refused_in_a_row = 0;
    while refused_in_a_row < 3 {
        assert!(
            idle.len() < 1000,
            "the proxy accepted 1000 idle connections"
        );
        match answer_within(proxy, Duration::from_millis(300)) {
            Ok(got) => {
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(CANNED_503)
                );
                refused_in_a_row += 1;
            }
            Err(s) => {
                idle.push(s);
                refused_in_a_row = 0;
            }
        }
    }
}

/// GETs `path` on new connections until one is answered (fds come back as the proxy notices the
/// closed idle connections); returns that answer.
fn get_once_fds_are_back(proxy: &Proxy, path: &str) -> Response {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = proxy.client();
        c.send(format!("GET {path} HTTP/1.1\r\nHost: test.example\r\n\r\n").as_bytes());
        match c.try_read_response(false) {
            Some(r) if r.status != 503 => return r,
            other => {
                assert!(Instant::now() < deadline, "still refused: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Idle connections must outlive the test: the default header timeout (10 s) would free fds.
const PATIENT_LIMITS: &str = "limits:\n  header_timeout: 120s\n  idle_timeout: 120s\n";

#[test]
fn out_of_fds_a_new_connection_gets_a_canned_503_and_service_resumes() {
    if !require::command("prlimit") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            nofile: Some(64),
            extra_yaml: PATIENT_LIMITS.into(),
            ..Opts::default()
        },
    );
    assert_eq!(proxy.get("/obj/2048").x_cache(), "MISS");
    assert_eq!(proxy.get("/obj/2048").x_cache(), "HIT");

    let mut idle = Vec::new();
    exhaust_fds(&proxy, &mut idle);
    assert!(!idle.is_empty());
    // The next connection is refused the same way, and closed.
    match answer_within(&proxy, Duration::from_secs(5)) {
        Ok(got) => assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(CANNED_503)
        ),
        Err(_) => panic!("out of fds, a new connection got no answer"),
    }

    drop(idle);
    let r = get_once_fds_are_back(&proxy, "/obj/2048");
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    assert!(r.body == body(2048));
    assert_eq!(origin.hits("/obj/2048"), 1);
    assert_eq!(metric(&proxy.metrics(), "zerocache_cache_objects"), 1);
}

#[test]
fn out_of_fds_a_hit_gets_503_with_retry_after_and_the_entry_stays() {
    if !require::command("prlimit") {
        return;
    }
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            nofile: Some(64),
            // No open-file cache: every hit needs an open(2), and there are no idle files to
            // give back when fds run out.
            cache_yaml: "  open_files: 0\n".into(),
            extra_yaml: PATIENT_LIMITS.into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/4096", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/obj/4096", &[]).x_cache(), "HIT");

    let mut idle = Vec::new();
    let mut r = None;
    for _ in 0..5 {
        exhaust_fds(&proxy, &mut idle);
        let got = c.get("/obj/4096", &[]);
        if got.status == 503 {
            r = Some(got);
            break;
        }
        // An fd came free in between (see `exhaust_fds`): the hit must then be served.
        assert_eq!((got.status, got.x_cache()), (200, "HIT"), "{got:?}");
    }
    let r = r.expect("out of fds, the hit was never refused");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.x_cache(), "ERROR");
    assert_eq!(r.body, b"503 Service Unavailable\n");

    drop(idle);
    // The same keep-alive connection, once fds are back: still a hit, from the same entry.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = c.get("/obj/4096", &[]);
        if r.status != 503 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((r.status, r.x_cache()), (200, "HIT"));
    assert!(r.body == body(4096));
    assert_eq!(origin.hits("/obj/4096"), 1, "the entry was never dropped");
    assert_eq!(metric(&proxy.metrics(), "zerocache_cache_objects"), 1);
}

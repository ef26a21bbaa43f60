//! The test clock (`debug.adjustable_clock`): it ages cached responses when, and only when, both
//! the config and the environment ask for it.

use crate::support::*;
use std::process::Command;

#[test]
fn advancing_the_clock_ages_every_entry_at_once() {
    let (origin, _rt) = origin();
    origin.script(
        "/a",
        Reply::ok(b"one".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/a", &[]).x_cache(), "MISS");
    let r = c.get("/a", &[]);
    assert_eq!((r.x_cache(), r.header("age")), ("HIT", Some("0")));
    // 59 s later it is still fresh, with the Age to show for it.
    assert_eq!(proxy.advance_clock(59), 59);
    let r = c.get("/a", &[]);
    assert_eq!((r.x_cache(), r.header("age")), ("HIT", Some("59")));
    // Two more and it is stale: fetched again.
    origin.script(
        "/a",
        Reply::ok(b"two".to_vec()).headers(&[("Cache-Control", "max-age=60")]),
    );
    assert_eq!(proxy.advance_clock(2), 61);
    let r = c.get("/a", &[]);
    assert_eq!((r.x_cache(), r.body.as_slice()), ("EXPIRED", &b"two"[..]));
    assert_eq!(origin.hits("/a"), 2);
    // What is stored after an advance starts at age 0, like anything stored.
    let r = c.get("/a", &[]);
    assert_eq!((r.x_cache(), r.header("age")), ("HIT", Some("0")));
    assert_eq!(origin.hits("/a"), 2);
}

#[test]
fn the_hook_refuses_what_is_not_a_forward_step_of_at_most_a_day() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    for body in [
        &b"{\"advance_secs\": 0}"[..],
        b"{\"advance_secs\": 86401}",
        b"{\"advance_secs\": -5}",
        b"{\"advance_secs\": \"5\"}",
        b"{\"advance_secs\": 5, \"also\": 1}",
        b"not json",
    ] {
        let mut c = Client::connect_dashboard(proxy.dashboard);
        let r = c.send_with_body(
            "POST",
            "/api/debug/clock",
            &[
                ("Content-Type", "application/json"),
                ("Connection", "close"),
            ],
            body,
        );
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(body));
    }
    // Nothing moved: the first real step is the whole offset.
    assert_eq!(proxy.advance_clock(3), 3);
}

#[test]
fn the_hook_is_off_without_the_config_key() {
    let (origin, _rt) = origin();
    let tmp = tempfile::tempdir().expect("tmp");
    let yaml = format!(
        "listen: 127.0.0.1:{{port}}\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"{}\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\ndashboard:\n  listen: 127.0.0.1:{{dport}}\n",
        tmp.path().join("cache").display(),
        origin.addr()
    );
    let proxy = Proxy::from_yaml(&yaml, tmp.path());
    let mut c = Client::connect_dashboard(proxy.dashboard);
    let r = c.send_with_body(
        "POST",
        "/api/debug/clock",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "close"),
        ],
        b"{\"advance_secs\": 5}",
    );
    assert_eq!(r.status, 404);
    // Every method: no 405 with `Allow: POST` that would say the hook is there.
    for method in ["GET", "HEAD"] {
        let mut c = Client::connect_dashboard(proxy.dashboard);
        let r = c.request(method, "/api/debug/clock", &[("Connection", "close")]);
        assert_eq!((r.status, r.header("allow")), (404, None), "{method}");
    }
}

#[test]
fn the_config_key_alone_refuses_to_start() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = tmp.path().join("zc.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:1\ncache: {{path: {}, max_size: 1MiB}}\nupstreams:\n  o: {{servers: [\"127.0.0.1:2\"]}}\nroutes:\n  - match: {{host: \"*\"}}\n    upstream: o\ndebug:\n  adjustable_clock: true\n",
            tmp.path().join("c").display()
        ),
    )
    .expect("write");
    // `run` refuses it, and so does `check`, so a check before a restart cannot pass a config the
    // restart then refuses.
    for cmd in ["run", "check"] {
        let out = Command::new(env!("CARGO_BIN_EXE_zerocache"))
            .args([cmd, "--config"])
            .arg(&cfg)
            .env_remove("ZEROCACHE_TEST_CLOCK")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("debug.adjustable_clock is a test hook and needs ZEROCACHE_TEST_CLOCK=1"),
            "{cmd}: {err}"
        );
        assert!(err.contains(&cfg.display().to_string()), "{cmd}: {err}");
    }
}

//! The access log as a log shipper reads it: a template of nginx-style variables, each with its
//! real value on a TLS hit and on a 502 (which names the server it could not reach, and says
//! `ERROR` in `X-Cache` as in the line); lines sent to syslog as journald and rsyslog read them.

use crate::support::*;
use crate::tls_support::*;
use std::time::Duration;

fn logging(log: &str, template: &str) -> String {
    format!("logging:\n  access_log: {log}\n  access_log_format: '{template}'\n")
}

/// Every variable but the clocks, on a MISS and a HIT over TLS (the version, the cipher by its
/// IANA name and the SNI), with the route's name; the clocks by their shapes.
#[test]
fn a_template_line_has_each_variables_value_over_tls() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let files = write(dir.path(), "site", &cert(&["test.example"]));
    let (origin, _rt) = origin();
    let tport = free_port();
    let template = "$client $method \"$target\" $protocol $host $status $bytes $complete $cache_status $zero_copy $upstream_addr $upstream_status $route \"$user_agent\" \"$referer\" $tls_version $tls_cipher $tls_sni | $time | $time_local | $duration | $upstream_time | $request_id | $client_port";
    let _proxy = Proxy::start(
        origin.addr(),
        Opts {
            route_yaml: "    name: everything\n".into(),
            extra_yaml: format!(
                "{}  ktls: off\n{}",
                listener_yaml(tport, &[files]),
                logging(&log.display().to_string(), template)
            ),
            ..Opts::default()
        },
    );
    let taddr: std::net::SocketAddr = format!("127.0.0.1:{tport}").parse().expect("addr");
    let mut c = TlsClient::connect(taddr, "test.example", client_config(None));
    for _ in 0..2 {
        c.send(b"GET /obj/10 HTTP/1.1\r\nHost: test.example\r\nUser-Agent: t/1\r\n\r\n");
        assert_eq!(c.response().status, 200);
    }
    let got = log_lines(&log, 2);
    let cipher = c.cipher_iana();
    let fixed = |l: &str| l.split(" | ").next().unwrap_or("").to_string();
    assert_eq!(
        fixed(&got[0]),
        format!(
            "127.0.0.1 GET \"/obj/10\" HTTP/1.1 test.example 200 10 complete MISS no {} 200 everything \"t/1\" \"-\" TLSv1.3 {cipher} test.example",
            origin.addr()
        )
    );
    assert_eq!(
        fixed(&got[1]),
        format!(
            "127.0.0.1 GET \"/obj/10\" HTTP/1.1 test.example 200 10 complete HIT no - - everything \"t/1\" \"-\" TLSv1.3 {cipher} test.example"
        ),
        "a hit over TLS in user space is a copy by design: zero_copy no"
    );
    // The clocks and ids, by their shapes: RFC 3339, nginx's $time_local, seconds, a hex id.
    let rest: Vec<&str> = got[0].split(" | ").skip(1).collect();
    let [time, local, duration, upstream_time, id, port] = rest[..] else {
        panic!("{got:?}");
    };
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
    assert!(
        local.ends_with(" +0000") && local.as_bytes()[2] == b'/',
        "{local}"
    );
    for secs in [duration, upstream_time] {
        assert!(secs.parse::<f64>().is_ok_and(|s| s < 60.0), "{secs}");
    }
    assert_eq!(upstream_time.split('.').nth(1).map(str::len), Some(3));
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{port}");
}

/// A 502 for an origin nobody listens on: its line names the server it could not reach, and the
/// client's `X-Cache` says `ERROR`, as the line and the metrics do (it said `MISS`).
#[test]
fn a_502_line_names_the_server_it_could_not_reach_and_x_cache_agrees() {
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("access.log");
    let dead: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let proxy = Proxy::start(
        dead,
        Opts {
            extra_yaml: logging(
                &log.display().to_string(),
                "$status $cache_status $upstream_addr $upstream_status $route",
            ),
            ..Opts::default()
        },
    );
    let r = proxy.get("/obj/10");
    assert_eq!((r.status, r.x_cache()), (502, "ERROR"));
    assert_eq!(log_lines(&log, 1), [format!("502 ERROR {dead} - 0")]);
    assert_eq!(
        metric(
            &proxy.metrics(),
            "zerocache_responses_total{cache_status=\"ERROR\",code=\"502\",protocol=\"http/1.1\",route=\"0\"}"
        ),
        1
    );
}

/// `access_log: syslog:PATH` (`syslog` is `/dev/log`): one datagram a line, `<134>` (local0,
/// info), `zerocache[PID]: ` and the line without its newline, as journald's and rsyslog's
/// sockets take them.
#[test]
fn lines_go_to_syslog_one_datagram_each() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("log.sock");
    let syslog = std::os::unix::net::UnixDatagram::bind(&sock).expect("bind");
    syslog
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: logging(
                &format!("syslog:{}", sock.display()),
                "$method $target $status $cache_status",
            ),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/obj/10", &[]).status, 200);
    assert_eq!(c.get("/obj/10", &[]).status, 200);
    let pid = proxy.child.id();
    let next = |syslog: &std::os::unix::net::UnixDatagram| {
        let mut buf = [0u8; 2048];
        let n = syslog.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    for want in ["GET /obj/10 200 MISS", "GET /obj/10 200 HIT"] {
        assert_eq!(next(&syslog), format!("<134>zerocache[{pid}]: {want}"));
    }
    // The daemon restarts and makes its socket anew (rsyslog does): the next line reaches it.
    drop(syslog);
    std::fs::remove_file(&sock).expect("remove");
    let syslog = std::os::unix::net::UnixDatagram::bind(&sock).expect("bind again");
    syslog
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(c.get("/obj/11", &[]).status, 200);
    assert_eq!(
        next(&syslog),
        format!("<134>zerocache[{pid}]: GET /obj/11 200 MISS")
    );
    assert_eq!(
        metric(&proxy.metrics(), "zerocache_access_log_dropped_total"),
        0
    );
}

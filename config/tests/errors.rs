//! Config errors name the file, line, column and key path, exactly.

use zerocache_config::{ConfigError, parse};

const GOOD: &str = "listen: 127.0.0.1:8080
cache:
  path: /tmp/zc
  max_size: 1GiB
upstreams:
  origin:
    servers: [\"127.0.0.1:8081\"]
  images:
    servers: [\"127.0.0.1:8082\"]
routes:
  - match: { host: \"*\", path_prefix: / }
    upstream: origin
";

fn err(text: &str) -> String {
    match parse(text, "zc.yaml") {
        Err(e) => e.to_string(),
        Ok(c) => panic!("accepted: {c:?}"),
    }
}

#[test]
fn the_minimal_config_is_valid_with_defaults() {
    let c = parse(GOOD, "zc.yaml").expect("valid");
    assert_eq!(c.dashboard.listen, "127.0.0.1:9180");
    assert!(c.probe.enabled);
    assert_eq!(c.cache.sendfile_max_chunk.as_u64(), 2 * 1024 * 1024);
    assert_eq!(c.limits.header_timeout, std::time::Duration::from_secs(10));
}

#[test]
fn unknown_keys_are_rejected_with_a_suggestion() {
    let text = GOOD.replace("    upstream: origin", "    upstrem: origin");
    assert_eq!(
        err(&text),
        "zc.yaml:12:5: routes[0]: unknown field `upstrem`, expected one of `name`, `match`, `upstream`, `cache`, `default_ttl`, `status_ttl`, `cache_key`, `stale_grace`, `bypass`, `allow_trace`, `store_set_cookie`, `upgrade`, `accept_encoding`, `max_object_size`, `min_object_size`, `slice`, `max_sliced_object_size`, `query`, `rules`; did you mean `upstream`?"
    );
}

#[test]
fn undefined_upstreams_name_the_route_and_the_choices() {
    let text = GOOD.replace("    upstream: origin", "    upstream: orgin");
    assert_eq!(
        err(&text),
        "zc.yaml:12:5: routes[0].upstream: upstream `orgin` is not defined; defined: images, origin"
    );
}

#[test]
fn bad_values_name_their_key() {
    assert_eq!(
        err(&GOOD.replace("listen: 127.0.0.1:8080", "listen: nowhere")),
        "zc.yaml:1:1: listen: `nowhere` is not an address (host:port): invalid socket address"
    );
    assert_eq!(
        err(&GOOD.replace("max_size: 1GiB", "max_size: 0")),
        "zc.yaml:4:3: cache.max_size: must be positive"
    );
    assert_eq!(
        err(&GOOD.replace("\"127.0.0.1:8082\"", "\"no-port\"")),
        "zc.yaml:9:5: upstreams.images.servers[0]: `no-port` is not host:port"
    );
    let dup = format!("{GOOD}dashboard:\n  listen: 127.0.0.1:8080\n");
    assert_eq!(
        err(&dup),
        "zc.yaml:14:3: dashboard.listen: `127.0.0.1:8080` is also the proxy's `listen`; they must differ"
    );
    let e = err(&GOOD.replace("max_size: 1GiB", "max_size: lots"));
    assert!(e.starts_with("zc.yaml:4:13: cache.max_size: "), "{e}");
}

/// An object size range with nothing in it is refused, naming the key that closed it; a size
/// that is no size names its own line and column.
#[test]
fn object_sizes_must_leave_room_for_an_object() {
    let route = GOOD.replace(
        "    upstream: origin\n",
        "    upstream: origin\n    max_object_size: 1MiB\n    min_object_size: 2MiB\n",
    );
    assert_eq!(
        err(&route),
        "zc.yaml:14:5: routes[0].min_object_size: 2 MiB is more than the largest object stored (1 MiB), so nothing would be stored; use `cache: false` for that"
    );
    let cache = GOOD.replace(
        "max_size: 1GiB\n",
        "max_size: 1GiB\n  max_object_size: 10KiB\n  min_object_size: 20KiB\n",
    );
    assert_eq!(
        err(&cache),
        "zc.yaml:6:3: cache.min_object_size: 20 KiB is more than the largest object stored (10 KiB), so nothing would be stored; use `cache: false` for that"
    );
    // Without max_object_size the largest object is the cache's max_size.
    let over = GOOD.replace(
        "max_size: 1GiB\n",
        "max_size: 1GiB\n  min_object_size: 2GiB\n",
    );
    assert_eq!(
        err(&over),
        "zc.yaml:5:3: cache.min_object_size: 2 GiB is more than the largest object stored (1 GiB), so nothing would be stored; use `cache: false` for that"
    );
    let e = err(&GOOD.replace(
        "max_size: 1GiB\n",
        "max_size: 1GiB\n  max_object_size: huge\n",
    ));
    assert!(
        e.starts_with("zc.yaml:5:20: cache.max_object_size: "),
        "{e}"
    );
    // A route may lower the cache's minimum below the cache's maximum, or raise both.
    let ok = GOOD
        .replace(
            "max_size: 1GiB\n",
            "max_size: 1GiB\n  max_object_size: 10KiB\n  min_object_size: 1KiB\n",
        )
        .replace(
            "    upstream: origin\n",
            "    upstream: origin\n    max_object_size: 1MiB\n    min_object_size: 20KiB\n",
        );
    let c = parse(&ok, "zc.yaml").expect("valid");
    assert_eq!(
        c.routes[0].min_object_size.map(|b| b.as_u64()),
        Some(20 * 1024)
    );
}

/// `accept_encoding` is a list of content codings or `as-sent`; anything else names its line.
#[test]
fn accept_encoding_is_codings_or_as_sent() {
    let with = |v: &str| {
        GOOD.replace(
            "    upstream: origin\n",
            &format!("    upstream: origin\n    accept_encoding: {v}\n"),
        )
    };
    for (v, why) in [
        (
            "gzip",
            "`gzip` is neither a list of content codings (`[br, gzip]`) nor `as-sent`",
        ),
        ("[gzip, GZIP]", "`gzip` is listed twice"),
        ("[identity]", "`identity` is not a content coding"),
        (
            "[x-gzip]",
            "`x-gzip` is not a content coding a route can list",
        ),
        ("[\"g zip\"]", "`g zip` is not a content coding"),
        ("[\"*\"]", "`*` is not a content coding"),
    ] {
        let e = err(&with(v));
        assert!(
            e.starts_with(&format!("zc.yaml:13:22: routes[0].accept_encoding: {why}")),
            "{v}: {e}"
        );
    }
    let c = parse(&with("as-sent"), "zc.yaml").expect("as-sent");
    assert_eq!(
        c.routes[0].accept_encoding,
        zerocache_config::AcceptEncoding::AsSent
    );
    let c = parse(&with("[Zstd, br]"), "zc.yaml").expect("codings");
    assert_eq!(
        c.routes[0].accept_encoding,
        zerocache_config::AcceptEncoding::Codings(vec!["zstd".into(), "br".into()])
    );
    let c = parse(GOOD, "zc.yaml").expect("default");
    assert_eq!(
        c.routes[0].accept_encoding,
        zerocache_config::AcceptEncoding::Codings(vec!["br".into(), "gzip".into()])
    );
}

/// A listen entry is an address or a map with `addr` and options; PROXY protocol needs its
/// sources, and they must be addresses or CIDRs.
#[test]
fn listen_entries_take_options() {
    let with = |v: &str| GOOD.replace("listen: 127.0.0.1:8080", &format!("listen: {v}"));
    let c = parse(
        &with("[127.0.0.1:8080, {addr: \"127.0.0.1:8081\", proxy_protocol: true, proxy_protocol_from: [10.0.0.0/8, \"::1\"]}]"),
        "zc.yaml",
    )
    .expect("valid");
    let e = c.listen.entries();
    assert_eq!(
        e[0],
        &zerocache_config::ListenEntry::plain("127.0.0.1:8080")
    );
    assert_eq!(
        (
            e[1].addr.as_str(),
            e[1].proxy_protocol,
            e[1].proxy_protocol_from.len()
        ),
        ("127.0.0.1:8081", true, 2)
    );
    // h2c on a plain listener; never on the TLS one, where ALPN offers h2.
    let c = parse(&with("{addr: \"127.0.0.1:8081\", h2c: true}"), "zc.yaml").expect("h2c");
    assert!(c.listen.entries()[0].h2c);
    assert_eq!(c.listen.to_string(), "127.0.0.1:8081 (h2c)");
    let tls = format!(
        "{}tls:\n  listen: [{{addr: \"127.0.0.1:8443\", h2c: true}}]\n  certificates: [{{cert: /c.pem, key: /k.pem}}]\n",
        GOOD
    );
    let e = err(&tls);
    assert!(
        e.contains("tls.listen[0].h2c: is HTTP/2 without TLS; on the TLS listener, ALPN offers h2 with `tls.http2: true`"),
        "{e}"
    );
    for (v, want) in [
        (
            "{addr: \"127.0.0.1:8081\", proxy_protocol: true}",
            "zc.yaml:1:1: listen.proxy_protocol_from: is needed with proxy_protocol",
        ),
        (
            "[127.0.0.1:8080, {addr: \"127.0.0.1:8081\", proxy_protocol: true, proxy_protocol_from: [10.0.0.0/33]}]",
            "zc.yaml:1:1: listen[1].proxy_protocol_from[0]: `10.0.0.0/33`: prefix length must be 0 to 32",
        ),
        (
            "{addr: \"127.0.0.1:8081\", proxy_protocol_from: [10.0.0.0/8]}",
            "zc.yaml:1:1: listen.proxy_protocol_from: has no meaning without `proxy_protocol: true`",
        ),
        (
            "{addr: \"127.0.0.1:8081\", proxy: true}",
            "zc.yaml:1:34: listen: unknown field `proxy`, expected one of `addr`, `proxy_protocol`, `proxy_protocol_from`",
        ),
    ] {
        let e = err(&with(v));
        assert!(e.starts_with(want), "{v}: {e}");
    }
}

/// `purge.method` names who may purge, by address or by a token long enough not to be guessed.
#[test]
fn the_purge_method_needs_clients_or_a_token() {
    let with = |p: &str| format!("{GOOD}purge:\n{p}");
    let c = parse(
        &with("  method: true\n  allowed_clients: [10.0.0.0/8, \"::1\"]\n"),
        "zc.yaml",
    )
    .expect("valid");
    assert!(c.purge.method);
    assert!(
        parse(
            &with("  method: true\n  token: 0123456789abcdef\n"),
            "zc.yaml"
        )
        .is_ok()
    );
    for (p, want) in [
        (
            "  method: true\n",
            "purge.method: needs `purge.allowed_clients` or `purge.token`",
        ),
        (
            "  method: true\n  allowed_clients: [10.0.0.0/33]\n",
            "purge.allowed_clients[0]: `10.0.0.0/33`: prefix length must be 0 to 32",
        ),
        (
            "  method: true\n  token: short\n",
            "purge.token: is shorter than 16 characters",
        ),
        ("  methods: true\n", "unknown field `methods`"),
    ] {
        let e = err(&with(p));
        assert!(e.contains(want), "{p}: {e}");
    }
    // The token never reaches `check`'s output.
    let c = parse(
        &with("  method: true\n  token: 0123456789abcdef\n"),
        "zc.yaml",
    )
    .expect("ok");
    assert_eq!(c.redacted().purge.token.as_deref(), Some("<redacted>"));
}

#[test]
fn unreadable_files_say_so() {
    let e =
        zerocache_config::load(std::path::Path::new("/nonexistent/zc.yaml")).expect_err("missing");
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/zc.yaml: cannot read: ")
    );
}

#[test]
fn the_example_config_parses_and_names_every_key() {
    let text = include_str!("../zerocache.example.yaml");
    let c = parse(text, "zerocache.example.yaml").expect("example is valid");
    // Every field of the schema appears in the example: serialise the effective config and look
    // for each key in the example text.
    let value = serde_json::to_value(&c).expect("json");
    let mut keys = Vec::new();
    collect_keys(&value, &mut keys);
    for k in keys {
        assert!(
            text.contains(&format!("{k}:")) || text.contains(&format!("# {k}:")),
            "example lacks `{k}`"
        );
    }
}

fn collect_keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k != "origin" {
                    out.push(k.clone());
                }
                collect_keys(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_keys(v, out)),
        _ => {}
    }
}

#[test]
fn more_error_classes_name_their_key() {
    assert_eq!(
        err(&format!(
            "{GOOD}workers:\n  cpu_affinity: true\n  count: 0\n"
        )),
        "zc.yaml:15:3: workers.count: 0 workers: use 1 to 1024, or leave it out for one per CPU"
    );
    assert_eq!(
        err(&format!("{GOOD}workers:\n  cpu_affinity: yes please\n")),
        "zc.yaml:14:17: workers.cpu_affinity: invalid value: string \"yes please\", expected `auto`, `true` or `false`"
    );
    assert_eq!(
        err(&format!("{GOOD}logging:\n  level: loud\n")),
        "zc.yaml:14:3: logging.level: `loud` is not a log level; use one of off, error, warn, info, debug, trace (optionally as target=level)"
    );
    assert_eq!(
        err(&format!("{GOOD}dashboard:\n  listen: 0.0.0.0:9180\n")),
        "zc.yaml:14:3: dashboard.listen: `0.0.0.0:9180` is not loopback: set `dashboard.token` so the dashboard and its API need a bearer token"
    );
    assert_eq!(
        err(&format!("{GOOD}limits:\n  drain_timeout: soon\n")),
        "zc.yaml:14:18: limits.drain_timeout: `soon` is not a duration: write seconds (`30`) or a number with a unit (`500ms`, `30s`, `5m`, `1h`, `1day`)"
    );
    assert_eq!(
        err(&GOOD.replace(
            "upstreams:\n  origin:\n    servers: [\"127.0.0.1:8081\"]\n",
            "upstreams:\n  origin:\n    servers: []\n"
        )),
        "zc.yaml:7:5: upstreams.origin.servers: at least one server is needed"
    );
    assert_eq!(
        err(&format!("{GOOD}probe:\n  watch: [self, {{pid: nope}}]\n")),
        "zc.yaml:14:10: probe.watch: expected `self`, `{pid: N}` or `{comm: NAME}`"
    );
    assert_eq!(
        err("listen: [unclosed\n"),
        "zc.yaml:2:1: did not find expected ',' or ']' while parsing a flow sequence"
    );
    // One error per syntax error, and one place in it; a tab where indentation is read says so.
    assert_eq!(
        err("listen: 127.0.0.1:1\ncache: {path: /tmp/c\nroutes: []\n"),
        "zc.yaml:3:7: did not find expected ',' or '}' while parsing a flow mapping"
    );
    assert_eq!(
        err("listen: 127.0.0.1:1\ncache:\n\tpath: /tmp/c\n"),
        "zc.yaml:3:1: a tab cannot indent YAML: indent with spaces"
    );
    let e = err("listen: \"unterminated\n");
    assert!(e.starts_with("zc.yaml:"), "{e}");
}

#[test]
fn environment_overrides_apply_per_host() {
    let mut c = parse(GOOD, "zc.yaml").expect("valid");
    zerocache_config::apply_env(&mut c, |k| match k {
        "ZEROCACHE_LISTEN" => Some("127.0.0.1:9999".into()),
        "ZEROCACHE_CACHE_PATH" => Some("/srv/cache".into()),
        _ => None,
    });
    assert_eq!(
        c.listen,
        zerocache_config::Listen::One(zerocache_config::ListenEntry::plain("127.0.0.1:9999"))
    );
    assert_eq!(c.cache.path, std::path::PathBuf::from("/srv/cache"));
}

#[test]
fn sizes_and_durations_read_as_nginx_writes_them() {
    let c = parse(
        &(GOOD.replace("max_size: 1GiB", "max_size: 1g")
            + "limits:\n  drain_timeout: 45\n  max_body_bytes: 10MB\n"),
        "zc.yaml",
    )
    .expect("valid");
    assert_eq!(c.cache.max_size.as_u64(), 1 << 30);
    assert_eq!(c.limits.drain_timeout, std::time::Duration::from_secs(45));
    assert_eq!(c.limits.max_body_bytes.as_u64(), 10_000_000);
    assert_eq!(
        err(&GOOD.replace("max_size: 1GiB", "max_size: 1gb!")),
        "zc.yaml:4:13: cache.max_size: `1gb!` is not a size: write bytes (`1048576`) or a number with a unit: k, m, g, t or KiB, MiB, GiB, TiB (binary, `1g` = 1 GiB as in nginx), KB, MB, GB, TB (decimal)"
    );
}

#[test]
fn errors_never_name_rust_types() {
    for (bad, want) in [
        (
            format!("{GOOD}limits:\n  max_connections: many\n"),
            "zc.yaml:14:20: limits.max_connections: invalid type: string \"many\", expected a whole number (0 or more)",
        ),
        (
            format!("{GOOD}limits:\n  max_connections: -3\n"),
            "zc.yaml:14:20: limits.max_connections: invalid type: integer `-3`, expected a whole number (0 or more)",
        ),
        (
            format!("{GOOD}cache:\n  path: /tmp/x\n  max_size: 1g\n  offload_cold_hits: maybe\n"),
            "",
        ),
        (
            format!("{GOOD}limits: 5\n"),
            "zc.yaml:13:9: limits: invalid type: integer `5`, expected a mapping (`key: value` lines)",
        ),
    ] {
        let e = err(&bad);
        if !want.is_empty() {
            assert_eq!(e, want);
        }
        for rust in [
            "usize", "u64", "u32", "u8", "i64", "f64", "struct ", "enum ", "Duration", "ByteSize",
            "Option<",
        ] {
            assert!(!e.contains(rust), "`{rust}` in {e}");
        }
    }
}

#[test]
fn a_zero_timeout_is_refused() {
    assert_eq!(
        err(&format!("{GOOD}limits:\n  send_timeout: 0s\n")),
        "zc.yaml:14:3: limits.send_timeout: a timeout of 0 would fail every exchange: give a duration (`30s`), or leave the key out for the default"
    );
    assert!(parse(&format!("{GOOD}limits:\n  drain_timeout: 0\n"), "zc.yaml").is_ok());
}

/// `GOOD` with the `origin` group replaced by `group` (its lines indented 4 spaces).
fn with_origin_group(group: &str) -> String {
    GOOD.replace(
        "  origin:\n    servers: [\"127.0.0.1:8081\"]\n",
        &format!("  origin:\n{group}"),
    )
}

#[test]
fn upstream_servers_take_both_forms_and_the_group_defaults() {
    use std::time::Duration;
    use zerocache_config::{Balance, ServerSpec};
    let c = parse(
        &with_origin_group(
            "    balance: least_conn\n    max_fails: 3\n    fail_timeout: 30s\n    host: objects.example\n    health_check: {path: /health}\n    servers:\n      - 127.0.0.1:8081\n      - addr: 127.0.0.1:8083\n        weight: 3\n      - {addr: \"127.0.0.1:8084\", max_fails: 0, fail_timeout: 5s}\n",
        ),
        "zc.yaml",
    )
    .expect("valid");
    let up = &c.upstreams["origin"];
    assert_eq!(up.balance, Balance::LeastConn);
    assert_eq!(up.host.as_deref(), Some("objects.example"));
    let hc = up.health_check.as_ref().expect("health_check");
    assert_eq!(
        (hc.path.as_str(), hc.interval, hc.timeout),
        ("/health", Duration::from_secs(5), Duration::from_secs(2))
    );
    let spec = |addr: &str, weight, max_fails, secs| ServerSpec {
        addr: addr.into(),
        weight,
        max_fails,
        fail_timeout: Duration::from_secs(secs),
    };
    assert_eq!(
        up.resolved_servers(),
        vec![
            spec("127.0.0.1:8081", 1, 3, 30),
            spec("127.0.0.1:8083", 3, 3, 30),
            spec("127.0.0.1:8084", 1, 0, 5),
        ]
    );
    // And nginx's defaults when nothing is said.
    let c = parse(GOOD, "zc.yaml").expect("valid");
    let up = &c.upstreams["origin"];
    assert_eq!(up.balance, Balance::RoundRobin);
    assert_eq!(
        (up.max_fails, up.fail_timeout),
        (1, Duration::from_secs(10))
    );
    assert_eq!((&up.health_check, &up.host), (&None, &None));
    assert_eq!(
        up.resolved_servers(),
        vec![spec("127.0.0.1:8081", 1, 1, 10)]
    );
}

#[test]
fn bad_upstream_keys_name_their_key() {
    assert_eq!(
        err(&with_origin_group(
            "    servers:\n      - 127.0.0.1:8081\n      - addr: 127.0.0.1:8083\n        weight: 0\n"
        )),
        "zc.yaml:10:9: upstreams.origin.servers[1].weight: must be at least 1 (remove the server to send it nothing)"
    );
    assert_eq!(
        err(&with_origin_group(
            "    balance: random\n    servers: [\"127.0.0.1:8081\"]\n"
        )),
        "zc.yaml:7:14: upstreams.origin.balance: unknown variant `random`, expected one of `round_robin`, `least_conn`, `hash`"
    );
    assert_eq!(
        err(&with_origin_group(
            "    servers:\n      - addr: 127.0.0.1:8083\n        wieght: 2\n"
        )),
        "zc.yaml:9:9: upstreams.origin.servers[0]: unknown field `wieght`, expected one of `addr`, `weight`, `max_fails`, `fail_timeout`; did you mean `weight`?"
    );
    assert_eq!(
        err(&with_origin_group("    servers:\n      - addr: nowhere\n")),
        "zc.yaml:8:9: upstreams.origin.servers[0].addr: `nowhere` is not host:port"
    );
    assert_eq!(
        err(&with_origin_group(
            "    servers: [\"127.0.0.1:8081\"]\n    health_check:\n      path: health\n"
        )),
        "zc.yaml:9:7: upstreams.origin.health_check.path: `health` must start with `/` and hold no spaces or controls"
    );
    assert_eq!(
        err(&with_origin_group(
            "    servers: [\"127.0.0.1:8081\"]\n    host: \"a.example\\r\\nX-Evil: 1\"\n"
        )),
        "zc.yaml:8:5: upstreams.origin.host: `a.example\r\nX-Evil: 1` is not a host name (optionally with :port)"
    );
    assert_eq!(
        err(&with_origin_group(
            "    servers: [\"127.0.0.1:8081\"]\n    max_fail: 2\n"
        )),
        "zc.yaml:8:5: upstreams.origin: unknown field `max_fail`, expected one of `servers`, `connect_timeout`, `read_timeout`, `keepalive`, `balance`, `max_fails`, `fail_timeout`, `health_check`, `host`, `tls`; did you mean `max_fails`?"
    );
    assert_eq!(
        err(&with_origin_group("    servers: [42]\n")),
        "zc.yaml:7:15: upstreams.origin.servers[0]: invalid type: integer `42`, expected `host:port` or `{addr: host:port, weight: N, max_fails: N, fail_timeout: D}`"
    );
}

#[test]
fn two_problems_located_at_one_key_are_both_reported() {
    let e = parse(
        &with_origin_group(
            "    servers: [{addr: \"127.0.0.1:8081\", weight: 0}, {addr: \"127.0.0.1:8082\", weight: 0}]\n",
        ),
        "zc.yaml",
    )
    .expect_err("invalid");
    let all: Vec<String> = e.each().iter().map(ToString::to_string).collect();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[0].contains("servers[0].weight"), "{all:?}");
    assert!(all[1].contains("servers[1].weight"), "{all:?}");
}

#[test]
fn a_duration_past_ten_years_is_refused() {
    let e = err(&format!(
        "{GOOD}limits:\n  header_timeout: 18446744073709551615\n"
    ));
    assert_eq!(
        e,
        "zc.yaml:14:19: limits.header_timeout: `18446744073709551615` is longer than 10 years: give a real duration (`30s`, `5m`, `1day`)"
    );
}

#[test]
fn the_request_id_field_cannot_be_one_the_proxy_sets_or_a_key_field() {
    assert_eq!(
        err(&format!(
            "{GOOD}logging:\n  request_id_header: Transfer-Encoding\n"
        )),
        "zc.yaml:14:3: logging.request_id_header: `Transfer-Encoding` is a field the proxy sets or that frames the message; use a name of its own such as X-Request-Id"
    );
    let keyed = GOOD.replace(
        "    upstream: origin\n",
        "    upstream: origin\n    cache_key: {headers: [x-request-id]}\n",
    );
    let e = err(&keyed);
    assert!(
        e.ends_with("`x-request-id` is `logging.request_id_header`, replaced by the proxy's request id, so it can never be part of what the origin answers"),
        "{e}"
    );
}

/// A duplicate key was said at the start of its mapping (1:1 for a top-level one): it is said
/// at the line that repeats it, with the line of the first.
#[test]
fn a_duplicate_key_is_said_at_its_own_line() {
    assert_eq!(
        err(&format!("{GOOD}listen: 127.0.0.1:9090\n")),
        "zc.yaml:13:1: duplicate entry with key \"listen\" (its first is on line 1)"
    );
    assert_eq!(
        err(&format!(
            "{GOOD}limits:\n  idle_timeout: 5s\n  # a comment\n\n  max_body_bytes: 1MiB\n  idle_timeout: 6s\n"
        )),
        "zc.yaml:18:3: limits: duplicate entry with key \"idle_timeout\" (its first is on line 14)"
    );
    // In a list item's mapping, and with the value's own lines between.
    let routes = GOOD.replace(
        "    upstream: origin\n",
        "    upstream: origin\n    cache_key:\n      query: false\n    upstream: images\n",
    );
    assert_eq!(
        err(&routes),
        "zc.yaml:15:5: routes[0]: duplicate entry with key \"upstream\" (its first is on line 12)"
    );
}

/// `routes[].name` labels metrics and log lines: unique (an unnamed route goes by its index, so
/// `1` is taken by the second route), not `-` (no route), a label's characters only.
#[test]
fn route_names_are_unique_label_values() {
    let two = |first: &str| {
        GOOD.replace(
            "routes:\n",
            &format!("routes:\n  - name: {first}\n    match: {{ path_prefix: /a/ }}\n    upstream: origin\n"),
        )
    };
    assert_eq!(
        err(&two("\"1\"")),
        "zc.yaml:14:3: routes[1].name: `1` is routes[0]'s name already: each route needs its own"
    );
    assert_eq!(
        err(&two("\"-\"")),
        "zc.yaml:11:5: routes[0].name: `-` is what a request that matched no route is counted under"
    );
    assert_eq!(
        err(&two("\"a b\"")),
        "zc.yaml:11:5: routes[0].name: `a b` may hold only letters, digits, `_`, `.` and `-`"
    );
    let ok = parse(&two("api.v2"), "zc.yaml").expect("valid");
    assert_eq!(ok.routes[0].name_or_index(0), "api.v2");
    assert_eq!(ok.routes[1].name_or_index(1), "1");
}

/// A template's misspelt variable is named where it is written, with the ones there are.
#[test]
fn an_access_log_template_names_a_misspelt_variable() {
    let e = err(&format!(
        "{GOOD}logging:\n  access_log_format: '$time $cach_status'\n"
    ));
    assert!(
        e.starts_with("zc.yaml:14:22: logging.access_log_format: `$cach_status` is not a variable; write `$$` for a `$`; the variables: $time, $time_local, $client,"),
        "{e}"
    );
    let ok = parse(
        &format!("{GOOD}logging:\n  access_log_format: '$time $status'\n"),
        "zc.yaml",
    )
    .expect("valid");
    assert_eq!(
        ok.logging.access_log_format,
        zerocache_config::AccessLogFormat::Template("$time $status".into())
    );
}

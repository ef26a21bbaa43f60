//! Cross-field checks that types alone cannot express: every route's upstream exists, addresses
//! parse and differ, sizes are positive, the cache directory can be created and written.

use crate::schema::{Config, UpstreamServer};
use std::net::SocketAddr;

/// One failed check: where (the key path, which the error module finds in the text) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Key path such as `routes[2].upstream`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

pub(crate) fn invalid(path: impl Into<String>, message: String) -> Invalid {
    Invalid {
        path: path.into(),
        message,
    }
}

/// Most worker threads a config may ask for: far beyond any CPU count that would use them, low
/// enough that a typo (an extra zero or two) is caught rather than spawning thousands of threads.
pub const MAX_WORKERS: usize = 1024;

/// Checks `config`; every problem found is returned, in the order of the checks (so `check`
/// reports all of them at once, not one per edit-and-rerun).
pub fn validate(config: &Config) -> Result<(), Vec<Invalid>> {
    let mut errs = Vec::new();
    checks(config, &mut errs);
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

fn checks(config: &Config, errs: &mut Vec<Invalid>) {
    crate::tls::checks(config, errs);
    crate::fleet::check(config, errs);
    let listen: Vec<SocketAddr> = match config.listen.addrs() {
        Ok(a) => a,
        Err(e) => {
            errs.push(invalid("listen", e));
            Vec::new()
        }
    };
    for (at, why) in config.listen.problems("listen") {
        errs.push(invalid(at, why));
    }
    if let Some(p) = &config.pid_file
        && (!p.is_absolute() || p.file_name().is_none())
    {
        errs.push(invalid(
            "pid_file",
            format!("`{}` must be an absolute path to a file", p.display()),
        ));
    }
    let tf = &config.cache.tag_field;
    if tf.is_empty()
        || !tf
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        errs.push(invalid(
            "cache.tag_field",
            format!("`{tf}` is not a field name (letters, digits, `-`)"),
        ));
    }
    if config.backlog == 0 {
        errs.push(invalid(
            "backlog",
            "must be at least 1 (511 is nginx's default)".into(),
        ));
    }
    for (at, why) in config.purge.problems() {
        errs.push(invalid(at, why));
    }
    if config
        .dashboard
        .token
        .as_deref()
        .is_some_and(|t| t.trim().is_empty())
    {
        errs.push(invalid(
            "dashboard.token",
            "is empty or only whitespace, which is no token: set a real one or remove the key"
                .into(),
        ));
    }
    if config.dashboard.enabled {
        let dash: Option<SocketAddr> = match config.dashboard.listen.parse() {
            Ok(a) => Some(a),
            Err(e) => {
                errs.push(invalid(
                    "dashboard.listen",
                    format!(
                        "`{}` is not an address (host:port): {e}",
                        config.dashboard.listen
                    ),
                ));
                None
            }
        };
        if let Some(dash) = dash
            && !dash.ip().is_loopback()
            && config.dashboard.token.as_deref().is_none_or(str::is_empty)
        {
            errs.push(invalid(
                "dashboard.listen",
                format!(
                    "`{dash}` is not loopback: set `dashboard.token` so the dashboard and its API need a bearer token"
                ),
            ));
        }
        if config.dashboard.metrics_require_token && config.dashboard.token.is_none() {
            errs.push(invalid(
                "dashboard.metrics_require_token",
                "needs `dashboard.token`".into(),
            ));
        }
        if let Some(dash) = dash
            && listen.contains(&dash)
            && dash.port() != 0
        {
            errs.push(invalid(
                "dashboard.listen",
                format!("`{dash}` is also the proxy's `listen`; they must differ"),
            ));
        }
    }
    let id = &config.logging.request_id_header;
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    {
        errs.push(invalid(
            "logging.request_id_header",
            format!("`{id}` is not a header field name (letters, digits and - . _ ...)"),
        ));
    }
    // The id is sent upstream under this name: a name the proxy generates or that frames or
    // routes the message would let a trusted peer's id desync the upstream connection.
    const SET_BY_THE_PROXY: &[&str] = &[
        "host",
        "content-length",
        "expect",
        "via",
        "forwarded",
        "x-forwarded-for",
    ];
    if HOP_BY_HOP
        .iter()
        .chain(SET_BY_THE_PROXY)
        .any(|r| id.eq_ignore_ascii_case(r))
    {
        errs.push(invalid(
            "logging.request_id_header",
            format!("`{id}` is a field the proxy sets or that frames the message; use a name of its own such as X-Request-Id"),
        ));
    }
    if config.cache.max_size.as_u64() == 0 {
        errs.push(invalid("cache.max_size", "must be positive".into()));
    }
    if config.cache.sendfile_max_chunk.as_u64() == 0 {
        errs.push(invalid(
            "cache.sendfile_max_chunk",
            "must be positive".into(),
        ));
    }
    if config.upstreams.is_empty() {
        errs.push(invalid(
            "upstreams",
            "at least one upstream is needed".into(),
        ));
    }
    for (name, up) in &config.upstreams {
        if up.servers.is_empty() {
            errs.push(invalid(
                format!("upstreams.{name}.servers"),
                "at least one server is needed".into(),
            ));
        }
        for (i, s) in up.servers.iter().enumerate() {
            let (at, addr) = match s {
                UpstreamServer::Addr(a) => (format!("upstreams.{name}.servers[{i}]"), a),
                UpstreamServer::Detailed(d) => {
                    (format!("upstreams.{name}.servers[{i}].addr"), &d.addr)
                }
            };
            let ok = addr
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
            if !ok {
                errs.push(invalid(at, format!("`{addr}` is not host:port")));
            }
            if let UpstreamServer::Detailed(d) = s {
                if d.weight == 0 {
                    errs.push(invalid(
                        format!("upstreams.{name}.servers[{i}].weight"),
                        "must be at least 1 (remove the server to send it nothing)".into(),
                    ));
                }
                if d.fail_timeout.is_some_and(|t| t.is_zero()) {
                    errs.push(invalid(
                        format!("upstreams.{name}.servers[{i}].fail_timeout"),
                        "must be positive".into(),
                    ));
                }
            }
        }
        if up.fail_timeout.is_zero() {
            errs.push(invalid(
                format!("upstreams.{name}.fail_timeout"),
                "must be positive".into(),
            ));
        }
        if let Some(h) = &up.health_check {
            let at = |k: &str| format!("upstreams.{name}.health_check.{k}");
            if !h.path.starts_with('/') || !h.path.bytes().all(|b| b.is_ascii_graphic()) {
                errs.push(invalid(
                    at("path"),
                    format!(
                        "`{}` must start with `/` and hold no spaces or controls",
                        h.path
                    ),
                ));
            }
            if h.interval.is_zero() {
                errs.push(invalid(at("interval"), "must be positive".into()));
            }
            if h.timeout.is_zero() {
                errs.push(invalid(at("timeout"), "must be positive".into()));
            }
        }
        if let Some(host) = &up.host {
            // It goes into the request head as is: anything but an authority's characters
            // (a space, CR/LF, `/`, `@`) would change the request rather than name a host.
            let ok = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b));
            if !ok {
                errs.push(invalid(
                    format!("upstreams.{name}.host"),
                    format!("`{host}` is not a host name (optionally with :port)"),
                ));
            }
        }
    }
    if config.cache.levels > 3 {
        errs.push(invalid(
            "cache.levels",
            format!("{} levels: use 0 to 3", config.cache.levels),
        ));
    }
    if config.cache.max_entries == Some(0) {
        errs.push(invalid("cache.max_entries", "must be positive".into()));
    }
    if config.limits.max_connections == 0 {
        errs.push(invalid("limits.max_connections", "must be positive".into()));
    }
    if let Some(n) = config.workers.count
        && !(1..=MAX_WORKERS).contains(&n)
    {
        errs.push(invalid(
            "workers.count",
            format!("{n} workers: use 1 to {MAX_WORKERS}, or leave it out for one per CPU"),
        ));
    }
    if let Err(e) = tracing_filter_ok(&config.logging.level) {
        errs.push(invalid("logging.level", e));
    }
    if config.routes.is_empty() {
        errs.push(invalid("routes", "at least one route is needed".into()));
    }
    let mut names = std::collections::HashMap::new();
    for (i, r) in config.routes.iter().enumerate() {
        let name = r.name_or_index(i);
        if let Some(why) = name_problem(&name) {
            errs.push(invalid(format!("routes[{i}].name"), why));
        } else if let Some(first) = names.insert(name.clone(), i) {
            errs.push(invalid(
                format!("routes[{i}].name"),
                format!("`{name}` is routes[{first}]'s name already: each route needs its own"),
            ));
        }
        if !config.upstreams.contains_key(&r.upstream) {
            let defined: Vec<&str> = config.upstreams.keys().map(String::as_str).collect();
            errs.push(invalid(
                format!("routes[{i}].upstream"),
                format!(
                    "upstream `{}` is not defined; defined: {}",
                    r.upstream,
                    defined.join(", ")
                ),
            ));
        }
        if !r.matcher.path_prefix.starts_with('/') {
            errs.push(invalid(
                format!("routes[{i}].match.path_prefix"),
                format!("`{}` must start with `/`", r.matcher.path_prefix),
            ));
        }
        // An object size range with nothing in it stores nothing: a mistake, never a switch.
        let max = Some(
            r.max_object_size
                .or(config.cache.max_object_size)
                .map_or(config.cache.max_size, |m| m.min(config.cache.max_size)),
        );
        let min = r.min_object_size.unwrap_or(config.cache.min_object_size);
        if let Some(max) = max
            && min > max
        {
            let field = if r.min_object_size.is_some() {
                format!("routes[{i}].min_object_size")
            } else {
                "cache.min_object_size".to_string()
            };
            errs.push(invalid(
                field,
                format!(
                    "{} is more than the largest object stored ({}), so nothing would be stored; use `cache: false` for that",
                    crate::units::binary(min.as_u64()),
                    crate::units::binary(max.as_u64())
                ),
            ));
        }
        crate::slice_check::slice_check(i, r, config, errs);
        crate::rules_check::check(i, r, config, errs);
        for (j, h) in r.cache_key.headers.iter().enumerate() {
            if let Some(why) = never_forwarded(config, h) {
                errs.push(invalid(
                    format!("routes[{i}].cache_key.headers[{j}]"),
                    format!("`{h}` is {why}, so it can never be part of what the origin answers"),
                ));
            }
        }
    }
    if !(1..=1 << 24).contains(&config.limits.rate_limit_keys) {
        errs.push(invalid(
            "limits.rate_limit_keys",
            format!(
                "{} keys: use 1 to 16777216 (the table is made whole at start-up, about 32 bytes a key)",
                config.limits.rate_limit_keys
            ),
        ));
    }
    for (i, c) in config.proxy.trusted_proxies.iter().enumerate() {
        if let Err(e) = crate::cidr::Cidr::parse(c) {
            errs.push(invalid(format!("proxy.trusted_proxies[{i}]"), e));
        }
    }
    // A zero timeout would fail every exchange at once (or, for some, wait forever): never what
    // was meant, so it is refused rather than obeyed.
    let l = &config.limits;
    let mut timeouts: Vec<(String, std::time::Duration)> = vec![
        ("limits.header_timeout".into(), l.header_timeout),
        ("limits.idle_timeout".into(), l.idle_timeout),
        ("limits.read_timeout".into(), l.read_timeout),
        ("limits.send_timeout".into(), l.send_timeout),
        (
            "cache.abandoned_fill_timeout".into(),
            config.cache.abandoned_fill_timeout,
        ),
    ];
    for (name, up) in &config.upstreams {
        timeouts.push((
            format!("upstreams.{name}.connect_timeout"),
            up.connect_timeout,
        ));
        timeouts.push((format!("upstreams.{name}.read_timeout"), up.read_timeout));
    }
    for (path, t) in timeouts {
        if t.is_zero() {
            errs.push(invalid(
                path,
                "a timeout of 0 would fail every exchange: give a duration (`30s`), or leave the \
                 key out for the default"
                    .into(),
            ));
        }
    }
}

/// Fields hop-by-hop whatever `Connection` says (RFC 9110 §7.6.1). The proxy strips the same
/// list, so `check` and the data plane can never disagree about it.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Fields in which a client states its own address, as origins read them for geolocation and
/// rate limits: forwarded only from a trusted proxy (the data plane drops them from anyone else,
/// and `check` refuses a rule that writes one, from this one list).
pub const CLIENT_ADDRESS_FIELDS: &[&str] = &[
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
];

/// Why a request field never reaches the origin, if it doesn't: such a field in the key would
/// split entries on something the origin never saw.
pub(crate) fn never_forwarded(config: &Config, name: &str) -> Option<&'static str> {
    if name.contains('_') {
        Some("dropped (field names with `_` are never forwarded)")
    } else if HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h)) {
        Some("hop-by-hop")
    } else if name.eq_ignore_ascii_case(&config.logging.request_id_header) {
        Some("`logging.request_id_header`, replaced by the proxy's request id")
    } else if config
        .proxy
        .strip_request_fields
        .iter()
        .any(|s| s.eq_ignore_ascii_case(name))
    {
        Some("in `proxy.strip_request_fields`")
    } else {
        None
    }
}

/// Why `name` cannot name a route or a rule in a metric label and a log field, if it cannot.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 64 {
        return Some(format!("`{name}` must have 1 to 64 characters"));
    }
    if name == "-" {
        return Some("`-` is what a request that matched no route is counted under".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Some(format!(
            "`{name}` may hold only letters, digits, `_`, `.` and `-`"
        ));
    }
    None
}

/// Accepts the level names and simple `target=level` lists a tracing filter understands.
fn tracing_filter_ok(level: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for directive in level.split(',').map(str::trim) {
        let lvl = directive.rsplit('=').next().unwrap_or("");
        if !LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "`{directive}` is not a log level; use one of {} (optionally as target=level)",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}

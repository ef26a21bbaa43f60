//! One access log line: the named formats, and templates of `$variables` compiled once when
//! the log opens. Absent values are `-`, as in nginx's logs; every value a client controls
//! (the target, the method, the host, the user agent, the referer, the SNI name) is escaped, so
//! no request can end a quoted field or start a line.

use super::{RequestInfo, UpstreamInfo};
use std::time::SystemTime;
use zerocache_config::AccessLogFormat;
use zerocache_config::access_log::Part;
use zerocache_ledger::ResponseRecord;

/// A format ready to write lines: a named one, or a template's parts.
#[derive(Debug, Clone)]
pub(crate) enum LineFormat {
    Text,
    Json,
    Combined,
    Template(Vec<Part>),
}

impl LineFormat {
    /// The format `f` names (a template checked again: the config checked it once).
    pub(crate) fn of(f: &AccessLogFormat) -> Result<LineFormat, String> {
        Ok(match f {
            AccessLogFormat::Text => LineFormat::Text,
            AccessLogFormat::Json => LineFormat::Json,
            AccessLogFormat::Combined => LineFormat::Combined,
            AccessLogFormat::Template(t) => {
                LineFormat::Template(zerocache_config::access_log::parts(t)?)
            }
        })
    }
}

/// One line, newline included.
pub fn format_line(
    format: &LineFormat,
    now: SystemTime,
    peer: &std::net::SocketAddr,
    r: &ResponseRecord<'_>,
    info: &RequestInfo,
) -> String {
    let path = match r.path {
        zerocache_ledger::DataPath::Zerocopy => "sendfile",
        zerocache_ledger::DataPath::Copy => "copy",
    };
    let ended = if r.complete { "complete" } else { "aborted" };
    let cache = info.relayed_cache.unwrap_or(r.cache_status);
    let proto = protocol(info);
    // Absent values are `-`, as in nginx's logs.
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            escape(s).into_owned()
        }
    };
    let up = info.upstream.as_ref();
    match format {
        LineFormat::Template(parts) => template(parts, now, peer, r, info),
        LineFormat::Text => {
            let (up_addr, up_status, up_time) = match up {
                Some(u) => (
                    u.addr.clone(),
                    u.status.map_or_else(|| "-".into(), |s| s.to_string()),
                    format!("{:.6}", u.time.as_secs_f64()),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            format!(
                "{} {peer} \"{} {} {proto}\" {} {} {} {path} {:.6} {ended} \"{}\" \"{}\" \"{}\" {up_addr} {up_status} {up_time} {}\n",
                rfc3339(now),
                escape(r.method),
                escape(r.target),
                r.status,
                r.body_bytes,
                cache.as_str(),
                r.duration.as_secs_f64(),
                or_dash(&info.host),
                or_dash(&info.user_agent),
                or_dash(&info.referer),
                or_dash(&info.id),
            )
        }
        LineFormat::Combined => format!(
            "{} - - [{}] \"{} {} {proto}\" {} {} \"{}\" \"{}\" {}\n",
            peer.ip(),
            clf_time(now),
            escape(r.method),
            escape(r.target),
            r.status,
            r.body_bytes,
            or_dash(&info.referer),
            or_dash(&info.user_agent),
            cache.as_str(),
        ),
        LineFormat::Json => {
            let v = serde_json::json!({
                "time": rfc3339(now), "peer": peer.to_string(), "method": r.method,
                "path": r.target, "protocol": proto, "status": r.status, "bytes": r.body_bytes,
                "cache": cache.as_str(), "data_path": path,
                "duration_s": r.duration.as_secs_f64(), "complete": r.complete,
                "host": info.host, "user_agent": info.user_agent, "referer": info.referer,
                "upstream_addr": up.map(|u| u.addr.as_str()),
                "upstream_status": up.and_then(|u| u.status),
                "upstream_time_s": up.map(|u| u.time.as_secs_f64()),
                "request_id": info.id,
            });
            format!("{v}\n")
        }
    }
}

/// A line of a template: each variable's value where it stands, `-` where it has none.
fn template(
    parts: &[Part],
    now: SystemTime,
    peer: &std::net::SocketAddr,
    r: &ResponseRecord<'_>,
    info: &RequestInfo,
) -> String {
    let mut out = String::with_capacity(256);
    for p in parts {
        match p {
            Part::Literal(t) => out.push_str(t),
            Part::Var(v) => {
                let value = variable(v, now, peer, r, info);
                out.push_str(if value.is_empty() { "-" } else { &value });
            }
        }
    }
    out.push('\n');
    out
}

/// One variable's value (empty for none); see `zerocache_config::access_log::VARIABLES`.
fn variable(
    name: &str,
    now: SystemTime,
    peer: &std::net::SocketAddr,
    r: &ResponseRecord<'_>,
    info: &RequestInfo,
) -> String {
    let up: Option<&UpstreamInfo> = info.upstream.as_ref();
    let tls = info.tls.as_deref();
    match name {
        "time" => rfc3339(now),
        "time_local" => clf_time(now),
        "client" => peer.ip().to_string(),
        "client_port" => peer.port().to_string(),
        "method" => escape(r.method).into_owned(),
        "target" => escape(r.target).into_owned(),
        "protocol" => protocol(info).into(),
        "host" => escape(&info.host).into_owned(),
        "status" => r.status.to_string(),
        "bytes" => r.body_bytes.to_string(),
        "duration" => format!("{:.6}", r.duration.as_secs_f64()),
        "complete" => (if r.complete { "complete" } else { "aborted" }).into(),
        "cache_status" => info.relayed_cache.unwrap_or(r.cache_status).as_str().into(),
        "zero_copy" if r.body_bytes == 0 => String::new(),
        "zero_copy" => match r.path {
            zerocache_ledger::DataPath::Zerocopy => "yes".into(),
            zerocache_ledger::DataPath::Copy => "no".into(),
        },
        "upstream_addr" => up.map(|u| u.addr.clone()).unwrap_or_default(),
        "upstream_status" => up
            .and_then(|u| u.status)
            .map(|s| s.to_string())
            .unwrap_or_default(),
        "upstream_time" => up
            .map(|u| format!("{:.3}", u.time.as_secs_f64()))
            .unwrap_or_default(),
        "request_id" => escape(&info.id).into_owned(),
        "route" => info
            .route
            .as_ref()
            .map_or(zerocache_ledger::NO_ROUTE, |r| r.name())
            .into(),
        "rule" => info
            .rules
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(","),
        "slices" => info.slices.map(|(n, _)| n.to_string()).unwrap_or_default(),
        "slices_fetched" => info.slices.map(|(_, n)| n.to_string()).unwrap_or_default(),
        "user_agent" => escape(&info.user_agent).into_owned(),
        "referer" => escape(&info.referer).into_owned(),
        "tls_version" => tls.map(|t| t.version.to_string()).unwrap_or_default(),
        "tls_cipher" => tls.map(|t| t.cipher.clone()).unwrap_or_default(),
        "tls_sni" => tls
            .and_then(|t| t.sni.as_deref())
            .map(|s| escape(s).into_owned())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The request's protocol as its request line says it (`HTTP/2.0` for an h2 stream).
fn protocol(info: &RequestInfo) -> &'static str {
    if info.h2 {
        "HTTP/2.0"
    } else if info.http10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    }
}

/// A client-controlled string for the text format, as nginx escapes it: `"`, `\\`, controls
/// and non-ASCII bytes become `\xHH`, so no request can end the quoted field or forge a line.
fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if s.bytes().all(plain) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Year, month, day, and seconds into the day, of a time (UTC), without a date crate (Howard
/// Hinnant's civil-from-days).
fn civil(t: SystemTime) -> (i64, i64, i64, u64, u32) {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    (year, month, day, rem, d.subsec_millis())
}

/// RFC 3339 UTC with milliseconds.
fn rfc3339(t: SystemTime) -> String {
    let (year, month, day, rem, ms) = civil(t);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
    )
}

/// The Common Log Format's time, `10/Oct/2000:13:55:36 +0000` (always UTC).
fn clf_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (year, month, day, rem, _) = civil(t);
    let name = MONTHS[(month as usize).clamp(1, 12) - 1];
    format!(
        "{day:02}/{name}/{year:04}:{:02}:{:02}:{:02} +0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use zerocache_ledger::{CacheStatus, DataPath};

    #[test]
    fn lines_are_exact() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_027_218_499);
        let peer: std::net::SocketAddr = "127.0.0.1:5555".parse().expect("addr");
        let r = ResponseRecord {
            method: "GET",
            target: "/obj/1024",
            status: 200,
            cache_status: CacheStatus::Hit,
            head_bytes: 200,
            body_bytes: 1024,
            path: DataPath::Zerocopy,
            duration: Duration::from_micros(213),
            complete: true,
        };
        let hit = RequestInfo {
            id: "0123456789abcdef".into(),
            http10: false,
            h2: false,
            host: "test.example".into(),
            user_agent: "curl/8.5.0".into(),
            referer: String::new(),
            upstream: None,
            relayed_cache: None,
            route: None,
            rules: Vec::new(),
            tls: None,
            slices: None,
        };
        assert_eq!(
            format_line(&LineFormat::Text, t, &peer, &r, &hit),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /obj/1024 HTTP/1.1\" 200 1024 HIT sendfile 0.000213 complete \"test.example\" \"curl/8.5.0\" \"-\" - - - 0123456789abcdef\n"
        );
        assert_eq!(
            format_line(&LineFormat::Combined, t, &peer, &r, &hit),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /obj/1024 HTTP/1.1\" 200 1024 \"-\" \"curl/8.5.0\" HIT\n"
        );
        // A stream of an HTTP/2 connection says so.
        let h2 = RequestInfo {
            h2: true,
            ..hit.clone()
        };
        assert_eq!(
            format_line(&LineFormat::Combined, t, &peer, &r, &h2),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /obj/1024 HTTP/2.0\" 200 1024 \"-\" \"curl/8.5.0\" HIT\n"
        );
        let miss = RequestInfo {
            referer: "http://a.example/".into(),
            upstream: Some(UpstreamInfo {
                addr: "127.0.0.1:8081".into(),
                status: Some(200),
                time: Duration::from_micros(1500),
            }),
            ..hit.clone()
        };
        let r_miss = ResponseRecord {
            cache_status: CacheStatus::Miss,
            ..r
        };
        assert_eq!(
            format_line(&LineFormat::Text, t, &peer, &r_miss, &miss),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /obj/1024 HTTP/1.1\" 200 1024 MISS sendfile 0.000213 complete \"test.example\" \"curl/8.5.0\" \"http://a.example/\" 127.0.0.1:8081 200 0.001500 0123456789abcdef\n"
        );
        // Hostile values cannot end a quoted field or start a line.
        let hostile = ResponseRecord {
            target: "/a\"b\\c\u{e9}",
            body_bytes: 100,
            complete: false,
            ..r
        };
        let evil = RequestInfo {
            user_agent: "x\" 200 0 \"\nforged".into(),
            referer: "a b".into(),
            http10: true,
            ..hit.clone()
        };
        assert_eq!(
            format_line(&LineFormat::Text, t, &peer, &hostile, &evil),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /a\\x22b\\x5Cc\\xC3\\xA9 HTTP/1.0\" 200 100 HIT sendfile 0.000213 aborted \"test.example\" \"x\\x22 200 0 \\x22\\x0Aforged\" \"a b\" - - - 0123456789abcdef\n"
        );
        assert_eq!(
            format_line(&LineFormat::Combined, t, &peer, &hostile, &evil),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /a\\x22b\\x5Cc\\xC3\\xA9 HTTP/1.0\" 200 100 \"a b\" \"x\\x22 200 0 \\x22\\x0Aforged\" HIT\n"
        );
        let j: serde_json::Value =
            serde_json::from_str(&format_line(&LineFormat::Json, t, &peer, &r_miss, &miss))
                .expect("json");
        assert_eq!(j["data_path"], "sendfile");
        assert_eq!(j["bytes"], 1024);
        assert_eq!(j["upstream_addr"], "127.0.0.1:8081");
        assert_eq!(j["upstream_status"], 200);
        assert_eq!(j["request_id"], "0123456789abcdef");
        assert_eq!(j["protocol"], "HTTP/1.1");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            clf_time(SystemTime::UNIX_EPOCH),
            "01/Jan/1970:00:00:00 +0000"
        );
    }

    /// Every variable a template may use, with its exact value, on a hit over TLS and on a 502
    /// whose upstream never answered; `-` where a value is absent; hostile values escaped.
    #[test]
    fn every_template_variable_has_its_exact_value() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_027_218_499);
        let peer: std::net::SocketAddr = "192.0.2.7:5555".parse().expect("addr");
        let all: Vec<String> = zerocache_config::access_log::VARIABLES
            .iter()
            .map(|(v, _)| format!("${v}"))
            .collect();
        let f = LineFormat::of(&AccessLogFormat::Template(all.join("|"))).expect("template");
        let r = ResponseRecord {
            method: "GET",
            target: "/a\"b",
            status: 200,
            cache_status: CacheStatus::Hit,
            head_bytes: 200,
            body_bytes: 1024,
            path: DataPath::Zerocopy,
            duration: Duration::from_micros(213),
            complete: true,
        };
        let acc = zerocache_ledger::Accounting::new(1, false);
        let hit = RequestInfo {
            id: "0123456789abcdef".into(),
            http10: false,
            h2: true,
            host: "test.example".into(),
            user_agent: "curl/8.5.0".into(),
            referer: String::new(),
            upstream: None,
            relayed_cache: None,
            route: Some(acc.route("static")),
            rules: vec![
                acc.route("static").rule("hsts"),
                acc.route("static").rule("api"),
            ],
            tls: Some(std::sync::Arc::new(super::super::TlsInfo {
                version: "TLSv1.3",
                cipher: "TLS_AES_256_GCM_SHA384".into(),
                sni: Some("test.example".into()),
            })),
            slices: Some((3, 1)),
        };
        assert_eq!(
            format_line(&f, t, &peer, &r, &hit),
            "2026-11-30T08:26:58.499Z|30/Nov/2026:08:26:58 +0000|192.0.2.7|5555|GET|/a\\x22b|HTTP/2.0|test.example|200|1024|0.000213|complete|HIT|yes|-|-|-|0123456789abcdef|static|hsts,api|3|1|curl/8.5.0|-|TLSv1.3|TLS_AES_256_GCM_SHA384|test.example\n"
        );
        let failed = RequestInfo {
            h2: false,
            route: None,
            rules: Vec::new(),
            tls: None,
            slices: None,
            upstream: Some(UpstreamInfo {
                addr: "127.0.0.1:9".into(),
                status: None,
                time: Duration::from_millis(2),
            }),
            ..hit.clone()
        };
        let r502 = ResponseRecord {
            status: 502,
            cache_status: CacheStatus::Error,
            body_bytes: 0,
            path: DataPath::Copy,
            complete: true,
            ..r
        };
        assert_eq!(
            format_line(&f, t, &peer, &r502, &failed),
            "2026-11-30T08:26:58.499Z|30/Nov/2026:08:26:58 +0000|192.0.2.7|5555|GET|/a\\x22b|HTTP/1.1|test.example|502|0|0.000213|complete|ERROR|-|127.0.0.1:9|-|0.002|0123456789abcdef|-|-|-|-|curl/8.5.0|-|-|-|-\n"
        );
    }
}

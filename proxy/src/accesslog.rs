//! The access log: one line per response, written by a dedicated thread so a slow disk never
//! blocks a connection. Lines are queued in a bounded channel; if the writer falls behind, lines
//! are dropped and counted (`zerocache_access_log_dropped_total`) rather than stalling the data
//! plane.
//!
//! Three formats (`logging.access_log_format`): `text`, zerocache's own, with every field an
//! operator greps for; `json`, the same as one object per line; and `combined`, Apache's and
//! nginx's, with the cache status appended, so existing log tooling reads it. Every field a
//! client controls is quoted and escaped as nginx escapes it, so no request can end a field or
//! forge a line.

use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};
use zerocache_config::AccessLogFormat;
use zerocache_ledger::ResponseRecord;

/// Lines queued before new ones are dropped.
const QUEUE: usize = 65_536;

/// What the writer thread is asked to do.
enum Msg {
    /// Write this line.
    Line(String),
    /// Reopen the file (SIGUSR1, after logrotate moved it).
    Reopen,
}

/// What a line says about the request beyond the response record: set by the connection when
/// the request is read, and by the fetch when the upstream answers.
#[derive(Debug, Default, Clone)]
pub struct RequestInfo {
    /// The request id.
    pub id: String,
    /// HTTP/1.0 (else 1.1).
    pub http10: bool,
    /// HTTP/2 (a stream of an h2 connection).
    pub h2: bool,
    /// The normalised host.
    pub host: String,
    /// `User-Agent`, as sent.
    pub user_agent: String,
    /// `Referer`, as sent.
    pub referer: String,
    /// The upstream exchange, when there was one.
    pub upstream: Option<UpstreamInfo>,
    /// A response relayed from the fleet member that owns the key: the owner's cache status
    /// (its `X-Cache`), which the line says in place of this node's `MISS`, so hit ratios read
    /// from logs are right. The metrics count it once, on the owner, as before.
    pub relayed_cache: Option<zerocache_ledger::CacheStatus>,
    /// The route the request matched (its counts and name); none before routing or when none
    /// matched.
    pub route: Option<std::sync::Arc<zerocache_ledger::RouteCounters>>,
}

/// The upstream part of a line.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamInfo {
    /// The server's address.
    pub addr: std::net::SocketAddr,
    /// Its status code.
    pub status: u16,
    /// From sending the request to the response head.
    pub time: Duration,
}

impl RequestInfo {
    /// The request's part of a line.
    pub fn of(req: &crate::http::request::RequestHead) -> RequestInfo {
        let field = |name: &str| req.field(name).unwrap_or_default().to_string();
        RequestInfo {
            id: req.id.clone(),
            http10: req.http10,
            h2: req.h2,
            host: req.host.clone(),
            user_agent: field("user-agent"),
            referer: field("referer"),
            upstream: None,
            relayed_cache: None,
            route: None,
        }
    }
}

/// A handle on the access log.
pub struct AccessLog {
    tx: SyncSender<Msg>,
    format: AccessLogFormat,
    /// Lines dropped because the writer fell behind.
    pub dropped: AtomicU64,
    /// A reopen asked for and not yet done (see [`AccessLog::reopen`]).
    reopen_pending: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Where lines go: a path is opened for appending (and reopened on SIGUSR1), `stdout`/`stderr`
/// are the process's own.
fn open_target(target: &str) -> io::Result<Box<dyn Write + Send>> {
    Ok(match target {
        "stdout" => Box::new(io::stdout()),
        "stderr" => Box::new(io::stderr()),
        path => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
    })
}

impl AccessLog {
    /// Opens `target` (a path, `stdout` or `stderr`) and starts the writer thread.
    pub fn open(target: &str, format: AccessLogFormat) -> io::Result<AccessLog> {
        let out = open_target(target)?;
        let (tx, rx) = sync_channel(QUEUE);
        let target = target.to_string();
        let reopen_pending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pending = reopen_pending.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, out, &target, &pending))?;
        Ok(AccessLog {
            tx,
            format,
            dropped: AtomicU64::new(0),
            reopen_pending,
        })
    }

    /// Queues one line for a response.
    pub fn log(&self, peer: &std::net::SocketAddr, r: &ResponseRecord<'_>, info: &RequestInfo) {
        let line = format_line(self.format, SystemTime::now(), peer, r, info);
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Line(line)) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the writer to reopen the file (nginx's SIGUSR1): lines queued before it go to the
    /// old file, lines after it to the new one. Never blocks: the request goes through the queue
    /// when there is room, and the flag the writer checks every 200 ms carries it when the queue
    /// is full (a stalled disk must not stall the signal loop, and with it the dashboard, reloads
    /// and shutdown).
    pub fn reopen(&self) {
        self.reopen_pending.store(true, Ordering::Relaxed);
        let _ = self.tx.try_send(Msg::Reopen);
    }
}

fn writer(
    rx: Receiver<Msg>,
    out: Box<dyn Write + Send>,
    target: &str,
    reopen_pending: &std::sync::atomic::AtomicBool,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    loop {
        // A reopen that could not be queued (the queue was full) is done here.
        if reopen_pending.load(Ordering::Relaxed) {
            apply(Msg::Reopen, &mut out, target, reopen_pending);
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(msg) => apply(msg, &mut out, target, reopen_pending),
            Err(RecvTimeoutError::Timeout) => {
                let _ = out.flush();
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        }
        // Flush whenever the queue runs dry, so a quiet proxy's log is current.
        match rx.try_recv() {
            Ok(msg) => apply(msg, &mut out, target, reopen_pending),
            Err(_) => {
                let _ = out.flush();
            }
        }
    }
}

/// Writes a line, or flushes and reopens the file; a file that cannot be reopened leaves the
/// old one in use (the lines still land somewhere) and says so.
fn apply(
    msg: Msg,
    out: &mut BufWriter<Box<dyn Write + Send>>,
    target: &str,
    reopen_pending: &std::sync::atomic::AtomicBool,
) {
    match msg {
        Msg::Line(line) => {
            let _ = out.write_all(line.as_bytes());
        }
        // A queued reopen whose flag an earlier one already cleared is the same request: done.
        Msg::Reopen if !reopen_pending.swap(false, Ordering::Relaxed) => {}
        Msg::Reopen => {
            let _ = out.flush();
            match open_target(target) {
                Ok(new) => {
                    *out = BufWriter::with_capacity(64 * 1024, new);
                    tracing::info!(path = target, "access log reopened");
                }
                Err(e) => {
                    tracing::error!(path = target, error = %e, "cannot reopen the access log; still writing to the old file")
                }
            }
        }
    }
}

/// One line, newline included.
pub fn format_line(
    format: AccessLogFormat,
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
    let proto = if info.h2 {
        "HTTP/2.0"
    } else if info.http10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    // Absent values are `-`, as in nginx's logs.
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            escape(s).into_owned()
        }
    };
    let up = info.upstream;
    match format {
        AccessLogFormat::Text => {
            let (up_addr, up_status, up_time) = match up {
                Some(u) => (
                    u.addr.to_string(),
                    u.status.to_string(),
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
        AccessLogFormat::Combined => format!(
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
        AccessLogFormat::Json => {
            let v = serde_json::json!({
                "time": rfc3339(now), "peer": peer.to_string(), "method": r.method,
                "path": r.target, "protocol": proto, "status": r.status, "bytes": r.body_bytes,
                "cache": cache.as_str(), "data_path": path,
                "duration_s": r.duration.as_secs_f64(), "complete": r.complete,
                "host": info.host, "user_agent": info.user_agent, "referer": info.referer,
                "upstream_addr": up.map(|u| u.addr.to_string()),
                "upstream_status": up.map(|u| u.status),
                "upstream_time_s": up.map(|u| u.time.as_secs_f64()),
                "request_id": info.id,
            });
            format!("{v}\n")
        }
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
        };
        assert_eq!(
            format_line(AccessLogFormat::Text, t, &peer, &r, &hit),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /obj/1024 HTTP/1.1\" 200 1024 HIT sendfile 0.000213 complete \"test.example\" \"curl/8.5.0\" \"-\" - - - 0123456789abcdef\n"
        );
        assert_eq!(
            format_line(AccessLogFormat::Combined, t, &peer, &r, &hit),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /obj/1024 HTTP/1.1\" 200 1024 \"-\" \"curl/8.5.0\" HIT\n"
        );
        // A stream of an HTTP/2 connection says so.
        let h2 = RequestInfo {
            h2: true,
            ..hit.clone()
        };
        assert_eq!(
            format_line(AccessLogFormat::Combined, t, &peer, &r, &h2),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /obj/1024 HTTP/2.0\" 200 1024 \"-\" \"curl/8.5.0\" HIT\n"
        );
        let miss = RequestInfo {
            referer: "http://a.example/".into(),
            upstream: Some(UpstreamInfo {
                addr: "127.0.0.1:8081".parse().expect("addr"),
                status: 200,
                time: Duration::from_micros(1500),
            }),
            ..hit.clone()
        };
        let r_miss = ResponseRecord {
            cache_status: CacheStatus::Miss,
            ..r
        };
        assert_eq!(
            format_line(AccessLogFormat::Text, t, &peer, &r_miss, &miss),
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
            format_line(AccessLogFormat::Text, t, &peer, &hostile, &evil),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /a\\x22b\\x5Cc\\xC3\\xA9 HTTP/1.0\" 200 100 HIT sendfile 0.000213 aborted \"test.example\" \"x\\x22 200 0 \\x22\\x0Aforged\" \"a b\" - - - 0123456789abcdef\n"
        );
        assert_eq!(
            format_line(AccessLogFormat::Combined, t, &peer, &hostile, &evil),
            "127.0.0.1 - - [30/Nov/2026:08:26:58 +0000] \"GET /a\\x22b\\x5Cc\\xC3\\xA9 HTTP/1.0\" 200 100 \"a b\" \"x\\x22 200 0 \\x22\\x0Aforged\" HIT\n"
        );
        let j: serde_json::Value = serde_json::from_str(&format_line(
            AccessLogFormat::Json,
            t,
            &peer,
            &r_miss,
            &miss,
        ))
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
}

//! The access log: one line per response, written by a dedicated thread so a slow disk never
//! blocks a connection. Lines are queued in a bounded channel; if the writer falls behind, lines
//! are dropped and counted rather than stalling the data plane.

use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};
use zerocache_config::AccessLogFormat;
use zerocache_dashboard::ResponseRecord;

/// Lines queued before new ones are dropped.
const QUEUE: usize = 65_536;

/// What the writer thread is asked to do.
enum Msg {
    /// Write this line.
    Line(String),
    /// Reopen the file (SIGUSR1, after logrotate moved it).
    Reopen,
}

/// A handle on the access log.
pub struct AccessLog {
    tx: SyncSender<Msg>,
    format: AccessLogFormat,
    /// Lines dropped because the writer fell behind.
    pub dropped: AtomicU64,
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
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, out, &target))?;
        Ok(AccessLog {
            tx,
            format,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues one line for a response.
    pub fn log(&self, peer: &std::net::SocketAddr, r: &ResponseRecord<'_>) {
        let line = format_line(self.format, SystemTime::now(), peer, r);
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Line(line)) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the writer to reopen the file (nginx's SIGUSR1): lines queued before it go to the
    /// old file, lines after it to the new one.
    pub fn reopen(&self) {
        // A blocking send: the signal loop may wait for a full queue to drain, but the request
        // must not be lost, or the log would keep going to a rotated (deleted) file.
        let _ = self.tx.send(Msg::Reopen);
    }
}

fn writer(rx: Receiver<Msg>, out: Box<dyn Write + Send>, target: &str) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(msg) => apply(msg, &mut out, target),
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
            Ok(msg) => apply(msg, &mut out, target),
            Err(_) => {
                let _ = out.flush();
            }
        }
    }
}

/// Writes a line, or flushes and reopens the file; a file that cannot be reopened leaves the
/// old one in use (the lines still land somewhere) and says so.
fn apply(msg: Msg, out: &mut BufWriter<Box<dyn Write + Send>>, target: &str) {
    match msg {
        Msg::Line(line) => {
            let _ = out.write_all(line.as_bytes());
        }
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
) -> String {
    let time = httpdate_rfc3339(now);
    let path = match r.path {
        zerocache_dashboard::DataPath::Zerocopy => "sendfile",
        zerocache_dashboard::DataPath::Copy => "copy",
    };
    let ended = if r.complete { "complete" } else { "aborted" };
    match format {
        AccessLogFormat::Text => format!(
            "{time} {peer} \"{} {}\" {} {} {} {path} {:.6} {ended}\n",
            escape(r.method),
            escape(r.target),
            r.status,
            r.body_bytes,
            r.cache_status.as_str(),
            r.duration.as_secs_f64()
        ),
        AccessLogFormat::Json => {
            let v = serde_json::json!({
                "time": time, "peer": peer.to_string(), "method": r.method, "path": r.target,
                "status": r.status, "bytes": r.body_bytes, "cache": r.cache_status.as_str(),
                "data_path": path, "duration_s": r.duration.as_secs_f64(), "complete": r.complete,
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

/// RFC 3339 UTC with milliseconds, without a date crate.
fn httpdate_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
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
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocache_dashboard::{CacheStatus, DataPath};

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
        assert_eq!(
            format_line(AccessLogFormat::Text, t, &peer, &r),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /obj/1024\" 200 1024 HIT sendfile 0.000213 complete\n"
        );
        let hostile = ResponseRecord {
            target: "/a\"b\\c\u{e9}",
            body_bytes: 100,
            complete: false,
            ..r
        };
        assert_eq!(
            format_line(AccessLogFormat::Text, t, &peer, &hostile),
            "2026-11-30T08:26:58.499Z 127.0.0.1:5555 \"GET /a\\x22b\\x5Cc\\xC3\\xA9\" 200 100 HIT sendfile 0.000213 aborted\n"
        );
        let j: serde_json::Value =
            serde_json::from_str(&format_line(AccessLogFormat::Json, t, &peer, &r)).expect("json");
        assert_eq!(j["data_path"], "sendfile");
        assert_eq!(j["bytes"], 1024);
        assert_eq!(
            httpdate_rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
    }
}

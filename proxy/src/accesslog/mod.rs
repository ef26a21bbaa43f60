//! The access log: one line per response, written by a dedicated thread so a slow disk never
//! blocks a connection. Lines are queued in a bounded channel; if the writer falls behind, lines
//! are dropped and counted (`zerocache_access_log_dropped_total`) rather than stalling the data
//! plane.
//!
//! The line (`line.rs`): three named formats (`logging.access_log_format`): `text`, zerocache's
//! own, with every field an operator greps for; `json`, the same as one object per line; and
//! `combined`, Apache's and nginx's, with the cache status appended, so existing log tooling reads
//! it; or a template of nginx-style `$variables`. Every value a client controls is escaped as
//! nginx escapes it, so no request can end a field or forge a line. Where it goes (`sink.rs`): a
//! file, stdout or stderr, or syslog (`/dev/log`, one datagram a line, as journald and rsyslog
//! read it).

mod line;
mod sink;

pub(crate) use line::LineFormat;
pub use line::format_line;
use sink::Sink;
use std::io;
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
    pub route: Option<&'static zerocache_ledger::RouteCounters>,
    /// The route's rules that matched, in order (`$rule`).
    pub rules: Vec<&'static zerocache_ledger::RuleCounters>,
    /// The connection's TLS handshake, on a TLS listener.
    pub tls: Option<std::sync::Arc<TlsInfo>>,
    /// A response from slices (`routes[].slice`): the slices its body came from, and how many
    /// slices were fetched from the origin for it (`$slices`, `$slices_fetched`).
    pub slices: Option<(u64, u64)>,
}

/// The upstream part of a line.
#[derive(Debug, Clone)]
pub struct UpstreamInfo {
    /// The server's address: the one it answered from, or the server tried last when none
    /// answered (a 502 says whom it could not reach).
    pub addr: String,
    /// Its status code; none when it did not answer.
    pub status: Option<u16>,
    /// From sending the request to the response head, or to the failure.
    pub time: Duration,
}

/// What a TLS connection's handshake agreed, for `$tls_version`, `$tls_cipher` and `$tls_sni`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsInfo {
    /// `TLSv1.2` or `TLSv1.3`, as nginx's `$ssl_protocol`.
    pub version: &'static str,
    /// The cipher suite's IANA name (`TLS_AES_128_GCM_SHA256`).
    pub cipher: String,
    /// The server name the client asked for, if it sent one.
    pub sni: Option<String>,
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
            rules: Vec::new(),
            tls: None,
            slices: None,
        }
    }
}

/// A handle on the access log.
pub struct AccessLog {
    tx: SyncSender<Msg>,
    format: LineFormat,
    /// Lines dropped because the writer fell behind, or because syslog took none (its socket
    /// gone and not back after a reconnect).
    pub dropped: std::sync::Arc<AtomicU64>,
    /// A reopen asked for and not yet done (see [`AccessLog::reopen`]).
    reopen_pending: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl AccessLog {
    /// Opens `target` (a path, `stdout`, `stderr`, or `syslog` / `syslog:PATH`) and starts the
    /// writer thread.
    pub fn open(target: &str, format: &AccessLogFormat) -> io::Result<AccessLog> {
        let format = LineFormat::of(format).map_err(io::Error::other)?;
        let out = Sink::open(target)?;
        let (tx, rx) = sync_channel(QUEUE);
        let target = target.to_string();
        let reopen_pending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pending = reopen_pending.clone();
        let dropped = std::sync::Arc::new(AtomicU64::new(0));
        let lost = dropped.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, out, &target, &pending, &lost))?;
        Ok(AccessLog {
            tx,
            format,
            dropped,
            reopen_pending,
        })
    }

    /// Queues one line for a response.
    pub fn log(&self, peer: &std::net::SocketAddr, r: &ResponseRecord<'_>, info: &RequestInfo) {
        let line = format_line(&self.format, SystemTime::now(), peer, r, info);
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
    mut out: Sink,
    target: &str,
    reopen_pending: &std::sync::atomic::AtomicBool,
    lost: &AtomicU64,
) {
    let apply = |msg: Msg, out: &mut Sink| {
        if !apply(msg, out, target, reopen_pending) {
            lost.fetch_add(1, Ordering::Relaxed);
        }
    };
    loop {
        // A reopen that could not be queued (the queue was full) is done here.
        if reopen_pending.load(Ordering::Relaxed) {
            apply(Msg::Reopen, &mut out);
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(msg) => apply(msg, &mut out),
            Err(RecvTimeoutError::Timeout) => out.flush(),
            Err(RecvTimeoutError::Disconnected) => {
                out.flush();
                return;
            }
        }
        // Flush whenever the queue runs dry, so a quiet proxy's log is current.
        match rx.try_recv() {
            Ok(msg) => apply(msg, &mut out),
            Err(_) => out.flush(),
        }
    }
}

/// Writes a line, or flushes and reopens the target; one that cannot be reopened leaves the
/// old one in use (the lines still land somewhere) and says so. False: a line was lost.
fn apply(
    msg: Msg,
    out: &mut Sink,
    target: &str,
    reopen_pending: &std::sync::atomic::AtomicBool,
) -> bool {
    match msg {
        Msg::Line(line) => return out.line(&line),
        // A queued reopen whose flag an earlier one already cleared is the same request: done.
        Msg::Reopen if !reopen_pending.swap(false, Ordering::Relaxed) => {}
        Msg::Reopen => {
            out.flush();
            match Sink::open(target) {
                Ok(new) => {
                    *out = new;
                    tracing::info!(path = target, "access log reopened");
                }
                Err(e) => {
                    tracing::error!(path = target, error = %e, "cannot reopen the access log; still writing to the old file")
                }
            }
        }
    }
    true
}

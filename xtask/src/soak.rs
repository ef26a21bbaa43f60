//! `cargo xtask soak`: a verified soak of the real zerocache binary, with faults injected on a
//! schedule, ending in one table.
//!
//! The origin runs in this process on its own tokio runtime, so killing it (dropping the runtime)
//! closes its listener and every connection it holds, and it restarts on the same port. It serves
//! objects of many sizes whose bytes are known ([`zerocache_origin::body`]): cacheable with an
//! ETag (`/obj/N`), `no-store` (`/ns/N`), chunked without a validator (`/ch/N`), and a "flaky" set
//! whose answers the origin faults rewrite: `/fl/N` (fresh for 2 s, revalidated with a 304) and
//! `/fn/N` (`no-store`). Client threads drive a weighted mix through the proxy: GET, HEAD, single
//! ranges, `If-None-Match` with the right and a wrong ETag, cache-busting misses, and purges
//! through the dashboard API. Every body is compared byte for byte with what the origin serves.
//!
//! Faults, one at a time every few seconds, each logged with its time: the origin killed and
//! restarted; the origin truncating responses (announcing the length, sending half, closing) and
//! hanging up; the origin stalling (before the head, and mid-body for less and for more than the
//! proxy's upstream read timeout); cache files truncated underneath; a byte of a cache file's body
//! flipped; SIGHUP storms (10 in 1 s).
//!
//! Classification. A response is ok, or an error of one kind: unexpected status, bad headers,
//! closed before the response, cut short mid-body, timeout, connect failure, protocol error, or
//! CORRUPT (a complete body, or the received part of a cut-short one, that differs from the
//! origin's). A non-corrupt error is *expected* when the request overlapped a fault window (the
//! fault's active time plus a grace for the proxy to notice recovery), or when it was cut short
//! on a URL whose cache file was truncated before it. A corrupt body whose every wrong byte is a
//! byte this soak flipped in that URL's cache file is counted apart (`flipped byte served`: the
//! cache cannot see a flip until its scrub reads the file). The run fails on any corrupt body not
//! so explained, on any unexpected error, and if the proxy died.
//!
//! A hit whose cache file is truncated *after* sendfile has handed its pages to the socket, but
//! before the client read them, reaches the client complete, with zeros from the cut to the end of
//! the kernel's page-cache folio (ext4 large folios: up to 128 KiB and more): zero-copy sends the
//! page cache's own pages, and truncate zeroes the partial folio in place. sendfile had returned
//! the full count, so no send-time check can see it; only an outside writer can cause it (the
//! proxy never modifies a cache file in place: fills are renamed into place whole). Like a flip,
//! such a body is counted apart ("injected truncation served as zeros") and does not fail the
//! run; any other wrong byte does.
//!
//! The run's directory (config, cache, the proxy's log) is removed after a pass unless
//! `XTASK_SOAK_KEEP` is set, and kept after a failure.

use crate::{free_port, root, run};
use anyhow::{Context, bail};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocache_origin::client::parse_head;
use zerocache_origin::{Framing, Origin, Reply};

/// Soak settings.
pub struct Options {
    /// Seconds of traffic.
    pub duration: u64,
    /// Client threads.
    pub clients: usize,
    /// Seed of every random choice (ops, objects, ranges, fault order, cache files).
    pub seed: u64,
    /// Load the eBPF probe (needs root).
    pub probe: bool,
    /// Build and run the release binary (else the debug one).
    pub release: bool,
}

/// The `Host` clients send; purges name `http://soak/...`.
const HOST: &str = "soak";
const MIB: usize = 1 << 20;
/// Every object size; the other families use subsets.
const SIZES: [usize; 9] = [0, 1, 1000, 4096, 65_535, 65_537, MIB, 3 * MIB, 16 * MIB];
/// Longest wait for one read from the proxy.
const CLIENT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one request may take, whatever the progress: a hang becomes a timeout.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// The proxy's `read_timeout` towards the origin (the stall fault pauses longer than this).
const UPSTREAM_READ_TIMEOUT_S: u64 = 2;
/// Error records kept per client thread (the counts stay exact beyond it).
const RECORDS_KEPT: usize = 20_000;

// ---------------------------------------------------------------------------------------------
// Randomness (seeded, no dependency).

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// An index into `weights`, chosen by weight.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| *w as u64).sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w as u64 {
                return i;
            }
            x -= *w as u64;
        }
        weights.len() - 1
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The objects.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    /// Cacheable for an hour, ETag, Content-Length.
    Obj,
    /// `no-store`, ETag.
    NoStore,
    /// Cacheable, chunked, no validator.
    Chunked,
    /// Fresh for 2 s, ETag, revalidated with 304; rewritten by the origin faults.
    Flaky,
    /// `no-store`, ETag; rewritten by the origin faults.
    FlakyNoStore,
}

impl Family {
    const ALL: [Family; 5] = [
        Family::Obj,
        Family::NoStore,
        Family::Chunked,
        Family::Flaky,
        Family::FlakyNoStore,
    ];

    fn tag(self) -> &'static str {
        match self {
            Family::Obj => "obj",
            Family::NoStore => "ns",
            Family::Chunked => "ch",
            Family::Flaky => "fl",
            Family::FlakyNoStore => "fn",
        }
    }

    fn sizes(self) -> &'static [usize] {
        match self {
            Family::Obj => &SIZES,
            Family::NoStore => &[0, 1000, 65_537, MIB],
            Family::Chunked => &[0, 1, 4096, 65_537, MIB, 3 * MIB],
            Family::Flaky => &[1000, 65_537, MIB, 3 * MIB],
            Family::FlakyNoStore => &[1000, 65_537, MIB],
        }
    }

    fn weight(self) -> u32 {
        match self {
            Family::Obj => 3,
            Family::Flaky => 2,
            _ => 1,
        }
    }

    fn cache_control(self) -> &'static str {
        match self {
            Family::Obj | Family::Chunked => "max-age=3600",
            Family::Flaky => "max-age=2",
            Family::NoStore | Family::FlakyNoStore => "no-store",
        }
    }

    fn cacheable(self) -> bool {
        matches!(self, Family::Obj | Family::Chunked | Family::Flaky)
    }

    fn flaky(self) -> bool {
        matches!(self, Family::Flaky | Family::FlakyNoStore)
    }
}

struct Object {
    family: Family,
    size: usize,
    path: String,
    etag: Option<String>,
    weight: u32,
}

fn size_weight(n: usize) -> u32 {
    match n {
        0 | 1 => 3,
        n if n <= 65_537 => 5,
        n if n <= MIB => 3,
        n if n <= 3 * MIB => 2,
        _ => 1,
    }
}

fn catalogue() -> Vec<Object> {
    let mut out = Vec::new();
    for f in Family::ALL {
        for &n in f.sizes() {
            out.push(Object {
                family: f,
                size: n,
                path: format!("/{}/{n}", f.tag()),
                etag: (f != Family::Chunked).then(|| format!("\"{}-{n}\"", f.tag())),
                weight: f.weight() * size_weight(n),
            });
        }
    }
    out
}

/// The generated body of every size, computed once.
type Bodies = HashMap<usize, Vec<u8>>;

// ---------------------------------------------------------------------------------------------
// The origin, killable and restartable on the same port.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OriginMode {
    Normal,
    Truncating,
    Stalling,
}

struct OriginCtl {
    addr: String,
    objects: Arc<Vec<Object>>,
    bodies: Arc<Bodies>,
    running: Option<(tokio::runtime::Runtime, Origin)>,
}

impl OriginCtl {
    /// Binds (retrying while the old socket goes away) and scripts every object. The scripts are
    /// built first, so the origin answers with them (not its 404s) almost from its first accept.
    fn start(&mut self) -> anyhow::Result<()> {
        let scripts = self.scripts(OriginMode::Normal, true);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("soak-origin")
                .enable_all()
                .build()?;
            match rt.block_on(Origin::bind(&self.addr)) {
                Ok(o) => {
                    self.running = Some((rt, o));
                    break;
                }
                Err(e) => {
                    rt.shutdown_background();
                    if Instant::now() > deadline {
                        return Err(e)
                            .with_context(|| format!("binding the origin on {}", self.addr));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.install(scripts);
        Ok(())
    }

    /// Stops accepting and drops every connection (the runtime and all its tasks go).
    fn kill(&mut self) {
        if let Some((rt, origin)) = self.running.take() {
            drop(origin);
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// Scripts the flaky objects for `mode`.
    fn script(&self, mode: OriginMode) {
        self.install(self.scripts(mode, false));
    }

    fn install(&self, scripts: Vec<Script>) {
        let Some((_, o)) = &self.running else { return };
        for (path, reply, by_inm) in scripts {
            o.script(&path, reply);
            if let Some(replies) = by_inm {
                let replies = replies
                    .iter()
                    .map(|(k, r)| (k.as_deref(), r.clone()))
                    .collect();
                o.script_by_header(&path, "if-none-match", replies);
            }
        }
    }

    /// The scripts of the flaky objects for `mode` (and, with `all`, of every other object too).
    fn scripts(&self, mode: OriginMode, all: bool) -> Vec<Script> {
        let mut out = Vec::new();
        let mut k = 0;
        for obj in self.objects.iter() {
            if !all && !obj.family.flaky() {
                continue;
            }
            let mut headers = vec![
                ("Cache-Control", obj.family.cache_control()),
                ("Content-Type", "application/octet-stream"),
            ];
            if let Some(e) = &obj.etag {
                headers.push(("ETag", e.as_str()));
            }
            let mut reply = Reply::ok(self.bodies[&obj.size].clone()).headers(&headers);
            if obj.family == Family::Chunked {
                reply = reply.framing(Framing::Chunked(8192));
            }
            if obj.family.flaky() {
                reply = match mode {
                    OriginMode::Normal => reply,
                    OriginMode::Truncating if k == 4 => Reply::hang_up(),
                    OriginMode::Truncating => reply.framing(Framing::Truncate(obj.size / 2)),
                    // Before the head, longer than the proxy's read timeout.
                    OriginMode::Stalling if k % 3 == 0 => reply.delay(Duration::from_secs(4)),
                    // Mid-body: half, a pause, the rest; shorter or longer than the timeout.
                    OriginMode::Stalling => {
                        let pause = if k % 3 == 1 { 1 } else { 4 };
                        reply.trickle(obj.size / 2 + 1, Duration::from_secs(pause))
                    }
                };
                k += 1;
            }
            let mut by_inm = None;
            if obj.family == Family::Flaky
                && let Some(etag) = &obj.etag
            {
                // Revalidation answers 304 normally; during a fault the plain (faulty) script.
                by_inm = Some(if mode == OriginMode::Normal {
                    vec![(
                        Some(etag.clone()),
                        Reply::ok(Vec::new()).status(304).headers(&[
                            ("Cache-Control", obj.family.cache_control()),
                            ("ETag", etag.as_str()),
                        ]),
                    )]
                } else {
                    Vec::new()
                });
            }
            out.push((obj.path.clone(), reply, by_inm));
        }
        out
    }
}

/// A path's script: its reply, and the replies by `If-None-Match` value if it has them.
type Script = (String, Reply, Option<Vec<(Option<String>, Reply)>>);

// ---------------------------------------------------------------------------------------------
// A strict HTTP/1.1 client: Content-Length, chunked and close-delimited bodies, interim
// responses skipped, every read bounded.

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    keep: bool,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How an exchange failed.
enum IoFail {
    /// Closed (or reset) before a complete response head.
    BeforeHead(String),
    /// Closed (or reset) mid-body: the status, and the body bytes received so far.
    MidBody(String, u16, Vec<u8>),
    Timeout(String),
    Protocol(String),
}

enum ReadErr {
    Eof,
    Timeout,
    Io(String),
}

struct HttpConn {
    sock: TcpStream,
    buf: Vec<u8>,
    scratch: Vec<u8>,
}

fn crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

impl HttpConn {
    fn connect(addr: SocketAddr) -> std::io::Result<HttpConn> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        sock.set_read_timeout(Some(CLIENT_READ_TIMEOUT))?;
        sock.set_write_timeout(Some(CLIENT_READ_TIMEOUT))?;
        sock.set_nodelay(true)?;
        Ok(HttpConn {
            sock,
            buf: Vec::with_capacity(1 << 18),
            scratch: vec![0; 1 << 18],
        })
    }

    fn fill(&mut self, deadline: Instant) -> Result<(), ReadErr> {
        if Instant::now() > deadline {
            return Err(ReadErr::Timeout);
        }
        match self.sock.read(&mut self.scratch) {
            Ok(0) => Err(ReadErr::Eof),
            Ok(n) => {
                self.buf.extend_from_slice(&self.scratch[..n]);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ReadErr::Timeout)
            }
            Err(e) => Err(ReadErr::Io(e.to_string())),
        }
    }

    /// Sends `req` and reads one response (`head_only`: the request was HEAD).
    fn exchange(&mut self, req: &[u8], head_only: bool) -> Result<Response, IoFail> {
        let started = Instant::now();
        let deadline = started + REQUEST_DEADLINE;
        if let Err(e) = self.sock.write_all(req) {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    IoFail::Timeout("writing the request".into())
                }
                _ => IoFail::BeforeHead(format!("writing the request: {e}")),
            });
        }
        let (status, headers) = loop {
            match parse_head(&self.buf).map_err(IoFail::Protocol)? {
                Some((status, headers, n)) => {
                    self.buf.drain(..n);
                    if (100..200).contains(&status) && status != 101 {
                        continue;
                    }
                    break (status, headers);
                }
                None => self.fill(deadline).map_err(|e| match e {
                    ReadErr::Timeout => IoFail::Timeout(format!(
                        "no response head after {:.1} s",
                        started.elapsed().as_secs_f64()
                    )),
                    ReadErr::Eof => IoFail::BeforeHead("closed before the response".into()),
                    ReadErr::Io(e) => IoFail::BeforeHead(e),
                })?,
            }
        };
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_ascii_lowercase())
        };
        let chunked = find("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let close = find("connection").is_some_and(|v| v.contains("close"));
        let length = match find("content-length") {
            Some(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| IoFail::Protocol(format!("Content-Length `{v}`")))?,
            ),
            None => None,
        };
        let (body, keep) = if head_only || status == 204 || status == 304 {
            (Vec::new(), !close)
        } else if chunked {
            (self.read_chunked(status, deadline, started)?, !close)
        } else if let Some(n) = length {
            (self.read_length(status, n, deadline, started)?, !close)
        } else {
            (self.read_to_eof(status, deadline, started)?, false)
        };
        Ok(Response {
            status,
            headers,
            body,
            keep,
        })
    }

    fn mid_body(e: ReadErr, status: u16, got: Vec<u8>, started: Instant) -> IoFail {
        match e {
            ReadErr::Timeout => IoFail::Timeout(format!(
                "{status} body stalled at {} bytes after {:.1} s",
                got.len(),
                started.elapsed().as_secs_f64()
            )),
            ReadErr::Eof => IoFail::MidBody(
                format!("{status} closed after {} body bytes", got.len()),
                status,
                got,
            ),
            ReadErr::Io(s) => IoFail::MidBody(
                format!("{status} {s} after {} body bytes", got.len()),
                status,
                got,
            ),
        }
    }

    fn read_length(
        &mut self,
        status: u16,
        n: usize,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        while self.buf.len() < n {
            if let Err(e) = self.fill(deadline) {
                let got = std::mem::take(&mut self.buf);
                return Err(Self::mid_body(e, status, got, started));
            }
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    fn read_to_eof(
        &mut self,
        status: u16,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        loop {
            match self.fill(deadline) {
                Ok(()) => {}
                Err(ReadErr::Eof) => return Ok(std::mem::take(&mut self.buf)),
                Err(e) => {
                    let got = std::mem::take(&mut self.buf);
                    return Err(Self::mid_body(e, status, got, started));
                }
            }
        }
    }

    fn read_chunked(
        &mut self,
        status: u16,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = crlf(&self.buf) {
                    break p;
                }
                if let Err(e) = self.fill(deadline) {
                    return Err(Self::mid_body(e, status, body, started));
                }
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| IoFail::Protocol(format!("chunk size line `{line}`")))?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                loop {
                    match crlf(&self.buf) {
                        Some(0) => {
                            self.buf.drain(..2);
                            return Ok(body);
                        }
                        Some(p) => {
                            self.buf.drain(..p + 2);
                        }
                        None => {
                            if let Err(e) = self.fill(deadline) {
                                return Err(Self::mid_body(e, status, body, started));
                            }
                        }
                    }
                }
            }
            while self.buf.len() < size + 2 {
                if let Err(e) = self.fill(deadline) {
                    let have = self.buf.len().min(size);
                    body.extend_from_slice(&self.buf[..have]);
                    return Err(Self::mid_body(e, status, body, started));
                }
            }
            body.extend_from_slice(&self.buf[..size]);
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(IoFail::Protocol("chunk not followed by CRLF".into()));
            }
            self.buf.drain(..size + 2);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests and their verdicts.

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
enum Op {
    Get,
    Head,
    Range,
    IfNoneMatch,
    IfNoneMatchWrong,
    Miss,
    Purge,
}

impl Op {
    const WEIGHTED: [(u32, Op); 7] = [
        (40, Op::Get),
        (8, Op::Head),
        (20, Op::Range),
        (8, Op::IfNoneMatch),
        (6, Op::IfNoneMatchWrong),
        (8, Op::Miss),
        (1, Op::Purge),
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Head => "HEAD",
            Op::Range => "range",
            Op::IfNoneMatch => "if-none-match",
            Op::IfNoneMatchWrong => "if-none-match (wrong)",
            Op::Miss => "miss",
            Op::Purge => "purge",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord, Hash)]
enum Kind {
    Status,
    Header,
    Closed,
    CutShort,
    Timeout,
    Connect,
    Protocol,
    Corrupt,
}

impl Kind {
    const ERRORS: [Kind; 7] = [
        Kind::Status,
        Kind::Header,
        Kind::Closed,
        Kind::CutShort,
        Kind::Timeout,
        Kind::Connect,
        Kind::Protocol,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Status => "unexpected status",
            Kind::Header => "bad headers",
            Kind::Closed => "closed before response",
            Kind::CutShort => "cut short mid-body",
            Kind::Timeout => "timeout",
            Kind::Connect => "connect failed",
            Kind::Protocol => "protocol error",
            Kind::Corrupt => "CORRUPT body",
        }
    }
}

struct Failure {
    kind: Kind,
    detail: String,
    /// For a wrong body: (absolute body position, byte received), at most 16.
    diffs: Vec<(u64, u8)>,
    /// `diffs` holds every difference (same length, at most 16 of them).
    diffs_complete: bool,
    /// Every wrong byte is a zero: the first wrong position.
    zero_fill: Option<u64>,
}

impl Failure {
    fn new(kind: Kind, detail: String) -> Failure {
        Failure {
            kind,
            detail,
            diffs: Vec::new(),
            diffs_complete: false,
            zero_fill: None,
        }
    }
}

/// Compares `got` with `expected` (the bytes from body position `base`); `complete`: the body was
/// whole (else `got` must be a prefix of `expected`).
fn check_bytes(expected: &[u8], got: &[u8], base: u64, complete: bool) -> Result<(), Failure> {
    let comparable = if complete {
        expected
    } else {
        &expected[..got.len().min(expected.len())]
    };
    if comparable == got {
        return Ok(());
    }
    let mut diffs = Vec::new();
    let (mut count, mut zeros, mut last) = (0u64, 0u64, 0u64);
    for (i, (a, b)) in comparable.iter().zip(got).enumerate() {
        if a != b {
            count += 1;
            zeros += (*b == 0) as u64;
            last = base + i as u64;
            if diffs.len() < 16 {
                diffs.push((base + i as u64, *b));
            }
        }
    }
    let same_len = comparable.len() == got.len();
    let what = if complete {
        "complete body"
    } else {
        "cut-short body"
    };
    let span = match diffs.first() {
        Some((first, _)) => {
            let zeros = if zeros == count {
                ", all of them zeros"
            } else {
                ""
            };
            format!(", at positions {first}..={last}{zeros}")
        }
        None => String::new(),
    };
    let mut f = Failure::new(
        Kind::Corrupt,
        format!(
            "{what} of {} bytes (expected {}) differs in {count} byte(s){span}",
            got.len(),
            comparable.len(),
        ),
    );
    f.diffs_complete = same_len && count <= 16;
    f.zero_fill = (count > 0 && zeros == count).then(|| diffs[0].0);
    f.diffs = diffs;
    Err(f)
}

fn expect_full(r: &Response, expected: &[u8]) -> Result<(), Failure> {
    if r.status != 200 {
        return Err(Failure::new(Kind::Status, format!("status {}", r.status)));
    }
    check_bytes(expected, &r.body, 0, true)
}

struct Shared {
    objects: Arc<Vec<Object>>,
    bodies: Arc<Bodies>,
    proxy: SocketAddr,
    dashboard: SocketAddr,
    stop: AtomicBool,
    requests: AtomicU64,
    errors: AtomicU64,
}

struct ErrRec {
    kind: Kind,
    op: Op,
    target: String,
    start: Instant,
    end: Instant,
    detail: String,
    diffs: Vec<(u64, u8)>,
    diffs_complete: bool,
    zero_fill: Option<u64>,
}

#[derive(Default)]
struct ClientStats {
    by_op: BTreeMap<Op, u64>,
    ok: u64,
    records: Vec<ErrRec>,
    /// Errors beyond [`RECORDS_KEPT`] (counted as unexpected).
    dropped: u64,
}

/// One purge through the dashboard API.
fn purge(dashboard: SocketAddr, field: &str, url: &str) -> Result<String, Failure> {
    let body = format!("{{\"{field}\": \"{url}\"}}");
    let req = format!(
        "POST /api/purge HTTP/1.1\r\nHost: {dashboard}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut c = HttpConn::connect(dashboard)
        .map_err(|e| Failure::new(Kind::Connect, format!("dashboard: {e}")))?;
    let r = c.exchange(req.as_bytes(), false).map_err(io_failure)?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    if r.status != 200 || !text.contains("\"purged\"") {
        return Err(Failure::new(
            Kind::Status,
            format!("purge answered {}: {text}", r.status),
        ));
    }
    Ok(text)
}

fn io_failure(e: IoFail) -> Failure {
    match e {
        IoFail::BeforeHead(s) => Failure::new(Kind::Closed, s),
        IoFail::MidBody(s, _, _) => Failure::new(Kind::CutShort, s),
        IoFail::Timeout(s) => Failure::new(Kind::Timeout, s),
        IoFail::Protocol(s) => Failure::new(Kind::Protocol, s),
    }
}

/// One request of `op` on `obj`: the target it named and its verdict.
fn one_request(
    sh: &Shared,
    rng: &mut Rng,
    conn: &mut Option<HttpConn>,
    op: Op,
    obj: &Object,
    seq: u64,
    tid: usize,
) -> (String, Result<(), Failure>) {
    if op == Op::Purge {
        let (field, url) = if rng.below(8) == 0 {
            let fam = if rng.below(2) == 0 { "ch" } else { "fl" };
            ("prefix", format!("http://{HOST}/{fam}/"))
        } else {
            ("url", format!("http://{HOST}{}", obj.path))
        };
        let target = format!("purge {field} {url}");
        return (target, purge(sh.dashboard, field, &url).map(|_| ()));
    }
    let n = obj.size;
    let expected = &sh.bodies[&n][..];
    // A range of an empty body and a conditional without a validator are plain GETs.
    let op = match op {
        Op::Range if n == 0 => Op::Get,
        Op::IfNoneMatch | Op::IfNoneMatchWrong if obj.etag.is_none() => Op::Get,
        op => op,
    };
    let target = if op == Op::Miss {
        format!("{}?miss={tid}-{seq}", obj.path)
    } else {
        obj.path.clone()
    };
    let mut extra = String::new();
    let mut range = (0usize, 0usize);
    match op {
        Op::Range => {
            let cap = 256 * 1024;
            let (spec, first, last) = match rng.below(4) {
                0 | 1 => {
                    let a = rng.below(n as u64) as usize;
                    let span = 1 + rng.below((n - a).min(cap) as u64) as usize;
                    (format!("{a}-{}", a + span - 1), a, a + span - 1)
                }
                2 => {
                    let a = rng.below(n as u64) as usize;
                    (format!("{a}-"), a, n - 1)
                }
                _ => {
                    let k = 1 + rng.below(n.min(cap) as u64) as usize;
                    (format!("-{k}"), n - k, n - 1)
                }
            };
            range = (first, last);
            let _ = write!(extra, "Range: bytes={spec}\r\n");
        }
        Op::IfNoneMatch => {
            let _ = write!(
                extra,
                "If-None-Match: {}\r\n",
                obj.etag.as_deref().unwrap_or("")
            );
        }
        Op::IfNoneMatchWrong => extra.push_str("If-None-Match: \"soak-wrong\"\r\n"),
        _ => {}
    }
    let close = rng.below(10) == 0;
    if close {
        extra.push_str("Connection: close\r\n");
    }
    let method = if op == Op::Head { "HEAD" } else { "GET" };
    let req = format!("{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n{extra}\r\n");
    if conn.is_none() {
        match HttpConn::connect(sh.proxy) {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                std::thread::sleep(Duration::from_millis(50));
                return (target, Err(Failure::new(Kind::Connect, e.to_string())));
            }
        }
    }
    let Some(c) = conn.as_mut() else {
        return (
            target,
            Err(Failure::new(Kind::Connect, "no connection".into())),
        );
    };
    let r = match c.exchange(req.as_bytes(), op == Op::Head) {
        Ok(r) => r,
        Err(e) => {
            *conn = None;
            // The received part of a cut-short body must still be right.
            if let IoFail::MidBody(detail, status, got) = &e {
                let (want, base) = if op == Op::Range && *status == 206 {
                    (&expected[range.0..=range.1], range.0 as u64)
                } else {
                    (expected, 0)
                };
                if let Err(mut f) = check_bytes(want, got, base, false) {
                    f.detail = format!("{detail}; {}", f.detail);
                    return (target, Err(f));
                }
            }
            return (target, Err(io_failure(e)));
        }
    };
    if !r.keep || close {
        *conn = None;
    }
    let verdict = match op {
        Op::Get | Op::Miss => expect_full(&r, expected),
        Op::Head => {
            if r.status != 200 {
                Err(Failure::new(Kind::Status, format!("status {}", r.status)))
            } else if let Some(cl) = r.header("content-length")
                && cl.trim() != n.to_string()
            {
                Err(Failure::new(
                    Kind::Header,
                    format!("HEAD Content-Length {cl}, object is {n} bytes"),
                ))
            } else {
                Ok(())
            }
        }
        Op::Range => match r.status {
            206 => {
                let (first, last) = range;
                let cr = r.header("content-range").unwrap_or("");
                let want = format!("bytes {first}-{last}/{n}");
                let want_unknown = format!("bytes {first}-{last}/*");
                if cr != want && cr != want_unknown {
                    Err(Failure::new(
                        Kind::Header,
                        format!("Content-Range `{cr}`, expected `{want}`"),
                    ))
                } else {
                    check_bytes(&expected[first..=last], &r.body, first as u64, true)
                }
            }
            _ => expect_full(&r, expected),
        },
        Op::IfNoneMatch => match r.status {
            304 => Ok(()),
            _ => expect_full(&r, expected),
        },
        Op::IfNoneMatchWrong => match r.status {
            304 => Err(Failure::new(
                Kind::Status,
                "304 to an If-None-Match that does not match".into(),
            )),
            _ => expect_full(&r, expected),
        },
        Op::Purge => Ok(()),
    };
    (target, verdict)
}

fn client(sh: Arc<Shared>, tid: usize, seed: u64) -> ClientStats {
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(tid as u64));
    let op_weights: Vec<u32> = Op::WEIGHTED.iter().map(|w| w.0).collect();
    let obj_weights: Vec<u32> = sh.objects.iter().map(|o| o.weight).collect();
    let small: Vec<usize> = sh
        .objects
        .iter()
        .enumerate()
        .filter(|(_, o)| o.family == Family::Obj && o.size <= 65_537)
        .map(|(i, _)| i)
        .collect();
    let cacheable: Vec<usize> = sh
        .objects
        .iter()
        .enumerate()
        .filter(|(_, o)| o.family.cacheable())
        .map(|(i, _)| i)
        .collect();
    let mut stats = ClientStats::default();
    let mut conn: Option<HttpConn> = None;
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        seq += 1;
        let op = Op::WEIGHTED[rng.weighted(&op_weights)].1;
        let idx = match op {
            Op::Miss => small[rng.below(small.len() as u64) as usize],
            Op::Purge => cacheable[rng.below(cacheable.len() as u64) as usize],
            _ => rng.weighted(&obj_weights),
        };
        let obj = &sh.objects[idx];
        let start = Instant::now();
        let (target, verdict) = one_request(&sh, &mut rng, &mut conn, op, obj, seq, tid);
        let end = Instant::now();
        *stats.by_op.entry(op).or_default() += 1;
        sh.requests.fetch_add(1, Ordering::Relaxed);
        match verdict {
            Ok(()) => stats.ok += 1,
            Err(f) => {
                sh.errors.fetch_add(1, Ordering::Relaxed);
                // Back off a little, like a real client: a dead origin answers 502 in
                // microseconds, and a hot loop of them would swamp the counts.
                std::thread::sleep(Duration::from_millis(10));
                if stats.records.len() >= RECORDS_KEPT {
                    stats.dropped += 1;
                    continue;
                }
                stats.records.push(ErrRec {
                    kind: f.kind,
                    op,
                    target,
                    start,
                    end,
                    detail: f.detail,
                    diffs: f.diffs,
                    diffs_complete: f.diffs_complete,
                    zero_fill: f.zero_fill,
                });
            }
        }
    }
    stats
}

// ---------------------------------------------------------------------------------------------
// Faults.

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
enum FaultKind {
    OriginRestart,
    OriginTruncate,
    OriginStall,
    CacheTruncate,
    CacheFlip,
    SighupStorm,
}

impl FaultKind {
    const ALL: [FaultKind; 6] = [
        FaultKind::OriginRestart,
        FaultKind::OriginTruncate,
        FaultKind::OriginStall,
        FaultKind::CacheTruncate,
        FaultKind::CacheFlip,
        FaultKind::SighupStorm,
    ];

    fn label(self) -> &'static str {
        match self {
            FaultKind::OriginRestart => "origin killed + restarted",
            FaultKind::OriginTruncate => "origin truncating / hanging up",
            FaultKind::OriginStall => "origin stalling",
            FaultKind::CacheTruncate => "cache files truncated",
            FaultKind::CacheFlip => "cache body bytes flipped",
            FaultKind::SighupStorm => "SIGHUP storm (10 in 1 s)",
        }
    }
}

struct Window {
    kind: FaultKind,
    start: Instant,
    end: Instant,
}

struct Truncation {
    target: String,
    /// Body bytes left in the file.
    body_len: u64,
    at: Instant,
}

struct Flip {
    target: String,
    pos: u64,
    value: u8,
    at: Instant,
}

/// What an entry file's header says (any `ZCENTRYn` version this soak knows: 4 and 5).
struct EntryInfo {
    target: String,
    body_offset: u64,
    body_len: u64,
}

fn entry_info(f: &std::fs::File) -> Option<EntryInfo> {
    let mut fixed = [0u8; 32];
    f.read_exact_at(&mut fixed, 0).ok()?;
    if &fixed[..7] != b"ZCENTRY" {
        return None;
    }
    let meta_at: u64 = if fixed[7] >= b'5' { 40 } else { 32 };
    let meta_len = u32::from_le_bytes(fixed[8..12].try_into().ok()?) as usize;
    let body_len = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
    let body_offset = u64::from_le_bytes(fixed[24..32].try_into().ok()?);
    if meta_len > 1 << 20 {
        return None;
    }
    let mut meta = vec![0u8; meta_len];
    f.read_exact_at(&mut meta, meta_at).ok()?;
    // The meta block starts with the key text, `GET http://host/target`.
    let key_len = u32::from_le_bytes(meta.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(meta.get(4..4 + key_len)?).ok()?;
    let after_scheme = &key[key.find("://")? + 3..];
    let target = after_scheme[after_scheme.find('/')?..].to_string();
    Some(EntryInfo {
        target,
        body_offset,
        body_len,
    })
}

/// Every entry file under the cache directory (the shard directories), `tmp/` excluded.
fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    let tmp = dir.join("tmp");
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && p != tmp => dirs.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Every entry file in a random order, the catalogue's objects first: a cache-busting miss's
/// entry is never asked for again. (Each file is closed after its header is read: there can be
/// tens of thousands.)
fn cache_candidates(dir: &Path, rng: &mut Rng) -> Vec<PathBuf> {
    let mut files = cache_files(dir);
    rng.shuffle(&mut files);
    let mut candidates: Vec<(PathBuf, bool)> = files
        .into_iter()
        .filter_map(|path| {
            let f = std::fs::File::open(&path).ok()?;
            let query = entry_info(&f)?.target.contains('?');
            Some((path, query))
        })
        .collect();
    candidates.sort_by_key(|(_, query)| *query);
    candidates.into_iter().map(|(p, _)| p).collect()
}

/// Truncates (`flip` false) or flips a body byte of up to 3 of `candidates`; returns what was
/// done, one description per file.
fn damage_cache(
    candidates: Vec<PathBuf>,
    rng: &mut Rng,
    flip: bool,
    flips: &Mutex<Vec<Flip>>,
    truncated: &Mutex<Vec<Truncation>>,
) -> Vec<String> {
    let mut done = Vec::new();
    for path in candidates {
        if done.len() >= 3 {
            break;
        }
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        // Read again from this very file: the entry may have been replaced meanwhile.
        let Some(info) = entry_info(&f) else { continue };
        if flip {
            if info.body_len == 0 {
                continue;
            }
            let pos = rng.below(info.body_len);
            let mut b = [0u8; 1];
            if f.read_exact_at(&mut b, info.body_offset + pos).is_err() {
                continue;
            }
            let value = b[0] ^ 0xA5;
            if f.write_all_at(&[value], info.body_offset + pos).is_err() {
                continue;
            }
            flips.lock().expect("flips").push(Flip {
                target: info.target.clone(),
                pos,
                value,
                at: Instant::now(),
            });
            done.push(format!(
                "{} byte {pos} of {} flipped",
                info.target, info.body_len
            ));
        } else {
            let end = info.body_offset + info.body_len;
            // Mostly inside the body; sometimes into the header.
            let new_len = if info.body_len == 0 || rng.below(4) == 0 {
                rng.below(info.body_offset.max(1))
            } else {
                info.body_offset + rng.below(info.body_len)
            };
            if f.set_len(new_len).is_err() {
                continue;
            }
            truncated.lock().expect("truncated").push(Truncation {
                target: info.target.clone(),
                body_len: new_len.saturating_sub(info.body_offset),
                at: Instant::now(),
            });
            done.push(format!(
                "{} truncated from {end} to {new_len} bytes",
                info.target
            ));
        }
    }
    done
}

// ---------------------------------------------------------------------------------------------
// The proxy process.

struct Proxy {
    child: Child,
}

impl Proxy {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, then SIGKILL after 10 s; the exit status.
    fn stop(&mut self) -> String {
        if let Ok(Some(s)) = self.child.try_wait() {
            return format!("had exited ({s})");
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return format!("exited on SIGTERM ({s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        "did not exit within 10 s of SIGTERM: killed".into()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// (VmRSS in KiB, open fds) of `pid`.
fn sample(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening ({status})");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The soak.

pub fn soak(opts: Options) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (profile, bin) = if opts.release {
        (vec!["--release"], root().join("target/release/zerocache"))
    } else {
        (vec![], root().join("target/debug/zerocache"))
    };
    run(Command::new(&cargo)
        .args(["build", "-p", "zerocache"])
        .args(&profile))?;
    // SAFETY: geteuid has no preconditions.
    let probe = opts.probe && unsafe { libc::geteuid() } == 0;
    if opts.probe && !probe {
        println!("xtask: soak: --probe needs root; running with the probe disabled");
    }
    let clients = opts.clients.max(1);
    let dir = std::env::temp_dir().join(format!("zerocache-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let cache_dir = dir.join("cache");

    let objects = Arc::new(catalogue());
    let mut bodies = Bodies::new();
    for o in objects.iter() {
        bodies
            .entry(o.size)
            .or_insert_with(|| zerocache_origin::body(o.size));
    }
    let bodies = Arc::new(bodies);

    let origin_addr = format!("127.0.0.1:{}", free_port()?);
    let mut origin = OriginCtl {
        addr: origin_addr.clone(),
        objects: objects.clone(),
        bodies: bodies.clone(),
        running: None,
    };
    origin.start()?;

    let port = free_port()?;
    let dport = free_port()?;
    let config = dir.join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "# Written by `cargo xtask soak`.\nlisten: 127.0.0.1:{port}\ncache:\n  path: {}\n  max_size: 1GiB\nupstreams:\n  origin:\n    servers: [\"{origin_addr}\"]\n    connect_timeout: 1s\n    read_timeout: {UPSTREAM_READ_TIMEOUT_S}s\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: {probe}\nlogging:\n  level: warn\n",
            cache_dir.display()
        ),
    )?;
    let log_path = dir.join("zerocache.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut proxy = Proxy { child };
    let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let dashboard: SocketAddr = format!("127.0.0.1:{dport}").parse()?;
    wait_listening(proxy_addr, &mut proxy.child, "zerocache")
        .with_context(|| format!("see {}", log_path.display()))?;
    wait_listening(dashboard, &mut proxy.child, "zerocache's dashboard")?;
    let pid = proxy.pid();
    let (rss_start, fds_start) = sample(pid).unwrap_or((0, 0));
    println!(
        "xtask: soak: {} s, {clients} clients, seed {}, probe {}, {} build; proxy {proxy_addr} (pid {pid}), origin {origin_addr}, dashboard {dashboard}, dir {}",
        opts.duration,
        opts.seed,
        if probe { "on" } else { "off" },
        if opts.release { "release" } else { "debug" },
        dir.display()
    );

    let shared = Arc::new(Shared {
        objects: objects.clone(),
        bodies: bodies.clone(),
        proxy: proxy_addr,
        dashboard,
        stop: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let peak = Arc::new((AtomicU64::new(rss_start), AtomicU64::new(fds_start)));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), sampler_stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((rss, fds)) = sample(pid) {
                    peak.0.fetch_max(rss, Ordering::Relaxed);
                    peak.1.fetch_max(fds, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let t0 = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|tid| {
            let sh = shared.clone();
            let seed = opts.seed;
            std::thread::Builder::new()
                .name(format!("soak-client-{tid}"))
                .spawn(move || client(sh, tid, seed))
        })
        .collect::<Result<_, _>>()?;

    // The fault schedule: one at a time, the kinds in a seeded order, none in the last seconds
    // (so the run ends with a clean stretch that must be error-free).
    let duration = Duration::from_secs(opts.duration);
    let spacing = Duration::from_secs_f64(((opts.duration as f64 - 7.0) / 6.0).clamp(2.5, 4.0));
    let last_start = duration.saturating_sub(Duration::from_secs(5));
    let mut rng = Rng::new(opts.seed ^ 0xFA17);
    let mut order: Vec<FaultKind> = Vec::new();
    let mut windows: Vec<Window> = Vec::new();
    let flips = Mutex::new(Vec::<Flip>::new());
    let truncated = Mutex::new(Vec::<Truncation>::new());
    let mut fault_files: BTreeMap<FaultKind, usize> = BTreeMap::new();
    let mut next = Duration::from_secs(2);
    let mut next_report = Duration::from_secs(10);
    let mut died: Option<String> = None;
    let at = |t: Instant| t.duration_since(t0).as_secs_f64();
    while t0.elapsed() < duration {
        if let Ok(Some(s)) = proxy.child.try_wait() {
            died = Some(format!(
                "the proxy died at t={:.1}s ({s})",
                at(Instant::now())
            ));
            println!("xtask: soak: {}", died.as_deref().unwrap_or(""));
            break;
        }
        if t0.elapsed() >= next_report {
            println!(
                "xtask: soak: t={:5.1}s  {} requests, {} errors so far",
                at(Instant::now()),
                shared.requests.load(Ordering::Relaxed),
                shared.errors.load(Ordering::Relaxed)
            );
            next_report += Duration::from_secs(10);
        }
        if t0.elapsed() < next || t0.elapsed() > last_start {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        if order.is_empty() {
            order = FaultKind::ALL.to_vec();
            rng.shuffle(&mut order);
            order.reverse();
        }
        let Some(kind) = order.pop() else { continue };
        // (Reading every cache file's header takes a while: before the fault's clock starts.)
        let candidates = match kind {
            FaultKind::CacheTruncate | FaultKind::CacheFlip => {
                cache_candidates(&cache_dir, &mut rng)
            }
            _ => Vec::new(),
        };
        let start = Instant::now();
        let (desc, grace) = match kind {
            FaultKind::OriginRestart => {
                origin.kill();
                std::thread::sleep(Duration::from_secs(1));
                origin.start()?;
                (
                    format!(
                        "origin killed, down {:.1} s, restarted",
                        start.elapsed().as_secs_f64()
                    ),
                    Duration::from_secs(2),
                )
            }
            FaultKind::OriginTruncate => {
                origin.script(OriginMode::Truncating);
                std::thread::sleep(Duration::from_millis(1500));
                origin.script(OriginMode::Normal);
                (
                    "origin truncating /fl/* and /fn/* at half their length (and hanging up on /fn/1000) for 1.5 s".into(),
                    Duration::from_secs(2),
                )
            }
            FaultKind::OriginStall => {
                origin.script(OriginMode::Stalling);
                std::thread::sleep(Duration::from_millis(1500));
                origin.script(OriginMode::Normal);
                (
                    format!(
                        "origin stalling /fl/* and /fn/* for 1.5 s (4 s before the head, or 1 s / 4 s mid-body; proxy read_timeout {UPSTREAM_READ_TIMEOUT_S} s)"
                    ),
                    Duration::from_secs(5),
                )
            }
            FaultKind::CacheTruncate | FaultKind::CacheFlip => {
                let flip = kind == FaultKind::CacheFlip;
                let done = damage_cache(candidates, &mut rng, flip, &flips, &truncated);
                *fault_files.entry(kind).or_default() += done.len();
                let what = if flip { "flipped" } else { "truncated" };
                (
                    if done.is_empty() {
                        format!("cache files {what}: none to damage")
                    } else {
                        format!("cache files {what}: {}", done.join("; "))
                    },
                    Duration::from_secs(1),
                )
            }
            FaultKind::SighupStorm => {
                for _ in 0..10 {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid, libc::SIGHUP) };
                    std::thread::sleep(Duration::from_millis(100));
                }
                (
                    "10 SIGHUPs to the proxy in 1 s".into(),
                    Duration::from_secs(1),
                )
            }
        };
        let end = Instant::now() + grace;
        println!("xtask: soak: t={:5.1}s  fault: {desc}", at(start));
        windows.push(Window { kind, start, end });
        next = start.duration_since(t0) + spacing;
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut stats = Vec::new();
    for t in threads {
        stats.push(
            t.join()
                .map_err(|_| anyhow::anyhow!("a soak client thread panicked"))?,
        );
    }
    let traffic_end = Instant::now();
    if died.is_none()
        && let Ok(Some(s)) = proxy.child.try_wait()
    {
        died = Some(format!("the proxy died at t={:.1}s ({s})", at(traffic_end)));
    }

    // The end state: everything purged, 2 s idle.
    let mut end_note = String::new();
    let (mut rss_end, mut fds_end, mut files_left) = (0, 0, 0);
    if died.is_none() {
        match purge(dashboard, "prefix", &format!("http://{HOST}/")) {
            Ok(text) => end_note = format!("purge-all answered {}", text.trim()),
            Err(f) => end_note = format!("purge-all FAILED: {}", f.detail),
        }
        std::thread::sleep(Duration::from_secs(2));
        (rss_end, fds_end) = sample(pid).unwrap_or((0, 0));
        files_left = cache_files(&cache_dir).len();
    }
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let exit = proxy.stop();
    origin.kill();
    if died.is_none() && !exit.starts_with("exited on SIGTERM") {
        died = Some(format!("the proxy {exit}"));
    }

    // Classification.
    let flips = flips.into_inner().expect("flips");
    let truncated = truncated.into_inner().expect("truncated");
    // The fault a request overlapped: the latest one that began before it ended.
    let window_of = |s: Instant, e: Instant| {
        windows
            .iter()
            .rev()
            .find(|w| s <= w.end && e >= w.start)
            .map(|w| w.kind)
    };
    let mut by_op: BTreeMap<Op, u64> = BTreeMap::new();
    let (mut ok, mut dropped) = (0u64, 0u64);
    let mut expected: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut unexpected: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let mut in_fault: BTreeMap<FaultKind, u64> = BTreeMap::new();
    let mut explained_trunc = 0u64;
    let mut zero_after_truncation = 0u64;
    let (mut flipped_served, mut flipped_last) = (0u64, 0f64);
    let mut corrupt: Vec<&ErrRec> = Vec::new();
    let mut bad: Vec<&ErrRec> = Vec::new();
    for s in &stats {
        for (op, n) in &s.by_op {
            *by_op.entry(*op).or_default() += n;
        }
        ok += s.ok;
        dropped += s.dropped;
    }
    for r in stats.iter().flat_map(|s| s.records.iter()) {
        if r.kind == Kind::Corrupt {
            let flip_of = |p: u64, v: u8| {
                flips
                    .iter()
                    .find(|f| f.target == r.target && f.pos == p && f.value == v && f.at <= r.end)
            };
            let explained = r.diffs_complete
                && !r.diffs.is_empty()
                && r.diffs.iter().all(|(p, v)| flip_of(*p, *v).is_some());
            if explained {
                flipped_served += 1;
                for (p, v) in &r.diffs {
                    if let Some(f) = flip_of(*p, *v) {
                        flipped_last = flipped_last.max(r.end.duration_since(f.at).as_secs_f64());
                    }
                }
            } else if r.zero_fill.is_some_and(|first| {
                truncated
                    .iter()
                    .any(|t| t.target == r.target && t.body_len == first && t.at <= r.end)
            }) {
                // The tail of a file this soak truncated underneath while its pages were in
                // flight: explained, like a flip (see the module documentation).
                zero_after_truncation += 1;
            } else {
                corrupt.push(r);
            }
            continue;
        }
        if r.kind == Kind::Status {
            let code = r.detail.split_whitespace().nth(1).unwrap_or("?");
            let code = if r.op == Op::Purge || r.detail.starts_with("304 to") {
                r.detail.split(':').next().unwrap_or("?")
            } else {
                code
            };
            *statuses.entry(code.to_string()).or_default() += 1;
        }
        let fault = window_of(r.start, r.end);
        let by_truncation = matches!(r.kind, Kind::CutShort | Kind::Closed)
            && truncated
                .iter()
                .any(|t| t.target == r.target && t.at <= r.end);
        if let Some(k) = fault {
            *in_fault.entry(k).or_default() += 1;
        }
        if fault.is_some() || by_truncation {
            if fault.is_none() {
                explained_trunc += 1;
            }
            *expected.entry(r.kind).or_default() += 1;
        } else {
            *unexpected.entry(r.kind).or_default() += 1;
            bad.push(r);
        }
    }
    // Every error, for the kept directory.
    let mut all = String::new();
    let mut sorted: Vec<&ErrRec> = stats.iter().flat_map(|s| s.records.iter()).collect();
    sorted.sort_by_key(|r| r.start);
    for r in sorted {
        let _ = writeln!(
            all,
            "t={:.3}s..{:.3}s {:?} {} {} [{}]: {}",
            at(r.start),
            at(r.end),
            window_of(r.start, r.end),
            r.kind.label(),
            r.op.name(),
            r.target,
            r.detail
        );
    }
    let _ = std::fs::write(dir.join("errors.txt"), all);
    let requests: u64 = by_op.values().sum();
    let errors_total: u64 = requests - ok;
    let unexpected_total: u64 = unexpected.values().sum::<u64>() + dropped;
    let mut faults_by_kind: BTreeMap<FaultKind, u64> = BTreeMap::new();
    for w in &windows {
        *faults_by_kind.entry(w.kind).or_default() += 1;
    }

    // The table.
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let mut t = String::new();
    let line =
        "+------------------------------------------+------------+---------------+------------+\n";
    let row = |t: &mut String, a: &str, b: String, c: String, d: String| {
        let _ = writeln!(t, "| {a:<40} | {b:>10} | {c:>13} | {d:>10} |");
    };
    t.push_str(line);
    row(
        &mut t,
        &format!(
            "zerocache soak: {} s, {clients} clients, seed {}",
            opts.duration, opts.seed
        ),
        "total".into(),
        "during faults".into(),
        "unexpected".into(),
    );
    t.push_str(line);
    row(
        &mut t,
        "requests",
        requests.to_string(),
        String::new(),
        String::new(),
    );
    for (op, n) in &by_op {
        row(
            &mut t,
            &format!("  {}", op.name()),
            n.to_string(),
            String::new(),
            String::new(),
        );
    }
    row(&mut t, "ok", ok.to_string(), String::new(), String::new());
    row(
        &mut t,
        "errors",
        errors_total.to_string(),
        expected.values().sum::<u64>().to_string(),
        unexpected_total.to_string(),
    );
    for k in Kind::ERRORS {
        let (e, u) = (
            expected.get(&k).copied().unwrap_or(0),
            unexpected.get(&k).copied().unwrap_or(0),
        );
        row(
            &mut t,
            &format!("  {}", k.label()),
            (e + u).to_string(),
            e.to_string(),
            u.to_string(),
        );
    }
    if !statuses.is_empty() {
        let s: Vec<String> = statuses.iter().map(|(c, n)| format!("{c} x{n}")).collect();
        row(
            &mut t,
            &format!("    statuses: {}", s.join(", ")),
            String::new(),
            String::new(),
            String::new(),
        );
    }
    if explained_trunc > 0 {
        row(
            &mut t,
            "  (cut short: cache file truncated before)",
            explained_trunc.to_string(),
            String::new(),
            String::new(),
        );
    }
    if dropped > 0 {
        row(
            &mut t,
            "  (not recorded: too many)",
            dropped.to_string(),
            String::new(),
            dropped.to_string(),
        );
    }
    row(
        &mut t,
        "CORRUPT bodies (not an injected flip or truncation)",
        corrupt.len().to_string(),
        String::new(),
        corrupt.len().to_string(),
    );
    if zero_after_truncation > 0 {
        row(
            &mut t,
            "injected truncation served as zeros (in flight)",
            zero_after_truncation.to_string(),
            String::new(),
            zero_after_truncation.to_string(),
        );
    }
    row(
        &mut t,
        "stale-corrupt: injected flip served",
        flipped_served.to_string(),
        String::new(),
        String::new(),
    );
    if flipped_served > 0 {
        row(
            &mut t,
            "  last one, seconds after its flip",
            format!("{flipped_last:.1}"),
            String::new(),
            String::new(),
        );
    }
    t.push_str(line);
    row(
        &mut t,
        "faults injected",
        windows.len().to_string(),
        "errors in them".into(),
        String::new(),
    );
    for k in FaultKind::ALL {
        let n = faults_by_kind.get(&k).copied().unwrap_or(0);
        let files = fault_files
            .get(&k)
            .map(|f| format!(" ({f} files)"))
            .unwrap_or_default();
        row(
            &mut t,
            &format!("  {}{files}", k.label()),
            n.to_string(),
            in_fault.get(&k).copied().unwrap_or(0).to_string(),
            String::new(),
        );
    }
    t.push_str(line);
    row(&mut t, "proxy", "start".into(), "peak".into(), "end".into());
    row(
        &mut t,
        "  RSS",
        mib(rss_start),
        mib(peak.0.load(Ordering::Relaxed).max(rss_end)),
        mib(rss_end),
    );
    row(
        &mut t,
        "  open fds",
        fds_start.to_string(),
        peak.1.load(Ordering::Relaxed).max(fds_end).to_string(),
        fds_end.to_string(),
    );
    row(
        &mut t,
        "  cache files left after purge-all",
        String::new(),
        String::new(),
        files_left.to_string(),
    );
    let alive = died.clone().unwrap_or_else(|| format!("alive; {exit}"));
    let mut failures = Vec::new();
    if !corrupt.is_empty() {
        failures.push(format!("{} corrupt bodies", corrupt.len()));
    }
    if unexpected_total > 0 {
        failures.push(format!(
            "{unexpected_total} unexpected errors outside fault windows"
        ));
    }
    if let Some(d) = &died {
        failures.push(d.clone());
    }
    if end_note.contains("FAILED") {
        failures.push(end_note.clone());
    }
    let verdict = if failures.is_empty() {
        "PASS".to_string()
    } else {
        "FAIL".to_string()
    };
    row(&mut t, "verdict", verdict, String::new(), String::new());
    t.push_str(line);
    println!();
    print!("{t}");
    println!("  proxy: {alive}; {end_note}");
    let mut per_second: BTreeMap<u64, u64> = BTreeMap::new();
    for r in stats.iter().flat_map(|s| s.records.iter()) {
        *per_second
            .entry(r.end.duration_since(t0).as_secs())
            .or_default() += 1;
    }
    if !per_second.is_empty() {
        let s: Vec<String> = per_second
            .iter()
            .map(|(t, n)| format!("{t}s:{n}"))
            .collect();
        println!(
            "  errors (flipped bodies included) by second of the run: {}",
            s.join(" ")
        );
    }
    for r in corrupt.iter().chain(bad.iter()).take(12) {
        println!(
            "  {} t={:.2}s..{:.2}s {} {}: {}",
            r.kind.label(),
            at(r.start),
            at(r.end),
            r.op.name(),
            r.target,
            r.detail
        );
    }
    if failures.is_empty() {
        if std::env::var_os("XTASK_SOAK_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    } else {
        bail!(
            "soak failed: {} (seed {}; config, cache and proxy log kept in {})",
            failures.join("; "),
            opts.seed,
            dir.display()
        )
    }
}

//! The client threads: a weighted mix of requests, each checked byte for byte against the
//! origin, and the verdict on each failure (expected inside a fault window, or not).

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub(crate) enum Op {
    Get,
    Head,
    Range,
    IfNoneMatch,
    IfNoneMatchWrong,
    Miss,
    Purge,
}

impl Op {
    pub(crate) const WEIGHTED: [(u32, Op); 7] = [
        (40, Op::Get),
        (8, Op::Head),
        (20, Op::Range),
        (8, Op::IfNoneMatch),
        (6, Op::IfNoneMatchWrong),
        (8, Op::Miss),
        (1, Op::Purge),
    ];

    pub(crate) fn name(self) -> &'static str {
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
pub(crate) enum Kind {
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
    pub(crate) const ERRORS: [Kind; 7] = [
        Kind::Status,
        Kind::Header,
        Kind::Closed,
        Kind::CutShort,
        Kind::Timeout,
        Kind::Connect,
        Kind::Protocol,
    ];

    pub(crate) fn label(self) -> &'static str {
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

pub(crate) struct Failure {
    pub(crate) kind: Kind,
    pub(crate) detail: String,
    /// For a wrong body: (absolute body position, byte received), at most 16.
    pub(crate) diffs: Vec<(u64, u8)>,
    /// `diffs` holds every difference (same length, at most 16 of them).
    pub(crate) diffs_complete: bool,
    /// Every wrong byte is a zero: the first wrong position.
    pub(crate) zero_fill: Option<u64>,
}

impl Failure {
    pub(crate) fn new(kind: Kind, detail: String) -> Failure {
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
pub(crate) fn check_bytes(
    expected: &[u8],
    got: &[u8],
    base: u64,
    complete: bool,
) -> Result<(), Failure> {
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

pub(crate) fn expect_full(r: &Response, expected: &[u8]) -> Result<(), Failure> {
    if r.status != 200 {
        return Err(Failure::new(Kind::Status, format!("status {}", r.status)));
    }
    check_bytes(expected, &r.body, 0, true)
}

pub(crate) struct Shared {
    pub(crate) objects: Arc<Vec<Object>>,
    pub(crate) bodies: Arc<Bodies>,
    pub(crate) proxy: SocketAddr,
    pub(crate) dashboard: SocketAddr,
    pub(crate) stop: AtomicBool,
    pub(crate) requests: AtomicU64,
    pub(crate) errors: AtomicU64,
}

pub(crate) struct ErrRec {
    pub(crate) kind: Kind,
    pub(crate) op: Op,
    pub(crate) target: String,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    pub(crate) detail: String,
    pub(crate) diffs: Vec<(u64, u8)>,
    pub(crate) diffs_complete: bool,
    pub(crate) zero_fill: Option<u64>,
}

#[derive(Default)]
pub(crate) struct ClientStats {
    pub(crate) by_op: BTreeMap<Op, u64>,
    pub(crate) ok: u64,
    pub(crate) records: Vec<ErrRec>,
    /// Errors beyond [`RECORDS_KEPT`] (counted as unexpected).
    pub(crate) dropped: u64,
}

/// One purge through the dashboard API.
pub(crate) fn purge(dashboard: SocketAddr, field: &str, url: &str) -> Result<String, Failure> {
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

pub(crate) fn io_failure(e: IoFail) -> Failure {
    match e {
        IoFail::BeforeHead(s) => Failure::new(Kind::Closed, s),
        IoFail::MidBody(s, _, _) => Failure::new(Kind::CutShort, s),
        IoFail::Timeout(s) => Failure::new(Kind::Timeout, s),
        IoFail::Protocol(s) => Failure::new(Kind::Protocol, s),
    }
}

/// One request of `op` on `obj`: the target it named and its verdict.
/// A client thread's connection: HTTP/1.1 or HTTP/2.
pub(crate) enum ClientConn {
    H1(HttpConn),
    H2(super::h2::H2Conn),
}

impl ClientConn {
    fn exchange(&mut self, req: &[u8], head_only: bool) -> Result<Response, IoFail> {
        match self {
            ClientConn::H1(c) => c.exchange(req, head_only),
            ClientConn::H2(c) => c.exchange(req, head_only),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn one_request(
    sh: &Shared,
    h2: bool,
    rng: &mut Rng,
    conn: &mut Option<ClientConn>,
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
        let connected = if h2 {
            super::h2::H2Conn::connect(sh.proxy).map(ClientConn::H2)
        } else {
            HttpConn::connect(sh.proxy).map(ClientConn::H1)
        };
        match connected {
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

pub(crate) fn client(sh: Arc<Shared>, tid: usize, seed: u64) -> ClientStats {
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
    let mut conn: Option<ClientConn> = None;
    let h2 = tid % 2 == 1;
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
        let (target, verdict) = one_request(&sh, h2, &mut rng, &mut conn, op, obj, seq, tid);
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

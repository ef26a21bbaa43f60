//! The axum app and its background tasks: joining the probe's closed-fd records with the proxy's
//! connections, and sampling the counters once a second for the charts.

use crate::guard::{self, HostPolicy};
use crate::history::{History, Sample};
use crate::{api, metrics};
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use zerocache_ledger::{Accounting, CacheStatus, SortKey};
use zerocache_ops::Purge;
use zerocache_probe::Probe;

/// The data-plane worker threads, as `/metrics` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Open client connections per worker, by worker number.
    pub connections: Vec<u64>,
    /// Whether each worker is pinned to a CPU right now, by worker number.
    pub pinned: Vec<bool>,
    /// Times a pinned worker was unpinned because it kept waiting for its CPU.
    pub unpins: u64,
}

/// Everything the dashboard reads.
pub struct DashboardState {
    /// The proxy's accounting.
    pub accounting: Arc<Accounting>,
    /// The probe.
    pub probe: Probe,
    /// The cache's current figures.
    pub cache: Box<dyn Fn() -> CacheStats + Send + Sync>,
    /// Upstream names (metric labels initialised at 0).
    pub upstreams: Vec<String>,
    /// Every configured server of every upstream group, `(group, server, up)`: up while the
    /// balancer may pick it (not marked down by failures or by the health check).
    pub upstream_servers: Box<dyn Fn() -> Vec<(String, String, bool)> + Send + Sync>,
    /// The data-plane worker threads' figures.
    pub workers: Box<dyn Fn() -> WorkerStats + Send + Sync>,
    /// Per-second samples.
    pub history: Mutex<History>,
    /// Bearer token required for the page and the API (and `/metrics` if
    /// `metrics_require_token`); `None`: no authentication (loopback). A blank one is refused:
    /// pass the config's through [`guard::check_token`].
    pub token: Option<String>,
    /// Extra names (`name` or `name:port`) the dashboard answers to besides its listen address
    /// (and, on loopback, `localhost`): `dashboard.allowed_hosts`. See [`guard`].
    pub allowed_hosts: Vec<String>,
    /// Whether `/metrics` needs the token too.
    pub metrics_require_token: bool,
    /// Removes cached entries; answers how many went.
    pub purge: PurgeFn,
    /// Whether the proxy is serving (`Ok`, with a note when it serves degraded: the cache not
    /// storing) or why not (`Err`: draining), for `/healthz`. A node that serves every response
    /// correctly answers 200: a load balancer must not pull it for a full disk.
    pub health: Box<dyn Fn() -> Result<Option<String>, String> + Send + Sync>,
    /// Access log lines dropped because the writer fell behind (0 without an access log).
    pub access_log_dropped: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The test hook behind `POST /api/debug/clock`; `None` (the route answers 404) unless
    /// `debug.adjustable_clock` is on: see [`crate::clock`].
    pub advance_clock: Option<crate::clock::AdvanceClockFn>,
    /// The fleet this node is a member of, if any (`/api/fleet`, fleet purges and metrics).
    pub fleet: Option<crate::fleet::FleetHooks>,
}

/// The proxy's purge: removes what a [`Purge`] names and answers how many entries went.
pub type PurgeFn = Box<dyn Fn(&Purge) -> Result<usize, String> + Send + Sync>;

/// The body of `POST /api/purge`: exactly one of `url` and `prefix`.
#[derive(Deserialize)]
struct PurgeBody {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    /// Cache tags: every response with any of them (`Surrogate-Key`, `Cache-Tag`).
    #[serde(default)]
    tags: Option<Vec<String>>,
    /// Purge on every fleet peer as well (`crate::fleet`).
    #[serde(default)]
    fleet: bool,
    /// Mark stale instead of removing (see `zerocache_ops::Purge::soft`).
    #[serde(default)]
    soft: bool,
}

/// The disk cache as the dashboard shows it.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CacheStats {
    /// Bytes of cache files on disk.
    pub size_bytes: u64,
    /// Entries.
    pub objects: u64,
    /// Writes that failed (disk full, permissions); the cache serves pass-through meanwhile.
    pub write_errors: u64,
    /// False while writes fail.
    pub writable: bool,
    /// Files held open by the open-file cache.
    pub open_files: u64,
    /// Entries evicted to make room, since start.
    pub evictions: u64,
    /// Entry heads read from their files (entries not kept whole), since start.
    pub head_reads: u64,
    /// Whether the index is still loading in the background.
    pub index_loading: bool,
    /// Entries the background load has indexed.
    pub index_loaded_entries: u64,
    /// `cache.max_size`.
    pub max_size_bytes: u64,
    /// Objects stored in slices (`routes[].slice`), at least one slice of each.
    pub sliced_objects: u64,
    /// Of those, objects known to miss a slice: cached in part.
    pub sliced_objects_partial: u64,
    /// Slices stored, in all (among `objects`).
    pub slices: u64,
}

static INDEX: &str = include_str!("../assets/index.html");
static UPLOT_JS: &str = include_str!("../assets/vendor/uplot/uPlot.iife.min.js");
static UPLOT_CSS: &str = include_str!("../assets/vendor/uplot/uPlot.min.css");

/// Starts the background tasks and serves the app on `listener` until the task is dropped, or
/// until `stop` completes (a SIGUSR2 upgrade's successor took the socket over: this process
/// stops accepting, and requests in flight finish).
///
/// Every request first passes the [`guard`] checks (Host; and for anything but GET and HEAD,
/// `Origin` and `Content-Type`), then the token. Fails at once, serving nothing, if `state.token`
/// is set but blank.
pub async fn serve(
    listener: TcpListener,
    state: Arc<DashboardState>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    guard::check_token(state.token.clone())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let (policy, invalid) = HostPolicy::new(listener.local_addr()?, &state.allowed_hosts);
    for entry in invalid {
        tracing::warn!(
            entry,
            "dashboard.allowed_hosts: not a host name or address (name or name:port); ignored"
        );
    }
    spawn_joiner(state.clone());
    spawn_sampler(state.clone());
    let metrics = Router::new().route("/metrics", get(metrics_handler));
    let metrics = if state.metrics_require_token {
        metrics.layer(middleware::from_fn_with_state(state.clone(), auth))
    } else {
        metrics
    };
    // The clock hook exists only when the proxy handed over a clock: otherwise every method
    // gets the router's 404, not a 405 that says a POST route is there.
    let debug = if state.advance_clock.is_some() {
        Router::new().route(
            "/api/debug/clock",
            axum::routing::post(crate::clock::advance),
        )
    } else {
        Router::new()
    };
    let app = Router::new()
        .route("/", get(index))
        .route("/assets/uplot.js", get(uplot_js))
        .route("/assets/uplot.css", get(uplot_css))
        .route("/api/stats", get(stats))
        .route("/api/probe", get(probe_report))
        .route("/api/connections", get(connections))
        .route("/api/processes", get(processes))
        .route("/api/purge", axum::routing::post(purge))
        .merge(debug)
        .route("/api/fleet", get(crate::fleet::api))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .merge(metrics)
        // No token, and let through by `edge` whatever the Host: see [`HEALTHZ`].
        .merge(Router::new().route(HEALTHZ, get(healthz)))
        .layer(middleware::from_fn_with_state(Arc::new(policy), edge))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// The health check's path. It needs no token and answers any `Host`: load balancers and
/// Kubernetes probes ask by address, without credentials, and the answer reveals nothing but up
/// or down (a DNS-rebinding page learns no more than a port scan would).
const HEALTHZ: &str = "/healthz";

/// `GET /healthz`: 200 `ok` while serving; 503 and a one-line reason while draining or while the
/// cache cannot be written.
async fn healthz(State(state): State<Arc<DashboardState>>) -> Response {
    let (status, body) = match (state.health)() {
        Ok(None) => (StatusCode::OK, "ok\n".to_string()),
        Ok(Some(note)) => (StatusCode::OK, format!("ok; {note}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    };
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The checks at the edge, before authentication and before any handler: the request must be
/// made to one of the dashboard's own names (else 421), and a state-changing one must come from
/// no other origin (else 403) with a JSON body (else 415). See [`guard`].
async fn edge(State(policy): State<Arc<HostPolicy>>, req: Request, next: Next) -> Response {
    if req.uri().path() == HEALTHZ && req.method() == axum::http::Method::GET {
        return next.run(req).await;
    }
    let host = match guard::check_host(&policy, &req) {
        Ok(host) => host,
        Err(refused) => return refused.into_response(),
    };
    if guard::is_state_changing(req.method())
        && let Err(refused) = guard::check_write(req.headers(), host)
    {
        return refused.into_response();
    }
    next.run(req).await
}

/// Bearer-token check: `Authorization: Bearer T`, or `?token=T` so a browser can open the page
/// (the page then sends the header on its API calls). The comparison takes time that depends only
/// on the token's length, and an empty or blank bearer never passes.
async fn auth(State(state): State<Arc<DashboardState>>, req: Request, next: Next) -> Response {
    guard::token::require(state.token.as_deref(), req, next).await
}

async fn uplot_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript")], UPLOT_JS).into_response()
}

async fn uplot_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css")], UPLOT_CSS).into_response()
}

/// Feeds the probe's records of this process's accepted sockets to the accounting.
fn spawn_joiner(state: Arc<DashboardState>) {
    let mut rx = state.probe.subscribe_closed();
    let me = std::process::id();
    let acc = state.accounting.clone();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(r) if r.pid == me && r.accepted => acc.kernel_closed(&r),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(lost = n, "dashboard fell behind the probe's close events");
                }
                Err(_) => return,
            }
        }
    });
}

fn spawn_sampler(state: Arc<DashboardState>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            state.accounting.expire_awaiting();
            let s = sample(&state);
            state.history.lock().push(s);
        }
    });
}

fn sample(state: &DashboardState) -> Sample {
    let acc = &state.accounting;
    let snap = state.probe.snapshot();
    let bytes_by_kind = snap
        .processes
        .iter()
        .find(|p| p.pid == std::process::id())
        .map(|p| p.socket.by_kind.iter().map(|k| k.bytes).collect())
        .unwrap_or_else(|| vec![0; zerocache_probe::kind::COUNT]);
    let body = acc.body_totals_with_live(&api::live(state));
    Sample {
        t: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        requests: CacheStatus::ALL.iter().map(|c| acc.requests(*c)).collect(),
        bytes_by_kind,
        body_zerocopy: body.zerocopy_bytes,
        // Only bytes meant for sendfile count against the ratio (see `BodyTotals::ratio`).
        body_copy: body.copy_bytes.saturating_sub(body.intended_copy_bytes),
        violations: acc.violations(),
    }
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

async fn metrics_handler(State(state): State<Arc<DashboardState>>) -> Response {
    metrics::exposition(metrics::render(&state))
}

#[derive(Deserialize)]
struct StatsQuery {
    #[serde(default)]
    history: Option<bool>,
}

async fn probe_report(
    State(state): State<Arc<DashboardState>>,
) -> Json<crate::probe_state::ProbeReport> {
    Json(crate::probe_state::report(&state.probe))
}

async fn stats(
    State(state): State<Arc<DashboardState>>,
    Query(q): Query<StatsQuery>,
) -> Json<api::Stats> {
    Json(api::stats(&state, q.history.unwrap_or(true)))
}

#[derive(Deserialize)]
struct ConnQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    sort: Option<String>,
    #[serde(default)]
    order: Option<String>,
}

async fn connections(
    State(state): State<Arc<DashboardState>>,
    Query(q): Query<ConnQuery>,
) -> Json<api::Connections> {
    Json(api::connections(
        &state,
        q.offset.unwrap_or(0),
        q.limit.unwrap_or(100).min(1000),
        // An unknown order is not an error worth a 400 on a dashboard: newest first.
        q.sort
            .as_deref()
            .and_then(SortKey::from_name)
            .unwrap_or(SortKey::Id),
        q.order.as_deref() == Some("asc"),
    ))
}

/// `POST /api/purge` with `{"url": "http://host/path"}`, `{"prefix": "http://host/dir/"}` or
/// `{"tags": ["product:42", ...]}` (every response with any of them), and `"soft": true` to mark
/// stale instead of removing:
/// the entries are gone from the index before the answer, so no request that arrives after it is
/// served them; transfers already running finish from their open files. Like every
/// state-changing request it needs `Content-Type: application/json` and no foreign `Origin`
/// ([`edge`]). With `"fleet": true` the purge is also sent to every fleet peer, and the answer
/// says per peer what happened (see `crate::fleet`).
async fn purge(State(state): State<Arc<DashboardState>>, body: axum::body::Bytes) -> Response {
    let parsed: Result<PurgeBody, _> = serde_json::from_slice(&body);
    let fleet = parsed.as_ref().is_ok_and(|b| b.fleet);
    let soft = parsed.as_ref().is_ok_and(|b| b.soft);
    let target = match parsed {
        Ok(PurgeBody {
            url: Some(u),
            prefix: None,
            tags: None,
            ..
        }) => Purge::url(u).soft(soft),
        Ok(PurgeBody {
            url: None,
            prefix: Some(p),
            tags: None,
            ..
        }) => Purge::prefix(p).soft(soft),
        Ok(PurgeBody {
            url: None,
            prefix: None,
            tags: Some(t),
            ..
        }) => match zerocache_ops::check_tags(&t) {
            Ok(()) => Purge::tags(t).soft(soft),
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(serde_json::json!({ "error": e })),
                )
                    .into_response();
            }
        },
        Ok(_) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"error": "give exactly one of `url`, `prefix` and `tags`"}),
                ),
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({"error": format!("invalid JSON: {e}")})),
            )
                .into_response();
        }
    };
    if fleet && state.fleet.is_none() {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "`fleet: true`, but this node is not in a fleet"})),
        )
            .into_response();
    }
    // Off the runtime: a purge deletes files, and a prefix purge reads the head of every entry
    // (the index keeps no key text), seconds at a million entries.
    let purged = {
        let (state, target) = (state.clone(), target.clone());
        tokio::task::spawn_blocking(move || (state.purge)(&target))
            .await
            .unwrap_or_else(|e| Err(format!("the purge failed: {e}")))
    };
    match purged {
        Ok(n) => {
            tracing::info!(?target, purged = n, fleet, "purge");
            match state.fleet.as_ref().filter(|_| fleet) {
                Some(h) => {
                    let peers = (h.purge)(target).await;
                    Json(serde_json::json!({ "purged": n, "peers": peers })).into_response()
                }
                None => Json(serde_json::json!({ "purged": n })).into_response(),
            }
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": e })),
        )
            .into_response(),
    }
}

async fn processes(State(state): State<Arc<DashboardState>>) -> Json<Vec<api::Process>> {
    Json(api::processes(&state))
}

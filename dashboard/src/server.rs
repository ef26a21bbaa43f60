//! The axum app and its background tasks: joining the probe's closed-fd records with the proxy's
//! connections, and sampling the counters once a second for the charts.

use crate::accounting::{Accounting, CacheStatus};
use crate::history::{History, Sample};
use crate::{api, metrics};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use zerocache_probe::Probe;

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
    /// Per-second samples.
    pub history: Mutex<History>,
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
}

static INDEX: &str = include_str!("../assets/index.html");

/// Starts the background tasks and serves the app on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<DashboardState>) -> std::io::Result<()> {
    spawn_joiner(state.clone());
    spawn_sampler(state.clone());
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics_handler))
        .route("/api/stats", get(stats))
        .route("/api/connections", get(connections))
        .route("/api/processes", get(processes))
        .with_state(state);
    axum::serve(listener, app).await
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
    let body = acc.body_totals();
    Sample {
        t: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        requests: CacheStatus::ALL.iter().map(|c| acc.requests(*c)).collect(),
        bytes_by_kind,
        body_zerocopy: body.zerocopy_bytes,
        body_copy: body.copy_bytes,
        violations: acc.violations(),
    }
}

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

async fn metrics_handler(State(state): State<Arc<DashboardState>>) -> Response {
    match metrics::render(&state) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[derive(Deserialize)]
struct StatsQuery {
    #[serde(default)]
    history: Option<bool>,
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
}

async fn connections(
    State(state): State<Arc<DashboardState>>,
    Query(q): Query<ConnQuery>,
) -> Json<api::Connections> {
    Json(api::connections(&state, q.limit.unwrap_or(200).min(10_000)))
}

async fn processes(State(state): State<Arc<DashboardState>>) -> Json<Vec<api::Process>> {
    Json(api::processes(&state))
}

//! `POST /api/debug/clock`: the test hook that ages every cached response without waiting. The
//! route answers 404 unless the proxy handed the dashboard a clock to move, which it does only
//! with `debug.adjustable_clock` set and `ZEROCACHE_TEST_CLOCK=1` in its environment; behind the
//! same token and edge checks as every other state-changing API.

use crate::server::DashboardState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

/// Moves the cache's clock forward by the given seconds; answers the whole offset.
pub type AdvanceClockFn = Box<dyn Fn(u64) -> u64 + Send + Sync>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Advance {
    advance_secs: u64,
}

/// At most a day per call: a test needs seconds, and a typo of many digits should not age the
/// cache past every `max-age` at once.
const MAX_ADVANCE: u64 = 86_400;

/// `POST /api/debug/clock` with `{"advance_secs": N}` (1..=86400): `{"offset_secs": total}`.
pub(crate) async fn advance(
    State(state): State<Arc<DashboardState>>,
    body: axum::body::Bytes,
) -> Response {
    let Some(clock) = &state.advance_clock else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match serde_json::from_slice::<Advance>(&body) {
        Ok(Advance { advance_secs: n }) if (1..=MAX_ADVANCE).contains(&n) => {
            let offset = clock(n);
            tracing::warn!(
                advanced = n,
                offset,
                "cache clock moved forward (test hook)"
            );
            Json(serde_json::json!({ "offset_secs": offset })).into_response()
        }
        Ok(_) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "advance_secs must be 1..=86400"})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": format!("invalid JSON: {e}")})),
        )
            .into_response(),
    }
}

//! `/metrics` in the Prometheus text format. Families follow Prometheus naming (base units,
//! `_total` counters) and every one has samples from start-up, so a scrape of an idle proxy is
//! complete. Ratios are left to PromQL (see docs/dashboard-and-metrics.md); no per-connection labels.

use crate::server::DashboardState;
use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use zerocache_ledger::{CacheStatus, DataPath, Protocol};

/// A counter family registered in `r`.
pub(crate) fn counter_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// `zerocache_build_info{version, commit} 1`, registered in `r`.
pub(crate) fn build_info(r: &Registry) -> prometheus::Result<()> {
    let build = IntGaugeVec::new(
        Opts::new(
            "zerocache_build_info",
            "Always 1; the labels say which build is running.",
        ),
        &["version", "commit"],
    )?;
    build
        .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("ZEROCACHE_COMMIT")])
        .set(1);
    r.register(Box::new(build))
}

/// A rendered metrics text as the HTTP answer: Prometheus text format 0.0.4, or 500 with the
/// reason if rendering failed.
pub(crate) fn exposition(rendered: prometheus::Result<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match rendered {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Renders the current metrics.
pub fn render(state: &DashboardState) -> prometheus::Result<String> {
    let r = Registry::new();
    let acc = &state.accounting;

    let requests = counter_vec(
        &r,
        "zerocache_requests_total",
        "Responses sent, by X-Cache status, source (client, or a fleet peer that forwarded the request), protocol (http/1.1, h2) and route (routes[].name, else its index; - for none).",
        &["cache_status", "source", "protocol", "route"],
    )?;
    let body = counter_vec(
        &r,
        "zerocache_response_body_bytes_total",
        "Response body bytes sent, by cache status and the data path the proxy chose (zerocopy = sendfile).",
        &["cache_status", "path"],
    )?;
    let routes = acc.routes();
    for route in &routes {
        for (p, source, cs, n) in route.requests() {
            requests
                .with_label_values(&[cs.as_str(), source, p.as_str(), route.name()])
                .inc_by(n);
        }
    }
    for cs in CacheStatus::ALL {
        for p in [DataPath::Zerocopy, DataPath::Copy] {
            body.with_label_values(&[cs.as_str(), p.as_str()])
                .inc_by(acc.body_bytes(cs, p));
        }
    }

    // By status code, so a 502 from a dead upstream is seen as a 5xx, not only as a MISS. Codes
    // appear as they are sent; 200 is there from start-up for every cache status and protocol.
    let responses = counter_vec(
        &r,
        "zerocache_responses_total",
        "Responses sent, by status code, X-Cache status, protocol (http/1.1, h2) and route.",
        &["code", "cache_status", "protocol", "route"],
    )?;
    for route in &routes {
        for cs in CacheStatus::ALL {
            for p in Protocol::ALL {
                responses
                    .with_label_values(&["200", cs.as_str(), p.as_str(), route.name()])
                    .inc_by(0);
            }
        }
        for (p, code, cs, n) in route.by_code() {
            responses
                .with_label_values(&[&code.to_string(), cs.as_str(), p.as_str(), route.name()])
                .inc_by(n);
        }
    }

    // Per edge rule: names from the config, so the series are the operator's to bound. Made at
    // load, so a rule that never matched reads 0 rather than being absent.
    let matches = counter_vec(
        &r,
        "zerocache_rule_matches_total",
        "Requests an edge rule (routes[].rules) matched, by route and rule name.",
        &["route", "rule"],
    )?;
    let limited = counter_vec(
        &r,
        "zerocache_rule_limited_total",
        "Requests an edge rule's rate limit answered 429, by route and rule name.",
        &["route", "rule"],
    )?;
    for route in &routes {
        for rule in route.rules() {
            let (m, l) = rule.counts();
            matches
                .with_label_values(&[route.name(), rule.name()])
                .inc_by(m);
            limited
                .with_label_values(&[route.name(), rule.name()])
                .inc_by(l);
        }
    }

    let rejected = counter_vec(
        &r,
        "zerocache_connections_rejected_total",
        "Connections answered 503 as soon as they were accepted, by reason.",
        &["reason"],
    )?;
    for (reason, n) in acc.rejected() {
        rejected.with_label_values(&[reason.as_str()]).inc_by(n);
    }

    let reloads = counter_vec(
        &r,
        "zerocache_config_reloads_total",
        "SIGHUP reloads, by result (rejected: the running config was kept).",
        &["result"],
    )?;
    let (accepted, refused) = acc.reloads();
    reloads.with_label_values(&["accepted"]).inc_by(accepted);
    reloads.with_label_values(&["rejected"]).inc_by(refused);

    let purges = counter_vec(
        &r,
        "zerocache_purges_total",
        "Purges carried out on this node (from /api/purge, a PURGE request or a fleet peer), by kind (url, prefix, tag) and mode (hard: removed; soft: made stale).",
        &["kind", "mode"],
    )?;
    for (kind, mode, n) in acc.purges() {
        purges.with_label_values(&[kind.as_str(), mode]).inc_by(n);
    }

    let upgrades = counter_vec(
        &r,
        "zerocache_binary_upgrades_total",
        "SIGUSR2 binary upgrades, by result (failed: the successor did not serve, and this process kept serving).",
        &["result"],
    )?;
    let (served, failed) = acc.binary_upgrades();
    upgrades.with_label_values(&["served"]).inc_by(served);
    upgrades.with_label_values(&["failed"]).inc_by(failed);

    let dropped = counter_vec(
        &r,
        "zerocache_access_log_dropped_total",
        "Access log lines dropped because the writer thread fell behind.",
        &[],
    )?;
    dropped
        .with_label_values(&[] as &[&str])
        .inc_by((state.access_log_dropped)());

    build_info(&r)?;

    let violations = counter_vec(
        &r,
        "zerocache_zero_copy_violations_total",
        "Responses meant to be sent with sendfile whose body bytes the kernel saw going through a copying syscall.",
        &[],
    )?;
    violations
        .with_label_values(&[] as &[&str])
        .inc_by(acc.violations());

    let cold = counter_vec(
        &r,
        "zerocache_cold_hit_offloads_total",
        "Hits whose pages were not in the page cache and were read in on the blocking pool first.",
        &[],
    )?;
    cold.with_label_values(&[] as &[&str])
        .inc_by(acc.cold_offloads());

    let kernel_body = counter_vec(
        &r,
        "zerocache_kernel_body_bytes_total",
        "zerocache response body bytes as the kernel saw them, by path (zerocopy = sendfile/splice).",
        &["path"],
    )?;
    let bt = acc.body_totals_with_live(&crate::api::live(state));
    kernel_body
        .with_label_values(&["zerocopy"])
        .inc_by(bt.zerocopy_bytes);
    kernel_body
        .with_label_values(&["copy"])
        .inc_by(bt.copy_bytes);

    crate::tls_metrics::register(&r, acc, &bt)?;
    crate::slice_metrics::register(&r, acc)?;

    let upstream = counter_vec(
        &r,
        "zerocache_upstream_errors_total",
        "Failed upstream exchanges.",
        &["upstream", "kind"],
    )?;
    for name in &state.upstreams {
        for k in ["connect", "timeout", "closed", "protocol", "io", "tls"] {
            upstream.with_label_values(&[name.as_str(), k]).inc_by(0);
        }
    }
    for ((name, k), n) in acc.upstream_errors() {
        upstream.with_label_values(&[name.as_str(), k]).inc_by(n);
    }

    // By server and status: which origin server answers 5xx. Series appear as servers answer.
    let upstream_requests = counter_vec(
        &r,
        "zerocache_upstream_requests_total",
        "Upstream response heads received, by upstream group, server and status code.",
        &["upstream", "server", "code"],
    )?;
    for ((name, server, code), n) in acc.upstream_responses() {
        upstream_requests
            .with_label_values(&[name.as_str(), server.as_str(), &code.to_string()])
            .inc_by(n);
    }
    for name in &state.upstreams {
        // Every group's histogram is there from start-up, with a count of 0.
        let _ = acc.upstream_seconds().with_label_values(&[name.as_str()]);
    }
    r.register(Box::new(acc.upstream_seconds().clone()))?;

    let cache = (state.cache)();
    let g = IntGauge::new(
        "zerocache_cache_size_bytes",
        "Bytes of cache files on disk.",
    )?;
    g.set(cache.size_bytes as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new("zerocache_cache_objects", "Entries in the cache.")?;
    g.set(cache.objects as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_slice_objects",
        "Objects stored in slices (routes[].slice), at least one slice of each.",
    )?;
    g.set(cache.sliced_objects as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_slice_objects_partial",
        "Of zerocache_slice_objects, those known to miss a slice: cached in part.",
    )?;
    g.set(cache.sliced_objects_partial as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_slices",
        "Slices stored, among zerocache_cache_objects.",
    )?;
    g.set(cache.slices as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_cache_max_size_bytes",
        "cache.max_size: the bytes of cache files eviction keeps the cache under.",
    )?;
    g.set(cache.max_size_bytes as i64);
    r.register(Box::new(g))?;
    let evictions = counter_vec(
        &r,
        "zerocache_cache_evictions_total",
        "Entries evicted (least recently used) to stay under cache.max_size or cache.max_entries.",
        &[],
    )?;
    evictions
        .with_label_values(&[] as &[&str])
        .inc_by(cache.evictions);
    counter_vec(
        &r,
        "zerocache_cache_head_reads_total",
        "Entry heads read from their files (one pread each): hits on entries not among cache.hot_entries, purges, the scrub.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .inc_by(cache.head_reads);
    let g = IntGauge::new(
        "zerocache_cache_index_loading",
        "1 while the cache index loads in the background after a start (the proxy serves meanwhile; entries not yet indexed are found by their hash), 0 once every file is indexed.",
    )?;
    g.set(cache.index_loading as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_cache_index_loaded_entries",
        "Entries the start-up load has indexed so far (its progress; entries stored since the start are not counted here).",
    )?;
    g.set(cache.index_loaded_entries as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_cache_open_files",
        "Cache files held open so hot hits cost no open(2).",
    )?;
    g.set(cache.open_files as i64);
    r.register(Box::new(g))?;
    let g = IntGauge::new(
        "zerocache_cache_writable",
        "1 while cache writes succeed; 0 after a failed write (serving pass-through).",
    )?;
    g.set(cache.writable as i64);
    r.register(Box::new(g))?;
    let werr = counter_vec(
        &r,
        "zerocache_cache_write_errors_total",
        "Cache writes that failed (disk full, permissions); those responses were passed through.",
        &[],
    )?;
    werr.with_label_values(&[] as &[&str])
        .inc_by(cache.write_errors);
    let corrupt = counter_vec(
        &r,
        "zerocache_cache_corrupt_entries_total",
        "Cache entries whose body no longer had the checksum stored with it (found at start-up or by the scrub); each was discarded and is fetched again on its next request.",
        &[],
    )?;
    corrupt
        .with_label_values(&[] as &[&str])
        .inc_by(acc.corrupt_entries());

    let upgrades = counter_vec(
        &r,
        "zerocache_upgrades_total",
        "Upgrade requests (WebSocket, ...) on routes with upgrade: true, by outcome: switched (the origin's 101, then a tunnel), refused (the origin answered otherwise), failed (no answer).",
        &["outcome"],
    )?;
    for k in ["switched", "refused", "failed"] {
        upgrades.with_label_values(&[k]).inc_by(0);
    }
    for (k, n) in acc.upgrade_counts() {
        upgrades.with_label_values(&[k]).inc_by(n);
    }

    let h2 = counter_vec(
        &r,
        "zerocache_h2_events_total",
        "HTTP/2 connections and what happened on them: connections, streams, malformed (refused before anything went upstream), refused (CONNECT), client-resets, send-timeouts, connection-errors (floods and protocol errors included), goaway, enhance-your-calm (GOAWAY to a client resetting most of its streams: rapid reset).",
        &["event"],
    )?;
    for k in zerocache_ledger::H2_EVENTS {
        h2.with_label_values(&[k]).inc_by(0);
    }
    for (k, n) in acc.h2_event_counts() {
        h2.with_label_values(&[k]).inc_by(n);
    }

    // Pre-seeded with the size reasons, so an alert on them has a series from the start.
    let not_stored = counter_vec(
        &r,
        "zerocache_cache_not_stored_total",
        "Responses fetched to be stored that were not, by reason (their Cache-Status detail): too-large and too-small (cache.max_object_size, min_object_size, or larger than the whole cache), no-freshness, response-directive, set-cookie, status, server-error, cache-unwritable, ...",
        &["reason"],
    )?;
    for k in ["too-large", "too-small"] {
        not_stored.with_label_values(&[k]).inc_by(0);
    }
    for (k, n) in acc.not_stored_counts() {
        not_stored.with_label_values(&[k]).inc_by(n);
    }

    let server_up = IntGaugeVec::new(
        Opts::new(
            "zerocache_upstream_server_up",
            "1 while the balancer may pick the upstream server, 0 while it is marked down by failures (max_fails within fail_timeout) or by the active health check; every configured server from start-up.",
        ),
        &["upstream", "server"],
    )?;
    for (group, server, up) in (state.upstream_servers)() {
        server_up
            .with_label_values(&[group.as_str(), server.as_str()])
            .set(i64::from(up));
    }
    r.register(Box::new(server_up))?;

    let per_worker = IntGaugeVec::new(
        Opts::new(
            "zerocache_worker_connections",
            "Open client connections per data-plane worker thread; each connection stays on the worker it was given when it arrived (the least loaded; while workers are pinned, one on its incoming CPU within a slack of 2).",
        ),
        &["worker"],
    )?;
    let pinned = IntGaugeVec::new(
        Opts::new(
            "zerocache_worker_pinned",
            "1 while a data-plane worker thread is pinned to its CPU (workers.cpu_affinity); with auto, 0 while it has been moved to the other CPUs because it kept waiting for its own.",
        ),
        &["worker"],
    )?;
    let workers = (state.workers)();
    for (i, n) in workers.connections.iter().enumerate() {
        per_worker
            .with_label_values(&[i.to_string().as_str()])
            .set(*n as i64);
    }
    for (i, p) in workers.pinned.iter().enumerate() {
        pinned
            .with_label_values(&[i.to_string().as_str()])
            .set(*p as i64);
    }
    r.register(Box::new(per_worker))?;
    r.register(Box::new(pinned))?;
    let unpins = IntCounter::new(
        "zerocache_worker_unpins_total",
        "Times workers.cpu_affinity: auto moved a pinned worker to the other CPUs because its runs kept waiting for its own (another task holding it).",
    )?;
    unpins.inc_by(workers.unpins);
    r.register(Box::new(unpins))?;

    let snap = state.probe.snapshot();
    crate::probe_state::register(&r, &snap)?;

    crate::process_metrics::register(&r, &snap, &["zerocache"], Some(std::process::id()))?;

    r.register(Box::new(acc.durations().clone()))?;
    crate::fleet::render(&r, state)?;
    // The standard process_* families (CPU seconds, resident memory, open fds, start time), so
    // the usual alerts and dashboards work unchanged.
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;

    let mut out = Vec::with_capacity(16 * 1024);
    TextEncoder::new().encode(&r.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

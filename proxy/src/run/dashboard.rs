//! The dashboard's view of the running process, built at start-up from what it keeps.

use super::*;

/// What the dashboard reads and may do: the store, the ledger, the probe, the workers, purges,
/// health (503 while `draining`), the fleet.
pub(super) fn dashboard_state(
    config: &Config,
    kept: &Kept,
    probe: &Probe,
    (loads, placement): (&Arc<server::workers::Loads>, &Arc<Placement>),
    draining: &Arc<std::sync::atomic::AtomicBool>,
    shared: &Arc<std::sync::OnceLock<Arc<Shared>>>,
) -> anyhow::Result<Arc<DashboardState>> {
    let (store, accounting, access_log, fleet) =
        (&kept.store, &kept.accounting, &kept.access_log, &kept.fleet);
    let st = store.clone();
    let purge_store = store.clone();
    let purge_accounting = accounting.clone();
    let health_store = store.clone();
    let health_draining = draining.clone();
    let state = Arc::new(DashboardState {
        accounting: accounting.clone(),
        probe: probe.clone(),
        cache: Box::new(move || {
            let (size_bytes, objects) = st.usage();
            let sliced = st.slice_census();
            CacheStats {
                sliced_objects: sliced.objects,
                sliced_objects_partial: sliced.partial,
                slices: sliced.slices,
                size_bytes,
                objects,
                write_errors: st.write_errors.load(std::sync::atomic::Ordering::Relaxed),
                writable: st.is_writable(),
                open_files: st.open_files() as u64,
                evictions: st.evictions.load(std::sync::atomic::Ordering::Relaxed),
                head_reads: st.head_reads.load(std::sync::atomic::Ordering::Relaxed),
                index_loading: st.is_loading(),
                index_loaded_entries: st.loaded_entries(),
                max_size_bytes: st.max_size(),
            }
        }),
        upstreams: config.upstreams.keys().cloned().collect(),
        upstream_servers: {
            let shared = shared.clone();
            Box::new(move || {
                let Some(shared) = shared.get() else {
                    return Vec::new();
                };
                let ctx = shared.ctx.load();
                let mut all: Vec<(String, String, bool)> = ctx
                    .routes
                    .groups
                    .iter()
                    .flat_map(|(name, g)| {
                        g.servers_up()
                            .into_iter()
                            .map(move |(s, up)| (name.clone(), s, up))
                    })
                    .collect();
                all.sort();
                all
            })
        },
        workers: {
            let (loads, placement) = (loads.clone(), placement.clone());
            Box::new(move || WorkerStats {
                connections: loads.snapshot(),
                pinned: placement.pinned(),
                unpins: placement.unpins(),
            })
        },
        history: Mutex::new(Default::default()),
        token: zerocache_dashboard::guard::check_token(config.dashboard.token.clone())?,
        allowed_hosts: config.dashboard.allowed_hosts.clone(),
        metrics_require_token: config.dashboard.metrics_require_token,
        purge: {
            let shared = shared.clone();
            Box::new(move |p| {
                // The fill locks and key width of the context current now (the store is the
                // same across reloads, and the context's).
                match shared.get() {
                    Some(s) => s.ctx.load().purger().purge(p),
                    // Before the data plane exists: nothing is indexed but by the store.
                    None => crate::purge::Purger {
                        store: &purge_store,
                        accounting: &purge_accounting,
                        locks: &Arc::new(FillLocks::default()),
                        hash_bits: 128,
                        routes: None,
                    }
                    .purge(p),
                }
            })
        },
        advance_clock: config
            .debug
            .adjustable_clock
            .then(|| Box::new(crate::clock::advance) as zerocache_dashboard::clock::AdvanceClockFn),
        access_log_dropped: {
            let log = access_log.clone();
            Box::new(move || {
                log.as_ref()
                    .map_or(0, |l| l.dropped.load(std::sync::atomic::Ordering::Relaxed))
            })
        },
        health: Box::new(move || {
            if health_draining.load(std::sync::atomic::Ordering::Relaxed) {
                Err("draining".into())
            } else if !health_store.is_writable() {
                Ok(Some(
                    "cache unwritable: responses are passed through, not stored".into(),
                ))
            } else {
                Ok(None)
            }
        }),
        fleet: crate::fleet::Fleet::hooks(fleet, accounting),
    });
    Ok(state)
}

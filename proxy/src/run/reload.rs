//! SIGHUP: a new config for new requests, or the old one kept with the reason logged.

use super::*;

/// SIGHUP: re-reads the config; a valid one replaces routes, upstreams, limits and the probe's
/// watch list for new requests, an invalid one is logged and the old one kept.
pub(super) fn reload(
    path: &Path,
    old: &Config,
    kept: &Kept,
    shared: &Shared,
    probe: &Probe,
) -> Option<Config> {
    let new = match zerocache_config::load_and_check_dirs(path, zerocache_config::Dirs::Untouched)
        .map_err(|e| e.to_string())
    {
        Ok(c) => match crate::clock::refusal(&c) {
            Some(why) => Err(format!("{}: {why}", path.display())),
            None => Ok(c),
        },
        Err(e) => Err(e),
    };
    let new = match new {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "reload rejected; keeping the running config");
            shared.ctx.load().accounting.config_reload(false);
            return None;
        }
    };
    for (what, changed) in [
        (
            "listen",
            new.listen != old.listen || new.backlog != old.backlog,
        ),
        ("cache", new.cache != old.cache),
        (
            "tls.listen",
            new.tls.as_ref().map(|t| &t.listen) != old.tls.as_ref().map(|t| &t.listen),
        ),
        ("dashboard", new.dashboard != old.dashboard),
        ("logging", new.logging != old.logging),
        ("probe.enabled", new.probe.enabled != old.probe.enabled),
        ("workers", new.workers != old.workers),
        (
            "debug.adjustable_clock",
            new.debug.adjustable_clock != old.debug.adjustable_clock,
        ),
        ("fleet", new.fleet != old.fleet),
    ] {
        if changed {
            tracing::warn!(
                setting = what,
                "changed in the config but only takes effect on restart"
            );
        }
    }
    warn_if_clamped(&new, kept.connection_cap, kept.nofile);
    // Certificates are read again; a bad file rejects the reload and the running ones stay.
    let tls = match crate::tls::listener::reload(&new, old) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "reload rejected (TLS certificates); keeping the running config");
            shared.ctx.load().accounting.config_reload(false);
            return None;
        }
    };
    let old_ctx = shared.ctx.swap(Arc::new(build_ctx(
        &new,
        kept,
        tls,
        Arc::new(crate::routing::Routes::new(&new, &kept.accounting)),
    )));
    // Responses in flight keep the old groups until they end; their health checks stop now.
    for group in old_ctx.routes.groups.values() {
        group.retire();
    }
    probe.set_targets(watch_targets(&new));
    tracing::info!(path = %path.display(), routes = new.routes.len(), upstreams = new.upstreams.len(), "config reloaded");
    shared.ctx.load().accounting.config_reload(true);
    Some(new)
}

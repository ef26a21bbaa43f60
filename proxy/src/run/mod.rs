//! Start-up, reload and shut-down of the whole process: config → cache rebuild → probe →
//! dashboard → listener; SIGHUP reloads, SIGUSR1 reopens the access
//! log, SIGTERM/SIGINT/SIGQUIT drain and exit, SIGUSR2 and SIGALRM are ignored.

use crate::accesslog::AccessLog;
use crate::cache::lock::FillLocks;
use crate::cache::store::Store;
use crate::cpu::affinity;
use crate::cpu::placement::Placement;
use crate::fd_limits::{connection_cap, open_files_for, raise_nofile, warn_if_clamped};
use crate::http::request::Limits;
use crate::rate_limit::Limiter;
use crate::routing::Routes;
use crate::server::{self, ClientRules, Ctx, Forwarding, Sending, Shared, Storing};
use anyhow::Context;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use zerocache_config::{Config, Keyword, WatchEntry};
use zerocache_dashboard::WorkerStats;
use zerocache_dashboard::{CacheStats, DashboardState};
use zerocache_ledger::Accounting;
use zerocache_probe::{Probe, ProbeOptions, WatchTarget};

mod dashboard;
mod reload;
mod signals;

use dashboard::dashboard_state;
use reload::reload;
use signals::{Signals, stop, upgrade_of};

/// Closed connections kept for the dashboard.
const CLOSED_KEPT: usize = 10_000;

fn watch_targets(config: &Config) -> Vec<WatchTarget> {
    config
        .probe
        .watch
        .iter()
        .map(|w| match w {
            WatchEntry::Keyword(Keyword::SelfProcess) => WatchTarget::SelfProcess,
            WatchEntry::Pid { pid } => WatchTarget::Pid(*pid),
            WatchEntry::Comm { comm } => WatchTarget::Comm(comm.clone()),
        })
        .collect()
}

/// The parts of a context that survive reloads.
struct Kept {
    store: Arc<Store>,
    locks: Arc<FillLocks>,
    accounting: Arc<Accounting>,
    access_log: Option<Arc<AccessLog>>,
    /// [`connection_cap`] of the process's RLIMIT_NOFILE.
    connection_cap: usize,
    nofile: u64,
    fleet: Option<Arc<crate::fleet::Fleet>>,
    /// The rules' rate-limit buckets (`limits.rate_limit_keys`, read at start-up).
    limiter: Arc<crate::rate_limit::Limiter>,
}

/// How many data-plane workers to run and where (see `cpu::placement`). By default one worker
/// per CPU the process may use: the data plane is syscall-bound, and more threads than CPUs only
/// add context switches. That is the affinity mask, further limited by a cgroup CPU quota
/// (`available_parallelism` reads `cpu.max`), so a container limited to 2 CPUs on a 64-core host
/// runs 2. Pinned workers go round robin over the allowed CPUs, as nginx's
/// `worker_cpu_affinity auto` does.
fn worker_placement(config: &zerocache_config::schema::WorkersConfig) -> Placement {
    let allowed = affinity::allowed_cpus().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the CPU affinity mask; workers not pinned");
        Vec::new()
    });
    let count = config.count.unwrap_or_else(|| {
        let quota = std::thread::available_parallelism().map_or(2, |n| n.get());
        if allowed.is_empty() {
            quota
        } else {
            quota.min(allowed.len())
        }
    });
    let placement = Placement::new(count, config.cpu_affinity, allowed);
    tracing::info!(
        workers = count,
        mode = ?config.cpu_affinity,
        pinned = placement.pins(),
        "data-plane workers"
    );
    placement
}

/// The request context of `config`; `routes` its routes, built once for it (and given to the
/// fleet, whose purge-log catch-ups normalise URLs with them).
fn build_ctx(
    config: &Config,
    kept: &Kept,
    tls: Option<Arc<crate::tls::server::TlsServer>>,
    routes: Arc<Routes>,
) -> Ctx {
    // The certificates served from now on, for their expiry gauge.
    kept.accounting
        .tls
        .set_certificates(crate::tls::server::TlsServer::expiries(tls.as_deref()));
    for (name, group) in &routes.groups {
        if let Some(cfg) = config.upstreams.get(name) {
            group.start_health_check(cfg);
        }
    }
    Ctx {
        fleet: crate::fleet::Fleet::for_config(&kept.fleet, config, &routes),
        routes,
        store: kept.store.clone(),
        locks: kept.locks.clone(),
        accounting: kept.accounting.clone(),
        access_log: kept.access_log.clone(),
        limiter: kept.limiter.clone(),
        tls,
        max_connections: config.limits.max_connections.min(kept.connection_cap),
        hash_bits: config.debug.key_hash_bits.unwrap_or(128).min(128) as u32,
        client: ClientRules {
            limits: Limits {
                max_head: config.limits.max_header_bytes.as_u64() as usize,
                max_uri: config.limits.max_uri_bytes.as_u64() as usize,
                path: crate::http::target::PathRules {
                    reject_backslash: config.proxy.path_backslash
                        == zerocache_config::PathSpelling::Reject,
                    reject_parameters: config.proxy.path_parameters
                        == zerocache_config::PathSpelling::Reject,
                    reject_encoded_traversal: config.proxy.path_encoded_traversal
                        == zerocache_config::PathSpelling::Reject,
                },
            },
            header_timeout: config.limits.header_timeout,
            idle_timeout: config.limits.idle_timeout,
            read_timeout: config.limits.read_timeout,
            send_timeout: config.limits.send_timeout,
            body_min_rate: config.limits.body_min_rate.as_u64(),
            max_body: config.limits.max_body_bytes.as_u64(),
        },
        purge_method: config.purge.method.then(|| crate::server::PurgeMethod {
            // Validated at load: an entry that does not parse never gets this far.
            allowed: config
                .purge
                .allowed_clients
                .iter()
                .filter_map(|c| zerocache_config::cidr::Cidr::parse(c).ok())
                .collect(),
            token: config.purge.token.clone(),
        }),
        forwarding: Forwarding {
            strip_fields: config
                .proxy
                .strip_request_fields
                .iter()
                .map(|f| f.to_ascii_lowercase())
                .collect(),
            request_id_header: config.logging.request_id_header.clone(),
            via: config.proxy.via,
            // Validated at load: an entry that does not parse never gets this far.
            trusted_proxies: config
                .proxy
                .trusted_proxies
                .iter()
                .filter_map(|c| zerocache_config::cidr::Cidr::parse(c).ok())
                .collect(),
        },
        storing: Storing {
            store_5xx: config.cache.store_5xx,
            heuristic_max: config.cache.heuristic_max,
            range_fill_max: config.cache.range_fill_max.as_u64(),
            abandoned_fill_max: config.cache.abandoned_fill_max.as_u64(),
            abandoned_fill_timeout: config.cache.abandoned_fill_timeout,
        },
        sending: Sending {
            sendfile_max_chunk: config.cache.sendfile_max_chunk.as_u64(),
            offload_cold_hits: config.cache.offload_cold_hits,
            copy_hits: config.debug.copy_hits,
        },
    }
}

/// Runs the proxy until SIGINT or SIGTERM, reloading `path` on SIGHUP.
pub async fn run(config: Config, path: PathBuf) -> anyhow::Result<()> {
    if let Some(why) = crate::clock::refusal(&config) {
        anyhow::bail!("{}: {why}", path.display());
    }
    // Handlers first: the rebuild below may take minutes, and a signal arriving meanwhile (a
    // logrotate postrotate, a reload) must wait for the loop below instead of taking the default
    // action (tokio keeps it until `recv`).
    let mut signals = Signals::install()?;
    crate::memory::start_trimming();
    // Sockets handed down (socket activation, or the process this one replaces) and the pipe on
    // which to tell that process we serve: read first, before anything else opens an fd.
    let mut inherited =
        crate::net::inherit::Inherited::from_env(std::process::id()).map_err(anyhow::Error::msg)?;
    let ready_pipe = crate::upgrade::has_ready_pipe();
    let raised = raise_nofile();
    // Read the limit back rather than trust the raise, which may have been refused.
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(raised, |(soft, _)| soft);
    let open_files = open_files_for(config.cache.open_files, nofile);
    let connection_cap = connection_cap(nofile);
    warn_if_clamped(&config, connection_cap, nofile);
    let store = open_store(&config, open_files)?;

    // Bind before the probe loads, so a taken port fails fast.
    let tls = crate::tls::listener::start(&config)?;
    let (listeners, dashboard_listener) = bind(&config, &tls.listen, &mut inherited).await?;
    inherited.close_rest();
    let upgrade = upgrade_of(&listeners, dashboard_listener.as_ref());
    let access_log = match &config.logging.access_log {
        Some(target) => Some(Arc::new(
            AccessLog::open(target, &config.logging.access_log_format)
                .with_context(|| format!("opening the access log {target} (logging.access_log)"))?,
        )),
        None => None,
    };

    let probe = Probe::start(ProbeOptions {
        enabled: config.probe.enabled,
        watch: watch_targets(&config),
        closed_capacity: CLOSED_KEPT,
    });
    // Kernel records reach the join through the dashboard's tasks: without a dashboard nobody
    // would take them, and closed connections would wait for them forever.
    let joined = probe.status().is_attached() && config.dashboard.enabled;
    let mut accounting = Accounting::new(CLOSED_KEPT, joined);
    if joined {
        // The join pairs each connection with the kernel's record of its own socket.
        let (probe, me) = (probe.clone(), std::process::id());
        accounting.set_generations(move |fd| probe.generation(me, fd));
    }
    let accounting = Arc::new(accounting);
    series_from_start(&config, &accounting, tls.server.as_deref());
    accounting
        .tls
        .set_detected(tls.server.is_some(), tls.ktls.available());
    crate::cache::scrub::start(
        store.clone(),
        accounting.clone(),
        crate::cache::scrub::ScrubConfig::of(&config.cache),
    );
    let placement = Arc::new(worker_placement(&config.workers));
    let loads = Arc::new(server::workers::Loads::new(placement.workers()));

    // Set when SIGTERM/SIGINT starts the drain: `/healthz` then answers 503, so a load balancer
    // stops sending new clients while responses in flight finish.
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let locks = Arc::new(FillLocks::default());
    // Before the fleet: its catch-up before serving normalises purged URLs with their `query`.
    let routes = Arc::new(Routes::new(&config, &accounting));
    let fleet = crate::fleet::Fleet::start(&config, &store, &locks, &accounting, &routes).await;
    let kept = Kept {
        store,
        locks,
        accounting,
        access_log,
        connection_cap,
        nofile,
        fleet,
        limiter: Arc::new(Limiter::new(config.limits.rate_limit_keys)),
    };
    // What the dashboard reads of the request context (the upstream groups, replaced on reload)
    // it finds here. Set before the dashboard serves: the listeners are bound already, so a
    // scrape the kernel queued must not find a context that does not exist yet (its upstream
    // series were missing from the first /metrics after start-up).
    let shared_slot: Arc<std::sync::OnceLock<Arc<Shared>>> = Arc::default();
    let shared = Shared::new(build_ctx(&config, &kept, tls.server, routes));
    let _ = shared_slot.set(shared.clone());
    // Sent once a successor serves: the dashboard stops accepting, as the data plane does.
    let (handed_over, _) = tokio::sync::watch::channel(false);
    if let Some(l) = dashboard_listener {
        let addr = l.local_addr()?;
        let mut handed = handed_over.subscribe();
        let stop = async move {
            let _ = handed.wait_for(|h| *h).await;
        };
        let state = dashboard_state(
            &config,
            &kept,
            &probe,
            (&loads, &placement),
            &draining,
            &shared_slot,
        )?;
        tokio::spawn(async move {
            if let Err(e) = zerocache_dashboard::serve(l, state, stop).await {
                tracing::error!(error = %e, "dashboard stopped");
            }
        });
        tracing::info!(%addr, "dashboard listening");
    }
    warn_of_debug_hooks(&config);
    let addrs: Vec<String> = listeners
        .iter()
        .filter_map(|(l, _)| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!(addrs = %addrs.join(", "), backlog = config.backlog, nofile, probe = ?probe.status(), "zerocache listening");
    let mut workers =
        server::workers::Workers::start(listeners, shared.clone(), loads, placement.clone())
            .context("starting the data-plane worker threads")?;
    // Until the process exits: connections still draining after shutdown need it as well.
    tokio::spawn(async move { placement.valve().await });
    // Written once the listeners accept, removed when this returns (while it still names us).
    let _pid_file = match &config.pid_file {
        Some(p) => Some(
            crate::pid_file::PidFile::write(p)
                .with_context(|| format!("cannot write pid_file {}", p.display()))?,
        ),
        None => None,
    };
    // Bound and accepting (the index loads meanwhile): systemd may start what comes after us.
    signals::serving(ready_pipe, &kept);

    let (current, ending) = signals
        .serve(config, &path, &kept, &shared, &probe, upgrade.as_ref())
        .await;
    ending.announce(upgrade, &handed_over);
    signals
        .lame_duck(&ending, current.limits.lame_duck, &draining, &kept)
        .await;
    let drained = stop(
        &shared,
        &mut workers,
        &draining,
        current.limits.drain_timeout,
    );
    signals.while_draining(drained, &kept).await;
    ending.after_drain(&kept);
    Ok(())
}

/// Every route's series and every certificate's expiry from the first scrape, made from the
/// config itself (the accounting outlives every context).
fn series_from_start(
    config: &Config,
    accounting: &Accounting,
    tls: Option<&crate::tls::server::TlsServer>,
) {
    for (i, r) in config.routes.iter().enumerate() {
        accounting.route(&r.name_or_index(i));
    }
    accounting
        .tls
        .set_certificates(crate::tls::server::TlsServer::expiries(tls));
}

/// The `debug:` hooks that change what the proxy does, said at start-up.
fn warn_of_debug_hooks(config: &Config) {
    if config.debug.adjustable_clock {
        tracing::warn!(
            "debug.adjustable_clock is on: POST /api/debug/clock ages every cached response (test hook)"
        );
    }
    if config.debug.copy_hits {
        tracing::warn!(
            "debug.copy_hits is on: cache hits are sent with read+write on purpose (planted zero-copy bug)"
        );
    }
}

/// Opens the cache directory and rebuilds its index from the files.
fn open_store(config: &Config, open_files: usize) -> anyhow::Result<Arc<Store>> {
    let store = Arc::new(
        Store::open(
            &config.cache.path,
            crate::cache::store::StoreLimits {
                max_size: config.cache.max_size.as_u64(),
                max_entries: config.cache.max_entries.unwrap_or(usize::MAX),
                hot_entries: config.cache.hot_entries,
                levels: config.cache.levels,
                open_files,
            },
        )
        .with_context(|| format!("opening cache directory {}", config.cache.path.display()))?
        .with_hash_bits(u32::from(config.debug.key_hash_bits.unwrap_or(128)))
        .with_targeted(crate::cache::targeted::Targeted::new(
            &config.cache.targeted_fields,
            config.cache.targeted_fields_forward,
        ))
        .with_tags(crate::cache::tags::TagField::new(
            &config.cache.tag_field,
            match config.cache.tag_separator {
                zerocache_config::TagSeparator::Space => crate::cache::tags::Separator::Space,
                zerocache_config::TagSeparator::Comma => crate::cache::tags::Separator::Comma,
            },
            config.cache.tag_field_forward,
        )),
    );
    // The proxy listens and serves while the index loads: what the load has not reached yet is
    // found by its hash on request.
    store
        .load_in_background(
            config.cache.verify_on_start,
            config.debug.hold_index_load.clone(),
        )
        .context("starting the cache index load")?;
    tracing::info!(dir = %config.cache.path.display(), "cache index loading in the background");
    Ok(store)
}

use crate::net::listen::Accepting;

/// Binds the data listeners (`listen`, then `tls_listen` marked as TLS) and the dashboard's, each
/// on the socket handed down for its address if there is one (socket activation, an upgrade).
async fn bind(
    config: &Config,
    tls_listen: &[(std::net::SocketAddr, zerocache_config::ListenEntry)],
    inherited: &mut crate::net::inherit::Inherited,
) -> anyhow::Result<(Vec<(std::net::TcpListener, Accepting)>, Option<TcpListener>)> {
    use crate::net::inherit::Role;
    let mut listeners = Vec::new();
    let data = config
        .listen
        .bound()
        .map_err(anyhow::Error::msg)
        .context("listen")?;
    let tls = tls_listen.iter().map(|(a, e)| (*a, e));
    for ((addr, entry), (role, key)) in data
        .into_iter()
        .map(|d| (d, (Role::Data, "listen")))
        .chain(tls.map(|t| (t, (Role::Tls, "tls.listen"))))
    {
        let l = match inherited.take(addr, role).map_err(anyhow::Error::msg)? {
            Some(fd) => crate::net::listen::relisten(fd, config.backlog),
            None => crate::net::listen::bind_listener(addr, config.backlog),
        }
        .with_context(|| format!("cannot listen on {addr} ({key})"))?;
        listeners.push((l, Accepting::of(entry, role == Role::Tls)));
    }
    let dashboard_listener = if config.dashboard.enabled {
        let listen = &config.dashboard.listen;
        let handed = match listen.parse::<std::net::SocketAddr>() {
            Ok(addr) => inherited
                .take(addr, Role::Dashboard)
                .map_err(anyhow::Error::msg)?,
            Err(_) => None,
        };
        let l = match handed {
            Some(fd) => {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)
                    .and_then(|()| TcpListener::from_std(l))
            }
            None => TcpListener::bind(listen).await,
        };
        Some(l.with_context(|| format!("cannot listen on {listen} (dashboard.listen)"))?)
    } else {
        None
    };
    Ok((listeners, dashboard_listener))
}

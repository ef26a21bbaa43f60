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

fn build_ctx(config: &Config, kept: &Kept, tls: Option<Arc<crate::tls::server::TlsServer>>) -> Ctx {
    let routes = Routes::new(config, &kept.accounting);
    for (name, group) in &routes.groups {
        if let Some(cfg) = config.upstreams.get(name) {
            group.start_health_check(cfg);
        }
    }
    Ctx {
        routes,
        store: kept.store.clone(),
        locks: kept.locks.clone(),
        accounting: kept.accounting.clone(),
        access_log: kept.access_log.clone(),
        tls,
        fleet: crate::fleet::Fleet::for_config(&kept.fleet, config),
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
    let ready_pipe = crate::upgrade::ready_pipe();
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
            AccessLog::open(target, config.logging.access_log_format)
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
    let fleet = crate::fleet::Fleet::start(&config, &store, &locks).await;
    let kept = Kept {
        store,
        locks,
        accounting,
        access_log,
        connection_cap,
        nofile,
        fleet,
    };
    // The dashboard starts before the request context exists; what it reads of the context
    // (the upstream groups, replaced on reload) it finds here once set.
    let shared_slot: Arc<std::sync::OnceLock<Arc<Shared>>> = Arc::default();
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
    let shared = Shared::new(build_ctx(&config, &kept, tls.server));
    let _ = shared_slot.set(shared.clone());
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
    match ready_pipe {
        // A successor tells the process it replaces, which tells systemd our pid
        // (NotifyAccess=main would drop our READY=1 until then, and log it).
        Some(pipe) => {
            tracing::info!("serving: telling the process this one replaces to drain");
            crate::upgrade::tell_ready(pipe);
            kept.accounting.binary_upgrade(true); // By the process made: the old one exits.
        }
        None => crate::notify::ready(),
    }

    let (current, ending) = signals
        .serve(config, &path, &kept, &shared, &probe, upgrade.as_ref())
        .await;
    ending.announce(upgrade, &handed_over);
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

impl Ending {
    /// Says why the drain that follows starts: to systemd, the dashboard and the log. Closes the
    /// socket copies kept for a successor (`upgrade`): a stopping process refuses new clients,
    /// and a replaced one has handed them over.
    /// After the drain of a stop, the index is written for the next process to start from; a
    /// successor has the directory already, and writes its own when it stops.
    fn after_drain(&self, kept: &Kept) {
        if let Ending::Stop = self {
            // Nothing is stored or evicted from here on, so the snapshot stays true.
            kept.store.hand_over(true);
            if let Err(e) = kept.store.write_snapshot() {
                tracing::warn!(error = %e, "could not write the cache index for the next start; it loads from the entries");
            }
        }
    }

    fn announce(
        &self,
        upgrade: Option<crate::upgrade::Upgrade>,
        handed_over: &tokio::sync::watch::Sender<bool>,
    ) {
        drop(upgrade);
        match self {
            Ending::Stop => crate::notify::stopping(),
            Ending::Upgraded(pid) => {
                // systemd follows the successor as the unit's main process (NotifyAccess=main
                // lets only the current main process say so) instead of stopping the unit
                // when we exit.
                crate::notify::send(&format!("MAINPID={pid}"));
                // Exit (after the drain) only once systemd has read it, or it would take our
                // exit for the main process's and stop the unit, successor and all.
                crate::notify::barrier(std::time::Duration::from_secs(5));
                let _ = handed_over.send(true);
                tracing::info!(successor = pid, "upgrade: the new process serves; draining");
            }
        }
    }
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

/// An upgrade failed: said in the log and, for `zerocache upgrade`, beside the pid file; and the
/// pid file names this process again (a successor may have written its own before it failed).
fn upgrade_failed(current: &Config, why: &str) {
    tracing::error!(%why, "upgrade failed; this process keeps serving");
    if let Some(p) = &current.pid_file {
        if let Err(e) = std::fs::write(crate::upgrade::failed_file(p), format!("{why}\n")) {
            tracing::warn!(error = %e, "cannot say beside the pid file that the upgrade failed");
        }
        match crate::pid_file::PidFile::write(p) {
            // The guard made at start-up removes it at exit; this one must not.
            Ok(again) => std::mem::forget(again),
            Err(e) => {
                tracing::warn!(error = %e, path = %p.display(), "cannot rewrite the pid file")
            }
        }
    }
}

/// Why [`Signals::serve`] returned.
enum Ending {
    /// SIGTERM, SIGINT or SIGQUIT.
    Stop,
    /// A SIGUSR2 upgrade's successor (this pid) serves on our sockets.
    Upgraded(u32),
}

/// What a SIGUSR2 upgrade needs, with a copy of every listening socket; none (and SIGUSR2 says
/// why) if the program's path cannot be read.
fn upgrade_of(
    listeners: &[(std::net::TcpListener, Accepting)],
    dashboard: Option<&TcpListener>,
) -> Option<crate::upgrade::Upgrade> {
    use crate::net::inherit::Role;
    let kept = crate::upgrade::Upgrade::new().and_then(|mut u| {
        for (l, accepting) in listeners {
            u.keep(l, if accepting.tls { Role::Tls } else { Role::Data })?;
        }
        if let Some(d) = dashboard {
            u.keep(d, Role::Dashboard)?;
        }
        Ok(u)
    });
    match kept {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(error = %e, "SIGUSR2 upgrades are off: cannot keep what they need");
            None
        }
    }
}

/// The signals the process answers, installed before anything slow starts.
struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    alrm: tokio::signal::unix::Signal,
}

impl Signals {
    /// Runs `drained` to its end, saying what becomes of the signals that come meanwhile rather
    /// than dropping them unheard: an operator's second `zerocache upgrade` or reload must learn
    /// it did nothing, and logrotate's postrotate still reopens the access log.
    async fn while_draining(
        &mut self,
        drained: impl std::future::Future<Output = ()>,
        kept: &Kept,
    ) {
        let mut drained = std::pin::pin!(drained);
        loop {
            tokio::select! {
                () = &mut drained => return,
                _ = self.usr2.recv() => tracing::warn!("SIGUSR2 ignored: this process is draining (its successor, if any, takes upgrades)"),
                _ = self.hup.recv() => tracing::warn!("SIGHUP ignored: this process is draining"),
                _ = self.usr1.recv() => {
                    if let Some(log) = &kept.access_log {
                        log.reopen();
                    }
                }
            }
        }
    }

    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            // Without a handler SIGUSR1 would kill the process: logrotate's nginx-style
            // postrotate (`kill -USR1`) would take the cache down.
            usr1: signal(SignalKind::user_defined1())?,
            // nginx's graceful stop: drains like SIGTERM (its default action would dump core).
            quit: signal(SignalKind::quit())?,
            // Signals with no meaning here whose default action would end the process silently:
            // a stray `kill -USR2` (nginx's binary upgrade) or an alarm must not take the cache
            // down.
            usr2: signal(SignalKind::user_defined2())?,
            alrm: signal(SignalKind::alarm())?,
        })
    }

    /// Serves until a signal says stop: reloads on SIGHUP, reopens the access log on SIGUSR1.
    /// Returns the config current at the end (its drain timeout governs the stop).
    async fn serve(
        &mut self,
        config: Config,
        path: &Path,
        kept: &Kept,
        shared: &Arc<Shared>,
        probe: &Probe,
        upgrade: Option<&crate::upgrade::Upgrade>,
    ) -> (Config, Ending) {
        let mut current = config;
        // The upgrade under way, if any: polled beside the signals, so a reload or a log
        // reopen still works while the successor rebuilds its index.
        let mut successor: Option<crate::upgrade::Starting<'_>> = None;
        let Signals {
            term,
            hup,
            usr1,
            quit,
            usr2,
            alrm,
        } = self;
        let ending = loop {
            tokio::select! {
                // A successor that is ready wins over a stop signal that came at the same time:
                // it serves on our sockets, and this process drains either way.
                biased;
                r = async { match successor.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => {
                    successor = None;
                    match r {
                        Ok(pid) => break Ending::Upgraded(pid),
                        Err(why) => {
                            kept.accounting.binary_upgrade(false);
                            // This process stores again: the index it wrote would go stale.
                            kept.store.discard_snapshot();
                            kept.store.hand_over(false);
                            upgrade_failed(&current, &why);
                        }
                    }
                }
                _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: draining"); break Ending::Stop }
                _ = term.recv() => { tracing::info!("SIGTERM: draining"); break Ending::Stop }
                _ = quit.recv() => { tracing::info!("SIGQUIT: draining"); break Ending::Stop }
                _ = usr2.recv() => match upgrade {
                    _ if successor.is_some() => tracing::warn!("SIGUSR2 ignored: an upgrade is under way"),
                    None => tracing::warn!("SIGUSR2 ignored: upgrades are off (see the start-up log)"),
                    Some(u) => match crate::upgrade::refusal() {
                        Some(why) => tracing::error!(%why, "SIGUSR2 refused"),
                        None => {
                            // From now on the successor indexes the directory: store nothing here.
                            kept.store.hand_over(true);
                            // ...and starts from this index instead of reading every entry.
                            if let Err(e) = kept.store.write_snapshot() {
                                tracing::warn!(error = %e, "could not write the cache index for the successor; it loads from the entries");
                            }
                            if let Some(p) = &current.pid_file {
                                let _ = std::fs::remove_file(crate::upgrade::failed_file(p));
                            }
                            successor = Some(Box::pin(u.start_successor()));
                        }
                    },
                },
                _ = alrm.recv() => tracing::info!("SIGALRM ignored"),
                _ = hup.recv() => {
                    // `systemctl reload` waits from RELOADING=1 to READY=1, which follows a rejected
                    // reload as well: the old config keeps serving, and the unit is still running.
                    crate::notify::reloading();
                    if let Some(next) = reload(path, &current, kept, shared, probe) {
                        current = next;
                    }
                    crate::notify::ready();
                }
                _ = usr1.recv() => {
                    tracing::info!("SIGUSR1: reopening the access log");
                    if let Some(log) = &kept.access_log {
                        log.reopen();
                    }
                }
            }
        };
        (current, ending)
    }
}

/// Stops: no new connections, idle ones closed, the rest drained within `timeout`.
async fn stop(
    shared: &Arc<Shared>,
    workers: &mut server::workers::Workers,
    draining: &std::sync::atomic::AtomicBool,
    timeout: std::time::Duration,
) {
    // Stop accepting (the listener closes with the accept loop) and close idle connections;
    // responses in flight run to their end or to the drain timeout.
    draining.store(true, std::sync::atomic::Ordering::Relaxed);
    // send_replace, not send: send fails, and keeps `false`, while no accept loop has subscribed
    // yet (a SIGTERM just after start), and the loops would then never see the shutdown.
    shared.shutdown.send_replace(true);
    // Every wait has a deadline: the drain timeout covers the workers' stopping too.
    let deadline = tokio::time::Instant::now() + timeout;
    if tokio::time::timeout_at(deadline, workers.stopped())
        .await
        .is_err()
    {
        tracing::warn!("workers did not stop accepting within the drain timeout; exiting");
    }
    let open = shared.open_connections();
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if shared.drain(left).await {
        tracing::info!(drained = open, "all connections finished; exiting");
    } else {
        tracing::warn!(
            left = shared.open_connections(),
            timeout = ?timeout,
            "drain timeout reached; exiting with connections still open"
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

/// What the dashboard reads and may do: the store, the ledger, the probe, the workers, purges,
/// health (503 while `draining`), the fleet.
fn dashboard_state(
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
    let health_store = store.clone();
    let health_draining = draining.clone();
    let state = Arc::new(DashboardState {
        accounting: accounting.clone(),
        probe: probe.clone(),
        cache: Box::new(move || {
            let (size_bytes, objects) = st.usage();
            CacheStats {
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
                        locks: &Arc::new(FillLocks::default()),
                        hash_bits: 128,
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

/// SIGHUP: re-reads the config; a valid one replaces routes, upstreams, limits and the probe's
/// watch list for new requests, an invalid one is logged and the old one kept.
fn reload(
    path: &Path,
    old: &Config,
    kept: &Kept,
    shared: &Shared,
    probe: &Probe,
) -> Option<Config> {
    let new = match zerocache_config::load_and_check_dirs(path).map_err(|e| e.to_string()) {
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
    let old_ctx = shared.ctx.swap(Arc::new(build_ctx(&new, kept, tls)));
    // Responses in flight keep the old groups until they end; their health checks stop now.
    for group in old_ctx.routes.groups.values() {
        group.retire();
    }
    probe.set_targets(watch_targets(&new));
    tracing::info!(path = %path.display(), routes = new.routes.len(), upstreams = new.upstreams.len(), "config reloaded");
    shared.ctx.load().accounting.config_reload(true);
    Some(new)
}

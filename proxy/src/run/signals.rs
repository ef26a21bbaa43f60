//! How the process ends, and what it answers meanwhile: the signals it takes (SIGTERM, SIGINT and
//! SIGQUIT drain and exit, SIGHUP reloads, SIGUSR1 reopens the access log, SIGUSR2 upgrades),
//! the drain, and a SIGUSR2 upgrade's hand-over to its successor or its failure.

use super::*;

impl Ending {
    /// Says why the drain that follows starts: to systemd, the dashboard and the log. Closes the
    /// socket copies kept for a successor (`upgrade`): a stopping process refuses new clients,
    /// and a replaced one has handed them over.
    /// After the drain of a stop, the index is written for the next process to start from; a
    /// successor has the directory already, and writes its own when it stops.
    pub(super) fn after_drain(&self, kept: &Kept) {
        if let Ending::Stop = self {
            // Nothing is stored or evicted from here on, so the snapshot stays true.
            kept.store.hand_over(true);
            if let Err(e) = kept.store.write_snapshot() {
                tracing::warn!(error = %e, "could not write the cache index for the next start; it loads from the entries");
            }
        }
    }

    pub(super) fn announce(
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

/// Says the process serves: to the process this one replaces (`ready_pipe`, a SIGUSR2
/// successor), which tells systemd our pid (NotifyAccess=main would drop our READY=1 until then,
/// and log it); else to systemd.
pub(super) fn serving(ready_pipe: bool, kept: &Kept) {
    if ready_pipe {
        tracing::info!("serving: telling the process this one replaces to drain");
        crate::upgrade::tell_ready();
        kept.accounting.binary_upgrade(true); // By the process made: the old one exits.
    } else {
        crate::notify::ready();
    }
}

/// An upgrade failed: said in the log and, for `zerocache upgrade`, beside the pid file; and the
/// pid file names this process again (a successor may have written its own before it failed).
pub(super) fn upgrade_failed(current: &Config, why: &str) {
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
pub(super) enum Ending {
    /// SIGTERM, SIGINT or SIGQUIT.
    Stop,
    /// A SIGUSR2 upgrade's successor (this pid) serves on our sockets.
    Upgraded(u32),
}

/// What a SIGUSR2 upgrade needs, with a copy of every listening socket; none (and SIGUSR2 says
/// why) if the program's path cannot be read.
pub(super) fn upgrade_of(
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
pub(super) struct Signals {
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
    pub(super) async fn while_draining(
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

    /// A stop's lame duck: `/healthz` answers 503 `draining` from now on, while the listeners
    /// still accept and every request is served as before for `period`, so a load balancer that
    /// checks the node moves its clients away before any connection is refused. A second
    /// SIGTERM, SIGINT or SIGQUIT ends it early (an operator who means now); other signals are
    /// answered as during the drain. None after an upgrade: the successor serves on the sockets.
    pub(super) async fn lame_duck(
        &mut self,
        ending: &Ending,
        period: std::time::Duration,
        draining: &std::sync::atomic::AtomicBool,
        kept: &Kept,
    ) {
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
        if period.is_zero() || matches!(ending, Ending::Upgraded(_)) {
            return;
        }
        tracing::info!(
            ?period,
            "lame duck: /healthz answers 503 and requests are still served; the listeners close after it (a second SIGTERM closes them now)"
        );
        let over = tokio::time::sleep(period);
        let mut over = std::pin::pin!(over);
        loop {
            tokio::select! {
                () = &mut over => return,
                _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: lame duck ended early"); return }
                _ = self.term.recv() => { tracing::info!("SIGTERM: lame duck ended early"); return }
                _ = self.quit.recv() => { tracing::info!("SIGQUIT: lame duck ended early"); return }
                _ = self.usr2.recv() => tracing::warn!("SIGUSR2 ignored: this process is stopping"),
                _ = self.hup.recv() => tracing::warn!("SIGHUP ignored: this process is stopping"),
                _ = self.alrm.recv() => tracing::info!("SIGALRM ignored"),
                _ = self.usr1.recv() => {
                    if let Some(log) = &kept.access_log {
                        log.reopen();
                    }
                }
            }
        }
    }

    pub(super) fn install() -> std::io::Result<Signals> {
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
    pub(super) async fn serve(
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
pub(super) async fn stop(
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

//! `zerocache watch`: the probe, its dashboard and `/metrics` pointed at other processes, without
//! the proxy or a cache. It answers the question no other tool does: does this server send its
//! files with sendfile, or does it copy them through user space, and on which connections?
//!
//! Targets come from `--pid`/`--comm` (repeatable; names re-resolved every second, so restarted
//! workers are picked up) or the watch-only config file (`config/src/watch.rs`); flags override
//! the file. Copy-loop detection is on for every target (see `ebpf/kernel/src/copy_loop.rs`). In a
//! terminal it prints a table every second; `--once` prints one after `--duration` seconds and
//! exits 0; `--json` prints the `/api/processes` objects instead. The probe sees global PIDs and
//! reads `/proc`: run it in the host PID namespace (a container needs `--pid=host`). See
//! docs/watch.md.

pub mod caps;
pub mod table;

use anyhow::Context;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use zerocache_config::watch::{WatchConfig, load_watch};
use zerocache_config::{Keyword, WatchEntry};
use zerocache_dashboard::peers::Peers;
use zerocache_dashboard::processes;
use zerocache_dashboard::watch::{WatchState, serve_watch};
use zerocache_probe::{Probe, ProbeOptions, WatchTarget};

/// The `zerocache watch` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct WatchArgs {
    /// Watch this process (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Watch every process with this name, as in /proc/PID/comm (repeatable; re-resolved every
    /// second).
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
    /// Serve the dashboard, API and /metrics here [default: 127.0.0.1:9181; with --once, none
    /// unless given].
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<String>,
    /// Serve no dashboard.
    #[arg(long, conflicts_with = "dashboard")]
    pub no_dashboard: bool,
    /// A watch-mode config file (`watch:`, `dashboard:`, `logging:`); flags override it.
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one table after --duration seconds and exit 0.
    #[arg(long)]
    pub once: bool,
    /// Seconds to watch before the table of --once.
    #[arg(long, value_name = "S", default_value_t = 5.0, requires = "once")]
    pub duration: f64,
    /// Print JSON (the objects of /api/processes) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What the arguments and the file add up to.
struct Plan {
    targets: Vec<WatchTarget>,
    names: Vec<String>,
    dashboard: Option<String>,
    config: WatchConfig,
}

fn plan(args: &WatchArgs) -> Result<Plan, zerocache_config::ConfigError> {
    let config = match &args.config {
        Some(path) => load_watch(path)?,
        None => WatchConfig::default(),
    };
    let mut targets: Vec<WatchTarget> = args
        .pids
        .iter()
        .map(|p| WatchTarget::Pid(*p))
        .chain(args.comms.iter().map(|c| WatchTarget::Comm(c.clone())))
        .collect();
    if targets.is_empty() {
        targets = config
            .watch
            .iter()
            .filter_map(|w| match w {
                WatchEntry::Pid { pid } => Some(WatchTarget::Pid(*pid)),
                WatchEntry::Comm { comm } => Some(WatchTarget::Comm(comm.clone())),
                WatchEntry::Keyword(Keyword::SelfProcess) => None,
            })
            .collect();
    }
    let names = targets
        .iter()
        .filter_map(|t| match t {
            WatchTarget::Comm(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    let dashboard = if args.no_dashboard || !config.dashboard.enabled && args.dashboard.is_none() {
        None
    } else if let Some(addr) = &args.dashboard {
        Some(addr.clone())
    } else if args.once {
        None
    } else {
        Some(config.dashboard.listen.clone())
    };
    Ok(Plan {
        targets,
        names,
        dashboard,
        config,
    })
}

/// Runs `zerocache watch`; `init_logging` sets up the log at the config's level.
pub fn main(args: WatchArgs, init_logging: fn(&str)) -> ExitCode {
    if !(args.duration.is_finite() && args.duration >= 0.0 && args.duration <= 86_400.0) {
        eprintln!("error: --duration must be a number of seconds from 0 to 86400");
        return ExitCode::from(2);
    }
    for c in &args.comms {
        if c.is_empty() || c.len() > 15 {
            eprintln!(
                "error: --comm {c:?}: a process name has 1 to 15 bytes (as in /proc/PID/comm)"
            );
            return ExitCode::from(2);
        }
    }
    let plan = match plan(&args) {
        Ok(p) => p,
        Err(e) => {
            for one in e.each() {
                eprintln!("error: {one}");
            }
            return ExitCode::FAILURE;
        }
    };
    init_logging(&plan.config.logging.level);
    match caps::effective() {
        Some(eff) => {
            let missing = caps::missing(eff, &caps::REQUIRED);
            if !missing.is_empty() {
                eprintln!("error: {}", caps::explain(&missing));
                return ExitCode::FAILURE;
            }
            if !caps::missing(eff, &[caps::PTRACE]).is_empty() {
                eprintln!(
                    "warning: no {} ({}); processes of other users show no sockets or peers",
                    caps::PTRACE.name,
                    caps::PTRACE.why
                );
            }
        }
        None => eprintln!("warning: cannot read /proc/self/status to check capabilities"),
    }
    // Two workers: the probe's ring-buffer reader reads a new connection's peer from /proc while
    // the connection is open, and must not wait behind a dashboard request or the table.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args, plan)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: WatchArgs, plan: Plan) -> anyhow::Result<()> {
    let probe = Probe::start(ProbeOptions {
        enabled: true,
        watch: plan.targets.clone(),
        closed_capacity: 10_000,
    });
    if let zerocache_probe::ProbeStatus::Unavailable { reason } = probe.status() {
        anyhow::bail!("the probe is unavailable: {reason}");
    }
    probe.set_copy_loop(true);
    let peers = Peers::start(probe.clone(), std::process::id());
    if let Some(addr) = &plan.dashboard {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (--dashboard, dashboard.listen)"))?;
        let bound = listener.local_addr()?;
        let d = &plan.config.dashboard;
        let state = Arc::new(WatchState {
            probe: probe.clone(),
            peers: peers.clone(),
            names: plan.names.clone(),
            token: d.token.clone(),
            allowed_hosts: d.allowed_hosts.clone(),
            metrics_require_token: d.metrics_require_token,
        });
        eprintln!("dashboard: http://{bound}/  metrics: http://{bound}/metrics");
        tokio::spawn(async move {
            if let Err(e) = serve_watch(listener, state).await {
                tracing::error!(error = %e, "watch dashboard stopped");
            }
        });
    }
    if args.once {
        tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
        print(&probe, args.json, false)?;
        return Ok(());
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let live = std::io::stdout().is_terminal() && !args.json;
    loop {
        tokio::select! {
            _ = tick.tick() => print(&probe, args.json, live)?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        }
    }
}

/// One table (or one JSON document) on stdout; `live` clears the terminal first, as `top` does.
fn print(probe: &Probe, json: bool, live: bool) -> anyhow::Result<()> {
    let rows = processes::rows(probe);
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &rows)?;
        out.write_all(b"\n")?;
    } else {
        if live {
            out.write_all(b"\x1b[H\x1b[2J")?;
        }
        out.write_all(table::render(&rows).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

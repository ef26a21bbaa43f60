//! The `zerocache` command: `run`, `check`, `check-cache`, `probe-check`, `upgrade` and `watch`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// An HTTP/1.1 edge cache that serves hits with sendfile(2) and proves it with an eBPF probe.
#[derive(Parser)]
#[command(name = "zerocache", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy in the foreground until SIGINT or SIGTERM.
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a config file without connecting to anything; exit 0 if valid, 1 if not.
    Check {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
        /// Print the effective config as JSON instead of YAML.
        #[arg(long)]
        json: bool,
        /// Print nothing when the config is valid (errors still go to stderr, or to stdout as
        /// JSON with --json): for systemd's ExecStartPre= and ExecReload=, whose output would
        /// otherwise fill the journal, and for scripts.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Verify every entry of the configured cache directory, without running the proxy.
    ///
    /// Checks each entry file's header and body checksums; prints `corrupt: <path> <key>` per
    /// corrupt entry and `checked N entries, M corrupt, K unreadable`; exit 0 if none is corrupt
    /// or unreadable, 1 if not.
    CheckCache {
        /// The YAML config file (its `cache.path` is checked).
        #[arg(short, long)]
        config: PathBuf,
        /// Delete the corrupt entries.
        #[arg(long)]
        remove: bool,
    },
    /// Load and attach every probe program on this kernel, print one line per program (ok, or
    /// missing and why), detach, and exit 1 if the proxy's accounting would be incomplete here.
    /// Writes nothing; needs the probe's privileges (root, or CAP_BPF, CAP_PERFMON and
    /// CAP_DAC_READ_SEARCH).
    ProbeCheck {
        /// Print the report as JSON (the dashboard's `/api/probe` object).
        #[arg(long)]
        json: bool,
    },
    /// Upgrade the running proxy to the binary now installed, refusing no connection (nginx's
    /// SIGUSR2): checks the config, signals the process `pid_file` names, waits until its
    /// successor serves and it has drained; exit 0 once the successor serves, 1 if it did not (the
    /// running process keeps serving and logs why).
    Upgrade {
        /// The YAML config file (its `pid_file` names the running process).
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Write the manual pages (zerocache(8), one per subcommand, zerocache.yaml(5)) into a
    /// directory: how docs/man/ is made.
    #[command(hide = true)]
    Man {
        /// Where the pages go (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Watch other processes with the probe, without the proxy: bytes by syscall per process and
    /// connection, and copy loops (file bytes read and written to a socket where sendfile would
    /// do). A dashboard on 127.0.0.1:9181. Needs CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH.
    Watch(zerocache::watch::WatchArgs),
}

/// Logs to stderr at `RUST_LOG` if set, else at `level` (the config's `logging.level`), in
/// colour only when stderr is a terminal: journald, files and pipes get plain text.
fn init_logging(level: &str) {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            config,
            json,
            quiet,
        } => {
            init_logging(if quiet { "error" } else { "warn" });
            check(&config, json, quiet)
        }
        Command::CheckCache { config, remove } => {
            init_logging("warn");
            check_cache(&config, remove)
        }
        Command::ProbeCheck { json } => {
            init_logging("error");
            zerocache::probe_check::main(json)
        }
        Command::Run { config: path } => run(path),
        Command::Upgrade { config } => {
            init_logging("warn");
            zerocache::upgrade_command::main(
                &config,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            )
        }
        Command::Watch(args) => zerocache::watch::main(args, init_logging),
        Command::Man { out } => {
            use clap::CommandFactory;
            match zerocache::man_pages::write(Cli::command(), &out) {
                Ok(pages) => {
                    for p in pages {
                        println!("{}", p.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: writing the manual pages to {}: {e}", out.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_cache(config: &std::path::Path, remove: bool) -> ExitCode {
    // Not `load_and_check_dirs`: checking must not create the cache directory.
    let c = match zerocache_config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = &c.cache.path;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    match zerocache::exports::check_dir(dir, remove, &mut out, &mut err) {
        Ok(report) => {
            println!("{}", report.summary());
            if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: cache directory {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn check(config: &std::path::Path, json: bool, quiet: bool) -> ExitCode {
    // The certificate and key files are parsed too, as start-up will: a bad one fails here.
    // Creates nothing: a check says whether a start would work, and `run` makes the directory.
    let loaded = zerocache_config::load_and_check_dirs(config, zerocache_config::Dirs::Untouched)
        .and_then(|c| {
        for name in zerocache_config::tls::unverified_upstreams(&c) {
            eprintln!(
                "warning: upstreams.{name}.tls.verify is false: the origin's certificate is NOT verified, and anyone on the path can impersonate it"
            );
        }
        match zerocache::exports::check_tls(&c) {
            Ok(()) => Ok(c),
            Err(e) => Err(zerocache_config::tls::file_error(
                config, &c, &e.path, &e.what,
            )),
        }
    });
    if let Ok(c) = &loaded
        && let Some(why) = zerocache::exports::clock_refusal(c)
    {
        eprintln!("error: {}: {why}", config.display());
        return ExitCode::FAILURE;
    }
    // The effective config is printed for people and logs: its secrets are not.
    let loaded = loaded.map(|c| c.redacted());
    match loaded {
        Ok(_) if quiet => ExitCode::SUCCESS,
        Ok(c) if json => match serde_json::to_string_pretty(&c) {
            // Sizes are numbers of bytes here (the schema serialises them so).
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(c) => match serde_yaml::to_string(&c) {
            Ok(s) => {
                println!("{s}");
                // Every size as the proxy will use it, and in binary units.
                println!("# sizes, in bytes:");
                for (key, bytes) in c.sizes() {
                    println!(
                        "#   {key}: {bytes} ({})",
                        zerocache_config::units::binary(bytes)
                    );
                }
                // Whom each https upstream trusts, so a pin, a CA file and no check at all are
                // told apart before a rollout.
                if let Some(k) = zerocache::exports::ktls_summary(&c) {
                    println!("# tls.ktls {k}");
                }
                let trust = zerocache::exports::upstream_trust(&c);
                if !trust.is_empty() {
                    println!("# upstream TLS trust:");
                    for (name, how) in trust {
                        println!("#   upstreams.{name}: {how}");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) if json => {
            // Machines get the errors as JSON too, on stdout, with the same exit status.
            let errors: Vec<serde_json::Value> = e
                .each()
                .into_iter()
                .map(|e| match e {
                    zerocache_config::ConfigError::At {
                        file,
                        line,
                        column,
                        message,
                    } => serde_json::json!({
                        "file": file, "line": line, "column": column, "message": message,
                    }),
                    other => serde_json::json!({ "message": other.to_string() }),
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({ "valid": false, "errors": errors })
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            for one in e.each() {
                eprintln!("error: {one}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(path: PathBuf) -> ExitCode {
    let config = match zerocache_config::load_and_check_dirs(&path, zerocache_config::Dirs::Create)
    {
        Ok(c) => c,
        Err(e) => {
            for one in e.each() {
                eprintln!("error: {one}");
            }
            // Started by an upgrade: the running process and `zerocache upgrade` say why.
            zerocache::exports::tell_upgrade_failed(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    init_logging(&config.logging.level);
    // The control plane: signals, the dashboard, the probe's reader. Connections run on the
    // data-plane workers (`server::workers`), one per core.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(zerocache::run::run(config, path));
    // The drain is over: a blocking-pool task still running (a cold-hit read on a stuck disk)
    // must not hold the exit, as dropping the runtime would.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            zerocache::exports::tell_upgrade_failed(&format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

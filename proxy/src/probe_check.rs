//! `zerocache probe-check`: loads and attaches every program of the probe on this kernel, the
//! copy-loop read side included, prints one line per program (ok, or missing and why), then
//! detaches everything and exits. For operators before a rollout, as `bpftool feature probe` is:
//! it writes nothing, serves nothing, and exits 1 when the proxy's own accounting would be
//! incomplete on this kernel (a copy-loop program missing only costs `zerocache watch`).

use std::process::ExitCode;
use zerocache_probe::{Probe, ProbeOptions, ProbeStatus, ProgramState, WatchTarget};

/// Runs the check; `json` prints `/api/probe`'s object instead of the lines.
pub fn main(json: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let probe = Probe::start(ProbeOptions {
            enabled: true,
            watch: vec![WatchTarget::SelfProcess],
            closed_capacity: 1,
        });
        // The read side attaches only while detection is wanted and a process is watched: this
        // process is, so it is tried here exactly as `zerocache watch` would.
        probe.set_copy_loop(true);
        let copy_loop = probe.copy_loop();
        let status = probe.status().clone();
        if json {
            let report = zerocache_dashboard::probe_state::report(&probe);
            match serde_json::to_string_pretty(&report) {
                Ok(s) => println!("{s}"),
                Err(e) => eprintln!("error: {e}"),
            }
        } else {
            println!(
                "kernel {} (the probe needs {} or later)",
                zerocache_probe::kernel_release(),
                zerocache_probe::MINIMUM_KERNEL
            );
            for p in status.programs() {
                println!("{}", line(p));
            }
            let read_side = if copy_loop.attached {
                "ok       exit_read (copy_loop): syscalls/sys_exit_{read,pread64,readv,preadv,preadv2}"
                    .to_string()
            } else {
                format!(
                    "missing  exit_read (copy_loop): {}",
                    copy_loop.error.as_deref().unwrap_or("not attached")
                )
            };
            if !matches!(status, ProbeStatus::Unavailable { .. }) {
                println!("{read_side}");
            }
            match &status {
                ProbeStatus::Attached { attachments, .. } => println!(
                    "probe: complete ({attachments} attachments): the proxy's accounting is whole on this kernel"
                ),
                ProbeStatus::Partial { reason, .. } => println!("probe: partial: {reason}"),
                ProbeStatus::Unavailable { reason } => println!("probe: unavailable: {reason}"),
                ProbeStatus::Disabled => println!("probe: disabled"),
            }
        }
        probe.set_copy_loop(false);
        if status.is_attached() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

/// `ok       exit_sendfile (accounting): syscalls/sys_exit_sendfile64`, or `missing` with the
/// reason and what it costs.
fn line(p: &ProgramState) -> String {
    let role = serde_json::to_value(p.role)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let variant = p
        .variant
        .as_deref()
        .map(|v| format!(" ({v})"))
        .unwrap_or_default();
    if p.attached {
        format!(
            "ok       {} ({role}): {}{variant}",
            p.program,
            p.tracepoints.join(", ")
        )
    } else {
        format!(
            "missing  {} ({role}): {}; {}",
            p.program,
            p.reason.as_deref().unwrap_or("not attached"),
            p.role.cost()
        )
    }
}

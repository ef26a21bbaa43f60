//! The probe's own state, the same on both dashboards (the proxy's and `zerocache watch`'s):
//! `/api/probe`, the probe families of `/metrics`, and the lines that say what a missing program
//! costs. One definition, so a partial probe reads the same wherever it is looked at.

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use zerocache_probe::{CopyLoopStatus, Probe, ProbeStatus, ProgramState, Snapshot};

/// `/api/probe`: the kernel, the floor, the status and every program with its state.
#[derive(Serialize)]
pub struct ProbeReport {
    /// `uname -r` of the running kernel.
    pub kernel: String,
    /// The oldest kernel the probe loads on.
    pub minimum_kernel: &'static str,
    /// Attached, partial, disabled or unavailable, and why.
    pub status: ProbeStatus,
    /// Every program attached at load, and the copy-loop read side.
    pub programs: Vec<ProgramState>,
    /// Copy-loop detection (watch mode).
    pub copy_loop: CopyLoopStatus,
}

/// Builds `/api/probe`.
pub fn report(probe: &Probe) -> ProbeReport {
    let status = probe.status().clone();
    ProbeReport {
        kernel: zerocache_probe::kernel_release(),
        minimum_kernel: zerocache_probe::MINIMUM_KERNEL,
        programs: status.programs().to_vec(),
        status,
        copy_loop: probe.copy_loop(),
    }
}

/// One line per missing program: which, why, and what that costs.
pub fn gaps(status: &ProbeStatus) -> Vec<String> {
    status
        .programs()
        .iter()
        .filter(|p| !p.attached)
        .map(|p| {
            format!(
                "{} is not attached ({}): {}.",
                p.program,
                p.reason.as_deref().unwrap_or("unknown reason"),
                p.role.cost()
            )
        })
        .collect()
}

/// `zerocache_probe_up`, `zerocache_probe_programs` and `zerocache_probe_lost_total`, in `r`.
pub(crate) fn register(r: &Registry, snap: &Snapshot) -> prometheus::Result<()> {
    let up = IntGauge::new(
        "zerocache_probe_up",
        "1 when the eBPF probe is attached with every program the proxy's own accounting needs.",
    )?;
    up.set(snap.status.is_attached() as i64);
    r.register(Box::new(up))?;
    let programs = IntGaugeVec::new(
        Opts::new(
            "zerocache_probe_programs",
            "1 for each probe program in its state (attached or missing; /api/probe says why).",
        ),
        &["program", "state"],
    )?;
    for p in snap.status.programs() {
        let state = if p.attached { "attached" } else { "missing" };
        programs.with_label_values(&[&p.program, state]).set(1);
    }
    r.register(Box::new(programs))?;
    let lost = crate::metrics::counter_vec(
        r,
        "zerocache_probe_lost_total",
        "Probe records lost since start, by what was lost (never silent).",
        &["what"],
    )?;
    lost.with_label_values(&["events"])
        .inc_by(snap.health.events_lost);
    lost.with_label_values(&["fd_records"])
        .inc_by(snap.health.fd_records_lost);
    Ok(())
}

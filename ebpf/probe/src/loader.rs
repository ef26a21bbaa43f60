//! Loading and attaching the BPF object. Kernel-facing and nothing else: policy (what counts as a
//! violation, how a connection is named) lives with the consumers.
//!
//! Per program, not all or nothing: the object loads (its maps) or the probe is unavailable with
//! the reason; then each program's record reads are checked against the kernel's tracepoint
//! formats, and it is loaded and attached on its own, so a kernel that refuses one program loses
//! that program's figures and says so, and keeps the rest.

use crate::fd_table::FdTable;
use crate::maps::Maps;
use crate::model::{ProgramRole, ProgramState};
use crate::read_side::{self, ReadSide};
use crate::{btf, kernel, tracefs};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfLoader};
use zerocache_probe_common::{FdInfo, FdKey, MAX_WATCHED, exit_mode, layout};

static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/zerocache-probe-bpf"));

/// One program the probe attaches when it loads: what it is for, its tracepoints, and the record
/// fields it reads (name, offset, size), which are checked against each tracepoint's format first.
pub(crate) struct Spec {
    pub(crate) program: &'static str,
    pub(crate) role: ProgramRole,
    pub(crate) tracepoints: &'static [(&'static str, &'static str)],
    pub(crate) reads: &'static [(&'static str, usize, usize)],
}

const RET: (&str, usize, usize) = ("ret", layout::SYSCALL_RET, 8);
const FD0: (&str, usize, usize) = ("fd", layout::SYSCALL_ARG0, 8);

const fn exit(program: &'static str, tracepoints: &'static [(&'static str, &'static str)]) -> Spec {
    Spec {
        program,
        role: ProgramRole::Accounting,
        tracepoints,
        reads: &[RET],
    }
}

/// Every program attached at load. Output syscalls are seen only at their exit, where the return
/// value is known and the arguments are still in the saved registers: one program run per call
/// instead of an enter and an exit with a per-thread map between them. The copy-loop read side is
/// attached at run time (`read_side`).
pub(crate) const PROGRAMS: &[Spec] = &[
    exit("exit_sendfile", &[("syscalls", "sys_exit_sendfile64")]),
    exit("exit_splice", &[("syscalls", "sys_exit_splice")]),
    exit("exit_write", &[("syscalls", "sys_exit_write")]),
    exit("exit_writev", &[("syscalls", "sys_exit_writev")]),
    exit("exit_sendto", &[("syscalls", "sys_exit_sendto")]),
    exit("exit_sendmsg", &[("syscalls", "sys_exit_sendmsg")]),
    exit("exit_sendmmsg", &[("syscalls", "sys_exit_sendmmsg")]),
    exit(
        "exit_accept",
        &[
            ("syscalls", "sys_exit_accept"),
            ("syscalls", "sys_exit_accept4"),
        ],
    ),
    exit("exit_socket", &[("syscalls", "sys_exit_socket")]),
    Spec {
        program: "enter_close",
        role: ProgramRole::Accounting,
        tracepoints: &[("syscalls", "sys_enter_close")],
        reads: &[FD0],
    },
    Spec {
        program: "enter_dup",
        role: ProgramRole::Accounting,
        tracepoints: &[
            ("syscalls", "sys_enter_dup2"),
            ("syscalls", "sys_enter_dup3"),
        ],
        reads: &[
            ("oldfd", layout::SYSCALL_ARG0, 8),
            ("newfd", layout::SYSCALL_ARG1, 8),
        ],
    },
    Spec {
        program: "enter_close_range",
        role: ProgramRole::Accounting,
        tracepoints: &[("syscalls", "sys_enter_close_range")],
        reads: &[FD0, ("max_fd", layout::SYSCALL_ARG1, 8)],
    },
    Spec {
        program: "enter_io_uring",
        role: ProgramRole::IoUring,
        tracepoints: &[("syscalls", "sys_enter_io_uring_enter")],
        reads: &[],
    },
    // Reads `group_dead` only where the record has it: see [`exit_mode`].
    Spec {
        program: "sched_exit",
        role: ProgramRole::ProcessExits,
        tracepoints: &[("sched", "sched_process_exit")],
        reads: &[],
    },
];

/// Why the probe could not load at all, phrased for an operator. A program that cannot load or
/// attach is not among these: it is reported missing in its [`ProgramState`] and the rest run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error(
        "loading the BPF object failed on kernel {release}: {error} (loading BPF needs root, or CAP_BPF and CAP_PERFMON; unprivileged BPF is disabled on this kernel)"
    )]
    Load { release: String, error: String },
    #[error("{0}")]
    Floor(String),
    #[error("the BPF object has no {0}: it does not match this loader")]
    Missing(&'static str),
    #[error("the probe reads x86-64 syscall registers and does not support {0} yet")]
    Arch(&'static str),
    #[error(
        "cannot read task_struct.tgid from the kernel's BTF ({path}): {error} (the probe needs a kernel built with CONFIG_DEBUG_INFO_BTF)"
    )]
    Btf { path: &'static str, error: String },
    #[error("cannot count the possible CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("BPF map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
}

/// What [`load_and_attach`] hands the probe.
pub(crate) struct Loaded {
    pub(crate) ebpf: Ebpf,
    pub(crate) maps: Maps,
    /// FD_INFO again, read alone (see `Probe::generation`).
    pub(crate) fd_info_reader: HashMap<MapData, FdKey, FdInfo>,
    pub(crate) ring: RingBuf<MapData>,
    pub(crate) attachments: usize,
    /// Every program of [`PROGRAMS`], attached or missing and why.
    pub(crate) programs: Vec<ProgramState>,
    /// The read side's state: why it cannot work on this kernel, if it cannot.
    pub(crate) read_side: ReadSide,
}

/// How `sched_exit` tells the last thread on this kernel: the record's `group_dead` where the
/// format has it where the program reads it, else `signal->live` at offsets from BTF.
fn exit_mode_for(vmlinux: &[u8]) -> Result<(u32, [u32; 2], String), String> {
    let tp = "sched/sched_process_exit";
    let fields = tracefs::format("sched", "sched_process_exit")?;
    let group_dead = ("group_dead", layout::SCHED_EXIT_GROUP_DEAD, 1);
    match tracefs::check(&fields, tp, &[group_dead]) {
        Ok(()) => Ok((exit_mode::RECORD, [0, 0], "group_dead in the record".into())),
        Err(why) => {
            let offsets = btf::member_offset(vmlinux, "task_struct", "signal")
                .and_then(|a| Ok([a, btf::member_offset(vmlinux, "signal_struct", "live")?]))
                .map_err(|e| format!("{why}, and the fallback cannot read signal->live: {e}"))?;
            Ok((
                exit_mode::SIGNAL_LIVE,
                offsets,
                "task->signal->live (the record has no group_dead)".into(),
            ))
        }
    }
}

pub(crate) fn load_and_attach() -> Result<Loaded, StartError> {
    // The exit programs read syscall arguments at x86-64 `pt_regs` offsets.
    if !cfg!(target_arch = "x86_64") {
        return Err(StartError::Arch(std::env::consts::ARCH));
    }
    let btf_error = |e: &dyn std::fmt::Display| StartError::Btf {
        path: btf::VMLINUX,
        error: e.to_string(),
    };
    let vmlinux = std::fs::read(btf::VMLINUX).map_err(|e| btf_error(&e))?;
    kernel::check_floor(&vmlinux).map_err(StartError::Floor)?;
    let tgid_offset =
        btf::member_offset(&vmlinux, "task_struct", "tgid").map_err(|e| btf_error(&e))?;
    // The copy-loop read side's offsets. A kernel without one of these members still gets the
    // rest of the probe; the read side then says why it is unavailable.
    let mut read_side = ReadSide::default();
    let file_offsets = read_side::offsets(&vmlinux).unwrap_or_else(|e| {
        read_side.error = Some(format!(
            "copy-loop detection needs kernel struct offsets from {}: {e}",
            btf::VMLINUX
        ));
        [0; 8]
    });
    let exit = exit_mode_for(&vmlinux);
    drop(vmlinux);
    let (mode, [task_signal, signal_live]) = match &exit {
        Ok((mode, offsets, _)) => (*mode, *offsets),
        Err(_) => (exit_mode::RECORD, [0, 0]),
    };
    kernel::raise_memlock();
    let mut loader = EbpfLoader::new();
    loader.override_global("TGID_OFFSET", &tgid_offset, true);
    loader.override_global("EXIT_MODE", &mode, true);
    loader.override_global("TASK_SIGNAL", &task_signal, true);
    loader.override_global("SIGNAL_LIVE", &signal_live, true);
    for ((global, _, _), offset) in read_side::OFFSETS.iter().zip(file_offsets.iter()) {
        loader.override_global(global, offset, true);
    }
    let mut ebpf = loader.load(OBJECT).map_err(|e| StartError::Load {
        release: kernel::release(),
        error: e.to_string(),
    })?;
    let mut attachments = 0;
    let mut programs = Vec::with_capacity(PROGRAMS.len());
    for spec in PROGRAMS {
        let mut state = ProgramState {
            program: spec.program.to_string(),
            role: spec.role,
            tracepoints: spec
                .tracepoints
                .iter()
                .map(|(c, n)| format!("{c}/{n}"))
                .collect(),
            attached: false,
            reason: None,
            variant: None,
        };
        let prerequisite = if spec.program == "sched_exit" {
            exit.as_ref()
                .map(|(_, _, v)| state.variant = Some(v.clone()))
        } else {
            Ok(())
        };
        match prerequisite
            .map_err(|e| e.clone())
            .and_then(|()| attach(&mut ebpf, spec))
        {
            Ok(n) => {
                attachments += n;
                state.attached = true;
            }
            Err(reason) => {
                tracing::warn!(program = spec.program, %reason, cost = spec.role.cost(), "probe program missing");
                state.reason = Some(reason);
            }
        }
        programs.push(state);
    }
    let take =
        |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(StartError::Missing(name));
    // A second handle on FD_INFO, for the generation lookup at each accept
    // (`Probe::generation`): under a lock of its own, not the maps' lock that long walks hold.
    let fd_info_reader = {
        let aya::maps::Map::HashMap(data) =
            ebpf.map("FD_INFO").ok_or(StartError::Missing("FD_INFO"))?
        else {
            return Err(StartError::Missing("FD_INFO"));
        };
        let fd = std::os::fd::AsFd::as_fd(data.fd())
            .try_clone_to_owned()
            .map_err(|e| StartError::Map("FD_INFO", aya::maps::MapError::from(e)))?;
        let data = MapData::from_fd(fd).map_err(|e| StartError::Map("FD_INFO", e))?;
        HashMap::try_from(aya::maps::Map::HashMap(data))
            .map_err(|e| StartError::Map("FD_INFO", e))?
    };
    let maps = Maps {
        watched: HashMap::try_from(take(&mut ebpf, "WATCHED")?)
            .map_err(|e| StartError::Map("WATCHED", e))?,
        watch_filter: Array::try_from(take(&mut ebpf, "WATCH_FILTER")?)
            .map_err(|e| StartError::Map("WATCH_FILTER", e))?,
        fd_info: HashMap::try_from(take(&mut ebpf, "FD_INFO")?)
            .map_err(|e| StartError::Map("FD_INFO", e))?,
        fd_table: FdTable::new(take(&mut ebpf, "FD_TABLE")?)
            .map_err(|e| StartError::Map("FD_TABLE", e))?,
        fd_records: HashMap::try_from(take(&mut ebpf, "FD_RECORDS")?)
            .map_err(|e| StartError::Map("FD_RECORDS", e))?,
        totals: PerCpuArray::try_from(take(&mut ebpf, "TOTALS")?)
            .map_err(|e| StartError::Map("TOTALS", e))?,
        stats: Array::try_from(take(&mut ebpf, "STATS")?)
            .map_err(|e| StartError::Map("STATS", e))?,
        pending: Array::try_from(take(&mut ebpf, "PENDING")?)
            .map_err(|e| StartError::Map("PENDING", e))?,
        switches: Array::try_from(take(&mut ebpf, "SWITCHES")?)
            .map_err(|e| StartError::Map("SWITCHES", e))?,
        free_indexes: (0..MAX_WATCHED).collect(),
        cpus: aya::util::nr_cpus().map_err(|(_, e)| StartError::Cpus(e))?,
    };
    let ring =
        RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(|e| StartError::Map("EVENTS", e))?;
    Ok(Loaded {
        ebpf,
        maps,
        fd_info_reader,
        ring,
        attachments,
        programs,
        read_side,
    })
}

/// Checks `spec`'s record reads against this kernel's formats, loads the program and attaches it
/// to every one of its tracepoints, or none: the number of attachments, or why not.
fn attach(ebpf: &mut Ebpf, spec: &Spec) -> Result<usize, String> {
    for (category, name) in spec.tracepoints {
        let fields = tracefs::format(category, name)?;
        tracefs::check(&fields, &format!("{category}/{name}"), spec.reads)?;
    }
    let program = spec.program;
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("the BPF object has no program {program}"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| rejected(program, e))?;
    }
    let mut links = Vec::with_capacity(spec.tracepoints.len());
    for (category, name) in spec.tracepoints {
        match prog.attach(category, name) {
            Ok(link) => links.push(link),
            Err(e) => {
                for link in links {
                    let _ = prog.detach(link);
                }
                return Err(attach_failed(program, category, name, &e));
            }
        }
    }
    Ok(links.len())
}

/// The verifier's refusal in a sentence: the kernel, the program and the error; the verifier's
/// own log goes to the debug log, where whoever debugs the probe looks for it.
pub(crate) fn rejected(program: &str, e: ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            tracing::debug!(program, log = %verifier_log, "verifier log");
            format!(
                "the verifier of kernel {} rejected {program}: {io_error}",
                kernel::release()
            )
        }
        other => format!(
            "loading {program} failed on kernel {}: {}",
            kernel::release(),
            os_error(&other).unwrap_or_else(|| other.to_string())
        ),
    }
}

/// An attach failure in a sentence, with the tracefs hint where access was the problem.
pub(crate) fn attach_failed(program: &str, category: &str, name: &str, e: &ProgramError) -> String {
    let error = os_error(e).unwrap_or_else(|| e.to_string());
    let hint = if error.contains("tracefs") || error.contains("ermission") {
        " (tracefs at /sys/kernel/tracing must be mounted and readable: mount it with `mount -t tracefs nodev /sys/kernel/tracing`; it is mode 0700, so a non-root service needs CAP_DAC_READ_SEARCH)"
    } else {
        ""
    };
    format!(
        "kernel {} refused to attach {program} to {category}/{name}: {error}{hint}",
        kernel::release()
    )
}

/// The operating system's error under an aya error, without aya's name for the syscall.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.to_string());
        }
        cur = err.source();
    }
    None
}

//! Loading and attaching the BPF object. Kernel-facing and nothing else: policy (what counts as a
//! violation, how a connection is named) lives with the consumers.

use crate::btf;
use crate::fd_table::FdTable;
use crate::maps::Maps;
use crate::read_side::{self, ReadSide};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfError, EbpfLoader};
use zerocache_probe_common::MAX_WATCHED;

static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/zerocache-probe-bpf"));

/// (program, category, tracepoint) for every attachment. Output syscalls are seen only at their
/// exit, where the return value is known and the arguments are still in the saved registers: one
/// program run per call instead of an enter and an exit with a per-thread map between them.
const ATTACHMENTS: &[(&str, &str, &str)] = &[
    ("exit_sendfile", "syscalls", "sys_exit_sendfile64"),
    ("exit_splice", "syscalls", "sys_exit_splice"),
    ("exit_write", "syscalls", "sys_exit_write"),
    ("exit_writev", "syscalls", "sys_exit_writev"),
    ("exit_sendto", "syscalls", "sys_exit_sendto"),
    ("exit_sendmsg", "syscalls", "sys_exit_sendmsg"),
    ("exit_sendmmsg", "syscalls", "sys_exit_sendmmsg"),
    ("exit_accept", "syscalls", "sys_exit_accept"),
    ("exit_accept", "syscalls", "sys_exit_accept4"),
    ("exit_socket", "syscalls", "sys_exit_socket"),
    ("enter_close", "syscalls", "sys_enter_close"),
    ("enter_dup", "syscalls", "sys_enter_dup2"),
    ("enter_dup", "syscalls", "sys_enter_dup3"),
    ("enter_close_range", "syscalls", "sys_enter_close_range"),
    ("enter_io_uring", "syscalls", "sys_enter_io_uring_enter"),
    ("sched_exit", "sched", "sched_process_exit"),
];

/// Why loading or attaching failed, phrased for an operator.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error(
        "loading the BPF object failed: {0} (loading BPF needs root, or CAP_BPF and CAP_PERFMON; unprivileged BPF is disabled on this kernel)"
    )]
    Load(#[source] EbpfError),
    #[error("the kernel's verifier rejected program {program}: {error}\nverifier log:\n{log}")]
    Verifier {
        program: String,
        error: String,
        log: String,
    },
    #[error("attaching {program} to {category}/{name} failed: {error}{hint}")]
    Attach {
        program: String,
        category: String,
        name: String,
        error: String,
        hint: &'static str,
    },
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
    pub(crate) ring: RingBuf<MapData>,
    pub(crate) attachments: usize,
    /// The read side's state: why it cannot work on this kernel, if it cannot.
    pub(crate) read_side: ReadSide,
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
    drop(vmlinux);
    let mut loader = EbpfLoader::new();
    loader.override_global("TGID_OFFSET", &tgid_offset, true);
    for ((global, _, _), offset) in read_side::OFFSETS.iter().zip(file_offsets.iter()) {
        loader.override_global(global, offset, true);
    }
    let mut ebpf = loader.load(OBJECT).map_err(StartError::Load)?;
    let mut attachments = 0;
    for (program, category, name) in ATTACHMENTS {
        let prog: &mut TracePoint = ebpf
            .program_mut(program)
            .ok_or(StartError::Missing("program"))?
            .try_into()
            .map_err(|_| StartError::Missing("tracepoint program"))?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| match e {
                ProgramError::LoadError {
                    io_error,
                    verifier_log,
                } => StartError::Verifier {
                    program: program.to_string(),
                    error: io_error.to_string(),
                    log: verifier_log.to_string(),
                },
                other => StartError::Verifier {
                    program: program.to_string(),
                    error: other.to_string(),
                    log: String::new(),
                },
            })?;
        }
        prog.attach(category, name).map_err(|e| {
            let error = e.to_string();
            let hint = if error.contains("tracefs") || error.contains("ermission") {
                " (tracefs at /sys/kernel/tracing must be mounted and readable: mount it with `mount -t tracefs nodev /sys/kernel/tracing`; it is mode 0700, so a non-root service needs CAP_DAC_READ_SEARCH)"
            } else {
                ""
            };
            StartError::Attach {
                program: program.to_string(),
                category: category.to_string(),
                name: name.to_string(),
                error,
                hint,
            }
        })?;
        attachments += 1;
    }
    let take =
        |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(StartError::Missing(name));
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
        ring,
        attachments,
        read_side,
    })
}

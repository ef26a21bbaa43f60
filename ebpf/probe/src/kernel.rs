//! What the running kernel must have for the probe, asked before anything is loaded, so that a
//! kernel below the floor gets one sentence naming itself, the minimum version and the missing
//! feature, never a raw verifier log.
//!
//! The floor is Linux 5.15, set by two BPF helpers every output program calls:
//! `bpf_get_current_task_btf` (5.11), which gives the running task as a pointer the verifier lets
//! the program load fields from, and `bpf_task_pt_regs` (5.15), which gives its saved user
//! registers, where the exit programs read a syscall's arguments. The kernel's own BTF lists the
//! helpers it has (`enum bpf_func_id`), which is exact where a version number would not be
//! (distributions backport). Everything else the probe uses is older: syscall tracepoints, BTF,
//! ring buffers (5.8), `close_range` (5.9); `sched_process_exit`'s `group_dead` (6.16) has a
//! fallback (`zerocache_probe_common::exit_mode`). Before 5.11, BPF maps are charged to
//! `RLIMIT_MEMLOCK`, which [`raise_memlock`] lifts.

use crate::btf;

/// The minimum kernel version, as operators read it.
pub const MINIMUM: &str = "5.15";

/// (helper, the Linux version that added it, what the probe does with it).
const HELPERS: [(&str, &str, &str); 2] = [
    (
        "get_current_task_btf",
        "5.11",
        "every program reads the running task through it",
    ),
    (
        "task_pt_regs",
        "5.15",
        "the output programs read a syscall's arguments from the task's saved registers with it",
    ),
];

/// The running kernel's release (`uname -r`).
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "(unknown release)".into())
}

/// Ok when the kernel whose BTF is `vmlinux` has every helper the probe calls; otherwise the
/// reason, naming this kernel, the minimum version and the missing helper.
pub(crate) fn check_floor(vmlinux: &[u8]) -> Result<(), String> {
    for (helper, since, why) in HELPERS {
        let id = format!("BPF_FUNC_{helper}");
        match btf::enum_has(vmlinux, "bpf_func_id", &id) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "kernel {} is below the probe's minimum, Linux {MINIMUM}: it lacks the BPF helper bpf_{helper} (Linux {since}), and {why}",
                    release()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "kernel {}: cannot tell its BPF helpers from {}: {e}",
                    release(),
                    btf::VMLINUX
                ));
            }
        }
    }
    Ok(())
}

/// Lifts `RLIMIT_MEMLOCK` for kernels before 5.11, which charge BPF maps to it (the probe's maps
/// hold ~60 MiB; the usual default is 8 MiB). Later kernels charge the memory cgroup and ignore
/// it; where raising is not permitted it is left as it is, and a map that does not fit then fails
/// with its own error.
pub(crate) fn raise_memlock() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK)
        && soft != RLIM_INFINITY
    {
        let want = if hard == RLIM_INFINITY {
            RLIM_INFINITY
        } else {
            hard
        };
        if setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_err() {
            let _ = setrlimit(Resource::RLIMIT_MEMLOCK, want, hard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_is_above_the_floor_and_names_its_release() {
        let data = std::fs::read(btf::VMLINUX).expect("this kernel publishes BTF");
        assert_eq!(check_floor(&data), Ok(()));
        let r = release();
        assert!(r.chars().next().is_some_and(|c| c.is_ascii_digit()), "{r}");
    }

    #[test]
    fn a_kernel_without_btf_enums_gets_a_reason_not_a_panic() {
        let e = check_floor(b"garbage").expect_err("refused");
        assert!(
            e.starts_with(&format!(
                "kernel {}: cannot tell its BPF helpers",
                release()
            )),
            "{e}"
        );
    }
}

//! What `zerocache watch` needs from the kernel, checked before it tries: the capabilities the
//! probe uses, read from `/proc/self/status` (`CapEff`), so a missing one is named instead of
//! surfacing as a bare EPERM.

/// A capability and why watch mode needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Its name, as in capabilities(7).
    pub name: &'static str,
    /// Its bit number.
    pub bit: u32,
    /// What it is for.
    pub why: &'static str,
}

/// Needed: without any of these the probe cannot load or attach.
pub const REQUIRED: [Cap; 3] = [
    Cap {
        name: "CAP_BPF",
        bit: 39,
        why: "creating the BPF maps and loading the programs",
    },
    Cap {
        name: "CAP_PERFMON",
        bit: 38,
        why: "tracing programs that read kernel memory (bpf_probe_read_kernel, task pointers)",
    },
    Cap {
        name: "CAP_DAC_READ_SEARCH",
        bit: 2,
        why: "attaching through tracefs (/sys/kernel/tracing is mode 0700)",
    },
];

/// Wanted for processes of other users: their `/proc/PID/fd` (socket fds, peer addresses) needs
/// ptrace access.
pub const PTRACE: Cap = Cap {
    name: "CAP_SYS_PTRACE",
    bit: 19,
    why: "reading /proc/PID/fd of processes owned by other users (their sockets and peers)",
};

/// The effective capability set, from `/proc/self/status`; None if it cannot be read.
pub fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The capabilities of `wanted` missing from `effective`.
pub fn missing(effective: u64, wanted: &[Cap]) -> Vec<Cap> {
    wanted
        .iter()
        .filter(|c| effective & (1u64 << c.bit) == 0)
        .copied()
        .collect()
}

/// The error text for missing required capabilities.
pub fn explain(missing: &[Cap]) -> String {
    let mut s = String::from(
        "zerocache watch needs to load an eBPF probe; this process lacks the capabilities:",
    );
    for c in missing {
        s.push_str(&format!("\n  {} ({})", c.name, c.why));
    }
    s.push_str(
        "\nRun it as root, or grant them: `sudo setpriv --inh-caps +bpf,+perfmon,+dac_read_search --ambient-caps +bpf,+perfmon,+dac_read_search zerocache watch ...` (add +sys_ptrace to watch other users' processes).",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        let root = parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n").expect("caps");
        assert!(missing(root, &REQUIRED).is_empty());
        let nobody = parse_cap_eff("CapEff:\t0000000000000000\n").expect("caps");
        let m = missing(nobody, &REQUIRED);
        assert_eq!(m.len(), 3);
        let text = explain(&m);
        for name in ["CAP_BPF", "CAP_PERFMON", "CAP_DAC_READ_SEARCH"] {
            assert!(text.contains(name), "{text}");
        }
        // CAP_BPF and CAP_PERFMON only.
        let some = (1u64 << 39) | (1 << 38);
        assert_eq!(missing(some, &REQUIRED), vec![REQUIRED[2]]);
        assert_eq!(parse_cap_eff("nothing"), None);
    }
}

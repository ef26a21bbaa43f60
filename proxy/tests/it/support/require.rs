//! What a test needs from the machine beyond a build: root, a second CPU, Chromium, a command.
//!
//! Each check returns `true` when the test can go on. When it cannot, the check prints
//! `skipped <test>: needs <what> (<why>)` and returns `false`, so the test returns early and
//! `cargo test` without root still runs (and passes) everything else:
//!
//! ```ignore
//! if !require::root("loads the eBPF probe") {
//!     return;
//! }
//! ```
//!
//! With `ZEROCACHE_REQUIRE_PRIVILEGED=1` in the environment (`cargo xtask test` sets it when it
//! runs as root, as CI does) a missing requirement panics with the same message instead: a run
//! that is meant to cover everything cannot pass by skipping.
//!
//! The panic points at the test's line (`#[track_caller]`), not at this file.
//!
//! The message goes straight to the process's stderr, not through `eprintln!`, which libtest
//! captures and shows only for failing tests: a skipped test passes, and its line must still be
//! seen. `cargo xtask test` collects these lines and lists them at the end.

use std::io::Write;
use std::path::Path;

/// The environment variable that turns every skip into a failure.
pub const REQUIRE_PRIVILEGED: &str = "ZEROCACHE_REQUIRE_PRIVILEGED";

/// True when running as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Goes on only as root; `why` says what in the test needs it ("loads the eBPF probe").
#[track_caller]
pub fn root(why: &str) -> bool {
    is_root() || skip(&format!("needs root ({why})"))
}

/// Goes on only with at least `n` CPUs available to this process (its affinity mask and CPU
/// quota, as `std::thread::available_parallelism` counts them).
#[track_caller]
pub fn cpus(n: usize, why: &str) -> bool {
    let have = std::thread::available_parallelism().map_or(1, |n| n.get());
    have >= n || skip(&format!("needs {n} CPUs, has {have} ({why})"))
}

/// Goes on only with Chromium at /usr/bin/chromium (where the browser test points chromedriver)
/// and `chromedriver` on PATH: Debian's chromium and chromium-driver.
#[track_caller]
pub fn chromium(why: &str) -> bool {
    let found = Path::new("/usr/bin/chromium").is_file() && on_path("chromedriver");
    found || skip(&format!("needs Chromium and chromedriver ({why})"))
}

/// Goes on only if `name` is an executable on PATH.
#[track_caller]
pub fn command(name: &str) -> bool {
    on_path(name) || skip(&format!("needs the `{name}` command on PATH"))
}

/// Goes on only if `ok`; `what` names the requirement ("cargo-deb", "no zerocache package
/// installed"), for what the other checks do not cover.
#[track_caller]
pub fn that(ok: bool, what: &str) -> bool {
    ok || skip(&format!("needs {what}"))
}

/// True if `name` is an executable file in one of PATH's directories (what `Command::new` runs).
pub fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// True when `ZEROCACHE_REQUIRE_PRIVILEGED=1`.
pub fn required() -> bool {
    std::env::var(REQUIRE_PRIVILEGED).is_ok_and(|v| v == "1")
}

/// The running test's name: libtest names each test's thread after it.
fn test_name() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => "a test".to_string(),
    }
}

/// Prints the skip line and returns false, or panics with it when skipping is not allowed.
#[track_caller]
fn skip(need: &str) -> bool {
    let line = format!("skipped {}: {need}", test_name());
    if required() {
        panic!("{line}; {REQUIRE_PRIVILEGED}=1 forbids skipping");
    }
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    false
}

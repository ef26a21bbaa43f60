//! virtme-ng, the tool `cargo xtask vm-test` boots kernels with: from PyPI (bookworm has no Debian
//! package of it) into the project's tools venv, at the version this harness was verified with.
//! `cargo xtask setup` calls [`virtme_ng`]; its check only looks for files (no Python start), so
//! setup stays fast when everything is there. The Debian packages it needs (QEMU, busybox, kmod,
//! udev) are in setup's apt list.

use std::path::PathBuf;

/// The virtme-ng release vm-test was verified with (`vng -r` of an unpacked Debian kernel,
/// `--disable-kvm`, `--rwdir`, `--overlay-rwdir`, the script's exit code passed back).
pub const VIRTME_NG_VERSION: &str = "1.42";

/// `vng` in the tools venv.
fn vng_path() -> PathBuf {
    crate::setup::tools_venv().join("bin/vng")
}

/// True when the venv has `vng` and virtme-ng's metadata says [`VIRTME_NG_VERSION`].
pub fn virtme_ng_ok() -> bool {
    let lib = crate::setup::tools_venv().join("lib");
    let want = format!("virtme_ng-{VIRTME_NG_VERSION}.dist-info");
    let found = std::fs::read_dir(&lib).ok().is_some_and(|pythons| {
        pythons
            .flatten()
            .any(|p| p.path().join("site-packages").join(&want).is_dir())
    });
    found && vng_path().is_file()
}

/// `vng`, or an error saying how to get it.
pub fn vng() -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        virtme_ng_ok(),
        "virtme-ng {VIRTME_NG_VERSION} is not in {}: run `cargo xtask setup`",
        crate::setup::tools_venv().display()
    );
    Ok(vng_path())
}

/// Installs virtme-ng into the tools venv unless it is there; `strict` as in setup: without it a
/// failure is a message, since only vm-test needs it.
pub fn virtme_ng(changed: &mut Vec<String>, strict: bool) -> anyhow::Result<()> {
    crate::setup::venv_tool(
        changed,
        strict,
        ("virtme-ng", VIRTME_NG_VERSION),
        virtme_ng_ok,
        "`cargo xtask vm-test` will not run",
    )
}

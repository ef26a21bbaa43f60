//! `cargo xtask image`: the OCI image, built without a daemon by Debian's buildah from an empty
//! base: the stripped release binary and the shared libraries it links (nothing else: no shell,
//! no package manager), the container config (config/packaging/container.yaml), the example
//! config and the README. It runs as uid 65534 with the cache directory a volume it owns, exposes
//! 8080, stops on SIGTERM (the drain), and is written as an OCI archive,
//! `target/image/zerocache_<version>.oci.tar`, for `podman load`, `skopeo copy` or a registry.
//!
//! buildah keeps its state under `target/image/` (`--root`, `--runroot`, the vfs driver, which
//! needs no kernel support), so the host's container storage is neither needed nor touched.

use crate::{root, run};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The image's user and group: nobody, as on Debian.
const UID: &str = "65534";

/// Where the archive is written.
pub fn archive() -> PathBuf {
    image_dir().join(format!("zerocache_{VERSION}.oci.tar"))
}

fn image_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"))
        .join("image")
}

/// Builds the image; returns the archive's path.
pub fn image() -> anyhow::Result<PathBuf> {
    let started = std::time::Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args(["build", "--release", "--locked", "-p", "zerocache"]))?;
    let dir = image_dir();
    let rootfs = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    std::fs::create_dir_all(&rootfs)?;
    let bin = dir
        .parent()
        .context("target dir")?
        .join("release/zerocache");
    stage(&bin, &rootfs)?;

    let state = dir.join("buildah");
    let buildah = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("buildah")
            .arg("--root")
            .arg(state.join("root"))
            .arg("--runroot")
            .arg(state.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .context("buildah (is it installed? `cargo xtask setup` installs it)")?;
        anyhow::ensure!(
            out.status.success(),
            "buildah {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let ctr = buildah(&["from", "scratch"])?;
    let built = (|| -> anyhow::Result<()> {
        let rootfs_s = rootfs.to_str().context("utf8 path")?;
        buildah(&["copy", &ctr, rootfs_s, "/"])?;
        // The cache directory, the one place the proxy writes: its user's.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty)?;
        let owner = format!("{UID}:{UID}");
        let empty_s = empty.to_str().context("utf8 path")?;
        buildah(&[
            "copy",
            "--chown",
            &owner,
            &ctr,
            empty_s,
            "/var/cache/zerocache",
        ])?;
        let created = format!("org.opencontainers.image.version={VERSION}");
        buildah(&[
            "config",
            "--entrypoint",
            r#"["/usr/bin/zerocache"]"#,
            "--cmd",
            r#"["run", "--config", "/etc/zerocache/zerocache.yaml"]"#,
            "--user",
            &format!("{UID}:{UID}"),
            "--port",
            "8080/tcp",
            "--volume",
            "/var/cache/zerocache",
            "--stop-signal",
            "SIGTERM",
            "--workingdir",
            "/",
            "--label",
            "org.opencontainers.image.title=zerocache",
            "--label",
            &created,
            "--label",
            "org.opencontainers.image.description=HTTP edge cache serving hits with sendfile(2), with an eBPF zero-copy witness",
            &ctr,
        ])?;
        let out = archive();
        let _ = std::fs::remove_file(&out);
        let dest = format!("oci-archive:{}:zerocache:{VERSION}", out.display());
        buildah(&[
            "commit",
            "--format",
            "oci",
            "--disable-compression=false",
            "--rm",
            &ctr,
            &dest,
        ])?;
        Ok(())
    })();
    if built.is_err() {
        let _ = buildah(&["rm", &ctr]);
    }
    built?;
    let _ = buildah(&["rmi", "--all"]);
    let out = archive();
    println!(
        "xtask: image: {} ({:.1} MiB) in {:.0} s",
        out.display(),
        std::fs::metadata(&out)?.len() as f64 / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// Lays out the image's files under `rootfs`: the binary stripped (as the package's; its debug
/// info is in the package's dbgsym, under the same build id), the shared
/// libraries and loader it names (as `ldd` resolves them), the configs, the docs, passwd and
/// group for uid 65534, and /tmp.
fn stage(bin: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let put = |inside: &str| -> anyhow::Result<PathBuf> {
        let p = rootfs.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        Ok(p)
    };
    run(Command::new("objcopy")
        .arg("--strip-all")
        .arg(bin)
        .arg(put("/usr/bin/zerocache")?))?;
    for lib in shared_libraries(bin)? {
        let inside = lib.to_str().context("utf8 library path")?;
        // The file itself under the name the binary asks for (symlinks followed).
        std::fs::copy(&lib, put(inside)?).with_context(|| format!("copying {inside}"))?;
    }
    let files = [
        (
            "config/packaging/container.yaml",
            "/etc/zerocache/zerocache.yaml",
        ),
        (
            "config/zerocache.example.yaml",
            "/usr/share/doc/zerocache/zerocache.example.yaml",
        ),
        ("README.md", "/usr/share/doc/zerocache/README.md"),
    ];
    for (source, inside) in files {
        std::fs::copy(root().join(source), put(inside)?).with_context(|| source.to_string())?;
    }
    std::fs::write(
        put("/etc/passwd")?,
        format!(
            "root:x:0:0:root:/root:/nonexistent\nnobody:x:{UID}:{UID}:nobody:/nonexistent:/nonexistent\n"
        ),
    )?;
    std::fs::write(put("/etc/group")?, format!("root:x:0:\nnogroup:x:{UID}:\n"))?;
    std::fs::create_dir_all(put("/tmp/x")?.parent().context("tmp")?)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// The absolute paths of the shared libraries `bin` loads, and its loader, as `ldd` lists them.
fn shared_libraries(bin: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("ldd")?;
    anyhow::ensure!(out.status.success(), "ldd {} failed", bin.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
            // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no file.
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next(),
                None => l.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    anyhow::ensure!(
        libs.iter()
            .any(|l| l.to_string_lossy().contains("ld-linux")),
        "ldd names no loader for {}: {text}",
        bin.display()
    );
    Ok(libs)
}

//! The OCI image, for real: `cargo xtask image` builds it with buildah, the archive's manifest
//! and config say what the image promises (entrypoint, user, port, volume, stop signal), its one
//! layer holds the binary, the libraries it links and the container config, and a container of
//! it (buildah's chroot isolation: no daemon, the host's network) serves a MISS then a HIT from a
//! real origin as uid 65534, and drains on SIGTERM. Needs root and buildah (`cargo xtask setup`
//! installs it); skips with the reason otherwise.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn blob(dir: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    std::fs::read(dir.join("blobs/sha256").join(hex)).expect("blob")
}

/// buildah with its state in `state`, away from the host's container storage.
fn buildah(state: &Path) -> Command {
    let mut c = Command::new("buildah");
    c.arg("--root")
        .arg(state.join("root"))
        .arg("--runroot")
        .arg(state.join("run"))
        .args(["--storage-driver", "vfs"]);
    c
}

#[test]
fn the_oci_image_is_built_without_a_daemon_and_serves_as_nobody() {
    if !require::root("buildah's vfs storage and chroot run") || !require::command("buildah") {
        return;
    }
    let root = workspace();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .args(["xtask", "image"])
        .current_dir(&root)
        .status()
        .expect("cargo xtask image");
    assert!(built.success(), "cargo xtask image: {built}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| root.join(t))
        .unwrap_or_else(|| root.join("target"));
    let archive = target.join(format!("image/zerocache_{VERSION}.oci.tar"));

    // The archive: an OCI layout whose one manifest is tagged with the version.
    let oci = tempfile::tempdir().expect("tmp");
    sh(
        "tar",
        &[
            "-xf",
            archive.to_str().expect("utf8"),
            "-C",
            oci.path().to_str().expect("utf8"),
        ],
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.path().join("index.json")).expect("index"))
            .expect("index.json");
    let m = &index["manifests"][0];
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        format!("zerocache:{VERSION}")
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(oci.path(), m["digest"].as_str().expect("digest")))
            .expect("manifest");
    let config: serde_json::Value = serde_json::from_slice(&blob(
        oci.path(),
        manifest["config"]["digest"]
            .as_str()
            .expect("config digest"),
    ))
    .expect("config");
    let c = &config["config"];
    assert_eq!(c["Entrypoint"], serde_json::json!(["/usr/bin/zerocache"]));
    assert_eq!(
        c["Cmd"],
        serde_json::json!(["run", "--config", "/etc/zerocache/zerocache.yaml"])
    );
    assert_eq!(c["User"], "65534:65534");
    assert_eq!(c["ExposedPorts"], serde_json::json!({"8080/tcp": {}}));
    assert_eq!(
        c["Volumes"],
        serde_json::json!({"/var/cache/zerocache": {}})
    );
    assert_eq!(c["StopSignal"], "SIGTERM");
    assert_eq!(config["architecture"], "amd64");

    // The layers: the binary, its libraries and loader, the container config, a cache directory
    // that uid 65534 owns; and no shell.
    let mut listing = String::new();
    for layer in manifest["layers"].as_array().expect("layers") {
        let digest = layer["digest"].as_str().expect("digest");
        let path = oci
            .path()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        listing.push_str(&sh(
            "tar",
            &["-tvzf", path.to_str().expect("utf8"), "--numeric-owner"],
        ));
    }
    for want in [
        "usr/bin/zerocache",
        "lib64/ld-linux-x86-64.so.2",
        "libc.so.6",
        "libgcc_s.so.1",
        "etc/zerocache/zerocache.yaml",
        "etc/passwd",
        "usr/share/doc/zerocache/zerocache.example.yaml",
    ] {
        assert!(
            listing.contains(want),
            "{want} not in the image:\n{listing}"
        );
    }
    assert!(
        listing
            .lines()
            .any(|l| l.contains(" 65534/65534 ") && l.trim_end().ends_with("var/cache/zerocache/")),
        "the cache directory is nobody's:\n{listing}"
    );
    assert!(!listing.contains("bin/sh"), "no shell in the image");

    // Run it: a container of the image serving a real origin, as the image's own user.
    let (origin, _rt) = origin();
    let state = tempfile::tempdir().expect("buildah state");
    let ctr = String::from_utf8_lossy(
        &buildah(state.path())
            .args(["from", &format!("oci-archive:{}", archive.display())])
            .output()
            .expect("buildah from")
            .stdout,
    )
    .trim()
    .to_string();
    assert!(!ctr.is_empty(), "buildah from gave no container");
    let test_dir = tempfile::tempdir().expect("mounted dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(test_dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let (port, dport) = (free_port(), free_port());
    std::fs::write(
        test_dir.path().join("z.yaml"),
        format!(
            "listen: 127.0.0.1:{port}\npid_file: /test/z.pid\ncache:\n  path: /var/cache/zerocache\n  max_size: 64MiB\nupstreams:\n  origin:\n    servers: [\"{}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: origin\ndashboard:\n  listen: 127.0.0.1:{dport}\nprobe:\n  enabled: false\n",
            origin.addr()
        ),
    )
    .expect("config");
    let mount = format!("{}:/test", test_dir.path().display());
    let mut container = buildah(state.path())
        .args([
            "run",
            "--isolation",
            "chroot",
            "--volume",
            &mount,
            &ctr,
            "--",
        ])
        .args(["/usr/bin/zerocache", "run", "--config", "/test/z.yaml"])
        .stdin(Stdio::null())
        .spawn()
        .expect("buildah run");
    struct Kill(Option<u32>, PathBuf);
    impl Drop for Kill {
        fn drop(&mut self) {
            if let Some(pid) = std::fs::read_to_string(&self.1)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                // SAFETY: the containerised proxy this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = self.0;
        }
    }
    let pid_file = test_dir.path().join("z.pid");
    let _kill = Kill(Some(container.id()), pid_file.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pid_file.exists() {
        if let Ok(Some(status)) = container.try_wait() {
            panic!("the container exited before serving: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the container did not start serving"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let first = Client::connect(addr).get("/obj/5000", &[]);
    assert_eq!((first.status, first.x_cache()), (200, "MISS"));
    let second = Client::connect(addr).get("/obj/5000", &[]);
    assert_eq!((second.status, second.x_cache()), (200, "HIT"));
    assert!(second.body == body(5000));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains("65534")),
        "runs as nobody: {status}"
    );
    // SAFETY: the containerised proxy this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exited = container.wait().expect("buildah run");
    assert!(exited.success(), "drained and exited 0: {exited}");
    let _ = buildah(state.path()).args(["rm", &ctr]).output();
    let _ = buildah(state.path()).args(["rmi", "--all"]).output();
}

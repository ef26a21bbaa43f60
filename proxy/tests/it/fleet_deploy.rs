//! The fleet's deployment files: the Kubernetes manifests (config/k8s/) pass
//! kubernetes-validate's strict schema check and hold what a member needs (a StatefulSet behind
//! a headless Service, a PodDisruptionBudget, the probe's capabilities, host PID namespace and
//! tracefs), and the configs they and the systemd example carry pass `zerocache check`.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// kubernetes-validate on PATH, or where `cargo xtask setup` installs it.
fn kubernetes_validate() -> Option<PathBuf> {
    if require::on_path("kubernetes-validate") {
        return Some("kubernetes-validate".into());
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let venv = home.join(".local/share/zerocache/venv/bin/kubernetes-validate");
    venv.is_file().then_some(venv)
}

/// `zerocache check` of `yaml` with `env`; panics with its output unless valid.
fn check(yaml: &str, env: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("zerocache.yaml");
    std::fs::write(&file, yaml).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_zerocache"))
        .args(["check", "-q", "--config"])
        .arg(&file)
        .env("ZEROCACHE_CACHE_PATH", tmp.path().join("cache"))
        .envs(env.iter().copied())
        .output()
        .expect("zerocache check");
    assert!(
        out.status.success(),
        "{}{}\n{yaml}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_kubernetes_manifests_validate_and_carry_a_valid_config() {
    let file = root().join("config/k8s/zerocache-fleet.yaml");
    let text = std::fs::read_to_string(&file).expect("manifests");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect();
    let kind = |k: &str| -> Vec<&serde_yaml::Value> {
        docs.iter()
            .filter(|d| d["kind"].as_str() == Some(k))
            .collect()
    };
    let sts = kind("StatefulSet");
    assert_eq!(sts.len(), 1);
    let sts = sts[0];
    let services = kind("Service");
    let headless = services
        .iter()
        .find(|s| s["spec"]["clusterIP"].as_str() == Some("None"))
        .expect("a headless Service");
    assert_eq!(sts["spec"]["serviceName"], headless["metadata"]["name"]);
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(kind("PodDisruptionBudget").len(), 1);
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"], true,
        "the probe needs the host PID namespace"
    );
    let c = &pod["containers"][0];
    let caps: Vec<&str> = c["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .expect("caps")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        caps.contains(&"BPF") && caps.contains(&"PERFMON"),
        "{caps:?}"
    );
    let mounts = c["volumeMounts"].as_sequence().expect("mounts");
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"].as_str() == Some("/sys/kernel/tracing")),
        "tracefs from the host"
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz");
    // The config it carries, as one member would run it.
    let secret = kind("Secret");
    let config = secret[0]["stringData"]["zerocache.yaml"]
        .as_str()
        .expect("config");
    assert!(config.contains(&format!(
        "peers_dns: {}.zerocache.svc.cluster.local:8080",
        headless["metadata"]["name"].as_str().expect("name")
    )));
    check(config, &[("ZEROCACHE_FLEET_SELF", "10.1.2.3:8080")]);

    let Some(validate) = kubernetes_validate() else {
        require::that(
            false,
            "kubernetes-validate (installed by cargo xtask setup)",
        );
        return;
    };
    let out = Command::new(validate)
        .args(["--strict"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    assert_eq!(
        report.matches(" passed for resource ").count(),
        docs.len(),
        "{report}"
    );
}

#[test]
fn the_systemd_fleet_example_is_a_valid_member_config() {
    let dir = root().join("config/fleet");
    let yaml = std::fs::read_to_string(dir.join("zerocache-fleet.example.yaml")).expect("example");
    let dropin = std::fs::read_to_string(dir.join("fleet.conf")).expect("drop-in");
    let me = dropin
        .lines()
        .find_map(|l| l.strip_prefix("Environment=ZEROCACHE_FLEET_SELF="))
        .expect("the drop-in sets the member's address");
    assert!(
        yaml.contains(&format!("\"{me}\"")),
        "{me} is one of the peers"
    );
    check(&yaml, &[("ZEROCACHE_FLEET_SELF", me)]);
}

//! The seeds as tests: real servers written the two ways each, serving the same 16 MiB file to
//! requests sent one after another on one connection, watched with copy-loop detection on.
//!
//! For every pair the zero-copy server's connection must show every body byte via sendfile and 0
//! copy-loop bytes, and the copying server's connection exactly the file size per request as
//! copy-loop bytes (with the response heads as the only other copied bytes). The sources are in
//! xtask/seeds/. Needs root (the probe), and python3, nginx, go and a JDK 17 (installed by
//! `cargo xtask setup`); a missing one skips with its reason, or fails under
//! `ZEROCACHE_REQUIRE_PRIVILEGED=1`.

#[path = "../../../proxy/tests/support/require.rs"]
#[allow(dead_code)]
mod require;
mod seeds_support;

use seeds_support::{Expect, Seed, exchange, seeds_dir};
use std::process::Command;
use zerocache_probe::{Probe, ProbeOptions};

fn probe() -> Probe {
    let p = Probe::start(ProbeOptions {
        enabled: true,
        watch: Vec::new(),
        closed_capacity: 1000,
    });
    assert!(p.status().is_attached(), "{:?}", p.status());
    p.set_copy_loop(true);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sendfile_against_a_read_sendall_loop() {
    if !require::root("loads the eBPF probe") || !require::command("python3") {
        return;
    }
    let probe = probe();
    let script = seeds_dir().join("python/server.py");
    for (mode, expect) in [("sendfile", Expect::ZeroCopy), ("copy", Expect::CopyLoop)] {
        let seed = Seed::spawn(&format!("python {mode}"), |port, file, _| {
            let mut c = Command::new("python3");
            c.arg(&script).arg(mode).arg(port.to_string()).arg(file);
            c
        });
        exchange(&probe, &seed, expect).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_sendfile_on_against_off() {
    if !require::root("loads the eBPF probe") || !require::command("nginx") {
        return;
    }
    let probe = probe();
    let template = std::fs::read_to_string(seeds_dir().join("nginx/nginx.conf.in")).expect("conf");
    for (mode, expect) in [("on", Expect::ZeroCopy), ("off", Expect::CopyLoop)] {
        let seed = Seed::spawn(&format!("nginx sendfile {mode}"), |port, _, dir| {
            let d = dir.display().to_string();
            let conf = template
                .replace("@DIR@", &d)
                .replace("@PORT@", &port.to_string())
                .replace("@SENDFILE@", mode);
            let path = dir.join("nginx.conf");
            std::fs::write(&path, conf).expect("write nginx.conf");
            let mut c = Command::new("nginx");
            c.args(["-e", &format!("{d}/error.log"), "-p", &d, "-c"])
                .arg(path);
            c
        });
        exchange(&probe, &seed, expect).await;
    }
}

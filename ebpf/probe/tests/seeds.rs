//! The seeds as tests: real servers written the two ways each, serving the same 16 MiB file to
//! requests sent one after another on one connection, watched with copy-loop detection on.
//!
//! For every pair the zero-copy server's connection must show every body byte via sendfile and 0
//! copy-loop bytes, and the copying server's connection exactly the file size per request as
//! copy-loop bytes (with the response heads as the only other copied bytes). The sources are in
//! xtask/seeds/. Needs root (the probe), and python3, nginx, go and a JDK 17 (installed by
//! `cargo xtask setup`); a missing one skips with its reason, or fails under
//! `ZEROCACHE_REQUIRE_PRIVILEGED=1`.

#[path = "../../../proxy/tests/it/support/require.rs"]
#[allow(dead_code)]
mod require;
mod seeds_support;

use seeds_support::{Expect, JDK, Seed, build_once, exchange, seeds_dir};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_io_copy_against_a_wrapped_reader() {
    if !require::root("loads the eBPF probe") || !require::command("go") {
        return;
    }
    let bin = build_once("seed-go", |out| {
        let mut c = Command::new("go");
        c.arg("build")
            .arg("-o")
            .arg(out)
            .arg(seeds_dir().join("go/main.go"))
            .env("GOCACHE", out.with_file_name("gocache"))
            .env("GO111MODULE", "off");
        c
    });
    let probe = probe();
    for (mode, expect) in [("sendfile", Expect::ZeroCopy), ("copy", Expect::CopyLoop)] {
        let seed = Seed::spawn(&format!("go {mode}"), |port, file, _| {
            let mut c = Command::new(&bin);
            c.arg(mode).arg(port.to_string()).arg(file);
            c
        });
        exchange(&probe, &seed, expect).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_transfer_to_against_files_copy() {
    let jdk = std::path::Path::new(JDK);
    if !require::root("loads the eBPF probe")
        || !require::that(
            jdk.join("bin/javac").is_file(),
            "OpenJDK 17 at /usr/lib/jvm/java-17-openjdk-amd64 (default-jdk-headless)",
        )
    {
        return;
    }
    let classes = build_once("java", |out| {
        let mut c = Command::new(jdk.join("bin/javac"));
        // javac's JVM sized for a small guest (its default heap is a quarter of memory).
        c.args([
            "-J-Xmx256m",
            "-J-XX:+UseSerialGC",
            "-J-XX:TieredStopAtLevel=1",
        ])
        .arg("-d")
        .arg(out)
        .arg(seeds_dir().join("java/Seed.java"));
        c
    });
    let probe = probe();
    for (mode, expect) in [("transferTo", Expect::ZeroCopy), ("copy", Expect::CopyLoop)] {
        let seed = Seed::spawn(&format!("java {mode}"), |port, file, _| {
            let mut c = Command::new(jdk.join("bin/java"));
            c.args(["-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp"])
                .arg(&classes)
                .args(["Seed", mode])
                .arg(port.to_string())
                .arg(file);
            c
        });
        exchange(&probe, &seed, expect).await;
    }
}

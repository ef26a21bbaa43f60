//! `cargo xtask demo`: the newcomer's first command. Builds zerocache (release), starts the demo
//! origin, zerocache in front of it with the probe and the dashboard, and drives a little traffic
//! (hits, misses, short and long connections) until Ctrl-C or `--duration`.

use crate::{root, run};
use anyhow::Context;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zerocache_origin::Origin;
use zerocache_origin::client::SimpleClient;

const PROXY: &str = "127.0.0.1:8080";
const ORIGIN: &str = "127.0.0.1:8081";
const DASHBOARD: &str = "127.0.0.1:9180";

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

pub fn demo(duration: Option<u64>) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args(["build", "--release", "-p", "zerocache"]))?;
    let dir = root().join("target/demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("zerocache.yaml");
    std::fs::write(
        &config,
        format!(
            "# Written by `cargo xtask demo`.\nlisten: {PROXY}\ncache:\n  path: {}\n  max_size: 2GiB\nupstreams:\n  demo-origin:\n    servers: [\"{ORIGIN}\"]\nroutes:\n  - match: {{ host: \"*\", path_prefix: / }}\n    upstream: demo-origin\ndashboard:\n  listen: {DASHBOARD}\nprobe:\n  enabled: true\n  watch: [self]\n",
            dir.join("cache").display()
        ),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _origin: Origin = rt
        .block_on(Origin::bind(ORIGIN))
        .with_context(|| format!("starting the demo origin on {ORIGIN} (is the port taken?)"))?;
    let child = Command::new(root().join("target/release/zerocache"))
        .args(["run", "--config"])
        .arg(&config)
        .spawn()
        .context("starting zerocache")?;
    let _proxy = KillOnDrop(child);
    let proxy: SocketAddr = PROXY.parse()?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(proxy).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "zerocache did not start listening on {PROXY}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!();
    println!("  proxy      http://{PROXY}/obj/<bytes>   (e.g. curl -i http://{PROXY}/obj/65536)");
    println!("  dashboard  http://{DASHBOARD}/");
    println!("  metrics    http://{DASHBOARD}/metrics");
    println!("  origin     http://{ORIGIN}/obj/<bytes>");
    println!();
    println!("Driving demo traffic (hits and misses); Ctrl-C stops everything.");

    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    rt.spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        s.store(true, Ordering::Relaxed);
    });
    let until = duration.map(|d| Instant::now() + Duration::from_secs(d));
    let sizes = [1024usize, 65_536, 65_537, 1_000_000, 16 * 1024 * 1024];
    let mut round = 0u64;
    let mut served = 0u64;
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| Instant::now() < u) {
        // A keep-alive connection of hits, then a one-request connection with a fresh miss.
        if let Ok(mut c) = SimpleClient::connect(proxy) {
            for s in sizes {
                if c.get("demo", &format!("/obj/{s}"), false).is_ok() {
                    served += 1;
                }
            }
        }
        if let Ok(mut c) = SimpleClient::connect(proxy)
            && c.get("demo", &format!("/obj/65536?v={round}"), true)
                .is_ok()
        {
            served += 1;
        }
        round += 1;
        if round.is_multiple_of(10) {
            println!("xtask: demo: {served} responses so far");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("xtask: demo: stopping");
    Ok(())
}

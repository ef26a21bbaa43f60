//! `cargo xtask demo --seeds`: the seed servers side by side under `zerocache watch`. Each pair
//! serves the same 16 MiB file two ways (xtask/seeds/: Python, nginx, Go, Java), gets a
//! keep-alive connection of three requests every two seconds, and the watch dashboard on
//! 127.0.0.1:9181 shows one of each pair green (zero-copy) and the other red, its copy loop
//! named. A pair whose toolchain is missing is left out, with the reason.

use crate::{free_port, root, run};
use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zerocache_origin::client::SimpleClient;

const DASHBOARD: &str = "127.0.0.1:9181";
const JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// One seed server: its label, the command and where it listens.
struct Seed {
    label: String,
    port: u16,
    child: KillOnDrop,
}

fn on_path(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// The commands of every pair whose toolchain is here: (label, command builder input).
fn commands(dir: &Path, file: &Path) -> anyhow::Result<Vec<(String, Command)>> {
    let seeds = root().join("xtask/seeds");
    let mut out = Vec::new();
    if on_path("python3") {
        for mode in ["sendfile", "copy"] {
            let mut c = Command::new("python3");
            c.arg(seeds.join("python/server.py")).arg(mode);
            out.push((format!("python {mode}"), c));
        }
    } else {
        println!("xtask: demo: no python3: the Python pair is left out");
    }
    if on_path("nginx") {
        let template = std::fs::read_to_string(seeds.join("nginx/nginx.conf.in"))?;
        for mode in ["on", "off"] {
            let d = dir.join(format!("nginx-{mode}"));
            std::fs::create_dir_all(d.join("www"))?;
            std::fs::copy(file, d.join("www/file.bin"))?;
            // The port is filled in by `spawn`; keep the template's other fields here.
            let conf = template
                .replace("@DIR@", &d.display().to_string())
                .replace("@SENDFILE@", mode);
            std::fs::write(d.join("nginx.conf.in"), conf)?;
            let mut c = Command::new("nginx");
            c.arg(d.join("nginx.conf.in"));
            out.push((format!("nginx sendfile {mode}"), c));
        }
    } else {
        println!("xtask: demo: no nginx: the nginx pair is left out");
    }
    if on_path("go") {
        let bin = dir.join("seed-go");
        run(Command::new("go")
            .arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(seeds.join("go/main.go"))
            .env("GOCACHE", dir.join("gocache"))
            .env("GO111MODULE", "off"))?;
        for mode in ["sendfile", "copy"] {
            let mut c = Command::new(&bin);
            c.arg(mode);
            out.push((format!("go {mode}"), c));
        }
    } else {
        println!("xtask: demo: no go: the Go pair is left out");
    }
    let jdk = Path::new(JDK);
    if jdk.join("bin/javac").is_file() {
        let classes = dir.join("java");
        run(Command::new(jdk.join("bin/javac"))
            .arg("-d")
            .arg(&classes)
            .arg(seeds.join("java/Seed.java")))?;
        for mode in ["transferTo", "copy"] {
            let mut c = Command::new(jdk.join("bin/java"));
            c.args(["-Xmx64m", "-cp"])
                .arg(&classes)
                .args(["Seed", mode]);
            out.push((format!("java {mode}"), c));
        }
    } else {
        println!("xtask: demo: no JDK 17 at {JDK}: the Java pair is left out");
    }
    Ok(out)
}

/// Starts one seed on a free port; nginx gets its config written with the port.
fn spawn(label: String, mut cmd: Command, file: &Path) -> anyhow::Result<Seed> {
    let port = free_port()?;
    let program = cmd.get_program().to_string_lossy().into_owned();
    let child = if program == "nginx" {
        let template: PathBuf = cmd
            .get_args()
            .next()
            .map(PathBuf::from)
            .context("nginx config")?;
        let d = template.parent().context("nginx dir")?.to_path_buf();
        let conf = std::fs::read_to_string(&template)?.replace("@PORT@", &port.to_string());
        std::fs::write(d.join("nginx.conf"), conf)?;
        let ds = d.display().to_string();
        Command::new("nginx")
            .args(["-e", &format!("{ds}/error.log"), "-p", &ds, "-c"])
            .arg(d.join("nginx.conf"))
            .spawn()?
    } else {
        cmd.arg(port.to_string())
            .arg(file)
            .stdout(Stdio::null())
            .spawn()?
    };
    let seed = Seed {
        label,
        port,
        child: KillOnDrop(child),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "{} did not listen", seed.label);
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(seed)
}

/// Runs the seeds and `zerocache watch` until Ctrl-C or `duration` seconds.
pub fn demo_seeds(duration: Option<u64>) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).args(["build", "--release", "-p", "zerocache"]))?;
    let dir = root().join("target/demo-seeds");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("file.bin");
    let body: Vec<u8> = (0..16u64 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, body)?;
    let mut seeds = Vec::new();
    for (label, cmd) in commands(&dir, &file)? {
        seeds.push(spawn(label, cmd, &file)?);
    }
    let mut watch = Command::new(root().join("target/release/zerocache"));
    watch.args(["watch", "--dashboard", DASHBOARD]);
    for s in &seeds {
        watch.args(["--pid", &s.child.0.id().to_string()]);
    }
    let _watch = KillOnDrop(
        watch
            .stdout(Stdio::null())
            .spawn()
            .context("zerocache watch")?,
    );
    println!();
    println!("  dashboard  http://{DASHBOARD}/     metrics  http://{DASHBOARD}/metrics");
    println!();
    for s in &seeds {
        println!(
            "  pid {:>7}  {:<20} http://127.0.0.1:{}/file.bin",
            s.child.0.id(),
            s.label,
            s.port
        );
    }
    println!();
    println!(
        "Each server gets three requests on one connection every 2 s; Ctrl-C (or SIGTERM) stops everything."
    );
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            // SIGTERM too (a `timeout`, a CI runner): the seeds must not outlive the demo.
            rt.block_on(async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {}
                            _ = term.recv() => {}
                        }
                    }
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            });
        }
        s.store(true, Ordering::Relaxed);
    });
    let until = duration.map(|d| Instant::now() + Duration::from_secs(d));
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| Instant::now() < u) {
        for s in &seeds {
            let addr: SocketAddr = ([127, 0, 0, 1], s.port).into();
            if let Ok(mut c) = SimpleClient::connect(addr) {
                for i in 0..3 {
                    if let Err(e) = c.get("seed", "/file.bin", i == 2) {
                        println!("xtask: demo: {}: {e}", s.label);
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    println!("xtask: demo: stopping");
    Ok(())
}

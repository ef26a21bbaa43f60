//! The burst mode: how long a small request waits while hundreds of large hits are in flight.
//!
//! 500 client threads each fetch the 16 MiB hit at once (one connection each, read to the end),
//! while two probes keep asking for the 1 KiB hit: one on a keep-alive connection every 20 ms,
//! one on a new connection every 50 ms. The probes' latencies during the burst are the figure:
//! a server that goes through every large transfer before looking at anyone else makes the small
//! request wait for the whole round. zerocache and nginx proxy_cache alternate, same clients.
//!
//! The clients, the probes and both servers run in this process's session, so Linux's autogroup
//! scheduler puts them in one group and they share its CPU time: what a test harness does, and
//! what produced the 2.8 s stall the safety issue measured (nginx, under the same conditions,
//! stalls a new connection as long). Under systemd the proxy has a cgroup of its own.

use super::*;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Concurrent large transfers.
const CLIENTS: usize = 500;
/// Their object.
const LARGE: usize = 16 << 20;
/// The probes' object.
const SMALL: usize = 1024;

/// One probe's latencies during one burst, in milliseconds.
#[derive(Default)]
struct Latencies(Vec<f64>);

impl Latencies {
    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

struct Burst {
    keep_alive: Latencies,
    fresh: Latencies,
    seconds: f64,
}

/// Fetches the large object to the end, once; its body bytes.
fn large_client(addr: SocketAddr) -> std::io::Result<u64> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.write_all(
        format!("GET /obj/{LARGE} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}

/// Runs `probe` every `every` until `stop`, with the start of each call; keeps what took place
/// between `from` and `to` (set once the burst ends).
fn probing(
    stop: Arc<AtomicBool>,
    every: Duration,
    mut probe: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<(Instant, f64)>> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        probe()?;
        out.push((t, t.elapsed().as_secs_f64() * 1e3));
        std::thread::sleep(every);
    }
    Ok(out)
}

fn one_burst(addr: SocketAddr) -> anyhow::Result<Burst> {
    let stop = Arc::new(AtomicBool::new(false));
    let ka = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = SimpleClient::connect(addr)?;
            probing(stop, Duration::from_millis(20), || {
                let r = c.get("bench", &format!("/obj/{SMALL}"), false)?;
                anyhow::ensure!(r.status == 200 && r.body.len() == SMALL, "keep-alive probe");
                Ok(())
            })
        })
    };
    let fresh = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            probing(stop, Duration::from_millis(50), || {
                let r =
                    SimpleClient::connect(addr)?.get("bench", &format!("/obj/{SMALL}"), true)?;
                anyhow::ensure!(r.status == 200 && r.body.len() == SMALL, "fresh probe");
                Ok(())
            })
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || large_client(addr))
        })
        .collect::<Result<_, _>>()?;
    let mut short = 0;
    for c in clients {
        let got = c
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        if got < LARGE as u64 {
            short += 1;
        }
    }
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    anyhow::ensure!(
        short == 0,
        "{short} of {CLIENTS} large fetches came back short"
    );
    let during = |v: Vec<(Instant, f64)>| {
        Latencies(
            v.into_iter()
                .filter(|(t, _)| *t >= start && *t <= end)
                .map(|(_, ms)| ms)
                .collect(),
        )
    };
    let join = |h: std::thread::JoinHandle<anyhow::Result<Vec<(Instant, f64)>>>| {
        h.join()
            .map_err(|_| anyhow::anyhow!("a probe thread panicked"))?
    };
    Ok(Burst {
        keep_alive: during(join(ka)?),
        fresh: during(join(fresh)?),
        seconds: (end - start).as_secs_f64(),
    })
}

/// `cargo xtask bench --burst`: writes xtask/bench/results/burst.md.
pub(crate) fn burst(opts: &Options) -> anyhow::Result<()> {
    let base = root().join("target/bench-burst");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let origin_server = start_origin()?;
    let origin = origin_server.addr;
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let servers = [Server::Zerocache, Server::NginxNopush];
    let mut results: BTreeMap<&'static str, Vec<Burst>> = BTreeMap::new();
    for rep in 0..opts.reps {
        for i in 0..servers.len() {
            let server = servers[(i + rep) % servers.len()];
            let running = match server {
                Server::Zerocache => {
                    start_zerocache(&base, free_port()?, origin, true, zc_affinity(opts))?
                }
                s => start_nginx(&base, origin, s, workers, false)?,
            };
            warm(running.addr, server, &[SMALL, LARGE])?;
            let b = one_burst(running.addr)?;
            println!(
                "xtask: bench: burst rep {} {:<34} {:.1} s; 1 KiB keep-alive p50 {:.1} max {:.1} ms; new connection p50 {:.1} max {:.1} ms",
                rep + 1,
                server.name(),
                b.seconds,
                b.keep_alive.quantile(0.5),
                b.keep_alive.quantile(1.0),
                b.fresh.quantile(0.5),
                b.fresh.quantile(1.0),
            );
            results.entry(server.name()).or_default().push(b);
        }
    }
    let mut r = String::new();
    writeln!(
        r,
        "# Small requests under a burst: `cargo xtask bench --burst`\n"
    )?;
    writeln!(
        r,
        "{CLIENTS} connections each fetch a 16 MiB hit at once while a 1 KiB hit is asked for every 20 ms on a keep-alive connection and every 50 ms on a new one; latencies of the probes made during the burst, medians over {} repetitions (server order rotated). Clients, probes and servers share one scheduling group (autogroup), as under a test harness. zerocache's probe attached; {workers} workers each.\n",
        opts.reps
    )?;
    writeln!(
        r,
        "| server | burst s | keep-alive p50 ms | keep-alive p99 ms | keep-alive max ms | new conn p50 ms | new conn p99 ms | new conn max ms |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for server in servers {
        let b = &results[server.name()];
        let med = |f: &dyn Fn(&Burst) -> f64| median(b.iter().map(f).collect());
        writeln!(
            r,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            server.name(),
            med(&|b| b.seconds),
            med(&|b| b.keep_alive.quantile(0.5)),
            med(&|b| b.keep_alive.quantile(0.99)),
            med(&|b| b.keep_alive.quantile(1.0)),
            med(&|b| b.fresh.quantile(0.5)),
            med(&|b| b.fresh.quantile(0.99)),
            med(&|b| b.fresh.quantile(1.0)),
        )?;
    }
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("burst.md"), &r)?;
    println!("\n{r}");
    println!("xtask: bench: written to xtask/bench/results/burst.md");
    Ok(())
}

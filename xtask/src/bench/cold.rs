//! The cold-cache mode: hot 1 KiB hits measured while cold 16 MiB hits run beside them.

use super::*;

/// Drops every cache file under `dir` larger than `min` bytes from the page cache.
pub(crate) fn evict_large(dir: &Path, min: u64) {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if e.metadata().map(|m| m.len() > min).unwrap_or(false)
                && let Ok(f) = std::fs::File::open(&p)
            {
                use std::os::fd::AsRawFd;
                let _ = f.sync_all();
                // SAFETY: valid fd; advice only.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

/// The cold-cache mode: hot 1 KiB hits under wrk while another client keeps asking for 16 MiB
/// objects whose cache files are evicted from the page cache before each request. With the
/// offload the disk reads run on the blocking pool; without it, sendfile waits for the disk on
/// a runtime thread and the hot hits behind it wait too.
pub(crate) fn cold(opts: &Options) -> anyhow::Result<()> {
    let base = root().join("target/bench-cold");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let origin_server = start_origin()?;
    let origin = origin_server.addr;
    pub(crate) const COLD_OBJECTS: usize = 16;
    let mut rows = Vec::new();
    for rep in 0..opts.reps {
        for offload in [true, false] {
            let port = free_port()?;
            let z = start_zerocache_with(&base, port, origin, true, offload, "auto")?;
            {
                let mut c = SimpleClient::connect(z.addr)?;
                c.get("bench", "/obj/1024", false)?;
                for i in 0..COLD_OBJECTS {
                    c.get("bench", &format!("/obj/16777216?cold={i}"), false)?;
                }
            }
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            let dir = base.join("zc/cache");
            let addr = z.addr;
            let coldies = std::thread::spawn(move || -> u64 {
                let mut n = 0;
                let Ok(mut c) = SimpleClient::connect(addr) else {
                    return 0;
                };
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    evict_large(&dir, 1 << 20);
                    for i in 0..COLD_OBJECTS {
                        if c.get("bench", &format!("/obj/16777216?cold={i}"), false)
                            .is_ok()
                        {
                            n += 1;
                        }
                    }
                }
                n
            });
            let hot = wrk(
                z.addr,
                1024,
                opts.duration,
                false,
                &pids(z.child.id()),
                None,
            )?;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let cold_hits = coldies.join().unwrap_or(0);
            println!(
                "xtask: bench: cold rep {} offload {:<5} hot 1 KiB: {:.0} req/s p50 {:.2} ms p99 {:.2} ms; cold 16 MiB hits: {}",
                rep + 1,
                offload,
                hot.rps,
                hot.p50_ms,
                hot.p99_ms,
                cold_hits
            );
            rows.push((offload, hot, cold_hits));
        }
    }
    let mut r = String::new();
    writeln!(r, "# Cold hits: `cargo xtask bench --cold`\n")?;
    writeln!(
        r,
        "Hot 1 KiB hits (wrk, 32 connections, {} s) while one client keeps fetching {COLD_OBJECTS} objects of 16 MiB whose cache files are evicted from the page cache (POSIX_FADV_DONTNEED) before every round. {} repetitions, medians, probe attached.\n",
        opts.duration, opts.reps
    )?;
    writeln!(
        r,
        "| cold-hit offload | hot req/s | hot p50 ms | hot p99 ms | cold hits served |"
    )?;
    writeln!(r, "|---|---|---|---|---|")?;
    for offload in [true, false] {
        let s: Vec<&(bool, Sample, u64)> = rows.iter().filter(|x| x.0 == offload).collect();
        writeln!(
            r,
            "| {} | {:.0} | {:.2} | {:.2} | {:.0} |",
            if offload { "on (default)" } else { "off" },
            median(s.iter().map(|x| x.1.rps).collect()),
            median(s.iter().map(|x| x.1.p50_ms).collect()),
            median(s.iter().map(|x| x.1.p99_ms).collect()),
            median(s.iter().map(|x| x.2 as f64).collect()),
        )?;
    }
    let out = root().join("xtask/bench/results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("cold.md"), &r)?;
    println!("\n{r}");
    println!("xtask: bench: written to xtask/bench/results/cold.md");
    Ok(())
}

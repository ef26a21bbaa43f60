//! The bench's table: medians per server and size, and the ratios against nginx.

use super::*;

pub(crate) fn med(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(samples.iter().map(f).collect())
}

pub(crate) fn report(
    opts: &Options,
    sizes: &[usize],
    results: &[Vec<Vec<Sample>>],
    unpins: Option<u64>,
    took: Duration,
) -> anyhow::Result<String> {
    let mut r = String::new();
    writeln!(r, "# zerocache vs nginx: `cargo xtask bench`\n")?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let nginx_v = Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    writeln!(
        r,
        "Machine: {} cores, kernel {}, {}. wrk -t2, {} s per run, {} repetitions in rotated order, medians; {} connections below 1 MB, {} from 1 MB up. Mode: {}. zerocache runs with the probe attached and is stopped while nginx is measured. CPU from /proc/PID/task/*/schedstat. Took {:.0} s.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim(),
        nginx_v,
        opts.duration,
        opts.reps,
        connections(1024),
        connections(1 << 20),
        match (opts.pin, opts.affinity, opts.unpinned) {
            (true, _, _) => "pinned (wrk on CPU 1, servers on CPU 0)",
            (false, true, _) => {
                "worker affinity (each server's workers pinned one per CPU: zerocache workers.cpu_affinity: true, nginx worker_cpu_affinity auto; wrk unpinned)"
            }
            (false, false, true) => {
                "unpinned (no server pins its workers: zerocache workers.cpu_affinity: false, nginx's default)"
            }
            (false, false, false) => {
                "defaults (wrk and servers on both cores; zerocache workers.cpu_affinity: auto pins its workers, nginx's are unpinned)"
            }
        },
        took.as_secs_f64()
    )?;
    writeln!(
        r,
        "| size | server | req/s | MB/s | p50 ms | p99 ms | errors | CPU-s/GB |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        for (k, server) in Server::ALL.iter().enumerate() {
            let s = &results[k][i];
            writeln!(
                r,
                "| {} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {} | {:.3} |",
                size_name(size),
                server.name(),
                med(s, |x| x.rps),
                med(s, |x| x.mbps),
                med(s, |x| x.p50_ms),
                med(s, |x| x.p99_ms),
                s.iter().map(|x| x.errors).sum::<u64>(),
                med(s, |x| x.cpu_s_per_gb),
            )?;
        }
    }
    writeln!(r, "\n## zerocache against the better nginx proxy_cache\n")?;
    writeln!(
        r,
        "| size | req/s ratio | CPU-s/GB ratio (lower is better) | p99 zerocache / better nginx |"
    )?;
    writeln!(r, "|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let zc = &results[0][i];
        let a = &results[1][i];
        let b = &results[2][i];
        let best_rps = med(a, |x| x.rps).max(med(b, |x| x.rps));
        let best_cpu = med(a, |x| x.cpu_s_per_gb).min(med(b, |x| x.cpu_s_per_gb));
        let best_p99 = med(a, |x| x.p99_ms).min(med(b, |x| x.p99_ms));
        writeln!(
            r,
            "| {} | {:.2}× | {:.2}× | {:.2} ms / {:.2} ms |",
            size_name(size),
            med(zc, |x| x.rps) / best_rps.max(1e-9),
            med(zc, |x| x.cpu_s_per_gb) / best_cpu.max(1e-12),
            med(zc, |x| x.p99_ms),
            best_p99
        )?;
    }
    if zc_affinity(opts) == "auto" {
        let n = unpins.map_or("unknown (a /metrics read failed)".to_string(), |n| {
            n.to_string()
        });
        writeln!(
            r,
            "\nzerocache workers moved off their CPU by `workers.cpu_affinity: auto` during the runs: {n}."
        )?;
    }
    writeln!(r, "\n## The probe's own cost\n")?;
    writeln!(
        r,
        "From the kernel's BPF statistics (kernel.bpf_stats_enabled=1): run_time_ns / run_cnt per program, times the syscall rate of the run. *On zerocache's syscalls* is the issue's figure: each output syscall's exit program (ns per run) times zerocache's calls of that syscall per request, as its own probe counted them, against zerocache's CPU time per request. *All processes* adds the runs that return early on everybody else's syscalls (wrk's writes here): a cost the probe puts on the machine rather than on zerocache. Every run includes the method's floor: bpf_stats reads the clock around each run, and a program that only returns measures ~60 ns on this machine.\n"
    )?;
    writeln!(
        r,
        "| size | zerocache syscalls/request | probe ns/request on them | zerocache CPU ns/request | share | all processes: probe ns/request | share | req/s probe on / off |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let on = &results[0][i];
        let off = &results[4][i];
        let own = med(on, |x| x.own_probe_ns_per_req());
        let all = med(on, |x| x.probe_ns_per_req);
        let cpu = med(on, |x| x.cpu_ns_per_req);
        let calls = on
            .first()
            .map(|x| x.own_calls.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|k| (med(on, |x| x.own_calls.get(&k).copied().unwrap_or(0.0)), k))
            .filter(|(n, _)| *n >= 0.005)
            .map(|(n, k)| format!("{n:.2} {k}"))
            .collect::<Vec<_>>()
            .join(" + ");
        writeln!(
            r,
            "| {} | {} | {:.0} | {:.0} | {:.1}% | {:.0} | {:.1}% | {:.2} |",
            size_name(size),
            calls,
            own,
            cpu,
            100.0 * own / cpu.max(1.0),
            all,
            100.0 * all / cpu.max(1.0),
            med(on, |x| x.rps) / med(off, |x| x.rps).max(1e-9)
        )?;
    }
    writeln!(
        r,
        "\nPer program (medians; programs that ran less than once per 100 requests left out):\n"
    )?;
    writeln!(r, "| size | program | runs/request | ns/run | ns/request |")?;
    writeln!(r, "|---|---|---|---|---|")?;
    for (i, &size) in sizes.iter().enumerate() {
        let on = &results[0][i];
        let names: std::collections::BTreeSet<String> =
            on.iter().flat_map(|x| x.programs.keys().cloned()).collect();
        for name in names {
            let runs = med(on, |x| x.programs.get(&name).map_or(0.0, |p| p.0));
            let ns = med(on, |x| x.programs.get(&name).map_or(0.0, |p| p.1));
            if runs >= 0.01 {
                writeln!(
                    r,
                    "| {} | {name} | {runs:.2} | {ns:.0} | {:.0} |",
                    size_name(size),
                    runs * ns
                )?;
            }
        }
    }
    Ok(r)
}

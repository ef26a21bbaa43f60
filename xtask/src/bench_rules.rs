//! `cargo xtask bench --rules`: what edge rules cost a hit (issue #46: at most 5% more CPU for a
//! 1 KiB HIT with 20 rules). One release binary, four proxies running at once in front of one
//! origin, the same objects: no rules; 20 rules none of which matches (every kind of matcher:
//! path prefixes, a regular expression, fields, query parameters, cookies, client ranges, host
//! globs); the same 20 with one more that matches every request and sets two response fields;
//! and a second proxy without rules, a control whose ratio to the first is the run's noise.
//! wrk drives one at a time, alternating the order, `--reps` times; the median of the paired
//! ratios (CPU per request and req/s, against no rules) goes to `xtask/bench/results/rules.md`.
//!
//! Each proxy runs on CPU 0 (one worker) and wrk on CPU 1: with both on both cores, wrk's
//! threads and the proxy's workers take turns on each. Even so the CPU time moves by more than
//! the effect from run to run, so each config's user-space instructions per hit are counted too,
//! under callgrind (`bench_instructions`): the figure that does not move.

use crate::bench::{Server, median, size_name, start_origin, warm};
use crate::bench_against::{measured_run, start, write_result};
use crate::root;
use std::fmt::Write as _;
use std::time::Instant;

/// Twenty rules a request for `/obj/N` from loopback matches none of.
fn twenty_rules() -> String {
    let mut y = String::from("    rules:\n");
    for i in 0..20 {
        let m = match i % 7 {
            0 => format!("{{ path_prefix: /admin{i}/ }}"),
            1 => format!("{{ path_regex: \"^/blog/{i}/(.*)$\" }}"),
            2 => format!("{{ headers: [{{ name: X-Beta-{i}, equals: \"1\" }}] }}"),
            3 => format!("{{ query: [{{ name: preview{i} }}] }}"),
            4 => format!("{{ cookies: [session{i}] }}"),
            5 => format!("{{ client_in: [10.{i}.0.0/16] }}"),
            _ => format!("{{ host: \"*.tenant{i}.example\" }}"),
        };
        let action = if i % 2 == 0 {
            "deny: 403".to_string()
        } else {
            format!("response_headers: {{ set: {{ X-Rule-{i}: \"yes\" }} }}")
        };
        writeln!(
            y,
            "      - name: r{i}\n        match: {m}\n        {action}"
        )
        .unwrap_or(());
    }
    y
}

/// Runs the comparison and writes `xtask/bench/results/rules.md`.
pub fn bench_rules(duration: u64, reps: usize) -> anyhow::Result<()> {
    crate::bench::build_release()?;
    let bin = root().join("target/release/zerocache");
    let base = root().join("target/bench-rules");
    let origin = start_origin()?;
    let none_match = twenty_rules();
    let one_match = format!(
        "{none_match}      - name: hsts\n        match: {{ path_prefix: /obj/ }}\n        response_headers: {{ set: {{ Strict-Transport-Security: \"max-age=31536000\", X-Edge: \"$route\" }} }}\n"
    );
    // The control is a second proxy without rules: how far two identical ones differ here is
    // the noise the other rows are read against.
    let configs = [
        ("no rules", String::new()),
        ("no rules (control)", String::new()),
        ("20 rules, none matching", none_match),
        ("21 rules, one matching with 2 fields", one_match),
    ];
    let mut proxies = Vec::new();
    for (i, (_, yaml)) in configs.iter().enumerate() {
        proxies.push(start(
            &bin,
            &base.join(i.to_string()),
            origin.addr,
            yaml,
            true,
        )?);
    }
    let size = 1024usize;
    for p in &proxies {
        warm(p.addr, Server::Zerocache, &[size])?;
    }
    println!("xtask: bench --rules: all warm, bodies checked");
    let started = Instant::now();
    let mut samples = vec![Vec::<(f64, f64)>::new(); configs.len()];
    // Clock ticks in user space and in the kernel, over every run of a config.
    let mut split = vec![(0u64, 0u64); configs.len()];
    for rep in 0..reps {
        for k in 0..configs.len() {
            let which = (k + rep) % configs.len();
            let p = &proxies[which];
            let server = crate::bench::pids(p.child.id());
            let (u0, s0) = crate::bench::user_sys_ticks(&server);
            let (s, per_req) = measured_run(p, size, duration, true)?;
            let (u1, s1) = crate::bench::user_sys_ticks(&server);
            split[which].0 += u1.saturating_sub(u0);
            split[which].1 += s1.saturating_sub(s0);
            println!(
                "xtask: bench --rules: rep {} {:<38} {:>10.0} req/s {:>7.1} µs CPU/req errors {}",
                rep + 1,
                configs[which].0,
                s.rps,
                per_req,
                s.errors
            );
            anyhow::ensure!(s.errors == 0, "errors in a run: the figures would lie");
            samples[which].push((s.rps, per_req));
        }
    }
    // The same configs, one at a time under callgrind: the ports and caches are theirs.
    let addrs: Vec<_> = proxies.iter().map(|p| p.addr).collect();
    drop(proxies);
    let mut instructions = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let conf = base.join(i.to_string()).join("zerocache.yaml");
        let n =
            crate::bench_instructions::per_request(&bin, &conf, *addr, &format!("/obj/{size}"))?;
        println!(
            "xtask: bench --rules: {:<38} {n:>8.0} instructions a hit",
            configs[i].0
        );
        instructions.push(n);
    }
    let mut r = String::new();
    writeln!(
        r,
        "# What edge rules cost a hit: `cargo xtask bench --rules`\n"
    )?;
    writeln!(
        r,
        "{} UTC. One release binary, four proxies at once (one a control without rules), each on CPU 0 (one worker), the probe off; {} HIT, wrk -t2 -c32 on CPU 1 over loopback, {duration} s per run after 1 s of warm-up, {reps} repetitions alternating the order, medians of the ratios paired rep by rep against no rules. Machine: {} cores. Took {:.0} s.\n",
        crate::bench_index::utc_now(),
        size_name(size),
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        started.elapsed().as_secs_f64()
    )?;
    writeln!(
        r,
        "| config | req/s | CPU µs/req | req/s ÷ no rules | CPU per request ÷ no rules | user space share of the CPU | user instructions a hit (callgrind) | ÷ no rules | CPU ÷ no rules, from instructions |"
    )?;
    writeln!(r, "|---|---|---|---|---|---|---|---|---|")?;
    let share = |i: usize| {
        let (u, s) = split[i];
        u as f64 / (u + s).max(1) as f64
    };
    for (i, (name, _)) in configs.iter().enumerate() {
        let med = |f: fn(&(f64, f64)) -> f64| median(samples[i].iter().map(f).collect());
        let paired = |f: fn(&(f64, f64)) -> f64| {
            median(
                samples[i]
                    .iter()
                    .zip(&samples[0])
                    .map(|(o, t)| f(o) / f(t).max(1e-9))
                    .collect(),
            )
        };
        let ratio = instructions[i] / instructions[0];
        writeln!(
            r,
            "| {name} | {:.0} | {:.1} | {:.3}× | {:.3}× | {:.0}% | {:.0} | {ratio:.3}× | {:.3}× |",
            med(|s| s.0),
            med(|s| s.1),
            paired(|s| s.0),
            paired(|s| s.1),
            share(i) * 100.0,
            instructions[i],
            1.0 + share(0) * (ratio - 1.0)
        )?;
    }
    writeln!(
        r,
        "\nInstructions: {} HITs counted after as many to warm up, one keep-alive connection, the proxy alone on CPU 0 under callgrind; user space only (a rule adds no syscall). The user space share is the proxy's `utime` over `utime + stime` during the runs (each with its 1 s warm-up); the last column is what the instructions alone say of the CPU: the no-rules proxy's CPU with its user-space part grown by the instruction ratio (the kernel's part is the same: a rule adds no syscall).",
        crate::bench_instructions::COUNTED
    )?;
    write_result("rules", &r)
}

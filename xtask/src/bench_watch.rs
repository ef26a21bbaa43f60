//! The probe's cost in watch mode, per syscall: what copy-loop detection adds to a watched
//! process's reads and socket sends, and what the read programs cost a process nobody watches.
//!
//! `zerocache watch` (release build) runs with copy-loop detection on, watching either the
//! workload (window *watched*) or an idle `sleep` (window *unwatched*: the read programs are
//! attached but the workload's syscalls return early). The workload in both: `dd` reading a
//! 64 MiB file in 4 KiB blocks into /dev/null (16,384 reads and writes) and the Python copy-loop
//! seed serving 4 × 16 MiB responses (reads of the file, sendto to the socket). Figures are the
//! kernel's BPF statistics (`kernel.bpf_stats_enabled=1`): run time ÷ run count per program over
//! the window, which also holds other processes' syscalls (the run counts show how few).

use crate::bench::bpf_programs;
use crate::{free_port, root};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SEED_RESPONSES: usize = 4;

/// One window: (runs, ns) per program.
type Window = BTreeMap<String, (u64, u64)>;

fn delta(before: &Window, after: &Window) -> Window {
    after
        .iter()
        .map(|(k, (t, n))| {
            let (t0, n0) = before.get(k).copied().unwrap_or((0, 0));
            (k.clone(), (n.saturating_sub(n0), t.saturating_sub(t0)))
        })
        .collect()
}

/// Runs the workload with `zerocache watch` watching it (`watched`) or not, and returns the
/// per-program deltas and the watch's JSON row of the workload's file reads (watched only).
fn window(dir: &std::path::Path, watched: bool) -> anyhow::Result<(Window, String)> {
    let file = dir.join("big.bin");
    // A shell that waits for a line, then becomes dd: its PID is known before the reads start.
    let mut dd = Kill(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "read x; exec dd if={} of=/dev/null bs=4096 status=none",
                file.display()
            ))
            .stdin(Stdio::piped())
            .spawn()?,
    );
    let port = free_port()?;
    let mut seed = Kill(
        Command::new("python3")
            .arg(root().join("xtask/seeds/python/server.py"))
            .args(["copy", &port.to_string()])
            .arg(dir.join("seed.bin"))
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let mut line = String::new();
    BufReader::new(
        seed.0
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("stdout"))?,
    )
    .read_line(&mut line)?;
    let idle = Kill(Command::new("sleep").arg("600").spawn()?);
    let targets: Vec<String> = if watched {
        vec![dd.0.id().to_string(), seed.0.id().to_string()]
    } else {
        vec![idle.0.id().to_string()]
    };
    let mut cmd = Command::new(root().join("target/release/zerocache"));
    cmd.args(["watch", "--no-dashboard", "--json"]);
    for t in &targets {
        cmd.args(["--pid", t]);
    }
    let mut watch = Kill(cmd.stdout(Stdio::piped()).spawn()?);
    let mut out = BufReader::new(
        watch
            .0
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("stdout"))?,
    );
    line.clear();
    out.read_line(&mut line)?;
    let before = bpf_programs(watch.0.id());
    dd.0.stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("stdin"))?
        .write_all(b"go\n")?;
    anyhow::ensure!(dd.0.wait()?.success(), "dd failed");
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    for i in 0..SEED_RESPONSES {
        let close = if i + 1 == SEED_RESPONSES {
            "Connection: close\r\n"
        } else {
            ""
        };
        s.write_all(format!("GET /x HTTP/1.1\r\nHost: b\r\n{close}\r\n").as_bytes())?;
    }
    let mut sink = Vec::new();
    s.read_to_end(&mut sink)?;
    anyhow::ensure!(
        sink.len() > SEED_RESPONSES * (16 << 20),
        "the seed sent {} bytes",
        sink.len()
    );
    let after = bpf_programs(watch.0.id());
    // The next JSON line has the workload's totals.
    std::thread::sleep(Duration::from_millis(1100));
    line.clear();
    out.read_line(&mut line)?;
    drop(idle);
    Ok((delta(&before, &after), line.trim().to_string()))
}

/// Measures both windows and returns the report section.
pub fn watch_cost() -> anyhow::Result<String> {
    let stats_path = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(stats_path).unwrap_or_default();
    std::fs::write(stats_path, "1")?;
    // Under target/, on the disk the checkout is on: a real filesystem, not tmpfs.
    let dir = root().join(format!("target/bench-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> anyhow::Result<_> {
        std::fs::write(dir.join("big.bin"), vec![1u8; 64 << 20])?;
        std::fs::write(dir.join("seed.bin"), vec![2u8; 16 << 20])?;
        let (unwatched, _) = window(&dir, false)?;
        let (watched, row) = window(&dir, true)?;
        Ok((watched, unwatched, row))
    })();
    let _ = std::fs::write(stats_path, stats_before.trim());
    let _ = std::fs::remove_dir_all(&dir);
    let (watched, unwatched, row) = result?;
    let mut r = String::new();
    writeln!(r, "\n## Watch mode: the probe's cost per syscall\n")?;
    writeln!(
        r,
        "`zerocache watch` with copy-loop detection on, the workload watched or not (the read programs attached either way): dd reading 64 MiB in 4 KiB blocks to /dev/null, and the Python copy-loop seed sending {SEED_RESPONSES} × 16 MiB. run_time_ns ÷ run_cnt per program from the kernel's BPF statistics over each window (which includes every other process's syscalls meanwhile; bpf_stats' own clock reads put the floor near 60 ns).\n"
    )?;
    writeln!(
        r,
        "| program | watched: runs | watched: ns/run | unwatched: runs | unwatched: ns/run |"
    )?;
    writeln!(r, "|---|---|---|---|---|")?;
    let names: std::collections::BTreeSet<&String> =
        watched.keys().chain(unwatched.keys()).collect();
    for name in names {
        let (wr, wt) = watched.get(name).copied().unwrap_or((0, 0));
        let (ur, ut) = unwatched.get(name).copied().unwrap_or((0, 0));
        if wr + ur < 100 {
            continue;
        }
        let per = |t: u64, n: u64| {
            if n == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", t as f64 / n as f64)
            }
        };
        writeln!(
            r,
            "| {name} | {wr} | {} | {ur} | {} |",
            per(wt, wr),
            per(ut, ur)
        )?;
    }
    // The figures the watch reported for the workload, picked out of its JSON line without a
    // JSON library: every `"key":value` pair of these keys, in order.
    let picked: Vec<String> = [
        "\"comm\"",
        "\"file_read_calls\"",
        "\"file_read_bytes\"",
        "\"copy_loop_bytes\"",
    ]
    .iter()
    .flat_map(|key| {
        let row = &row;
        row.match_indices(key).map(move |(at, _)| {
            let rest = &row[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            (at, rest[..end].to_string())
        })
    })
    .collect::<std::collections::BTreeMap<_, _>>()
    .into_values()
    .collect();
    writeln!(
        r,
        "\nWhat `zerocache watch --json` reported for the watched workload (`sh` is dd, watched before its exec): {}",
        picked.join(" ")
    )?;
    Ok(r)
}

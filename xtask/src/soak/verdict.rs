//! The soak's verdict: every request classified against the fault windows, and the table.

use super::*;

/// What the run left for the verdict.
pub(crate) struct Outcome<'a> {
    pub(crate) opts: &'a Options,
    pub(crate) dir: &'a Path,
    pub(crate) clients: usize,
    pub(crate) t0: Instant,
    pub(crate) stats: Vec<ClientStats>,
    pub(crate) windows: Vec<Window>,
    pub(crate) flips: Mutex<Vec<Flip>>,
    pub(crate) truncated: Mutex<Vec<Truncation>>,
    pub(crate) fault_files: BTreeMap<FaultKind, usize>,
    pub(crate) died: Option<String>,
    pub(crate) exit: String,
    pub(crate) end_note: String,
    /// (RSS, fds) at the start, at the peak and at the end; cache files left at the end.
    pub(crate) rss_fds: [(u64, u64); 3],
    pub(crate) files_left: usize,
}

/// Classifies every request and prints the table; an error when the run failed.
pub(crate) fn verdict(o: Outcome<'_>) -> anyhow::Result<()> {
    let Outcome {
        opts,
        dir,
        clients,
        t0,
        stats,
        windows,
        flips,
        truncated,
        fault_files,
        died,
        exit,
        end_note,
        rss_fds,
        files_left,
    } = o;
    let [
        (rss_start, fds_start),
        (peak_rss, peak_fds),
        (rss_end, fds_end),
    ] = rss_fds;
    let at = |t: Instant| t.duration_since(t0).as_secs_f64();
    // Classification.
    let flips = flips.into_inner().expect("flips");
    let truncated = truncated.into_inner().expect("truncated");
    // The fault a request overlapped: the latest one that began before it ended.
    let window_of = |s: Instant, e: Instant| {
        windows
            .iter()
            .rev()
            .find(|w| s <= w.end && e >= w.start)
            .map(|w| w.kind)
    };
    let mut by_op: BTreeMap<Op, u64> = BTreeMap::new();
    let (mut ok, mut dropped) = (0u64, 0u64);
    let mut expected: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut unexpected: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let mut in_fault: BTreeMap<FaultKind, u64> = BTreeMap::new();
    let mut explained_trunc = 0u64;
    let mut zero_after_truncation = 0u64;
    let (mut flipped_served, mut flipped_last) = (0u64, 0f64);
    let mut corrupt: Vec<&ErrRec> = Vec::new();
    let mut bad: Vec<&ErrRec> = Vec::new();
    for s in &stats {
        for (op, n) in &s.by_op {
            *by_op.entry(*op).or_default() += n;
        }
        ok += s.ok;
        dropped += s.dropped;
    }
    for r in stats.iter().flat_map(|s| s.records.iter()) {
        if r.kind == Kind::Corrupt {
            let flip_of = |p: u64, v: u8| {
                flips
                    .iter()
                    .find(|f| f.target == r.target && f.pos == p && f.value == v && f.at <= r.end)
            };
            let explained = r.diffs_complete
                && !r.diffs.is_empty()
                && r.diffs.iter().all(|(p, v)| flip_of(*p, *v).is_some());
            if explained {
                flipped_served += 1;
                for (p, v) in &r.diffs {
                    if let Some(f) = flip_of(*p, *v) {
                        flipped_last = flipped_last.max(r.end.duration_since(f.at).as_secs_f64());
                    }
                }
            } else if r.zero_fill.is_some_and(|first| {
                truncated
                    .iter()
                    .any(|t| t.target == r.target && t.body_len <= first && t.at <= r.end)
            }) {
                // The tail of a file this soak truncated underneath while its pages were in
                // flight: explained, like a flip (see the module documentation). sendfile's zeros
                // start at the cut; a copying read (an HTTP/2 stream's pread) racing the
                // truncation can copy a page the kernel was zeroing, so zeros past the cut.
                zero_after_truncation += 1;
            } else {
                corrupt.push(r);
            }
            continue;
        }
        if r.kind == Kind::Status {
            let code = r.detail.split_whitespace().nth(1).unwrap_or("?");
            let code = if r.op == Op::Purge || r.detail.starts_with("304 to") {
                r.detail.split(':').next().unwrap_or("?")
            } else {
                code
            };
            *statuses.entry(code.to_string()).or_default() += 1;
        }
        let fault = window_of(r.start, r.end);
        let by_truncation = matches!(r.kind, Kind::CutShort | Kind::Closed)
            && truncated
                .iter()
                .any(|t| t.target == r.target && t.at <= r.end);
        if let Some(k) = fault {
            *in_fault.entry(k).or_default() += 1;
        }
        if fault.is_some() || by_truncation {
            if fault.is_none() {
                explained_trunc += 1;
            }
            *expected.entry(r.kind).or_default() += 1;
        } else {
            *unexpected.entry(r.kind).or_default() += 1;
            bad.push(r);
        }
    }
    // Every error, for the kept directory.
    let mut all = String::new();
    let mut sorted: Vec<&ErrRec> = stats.iter().flat_map(|s| s.records.iter()).collect();
    sorted.sort_by_key(|r| r.start);
    for r in sorted {
        let _ = writeln!(
            all,
            "t={:.3}s..{:.3}s {:?} {} {} [{}]: {}",
            at(r.start),
            at(r.end),
            window_of(r.start, r.end),
            r.kind.label(),
            r.op.name(),
            r.target,
            r.detail
        );
    }
    let _ = std::fs::write(dir.join("errors.txt"), all);
    let requests: u64 = by_op.values().sum();
    let errors_total: u64 = requests - ok;
    let unexpected_total: u64 = unexpected.values().sum::<u64>() + dropped;
    let mut faults_by_kind: BTreeMap<FaultKind, u64> = BTreeMap::new();
    for w in &windows {
        *faults_by_kind.entry(w.kind).or_default() += 1;
    }

    // The table.
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let mut t = String::new();
    let line =
        "+------------------------------------------+------------+---------------+------------+\n";
    let row = |t: &mut String, a: &str, b: String, c: String, d: String| {
        let _ = writeln!(t, "| {a:<40} | {b:>10} | {c:>13} | {d:>10} |");
    };
    t.push_str(line);
    row(
        &mut t,
        &format!(
            "zerocache soak: {} s, {clients} clients, seed {}",
            opts.duration, opts.seed
        ),
        "total".into(),
        "during faults".into(),
        "unexpected".into(),
    );
    t.push_str(line);
    row(
        &mut t,
        "requests",
        requests.to_string(),
        String::new(),
        String::new(),
    );
    for (op, n) in &by_op {
        row(
            &mut t,
            &format!("  {}", op.name()),
            n.to_string(),
            String::new(),
            String::new(),
        );
    }
    row(&mut t, "ok", ok.to_string(), String::new(), String::new());
    row(
        &mut t,
        "errors",
        errors_total.to_string(),
        expected.values().sum::<u64>().to_string(),
        unexpected_total.to_string(),
    );
    for k in Kind::ERRORS {
        let (e, u) = (
            expected.get(&k).copied().unwrap_or(0),
            unexpected.get(&k).copied().unwrap_or(0),
        );
        row(
            &mut t,
            &format!("  {}", k.label()),
            (e + u).to_string(),
            e.to_string(),
            u.to_string(),
        );
    }
    if !statuses.is_empty() {
        let s: Vec<String> = statuses.iter().map(|(c, n)| format!("{c} x{n}")).collect();
        row(
            &mut t,
            &format!("    statuses: {}", s.join(", ")),
            String::new(),
            String::new(),
            String::new(),
        );
    }
    if explained_trunc > 0 {
        row(
            &mut t,
            "  (cut short: cache file truncated before)",
            explained_trunc.to_string(),
            String::new(),
            String::new(),
        );
    }
    if dropped > 0 {
        row(
            &mut t,
            "  (not recorded: too many)",
            dropped.to_string(),
            String::new(),
            dropped.to_string(),
        );
    }
    row(
        &mut t,
        "CORRUPT bodies (not an injected flip or truncation)",
        corrupt.len().to_string(),
        String::new(),
        corrupt.len().to_string(),
    );
    if zero_after_truncation > 0 {
        row(
            &mut t,
            "injected truncation served as zeros (in flight)",
            zero_after_truncation.to_string(),
            String::new(),
            zero_after_truncation.to_string(),
        );
    }
    row(
        &mut t,
        "stale-corrupt: injected flip served",
        flipped_served.to_string(),
        String::new(),
        String::new(),
    );
    if flipped_served > 0 {
        row(
            &mut t,
            "  last one, seconds after its flip",
            format!("{flipped_last:.1}"),
            String::new(),
            String::new(),
        );
    }
    t.push_str(line);
    row(
        &mut t,
        "faults injected",
        windows.len().to_string(),
        "errors in them".into(),
        String::new(),
    );
    for k in FaultKind::ALL {
        let n = faults_by_kind.get(&k).copied().unwrap_or(0);
        let files = fault_files
            .get(&k)
            .map(|f| format!(" ({f} files)"))
            .unwrap_or_default();
        row(
            &mut t,
            &format!("  {}{files}", k.label()),
            n.to_string(),
            in_fault.get(&k).copied().unwrap_or(0).to_string(),
            String::new(),
        );
    }
    t.push_str(line);
    row(&mut t, "proxy", "start".into(), "peak".into(), "end".into());
    row(
        &mut t,
        "  RSS",
        mib(rss_start),
        mib(peak_rss.max(rss_end)),
        mib(rss_end),
    );
    row(
        &mut t,
        "  open fds",
        fds_start.to_string(),
        peak_fds.max(fds_end).to_string(),
        fds_end.to_string(),
    );
    row(
        &mut t,
        "  cache files left after purge-all",
        String::new(),
        String::new(),
        files_left.to_string(),
    );
    let alive = died.clone().unwrap_or_else(|| format!("alive; {exit}"));
    let mut failures = Vec::new();
    if !corrupt.is_empty() {
        failures.push(format!("{} corrupt bodies", corrupt.len()));
    }
    if unexpected_total > 0 {
        failures.push(format!(
            "{unexpected_total} unexpected errors outside fault windows"
        ));
    }
    if let Some(d) = &died {
        failures.push(d.clone());
    }
    if end_note.contains("FAILED") {
        failures.push(end_note.clone());
    }
    let verdict = if failures.is_empty() {
        "PASS".to_string()
    } else {
        "FAIL".to_string()
    };
    row(&mut t, "verdict", verdict, String::new(), String::new());
    t.push_str(line);
    println!();
    print!("{t}");
    println!("  proxy: {alive}; {end_note}");
    let mut per_second: BTreeMap<u64, u64> = BTreeMap::new();
    for r in stats.iter().flat_map(|s| s.records.iter()) {
        *per_second
            .entry(r.end.duration_since(t0).as_secs())
            .or_default() += 1;
    }
    if !per_second.is_empty() {
        let s: Vec<String> = per_second
            .iter()
            .map(|(t, n)| format!("{t}s:{n}"))
            .collect();
        println!(
            "  errors (flipped bodies included) by second of the run: {}",
            s.join(" ")
        );
    }
    for r in corrupt.iter().chain(bad.iter()).take(12) {
        println!(
            "  {} t={:.2}s..{:.2}s {} {}: {}",
            r.kind.label(),
            at(r.start),
            at(r.end),
            r.op.name(),
            r.target,
            r.detail
        );
    }
    if failures.is_empty() {
        if std::env::var_os("XTASK_SOAK_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    } else {
        bail!(
            "soak failed: {} (seed {}; config, cache and proxy log kept in {})",
            failures.join("; "),
            opts.seed,
            dir.display()
        )
    }
}

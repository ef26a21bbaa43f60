//! The terminal table of `zerocache watch`: one line per watched process, like `top`. Bytes in
//! binary units; the same figures as `/api/processes` and `--json`.

use zerocache_dashboard::processes::Process;
use zerocache_probe::kind;

/// Column headers, in order.
pub const HEADERS: [&str; 12] = [
    "PID",
    "PROCESS",
    "STATE",
    "CONNS",
    "SENDFILE",
    "SPLICE",
    "COPIED",
    "FILE READ",
    "COPY-LOOP",
    "ZERO-COPY",
    "LOOP SHARE",
    "VERDICT",
];

/// Bytes as `12.3 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn percent(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{:.1}%", 100.0 * r))
}

/// The table for `rows`: a header line and one line per process; with no rows, the header and
/// `(no process watched)`.
pub fn render(rows: &[Process]) -> String {
    let mut cells: Vec<Vec<String>> = vec![HEADERS.iter().map(|h| h.to_string()).collect()];
    for p in rows {
        let t = &p.totals;
        cells.push(vec![
            t.pid.to_string(),
            t.comm.clone(),
            if t.alive { "running" } else { "exited" }.into(),
            p.connections.to_string(),
            bytes(t.socket.by_kind[kind::SENDFILE as usize].bytes),
            bytes(t.socket.by_kind[kind::SPLICE as usize].bytes),
            bytes(t.socket.copy_bytes()),
            bytes(t.file_read_bytes),
            bytes(t.copy_loop_bytes),
            percent(p.socket_zero_copy_ratio),
            percent(p.copy_loop_share),
            p.verdict.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..HEADERS.len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no process watched)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocache_probe::ProcessTotals;

    #[test]
    fn renders_an_empty_and_a_full_table() {
        let empty = render(&[]);
        assert!(empty.starts_with("PID  PROCESS  STATE"), "{empty}");
        assert!(empty.ends_with("(no process watched)\n"), "{empty}");
        let mut t = ProcessTotals {
            pid: 42,
            comm: "java".into(),
            alive: true,
            copy_loop_bytes: 16 << 20,
            file_read_bytes: 16 << 20,
            ..Default::default()
        };
        t.socket.by_kind[kind::WRITE as usize].bytes = (16 << 20) + 100;
        let table = render(&[Process::new(t, 1)]);
        let line = table.lines().nth(1).expect("row");
        assert!(line.starts_with("42 "), "{table}");
        assert!(line.contains("16.0 MiB"), "{table}");
        assert!(line.ends_with("copy-loop"), "{table}");
        assert!(line.contains("0.0%"), "{table}");
    }

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(16 << 20), "16.0 MiB");
    }
}

//! Reads what each test binary left in a guest's results directory (libtest's stdout, the
//! binary's stderr, its exit code) into one status per test, and prints the kernel × test table.
//!
//! From stdout: `test NAME ... ok|FAILED|ignored[, reason]`, and for a failure the first line of
//! its panic message in the `---- NAME stdout ----` section. From stderr: the
//! `skipped NAME: needs ...` lines gated tests print when they skip (proxy/tests/it/support/
//! require.rs). A test that started and never ended is the one the binary crashed or timed out in;
//! a listed test never started did not run. Each status keeps its reason for the lines under the
//! table.

use std::collections::BTreeMap;
use std::path::Path;

/// The outcome of one test on one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
    Ignored,
    /// Started, never finished: the binary crashed or was killed at its timeout.
    Crash,
    /// Never started (an earlier crash, a guest that did not boot).
    NotRun,
}

impl Status {
    fn cell(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
            Status::Ignored => "ignored",
            Status::Crash => "CRASH",
            Status::NotRun => "not run",
        }
    }

    /// Whether it counts against a kernel that is expected to pass.
    pub fn is_bad(self) -> bool {
        matches!(self, Status::Fail | Status::Crash | Status::NotRun)
    }
}

/// One test's outcome and why.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub status: Status,
    pub reason: Option<String>,
}

/// Parses one binary's results (`<id>.out`, `.err`, `.rc` in `dir`) for the tests it was to run.
pub fn parse_job(dir: &Path, id: &str, planned: &[String]) -> BTreeMap<String, Outcome> {
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{id}.{ext}"))).ok();
    let out = read("out").unwrap_or_default();
    let err = read("err").unwrap_or_default();
    let rc: Option<i32> = read("rc").and_then(|s| s.trim().parse().ok());
    let mut results: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut started: Option<String> = None;
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, result)) = rest.split_once(" ... ") else {
            // "test NAME ..." with the result still to come (or never, on a crash).
            if let Some(name) = rest.strip_suffix(" ...") {
                started = Some(name.to_string());
            }
            continue;
        };
        let (status, reason) = match result.trim() {
            "ok" => (Status::Pass, None),
            "FAILED" => (Status::Fail, panic_message(&out, name)),
            r if r.starts_with("ignored") => (
                Status::Ignored,
                r.strip_prefix("ignored, ").map(str::to_string),
            ),
            "" => {
                started = Some(name.to_string());
                continue;
            }
            // Something else wrote to the test's stdout between "test NAME ... " and its result
            // (a child process that inherited it). The summary at the end still says how it went.
            other if listed_failure(&out, name) => (
                Status::Fail,
                Some(format!(
                    "{} (its result line was cut by other output: {other:?})",
                    panic_message(&out, name).unwrap_or_default()
                )),
            ),
            _ if out.lines().any(|l| l.starts_with("test result: ")) => (Status::Pass, None),
            _ => {
                started = Some(name.to_string());
                continue;
            }
        };
        started = None;
        results.insert(name.to_string(), Outcome { status, reason });
    }
    for line in err.lines() {
        let Some((name, need)) = line
            .strip_prefix("skipped ")
            .and_then(|l| l.split_once(": "))
        else {
            continue;
        };
        if let Some(o) = results.get_mut(name).filter(|o| o.status == Status::Pass) {
            *o = Outcome {
                status: Status::Skip,
                reason: Some(need.to_string()),
            };
        }
    }
    let ended = match rc {
        None => "the guest stopped before the binary ended (crash or timeout)".to_string(),
        Some(124) | Some(137) => "the binary was killed at its timeout".to_string(),
        Some(c) if c > 128 => format!("the binary died of signal {}", c - 128),
        Some(c) => format!("the binary exited {c}"),
    };
    if let Some(name) = started {
        let tail = err.lines().rev().find(|l| !l.trim().is_empty());
        let reason = match tail {
            Some(t) => format!("{ended}; last stderr line: {}", clip(t)),
            None => ended.clone(),
        };
        results.insert(
            name,
            Outcome {
                status: Status::Crash,
                reason: Some(reason),
            },
        );
    }
    for name in planned {
        results.entry(name.clone()).or_insert_with(|| Outcome {
            status: Status::NotRun,
            reason: Some(ended.clone()),
        });
    }
    results
}

/// Whether libtest's closing list of failures names `name`.
fn listed_failure(out: &str, name: &str) -> bool {
    let lines: Vec<&str> = out.lines().collect();
    let Some(last) = lines.iter().rposition(|l| l.trim_end() == "failures:") else {
        return false;
    };
    lines[last + 1..]
        .iter()
        .take_while(|l| !l.starts_with("test result: "))
        .any(|l| l.starts_with("    ") && l.trim() == name)
}

/// The first line of the panic message in the `---- NAME stdout ----` section, if any.
fn panic_message(out: &str, name: &str) -> Option<String> {
    let header = format!("---- {name} stdout ----");
    let section: Vec<&str> = out
        .lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.starts_with("---- ") && l.trim() != "failures:")
        .collect();
    let at = section.iter().position(|l| l.contains("panicked at"));
    let message: Vec<&str> = match at {
        // "thread 'x' panicked at src/x.rs:1:2:" then the message, "left: ..", "right: .." lines.
        Some(i) if section[i].trim_end().ends_with(':') => section[i + 1..]
            .iter()
            .take_while(|l| !l.trim().is_empty() && !l.starts_with("note: "))
            .map(|l| l.trim())
            .collect(),
        Some(i) => vec![section[i]],
        None => section
            .iter()
            .find(|l| !l.trim().is_empty())
            .copied()
            .into_iter()
            .collect(),
    };
    (!message.is_empty()).then(|| clip(&message.join(" / ")))
}

fn clip(line: &str) -> String {
    let line = line.trim();
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

/// A kernel's column: its label and each row's outcome.
pub struct Column<'a> {
    pub label: &'a str,
    pub results: &'a BTreeMap<String, Outcome>,
}

/// Prints the table (rows in `rows` order), then every outcome that is not a pass, with reason.
pub fn print_table(rows: &[String], columns: &[Column<'_>]) {
    let width = rows
        .iter()
        .map(|r| r.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let col = columns
        .iter()
        .map(|c| c.label.len())
        .max()
        .unwrap_or(0)
        .max("not run".len());
    let mut head = format!("{:width$}", "test");
    for c in columns {
        head.push_str(&format!(" | {:col$}", c.label));
    }
    println!("{head}");
    println!("{}", "-".repeat(head.chars().count()));
    for row in rows {
        let mut line = format!("{row:width$}");
        for c in columns {
            let cell = c.results.get(row).map_or("-", |o| o.status.cell());
            line.push_str(&format!(" | {cell:col$}"));
        }
        println!("{line}");
    }
    for c in columns {
        for row in rows {
            let Some(o) = c.results.get(row) else {
                continue;
            };
            if o.status != Status::Pass {
                let why = o.reason.as_deref().unwrap_or("");
                println!("  {} {} {row}: {why}", c.label, o.status.cell());
            }
        }
    }
}

/// (passed, failed-or-crashed-or-not-run, skipped) in a column.
pub fn counts(results: &BTreeMap<String, Outcome>) -> (usize, usize, usize) {
    let n = |f: &dyn Fn(Status) -> bool| results.values().filter(|o| f(o.status)).count();
    (
        n(&|s| s == Status::Pass),
        n(&|s| s.is_bad()),
        n(&|s| matches!(s, Status::Skip | Status::Ignored)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_reasons_come_from_libtest_output_stderr_and_exit_code() {
        let dir = tempdir();
        let out = "\nrunning 4 tests\ntest a ... ok\ntest b ... FAILED\ntest c ... ignored, slow\n\
                   test s ... ok\ntest d ... \n\nfailures:\n\n---- b stdout ----\n\n\
                   thread 'b' (7) panicked at x.rs:1:2:\nassertion `left == right` failed\n  \
                   left: 1\n right: 2\nnote: run with `RUST_BACKTRACE=1`\n\nfailures:\n    b\n";
        std::fs::write(dir.join("j.out"), out).unwrap();
        std::fs::write(dir.join("j.err"), "skipped s: needs root (x)\nbye\n").unwrap();
        std::fs::write(dir.join("j.rc"), "139\n").unwrap();
        let planned: Vec<String> = ["a", "b", "c", "s", "d", "e"].map(String::from).to_vec();
        let r = parse_job(&dir, "j", &planned);
        let status = |n: &str| r[n].status;
        assert_eq!(status("a"), Status::Pass);
        assert_eq!(status("b"), Status::Fail);
        assert_eq!(
            r["b"].reason.as_deref(),
            Some("assertion `left == right` failed / left: 1 / right: 2")
        );
        assert_eq!(status("c"), Status::Ignored);
        assert_eq!(status("s"), Status::Skip);
        assert_eq!(r["s"].reason.as_deref(), Some("needs root (x)"));
        assert_eq!(status("d"), Status::Crash);
        assert_eq!(
            r["d"].reason.as_deref(),
            Some("the binary died of signal 11; last stderr line: bye")
        );
        assert_eq!(status("e"), Status::NotRun);
        assert_eq!(counts(&r), (1, 3, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A child that inherited the test's stdout (a JVM's fatal-error report starts with "#")
    /// can cut "test NAME ... " from its result: the closing summary decides.
    #[test]
    fn a_result_line_cut_by_a_childs_output_is_read_from_the_summary() {
        let dir = tempdir();
        let out = "\nrunning 2 tests\ntest j ... #\n# A fatal error\n#\nFAILED\n\
                   test k ... # x\nok\n\nfailures:\n\n---- j stdout ----\n\
                   thread 'j' (7) panicked at x.rs:1:2:\nbuilding seed java: exit status: 1\n\n\
                   failures:\n    j\n\ntest result: FAILED. 1 passed; 1 failed\n";
        std::fs::write(dir.join("g.out"), out).unwrap();
        std::fs::write(dir.join("g.rc"), "101\n").unwrap();
        let r = parse_job(&dir, "g", &["j".to_string(), "k".to_string()]);
        assert_eq!(r["j"].status, Status::Fail);
        assert_eq!(
            r["j"].reason.as_deref(),
            Some(
                "building seed java: exit status: 1 (its result line was cut by other output: \"#\")"
            )
        );
        assert_eq!(r["k"].status, Status::Pass);
        // Without a summary (the binary died), the cut test is a crash, not a pass.
        std::fs::write(dir.join("h.out"), "test j ... #\n").unwrap();
        std::fs::write(dir.join("h.rc"), "137\n").unwrap();
        let r = parse_job(&dir, "h", &["j".to_string()]);
        assert_eq!(r["j"].status, Status::Crash);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_binary_that_never_ran_leaves_every_test_not_run() {
        let dir = tempdir();
        let r = parse_job(&dir, "missing", &["a".to_string()]);
        assert_eq!(r["a"].status, Status::NotRun);
        assert_eq!(
            r["a"].reason.as_deref(),
            Some("the guest stopped before the binary ended (crash or timeout)")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xtask-vm-report-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

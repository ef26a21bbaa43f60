//! `zerocache check-cache`: every entry file under a cache directory checked offline, header and
//! body, against the checksums its fill stored, with the corrupt ones named and, on request,
//! deleted. Safe on a directory a running proxy uses: a file that disappears meanwhile is not
//! counted, and the proxy's open files keep their bytes.

use super::entry::{self, CorruptEntry};
use super::scrub::{PIECE, still_named, verify_body};
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// What `zerocache check-cache` found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CheckReport {
    /// Entry files looked at.
    pub checked: u64,
    /// Entry files whose header or body does not hold.
    pub corrupt: u64,
    /// Entry files (or directories) that could not be read.
    pub unreadable: u64,
    /// Corrupt files deleted (with `remove`).
    pub removed: u64,
}

impl CheckReport {
    /// The summary line.
    pub fn summary(&self) -> String {
        format!(
            "checked {} entries, {} corrupt, {} unreadable",
            self.checked, self.corrupt, self.unreadable
        )
    }

    /// True when nothing was corrupt or unreadable.
    pub fn clean(&self) -> bool {
        self.corrupt == 0 && self.unreadable == 0
    }
}

/// Verifies every entry file under the cache directory `dir` (every shard level; not `tmp/`, whose
/// files are unfinished fills, nor `state/`), writing `corrupt: <path> <key>` to `out` for each corrupt one
/// (`-` for the key when the header itself is corrupt) and notes about unreadable or foreign
/// files to `err`. With `remove`, deletes the corrupt files. Works on a directory a running proxy
/// uses too: a file that disappears meanwhile is not counted.
pub fn check_dir(
    dir: &Path,
    remove: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<CheckReport> {
    let mut report = CheckReport::default();
    let mut buf = Vec::with_capacity(PIECE);
    let mut dirs = vec![dir.to_path_buf()];
    let mut top = true;
    while let Some(d) = dirs.pop() {
        let listing = match std::fs::read_dir(&d) {
            Ok(l) => l,
            Err(e) if top => return Err(e),
            Err(e) => {
                writeln!(err, "unreadable: {}: {e}", d.display())?;
                report.unreadable += 1;
                continue;
            }
        };
        top = false;
        let mut files = Vec::new();
        for item in listing {
            let item = match item {
                Ok(i) => i,
                Err(e) => {
                    writeln!(err, "unreadable: {}: {e}", d.display())?;
                    report.unreadable += 1;
                    continue;
                }
            };
            let path = item.path();
            match item.file_type() {
                Ok(t) if t.is_dir() => {
                    if super::store::holds_entries(dir, &path) {
                        dirs.push(path);
                    }
                }
                Ok(_) => files.push(path),
                Err(e) => {
                    writeln!(err, "unreadable: {}: {e}", path.display())?;
                    report.unreadable += 1;
                }
            }
        }
        files.sort();
        for path in files {
            check_file(&path, remove, &mut buf, &mut report, out, err)?;
        }
    }
    Ok(report)
}

/// One file of [`check_dir`].
fn check_file(
    path: &Path,
    remove: bool,
    buf: &mut Vec<u8>,
    report: &mut CheckReport,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.is_empty() || u128::from_str_radix(name, 16).is_err() {
        writeln!(err, "skipped: {} (not a cache entry file)", path.display())?;
        return Ok(());
    }
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            report.checked += 1;
            report.unreadable += 1;
            writeln!(err, "unreadable: {}: {e}", path.display())?;
            return Ok(());
        }
    };
    report.checked += 1;
    let (verdict, key) = match entry::read_entry_header(&file) {
        Ok(h) => (
            verify_body(&file, h.body_offset, h.body_len, h.body_checksum, buf),
            h.meta.key,
        ),
        Err(e) => (Err(e), "-".to_string()),
    };
    match verdict {
        Ok(()) => {}
        Err(CorruptEntry::Io(e)) => {
            report.unreadable += 1;
            writeln!(err, "unreadable: {}: {e}", path.display())?;
        }
        Err(why) => {
            report.corrupt += 1;
            writeln!(out, "corrupt: {} {key}", path.display())?;
            writeln!(err, "{}: {why}", path.display())?;
            // Not a file a newer fill renamed over the one that was read.
            if remove && still_named(path, &file) {
                match std::fs::remove_file(path) {
                    Ok(()) => {
                        report.removed += 1;
                        writeln!(err, "removed: {}", path.display())?;
                    }
                    Err(e) => writeln!(err, "could not remove {}: {e}", path.display())?,
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::test_support::{body, flip, put, store};

    use std::os::unix::fs::FileExt;

    #[test]
    fn check_dir_reports_corrupt_entries_and_removes_them_on_request() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let good = put(&s, "/good", &body(100_000, 4));
        let bad = put(&s, "/bad", &body(100_000, 5));
        flip(&bad, 500);
        // A torn header, and a file that is no entry at all.
        let torn = put(&s, "/torn", b"torn");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&torn.path)
            .and_then(|f| f.write_all_at(b"\xff", 20))
            .expect("tear");
        std::fs::write(tmp.path().join("notes.txt"), "hello").expect("write");
        std::fs::write(s.temp_path(), "unfinished fill").expect("write");
        drop(s);

        let run = |remove: bool| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let r = check_dir(tmp.path(), remove, &mut out, &mut err).expect("check");
            (
                r,
                String::from_utf8(out).expect("utf8"),
                String::from_utf8(err).expect("utf8"),
            )
        };
        let (r, out, err) = run(false);
        assert_eq!(
            (r.checked, r.corrupt, r.unreadable, r.removed),
            (3, 2, 0, 0),
            "{out}{err}"
        );
        assert!(!r.clean());
        assert_eq!(r.summary(), "checked 3 entries, 2 corrupt, 0 unreadable");
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        let mut want = vec![
            format!("corrupt: {} {}", bad.path.display(), bad.meta.key),
            format!("corrupt: {} -", torn.path.display()),
        ];
        want.sort();
        assert_eq!(lines, want);
        assert!(err.contains("notes.txt (not a cache entry file)"), "{err}");
        assert!(bad.path.exists());

        let (r, _, err) = run(true);
        assert_eq!((r.corrupt, r.removed), (2, 2), "{err}");
        assert!(!bad.path.exists() && !torn.path.exists() && good.path.exists());
        let (r, out, _) = run(false);
        assert_eq!((r.checked, r.corrupt, r.unreadable), (1, 0, 0));
        assert!(r.clean() && out.is_empty());
        assert!(
            check_dir(
                &tmp.path().join("missing"),
                false,
                &mut Vec::new(),
                &mut Vec::new()
            )
            .is_err()
        );
    }
}

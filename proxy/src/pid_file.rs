//! `pid_file`: the process id written where scripts find it (logrotate's `postrotate`, an init
//! system without systemd), as nginx's `pid` directive.
//!
//! Written once the listeners are bound (a file naming a process that is not serving would send
//! signals to nothing useful), atomically (a temp file renamed over it, so a reader never sees
//! half a number), and removed at exit only while it still names this process (a successor that
//! rewrote it keeps its own).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The pid file of this process; removed when dropped, if it still holds this pid.
pub(crate) struct PidFile {
    path: PathBuf,
    pid: u32,
}

impl PidFile {
    /// Writes this process's id, followed by a newline, to `path`.
    pub(crate) fn write(path: &Path) -> std::io::Result<PidFile> {
        let pid = std::process::id();
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(format!(".{pid}.tmp"));
        let tmp = PathBuf::from(tmp_name);
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            writeln!(f, "{pid}")?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours =
            std::fs::read_to_string(&self.path).is_ok_and(|s| s.trim() == self.pid.to_string());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_whole_and_removed_only_while_it_is_ours() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("z.pid");
        std::fs::write(&path, "999999\n").expect("stale");
        let f = PidFile::write(&path).expect("write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            format!("{}\n", std::process::id())
        );
        drop(f);
        assert!(!path.exists(), "removed at exit");
        // A successor rewrote it: it stays.
        let f = PidFile::write(&path).expect("write");
        std::fs::write(&path, "4242\n").expect("successor");
        drop(f);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "4242\n");
    }
}

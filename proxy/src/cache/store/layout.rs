//! Where the cache's files live: entries under `levels` of shard directories named by hash
//! (`dir/ab/<32 hex digits>` for one level), fills in `dir/tmp/` until they are committed by a
//! rename on the same filesystem, so a reader never sees a half-written entry under its final
//! name and a crash leaves only temp files, which the rebuild deletes. The cache's own state
//! that must outlive a restart (the fleet's epoch and purge log) lives in `dir/state/`, which
//! nothing that walks entries enters: the rebuild deletes every file it cannot read as an entry,
//! and state kept beside the shards was deleted with them.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory of fills in progress, under the cache directory.
const TMP: &str = "tmp";

/// The directory of state kept across restarts, under the cache directory.
const STATE: &str = "state";

/// State files that older versions kept at the top of the cache directory, where the rebuild
/// took them for foreign files: moved into [`STATE`] before anything walks the directory.
const STATE_FILES_AT_THE_TOP: [&str; 2] = ["fleet-epoch", "fleet-purge-log"];

/// The directory of state kept across restarts under the cache directory `dir` (created if it
/// can be: a failure shows when the state is written, where it is logged).
pub(crate) fn state_dir(dir: &Path) -> PathBuf {
    let state = dir.join(STATE);
    let _ = fs::create_dir_all(&state);
    state
}

/// Whether `path`, a directory under the cache directory `dir`, holds entries: neither fills in
/// progress nor state.
pub(crate) fn holds_entries(dir: &Path, path: &Path) -> bool {
    path != dir.join(TMP) && path != dir.join(STATE)
}

/// The directory layout of one store.
pub(crate) struct Layout {
    dir: PathBuf,
    levels: u8,
    tmp_seq: AtomicU64,
}

impl Layout {
    /// The layout under `dir` with `levels` shard levels; creates `dir/tmp` and `dir/state`, and
    /// moves state files an older version left at the top into `dir/state`.
    pub(crate) fn create(dir: &Path, levels: u8) -> io::Result<Layout> {
        fs::create_dir_all(dir.join(TMP))?;
        let state = dir.join(STATE);
        fs::create_dir_all(&state)?;
        for name in STATE_FILES_AT_THE_TOP {
            let (old, new) = (dir.join(name), state.join(name));
            if old.is_file() && !new.exists() {
                fs::rename(&old, &new)?;
                tracing::info!(from = %old.display(), to = %new.display(), "moved cache state into its directory");
            }
        }
        Ok(Layout {
            dir: dir.to_path_buf(),
            levels,
            tmp_seq: AtomicU64::new(0),
        })
    }

    /// The cache directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Shard directory levels.
    pub(crate) fn levels(&self) -> u8 {
        self.levels
    }

    /// The directory of fills in progress.
    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.dir.join(TMP)
    }

    /// Path of the final file for `hash`, creating its shard directories.
    pub(crate) fn entry_path(&self, hash: u128) -> io::Result<PathBuf> {
        let path = self.entry_path_unchecked(hash);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        Ok(path)
    }

    /// Path of the final file for `hash` under the current `levels`, without creating anything.
    ///
    /// Written into one buffer: a hit on an entry that is not hot builds this path, and the
    /// shard and file names formatted apart and joined cost a few allocations and a formatter
    /// pass each. A test holds it to that join.
    pub(crate) fn entry_path_unchecked(&self, hash: u128) -> PathBuf {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let whole = self.dir.as_os_str().as_bytes();
        // Each level and the name push their `/`: none of the directory's own may end it.
        let mut dir = whole;
        while let Some(d) = dir.strip_suffix(b"/") {
            dir = d;
        }
        let mut p = Vec::with_capacity(dir.len() + 3 * usize::from(self.levels) + 33);
        p.extend_from_slice(dir);
        let hex = |p: &mut Vec<u8>, byte: u8| {
            p.extend_from_slice(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
        };
        // As `CacheKey::shard`: a level per byte, from the low ones.
        for i in 0..self.levels {
            p.push(b'/');
            hex(&mut p, (hash >> (8 * u32::from(i))) as u8);
        }
        // As `CacheKey::file_name`: 32 digits, most significant first.
        p.push(b'/');
        for byte in hash.to_be_bytes() {
            hex(&mut p, byte);
        }
        if whole.is_empty() {
            // An empty directory is the working directory, as `Path::join` takes it.
            p.remove(0);
        }
        PathBuf::from(std::ffi::OsString::from_vec(p))
    }

    /// A fresh temp file path (same filesystem, so the commit is a rename). Unique per process
    /// and fill: the pid keeps a restarted proxy from colliding with its predecessor's leftovers.
    pub(crate) fn temp_path(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        self.tmp_dir()
            .join(format!("{}-{n}.tmp", std::process::id()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::key::CacheKey;

    #[test]
    fn entries_are_sharded_by_hash_and_fills_go_to_tmp() {
        let tmp = tempfile::tempdir().expect("tmp");
        let l = Layout::create(tmp.path(), 2).expect("layout");
        assert!(tmp.path().join("tmp").is_dir());
        let hash = 0x0123_4567_89ab_cdef_0011_2233_4455_6677u128;
        let p = l.entry_path(hash).expect("path");
        assert_eq!(p, l.entry_path_unchecked(hash));
        assert!(
            p.parent().is_some_and(Path::is_dir),
            "shard directories are created"
        );
        assert_eq!(
            p.strip_prefix(tmp.path())
                .expect("under dir")
                .components()
                .count(),
            3,
            "two shard levels, then the file"
        );
        assert_eq!(
            p.file_name().and_then(|n| n.to_str()),
            Some(CacheKey::file_name(hash).as_str())
        );
        let (a, b) = (l.temp_path(), l.temp_path());
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(l.tmp_dir().as_path()));
        let pid = std::process::id();
        assert_eq!(
            a.file_name().and_then(|n| n.to_str()),
            Some(format!("{pid}-0.tmp").as_str())
        );
    }

    #[test]
    fn an_entry_path_is_the_shards_and_file_name_joined() {
        let tmp = tempfile::tempdir().expect("tmp");
        for levels in [0, 1, 2, 3] {
            let l = Layout::create(tmp.path(), levels).expect("layout");
            let slash = Layout::create(&tmp.path().join(""), levels).expect("layout");
            for hash in [0, 1, u128::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210] {
                let joined = tmp
                    .path()
                    .join(CacheKey::shard(hash, levels))
                    .join(CacheKey::file_name(hash));
                let path = l.entry_path_unchecked(hash);
                assert_eq!(path.as_os_str(), joined.as_os_str(), "{levels} {hash:x}");
                assert_eq!(
                    slash.entry_path_unchecked(hash).as_os_str(),
                    joined.as_os_str()
                );
                // The root and the working directory (an empty path), which nothing rejects.
                for dir in ["/", ""] {
                    let at = Layout {
                        dir: PathBuf::from(dir),
                        levels,
                        tmp_seq: AtomicU64::new(0),
                    };
                    let joined = Path::new(dir)
                        .join(CacheKey::shard(hash, levels))
                        .join(CacheKey::file_name(hash));
                    assert_eq!(
                        at.entry_path_unchecked(hash).as_os_str(),
                        joined.as_os_str()
                    );
                }
            }
        }
    }

    #[test]
    fn state_left_at_the_top_by_an_older_version_moves_into_the_state_directory() {
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::write(tmp.path().join("fleet-epoch"), "5 0\n").expect("epoch");
        std::fs::write(tmp.path().join("fleet-purge-log"), "old\n").expect("log");
        // A newer file already in place wins over a stale one at the top.
        std::fs::create_dir_all(state_dir(tmp.path())).expect("state");
        std::fs::write(state_dir(tmp.path()).join("fleet-purge-log"), "new\n").expect("log");
        Layout::create(tmp.path(), 1).expect("layout");
        let read = |p: PathBuf| std::fs::read_to_string(p).expect("read");
        assert_eq!(read(state_dir(tmp.path()).join("fleet-epoch")), "5 0\n");
        assert_eq!(read(state_dir(tmp.path()).join("fleet-purge-log")), "new\n");
        assert!(!tmp.path().join("fleet-epoch").exists());
        assert!(holds_entries(tmp.path(), &tmp.path().join("ab")));
        assert!(!holds_entries(tmp.path(), &state_dir(tmp.path())));
        assert!(!holds_entries(tmp.path(), &tmp.path().join("tmp")));
    }
}

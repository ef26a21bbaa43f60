//! The fleet purge log: every fleet purge this member applied (the ones it started and the ones
//! peers sent), with its epoch, kept on disk in the cache directory and bounded by count
//! (`fleet.purge_log_max`) and age (`fleet.purge_log_age`). A member that finds a peer ahead of
//! it (it was down, or cut off, during a purge) asks that peer for its log since its own epoch
//! and applies what it missed ([`super::health`]): it refetches the purged objects only, not its
//! whole share. Only when the peer's log no longer reaches back that far (the bound dropped
//! entries it would need) does it fall back to treating everything it stored before as purged
//! (`super::epoch`), which is counted and logged.
//!
//! The file is JSON lines, appended to at each purge: the first line, `{"trimmed_through": N}`,
//! says up to which epoch entries were dropped; it is rewritten (compacted) when it holds twice
//! the bound.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zerocache_ops::{Purge, Target};

/// One purge as the log keeps it (and as a peer's catch-up receives it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Logged {
    /// The fleet epoch it carried.
    pub(crate) epoch: u64,
    /// The member that started it.
    pub(crate) from: String,
    /// When it was logged here, ms since the Unix epoch.
    pub(crate) at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tags: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) soft: bool,
}

impl Logged {
    /// The purge it records, if it is well formed.
    pub(crate) fn purge(&self) -> Option<Purge> {
        match (&self.url, &self.prefix, &self.tags) {
            (Some(u), None, None) => Some(Purge::url(u.clone()).soft(self.soft)),
            (None, Some(p), None) => Some(Purge::prefix(p.clone()).soft(self.soft)),
            (None, None, Some(t)) if zerocache_ops::check_tags(t).is_ok() => {
                Some(Purge::tags(t.clone()).soft(self.soft))
            }
            _ => None,
        }
    }

    /// The same purge, by the same member, under the same epoch.
    fn same(&self, other: &Logged) -> bool {
        self.epoch == other.epoch
            && self.from == other.from
            && self.url == other.url
            && self.prefix == other.prefix
            && self.tags == other.tags
            && self.soft == other.soft
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    trimmed_through: u64,
}

struct Inner {
    entries: VecDeque<Logged>,
    /// The highest epoch of an entry dropped by the bounds: a member behind this cannot catch up
    /// from this log.
    trimmed_through: u64,
    /// Lines in the file (for compaction).
    lines: usize,
}

/// The log and its bounds.
pub(crate) struct PurgeLog {
    inner: Mutex<Inner>,
    file: PathBuf,
    max: usize,
    age: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl PurgeLog {
    /// The log kept in `dir` (empty if there is none or it is unreadable: logged).
    pub(crate) fn load(dir: &Path, max: usize, age: Duration) -> PurgeLog {
        let file = crate::cache::store::state_dir(dir).join("fleet-purge-log");
        let mut inner = Inner {
            entries: VecDeque::new(),
            trimmed_through: 0,
            lines: 0,
        };
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            match lines.next().map(serde_json::from_str::<Header>) {
                Some(Ok(h)) => inner.trimmed_through = h.trimmed_through,
                Some(Err(e)) => {
                    tracing::warn!(file = %file.display(), error = %e, "fleet purge log unreadable; starting a new one");
                }
                None => {}
            }
            for line in lines {
                // A line cut by a crash (the last one) is skipped; the rest stand.
                if let Ok(l) = serde_json::from_str::<Logged>(line) {
                    inner.entries.push_back(l);
                }
            }
        }
        let log = PurgeLog {
            inner: Mutex::new(inner),
            file,
            max: max.max(1),
            age,
        };
        {
            let mut inner = log.inner.lock();
            log.trim(&mut inner);
            log.rewrite(&mut inner);
        }
        log
    }

    /// Records purge `p`, which carried `epoch` and was started by `from`.
    pub(crate) fn record(&self, epoch: u64, from: &str, p: &Purge) {
        let (url, prefix, tags) = match &p.target {
            Target::Url(u) => (Some(u.clone()), None, None),
            Target::Prefix(x) => (None, Some(x.clone()), None),
            Target::Tags(t) => (None, None, Some(t.clone())),
        };
        let l = Logged {
            epoch,
            from: from.to_string(),
            at_ms: now_ms(),
            url,
            prefix,
            tags,
            soft: p.soft,
        };
        let mut inner = self.inner.lock();
        let line = serde_json::to_string(&l).unwrap_or_default();
        inner.entries.push_back(l);
        let trimmed = self.trim(&mut inner);
        if trimmed || inner.lines > 2 * self.max {
            self.rewrite(&mut inner);
        } else {
            let appended = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.file)
                .and_then(|mut f| writeln!(f, "{line}"));
            match appended {
                Ok(()) => inner.lines += 1,
                Err(e) => {
                    tracing::warn!(file = %self.file.display(), error = %e, "cannot append to the fleet purge log")
                }
            }
        }
    }

    /// Whether `l` (a peer's entry) is already here.
    pub(crate) fn contains(&self, l: &Logged) -> bool {
        self.inner.lock().entries.iter().any(|e| e.same(l))
    }

    /// The entries with an epoch of `since` or more (a member at `since` may have missed another
    /// purge that carried the same epoch, started concurrently elsewhere), oldest first, and
    /// whether they are complete: no entry it could need was dropped by the bounds.
    pub(crate) fn since(&self, since: u64) -> (Vec<Logged>, bool) {
        let mut inner = self.inner.lock();
        self.trim(&mut inner);
        let complete = inner.trimmed_through < since.max(1);
        let mut out: Vec<Logged> = inner
            .entries
            .iter()
            .filter(|e| e.epoch >= since)
            .cloned()
            .collect();
        out.sort_by_key(|e| e.epoch);
        (out, complete)
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// Drops entries beyond the bounds; true if any went.
    fn trim(&self, inner: &mut Inner) -> bool {
        // An entry as old as the age or older goes (`<=`: with an age of 0, every entry).
        let expired_at = now_ms().saturating_sub(self.age.as_millis() as u64);
        let mut dropped = false;
        while inner.entries.len() > self.max
            || inner.entries.front().is_some_and(|e| e.at_ms <= expired_at)
        {
            if let Some(e) = inner.entries.pop_front() {
                inner.trimmed_through = inner.trimmed_through.max(e.epoch);
                dropped = true;
            }
        }
        dropped
    }

    /// Writes the whole log again (a temp file renamed over it).
    fn rewrite(&self, inner: &mut Inner) {
        let mut text = serde_json::to_string(&Header {
            trimmed_through: inner.trimmed_through,
        })
        .unwrap_or_default();
        text.push('\n');
        for e in &inner.entries {
            text.push_str(&serde_json::to_string(e).unwrap_or_default());
            text.push('\n');
        }
        let tmp = self.file.with_extension("tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.file));
        match written {
            Ok(()) => inner.lines = inner.entries.len() + 1,
            Err(e) => {
                tracing::warn!(file = %self.file.display(), error = %e, "cannot write the fleet purge log")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_a_restart_and_the_bound_says_how_far_back_it_reaches() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = PurgeLog::load(dir.path(), 3, Duration::from_secs(3600));
        for e in 1..=3 {
            log.record(e, "a:1", &Purge::url(format!("http://h/{e}")));
        }
        let (all, complete) = log.since(1);
        assert!(complete);
        assert_eq!(
            all.iter().map(|l| l.epoch).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        // Reloaded from disk: the same.
        let log = PurgeLog::load(dir.path(), 3, Duration::from_secs(3600));
        assert_eq!(log.since(2).0.len(), 2);
        // A fourth pushes the first out: a member at epoch 0 or 1 can no longer catch up here;
        // one at 2 still can.
        log.record(4, "b:2", &Purge::prefix("http://h/").soft(true));
        assert_eq!(log.len(), 3);
        assert!(!log.since(1).1);
        let (from2, complete) = log.since(2);
        assert!(complete);
        assert_eq!(
            from2.last().and_then(Logged::purge),
            Some(Purge::prefix("http://h/").soft(true))
        );
        let log = PurgeLog::load(dir.path(), 3, Duration::from_secs(3600));
        assert!(!log.since(1).1, "the trim is remembered across a restart");
        assert!(log.contains(&from2[0]));
    }

    #[test]
    fn old_entries_go_by_age_and_a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = PurgeLog::load(dir.path(), 100, Duration::from_secs(3600));
        log.record(1, "a:1", &Purge::url("http://h/1"));
        log.record(2, "a:1", &Purge::url("http://h/2"));
        drop(log);
        let file = crate::cache::store::state_dir(dir.path()).join("fleet-purge-log");
        let mut text = std::fs::read_to_string(&file).expect("log");
        text.push_str("{\"epoch\":3,\"fr");
        std::fs::write(&file, text).expect("torn");
        let log = PurgeLog::load(dir.path(), 100, Duration::from_secs(3600));
        assert_eq!(log.len(), 2);
        let aged = PurgeLog::load(dir.path(), 100, Duration::ZERO);
        assert_eq!(aged.len(), 0);
        assert!(!aged.since(1).1);
    }
}

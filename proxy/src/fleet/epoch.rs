//! The fleet purge epoch. Every fleet purge raises it by one on every member it reaches, and
//! members report theirs in health checks. A member that finds a peer ahead of it missed a purge
//! (it was down, or cut off) and replays it from that peer's purge log (`super::purge_log`).
//! When it cannot know which objects the purges it missed removed (the log no longer reaches
//! back), it treats everything it stored before that moment as purged ([`Epoch::seen`]): such an
//! entry is dropped on its next use and fetched again. The epoch and that moment are kept in the
//! cache directory, so a restart does not forget them.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far ahead of this node a peer's epoch may plausibly be: a member that missed a million
/// fleet purges is not what a report that far ahead means (a forged or corrupt number, which
/// would otherwise carry the epoch to `u64::MAX` and wrap the next purge to 0).
pub(crate) const MAX_AHEAD: u64 = 1_000_000;

/// The epoch and the moment before which stored entries count as purged.
pub(crate) struct Epoch {
    state: Mutex<(u64, SystemTime)>,
    /// `state.1` in milliseconds since the Unix epoch, read on every lookup without the lock.
    stale_before_ms: AtomicU64,
    file: PathBuf,
}

impl Epoch {
    /// The epoch kept in `dir` (0 and nothing stale if there is none).
    pub(crate) fn load(dir: &std::path::Path) -> Epoch {
        let file = crate::cache::store::state_dir(dir).join("fleet-epoch");
        let (epoch, ms) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| {
                let mut it = t.split_ascii_whitespace().map(|n| n.parse::<u64>().ok());
                Some((it.next()??, it.next()??))
            })
            .unwrap_or((0, 0));
        Epoch {
            state: Mutex::new((epoch, UNIX_EPOCH + Duration::from_millis(ms))),
            stale_before_ms: AtomicU64::new(ms),
            file,
        }
    }

    /// The current epoch.
    pub(crate) fn current(&self) -> u64 {
        self.state.lock().0
    }

    /// Whether a peer's `theirs` is an epoch it could have reached: at most [`MAX_AHEAD`] past
    /// this node's (behind is always plausible: that peer missed purges).
    pub(crate) fn plausible(&self, theirs: u64) -> bool {
        theirs <= self.current().saturating_add(MAX_AHEAD)
    }

    /// A purge carrying `epoch` was applied here: moves up to it (never down).
    pub(crate) fn applied(&self, epoch: u64) {
        let mut s = self.state.lock();
        if epoch > s.0 {
            s.0 = epoch;
            self.save(&s);
        }
    }

    /// The next epoch for a purge started here.
    pub(crate) fn next(&self) -> u64 {
        let mut s = self.state.lock();
        s.0 = s.0.saturating_add(1);
        self.save(&s);
        s.0
    }

    /// A peer reported `theirs`: if it is ahead, this node missed a purge, and everything stored
    /// until now is stale. True if it was behind.
    pub(crate) fn seen(&self, theirs: u64) -> bool {
        let mut s = self.state.lock();
        if theirs <= s.0 {
            return false;
        }
        if theirs > s.0.saturating_add(MAX_AHEAD) {
            tracing::warn!(
                ours = s.0,
                theirs,
                "a peer reported an implausible purge epoch; ignored"
            );
            return false;
        }
        tracing::warn!(
            ours = s.0,
            theirs,
            "missed a fleet purge: entries stored until now are treated as purged"
        );
        *s = (theirs, SystemTime::now());
        self.stale_before_ms.store(millis(s.1), Ordering::Relaxed);
        self.save(&s);
        true
    }

    /// Whether an entry stored at `stored_at` predates a purge this node missed.
    pub(crate) fn is_stale(&self, stored_at: SystemTime) -> bool {
        let before = self.stale_before_ms.load(Ordering::Relaxed);
        before != 0 && millis(stored_at) < before
    }

    fn save(&self, s: &(u64, SystemTime)) {
        let ms = millis(s.1);
        let tmp = self.file.with_extension("tmp");
        let written = std::fs::write(&tmp, format!("{} {ms}\n", s.0))
            .and_then(|()| std::fs::rename(&tmp, &self.file));
        if let Err(e) = written {
            tracing::warn!(file = %self.file.display(), error = %e, "cannot save the fleet purge epoch");
        }
    }
}

/// Milliseconds since the Unix epoch (0 before it).
fn millis(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behind_a_peer_makes_older_entries_stale_and_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let e = Epoch::load(dir.path());
        assert_eq!(e.current(), 0);
        let before = SystemTime::now() - Duration::from_secs(1);
        assert!(!e.is_stale(before));
        assert_eq!(e.next(), 1);
        assert!(!e.seen(1), "level with the peer: nothing missed");
        assert!(!e.is_stale(before));
        assert!(e.seen(3));
        assert!(e.is_stale(before));
        assert!(!e.is_stale(SystemTime::now() + Duration::from_secs(1)));
        e.applied(2);
        assert_eq!(e.current(), 3, "never moves down");
        let again = Epoch::load(dir.path());
        assert_eq!(again.current(), 3);
        assert!(again.is_stale(before));
    }

    /// An epoch far past anything a peer could have issued is refused: it would carry this
    /// node's to `u64::MAX`, and the next purge would wrap it to 0.
    #[test]
    fn an_implausible_epoch_is_refused_and_none_wraps() {
        let dir = tempfile::tempdir().expect("tmp");
        let e = Epoch::load(dir.path());
        assert!(e.plausible(MAX_AHEAD));
        assert!(!e.plausible(MAX_AHEAD + 1));
        assert!(!e.plausible(u64::MAX));
        assert!(!e.seen(u64::MAX), "ignored, nothing made stale");
        assert_eq!(e.current(), 0);
        assert!(!e.is_stale(SystemTime::now() - Duration::from_secs(1)));
        e.applied(u64::MAX - 1);
        assert_eq!(e.next(), u64::MAX);
        assert_eq!(e.next(), u64::MAX, "saturates, never wraps to 0");
    }
}

//! Verification of stored bodies against the checksum their fill stored: the background scrub,
//! the body check the start-up rebuild runs on a sample of entries, and `zerocache check-cache`.
//!
//! Why: the header checksum only proves the header. A byte flipped in a body (a bad sector, a
//! stray write, a bug elsewhere) was served to every client, forever, across restarts. Every
//! entry now carries the xxh3-64 of its body, computed by the fill as it wrote the bytes.
//!
//! Why here and not on a hit: a hit is one sendfile from the page cache and must stay that way, no
//! read of the body and no extra syscall. So bodies are verified off the hot path instead: a
//! random sample at start-up ([`super::store::Store::rebuild_verifying`], `cache.verify_on_start`),
//! and continuously by the scrub ([`start`], `cache.scrub_rate`), which walks the index over and
//! over, reads each body with pread in 1 MiB pieces on the blocking pool, at most `scrub_rate`
//! bytes a second, and discards what does not match with
//! [`Store::remove_if_same`](super::store::Store::remove_if_same), so a transfer in flight keeps
//! its open file. The next request for a discarded entry is a miss and fetches the body again.
//! Pieces the scrub had to read from disk are dropped from the page cache again, so the scrub
//! does not push the hot set out.

use super::entry::{self, BodyHasher, CorruptEntry, Entry};
use super::store::Store;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocache_ledger::Accounting;

/// Bytes read at a time.
pub const PIECE: usize = 1 << 20;

/// Shortest time between the starts of two passes, so a small cache is not re-read in a tight
/// loop.
const MIN_PASS: Duration = Duration::from_secs(1);

/// Reads `len` body bytes at `offset` of `file` in [`PIECE`]s (`buf` is reused) and compares
/// their checksum with `expected`: [`CorruptEntry::Body`] if it differs, [`CorruptEntry::Io`] if
/// the bytes could not be read (which says nothing about them).
pub fn verify_body(
    file: &File,
    offset: u64,
    len: u64,
    expected: u64,
    buf: &mut Vec<u8>,
) -> Result<(), CorruptEntry> {
    buf.resize(PIECE, 0);
    let mut hasher = BodyHasher::new();
    let mut done = 0;
    while done < len {
        let n = read_piece(file, offset + done, len - done, buf, &mut hasher)?;
        done += n;
    }
    check(expected, hasher.digest())
}

fn check(expected: u64, actual: u64) -> Result<(), CorruptEntry> {
    if actual == expected {
        Ok(())
    } else {
        Err(CorruptEntry::Body { expected, actual })
    }
}

/// Reads the next piece (at most [`PIECE`] of the `left` bytes at `at`) into the hasher; returns
/// its length. A piece that was not in the page cache is dropped from it again afterwards.
fn read_piece(
    file: &File,
    at: u64,
    left: u64,
    buf: &mut [u8],
    hasher: &mut BodyHasher,
) -> io::Result<u64> {
    let n = left.min(buf.len() as u64) as usize;
    let piece = &mut buf[..n];
    let cold = !crate::residency::resident(file, at, n as u64);
    file.read_exact_at(piece, at)?;
    hasher.update(piece);
    if cold {
        // Advice only: a failure costs page-cache space, never bytes.
        let _ = nix::fcntl::posix_fadvise(
            file,
            at as libc::off_t,
            n as libc::off_t,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
    }
    Ok(n as u64)
}

/// The scrub's settings, from the `cache` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubConfig {
    /// Body bytes read per second at most (`cache.scrub_rate`); 0 turns the scrub off.
    pub rate: u64,
}

impl ScrubConfig {
    /// The settings of `cache`.
    pub fn of(cache: &zerocache_config::CacheConfig) -> ScrubConfig {
        ScrubConfig {
            rate: cache.scrub_rate.as_u64(),
        }
    }
}

/// Counts corrupt entries in `accounting` from now on (those the rebuild found included) and,
/// unless `config.rate` is 0, starts the scrub on the current runtime. It runs until the runtime
/// stops.
pub fn start(
    store: Arc<Store>,
    accounting: Arc<Accounting>,
    config: ScrubConfig,
) -> Option<tokio::task::JoinHandle<()>> {
    store.attach_accounting(accounting);
    if config.rate == 0 {
        tracing::info!("cache scrub off (cache.scrub_rate: 0)");
        return None;
    }
    tracing::info!(rate = config.rate, "cache scrub running");
    Some(tokio::spawn(run(store, config.rate)))
}

/// Keeps reads under `rate` bytes a second: after `bytes` that took `took`, waits out the rest of
/// the time they are worth.
struct Pacer {
    rate: u64,
}

impl Pacer {
    async fn spent(&self, bytes: u64, took: Duration) {
        let worth = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        if worth > took {
            tokio::time::sleep(worth - took).await;
        }
    }
}

/// The scrub: pass after pass over the index.
async fn run(store: Arc<Store>, rate: u64) {
    let pacer = Pacer { rate };
    let mut buf = Vec::with_capacity(PIECE);
    loop {
        let began = Instant::now();
        let (mut entries, mut corrupt) = (0u64, 0u64);
        // Hashes, not entries: an entry evicted during the pass is neither kept alive (with its
        // open file) nor read.
        for hash in store.hashes() {
            if store.is_handing_over() {
                // The successor may refill a key at its path: a checksum that differs would
                // be its new file, not corruption. Its own scrub takes over.
                break;
            }
            let Some(e) = store.peek(hash) else { continue };
            entries += 1;
            let (outcome, b) = scrub_entry(&store, &e, &pacer, buf).await;
            buf = b;
            if outcome == Outcome::Corrupt {
                corrupt += 1;
            }
        }
        tracing::debug!(entries, corrupt, took = ?began.elapsed(), "cache scrub pass done");
        tokio::time::sleep(MIN_PASS.saturating_sub(began.elapsed())).await;
    }
}

/// What the scrub made of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The body has its checksum.
    Intact,
    /// Corrupt, and discarded.
    Corrupt,
    /// Not verified: gone, replaced by a newer fill, or unreadable just now.
    Skipped,
}

/// Runs `f` on the blocking pool; an `Err` if it panicked.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Whether `path` still names the inode `file` has open (it was not replaced by a newer fill).
pub(super) fn still_named(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(p), Ok(f)) => p.dev() == f.dev() && p.ino() == f.ino(),
        _ => false,
    }
}

/// Verifies one entry, discarding it if corrupt. Hands `buf` back for the next one.
async fn scrub_entry(
    store: &Arc<Store>,
    e: &Arc<Entry>,
    pacer: &Pacer,
    buf: Vec<u8>,
) -> (Outcome, Vec<u8>) {
    let t = Instant::now();
    let path = e.path.clone();
    let opened = blocking(
        move || -> io::Result<(File, Result<entry::Header, CorruptEntry>)> {
            let f = File::open(&path)?;
            let mut h = entry::read_entry_header(&f);
            if matches!(h, Err(ref err) if !matches!(err, CorruptEntry::Io(_))) {
                // Perhaps caught in the middle of a header rewrite after a revalidation: look again.
                std::thread::sleep(Duration::from_millis(50));
                h = entry::read_entry_header(&f);
            }
            Ok((f, h))
        },
    )
    .await
    .and_then(|r| r);
    pacer.spent(e.body_offset, t.elapsed()).await;
    let (file, header) = match opened {
        Ok(x) => x,
        // Evicted, purged or replaced since the pass began.
        Err(err) if err.kind() == io::ErrorKind::NotFound => return (Outcome::Skipped, buf),
        Err(err) => {
            tracing::debug!(path = %e.path.display(), error = %err, "cache scrub could not open an entry");
            return (Outcome::Skipped, buf);
        }
    };
    let file = Arc::new(file);
    match header {
        Ok(h) => {
            if h.meta.key != e.meta.key
                || h.body_offset != e.body_offset
                || h.body_len != e.body_len
                || h.body_checksum != e.body_checksum
            {
                // A newer fill of the same key renamed its file over this one.
                return (Outcome::Skipped, buf);
            }
        }
        Err(CorruptEntry::Io(err)) => {
            tracing::debug!(path = %e.path.display(), error = %err, "cache scrub could not read a header");
            return (Outcome::Skipped, buf);
        }
        Err(err) => return (discard(store, e, &file, &err).await, buf),
    }

    let mut hasher = BodyHasher::new();
    let mut buf = buf;
    buf.resize(PIECE, 0);
    let mut done = 0;
    while done < e.body_len {
        let t = Instant::now();
        let (f, at, left) = (file.clone(), e.body_offset + done, e.body_len - done);
        let read = blocking(move || {
            let n = read_piece(&f, at, left, &mut buf, &mut hasher);
            (n, buf, hasher)
        })
        .await;
        let n = match read {
            Ok((n, b, h)) => {
                (buf, hasher) = (b, h);
                n
            }
            Err(err) => {
                tracing::warn!(error = %err, "cache scrub read failed");
                return (Outcome::Skipped, Vec::with_capacity(PIECE));
            }
        };
        match n {
            Ok(n) => {
                done += n;
                pacer.spent(n, t.elapsed()).await;
            }
            Err(err) => {
                tracing::debug!(path = %e.path.display(), error = %err, "cache scrub could not read a body");
                return (Outcome::Skipped, buf);
            }
        }
    }
    match check(e.body_checksum, hasher.digest()) {
        Ok(()) => (Outcome::Intact, buf),
        Err(err) => (discard(store, e, &file, &err).await, buf),
    }
}

/// Discards `e`, whose file `file` was found corrupt (`why`), unless its path now names another
/// file (a newer fill, which is not what was read).
async fn discard(
    store: &Arc<Store>,
    e: &Arc<Entry>,
    file: &Arc<File>,
    why: &CorruptEntry,
) -> Outcome {
    let (path, f) = (e.path.clone(), file.clone());
    if !blocking(move || still_named(&path, &f))
        .await
        .unwrap_or(false)
    {
        return Outcome::Skipped;
    }
    if store.remove_corrupt(e) {
        tracing::warn!(path = %e.path.display(), key = %e.meta.key, error = %why, "cache scrub discarded a corrupt entry");
        Outcome::Corrupt
    } else {
        Outcome::Skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::test_support::{body, flip, put, store};

    #[test]
    fn verify_body_tells_intact_from_corrupt() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let b = body(PIECE * 2 + 1000, 3);
        let e = put(&s, "/v", &b);
        let mut buf = Vec::new();
        let f = File::open(&e.path).expect("open");
        verify_body(&f, e.body_offset, e.body_len, e.body_checksum, &mut buf).expect("intact");
        flip(&e, PIECE as u64 * 2 + 999);
        assert!(matches!(
            verify_body(&f, e.body_offset, e.body_len, e.body_checksum, &mut buf),
            Err(CorruptEntry::Body { expected, .. }) if expected == e.body_checksum
        ));
        // A body shorter on disk than promised cannot be read, which is not the same as corrupt.
        assert!(matches!(
            verify_body(&f, e.body_offset, e.body_len + 1, e.body_checksum, &mut buf),
            Err(CorruptEntry::Io(_))
        ));
        let empty = put(&s, "/empty", b"");
        let f = File::open(&empty.path).expect("open");
        verify_body(&f, empty.body_offset, 0, empty.body_checksum, &mut buf).expect("empty");
    }

    #[tokio::test]
    async fn the_scrub_discards_a_flipped_body_and_keeps_the_rest() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        let good = put(&s, "/good", &body(PIECE * 2 + 300, 1));
        let bad = put(&s, "/bad", &body(PIECE * 3, 2));
        let small = put(&s, "/small", b"small");
        flip(&bad, PIECE as u64 * 2 + 5);
        let acc = Arc::new(Accounting::new(8, false));
        let task = start(s.clone(), acc.clone(), ScrubConfig { rate: 1 << 30 }).expect("on");
        let deadline = Instant::now() + Duration::from_secs(20);
        while acc.corrupt_entries() == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(acc.corrupt_entries(), 1);
        assert!(s.peek(bad.hash).is_none() && !bad.path.exists());
        for e in [&good, &small] {
            assert!(s.peek(e.hash).is_some() && e.path.exists());
        }
        // Later passes find nothing more.
        tokio::time::sleep(MIN_PASS * 2).await;
        assert_eq!(acc.corrupt_entries(), 1);
        assert_eq!(
            s.corrupt_entries.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_scrub_rate_of_0_starts_nothing_but_still_counts() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path(), 10);
        s.corrupt_found(1);
        let acc = Arc::new(Accounting::new(8, false));
        assert!(start(s.clone(), acc.clone(), ScrubConfig { rate: 0 }).is_none());
        assert_eq!(acc.corrupt_entries(), 1);
    }

    #[tokio::test]
    async fn the_pacer_holds_the_rate() {
        let pacer = Pacer { rate: 100 << 20 };
        let t = Instant::now();
        for _ in 0..4 {
            pacer.spent(5 << 20, Duration::ZERO).await;
        }
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        // Time the reads already took counts: nothing is left to wait.
        let t = Instant::now();
        pacer.spent(10 << 20, Duration::from_millis(150)).await;
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }
}

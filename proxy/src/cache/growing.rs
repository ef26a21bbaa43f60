//! A fill in progress that clients read behind (Varnish's streaming fetch, ATS's read-while-write).
//!
//! Why: when a MISS was streamed from the origin through the client that asked for it, a client
//! that stopped reading held the origin connection, the origin's worker and the fill lock for as
//! long as it liked, and every later client of the same URL waited behind it. Now the fill task
//! reads the origin at the origin's speed into the cache file, and each client (the one that
//! caused the fill, and followers whose variant matches) is served from that file with sendfile
//! as it grows. A stalled client stalls only itself.
//!
//! The writer publishes how many body bytes are in the file; a reader sends what is there and
//! then waits for the next notification (never spins on a sendfile that returns 0). The last
//! bytes are published only after the entry is committed, so a client that has read a whole MISS
//! and asks again gets a HIT. If the fill fails, every reader sees [`Progress::Failed`] and aborts
//! its connection: no client is ever given a short body that looks complete.

use super::entry::Entry;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// How far a fill has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// This many body bytes are in the file; more will come.
    Writing(u64),
    /// The body is complete at this length (and the entry committed, if it could be).
    Done(u64),
    /// The fill failed after this many published bytes: a reader may send them, then must
    /// abort its connection, so the client sees a truncated body, never a short complete one.
    Failed(u64),
}

impl Progress {
    /// Body bytes a reader may send.
    pub fn available(self) -> u64 {
        match self {
            Progress::Writing(n) | Progress::Done(n) | Progress::Failed(n) => n,
        }
    }
}

/// A body being written, shared by the fill task and its readers.
#[derive(Debug)]
pub struct Growing {
    /// The file (the same inode before and after it is renamed into place).
    pub file: Arc<File>,
    /// The stored response as it will be indexed (its `body_len` is not final: use the
    /// progress). Gives followers their head, validators and reuse rules.
    pub entry: Entry,
    /// The body length, when the origin announced one.
    pub length: Option<u64>,
    rx: watch::Receiver<Progress>,
    readers: Arc<AtomicUsize>,
}

/// The writing side, held by the fill task. Dropping it without [`Writer::finish`] counts as a
/// failure for every reader.
pub struct Writer {
    tx: watch::Sender<Progress>,
    readers: Arc<AtomicUsize>,
    published: u64,
    finished: bool,
}

/// One client reading behind the fill; counted while it lives.
pub struct Reader {
    rx: watch::Receiver<Progress>,
    readers: Arc<AtomicUsize>,
}

impl Growing {
    /// A new fill of `entry`'s body into `file`.
    pub fn new(file: Arc<File>, entry: Entry, length: Option<u64>) -> (Arc<Growing>, Writer) {
        let (tx, rx) = watch::channel(Progress::Writing(0));
        let readers = Arc::new(AtomicUsize::new(0));
        let g = Arc::new(Growing {
            file,
            entry,
            length,
            rx,
            readers: readers.clone(),
        });
        let w = Writer {
            tx,
            readers,
            published: 0,
            finished: false,
        };
        (g, w)
    }

    /// Starts reading behind the fill.
    pub fn reader(&self) -> Reader {
        self.readers.fetch_add(1, Ordering::Relaxed);
        Reader {
            rx: self.rx.clone(),
            readers: self.readers.clone(),
        }
    }
}

impl Writer {
    /// `n` body bytes are now in the file.
    pub fn advance(&mut self, n: u64) {
        self.published = n;
        self.tx.send_replace(Progress::Writing(n));
    }

    /// The body is complete at `n` bytes.
    pub fn finish(mut self, n: u64) {
        self.finished = true;
        self.tx.send_replace(Progress::Done(n));
    }

    /// Clients reading behind the fill right now.
    pub fn readers(&self) -> usize {
        self.readers.load(Ordering::Relaxed)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.finished {
            self.tx.send_replace(Progress::Failed(self.published));
        }
    }
}

impl Reader {
    /// The progress now.
    pub fn now(&mut self) -> Progress {
        *self.rx.borrow_and_update()
    }

    /// Waits for progress beyond what [`Reader::now`] last returned, at most `timeout`;
    /// `Failed` when the writer is gone or the wait timed out.
    pub async fn next(&mut self, timeout: Duration) -> Progress {
        match tokio::time::timeout(timeout, self.rx.changed()).await {
            Ok(Ok(())) => *self.rx.borrow_and_update(),
            _ => Progress::Failed(self.rx.borrow().available()),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.readers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::Meta;
    use std::time::SystemTime;

    fn growing() -> (Arc<Growing>, Writer) {
        let file = Arc::new(tempfile_in_tmp());
        let meta = Meta {
            key: "GET http://h/x".into(),
            stored_at: SystemTime::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            status: 200,
            reason: "OK".into(),
            fields: Vec::new(),
            vary: Vec::new(),
            url: "GET http://h/x".into(),
        };
        let e = Entry::new(
            1,
            meta,
            "/nonexistent".into(),
            4096,
            0,
            &crate::cache::targeted::Targeted::default(),
        );
        Growing::new(file, e, None)
    }

    fn tempfile_in_tmp() -> File {
        let p = std::env::temp_dir().join(format!("zc-growing-{}", std::process::id()));
        let f = File::create(&p).expect("temp file");
        let _ = std::fs::remove_file(&p);
        f
    }

    #[tokio::test]
    async fn readers_see_progress_then_the_end() {
        let (g, mut w) = growing();
        let mut r = g.reader();
        assert_eq!(w.readers(), 1);
        assert_eq!(r.now(), Progress::Writing(0));
        w.advance(10);
        assert_eq!(r.next(Duration::from_secs(1)).await, Progress::Writing(10));
        w.finish(25);
        assert_eq!(r.next(Duration::from_secs(1)).await, Progress::Done(25));
        drop(r);
        assert_eq!(g.readers.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_writer_that_goes_away_fails_its_readers() {
        let (g, mut w) = growing();
        let mut r = g.reader();
        r.now();
        w.advance(5);
        drop(w);
        // The reader may send the 5 published bytes, but never as a complete body.
        assert_eq!(r.next(Duration::from_secs(1)).await, Progress::Failed(5));
        assert_eq!(
            g.reader().next(Duration::from_millis(10)).await,
            Progress::Failed(5)
        );
    }
}

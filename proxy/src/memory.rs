//! Giving memory that a burst freed back to the system. glibc's malloc keeps freed chunks in its
//! arenas for reuse and returns pages only from the top of a heap, so a burst of buffers (many
//! h2 streams reading ahead, TLS records, fills) left the process hundreds of MB larger after
//! it ended, reused but never returned: an edge box's RSS that a load pattern can ratchet up.
//! A thread of its own looks every [`EVERY`] at how much the arenas hold free and, past
//! [`SLACK`], asks glibc to hand the free pages back (`malloc_trim`, which since glibc 2.8
//! releases whole free pages anywhere in every arena with `MADV_DONTNEED`). Off the request path
//! (a trim takes each arena's lock briefly), and a few syscalls only when there is something to
//! give back, where a lower mmap threshold would cost a map and unmap per buffer.

use std::time::Duration;

/// How often the free memory is looked at.
const EVERY: Duration = Duration::from_secs(2);

/// Free memory the arenas may keep for reuse before the rest is given back.
const SLACK: usize = 32 << 20;

/// Starts the thread (a no-op where the C library is not glibc).
pub(crate) fn start_trimming() {
    #[cfg(target_env = "gnu")]
    {
        let spawned = std::thread::Builder::new()
            .name("zc-memory".into())
            .spawn(|| {
                // What the arenas held free after the last trim: `malloc_trim` gives pages back
                // but leaves their chunks in the free lists (`fordblks` does not fall), so the
                // next trim waits until another SLACK has been freed, or every tick after one
                // burst would walk every arena under its lock again.
                // It follows the free memory down as the arenas reuse it.
                let mut after_last = 0;
                loop {
                    std::thread::sleep(EVERY);
                    // SAFETY: see `trim_if_past`.
                    after_last = after_last.min(unsafe { libc::mallinfo2() }.fordblks);
                    if let Some(free) = trim_if_past(after_last + SLACK) {
                        after_last = free;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the memory trimmer; freed memory stays with the process");
        }
    }
}

/// Gives free memory back when the arenas hold more than `past` of it: the bytes they hold
/// free after the trim, or None when it was not needed. (`mallinfo2` is glibc 2.33's: Debian
/// 12 has 2.36.)
#[cfg(target_env = "gnu")]
fn trim_if_past(past: usize) -> Option<usize> {
    // SAFETY: mallinfo2 and malloc_trim only read and adjust the allocator's own state, under
    // its locks; neither touches memory the program owns.
    let free = unsafe { libc::mallinfo2() }.fordblks;
    if free <= past {
        return None;
    }
    // SAFETY: as above; a pad of 0 keeps nothing extra at the top of the heap.
    unsafe { libc::malloc_trim(0) };
    tracing::debug!(free_mb = free >> 20, "free memory given back to the system");
    // SAFETY: as above.
    Some(unsafe { libc::mallinfo2() }.fordblks)
}

#[cfg(all(test, target_env = "gnu"))]
mod tests {
    use super::*;

    fn rss_kib() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    /// 200 MB of 64 KiB buffers, freed with every other one still held at first so nothing is at
    /// the top of the heap: glibc keeps it all until the trim gives the pages back.
    #[test]
    fn freed_buffers_in_the_middle_of_the_heap_are_given_back() {
        let mut bufs: Vec<Vec<u8>> = (0..3200).map(|_| vec![1u8; 64 * 1024 - 64]).collect();
        let keep: Vec<Vec<u8>> = bufs.drain(..).step_by(2).collect();
        let before = rss_kib();
        let free = trim_if_past(SLACK);
        let after = rss_kib();
        assert!(
            free.is_some(),
            "100 MB free in the arenas is past the slack"
        );
        // The chunks stay in the free lists: the next look needs another SLACK freed.
        assert_eq!(trim_if_past(free.unwrap_or(0) + SLACK), None);
        assert!(
            before.saturating_sub(after) > 80 * 1024,
            "given back: {} KiB (RSS {before} -> {after} KiB)",
            before.saturating_sub(after)
        );
        drop(keep);
    }
}

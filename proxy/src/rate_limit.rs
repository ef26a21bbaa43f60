//! The rules' rate limits: one token bucket per (rule, key) in a table made once at start-up
//! (`limits.rate_limit_keys`), shared by every worker thread, so a client gets `rate` across the
//! whole process, not per thread, and hits count like misses.
//!
//! The table is four-way set-associative: a key's hash picks a set of four slots, each behind
//! one short lock; a new key takes the least recently seen slot of its set. Memory is fixed
//! whatever clients send; a client whose slot was taken starts again with a full bucket,
//! which only ever errs toward letting a request through. Time is monotonic, plus the test
//! clock's offset (`crate::clock`), so a test moves it instead of sleeping.

use parking_lot::Mutex;
use std::time::Instant;

const WAYS: usize = 4;

#[derive(Clone, Copy, Default)]
struct Slot {
    /// The key's hash (0: empty).
    key: u64,
    /// Tokens left, as of `at`.
    tokens: f64,
    /// When last seen, nanoseconds since the table was made.
    at: u64,
}

/// The process's buckets.
pub(crate) struct Limiter {
    sets: Box<[Mutex<[Slot; WAYS]>]>,
    epoch: Instant,
}

impl Limiter {
    /// A table for about `keys` keys (at least one set).
    pub(crate) fn new(keys: usize) -> Limiter {
        let n = keys.div_ceil(WAYS).max(1);
        Limiter {
            sets: (0..n)
                .map(|_| Mutex::new([Slot::default(); WAYS]))
                .collect(),
            epoch: Instant::now(),
        }
    }

    /// Now, in the table's nanoseconds.
    pub(crate) fn now(&self) -> u64 {
        let t = self.epoch.elapsed() + crate::clock::offset();
        u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Takes a token from `key`'s bucket (`rate` a second, at most `burst`) at `now`: `Ok`, or
    /// `Err(seconds)` until one is there (at least 1, for `Retry-After`).
    pub(crate) fn take(&self, key: u64, rate: f64, burst: f64, now: u64) -> Result<(), u64> {
        let key = key.max(1);
        let mut set = self.sets[(key % self.sets.len() as u64) as usize].lock();
        let i = match set.iter().position(|s| s.key == key) {
            Some(i) => i,
            None => {
                let (i, _) = set
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| if s.key == 0 { 0 } else { s.at.max(1) })
                    .unwrap_or((0, &Slot::default()));
                set[i] = Slot {
                    key,
                    tokens: burst,
                    at: now,
                };
                i
            }
        };
        let s = &mut set[i];
        let elapsed = now.saturating_sub(s.at) as f64 / 1e9;
        s.tokens = (s.tokens + elapsed * rate).min(burst);
        s.at = now.max(s.at);
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - s.tokens) / rate).ceil() as u64).max(1))
        }
    }

    /// Bytes the table holds.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.sets.len() * std::mem::size_of::<Mutex<[Slot; WAYS]>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate_and_says_when() {
        let l = Limiter::new(16);
        for _ in 0..5 {
            assert_eq!(l.take(7, 5.0, 5.0, 0), Ok(()));
        }
        assert_eq!(l.take(7, 5.0, 5.0, 0), Err(1));
        // 0.2 s gives one token back, and only one.
        assert_eq!(l.take(7, 5.0, 5.0, SEC / 5), Ok(()));
        assert_eq!(l.take(7, 5.0, 5.0, SEC / 5), Err(1));
        // Another key has its own bucket.
        assert_eq!(l.take(8, 5.0, 5.0, SEC / 5), Ok(()));
        // A slow rate says how long: one a minute, empty, is 60 s away.
        assert_eq!(l.take(9, 1.0 / 60.0, 1.0, 0), Ok(()));
        assert_eq!(l.take(9, 1.0 / 60.0, 1.0, 0), Err(60));
        assert_eq!(l.take(9, 1.0 / 60.0, 1.0, 30 * SEC), Err(30));
        // A long quiet spell refills to the burst, no more.
        for _ in 0..5 {
            assert_eq!(l.take(7, 5.0, 5.0, 100 * SEC), Ok(()));
        }
        assert_eq!(l.take(7, 5.0, 5.0, 100 * SEC), Err(1));
    }

    #[test]
    fn a_flood_of_keys_stays_in_the_table_it_was_given() {
        let l = Limiter::new(64);
        let before = l.bytes();
        assert_eq!(before, 16 * std::mem::size_of::<Mutex<[Slot; WAYS]>>());
        // A million distinct keys (a spoofing client's): the table does not grow, and a key
        // whose slot was taken starts again full.
        for k in 1..1_000_000u64 {
            let _ = l.take(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1.0, 1.0, k);
        }
        assert_eq!(l.bytes(), before);
        assert_eq!(l.take(42, 1.0, 1.0, 2_000_000), Ok(()));
        assert_eq!(l.take(42, 1.0, 1.0, 2_000_000), Err(1));
    }
}

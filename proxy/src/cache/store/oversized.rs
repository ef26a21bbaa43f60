//! Keys whose last fill ran past the size bound with a body of unknown length (chunked, or
//! closed by the origin): the head of such a response goes out before its length is known,
//! saying `stored`, and then it is not. Remembered for a while, so the next request for the key
//! is relayed without a fill and says `detail=too-large`, as one with a `Content-Length` over
//! the bound does, instead of claiming `stored` and writing the body to disk again each time.
//! Bounded in count (the oldest goes first) and in age (an object that shrinks is stored again
//! within [`FOR`]).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Keys remembered at most: 16 bytes and an instant each, about 400 KB in all.
const KEPT: usize = 16_384;

/// How long a key stays remembered.
const FOR: Duration = Duration::from_secs(300);

/// The keys, and their order of arrival.
#[derive(Default)]
pub(crate) struct Oversized {
    inner: Mutex<(HashMap<u128, Instant>, VecDeque<u128>)>,
}

impl Oversized {
    /// The fill of `hash` ran past its bound.
    pub(crate) fn note(&self, hash: u128) {
        let mut g = self.inner.lock();
        let (seen, order) = &mut *g;
        if seen.insert(hash, Instant::now()).is_none() {
            order.push_back(hash);
        }
        while order.len() > KEPT {
            if let Some(old) = order.pop_front() {
                seen.remove(&old);
            }
        }
    }

    /// Whether the last fill of `hash`, within [`FOR`], ran past its bound.
    pub(crate) fn recently(&self, hash: u128) -> bool {
        let g = self.inner.lock();
        g.0.get(&hash).is_some_and(|at| at.elapsed() < FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_and_bounded_in_count() {
        let o = Oversized::default();
        assert!(!o.recently(1));
        o.note(1);
        o.note(1);
        assert!(o.recently(1));
        assert!(!o.recently(2));
        for h in 0..(KEPT as u128 + 10) {
            o.note(h);
        }
        assert!(!o.recently(0), "the oldest went first");
        assert!(o.recently(KEPT as u128 + 9));
        assert_eq!(o.inner.lock().0.len(), KEPT);
        assert_eq!(o.inner.lock().1.len(), KEPT);
    }
}

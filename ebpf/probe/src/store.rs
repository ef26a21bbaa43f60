//! Bounded history of closed fds. Memory must stay flat under 100,000 short connections, so the
//! history is a ring of at most `capacity` records; what falls off is counted, not hidden.

use crate::model::ClosedFd;
use std::collections::VecDeque;

/// The last `capacity` closed fds, oldest first, plus a count of those dropped.
pub struct ClosedStore {
    records: VecDeque<ClosedFd>,
    capacity: usize,
    /// Records dropped to make room.
    pub evicted: u64,
}

impl ClosedStore {
    /// An empty store holding at most `capacity` records.
    pub fn new(capacity: usize) -> Self {
        ClosedStore {
            records: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
            evicted: 0,
        }
    }

    /// Appends, dropping the oldest when full.
    pub fn push(&mut self, r: ClosedFd) {
        if self.records.len() == self.capacity {
            self.records.pop_front();
            self.evicted += 1;
        }
        self.records.push_back(r);
    }

    /// The records, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &ClosedFd> {
        self.records.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FdCounts;

    #[test]
    fn keeps_the_newest_and_counts_the_rest() {
        let mut s = ClosedStore::new(3);
        for fd in 0..5 {
            s.push(ClosedFd::new(1, fd, fd as u64, 0, FdCounts::default()));
        }
        let fds: Vec<u32> = s.iter().map(|r| r.fd).collect();
        assert_eq!(fds, vec![2, 3, 4]);
        assert_eq!(s.evicted, 2);
    }
}

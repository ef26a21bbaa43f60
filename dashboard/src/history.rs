//! One sample per second of the cumulative counters, for the dashboard's charts: rates are the
//! differences between neighbouring samples, so the page never needs a second source of truth.

use serde::Serialize;
use std::collections::VecDeque;

/// Samples kept: ten minutes at one per second.
pub const KEPT: usize = 600;

/// Cumulative counters at one instant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Unix time in ms.
    pub t: u64,
    /// Requests by cache status, in `CacheStatus::ALL` order.
    pub requests: Vec<u64>,
    /// zerocache's socket bytes per syscall kind (kind order).
    pub bytes_by_kind: Vec<u64>,
    /// Kernel-verified body bytes via sendfile/splice.
    pub body_zerocopy: u64,
    /// Kernel-verified body bytes via copying syscalls that were meant for sendfile (the copies
    /// by design, relayed misses and TLS in user space, are left out).
    pub body_copy: u64,
    /// Violations so far.
    pub violations: u64,
}

/// The bounded series.
#[derive(Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Appends, dropping the oldest beyond [`KEPT`].
    pub fn push(&mut self, s: Sample) {
        if self.samples.len() == KEPT {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// All samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.iter().cloned().collect()
    }
}

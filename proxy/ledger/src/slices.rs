//! Counts of sliced objects (`routes[].slice`): slices fetched from the origin, slices served
//! from the store, slices revalidated, objects found changed at the origin between slices, and
//! objects an origin's answer made unsliced, by why. What `/metrics` shows as
//! `zerocache_slice_*`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why an object on a sliced route is served unsliced: the origin's answer to a slice request.
pub const UNSLICED_REASONS: [&str; 10] = [
    "slice-whole",
    "slice-unstable",
    "slice-content-range",
    "slice-length",
    "slice-vary",
    "slice-weak-etag",
    "slice-no-etag",
    "slice-stale",
    "too-large",
    "not-storable",
];

/// The counters.
#[derive(Default)]
pub struct SliceCounts {
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    served: AtomicU64,
    revalidated: AtomicU64,
    changed: AtomicU64,
    unsliced: [AtomicU64; UNSLICED_REASONS.len()],
}

impl SliceCounts {
    /// A slice of `bytes` was fetched from the origin and stored.
    pub fn fetched(&self, bytes: u64) {
        self.fetched.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A slice served (part of) a response from the store.
    pub fn served(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// A stale slice was made fresh again by a 304.
    pub fn revalidated(&self) {
        self.revalidated.fetch_add(1, Ordering::Relaxed);
    }

    /// Slices made fresh again by a 304.
    pub fn revalidations(&self) -> u64 {
        self.revalidated.load(Ordering::Relaxed)
    }

    /// An object's slices disagreed (it changed at the origin): all of them were dropped.
    pub fn changed(&self) {
        self.changed.fetch_add(1, Ordering::Relaxed);
    }

    /// An object is served unsliced, for `reason` (one of [`UNSLICED_REASONS`]; another counts
    /// as `not-storable`).
    pub fn unsliced(&self, reason: &str) {
        let i = UNSLICED_REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(UNSLICED_REASONS.len() - 1);
        self.unsliced[i].fetch_add(1, Ordering::Relaxed);
    }

    /// (slices fetched, their bytes, slices served from the store, objects changed).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        (
            self.fetched.load(Ordering::Relaxed),
            self.fetched_bytes.load(Ordering::Relaxed),
            self.served.load(Ordering::Relaxed),
            self.changed.load(Ordering::Relaxed),
        )
    }

    /// Objects made unsliced, by reason, in [`UNSLICED_REASONS`]' order.
    pub fn unsliced_by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        UNSLICED_REASONS
            .iter()
            .zip(&self.unsliced)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_an_unknown_reason() {
        let s = SliceCounts::default();
        s.fetched(10);
        s.fetched(5);
        s.served();
        s.changed();
        s.unsliced("slice-vary");
        s.unsliced("response-directive");
        assert_eq!(s.totals(), (2, 15, 1, 1));
        let by: Vec<_> = s.unsliced_by_reason().filter(|(_, n)| *n > 0).collect();
        assert_eq!(by, [("slice-vary", 1), ("not-storable", 1)]);
    }
}

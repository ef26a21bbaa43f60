//! The `/metrics` families of sliced objects (`routes[].slice`): `zerocache_slice_fetches_total`,
//! `zerocache_slice_fetched_bytes_total`, `zerocache_slice_hits_total`,
//! `zerocache_slice_revalidations_total`, `zerocache_slice_objects_changed_total` and
//! `zerocache_slice_unsliced_total{reason}`, every label value present from start-up.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use zerocache_ledger::Accounting;

fn counter(r: &Registry, name: &str, help: &str, v: u64) -> prometheus::Result<()> {
    let c = IntCounter::new(name, help)?;
    c.inc_by(v);
    r.register(Box::new(c))
}

/// Adds the families to `r`.
pub(crate) fn register(r: &Registry, acc: &Accounting) -> prometheus::Result<()> {
    let (fetched, bytes, served, changed) = acc.slices.totals();
    counter(
        r,
        "zerocache_slice_fetches_total",
        "Slices fetched from the origin (by Range) to be stored.",
        fetched,
    )?;
    counter(
        r,
        "zerocache_slice_fetched_bytes_total",
        "Body bytes of the slices fetched from the origin.",
        bytes,
    )?;
    counter(
        r,
        "zerocache_slice_hits_total",
        "Slices that served (part of) a response from the store.",
        served,
    )?;
    counter(
        r,
        "zerocache_slice_revalidations_total",
        "Stale slices made fresh again by a 304 to a conditional range request.",
        acc.slices.revalidations(),
    )?;
    counter(
        r,
        "zerocache_slice_objects_changed_total",
        "Sliced objects whose slices disagreed (the object changed at the origin): all their slices were dropped.",
        changed,
    )?;
    let unsliced = IntCounterVec::new(
        Opts::new(
            "zerocache_slice_unsliced_total",
            "Objects on a sliced route served unsliced for a while, by the origin's answer to a slice request (slice-whole: a 200, no range support).",
        ),
        &["reason"],
    )?;
    for (reason, n) in acc.slices.unsliced_by_reason() {
        unsliced.with_label_values(&[reason]).inc_by(n);
    }
    r.register(Box::new(unsliced))
}

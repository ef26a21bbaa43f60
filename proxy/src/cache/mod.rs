//! The disk cache: one file per stored response, an in-memory index with LRU eviction, fills that
//! become entries only when complete, the locks that coalesce concurrent misses, and the HTTP
//! caching rules (RFC 9111) that decide what is stored, for how long, and how it is reused.

pub mod check;
pub mod conditional;
pub(crate) mod decide;
pub mod directives;
pub mod entry;
pub mod fill;
pub mod freshness;
pub mod growing;
pub mod invalidation;
pub mod key;
pub mod lock;
pub mod policy;
pub(crate) mod rules;
pub mod scrub;
pub mod slice;
pub mod stale;
pub mod store;
pub mod stored_meta;
pub mod tags;
pub mod targeted;
#[cfg(test)]
mod test_support;
pub mod validation;
pub mod variance;

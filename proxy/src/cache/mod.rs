//! The disk cache: one file per stored response, an in-memory index with LRU eviction, fills that
//! become entries only when complete, and the locks that coalesce concurrent misses.

pub mod entry;
pub mod fill;
pub mod key;
pub mod lock;
pub mod policy;
pub mod store;

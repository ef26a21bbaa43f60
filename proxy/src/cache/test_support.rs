//! What the cache's unit tests share: a store in a temporary directory, entries stored through a
//! real fill (as the proxy stores them), and a body byte flipped on disk as a bad sector would.

use super::entry::{Entry, Meta};
use super::fill::Fill;
use super::key::CacheKey;
use super::store::{Store, StoreLimits};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A store under `dir` with room for everything and `open_files` files kept open.
pub(crate) fn store(dir: &Path, open_files: usize) -> Arc<Store> {
    store_keeping(dir, open_files, 4096)
}

/// [`store`], keeping at most `hot` entries whole (the others are read from their heads).
pub(crate) fn store_keeping(dir: &Path, open_files: usize, hot: usize) -> Arc<Store> {
    let limits = StoreLimits {
        max_size: 1 << 30,
        max_entries: 1000,
        levels: 1,
        open_files,
        hot_entries: hot,
    };
    Arc::new(Store::open(dir, limits).expect("store"))
}

/// Stores `body` for `GET http://h{target}`, fresh for 10 minutes.
pub(crate) fn put(store: &Arc<Store>, target: &str, body: &[u8]) -> Arc<Entry> {
    let key = CacheKey::new("GET", "http", "h", target, 128);
    let url = key.text.clone();
    fill(
        store,
        &key,
        &url,
        b"Cache-Control: max-age=600\r\n",
        Vec::new(),
        body,
    )
}

/// Stores `body` under `key` (indexed for `url`) through a real fill, fresh for 10 minutes,
/// written in uneven pieces as an upstream delivers them.
pub(crate) fn fill(
    store: &Arc<Store>,
    key: &CacheKey,
    url: &str,
    fields: &[u8],
    vary: Vec<String>,
    body: &[u8],
) -> Arc<Entry> {
    let meta = Meta {
        key: key.text.clone(),
        stored_at: SystemTime::now(),
        initial_age: Duration::ZERO,
        lifetime: Duration::from_secs(600),
        status: 200,
        reason: "OK".into(),
        fields: fields.to_vec(),
        vary,
        url: url.to_string(),
    };
    let mut fill = Fill::create(store.clone(), key.hash, meta).expect("fill");
    for piece in body.chunks(65_536 + 17) {
        fill.write(piece).expect("write");
    }
    fill.commit().expect("commit")
}

/// `len` bytes of a pattern that differs with `seed`.
pub(crate) fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Flips one bit of `e`'s body byte `at`, in place, as a bad sector or a stray write would.
pub(crate) fn flip(e: &Entry, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&e.path)
        .expect("open");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, e.body_offset + at).expect("read");
    f.write_all_at(&[b[0] ^ 0x20], e.body_offset + at)
        .expect("write");
}

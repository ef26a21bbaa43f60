//! The store's own tests: real fills into a temporary directory, real files deleted, corrupted
//! and failed to open underneath it.

use super::open_files::injected::{self, fail_next_opens};
use super::*;
use crate::cache::test_support::{fill, flip, put, store, store_keeping};
use std::time::Duration;

fn indexed(store: &Store, e: &Arc<Entry>) -> bool {
    let key = CacheKey::from_text(e.meta.key.clone(), 128);
    store
        .lookup_varying(&key, |_| key.clone())
        .is_some_and(|found| Arc::ptr_eq(&found, e))
}

#[test]
fn purging_a_url_forgets_what_its_keyed_primary_varied_on() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    // A route with `cache_key.headers`: the primary key is the URL's plus a key field.
    let url = CacheKey::new("GET", "http", "h", "/v", 128);
    let primary = url
        .clone()
        .with_headers(&["x-tenant".to_string()], |_| Some("a".into()), 128);
    assert_ne!(primary.text, url.text);
    for lang in ["en", "fr"] {
        let key = CacheKey::from_text(
            format!(
                "{}{}accept-language={lang}",
                primary.text,
                crate::cache::variance::SEPARATOR
            ),
            128,
        );
        fill(
            &s,
            &key,
            &url.text,
            b"Vary: Accept-Language\r\n",
            vec!["accept-language".into()],
            lang.as_bytes(),
        );
    }
    assert!(s.index.lock().varies_on(primary.hash).is_some());
    assert_eq!(s.usage().1, 2, "the marker is not an entry");
    let marker = s.layout.entry_path_unchecked(primary.hash);
    assert!(marker.exists(), "the marker names the fields");
    assert_eq!(s.purge_url(&url.text), 2);
    assert_eq!(s.usage(), (0, 0));
    assert!(!marker.exists(), "the marker goes with its URL");
    assert!(
        s.index.lock().varies_on(primary.hash).is_none(),
        "the primary's Vary names outlived its entries"
    );
}

#[test]
fn a_deleted_file_drops_its_entry() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let e = put(&s, "/gone", b"body");
    fs::remove_file(&e.path).expect("rm");
    let err = s.open_file(&e).expect_err("file is gone");
    assert_eq!(OpenFailure::of(&err), OpenFailure::Gone);
    assert!(!indexed(&s, &e));
    assert_eq!(s.usage(), (0, 0));
}

#[test]
fn a_file_deleted_while_cached_drops_its_entry_at_the_recheck() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let e = put(&s, "/gone-later", b"body");
    s.open_file(&e).expect("open");
    assert_eq!(s.open_files(), 1);
    fs::remove_file(&e.path).expect("rm");
    // Age the cached handle past the link-count recheck.
    if let Some(of) = e.file.lock().as_mut() {
        of.checked -= Duration::from_secs(1);
    }
    let err = s.open_file(&e).expect_err("file is gone");
    assert_eq!(OpenFailure::of(&err), OpenFailure::Gone);
    assert!(!indexed(&s, &e));
    assert_eq!(s.open_files(), 0);
}

#[test]
fn out_of_fds_gives_back_idle_files_and_retries() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let a = put(&s, "/a", b"aaaa");
    let b = put(&s, "/b", b"bbbb");
    s.open_file(&a).expect("open a");
    assert_eq!(s.open_files(), 1);
    fail_next_opens(&[libc::EMFILE]);
    let f = s
        .open_file(&b)
        .expect("the retry after giving back a's fd works");
    let mut got = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&*f, &mut got, b.body_offset).expect("read");
    assert_eq!(&got, b"bbbb");
    // a's idle handle went, b's took its place; both entries stay.
    assert!(a.file.lock().is_none());
    assert!(b.file.lock().is_some());
    assert_eq!(s.open_files(), 1);
    assert!(indexed(&s, &a) && indexed(&s, &b));
    // a opens again on its next hit.
    s.open_file(&a).expect("reopen a");
    assert_eq!(s.open_files(), 2);
}

#[test]
fn emfile_or_any_other_error_keeps_the_entry() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let e = put(&s, "/kept", b"kept");
    for (errnos, want) in [
        (&[libc::EMFILE, libc::EMFILE][..], OpenFailure::NoFds),
        (&[libc::ENFILE, libc::ENFILE][..], OpenFailure::NoFds),
        (&[libc::EACCES][..], OpenFailure::Other),
        (&[libc::EIO][..], OpenFailure::Other),
    ] {
        fail_next_opens(errnos);
        let err = s.open_file(&e).expect_err("injected failure");
        assert_eq!(OpenFailure::of(&err), want, "{errnos:?}");
        assert!(indexed(&s, &e), "{errnos:?} must not drop the entry");
        assert!(e.path.exists(), "{errnos:?} must not delete the file");
        assert_eq!(injected::next(), None, "{errnos:?}: one retry at most");
    }
    assert_eq!(s.usage().1, 1);
    s.open_file(&e).expect("opens once fds are back");
}

#[test]
fn the_held_list_stays_bounded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 4);
    for i in 0..500 {
        // Each entry is replaced before the next: its slot goes with it.
        let e = put(&s, "/churn", format!("{i}").as_bytes());
        s.open_file(&e).expect("open");
    }
    assert!(s.files.held_len() <= 2 * 32 + 1);
    assert!(s.open_files() <= 4);
}

#[test]
fn a_fill_stores_its_body_checksum() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let e = put(&s, "/sum", &body);
    assert_eq!(e.body_checksum, entry::body_checksum(&body));
    let h = entry::read_entry_header(&File::open(&e.path).expect("open")).expect("header");
    assert_eq!(h.body_checksum, e.body_checksum);
    // A revalidation rewrites the header and keeps the checksum.
    let mut meta = e.meta.clone();
    meta.fields = b"Cache-Control: max-age=900\r\n".to_vec();
    let updated = s.replace_meta(&e, meta);
    assert_eq!(updated.body_checksum, e.body_checksum);
    let h = entry::read_entry_header(&File::open(&e.path).expect("open")).expect("header");
    assert_eq!(h.body_checksum, e.body_checksum);
    assert_eq!(h.meta.fields, b"Cache-Control: max-age=900\r\n");
}

#[test]
fn start_up_verification_discards_a_corrupt_body() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let good = put(&s, "/good", &[7u8; 5000]);
    let bad = put(&s, "/bad", &[9u8; 5000]);
    flip(&bad, 500);
    drop(s);
    // Without verification the corrupt entry is indexed (a hit never reads the body).
    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!((r.entries, r.verified, r.corrupt), (2, 0, 0));
    drop(s);
    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(64).expect("rebuild");
    assert_eq!(
        r,
        Rebuilt {
            restored: 0,
            entries: 1,
            discarded: 1,
            verified: 2,
            corrupt: 1
        }
    );
    assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 1);
    assert!(!bad.path.exists());
    assert!(good.path.exists());
    assert_eq!(s.usage().1, 1);
    assert!(s.peek(good.hash).is_some() && s.peek(bad.hash).is_none());
    // Counted for /metrics once the accounting exists, and after.
    let acc = Arc::new(zerocache_ledger::Accounting::new(8, false));
    s.attach_accounting(acc.clone());
    assert_eq!(acc.corrupt_entries(), 1);
    s.corrupt_found(2);
    assert_eq!(acc.corrupt_entries(), 3);
    assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 3);
}

#[test]
fn start_up_verification_reads_at_most_its_sample() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    for i in 0..6 {
        put(&s, &format!("/e{i}"), format!("body {i}").as_bytes());
    }
    drop(s);
    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(2).expect("rebuild");
    assert_eq!((r.entries, r.verified, r.corrupt), (6, 2, 0));
    assert_eq!(s.sample(6).len(), 6);
    assert_eq!(s.sample(10).len(), 6);
    assert_eq!(s.sample(0).len(), 0);
}

#[test]
fn remove_corrupt_spares_a_newer_fill() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let old = put(&s, "/k", b"old body");
    let new = put(&s, "/k", b"new body");
    assert!(!s.remove_corrupt(&old), "the index holds a newer fill");
    assert!(indexed(&s, &new) && new.path.exists());
    assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 0);
    // The same body with its header rewritten after a revalidation goes, though.
    let revalidated = s.replace_meta(&new, new.meta.clone());
    assert!(s.remove_corrupt(&new));
    assert!(!indexed(&s, &revalidated) && !new.path.exists());
    assert_eq!(s.corrupt_entries.load(Ordering::Relaxed), 1);
}

/// A SIGUSR2 upgrade shares the directory: the rebuild keeps the temp files of another live
/// process's fills (pid 1 here), and deletes its own pid's and a dead process's.
#[test]
fn rebuild_keeps_the_fills_of_another_live_process() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let mut dead = std::process::Command::new("true").spawn().expect("true");
    let dead_pid = dead.id();
    dead.wait().expect("wait");
    let names = [
        "1-0.tmp".to_string(),
        format!("{}-3.tmp", std::process::id()),
        format!("{dead_pid}-0.tmp"),
        "garbage.tmp".to_string(),
    ];
    for n in &names {
        std::fs::write(tmp.path().join("tmp").join(n), b"partial").expect("temp");
    }
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!(r.discarded, 3);
    let mut left: Vec<String> = std::fs::read_dir(tmp.path().join("tmp"))
        .expect("tmp dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, vec!["1-0.tmp".to_string()]);
}

/// While a successor takes the directory over, a fill is not committed (its temp file goes)
/// and nothing is evicted; after a failed upgrade both work again.
#[test]
fn a_store_handed_over_commits_and_evicts_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let kept = put(&s, "/a", b"kept");
    s.hand_over(true);
    let other = CacheKey::new("GET", "http", "h", "/b", 128);
    let meta = crate::cache::entry::Meta {
        key: other.text.clone(),
        stored_at: std::time::SystemTime::now(),
        initial_age: Duration::ZERO,
        lifetime: Duration::from_secs(600),
        status: 200,
        reason: "OK".into(),
        fields: Vec::new(),
        vary: Vec::new(),
        url: other.text.clone(),
    };
    let mut f = crate::cache::fill::Fill::create(s.clone(), other.hash, meta).expect("create");
    f.write(b"body").expect("write");
    let err = f.commit().expect_err("refused");
    assert_eq!(err.to_string(), crate::cache::fill::HANDING_OVER);
    assert_eq!(
        std::fs::read_dir(tmp.path().join("tmp"))
            .expect("tmp")
            .count(),
        0
    );
    s.evict_to_fit(u64::MAX / 2);
    assert!(indexed(&s, &kept), "not evicted while handing over");
    s.hand_over(false);
    s.evict_to_fit(u64::MAX / 2);
    assert!(!indexed(&s, &kept), "evicted again after a failed upgrade");
}

fn reads(s: &Store) -> u64 {
    s.head_reads.load(Ordering::Relaxed)
}

#[test]
fn an_entry_not_kept_whole_is_read_from_its_head_once_then_kept() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store_keeping(tmp.path(), 10, 1);
    let a = put(&s, "/a", b"aaaa");
    let b = put(&s, "/b", b"bbbb");
    // Only /b is kept whole now: /a is read back from its file, once.
    let key = CacheKey::new("GET", "http", "h", "/a", 128);
    let found = s.lookup_varying(&key, |_| unreachable!()).expect("/a");
    assert_eq!(reads(&s), 1);
    assert!(!Arc::ptr_eq(&found, &a), "read back, not kept");
    // The file keeps times to the millisecond: the meta read back is the meta encoded.
    let on_disk = entry::Meta::decode(&a.meta.encode()).expect("decodes");
    assert_eq!(
        (found.id, &found.meta, &found.hit_head),
        (a.id, &on_disk, &a.hit_head)
    );
    assert_eq!(
        (
            found.body_offset,
            found.body_len,
            found.body_checksum,
            &found.path
        ),
        (a.body_offset, a.body_len, a.body_checksum, &a.path)
    );
    assert!(s.is_current(&a) && s.is_current(&found), "the same entry");
    let again = s.lookup_varying(&key, |_| unreachable!()).expect("/a");
    assert!(Arc::ptr_eq(&again, &found));
    assert_eq!(reads(&s), 1, "kept whole after the read");
    // The read kept its file open for the hit's sendfile: no second open.
    assert_eq!(s.open_files(), 1);
    assert!(s.open_file(&again).is_ok());
    assert_eq!(s.open_files(), 1);
    // /b left the hot set for /a and is read when asked for.
    assert!(indexed(&s, &b) || reads(&s) == 2);
    assert_eq!(s.usage().1, 2);
}

#[test]
fn a_hash_collision_with_an_entry_not_kept_whole_is_a_miss() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store_keeping(tmp.path(), 10, 1);
    // Keys under 4-bit hashes, as a forged collision: /x and another target share one.
    let k = |t: &str| CacheKey::new("GET", "http", "h", t, 4);
    let x = k("/x");
    let twin = (0..)
        .map(|i| k(&format!("/y{i}")))
        .find(|y| y.hash == x.hash)
        .expect("a twin");
    let other = (0..)
        .map(|i| k(&format!("/z{i}")))
        .find(|z| z.hash != x.hash)
        .expect("another");
    fill(&s, &x, &x.text, b"", Vec::new(), b"x's body");
    fill(&s, &other, &other.text, b"", Vec::new(), b"other");
    assert!(s.lookup_varying(&twin, |_| unreachable!()).is_none());
    assert_eq!(reads(&s), 1, "the key was read and compared");
    assert_eq!(s.usage().1, 2, "x keeps its place");
    let got = s.lookup_varying(&x, |_| unreachable!()).expect("x");
    assert_eq!(got.meta.key, x.text);
}

#[test]
fn a_file_replaced_underneath_is_a_miss_and_a_corrupt_head_goes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store_keeping(tmp.path(), 10, 1);
    let a = put(&s, "/a", b"aaaa");
    let c = put(&s, "/c", b"cccc");
    let key = CacheKey::new("GET", "http", "h", "/a", 128);
    // Another body under /a's name (as a successor's refill during an upgrade would leave).
    let original = fs::read(&a.path).expect("read");
    fs::copy(&c.path, &a.path).expect("copy");
    assert!(s.lookup_varying(&key, |_| unreachable!()).is_none());
    assert_eq!(s.usage().1, 2, "not ours to drop");
    assert!(a.path.exists());
    // Put back, then a bit flipped in the head: the entry and its file go.
    fs::write(&a.path, &original).expect("write");
    assert!(s.lookup_varying(&key, |_| unreachable!()).is_some());
    let _ = put(&s, "/c2", b"c2");
    let mut bytes = original.clone();
    bytes[60] ^= 0x20;
    fs::write(&a.path, &bytes).expect("write");
    assert!(s.lookup_varying(&key, |_| unreachable!()).is_none());
    assert_eq!(s.usage().1, 2);
    assert!(!a.path.exists(), "a corrupt head is deleted");
}

/// Two plain entries, one tagged, and a URL with two variants (and so its marker).
fn stock(s: &Arc<Store>) -> (Arc<Entry>, CacheKey) {
    let a = put(s, "/a", b"aaaa");
    let t = CacheKey::new("GET", "http", "h", "/t", 128);
    fill(
        s,
        &t,
        &t.text,
        b"Surrogate-Key: shop\r\n",
        Vec::new(),
        b"tagged",
    );
    let url = CacheKey::new("GET", "http", "h", "/v", 128);
    for lang in ["en", "fr"] {
        let key = crate::cache::variance::variant(
            &url,
            &["accept-language".to_string()],
            &crate::http::request::test_request("GET", &format!("Accept-Language: {lang}\r\n")),
            128,
        );
        fill(
            s,
            &key,
            &url.text,
            b"Vary: Accept-Language\r\n",
            vec!["accept-language".into()],
            lang.as_bytes(),
        );
    }
    (a, url)
}

#[test]
fn a_snapshot_restores_the_whole_index_without_reading_a_head_and_is_read_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let (a, url) = stock(&s);
    let usage = s.usage();
    assert_eq!(usage.1, 4);
    s.hand_over(true);
    assert_eq!(s.write_snapshot().expect("written"), 4);
    drop(s);

    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!((r.restored, r.entries, r.discarded), (4, 0, 0));
    assert_eq!(s.usage(), usage, "the same bytes and entries");
    assert_eq!(reads(&s), 0, "not one head read");
    assert!(
        !state_dir(tmp.path()).join("index.snap").exists(),
        "read once"
    );
    // Every index works as before: by key, through the Vary names, by tag.
    let found = s
        .lookup_varying(
            &CacheKey::new("GET", "http", "h", "/a", 128),
            |_| unreachable!(),
        )
        .expect("/a");
    assert_eq!(
        (found.body_checksum, &found.path),
        (a.body_checksum, &a.path)
    );
    let fr = s.lookup_varying(&url, |names| {
        crate::cache::variance::variant(
            &url,
            names,
            &crate::http::request::test_request("GET", "Accept-Language: fr\r\n"),
            128,
        )
    });
    assert_eq!(fr.expect("fr").body_len, 2);
    assert_eq!(s.purge_tag("shop"), 1);
    assert_eq!(s.purge_url(&url.text), 2);
    assert_eq!(s.usage().1, 1);
}

#[test]
fn a_torn_snapshot_or_one_of_another_layout_is_ignored_and_every_head_is_read() {
    let tmp = tempfile::tempdir().expect("tmp");
    let snap = state_dir(tmp.path()).join("index.snap");
    let s = store(tmp.path(), 10);
    stock(&s);
    s.hand_over(true);
    s.write_snapshot().expect("written");
    drop(s);
    // Torn: its last byte lost.
    let bytes = fs::read(&snap).expect("read");
    fs::write(&snap, &bytes[..bytes.len() - 1]).expect("write");
    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!(
        (r.restored, r.entries),
        (0, 5),
        "four entries and the marker, read"
    );
    assert!(!snap.exists(), "a torn one is not read twice");
    s.hand_over(true);
    s.write_snapshot().expect("written");
    drop(s);
    // Whole, but written under `levels: 1`: another layout names other paths.
    let limits = StoreLimits {
        max_size: 1 << 30,
        max_entries: 1000,
        levels: 2,
        open_files: 10,
        hot_entries: 16,
    };
    let s = Store::open(tmp.path(), limits).expect("store");
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!((r.restored, r.entries), (0, 5));
    s.hand_over(true);
    s.write_snapshot().expect("written");
    drop(s);
    // Whole and of this layout, but its tags were read from another field.
    let s = Store::open(tmp.path(), limits).expect("store").with_tags(
        crate::cache::tags::TagField::new("Cache-Tag", crate::cache::tags::Separator::Comma, false),
    );
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!((r.restored, r.entries), (0, 5));
}

/// The load deletes a file named as an entry that is not a whole one, and nothing else: a file
/// an operator put in the cache directory (or a directory shared by mistake) is not the
/// cache's. Found by the full-disk test, whose filler the background load deleted when it ran
/// late.
#[test]
fn the_load_leaves_files_not_named_as_entries_alone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s = store(tmp.path(), 10);
    let good = put(&s, "/good", &[7u8; 100]);
    drop(s);
    let shard = good.path.parent().expect("shard").to_path_buf();
    let foreign = [
        tmp.path().join("not-the-caches"),
        tmp.path().join("README"),
        shard.join(format!("{:031x}", 5u8)),
        shard.join(format!("{:032x}.bak", 5u8)),
    ];
    for f in &foreign {
        std::fs::write(f, b"an operator's").expect("foreign file");
    }
    let corrupt = shard.join(format!("{:032x}", 5u8));
    std::fs::write(&corrupt, vec![b'x'; 4096]).expect("corrupt");
    let s = store(tmp.path(), 10);
    let r = s.rebuild_verifying(0).expect("rebuild");
    assert_eq!((r.entries, r.discarded), (1, 1));
    assert!(!corrupt.exists());
    for f in &foreign {
        assert_eq!(std::fs::read(f).expect("kept"), b"an operator's", "{f:?}");
    }
    assert!(good.path.exists());
}

//! Cold hits never block the runtime: pages not in the page cache are read in on the blocking
//! pool before sendfile, and hot hits are not even checked.

use crate::support::*;
use std::time::Duration;

fn cold_offloads(proxy: &Proxy) -> u64 {
    proxy
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("zerocache_cold_hit_offloads_total "))
        .and_then(|v| v.parse().ok())
        .expect("cold offload metric")
}

/// Pages of `f` in the page cache (cachestat(2), Linux 6.5+; `None` where the kernel has none).
fn cached_pages(f: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // struct cachestat_range { off, len } (len 0: to the end) and struct cachestat's five u64s.
    let range = [0u64, 0u64];
    let mut st = [0u64; 5];
    // SAFETY: a valid fd and pointers to locals of the kernel's layout.
    let r = unsafe { libc::syscall(451, f.as_raw_fd(), range.as_ptr(), st.as_mut_ptr(), 0u32) };
    (r == 0).then_some(st[0])
}

/// Drops every cache file's pages, as a cold cache would have them, and checks that they are
/// gone: POSIX_FADV_DONTNEED skips pages still in another CPU's LRU batch or under writeback,
/// and on a busy machine one call left a whole body resident (the hit was then rightly hot, and
/// the test failed on its own precondition). So it asks again until cachestat counts none of a
/// body's.
fn evict_cache_files(dir: &std::path::Path) {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let f = std::fs::File::open(&p).expect("open");
            f.sync_all()
                .expect("write back first: dirty pages cannot be dropped");
            // Only the bodies under test must go (the index and small files may be written to
            // while this runs).
            let body = f.metadata().expect("metadata").len() >= 1 << 20;
            let mut left = None;
            for _ in 0..100 {
                let _ = nix::fcntl::posix_fadvise(
                    &f,
                    0,
                    0,
                    nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                );
                left = cached_pages(&f).filter(|_| body);
                if left.is_none_or(|n| n == 0) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                left.is_none_or(|n| n == 0),
                "{} keeps {left:?} pages in the page cache after 100 POSIX_FADV_DONTNEED",
                p.display()
            );
        }
    }
}

#[test]
fn a_cold_hit_is_read_in_off_the_event_loop_and_a_hot_one_is_not_checked() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    assert_eq!(proxy.get("/obj/2000000").x_cache(), "MISS");
    evict_cache_files(&proxy.dir);
    let mut c = proxy.client();
    let r = c.get("/obj/2000000", &[]);
    assert_eq!((r.x_cache(), r.body.clone()), ("HIT", body(2_000_000)));
    assert_eq!(
        cold_offloads(&proxy),
        1,
        "the evicted entry was read in on the blocking pool"
    );
    // Hot: hit within the last second, not even checked.
    assert_eq!(c.get("/obj/2000000", &[]).x_cache(), "HIT");
    assert_eq!(cold_offloads(&proxy), 1);
    // Evicted again and idle for a second: offloaded again.
    std::thread::sleep(Duration::from_millis(1100));
    evict_cache_files(&proxy.dir);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(c.get("/obj/2000000", &[]).body, body(2_000_000));
    assert_eq!(cold_offloads(&proxy), 2);
}

/// With pinned workers, the blocking-pool thread that reads a cold entry in is not pinned with
/// its worker (it would compete with that worker for its one CPU): every thread but the workers
/// keeps the process's whole CPU mask.
#[test]
fn a_pinned_workers_blocking_threads_keep_the_whole_mask() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            extra_yaml: "workers:\n  cpu_affinity: true\n".into(),
            ..Opts::default()
        },
    );
    let pid = proxy.child.id();
    assert_eq!(proxy.get("/obj/2000000").x_cache(), "MISS");
    let before = thread_cpu_lists(pid).len();
    evict_cache_files(&proxy.dir);
    let r = proxy.get("/obj/2000000");
    assert_eq!((r.x_cache(), &r.body), ("HIT", &body(2_000_000)));
    assert_eq!(cold_offloads(&proxy), 1);
    let threads = thread_cpu_lists(pid);
    assert!(threads.len() > before, "no blocking thread: {threads:?}");
    let mask = process_cpu_list(pid);
    for (name, list) in &threads {
        if !name.starts_with("zerocache-w") {
            assert_eq!(list, &mask, "thread {name}: {threads:?}");
        }
    }
}

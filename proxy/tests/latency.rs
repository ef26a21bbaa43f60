//! No latency cliffs and no cold hit on the event loop. The bounds are generous (10 ms against the
//! ~40 ms stall nginx shows with tcp_nopush at 64 KiB), so only the pathology fails them.

mod support;
use std::time::{Duration, Instant};
use support::*;

#[test]
fn fifty_sequential_keep_alive_hits_per_size_never_take_10ms() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            probe: true,
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    for size in [1024usize, 65_536, 65_537, 1_000_000, 1_048_576] {
        let path = format!("/obj/{size}");
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS");
        let mut worst = Duration::ZERO;
        for _ in 0..50 {
            let t = Instant::now();
            let r = c.get(&path, &[]);
            let took = t.elapsed();
            assert_eq!((r.x_cache(), r.body.len()), ("HIT", size));
            worst = worst.max(took);
        }
        assert!(
            worst < Duration::from_millis(10),
            "{size} B: slowest of 50 hits took {worst:?}"
        );
    }
}

fn cold_offloads(proxy: &Proxy) -> u64 {
    proxy
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("zerocache_cold_hit_offloads_total "))
        .and_then(|v| v.parse().ok())
        .expect("cold offload metric")
}

fn evict_cache_files(dir: &std::path::Path) {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let f = std::fs::File::open(&p).expect("open");
                f.sync_all()
                    .expect("write back first: dirty pages cannot be dropped");
                zerocache::residency::evict(&f);
            }
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
    // Resident but not recently hit: checked, found in memory, not offloaded.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(c.get("/obj/2000000", &[]).x_cache(), "HIT");
    assert_eq!(cold_offloads(&proxy), 1);
    // Evicted again and idle for a second: offloaded again.
    evict_cache_files(&proxy.dir);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(c.get("/obj/2000000", &[]).body, body(2_000_000));
    assert_eq!(cold_offloads(&proxy), 2);
}

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

//! Memory stays bounded under 100,000 short connections: closed records are capped, nothing stays
//! behind in the kernel maps, and every event is either received or counted as lost.

#[path = "../../../proxy/tests/it/support/require.rs"]
#[allow(dead_code)]
mod require;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zerocache_probe::{Probe, ProbeOptions, WatchTarget};

const CONNECTIONS: usize = 100_000;
const CAP: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_short_connections_stay_bounded_and_accounted() {
    if !require::root("loads the eBPF probe") {
        return;
    }
    let probe = Probe::start(ProbeOptions {
        enabled: true,
        watch: vec![WatchTarget::SelfProcess],
        closed_capacity: CAP,
    });
    assert!(probe.status().is_attached(), "{:?}", probe.status());
    let mut rx = probe.subscribe_closed();
    let counter = tokio::spawn(async move {
        let mut accepted = 0usize;
        loop {
            match rx.recv().await {
                Ok(r) if r.accepted => accepted += 1,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return accepted,
            }
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let client = std::thread::spawn(move || {
        for _ in 0..CONNECTIONS {
            let mut c = TcpStream::connect(addr).expect("connect");
            let mut b = [0u8; 1];
            c.read_exact(&mut b).expect("one byte");
        }
    });
    tokio::task::spawn_blocking(move || {
        for _ in 0..CONNECTIONS {
            let (mut s, _) = listener.accept().expect("accept");
            s.write_all(b"x").expect("write");
        }
    })
    .await
    .expect("server");
    client.join().expect("client");

    // Every accepted connection's close is either in the store, evicted from it, or lost.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = probe.snapshot();
        let h = snap.health;
        let stored = probe
            .closed(usize::MAX)
            .iter()
            .filter(|r| r.accepted)
            .count() as u64;
        let seen = probe.closed(usize::MAX).len() as u64 + h.closed_evicted;
        if seen + h.events_lost >= CONNECTIONS as u64 {
            assert!(stored <= CAP as u64);
            assert_eq!(probe.closed(usize::MAX).len(), CAP);
            // Nothing of the closed connections stays in the kernel's per-fd map.
            let live: Vec<_> = probe
                .live_fds(std::process::id())
                .into_iter()
                .filter(|(_, _, socket, _)| *socket)
                .collect();
            assert!(live.len() < 10, "{} live socket records left", live.len());
            eprintln!(
                "100k connections: {} evicted, {} lost in the kernel, {} kept",
                h.closed_evicted, h.events_lost, CAP
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {seen} + {} lost of {CONNECTIONS}",
            h.events_lost
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(probe);
    counter.abort();
}

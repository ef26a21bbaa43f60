//! Test support: a real origin, the real `zerocache` binary with a generated config, and a small
//! raw HTTP/1.1 client that keeps the exact bytes it received. Test files declare `mod support;`
//! and `use support::*;`, which brings in everything below, the `require` module included.
//!
//! - [`proxy`]: [`Proxy`] (a running zerocache, killed on drop), its [`Opts`], [`origin`];
//! - [`client`]: [`Client`] and [`Response`];
//! - [`observe`]: `/metrics` series, worker loads and CPU lists, sendfile byte counts;
//! - [`h2raw`]: a raw HTTP/2 client (frames and HPACK literals by hand) for hostile tests;
//! - [`require`]: root, CPUs, Chromium, commands: skip with the reason, or fail under
//!   `ZEROCACHE_REQUIRE_PRIVILEGED=1`.
#![allow(dead_code, unused_imports)]

mod client;
mod fleet;
pub mod h2raw;
mod observe;
mod proxy;
pub mod require;

pub use client::*;
pub use fleet::*;
pub use observe::*;
pub use proxy::*;
pub use zerocache_origin::{Framing, Origin, Reply, body};

use std::time::{Duration, Instant};

/// Polls `read` every 10 ms for up to `within` until it returns `want`, then asserts that it
/// does: for what the proxy does just after the client has its answer (accounting, metrics,
/// committing an entry, releasing a connection, re-pinning a worker).
pub fn assert_eventually_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    within: Duration,
    mut read: impl FnMut() -> T,
    want: T,
) {
    let deadline = Instant::now() + within;
    let mut got = read();
    while got != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        got = read();
    }
    assert_eq!(got, want, "{what}");
}

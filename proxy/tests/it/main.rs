//! The proxy's integration tests, as one binary: the real `zerocache` binary against a real
//! origin, real sockets and clients, the real probe. One module per concern, each file's own
//! `//!` says what it covers; `support` (origin, proxy, client, metrics) and `tls_support`
//! (certificates, TLS clients) are shared.
//!
//! One binary rather than one per file: each test binary links the whole crate and its
//! dependencies, and 33 of them made linking most of the build. Filter as usual:
//! `cargo test -p zerocache --test it -- zero_copy::`.

mod support;
mod tls_support;

mod access_log;
mod alerts;
mod binary_upgrade;
mod cache_config;
mod cli;
mod cold_hits;
mod dashboard;
mod dashboard_csrf;
mod data_plane;
mod edge_rules;
mod faults;
mod fd_limit;
mod fleet_deploy;
mod fleet_nodes;
mod fleet_page;
mod fleet_view;
mod house;
mod http2;
mod image;
mod index_load;
mod integrity;
mod latency;
mod layering;
mod operations;
mod package;
mod placement;
mod poisoning;
mod proxy_protocol;
mod purge_method;
mod purge_tags;
mod rfc9111;
mod rfc9111_optional;
mod rfc9213;
mod rfc_invalidation_stale;
mod slices;
mod slow_clients;
mod smuggling;
mod systemd_unit;
mod test_clock;
mod tls_ktls;
mod tls_listener;
mod tls_origin;
mod upgrade;
mod uploads;
mod upstreams;
mod watch_cli;
mod zero_copy;

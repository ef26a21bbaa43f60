//! `limits:`: the bound on every wait, buffer and client share that faces the network.

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Limits on client requests.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request head (request line and headers); larger gets 431.
    #[serde(default = "default_max_header", with = "crate::units::size")]
    pub max_header_bytes: ByteSize,
    /// Longest request target; longer gets 414.
    #[serde(default = "default_max_uri", with = "crate::units::size")]
    pub max_uri_bytes: ByteSize,
    /// Time a client has to send a complete request head; slower gets 408.
    #[serde(default = "default_header_timeout", with = "crate::units::duration")]
    pub header_timeout: Duration,
    /// Time a keep-alive connection may sit idle between requests.
    #[serde(default = "default_idle_timeout", with = "crate::units::duration")]
    pub idle_timeout: Duration,
    /// Time allowed between reads of a request body; slower clients are disconnected.
    #[serde(
        default = "default_client_read_timeout",
        with = "crate::units::duration"
    )]
    pub read_timeout: Duration,
    /// Least average rate of a request body, in bytes per second (Apache mod_reqtimeout's
    /// `MinRate`): the whole body must arrive by `read_timeout` plus one second per this many
    /// bytes received, so a client trickling a byte just inside every `read_timeout` is cut off
    /// (408) instead of holding its connection forever. 0 turns it off.
    #[serde(default = "default_body_min_rate", with = "crate::units::size")]
    pub body_min_rate: ByteSize,
    /// Largest request body accepted; larger gets 413.
    #[serde(default = "default_max_body", with = "crate::units::size")]
    pub max_body_bytes: ByteSize,
    /// Most client connections open at once; further connections are closed on accept.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, how long the process goes on accepting and serving with `/healthz`
    /// answering 503 `draining` before it closes its listeners (a lame duck): a load balancer
    /// that health-checks the node moves clients away before any is refused. 0, the default,
    /// closes them at once. A second SIGTERM/SIGINT ends it early.
    #[serde(default, with = "crate::units::duration")]
    pub lame_duck: Duration,
    /// On SIGTERM/SIGINT, once the listeners are closed, how long in-flight responses may run
    /// before the process exits anyway.
    #[serde(default = "default_drain_timeout", with = "crate::units::duration")]
    pub drain_timeout: Duration,
    /// Longest time between two writes to a client that make progress (nginx's `send_timeout`);
    /// a client that stops reading is disconnected after it.
    #[serde(default = "default_send_timeout", with = "crate::units::duration")]
    pub send_timeout: Duration,
    /// Keys the rules' rate limits remember at once, all rules together (each about 32 bytes):
    /// the table is made this size at start-up and never grows; past it the least recently seen
    /// key of a slot's four is forgotten (it starts again with a full bucket).
    #[serde(default = "default_rate_limit_keys")]
    pub rate_limit_keys: usize,
}

fn default_rate_limit_keys() -> usize {
    65_536
}

/// mod_reqtimeout's suggested `MinRate=500`.
fn default_body_min_rate() -> ByteSize {
    ByteSize::b(500)
}

fn default_send_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_connections() -> usize {
    100_000
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_body() -> ByteSize {
    ByteSize::mib(16)
}

fn default_max_header() -> ByteSize {
    ByteSize::kib(16)
}
fn default_max_uri() -> ByteSize {
    ByteSize::kib(8)
}
fn default_header_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_client_read_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: default_max_header(),
            max_uri_bytes: default_max_uri(),
            header_timeout: default_header_timeout(),
            idle_timeout: default_idle_timeout(),
            read_timeout: default_client_read_timeout(),
            body_min_rate: default_body_min_rate(),
            max_body_bytes: default_max_body(),
            max_connections: default_max_connections(),
            lame_duck: Duration::ZERO,
            drain_timeout: default_drain_timeout(),
            send_timeout: default_send_timeout(),
            rate_limit_keys: default_rate_limit_keys(),
        }
    }
}

/// The data-plane worker threads: how many, and whether each is pinned to a CPU (nginx's
/// `worker_processes` and `worker_cpu_affinity`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkersConfig {
    /// Worker threads; absent means one per CPU the process may use (its affinity mask, so
    /// `taskset` and cpusets count, and no more than a cgroup CPU quota allows). The data plane
    /// is syscall-bound: more threads than CPUs only add context switches.
    #[serde(default)]
    pub count: Option<usize>,
    /// Whether the workers are pinned one per allowed CPU, round robin, with each new connection
    /// given to a worker on the CPU its packets arrive on. `auto` (the default) pins them and
    /// moves a worker that keeps waiting for its CPU to the other CPUs for a while; `true` always
    /// pins; `false` never does.
    #[serde(default)]
    pub cpu_affinity: CpuAffinity,
}

/// `workers.cpu_affinity`: `auto`, `true` or `false`.
///
/// Pinned, a connection's sends, the ACKs that clock them and its socket lock stay on one CPU and
/// one backlog queue, which costs the proxy about two thirds of the CPU per GB of an unpinned
/// worker on large hits (docs/benchmark.md). The price is that a pinned worker
/// cannot leave a CPU that something else holds. An ordinary busy loop costs a waking worker
/// little (the scheduler lets it preempt), but a real-time task or a crowded CPU can hold it off
/// for hundreds of milliseconds (nginx leaves `worker_cpu_affinity` off unless asked). `auto`
/// keeps the pinning and moves such a worker to the other CPUs while its CPU is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuAffinity {
    /// Never pinned (`false`).
    Off,
    /// Always pinned (`true`), as nginx's `worker_cpu_affinity auto`.
    On,
    /// Pinned, but a worker whose runs keep waiting for its CPU is moved to the other CPUs for a
    /// while.
    #[default]
    Auto,
}

impl<'de> Deserialize<'de> for CpuAffinity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than an untagged enum, so that a wrong value is named ("did not match
        // any variant" otherwise) and located at the value itself.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CpuAffinity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`auto`, `true` or `false`")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<CpuAffinity, E> {
                Ok(if b { CpuAffinity::On } else { CpuAffinity::Off })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<CpuAffinity, E> {
                match s {
                    "auto" => Ok(CpuAffinity::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for CpuAffinity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The way it is written, so that `zerocache check`'s effective config reads back.
        match self {
            CpuAffinity::On => s.serialize_bool(true),
            CpuAffinity::Off => s.serialize_bool(false),
            CpuAffinity::Auto => s.serialize_str("auto"),
        }
    }
}

/// Switches for demonstrations and tests.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// Plant the zero-copy bug on purpose: send bodies from cache files (hits, and misses read
    /// behind their fill) with read(2)+write(2) instead of sendfile(2), while still declaring them
    /// zero-copy, so the violation detector has something to find.
    #[serde(default)]
    pub copy_hits: bool,
    /// Use only this many bits of the cache-key hash, to force collisions in tests. Never set it
    /// in production: collisions are still safe (the full key is compared) but cost hit ratio.
    #[serde(default)]
    pub key_hash_bits: Option<u8>,
    /// Let tests age every cached response without waiting: `POST /api/debug/clock` with
    /// `{"advance_secs": N}` adds N seconds to the clock the cache's freshness decisions read.
    /// The proxy refuses to start with it unless `ZEROCACHE_TEST_CLOCK=1` is also in its
    /// environment, so a copied test config cannot turn it on in production.
    #[serde(default)]
    pub adjustable_clock: bool,
    /// Make the background load of the cache index wait until this file exists, so tests can
    /// send requests while it has indexed nothing. Never set it in production: the proxy serves
    /// meanwhile, but every entry costs a lookup by its path until the file appears.
    #[serde(default)]
    pub hold_index_load: Option<std::path::PathBuf>,
}

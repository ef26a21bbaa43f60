//! `cache:`: where entries live, how big the cache may grow, and how it reads, verifies and
//! fills them.

use super::default_true;
use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The disk cache.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Directory holding the cache files; created if missing.
    pub path: PathBuf,
    /// Upper bound of the bytes of all cache files; least recently used entries are evicted.
    #[serde(with = "crate::units::size")]
    pub max_size: ByteSize,
    /// Largest single sendfile(2) call, so one huge transfer cannot starve other connections.
    /// Under a crowd of transfers on one worker, calls are cut further (`sendfile::chunk_for`).
    #[serde(default = "default_sendfile_max_chunk", with = "crate::units::size")]
    pub sendfile_max_chunk: ByteSize,
    /// Directory levels between `path` and the files (0 to 3, two hex digits each), so no
    /// directory holds millions of files.
    #[serde(default = "default_levels")]
    pub levels: u8,
    /// Most entries in the cache; beyond it the least recently used are evicted. Unset (the
    /// default): no bound but `max_size`, since an entry costs the index about 70 bytes of RAM
    /// (a million entries, 70 MB), so the disk fills first.
    #[serde(default)]
    pub max_entries: Option<usize>,
    /// Entries kept whole in memory (their metadata and prebuilt hit head, about 1.5 KB each), so
    /// a hot hit reads nothing; any other hit reads its file's head, one `pread` from the page
    /// cache. Default 4096.
    #[serde(default = "default_hot_entries")]
    pub hot_entries: usize,
    /// Most cache files kept open, so hot hits cost no open(2): `auto` (the default) or a
    /// number. Every one is a file descriptor, so the proxy bounds it by RLIMIT_NOFILE at start-up
    /// (see [`OpenFiles`]).
    #[serde(default = "default_open_files")]
    pub open_files: OpenFiles,
    /// Cap of heuristic freshness: responses without explicit freshness but with
    /// `Last-Modified` stay fresh for 10% of their age, at most this long (RFC 9111 §4.2.2).
    #[serde(default = "default_heuristic_max", with = "crate::units::duration")]
    pub heuristic_max: Duration,
    /// Read hits whose pages are not in the page cache on the blocking pool before sendfile, so a
    /// disk wait never stalls a runtime thread (like nginx's `aio threads`).
    #[serde(default = "default_true")]
    pub offload_cold_hits: bool,
    /// Targeted cache-control fields (RFC 9213) that govern zerocache's caching in place of
    /// `Cache-Control` and `Expires`: the first with a valid, non-empty Structured Field
    /// Dictionary wins; an invalid one is ignored.
    #[serde(default = "default_targeted")]
    pub targeted_fields: Vec<String>,
    /// Forward the targeted fields to clients (true, the default: a cache in front of or behind
    /// zerocache needs them), or hide them (false).
    #[serde(default = "default_true")]
    pub targeted_fields_forward: bool,
    /// The origin response field that names a response's cache tags, for purges by tag:
    /// `Surrogate-Key` (Fastly, Varnish xkey) or `Cache-Tag` (Cloudflare), or another name.
    #[serde(default = "default_tag_field")]
    pub tag_field: String,
    /// How `tag_field` separates its tags: `space` (Surrogate-Key) or `comma` (Cache-Tag).
    #[serde(default)]
    pub tag_separator: TagSeparator,
    /// Show `tag_field` to clients (a cache tier below reads it); hidden by default.
    #[serde(default)]
    pub tag_field_forward: bool,
    /// A `Range` request on a miss is forwarded and its 206 relayed, never stored; when the 206
    /// says the whole object is at most this large, the whole object is fetched and stored in the
    /// background, so the next request is a hit.
    #[serde(default = "default_range_fill_max", with = "crate::units::size")]
    pub range_fill_max: ByteSize,
    /// Largest response body stored; a larger one is relayed whole and not stored
    /// (`Cache-Status: detail=too-large`), known from its `Content-Length`, or found out while a
    /// body of unknown length arrives (its fill is then dropped, every byte still relayed).
    /// Unset: the cache's `max_size` (a larger entry could never be kept). A route may set its
    /// own (`routes[].max_object_size`).
    #[serde(default, with = "crate::units::opt_size")]
    pub max_object_size: Option<ByteSize>,
    /// Smallest response body stored; a smaller one is relayed (`detail=too-small`). Default 0.
    #[serde(default = "zero_size", with = "crate::units::size")]
    pub min_object_size: ByteSize,
    /// Store 5xx responses that carry explicit freshness (RFC 9111 §3 allows it); `false` never
    /// stores a 5xx.
    #[serde(default = "default_true")]
    pub store_5xx: bool,
    /// A fill reads the origin into the cache file while clients read behind it; once no client
    /// is reading, it stops after this many bytes.
    #[serde(default = "default_range_fill_max", with = "crate::units::size")]
    pub abandoned_fill_max: ByteSize,
    /// ...or after this long with no client reading.
    #[serde(
        default = "default_abandoned_fill_timeout",
        with = "crate::units::duration"
    )]
    pub abandoned_fill_timeout: Duration,
    /// At start-up, verify the bodies of at most this many entries, chosen at random, against the
    /// checksum stored with them, once the index has loaded (the proxy serves meanwhile); a
    /// corrupt one is deleted. 0 verifies none.
    #[serde(default = "default_verify_on_start")]
    pub verify_on_start: usize,
    /// Bytes per second the background scrub reads to verify every stored body against its
    /// checksum, over and over; a corrupt entry is discarded. 0 turns the scrub off.
    #[serde(default = "default_scrub_rate", with = "crate::units::size")]
    pub scrub_rate: ByteSize,
}

fn zero_size() -> ByteSize {
    ByteSize::b(0)
}

fn default_verify_on_start() -> usize {
    64
}

fn default_scrub_rate() -> ByteSize {
    ByteSize::mib(8)
}

fn default_abandoned_fill_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_range_fill_max() -> ByteSize {
    ByteSize::mib(64)
}

/// `cache.tag_separator`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TagSeparator {
    /// Whitespace.
    #[default]
    Space,
    /// Commas.
    Comma,
}

fn default_tag_field() -> String {
    "Surrogate-Key".into()
}

fn default_targeted() -> Vec<String> {
    vec!["CDN-Cache-Control".into()]
}

fn default_heuristic_max() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_levels() -> u8 {
    2
}
fn default_hot_entries() -> usize {
    4096
}
fn default_open_files() -> OpenFiles {
    OpenFiles::Auto
}

/// `cache.open_files`: `auto` or a number.
///
/// A fixed default (it was 10,000) ignores the fd limit: under `ulimit -n 256` the open-file
/// cache alone exhausted the process's descriptors, and then neither connections nor cache files
/// could be opened. The proxy turns this into a number at start-up, once RLIMIT_NOFILE is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenFiles {
    /// min(10,000, RLIMIT_NOFILE / 4): the rest stays for connections, upstreams and fills.
    #[default]
    Auto,
    /// At most this many; more than RLIMIT_NOFILE / 2 is clamped to that, with a warning.
    Max(usize),
}

impl<'de> Deserialize<'de> for OpenFiles {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, as for `CpuAffinity`: a wrong value is named and located at the value.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OpenFiles;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`auto` or a non-negative integer")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<OpenFiles, E> {
                usize::try_from(n)
                    .map(OpenFiles::Max)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<OpenFiles, E> {
                u64::try_from(n)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OpenFiles, E> {
                match s {
                    "auto" => Ok(OpenFiles::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for OpenFiles {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // As written, so that `zerocache check`'s effective config reads back.
        match self {
            OpenFiles::Auto => s.serialize_str("auto"),
            OpenFiles::Max(n) => s.serialize_u64(*n as u64),
        }
    }
}

fn default_sendfile_max_chunk() -> ByteSize {
    ByteSize::mib(2)
}

//! The records the ledger keeps: one per response as the proxy sent it ([`ResponseRecord`]), one
//! per connection ([`ConnRecord`]) with the kernel's view joined in ([`KernelView`]), the
//! violations found by the join, and the kernel-verified body totals.

use crate::tls_transport::UserspaceReason;
use crate::vocabulary::{CacheStatus, ConnId, DataPath};
use serde::Serialize;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use zerocache_probe::FdCounts;

/// One response as the proxy sent it.
#[derive(Clone, Debug)]
pub struct ResponseRecord<'a> {
    /// Method.
    pub method: &'a str,
    /// Request target.
    pub target: &'a str,
    /// Status code.
    pub status: u16,
    /// Cache status.
    pub cache_status: CacheStatus,
    /// Bytes of the response head (and interim heads).
    pub head_bytes: u64,
    /// Bytes of the body.
    pub body_bytes: u64,
    /// The data path the proxy chose for the body.
    pub path: DataPath,
    /// Time from request head to last byte.
    pub duration: Duration,
    /// The whole response was sent; false when it was cut short (client gone, send timeout,
    /// upstream failure mid-body), with `body_bytes` what actually went out.
    pub complete: bool,
}

/// One connection's account, live or closed.
#[derive(Clone, Debug, Serialize)]
pub struct ConnRecord {
    /// Connection id.
    pub id: ConnId,
    /// Client address.
    pub peer: String,
    /// Socket fd number.
    pub fd: u32,
    /// Opened at (Unix ms).
    pub opened_ms: u64,
    /// Duration so far, or total once closed, in ms.
    pub duration_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// The last request line.
    pub last_request: String,
    /// Head bytes the proxy sent.
    pub head_bytes: u64,
    /// Body bytes the proxy meant to send zero-copy.
    pub zerocopy_body_bytes: u64,
    /// Body bytes the proxy meant to copy.
    pub copy_body_bytes: u64,
    /// What the kernel saw on this socket (absent while the probe is off or the event is pending).
    pub kernel: Option<KernelView>,
    /// zero-copy, copied, mixed, or no-body.
    pub verdict: &'static str,
    /// Responses meant to be zero-copy whose bodies the kernel saw copied.
    pub violations: u64,
    /// Still open.
    pub active: bool,
    /// A TLS connection without kTLS: every body byte is copied by design.
    pub tls_userspace: bool,
    /// Why it is in user space (`tls_userspace`), as the metric label has it.
    pub tls_userspace_reason: Option<UserspaceReason>,
    /// A TLS connection whose keys were handed to the kernel (kTLS): its hit bodies go out with
    /// sendfile, and any copied hit body is a violation, as on a plain connection.
    pub ktls: bool,
    /// An HTTP/2 connection (`tls.http2` by ALPN, or `h2c`): its `requests` are its streams,
    /// and every body byte is copied by design (DATA frames are written from user space).
    pub h2: bool,
    /// Bytes the transport wrote that are neither heads nor bodies: the TLS handshake before the
    /// keys went to the kernel, and the closing alert. Counted beside heads in the join.
    pub tls_control_bytes: u64,
    /// The kernel's number for the socket, read at accept (none without the probe, or when the
    /// read failed): the join pairs the connection with the kernel's record of this socket only.
    #[serde(skip)]
    pub(crate) generation: Option<u64>,
    #[serde(skip)]
    pub(crate) started: Option<Instant>,
    /// (request line, body length) of recent zero-copy responses, for naming violations.
    #[serde(skip)]
    pub(crate) zc_responses: VecDeque<(String, u64)>,
}

/// The kernel's per-socket figures for one connection.
#[derive(Clone, Debug, Serialize)]
pub struct KernelView {
    /// Bytes via sendfile and splice.
    pub zerocopy_bytes: u64,
    /// Bytes via write, writev, sendto, sendmsg.
    pub copy_bytes: u64,
    /// Calls of every kind.
    pub calls: u64,
    /// The connection's generation number in the kernel.
    pub generation: u64,
    /// Per syscall kind.
    pub counts: FdCounts,
}

/// A detected violation.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// When it was detected (Unix ms).
    pub at_ms: u64,
    /// Connection id.
    pub conn: ConnId,
    /// Client address.
    pub peer: String,
    /// The request(s) affected.
    pub request: String,
    /// Body bytes meant for sendfile that the kernel saw copied.
    pub bytes: u64,
    /// Responses affected.
    pub responses: u64,
    /// In words.
    pub reason: String,
}

/// Cumulative kernel-verified body figures over joined connections.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct BodyTotals {
    /// Body bytes the kernel saw go through sendfile/splice.
    pub zerocopy_bytes: u64,
    /// Body bytes the kernel saw go through copying syscalls (copy bytes minus head bytes).
    pub copy_bytes: u64,
    /// Connections joined with a kernel record.
    pub connections: u64,
    /// Of `copy_bytes`, those the proxy meant to copy (relayed misses, generated bodies, TLS in
    /// user space): left out of the ratio, which counts only bytes meant for sendfile.
    pub intended_copy_bytes: u64,
}

impl BodyTotals {
    /// The body zero-copy ratio over the bytes meant for sendfile, or `None` before any.
    pub fn ratio(&self) -> Option<f64> {
        let all = self.zerocopy_bytes + self.copy_bytes.saturating_sub(self.intended_copy_bytes);
        (all > 0).then(|| self.zerocopy_bytes as f64 / all as f64)
    }
}

/// The orders `/api/connections?sort=` offers for closed connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Connection id (the default): newest first.
    Id,
    /// Requests answered.
    Requests,
    /// Body bytes through sendfile (the kernel's figure once joined).
    Zerocopy,
    /// Bytes through copying syscalls (the kernel's figure once joined).
    Copied,
    /// Violations.
    Violations,
    /// Connection lifetime.
    Duration,
}

impl SortKey {
    /// The query value naming `self`'s order, or `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<SortKey> {
        Some(match name {
            "id" => SortKey::Id,
            "requests" => SortKey::Requests,
            "zerocopy" => SortKey::Zerocopy,
            "copied" => SortKey::Copied,
            "violations" => SortKey::Violations,
            "duration" => SortKey::Duration,
            _ => return None,
        })
    }
}

//! The ledger: the accounting of intent against kernel truth.
//!
//! The proxy knows, per response, which data path it meant to use (sendfile for hits, copy for
//! misses) and how many head and body bytes it sent; the probe knows, per socket, which syscalls
//! really carried them. The ledger keeps the first ([`Accounting::response`]), joins it with the
//! second per connection ([`Accounting::kernel_closed`]), and from the join gives the body
//! zero-copy ratio and the **violations**: body bytes the proxy meant to send with sendfile that
//! the kernel saw going through a copying syscall. It also holds the process-wide counters that
//! `/metrics` exports. The data plane writes to it; the dashboard only reads it.
#![forbid(unsafe_code)]

mod accounting;
mod copy_reason;
mod join;
mod records;
mod routes;
mod slices;
mod tls_stats;
mod tls_transport;
mod vocabulary;

pub use accounting::{Accounting, H2_EVENTS, PurgeKind};
pub use copy_reason::{CopiedBytes, CopyReason};
pub use records::{BodyTotals, ConnRecord, KernelView, ResponseRecord, SortKey, Violation};
pub use routes::{NO_ROUTE, RouteCounters, RuleCounters};
pub use slices::{SliceCounts, UNSLICED_REASONS};
pub use tls_stats::{HandshakeResult, TlsSnapshot, TlsStats};
pub use tls_transport::{KTLS_VERDICT, TLS_USERSPACE_VERDICT, TlsTransport, UserspaceReason};
pub use vocabulary::{CacheStatus, ConnId, DataPath, Protocol, REJECT_REASONS, RejectReason};

//! Everything outside this crate reaches inside it through here: the binary (`run`, the offline
//! cache check), the integration tests (which drive the real binary, but read an entry file's
//! header, pin threads the way workers are pinned, and compare clocks with `sd_notify`), and the
//! fuzz targets (through [`crate::fuzzing`]). The modules themselves are `pub(crate)`, so the
//! compiler flags whatever nothing here or inside the crate uses.

pub use crate::cache::check::{CheckReport, check_dir};
pub use crate::cache::entry::{Header, read_entry_header};
pub use crate::clock::refusal as clock_refusal;
pub use crate::cpu::affinity::{allow_current_thread, allowed_cpus, pin_current_thread};
pub use crate::notify::monotonic_usec;
pub use crate::server::workers::SLACK;
pub use crate::tls::check as check_tls;
pub use crate::tls::client::trust as upstream_trust;
pub use crate::tls::ktls_summary;
pub use crate::upgrade::tell_failed as tell_upgrade_failed;

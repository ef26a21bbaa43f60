//! What the index answers about an entry: where it is and which one it is ([`Located`], enough
//! to read it outside the lock and to act on it later only if it is still the same), what a
//! lookup found ([`Found`]), and what indexing a file the start-up load read did ([`Loaded`]).

use crate::cache::entry::Entry;
use crate::cache::key::CacheKey;
use std::path::PathBuf;
use std::sync::Arc;

/// Where an indexed entry is and which entry it is: what a caller needs to read it (outside the
/// lock) and to act on it later only if it is still the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) hash: u128,
    pub(crate) id: u64,
    pub(crate) body_offset: u64,
    pub(crate) body_len: u64,
    pub(crate) body_checksum: u64,
    /// The file's path when it is not the layout's path for the hash.
    pub(crate) foreign: Option<PathBuf>,
}

/// What a lookup found.
pub(crate) enum Found {
    /// A hot entry, whole in memory: nothing to read.
    Hot(Arc<Entry>),
    /// An entry whose head is to be read from its file, and the key it must hold: the variant's
    /// when the URL varies, `None` when it is the primary key looked up.
    Cold(Located, Option<CacheKey>),
}

/// What indexing a file the start-up load read did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loaded {
    /// Indexed.
    Indexed,
    /// The hash was indexed already (a fill since the start, or a request that found the file
    /// first): the index's entry stays, and this is where it is.
    Present(Located),
    /// A purge made during the load names it: the file is to be deleted, not indexed.
    Purged,
}

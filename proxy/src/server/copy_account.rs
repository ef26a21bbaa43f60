//! Which data path a response really took, and why its body was copied if it was: the one place
//! that turns what a response path declares (`Zerocopy`: served from a cache file; `Copy`:
//! relayed or generated) into what the transport made of it. A cache-file body on a TLS
//! connection without kTLS is a copy by design (`tls-userspace`), never a violation; on a kTLS
//! connection it went by sendfile like a plain one, and is held to that; on an HTTP/2 stream it
//! is a DATA frame written from user space (`h2`), by design too; the planted
//! bug (`debug.copy_hits`) still declares zero-copy, so the probe flags it, and is counted as
//! `debug-copy`. `Conn::record_as` (respond.rs) applies it to every response a connection
//! records.

use zerocache_ledger::{CopyReason, DataPath};

/// The path to record and the copy reason to count the body under (none for sendfile).
/// `relay`: the reason a declared `Copy` body was copied (`Miss` for upstream bodies,
/// `Generated` for the proxy's own).
pub(crate) fn classify(
    declared: DataPath,
    relay: CopyReason,
    by_design: Option<CopyReason>,
    copy_hits: bool,
) -> (DataPath, Option<CopyReason>) {
    match declared {
        DataPath::Copy => (DataPath::Copy, Some(relay)),
        DataPath::Zerocopy if by_design.is_some() => (DataPath::Copy, by_design),
        DataPath::Zerocopy if copy_hits => (DataPath::Zerocopy, Some(CopyReason::DebugCopy)),
        DataPath::Zerocopy => (DataPath::Zerocopy, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_path_gets_its_reason() {
        use CopyReason::*;
        use DataPath::*;
        let tls = Some(TlsUserspace);
        assert_eq!(classify(Zerocopy, Miss, None, false), (Zerocopy, None));
        assert_eq!(classify(Zerocopy, Miss, tls, false), (Copy, tls));
        assert_eq!(classify(Zerocopy, Miss, tls, true), (Copy, tls));
        assert_eq!(classify(Zerocopy, Miss, Some(H2), true), (Copy, Some(H2)));
        assert_eq!(
            classify(Zerocopy, Miss, None, true),
            (Zerocopy, Some(DebugCopy))
        );
        assert_eq!(classify(Copy, Miss, tls, false), (Copy, Some(Miss)));
        assert_eq!(classify(Copy, Miss, Some(H2), false), (Copy, Some(Miss)));
        assert_eq!(
            classify(Copy, Generated, None, false),
            (Copy, Some(Generated))
        );
    }
}

//! Purging by absolute URL or URL prefix: what the dashboard's `POST /api/purge` and a fleet
//! peer's purge both do on this node.

use crate::cache::store::Store;

/// A purge from the dashboard API, by absolute URL or URL prefix. Routes that drop the query from
/// their keys index the URL without it, so both spellings are purged.
pub(crate) fn purge(store: &Store, p: &zerocache_ops::Purge) -> Result<usize, String> {
    use crate::cache::invalidation::{split_absolute, url_text};
    let (raw, prefix) = match p {
        zerocache_ops::Purge::Url(u) => (u, false),
        zerocache_ops::Purge::Prefix(u) => (u, true),
    };
    let (host, target) = split_absolute(raw)
        .ok_or_else(|| format!("`{raw}` is not an absolute http:// or https:// URL"))?;
    let mut texts = vec![url_text(&host, &target, true)];
    let without_query = url_text(&host, &target, false);
    if !prefix && without_query != texts[0] {
        texts.push(without_query);
    }
    Ok(texts
        .into_iter()
        .flat_map(crate::cache::key::with_https_twin)
        .collect::<Vec<_>>()
        .iter()
        .map(|t| {
            if prefix {
                store.purge_prefix(t)
            } else {
                store.purge_url(t)
            }
        })
        .sum())
}

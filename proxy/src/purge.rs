//! Purging by absolute URL or URL prefix, hard or soft: what the dashboard's `POST /api/purge`,
//! a fleet peer's purge and the `PURGE` method all do on this node.
//!
//! A hard purge removes the entries. A soft one keeps them and ends their freshness: the stored
//! header is rewritten with a lifetime of zero (so it holds across a restart), under the URL's
//! fill lock as every header rewrite is (a fill renaming a new file into place meanwhile would
//! otherwise get the old header). An entry whose URL is being filled right now is left to that
//! fill, which replaces it with what the origin says now.

use crate::cache::entry::Entry;
use crate::cache::key::CacheKey;
use crate::cache::lock::{FillLocks, Role};
use crate::cache::store::{Purging, Store};
use std::sync::Arc;

/// What a purge needs of the node: its store, and for a soft purge the fill locks and the key
/// hash width.
pub(crate) struct Purger<'a> {
    pub store: &'a Store,
    /// Where each purge carried out is counted (`zerocache_purges_total`).
    pub accounting: &'a zerocache_ledger::Accounting,
    pub locks: &'a Arc<FillLocks>,
    pub hash_bits: u32,
    /// The routes whose `query` rules a purged URL goes through, as a request's target does, so
    /// a purge of `/p?b=2&a=1&utm_source=x` finds what `/p?a=1&b=2` stored (a purge the fleet's
    /// log replays too: the log holds URLs as they were sent). `None`: no normalisation.
    pub routes: Option<&'a crate::routing::Routes>,
}

impl Purger<'_> {
    /// Carries out `p`; returns how many entries it removed (hard) or made stale (soft). Routes
    /// that drop the query from their keys index the URL without it, so both spellings count.
    pub(crate) fn purge(&self, p: &zerocache_ops::Purge) -> Result<usize, String> {
        use crate::cache::invalidation::{split_absolute, url_text};
        let (raw, prefix) = match &p.target {
            zerocache_ops::Target::Url(u) => (u, false),
            zerocache_ops::Target::Prefix(u) => (u, true),
            zerocache_ops::Target::Tags(tags) => {
                self.accounting
                    .purge(zerocache_ledger::PurgeKind::Tag, p.soft);
                return Ok(self.purge_tags(tags, p.soft));
            }
        };
        let (host, mut target) = split_absolute(raw)
            .ok_or_else(|| format!("`{raw}` is not an absolute http:// or https:// URL"))?;
        if !prefix
            && let Some(t) = self
                .routes
                .and_then(|r| r.find(&host, &target))
                .and_then(|r| r.normalised(&target))
        {
            target = t;
        }
        self.accounting.purge(
            if prefix {
                zerocache_ledger::PurgeKind::Prefix
            } else {
                zerocache_ledger::PurgeKind::Url
            },
            p.soft,
        );
        let mut texts = vec![url_text(&host, &target, true)];
        let without_query = url_text(&host, &target, false);
        if !prefix && without_query != texts[0] {
            texts.push(without_query);
        }
        let texts: Vec<String> = texts
            .into_iter()
            .flat_map(crate::cache::key::with_https_twin)
            .collect();
        // While the index loads, the purge must also reach the files it has not indexed yet.
        for t in &texts {
            self.store.purging(if prefix {
                Purging::Prefix(t)
            } else {
                Purging::Url(t)
            });
        }
        let urls: Vec<String> = if prefix {
            texts
                .iter()
                .flat_map(|t| self.store.urls_with_prefix(t))
                .collect()
        } else {
            texts
        };
        Ok(urls
            .iter()
            .map(|u| {
                // Handing the directory over, a soft purge's header rewrite could land on the
                // successor's file: the entry goes instead, which the successor notices.
                if p.soft && !self.store.is_handing_over() {
                    self.soften(u)
                } else {
                    self.store.purge_url(u)
                }
            })
            .sum())
    }

    /// Removes (or, `soft`, makes stale) every entry with any of `tags`; returns how many
    /// entries, each once however many of the tags it has.
    fn purge_tags(&self, tags: &[String], soft: bool) -> usize {
        for t in tags {
            self.store.purging(Purging::Tag(t));
        }
        if soft && !self.store.is_handing_over() {
            let mut seen = std::collections::HashSet::new();
            for t in tags {
                for e in self.store.entries_of_tag(t) {
                    if seen.insert(e.hash) {
                        self.stale(&e);
                    }
                }
            }
            seen.len()
        } else {
            tags.iter().map(|t| self.store.purge_tag(t)).sum()
        }
    }

    /// Makes every entry of URL key text `url` stale; returns how many.
    fn soften(&self, url: &str) -> usize {
        let entries = self.store.entries_of_url(url);
        for e in &entries {
            self.stale(e);
        }
        entries.len()
    }

    fn stale(&self, e: &Arc<Entry>) {
        let primary = crate::cache::variance::primary_text(&e.meta.key).to_string();
        let key = CacheKey::from_text(primary, self.hash_bits);
        match self.locks.acquire(key.hash) {
            Role::Leader(_guard) => {
                let meta = crate::cache::entry::Meta {
                    lifetime: std::time::Duration::ZERO,
                    ..e.meta.clone()
                };
                self.store.replace_meta(e, meta);
            }
            // A fill of this URL is running: it replaces the entry with the origin's answer.
            Role::Follower(_) => {}
        }
    }
}

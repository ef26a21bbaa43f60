//! The index as bytes, for the snapshot a clean stop or an upgrade hands to the next process
//! (`store::snapshot` writes and reads the file): every slot in eviction order with its tags'
//! hashes, then the Vary lists, then a checksum. Kept apart from the lookups: it runs once a
//! process, and must refuse anything torn or foreign rather than index it.

use super::*;

/// Slots [`Index::snapshot_size`] leaves room for beyond those in use.
pub(super) const SIZE_SLACK: usize = 64;

/// Appends the xxh3-64 of `body` (what [`Index::snapshot_body`] wrote): the snapshot's last 8
/// bytes, computed after the store's lock is let go.
pub(crate) fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let sum = xxh3_64(&body);
    body.extend_from_slice(&sum.to_le_bytes());
    body
}

impl<E: Eviction> Index<E> {
    /// The index as bytes (`store::snapshot`): the header `head`, then every slot in eviction
    /// order (next victim first) with its tags' hashes, then the Vary lists, then the xxh3-64
    /// of everything before. Entries at a foreign path are left out (the load's walk finds
    /// them); entries kept whole are written as any other. The store writes it in two parts
    /// ([`Index::snapshot_body`] under its lock, [`seal`] after); the tests, whole.
    #[cfg(test)]
    pub(crate) fn snapshot(&self, head: &[u8]) -> Vec<u8> {
        seal(self.snapshot_body(head, Vec::new()))
    }

    /// What [`Index::snapshot`] writes before its checksum, appended to `out` (cleared first):
    /// the part that must read the index, so the part the store's lock is held for. Given a
    /// buffer of [`Index::snapshot_size`] whose pages are already touched, it writes the bytes
    /// without growing it or faulting a page of it.
    pub(crate) fn snapshot_body(&self, head: &[u8], mut out: Vec<u8>) -> Vec<u8> {
        out.clear();
        let order: Vec<u32> = self
            .policy
            .oldest_first()
            .into_iter()
            .filter(|&i| self.slots[i as usize].flags & (FREE | FOREIGN) == 0)
            .collect();
        out.reserve(head.len() + 16 + order.len() * SNAP_SLOT);
        out.extend_from_slice(head);
        out.extend_from_slice(&(order.len() as u64).to_le_bytes());
        for i in order {
            let s = &self.slots[i as usize];
            for w in [s.hash_lo, s.hash_hi, s.body_len, s.body_checksum, s.url] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&s.body_offset.to_le_bytes());
            out.push(s.flags & (MARKER | SLICE));
            let tags = self.tags_of.get(&i).map_or(&[][..], |t| &t[..]);
            out.extend_from_slice(&(tags.len() as u16).to_le_bytes());
            for t in tags {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.vary.len() as u64).to_le_bytes());
        for (primary, names) in &self.vary {
            out.extend_from_slice(&primary.to_le_bytes());
            out.extend_from_slice(&(names.len() as u16).to_le_bytes());
            for n in names.iter() {
                out.extend_from_slice(&(n.len() as u16).to_le_bytes());
                out.extend_from_slice(n.as_bytes());
            }
        }
        out
    }

    /// At least the bytes [`Index::snapshot`] writes, its header of `head_len` bytes and its
    /// checksum included, so a buffer this big is never grown while the lock is held: every slot
    /// in use (one at a foreign path too), and room for [`SIZE_SLACK`] more, the fills that
    /// were already committing when the process stopped storing.
    pub(crate) fn snapshot_size(&self, head_len: usize) -> usize {
        let tags: usize = self.tags_of.values().map(|t| t.len() * 16).sum();
        let vary: usize = (self.vary.values())
            .map(|names| 18 + names.iter().map(|n| 2 + n.len()).sum::<usize>())
            .sum();
        let slots = self.slots.len() - self.free.len() + SIZE_SLACK;
        head_len + 8 + slots * SNAP_SLOT + tags + 8 + vary + 8
    }

    /// Fills an empty index from `bytes` written by [`Index::snapshot`] after the header `head`
    /// (which must match: the layout and the key hashes it was written under); returns the
    /// entries restored. Nothing is changed unless the whole snapshot holds.
    pub(crate) fn restore(&mut self, bytes: &[u8], head: &[u8]) -> Result<u64, &'static str> {
        let (body, sum) = bytes
            .split_last_chunk::<8>()
            .ok_or("shorter than its checksum")?;
        if xxh3_64(body) != u64::from_le_bytes(*sum) {
            return Err("checksum mismatch (torn or corrupt)");
        }
        let mut r = body
            .strip_prefix(head)
            .ok_or("written under another layout")?;
        let mut take = |n: usize| -> Result<&[u8], &'static str> {
            let (a, b) = r.split_at_checked(n).ok_or("truncated")?;
            r = b;
            Ok(a)
        };
        let u64_ = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mut slots = Vec::new();
        let n = u64_(take(8)?);
        for _ in 0..n {
            let w = take(40)?;
            let word = |k: usize| u64_(&w[8 * k..8 * k + 8]);
            let rest = take(7)?;
            let ntags = u16::from_le_bytes([rest[5], rest[6]]) as usize;
            let tags: Box<[u128]> = (0..ntags)
                .map(|_| take(16).map(|t| u128::from_le_bytes(t.try_into().unwrap_or([0; 16]))))
                .collect::<Result<_, _>>()?;
            let slot = Slot {
                hash_lo: word(0),
                hash_hi: word(1),
                id: crate::cache::entry::next_id(),
                body_len: word(2),
                body_checksum: word(3),
                url: word(4),
                body_offset: u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]),
                flags: rest[4] & (MARKER | SLICE),
            };
            slots.push((slot, tags));
        }
        let mut vary = Vec::new();
        let nvary = u64_(take(8)?);
        for _ in 0..nvary {
            let primary = u128::from_le_bytes(take(16)?.try_into().unwrap_or([0; 16]));
            let nn = u16::from_le_bytes(take(2)?.try_into().unwrap_or([0; 2])) as usize;
            let mut names = Vec::with_capacity(nn);
            for _ in 0..nn {
                let len = u16::from_le_bytes(take(2)?.try_into().unwrap_or([0; 2])) as usize;
                let name =
                    std::str::from_utf8(take(len)?).map_err(|_| "a Vary name is not UTF-8")?;
                names.push(name.to_string());
            }
            vary.push((primary, names));
        }
        if !r.is_empty() {
            return Err("bytes after the end");
        }
        if self.len > 0 || !self.slots.is_empty() {
            return Err("the index is not empty");
        }
        for (slot, tags) in slots {
            let hash = slot.hash();
            if self.slot_of(hash).is_some() {
                continue;
            }
            self.slots.push(slot);
            let i = (self.slots.len() - 1) as u32;
            let slots = &self.slots;
            self.by_hash
                .insert_unique(slot.hash_lo, i, |&j| slots[j as usize].hash_lo);
            self.by_url
                .insert_unique(slot.url, i, |&j| slots[j as usize].url);
            self.bytes += slot.disk_size();
            self.len += u64::from(slot.flags & MARKER == 0);
            if slot.flags & SLICE != 0 {
                self.slice_restored(slot.url);
            }
            if !tags.is_empty() {
                for &t in tags.iter() {
                    self.by_tag.entry(t).or_default().insert(i);
                }
                self.tags_of.insert(i, tags);
                self.slots[i as usize].flags |= TAGGED;
            }
            self.policy.inserted(i, slot.disk_size());
        }
        for (primary, names) in vary {
            let names = self.intern(&names);
            self.vary.insert(primary, names);
        }
        Ok(self.len)
    }
}

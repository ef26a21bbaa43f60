//! The faults the soak injects on the proxy's cache files (truncation, a flipped byte) and the
//! windows in which each fault excuses an error.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    OriginRestart,
    OriginTruncate,
    OriginStall,
    CacheTruncate,
    CacheFlip,
    SighupStorm,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 6] = [
        FaultKind::OriginRestart,
        FaultKind::OriginTruncate,
        FaultKind::OriginStall,
        FaultKind::CacheTruncate,
        FaultKind::CacheFlip,
        FaultKind::SighupStorm,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            FaultKind::OriginRestart => "origin killed + restarted",
            FaultKind::OriginTruncate => "origin truncating / hanging up",
            FaultKind::OriginStall => "origin stalling",
            FaultKind::CacheTruncate => "cache files truncated",
            FaultKind::CacheFlip => "cache body bytes flipped",
            FaultKind::SighupStorm => "SIGHUP storm (10 in 1 s)",
        }
    }
}

pub(crate) struct Window {
    pub(crate) kind: FaultKind,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

pub(crate) struct Truncation {
    pub(crate) target: String,
    /// Body bytes left in the file.
    pub(crate) body_len: u64,
    pub(crate) at: Instant,
}

pub(crate) struct Flip {
    pub(crate) target: String,
    pub(crate) pos: u64,
    pub(crate) value: u8,
    pub(crate) at: Instant,
}

/// What an entry file's header says (any `ZCENTRYn` version this soak knows: 4 and 5).
pub(crate) struct EntryInfo {
    pub(crate) target: String,
    pub(crate) body_offset: u64,
    pub(crate) body_len: u64,
}

pub(crate) fn entry_info(f: &std::fs::File) -> Option<EntryInfo> {
    let mut fixed = [0u8; 32];
    f.read_exact_at(&mut fixed, 0).ok()?;
    if &fixed[..7] != b"ZCENTRY" {
        return None;
    }
    let meta_at: u64 = if fixed[7] >= b'5' { 40 } else { 32 };
    let meta_len = u32::from_le_bytes(fixed[8..12].try_into().ok()?) as usize;
    let body_len = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
    let body_offset = u64::from_le_bytes(fixed[24..32].try_into().ok()?);
    if meta_len > 1 << 20 {
        return None;
    }
    let mut meta = vec![0u8; meta_len];
    f.read_exact_at(&mut meta, meta_at).ok()?;
    // The meta block starts with the key text, `GET http://host/target`.
    let key_len = u32::from_le_bytes(meta.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(meta.get(4..4 + key_len)?).ok()?;
    let after_scheme = &key[key.find("://")? + 3..];
    let target = after_scheme[after_scheme.find('/')?..].to_string();
    Some(EntryInfo {
        target,
        body_offset,
        body_len,
    })
}

/// Every entry file under the cache directory (the shard directories), `tmp/` excluded.
pub(crate) fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    let tmp = dir.join("tmp");
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && p != tmp => dirs.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Every entry file in a random order, the catalogue's objects first: a cache-busting miss's
/// entry is never asked for again. (Each file is closed after its header is read: there can be
/// tens of thousands.)
pub(crate) fn cache_candidates(dir: &Path, rng: &mut Rng) -> Vec<PathBuf> {
    let mut files = cache_files(dir);
    rng.shuffle(&mut files);
    let mut candidates: Vec<(PathBuf, bool)> = files
        .into_iter()
        .filter_map(|path| {
            let f = std::fs::File::open(&path).ok()?;
            let query = entry_info(&f)?.target.contains('?');
            Some((path, query))
        })
        .collect();
    candidates.sort_by_key(|(_, query)| *query);
    candidates.into_iter().map(|(p, _)| p).collect()
}

/// Truncates (`flip` false) or flips a body byte of up to 3 of `candidates`; returns what was
/// done, one description per file.
pub(crate) fn damage_cache(
    candidates: Vec<PathBuf>,
    rng: &mut Rng,
    flip: bool,
    flips: &Mutex<Vec<Flip>>,
    truncated: &Mutex<Vec<Truncation>>,
) -> Vec<String> {
    let mut done = Vec::new();
    for path in candidates {
        if done.len() >= 3 {
            break;
        }
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        // Read again from this very file: the entry may have been replaced meanwhile.
        let Some(info) = entry_info(&f) else { continue };
        if flip {
            if info.body_len == 0 {
                continue;
            }
            let pos = rng.below(info.body_len);
            let mut b = [0u8; 1];
            if f.read_exact_at(&mut b, info.body_offset + pos).is_err() {
                continue;
            }
            let value = b[0] ^ 0xA5;
            if f.write_all_at(&[value], info.body_offset + pos).is_err() {
                continue;
            }
            flips.lock().expect("flips").push(Flip {
                target: info.target.clone(),
                pos,
                value,
                at: Instant::now(),
            });
            done.push(format!(
                "{} byte {pos} of {} flipped",
                info.target, info.body_len
            ));
        } else {
            let end = info.body_offset + info.body_len;
            // Mostly inside the body; sometimes into the header.
            let new_len = if info.body_len == 0 || rng.below(4) == 0 {
                rng.below(info.body_offset.max(1))
            } else {
                info.body_offset + rng.below(info.body_len)
            };
            if f.set_len(new_len).is_err() {
                continue;
            }
            truncated.lock().expect("truncated").push(Truncation {
                target: info.target.clone(),
                body_len: new_len.saturating_sub(info.body_offset),
                at: Instant::now(),
            });
            done.push(format!(
                "{} truncated from {end} to {new_len} bytes",
                info.target
            ));
        }
    }
    done
}

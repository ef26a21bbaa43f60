//! The objects the soak asks for: families of URLs the origin serves differently, at sizes
//! weighted toward the ones that matter (around buffer and page boundaries).

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Family {
    /// Cacheable for an hour, ETag, Content-Length.
    Obj,
    /// `no-store`, ETag.
    NoStore,
    /// Cacheable, chunked, no validator.
    Chunked,
    /// Fresh for 2 s, ETag, revalidated with 304; rewritten by the origin faults.
    Flaky,
    /// `no-store`, ETag; rewritten by the origin faults.
    FlakyNoStore,
}

impl Family {
    pub(crate) const ALL: [Family; 5] = [
        Family::Obj,
        Family::NoStore,
        Family::Chunked,
        Family::Flaky,
        Family::FlakyNoStore,
    ];

    pub(crate) fn tag(self) -> &'static str {
        match self {
            Family::Obj => "obj",
            Family::NoStore => "ns",
            Family::Chunked => "ch",
            Family::Flaky => "fl",
            Family::FlakyNoStore => "fn",
        }
    }

    pub(crate) fn sizes(self) -> &'static [usize] {
        match self {
            Family::Obj => &SIZES,
            Family::NoStore => &[0, 1000, 65_537, MIB],
            Family::Chunked => &[0, 1, 4096, 65_537, MIB, 3 * MIB],
            Family::Flaky => &[1000, 65_537, MIB, 3 * MIB],
            Family::FlakyNoStore => &[1000, 65_537, MIB],
        }
    }

    pub(crate) fn weight(self) -> u32 {
        match self {
            Family::Obj => 3,
            Family::Flaky => 2,
            _ => 1,
        }
    }

    pub(crate) fn cache_control(self) -> &'static str {
        match self {
            Family::Obj | Family::Chunked => "max-age=3600",
            Family::Flaky => "max-age=2",
            Family::NoStore | Family::FlakyNoStore => "no-store",
        }
    }

    pub(crate) fn cacheable(self) -> bool {
        matches!(self, Family::Obj | Family::Chunked | Family::Flaky)
    }

    pub(crate) fn flaky(self) -> bool {
        matches!(self, Family::Flaky | Family::FlakyNoStore)
    }
}

pub(crate) struct Object {
    pub(crate) family: Family,
    pub(crate) size: usize,
    pub(crate) path: String,
    pub(crate) etag: Option<String>,
    pub(crate) weight: u32,
}

pub(crate) fn size_weight(n: usize) -> u32 {
    match n {
        0 | 1 => 3,
        n if n <= 65_537 => 5,
        n if n <= MIB => 3,
        n if n <= 3 * MIB => 2,
        _ => 1,
    }
}

pub(crate) fn catalogue() -> Vec<Object> {
    let mut out = Vec::new();
    for f in Family::ALL {
        for &n in f.sizes() {
            out.push(Object {
                family: f,
                size: n,
                path: format!("/{}/{n}", f.tag()),
                etag: (f != Family::Chunked).then(|| format!("\"{}-{n}\"", f.tag())),
                weight: f.weight() * size_weight(n),
            });
        }
    }
    out
}

/// The generated body of every size, computed once.
pub(crate) type Bodies = HashMap<usize, Vec<u8>>;

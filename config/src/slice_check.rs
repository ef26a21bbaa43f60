//! The checks of `routes[].slice` and `routes[].max_sliced_object_size` that types cannot
//! express: a slice size in the range nginx's and ATS's users pick from, slices that a route can
//! store, and a whole-object bound no smaller than one slice.

use crate::schema::{Config, Route};
use crate::units::binary;
use crate::validate::{Invalid, invalid};

/// Smallest slice: below it, the per-slice entry head and origin request dominate.
pub const MIN_SLICE: u64 = 256 * 1024;

/// Largest slice: one slice is filled before any of it is sent, so it bounds the first byte's
/// wait and a slice fill's disk write.
pub const MAX_SLICE: u64 = 64 * 1024 * 1024;

/// Checks route `i`'s slicing.
pub(crate) fn slice_check(i: usize, r: &Route, config: &Config, errs: &mut Vec<Invalid>) {
    let Some(size) = r.slice.map(|s| s.as_u64()) else {
        if r.max_sliced_object_size.is_some() {
            errs.push(invalid(
                format!("routes[{i}].max_sliced_object_size"),
                "applies only to a route with `slice` set".into(),
            ));
        }
        return;
    };
    let field = format!("routes[{i}].slice");
    if !(MIN_SLICE..=MAX_SLICE).contains(&size) {
        errs.push(invalid(
            field,
            format!("{} is outside 256KiB to 64MiB", binary(size)),
        ));
        return;
    }
    if !r.cache {
        errs.push(invalid(
            field,
            "a route with `cache: false` stores no slices; remove one of the two".into(),
        ));
        return;
    }
    // Each slice is an entry: it must be a body the route stores.
    let max = r
        .max_object_size
        .or(config.cache.max_object_size)
        .map_or(config.cache.max_size.as_u64(), |m| {
            m.as_u64().min(config.cache.max_size.as_u64())
        });
    if size > max {
        errs.push(invalid(
            field,
            format!(
                "{} is larger than the largest object this route stores ({}), so no slice would be stored",
                binary(size),
                binary(max)
            ),
        ));
    }
    if let Some(whole) = r.max_sliced_object_size
        && whole.as_u64() > config.cache.max_size.as_u64()
    {
        errs.push(invalid(
            format!("routes[{i}].max_sliced_object_size"),
            format!(
                "{} is more than cache.max_size ({}): an object larger than the cache cannot be stored in it",
                binary(whole.as_u64()),
                binary(config.cache.max_size.as_u64())
            ),
        ));
    }
    if let Some(whole) = r.max_sliced_object_size
        && whole.as_u64() < size
    {
        errs.push(invalid(
            format!("routes[{i}].max_sliced_object_size"),
            format!(
                "{} is less than one slice ({})",
                binary(whole.as_u64()),
                binary(size)
            ),
        ));
    }
}

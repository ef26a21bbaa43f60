//! The cache entry reader, `Meta::decode` and `read_header` on a file holding the input: never
//! panics, and whatever decodes re-encodes to the same `Meta`.
//! The property is in `zerocache::fuzzing::cache_entry`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::cache_entry(data));

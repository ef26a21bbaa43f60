//! `zerocache::http::response::parse`, then `.framing(false)` and `.framing(true)`: never panics.
//! The property is in `zerocache::fuzzing::response_head`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::response_head(data));

//! `zerocache::http::request::parse` with the default limits: never panics, never claims more
//! bytes than it was given.
//! The property is in `zerocache::fuzzing::request_head`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::request_head(data));

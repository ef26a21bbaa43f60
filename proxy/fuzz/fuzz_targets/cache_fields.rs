//! `zerocache::http::date::parse`, `zerocache::cache::targeted::parse` and `Vary` normalisation
//! on one UTF-8 string. The properties are in `zerocache::fuzzing::cache_fields`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::cache_fields(data));

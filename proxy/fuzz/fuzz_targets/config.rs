//! `zerocache_config::parse` (YAML, schema, validation, error positions) on any UTF-8 input:
//! never panics, whatever it makes of it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = zerocache_config::parse(text, "fuzz.yaml");
    }
});

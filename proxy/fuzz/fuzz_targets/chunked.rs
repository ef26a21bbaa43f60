//! `ChunkedDecoder::decode` fed its input whole and in two pieces (split where the first byte
//! says): the same body and leftover bytes either way, and no panic.
//! The property is in `zerocache::fuzzing::chunked`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::chunked(data));

//! Byte ranges and slices: `range::answer` and `range::set` inside the body and agreeing,
//! `Slicing::first_wanted`, the multipart framing's length, and `slice::judge` of a hostile
//! `Content-Range`. The property is in `zerocache::fuzzing::ranges`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::ranges(data));

//! An HTTP/2 request head translated into the HTTP/1.1 head the request path reads: exactly one
//! whole request to the HTTP/1.1 parser, or refused. The property is in
//! `zerocache::fuzzing::h2_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::h2_request(data));

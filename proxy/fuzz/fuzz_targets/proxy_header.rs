//! `net::proxy_protocol::parse` on arbitrary bytes: a header lies within what it was given and
//! its bound, and its prefixes are incomplete. The property is in
//! `zerocache::fuzzing::proxy_header`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::proxy_header(data));

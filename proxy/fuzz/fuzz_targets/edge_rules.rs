//! A request through a route's query rule and edge rules: an idempotent query, fields that are
//! fields, and an upstream request that parses again as the same request. The property is in
//! `zerocache::fuzzing::edge_rules`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zerocache::fuzzing::edge_rules(data));

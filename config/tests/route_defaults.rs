//! A route's defaults that decide what is stored for everyone: each pinned, so a change to one
//! is a decision made here, not a side effect.

use zerocache_config::parse;

const ROUTE: &str = "listen: 127.0.0.1:8080
cache:
  path: /tmp/zc
  max_size: 1GiB
upstreams:
  origin:
    servers: [\"127.0.0.1:8081\"]
routes:
  - match: { host: \"*\", path_prefix: / }
    upstream: origin
";

#[test]
fn set_cookie_is_not_stored_unless_the_route_says_so() {
    let c = parse(ROUTE, "zc.yaml").expect("valid");
    assert!(!c.routes[0].store_set_cookie);
    let c = parse(&format!("{ROUTE}    store_set_cookie: true\n"), "zc.yaml").expect("valid");
    assert!(c.routes[0].store_set_cookie);
}

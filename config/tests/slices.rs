//! `routes[].slice` and `routes[].max_sliced_object_size`: defaults, and errors that name the
//! file, line and key.

use zerocache_config::parse;

const GOOD: &str = "listen: 127.0.0.1:8080
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

fn err(text: &str) -> String {
    match parse(text, "zc.yaml") {
        Err(e) => e.to_string(),
        Ok(c) => panic!("accepted: {c:?}"),
    }
}

#[test]
fn slicing_is_off_unless_a_route_asks() {
    let c = parse(GOOD, "zc.yaml").expect("valid");
    assert_eq!(c.routes[0].slice, None);
    let c = parse(
        &format!("{GOOD}    slice: 4MiB\n    max_sliced_object_size: 512MiB\n"),
        "zc.yaml",
    )
    .expect("valid");
    assert_eq!(c.routes[0].slice.map(|s| s.as_u64()), Some(4 << 20));
    assert_eq!(
        c.routes[0].max_sliced_object_size.map(|s| s.as_u64()),
        Some(512 << 20)
    );
}

#[test]
fn slice_errors_name_the_line_and_key() {
    assert_eq!(
        err(&format!("{GOOD}    slice: 128KiB\n")),
        "zc.yaml:11:5: routes[0].slice: 128 KiB is outside 256KiB to 64MiB"
    );
    assert_eq!(
        err(&format!("{GOOD}    slice: 65MiB\n")),
        "zc.yaml:11:5: routes[0].slice: 65 MiB is outside 256KiB to 64MiB"
    );
    assert_eq!(
        err(&format!("{GOOD}    slice: 4MiB\n    cache: false\n")),
        "zc.yaml:11:5: routes[0].slice: a route with `cache: false` stores no slices; remove one of the two"
    );
    assert_eq!(
        err(&format!(
            "{GOOD}    slice: 4MiB\n    max_object_size: 1MiB\n"
        )),
        "zc.yaml:11:5: routes[0].slice: 4 MiB is larger than the largest object this route stores (1 MiB), so no slice would be stored"
    );
    assert_eq!(
        err(&format!(
            "{GOOD}    slice: 4MiB\n    max_sliced_object_size: 1MiB\n"
        )),
        "zc.yaml:12:5: routes[0].max_sliced_object_size: 1 MiB is less than one slice (4 MiB)"
    );
    assert_eq!(
        err(&format!(
            "{GOOD}    slice: 4MiB\n    max_sliced_object_size: 2GiB\n"
        )),
        "zc.yaml:12:5: routes[0].max_sliced_object_size: 2 GiB is more than cache.max_size (1 GiB): an object larger than the cache cannot be stored in it"
    );
    assert_eq!(
        err(&format!("{GOOD}    max_sliced_object_size: 1GiB\n")),
        "zc.yaml:11:5: routes[0].max_sliced_object_size: applies only to a route with `slice` set"
    );
}

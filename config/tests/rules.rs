//! `routes[].query` and `routes[].rules` errors name the file, line, column and key, exactly:
//! the hostile template, the bad pattern and the conflicting rule beside the good ones.

use zerocache_config::parse;

const HEAD: &str = "listen: 127.0.0.1:8080
cache: { path: /tmp/zc, max_size: 1GiB }
upstreams:
  origin: { servers: [\"127.0.0.1:8081\"] }
routes:
  - name: site
    match: { path_prefix: / }
    upstream: origin
";

fn with(rules: &str) -> String {
    format!("{HEAD}{rules}")
}

fn err(rules: &str) -> String {
    match parse(&with(rules), "zc.yaml") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted: {rules}"),
    }
}

#[test]
fn the_issues_example_is_valid() {
    let c = parse(
        &with(
            r#"    query: { sort: true, drop: ["utm_*", "fbclid"] }
    rules:
      - name: old-blog
        match: { path_regex: "^/blog/(.*)$" }
        redirect: { status: 301, location: "https://$host/posts/$1" }
      - name: hsts
        response_headers: { set: { Strict-Transport-Security: "max-age=31536000" } }
      - name: admin
        match: { path_prefix: "/admin/", client_not_in: ["10.0.0.0/8"] }
        deny: 403
      - name: api
        match: { path_prefix: "/api/" }
        rate_limit: { key: client, rate: 5/s, burst: 5 }
"#,
        ),
        "zc.yaml",
    )
    .expect("valid");
    assert_eq!(c.routes[0].rules.len(), 4);
    assert_eq!(
        c.routes[0].rules[3]
            .rate_limit
            .as_ref()
            .map(|l| l.per_second()),
        Some(Ok(5.0))
    );
}

#[test]
fn a_line_break_in_a_template_is_refused_where_it_is_written() {
    assert_eq!(
        err(r#"    rules:
      - name: split
        response_headers: { set: { X-A: "a\r\nSet-Cookie: s=1" } }
"#),
        "zc.yaml:11:9: routes[0].rules[0].response_headers.set.X-A: a CR, LF or NUL has no place in a header field or a redirect"
    );
    assert_eq!(
        err(r#"    rules:
      - name: loc
        redirect: { location: "/x\n" }
"#),
        "zc.yaml:11:9: routes[0].rules[0].redirect.location: a CR, LF or NUL has no place in a header field or a redirect"
    );
}

#[test]
fn unknown_variables_groups_and_bad_patterns_are_named() {
    let e = err(r#"    rules:
      - name: r
        redirect: { location: "https://$hots/" }
"#);
    assert!(
        e.starts_with(
            "zc.yaml:11:9: routes[0].rules[0].redirect.location: `$hots` is not a variable"
        ),
        "{e}"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        match: { path_regex: "^/a/(.*)$" }
        redirect: { location: "/b/$2" }
"#),
        "zc.yaml:12:9: routes[0].rules[0].redirect.location: `$2` names a group the rule's path_regex does not have (1)"
    );
    let e = err(r#"    rules:
      - name: r
        match: { path_regex: "(unclosed" }
        deny: 403
"#);
    assert!(
        e.starts_with(
            "zc.yaml:11:9: routes[0].rules[0].match.path_regex: not a regular expression"
        ),
        "{e}"
    );
    // A pattern whose compiled form is past the limit is refused at load, not at a request.
    let e = err(r#"    rules:
      - name: r
        match: { path_regex: "(\\w{100}){100}" }
        deny: 403
"#);
    assert!(
        e.contains("routes[0].rules[0].match.path_regex: not a regular expression this proxy runs"),
        "{e}"
    );
}

#[test]
fn conflicting_and_forbidden_actions_are_refused() {
    assert_eq!(
        err(r#"    rules:
      - name: r
        deny: 403
        redirect: { location: "/" }
"#),
        "zc.yaml:10:7: routes[0].rules[0]: a rule answers one way: give one of `redirect`, `respond` and `deny`"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        response_headers: { set: { Content-Length: "0" } }
"#),
        "zc.yaml:11:9: routes[0].rules[0].response_headers.set: `Content-Length` is the proxy's to write: a rule cannot set or remove it"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        request_headers: { set: { X-Forwarded-Host: "a" } }
"#),
        "zc.yaml:11:9: routes[0].rules[0].request_headers.set: `X-Forwarded-Host` is in `proxy.strip_request_fields`, so setting it would reach no origin"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
      - name: r
"#),
        "zc.yaml:11:9: routes[0].rules[1].name: `r` is rules[0]'s name already: each rule of a route needs its own"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        rate_limit: { rate: 0/s, burst: 1 }
"#),
        "zc.yaml:11:9: routes[0].rules[0].rate_limit.rate: `0/s` lets nothing through: use `deny` for that"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        match: { client_in: [10.0.0.0/33] }
        deny: 403
"#),
        "zc.yaml:11:9: routes[0].rules[0].match.client_in[0]: `10.0.0.0/33`: prefix length must be 0 to 32"
    );
}

#[test]
fn answers_that_would_desync_and_edits_the_origin_would_not_see_are_refused() {
    assert_eq!(
        err(r#"    rules:
      - name: r
        respond: { status: 204, body: "ok" }
"#),
        "zc.yaml:11:9: routes[0].rules[0].respond.status: 204 is not a status a rule can answer with a body (200 to 599, not 204, 205 or 304, which end at their head)"
    );
    assert_eq!(
        err(r#"    rules:
      - name: r
        request_headers: { set: { X-Real-IP: "$host" } }
"#),
        "zc.yaml:11:9: routes[0].rules[0].request_headers.set: `X-Real-IP` is written or scrubbed by the proxy when it forwards, so the origin would not see what the key and Vary saw"
    );
    // A value per client on a route that caches: one client's answer stored for all.
    assert_eq!(
        err(r#"    rules:
      - name: r
        request_headers: { set: { X-Client: "$client" } }
"#),
        "zc.yaml:11:9: routes[0].rules[0].request_headers.set.X-Client: `$client` differs between requests that share a cache entry: one client's answer would be stored for all; add `bypass: true` to the rule or leave the route uncached"
    );
    // The same with `bypass`, or in what the client gets, is fine.
    for ok in [
        "    rules:\n      - name: r\n        bypass: true\n        request_headers: { set: { X-Client: \"$client\" } }\n",
        "    rules:\n      - name: r\n        response_headers: { set: { X-Client: \"$client\" } }\n",
    ] {
        parse(&with(ok), "zc.yaml").expect(ok);
    }
    assert!(
        parse(
            &with("").replace(
                "max_size: 1GiB }",
                "max_size: 1GiB }\nlimits: { rate_limit_keys: 100000000 }"
            ),
            "zc.yaml"
        )
        .unwrap_err()
        .to_string()
        .contains("limits.rate_limit_keys: 100000000 keys: use 1 to 16777216")
    );
}

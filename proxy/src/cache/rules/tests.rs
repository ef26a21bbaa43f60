//! The rules as pure functions: a request parsed as a client sends it, a config as an operator
//! writes it, and the verdict, the edited request and the counts pinned.

use super::*;
use crate::http::field_edit::Op;
use crate::http::request::{Limits, parse};
use crate::http::target::PathRules;

fn req(text: &str) -> RequestHead {
    let limits = Limits {
        max_head: 16384,
        max_uri: 8192,
        path: PathRules::SAFE,
    };
    let (r, _) = parse(text.as_bytes(), limits)
        .expect("valid")
        .expect("whole");
    r
}

fn rules(yaml: &str) -> (Rules, &'static RouteCounters) {
    let cfg = format!(
        "listen: 127.0.0.1:1\ncache: {{path: /tmp/x, max_size: 1MiB}}\nupstreams:\n  o: {{servers: ['127.0.0.1:2']}}\nroutes:\n  - name: site\n    match: {{path_prefix: /}}\n    upstream: o\n{yaml}"
    );
    let cfg = zerocache_config::parse(&cfg, "t.yaml").expect("valid config");
    let acc = Box::leak(Box::new(zerocache_ledger::Accounting::new(16, false)));
    let counters = acc.route("site");
    (
        Rules::new(&cfg.routes[0], counters).expect("compiles"),
        counters,
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn counts(c: &RouteCounters) -> Vec<(String, u64, u64)> {
    c.rules()
        .iter()
        .map(|r| (r.name().to_string(), r.counts().0, r.counts().1))
        .collect()
}

const EXAMPLE: &str = r#"    rules:
      - name: old-blog
        match: { path_regex: "^/blog/([0-9]+)/(.*)$" }
        redirect: { status: 301, location: "https://$host/posts/$2?id=$1" }
      - name: hsts
        response_headers: { set: { Strict-Transport-Security: "max-age=31536000" }, remove: [Server] }
      - name: admin
        match: { path_prefix: "/admin/", client_not_in: ["10.0.0.0/8"] }
        deny: 403
      - name: beta
        match: { headers: [{ name: X-Beta, equals: "1" }] }
        request_headers: { set: { X-Variant: b }, remove: [X-Beta] }
      - name: tag
        request_headers: { append: { X-Edge-Route: "$route $scheme" } }
"#;

#[test]
fn a_redirect_takes_its_groups_and_ends_the_rules() {
    let (r, c) = rules(EXAMPLE);
    let l = Limiter::new(16);
    let mut q = req("GET /blog/2019/hello-world HTTP/1.1\r\nHost: Example.COM\r\n\r\n");
    let mut edits = FieldEdits::default();
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut edits);
    assert_eq!(
        v.answer,
        Some(Answer::Redirect(
            301,
            "https://example.com/posts/hello-world?id=2019".into()
        ))
    );
    // Matched first, it stopped there: hsts's edits are not the redirect's.
    assert!(edits.is_empty());
    assert_eq!(v.matched, 0b1);
    assert_eq!(counts(c)[0], ("old-blog".into(), 1, 0));
    assert_eq!(counts(c)[1], ("hsts".into(), 0, 0));
    // `/blog/x` has no number: no redirect, the others run.
    let mut q = req("GET /blog/x HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut edits = FieldEdits::default();
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut edits);
    assert_eq!(v.answer, None);
    assert_eq!(
        edits.iter().collect::<Vec<_>>(),
        vec![
            (Op::Remove, "Server", &b""[..]),
            (
                Op::Set,
                "Strict-Transport-Security",
                &b"max-age=31536000"[..]
            ),
        ]
    );
    // hsts and tag matched.
    assert_eq!(v.matched, 0b1_0010);
    let names: Vec<&str> = r.matched(v.matched).iter().map(|c| c.name()).collect();
    assert_eq!(names, vec!["hsts", "tag"]);
    assert_eq!(
        q.field("x-edge-route"),
        Some("site http"),
        "a template renders per request"
    );
}

#[test]
fn deny_by_address_holds_for_outsiders_only() {
    let (r, _) = rules(EXAMPLE);
    let l = Limiter::new(16);
    let admin = "GET /admin/users HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut edits = FieldEdits::default();
    let v = r.on_request(&mut req(admin), ip("203.0.113.9"), &l, 0, &mut edits);
    assert_eq!(v.answer, Some(Answer::Deny(403)));
    // The response edits of rules before it still apply to the 403.
    assert_eq!(edits.iter().count(), 2);
    let v = r.on_request(
        &mut req(admin),
        ip("10.1.2.3"),
        &l,
        0,
        &mut FieldEdits::default(),
    );
    assert_eq!(v.answer, None);
    // A header cannot claim an inside address: the peer decides.
    let forged = "GET /admin/ HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n";
    let v = r.on_request(
        &mut req(forged),
        ip("203.0.113.9"),
        &l,
        0,
        &mut FieldEdits::default(),
    );
    assert_eq!(v.answer, Some(Answer::Deny(403)));
    // A path spelt to dodge the prefix is normalised before the rules see it.
    let dodge = "GET /x/../admin/users HTTP/1.1\r\nHost: a\r\n\r\n";
    let v = r.on_request(
        &mut req(dodge),
        ip("203.0.113.9"),
        &l,
        0,
        &mut FieldEdits::default(),
    );
    assert_eq!(v.answer, Some(Answer::Deny(403)));
}

#[test]
fn a_request_edit_on_a_field_puts_the_rule_in_the_key_and_one_on_the_url_does_not() {
    let (r, _) = rules(EXAMPLE);
    let l = Limiter::new(16);
    let mut q = req("GET /p HTTP/1.1\r\nHost: a\r\nX-Beta: 1\r\n\r\n");
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut FieldEdits::default());
    assert_eq!(v.key_part.as_deref(), Some("beta"));
    assert_eq!(q.field("x-variant"), Some("b"));
    assert_eq!(q.field("x-beta"), None);
    // `tag` edits every request the same way: nothing for the key.
    let mut q = req("GET /p HTTP/1.1\r\nHost: a\r\nX-Beta: 2\r\n\r\n");
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut FieldEdits::default());
    assert_eq!(v.key_part, None);
    assert_eq!(q.field("x-variant"), None);
    assert_eq!(q.field("x-beta"), Some("2"));
}

#[test]
fn a_rate_limit_answers_429_with_retry_after_then_recovers_and_counts() {
    let (r, c) = rules(
        r#"    rules:
      - name: api
        match: { path_prefix: "/api/" }
        rate_limit: { key: client, rate: 2/s, burst: 2 }
"#,
    );
    let l = Limiter::new(64);
    let get = "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n";
    let at = |now: u64, who: &str| {
        r.on_request(&mut req(get), ip(who), &l, now, &mut FieldEdits::default())
            .answer
    };
    assert_eq!(at(0, "192.0.2.1"), None);
    assert_eq!(at(0, "192.0.2.1"), None);
    assert_eq!(at(0, "192.0.2.1"), Some(Answer::Limited(1)));
    // Another client has its own bucket; other paths none.
    assert_eq!(at(0, "192.0.2.2"), None);
    let other = r.on_request(
        &mut req("GET /p HTTP/1.1\r\nHost: a\r\n\r\n"),
        ip("192.0.2.1"),
        &l,
        0,
        &mut FieldEdits::default(),
    );
    assert_eq!(other.answer, None);
    // Half a second later one token is back.
    assert_eq!(at(500_000_000, "192.0.2.1"), None);
    assert_eq!(at(500_000_000, "192.0.2.1"), Some(Answer::Limited(1)));
    assert_eq!(counts(c), vec![("api".into(), 6, 2)]);
}

#[test]
fn an_empty_rule_list_edits_nothing() {
    let (r, _) = rules("");
    assert!(r.is_empty());
    let mut q = req("GET /p?b=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    let before = q.clone();
    let v = r.on_request(
        &mut q,
        ip("192.0.2.1"),
        &Limiter::new(4),
        0,
        &mut FieldEdits::default(),
    );
    assert_eq!((v.answer, v.bypass, v.key_part), (None, false, None));
    assert_eq!(q.fields, before.fields);
}

#[test]
fn a_canary_takes_its_share_of_10000_keys_and_keys_what_it_answered_apart() {
    let cfg =
        "    rules:\n      - name: canary\n        upstream: { to: o, percent: 10, key: url }\n";
    let (r, _) = rules(cfg);
    let l = Limiter::new(4);
    let mut chosen = 0;
    for i in 0..10_000 {
        let mut q = req(&format!("GET /item/{i} HTTP/1.1\r\nHost: a\r\n\r\n"));
        let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut FieldEdits::default());
        match v.upstream.as_deref() {
            Some("o") => {
                chosen += 1;
                assert_eq!(v.key_part.as_deref(), Some("canary"));
            }
            None => assert_eq!(v.key_part, None),
            other => panic!("{other:?}"),
        }
        // The same key, the same side.
        let again = r.on_request(
            &mut q,
            ip("198.51.100.1"),
            &l,
            0,
            &mut FieldEdits::default(),
        );
        assert_eq!(again.upstream, v.upstream);
    }
    // Within 2 points of 10% (the hash is fixed: this is the exact count).
    assert!((800..=1200).contains(&chosen), "{chosen}");
    assert_eq!(chosen, CANARY_10000);
    // 0% sends none, 100% all.
    for (percent, want) in [(0, 0), (100, 50)] {
        let (r, _) = rules(&cfg.replace("percent: 10", &format!("percent: {percent}")));
        let n = (0..50)
            .filter(|i| {
                let mut q = req(&format!("GET /item/{i} HTTP/1.1\r\nHost: a\r\n\r\n"));
                r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut FieldEdits::default())
                    .upstream
                    .is_some()
            })
            .count();
        assert_eq!(n, want, "{percent}%");
    }
}

/// How many of `/item/0`..`/item/9999` a 10% canary by URL takes (9.88%).
const CANARY_10000: usize = 988;

#[test]
fn hostile_spellings_meet_the_same_rules() {
    let (r, c) = rules(
        r#"    rules:
      - name: admin
        match: { path_prefix: "/admin/", client_not_in: ["10.0.0.0/8"] }
        deny: 403
      - name: slash
        match: { path_prefix: "/go/" }
        redirect: { location: "$target" }
      - name: api
        match: { path_prefix: "/api/" }
        rate_limit: { key: client, rate: 1/h, burst: 1 }
"#,
    );
    let l = Limiter::new(64);
    let mut e = FieldEdits::default();
    // Slashes merged, as origins that merge them read it.
    let v = r.on_request(
        &mut req("GET //admin//users HTTP/1.1\r\nHost: a\r\n\r\n"),
        ip("192.0.2.1"),
        &l,
        0,
        &mut e,
    );
    assert_eq!(v.answer, Some(Answer::Deny(403)));
    // A location made from the client's target never starts with `//` (another host).
    let v = r.on_request(
        &mut req("GET //go/x HTTP/1.1\r\nHost: a\r\n\r\n"),
        ip("192.0.2.1"),
        &l,
        0,
        &mut e,
    );
    assert_eq!(v.answer, Some(Answer::Redirect(302, "/go/x".into())));
    // One IPv6 host is its /64: a new address in it is not a new bucket.
    let api = "GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n";
    let v = r.on_request(&mut req(api), ip("2001:db8:1:2::1"), &l, 0, &mut e);
    assert_eq!(v.answer, None);
    let v = r.on_request(&mut req(api), ip("2001:db8:1:2::ffff"), &l, 0, &mut e);
    assert_eq!(v.answer, Some(Answer::Limited(3600)));
    let v = r.on_request(&mut req(api), ip("2001:db8:1:3::1"), &l, 0, &mut e);
    assert_eq!(v.answer, None);
    assert_eq!(counts(c)[2], ("api".into(), 3, 1));
}

#[test]
fn a_later_rule_sees_the_fields_an_earlier_one_set_or_removed() {
    // The prefilter (`facts`) is found before the rules run: it must be found again after a
    // request edit, or `marked` would be skipped for a field the request did not arrive with.
    let (r, c) = rules(
        r#"    rules:
      - name: mark
        match: { path_prefix: /a/ }
        request_headers: { set: { X-Mark: "1" }, remove: [X-Gone] }
      - name: marked
        match: { headers: [{ name: x-mark }] }
        response_headers: { set: { X-Was-Marked: "yes" } }
      - name: gone
        match: { headers: [{ name: X-Gone }] }
        deny: 403
"#,
    );
    let l = Limiter::new(16);
    let mut q = req("GET /a/x HTTP/1.1\r\nHost: a\r\nX-Gone: 1\r\n\r\n");
    let mut out = FieldEdits::default();
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut out);
    assert_eq!(v.answer, None, "X-Gone was removed before `gone` ran");
    assert_eq!(v.matched, 0b011);
    assert_eq!(
        out.iter().collect::<Vec<_>>(),
        vec![(Op::Set, "X-Was-Marked", &b"yes"[..])]
    );
    // Elsewhere `mark` does not run, and the request's own X-Gone is denied.
    let mut q = req("GET /b HTTP/1.1\r\nHost: a\r\nX-Gone: 1\r\n\r\n");
    let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut FieldEdits::default());
    assert_eq!(v.answer, Some(Answer::Deny(403)));
    assert_eq!(
        counts(c),
        vec![
            ("mark".into(), 1, 0),
            ("marked".into(), 1, 0),
            ("gone".into(), 1, 0)
        ]
    );
}

#[test]
fn a_rule_matched_by_its_needs_alone_matches_what_its_conditions_would() {
    // Each rule sets a field named for it, so the edits say which matched; the same prefixes as
    // a regular expression (never matched by the needs alone) are the reference.
    let (r, _) = rules(
        "    rules:\n      - name: short\n        match: { path_prefix: /admin/ }\n        response_headers: { set: { X-Short: \"1\" } }\n      - name: long\n        match: { path_prefix: /admin/panel/ }\n        response_headers: { set: { X-Long: \"1\" } }\n      - name: nul\n        match: { path_prefix: \"/a\\0\" }\n        response_headers: { set: { X-Nul: \"1\" } }\n      - name: all\n        response_headers: { set: { X-All: \"$route\" } }\n",
    );
    let l = crate::rate_limit::Limiter::new(64);
    let got = |path: &str| {
        let mut edits = FieldEdits::default();
        let mut q = req(&format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n"));
        let v = r.on_request(&mut q, ip("192.0.2.1"), &l, 0, &mut edits);
        let names: Vec<String> = edits
            .iter()
            .map(|(_, n, v)| format!("{n}={}", String::from_utf8_lossy(v)))
            .collect();
        (v.matched, names.join(" "))
    };
    assert_eq!(got("/admin/x"), (0b1001, "X-Short=1 X-All=site".into()));
    assert_eq!(got("//admin//x"), (0b1001, "X-Short=1 X-All=site".into()));
    assert_eq!(
        got("/admin/panel/y"),
        (0b1011, "X-Short=1 X-Long=1 X-All=site".into())
    );
    assert_eq!(got("/admin/pane"), (0b1001, "X-Short=1 X-All=site".into()));
    for other in ["/admin", "/Admin/x", "/a", "/", "/adminx/"] {
        assert_eq!(got(other), (0b1000, "X-All=site".into()), "{other}");
    }
}

//! Purge by cache tag (issue #31): an origin's `Surrogate-Key` (or `Cache-Tag`) names the groups
//! a response belongs to; `POST /api/purge {"tags": [...]}` removes (or, soft, makes stale) every
//! stored response with any of them, on one node or, with `"fleet": true`, on every member. The
//! field stays with the cache: clients do not see it unless it is forwarded.

use crate::support::*;
use zerocache_origin::Reply;

fn tagged(body: &str, field: &str, tags: &str) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(&[
        ("Cache-Control", "max-age=3600"),
        ("ETag", "\"v1\""),
        (field, tags),
    ])
}

#[test]
fn a_tag_purge_removes_every_response_with_the_tag_and_only_those() {
    let (origin, _rt) = origin();
    origin.script("/t/shoe", tagged("shoe", "Surrogate-Key", "product:1 shop"));
    origin.script("/t/sock", tagged("sock", "Surrogate-Key", "product:2 shop"));
    origin.script("/t/news", tagged("news", "Surrogate-Key", "news"));
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("cache");
    let mut proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let mut c = proxy.client();
    for p in ["/t/shoe", "/t/sock", "/t/news"] {
        let r = c.get(p, &[]);
        assert_eq!(r.x_cache(), "MISS");
        // For the cache only: the client never sees the field.
        assert_eq!(r.header("surrogate-key"), None, "{p}");
        let r = c.get(p, &[]);
        assert_eq!(
            (r.x_cache(), r.header("surrogate-key")),
            ("HIT", None),
            "{p}"
        );
    }
    // Rebuilt at start from the stored responses: a restart keeps the tags.
    assert_eq!(proxy.stop().code(), Some(0));
    let proxy = Proxy::start_in(origin.addr(), &dir, tmp.path(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(
        proxy.purge(r#"{"tags": ["shop", "product:2"]}"#),
        (200, serde_json::json!({"purged": 2})),
        "two entries, each counted once"
    );
    assert_eq!(c.get("/t/shoe", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/t/sock", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/t/news", &[]).x_cache(), "HIT");
    assert_eq!(origin.hits("/t/news"), 1);
    // A soft purge by tag: the entry stays, stale, and is revalidated (a 304: nothing fetched).
    assert_eq!(
        proxy.purge(r#"{"tags": ["news"], "soft": true}"#),
        (200, serde_json::json!({"purged": 1}))
    );
    origin.script(
        "/t/news",
        Reply::ok(Vec::new())
            .status(304)
            .headers(&[("ETag", "\"v1\""), ("Cache-Control", "max-age=3600")]),
    );
    let r = c.get("/t/news", &[]);
    assert_eq!(
        (r.x_cache(), r.body.as_slice()),
        ("REVALIDATED", &b"news"[..])
    );
    // Nothing carries the tag any more.
    assert_eq!(
        proxy.purge(r#"{"tags": ["no-such-tag"]}"#),
        (200, serde_json::json!({"purged": 0}))
    );
    // Each purge carried out is counted by kind and mode, whatever it found; a refused one is not.
    assert_eq!(
        proxy.purge(r#"{"url": "http://test.example/t/shoe"}"#).0,
        200
    );
    assert_eq!(
        proxy
            .purge(r#"{"prefix": "http://test.example/t/", "soft": true}"#)
            .0,
        200
    );
    assert_eq!(proxy.purge(r#"{"url": "/t/shoe"}"#).0, 400);
    let m = proxy.metrics();
    let purges = |kind: &str, mode: &str| {
        metric(
            &m,
            &format!("zerocache_purges_total{{kind=\"{kind}\",mode=\"{mode}\"}}"),
        )
    };
    assert_eq!(
        [
            purges("tag", "hard"),
            purges("tag", "soft"),
            purges("url", "hard"),
            purges("url", "soft"),
            purges("prefix", "hard"),
            purges("prefix", "soft"),
        ],
        [2, 1, 1, 0, 0, 1]
    );
}

#[test]
fn hostile_tag_purges_are_refused_with_the_reason() {
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let many: Vec<String> = (0..257).map(|i| format!("\"t{i}\"")).collect();
    let long = "x".repeat(1025);
    for (body, says) in [
        (r#"{"tags": []}"#.to_string(), "1 to 256 tags"),
        (
            format!(r#"{{"tags": [{}]}}"#, many.join(",")),
            "1 to 256 tags",
        ),
        (r#"{"tags": ["a b"]}"#.to_string(), "visible ASCII"),
        (r#"{"tags": ["a,b"]}"#.to_string(), "without a comma"),
        (format!(r#"{{"tags": ["{long}"]}}"#), "1 to 1024 bytes"),
        (r#"{"tags": "shop"}"#.to_string(), "invalid JSON"),
        (
            r#"{"tags": ["shop"], "url": "http://a/x"}"#.to_string(),
            "exactly one of `url`, `prefix` and `tags`",
        ),
    ] {
        let (status, json) = proxy.purge(&body);
        assert_eq!(status, 400, "{body}");
        assert!(
            json["error"].as_str().is_some_and(|e| e.contains(says)),
            "{body}: {json}"
        );
    }
}

/// `Cache-Tag`, comma-separated, as Cloudflare reads it; forwarded to clients when configured.
#[test]
fn cache_tag_is_selectable_and_can_be_forwarded() {
    let (origin, _rt) = origin();
    origin.script("/c/a", tagged("a", "Cache-Tag", "blue, green"));
    origin.script("/c/b", tagged("b", "Cache-Tag", "green,red"));
    let proxy = Proxy::start(
        origin.addr(),
        Opts {
            cache_yaml:
                "  tag_field: Cache-Tag\n  tag_separator: comma\n  tag_field_forward: true\n".into(),
            ..Opts::default()
        },
    );
    let mut c = proxy.client();
    assert_eq!(c.get("/c/a", &[]).header("cache-tag"), Some("blue, green"));
    assert_eq!(c.get("/c/b", &[]).x_cache(), "MISS");
    assert_eq!(c.get("/c/b", &[]).header("cache-tag"), Some("green,red"));
    assert_eq!(
        proxy.purge(r#"{"tags": ["red"]}"#),
        (200, serde_json::json!({"purged": 1}))
    );
    assert_eq!(c.get("/c/a", &[]).x_cache(), "HIT");
    assert_eq!(c.get("/c/b", &[]).x_cache(), "MISS");
}

/// The issue's test: 3 nodes, a tag purge with `"fleet": true` answers 200 with the count here
/// and per peer, and no member serves a tagged object from a cache afterwards: with
/// `store_remote`, every member holds copies of the others' objects too (the owner passes the tag
/// field to peers, hidden from clients), and after the purge every member answers the origin's
/// new version of each purged object and the old, still cached, version of every other.
#[test]
fn a_fleet_tag_purge_reaches_every_member() {
    let (origin, _rt) = origin();
    let paths: Vec<String> = (0..12).map(|i| format!("/ft/{i}")).collect();
    let script = |version: &str| {
        for (i, p) in paths.iter().enumerate() {
            let tag = if i % 2 == 0 { "even all" } else { "odd all" };
            origin.script(p, tagged(&format!("{p} {version}"), "Surrogate-Key", tag));
        }
    };
    script("v1");
    let f = TestFleet::start(origin.addr(), 3, "  store_remote: true\n", false);
    for n in 0..3 {
        let mut c = f.client(n);
        for p in &paths {
            let r = c.get(p, &[]);
            assert_eq!(r.body, format!("{p} v1").as_bytes());
            assert_eq!(r.header("surrogate-key"), None, "clients never see it");
        }
    }
    script("v2");
    let mut d = Client::connect_dashboard(f.nodes[0].dashboard);
    let r = d.send_with_body(
        "POST",
        "/api/purge",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "close"),
        ],
        br#"{"tags": ["even"], "fleet": true}"#,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let answer: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    let mut total = answer["purged"].as_u64().expect("purged here");
    for n in 1..3 {
        let peer = &answer["peers"][f.nodes[n].addr.to_string()];
        total += peer["purged"]
            .as_u64()
            .unwrap_or_else(|| panic!("{answer}"));
    }
    // Six even objects, each on its owner and on the two members that stored a copy.
    assert_eq!(total, 18, "{answer}");
    for n in 0..3 {
        let mut c = f.client(n);
        for (i, p) in paths.iter().enumerate() {
            let want = if i % 2 == 0 { "v2" } else { "v1" };
            let r = c.get(p, &[]);
            assert_eq!(
                String::from_utf8_lossy(&r.body),
                format!("{p} {want}"),
                "node {n}"
            );
        }
    }
}

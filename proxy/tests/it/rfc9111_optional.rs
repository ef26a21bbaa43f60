//! The optional behaviours of RFC 9111 and 9110 that zerocache implements, one test each, named
//! after the section. Every expected hit also checks that its body went out through sendfile.

use crate::support::*;
use std::time::{Duration, SystemTime};

fn reply(body: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::ok(body.as_bytes().to_vec()).headers(headers)
}

#[test]
fn rfc9110_5_6_7_expires_is_read_leniently() {
    let (origin, _rt) = origin();
    // 8 August 2050 is a Monday: the weekday is ignored, and names may be in any case.
    let lenient = [
        ("weekday", "Thu, 08 Aug 2050 12:00:00 GMT"),
        ("case", "mon, 08 AUG 2050 12:00:00 gmt"),
        ("rfc850", "Monday, 08-Aug-50 12:00:00 GMT"),
        ("asctime", "Mon Aug  8 12:00:00 2050"),
    ];
    for (name, expires) in lenient {
        origin.script(&format!("/{name}"), reply(name, &[("Expires", expires)]));
    }
    // A date that does not exist is still invalid, which means already expired (§5.3).
    origin.script(
        "/feb31",
        reply("x", &[("Expires", "Mon, 31 Feb 2050 12:00:00 GMT")]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    for (name, expires) in lenient {
        let path = format!("/{name}");
        assert_eq!(c.get(&path, &[]).x_cache(), "MISS", "{expires}");
        let before = zero_copy_bytes(&proxy);
        let hit = c.get(&path, &[]);
        assert_hit(&proxy, &hit, "HIT", name.as_bytes(), before);
        assert_eq!(hit.header("expires"), Some(expires), "stored as received");
    }
    c.get("/feb31", &[]);
    assert_ne!(c.get("/feb31", &[]).x_cache(), "HIT");
    assert_eq!(origin.hits("/feb31"), 2);
}

#[test]
fn rfc9111_4_3_2_if_modified_since_without_last_modified_uses_the_stored_date() {
    let (origin, _rt) = origin();
    let date = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(100));
    origin.script(
        "/no-lm",
        reply("body", &[("Cache-Control", "max-age=600"), ("Date", &date)]),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/no-lm", &[]);
    let now = httpdate::fmt_http_date(SystemTime::now());
    let r = c.get("/no-lm", &[("If-Modified-Since", &now)]);
    assert_eq!((r.status, r.x_cache(), r.body.len()), (304, "HIT", 0));
    assert_eq!(r.header("date"), Some(date.as_str()));
    // Before the stored Date: the full response, from the cache through sendfile.
    let earlier = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(1000));
    let before = zero_copy_bytes(&proxy);
    let r = c.get("/no-lm", &[("If-Modified-Since", &earlier)]);
    assert_eq!(r.status, 200);
    assert_hit(&proxy, &r, "HIT", b"body", before);
    assert_eq!(origin.hits("/no-lm"), 1);
}

#[test]
fn rfc9111_5_2_2_3_must_understand_stores_understood_statuses_despite_no_store() {
    let (origin, _rt) = origin();
    let mu = [("Cache-Control", "must-understand, no-store, max-age=600")];
    origin.script("/mu-200", reply("ok", &mu));
    origin.script("/mu-299", reply("odd", &mu).status(299));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/mu-200", &[]);
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/mu-200", &[]);
    assert_hit(&proxy, &hit, "HIT", b"ok", before);
    c.get("/mu-299", &[]);
    let again = c.get("/mu-299", &[]);
    assert_eq!((again.status, again.x_cache()), (299, "MISS"));
    assert_eq!(origin.hits("/mu-299"), 2);
}

#[test]
fn rfc9111_4_1_accept_language_spellings_of_one_preference_select_one_variant() {
    let (origin, _rt) = origin();
    origin.script(
        "/lang",
        reply(
            "multi",
            &[
                ("Cache-Control", "max-age=600"),
                ("Vary", "Accept-Language"),
            ],
        ),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    c.get("/lang", &[("Accept-Language", "en, de;q=0.5")]);
    for same in [
        "EN,DE;Q=0.5",
        "en;q=1.0, de;q=0.50",
        "de;q=0.5, en",
        "en ,\tde ; q=0.500",
    ] {
        let before = zero_copy_bytes(&proxy);
        let hit = c.get("/lang", &[("Accept-Language", same)]);
        assert_hit(&proxy, &hit, "HIT", b"multi", before);
    }
    // Equal qualities in another order are another preference (RFC 9110 §12.5.4): the origin
    // decides, so one client cannot choose the language for the others.
    let other = c.get("/lang", &[("Accept-Language", "de;q=0.5, en;q=0.5")]);
    assert_eq!(other.x_cache(), "MISS");
    let swapped = c.get("/lang", &[("Accept-Language", "en;q=0.5, de;q=0.5")]);
    assert_eq!(swapped.x_cache(), "MISS");
    assert_eq!(origin.hits("/lang"), 3);
}

#[test]
fn rfc9111_4_3_5_a_head_response_updates_or_invalidates_the_stored_get() {
    let (origin, _rt) = origin();
    let v = |body: &str, etag: &str, x: &str| {
        reply(
            body,
            &[("Cache-Control", "max-age=600"), ("ETag", etag), ("X-V", x)],
        )
    };
    origin.script("/h", v("hello", "\"a\"", "1"));
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/h", &[]).x_cache(), "MISS");

    // Same validators and length: the HEAD's fields update the stored response.
    origin.script("/h", v("hello", "\"a\"", "2"));
    let head = c.request("HEAD", "/h", &[("Cache-Control", "no-cache")]);
    assert_eq!((head.status, head.header("x-v")), (200, Some("2")));
    assert_eq!(origin.hits("/h"), 2);
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/h", &[]);
    assert_hit(&proxy, &hit, "HIT", b"hello", before);
    assert_eq!(hit.header("x-v"), Some("2"));
    assert_eq!(origin.hits("/h"), 2);

    // Another ETag: the stored response is stale, so the next GET goes to the origin.
    origin.script("/h", v("world!", "\"b\"", "3"));
    let head = c.request("HEAD", "/h", &[("Cache-Control", "no-cache")]);
    assert_eq!((head.status, head.header("etag")), (200, Some("\"b\"")));
    let next = c.get("/h", &[]);
    assert_ne!(next.x_cache(), "HIT");
    assert_eq!(
        (next.body.as_slice(), next.header("x-v")),
        (&b"world!"[..], Some("3"))
    );
    assert_eq!(origin.hits("/h"), 4);
    let before = zero_copy_bytes(&proxy);
    let hit = c.get("/h", &[]);
    assert_hit(&proxy, &hit, "HIT", b"world!", before);
}

#[test]
fn rfc9111_4_3_5_a_head_200_never_refreshes_a_stored_404() {
    let (origin, _rt) = origin();
    origin.script(
        "/h404",
        reply("gone", &[("Cache-Control", "max-age=600")]).status(404),
    );
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let mut c = proxy.client();
    assert_eq!(c.get("/h404", &[]).status, 404);
    origin.script(
        "/h404",
        reply("back", &[("Cache-Control", "max-age=86400")]),
    );
    let head = c.request("HEAD", "/h404", &[("Cache-Control", "no-cache")]);
    assert_eq!(head.status, 200);
    // The stored 404 is stale now, not refreshed with the 200's fields: the next GET goes to
    // the origin and gets the 200.
    let next = c.get("/h404", &[]);
    assert_eq!((next.status, next.body.as_slice()), (200, &b"back"[..]));
    assert_eq!(origin.hits("/h404"), 3);
}

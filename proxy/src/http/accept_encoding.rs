//! `Accept-Encoding` normalised to the codings a route serves, as Varnish does, before the cache
//! key and the upstream request are made from the request.
//!
//! Why: an origin that varies on `Accept-Encoding` stores one variant per distinct field value,
//! and clients spell the same wish many ways (`gzip, deflate, br, zstd`, `br, gzip`, `gzip;q=1.0,
//! identity; q=0.5, *;q=0`): four browsers made four copies of one body. The field becomes the
//! canonical list of the route's codings the client accepts, in the route's order, and that list
//! is also what the origin is asked with, so the variants are as many as the route's codings
//! allow, and an origin without `br` still gets `gzip`.
//!
//! The grammar is RFC 9110 §12.5.3: `#( codings [ OWS ";" OWS "q=" qvalue ] )`, codings
//! case-insensitive, `x-gzip` the same as `gzip` (§8.4.1.3), `*` any coding not listed, `q=0`
//! "not acceptable". An element that does not parse accepts nothing (it could mean anything).

/// The canonical value for a client's `Accept-Encoding` (every line of it, joined) among the
/// route's `codings` (lower case, in the route's preference order): the accepted ones, `", "`
/// joined, or `identity` when the client accepts none of them. A field that was absent stays
/// absent (`None`): no field means no preference (RFC 9110 §12.5.3), which an origin may answer
/// with any coding, while `identity` asks for none.
pub fn canonical(field: Option<&str>, codings: &[String]) -> Option<String> {
    let field = field?;
    let mut listed: Vec<(String, bool)> = Vec::new();
    let mut star: Option<bool> = None;
    for element in field.split(',') {
        let element = element.trim_matches([' ', '\t']);
        if element.is_empty() {
            continue; // Empty list elements are allowed and mean nothing (RFC 9110 §5.6.1).
        }
        let Some((coding, accepted)) = parse_element(element) else {
            continue;
        };
        if coding == "*" {
            star = Some(star.unwrap_or(false) || accepted);
        } else {
            listed.push((coding, accepted));
        }
    }
    let accepts = |c: &str| {
        let mine: Vec<bool> = listed
            .iter()
            .filter(|(l, _)| l == c)
            .map(|(_, a)| *a)
            .collect();
        if mine.is_empty() {
            star.unwrap_or(false)
        } else {
            // Listed twice with different weights: the client said both; "not acceptable" wins.
            mine.iter().all(|a| *a)
        }
    };
    let out: Vec<&str> = codings
        .iter()
        .map(String::as_str)
        .filter(|c| accepts(c))
        .collect();
    Some(if out.is_empty() {
        "identity".to_string()
    } else {
        out.join(", ")
    })
}

/// One list element: its coding (lower case; `x-gzip` as `gzip`) and whether its weight accepts
/// it. `None`: not the grammar.
fn parse_element(element: &str) -> Option<(String, bool)> {
    let mut parts = element.split(';');
    let coding = parts.next()?.trim_end_matches([' ', '\t']);
    if coding.is_empty() || !coding.bytes().all(is_tchar) {
        return None;
    }
    let mut coding = coding.to_ascii_lowercase();
    if coding == "x-gzip" {
        coding = "gzip".into();
    }
    let mut accepted = true;
    if let Some(weight) = parts.next() {
        let weight = weight.trim_matches([' ', '\t']);
        let q = weight
            .strip_prefix("q=")
            .or_else(|| weight.strip_prefix("Q="))?;
        accepted = qvalue(q)? > 0;
    }
    if parts.next().is_some() {
        return None; // One weight at most (Accept-Encoding has no other parameters).
    }
    Some((coding, accepted))
}

/// A qvalue in thousandths: `0`, `0.5`, `1.000` (RFC 9110 §12.4.2); `None` outside the grammar
/// (`2`, `0.0001`, `1.5`, `-0`, ` 1`).
fn qvalue(q: &str) -> Option<u16> {
    let (int, frac) = match q.split_once('.') {
        Some((i, f)) => (i, f),
        None => (q, ""),
    };
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = format!("{frac:0<3}").parse::<u16>().ok()?;
    match int {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Vec<String> {
        vec!["br".into(), "gzip".into()]
    }

    /// What browsers, curl and libraries send, as of 2026: each becomes the route's codings it
    /// accepts, in the route's order.
    #[test]
    fn what_real_clients_send() {
        for (sent, want) in [
            ("gzip, deflate, br, zstd", Some("br, gzip")), // Chrome, Edge, Firefox
            ("gzip, deflate, br", Some("br, gzip")),       // Safari
            ("deflate, gzip, br, zstd", Some("br, gzip")), // curl --compressed
            ("gzip, deflate", Some("gzip")),               // Python requests, older curl
            ("gzip", Some("gzip")),                        // Go net/http
            ("br;q=1.0, gzip;q=0.8, *;q=0.1", Some("br, gzip")),
            ("identity", Some("identity")), // wget
            ("br, gzip", Some("br, gzip")),
            ("*", Some("br, gzip")),
            ("", Some("identity")),
        ] {
            assert_eq!(canonical(Some(sent), &route()).as_deref(), want, "{sent:?}");
        }
        assert_eq!(canonical(None, &route()), None, "no field: identity");
    }

    /// `q=0` refuses a coding, also through `*`; an explicit listing wins over `*`; names are
    /// case-insensitive and `x-gzip` is `gzip`; repeated elements keep the refusal.
    #[test]
    fn weights_and_wildcards() {
        for (sent, want) in [
            ("br;q=0, gzip", Some("gzip")),
            ("gzip;q=0, *", Some("br")),
            ("*;q=0, gzip", Some("gzip")),
            ("*;q=0", Some("identity")),
            ("GZIP, Br", Some("br, gzip")),
            ("x-gzip", Some("gzip")),
            ("gzip;q=0.001", Some("gzip")),
            ("gzip;q=0.000", Some("identity")),
            ("gzip ; q=0.5 , br;Q=1", Some("br, gzip")),
            ("gzip, gzip;q=0", Some("identity")),
            ("identity;q=0, br", Some("br")),
        ] {
            assert_eq!(canonical(Some(sent), &route()).as_deref(), want, "{sent:?}");
        }
    }

    /// Elements outside the grammar accept nothing; the rest of the list still counts.
    #[test]
    fn hostile_elements_accept_nothing() {
        for (sent, want) in [
            ("gzip;q=2", Some("identity")),
            ("gzip;q=1.5", Some("identity")),
            ("gzip;q=0.0001", Some("identity")),
            ("gzip;q=-0", Some("identity")),
            ("gzip;q=", Some("identity")),
            ("gzip;q=abc", Some("identity")),
            ("gzip;level=9", Some("identity")),
            ("gzip;q=1;q=0", Some("identity")),
            ("gz ip", Some("identity")),
            ("gzip\u{0}, br", Some("br")),
            ("\"gzip\"", Some("identity")),
            (",,, ,gzip,,", Some("gzip")),
            ("br;q=0.5;", Some("identity")),
            ("gzip;q=1.0000", Some("identity")),
            ("ｇｚｉｐ", Some("identity")),
        ] {
            assert_eq!(canonical(Some(sent), &route()).as_deref(), want, "{sent:?}");
        }
        let long = "x, ".repeat(10_000) + "gzip";
        assert_eq!(canonical(Some(&long), &route()).as_deref(), Some("gzip"));
    }

    #[test]
    fn the_routes_order_and_codings_decide() {
        let zstd_first: Vec<String> = vec!["zstd".into(), "gzip".into()];
        assert_eq!(
            canonical(Some("gzip, deflate, br, zstd"), &zstd_first).as_deref(),
            Some("zstd, gzip")
        );
        assert_eq!(
            canonical(Some("br"), &zstd_first).as_deref(),
            Some("identity")
        );
        assert_eq!(
            canonical(Some("gzip, br"), &[]).as_deref(),
            Some("identity")
        );
    }
}

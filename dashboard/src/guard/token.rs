//! The dashboard's token: a blank one is refused at start-up rather than taken as "no
//! authentication", and a bearer is compared in time that depends only on the token's length, so
//! response timing tells an attacker nothing about how much of a guess was right.

use axum::extract::Request;
use axum::http::{StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// `dashboard.token` set but empty or only whitespace: that is no token, and serving with it
/// would either lock everyone out or, worse, accept an empty bearer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlankToken;

impl std::fmt::Display for BlankToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "dashboard.token is empty or only whitespace, which is no token: set a real token, \
             or remove `dashboard.token` to serve without one (loopback only)",
        )
    }
}

impl std::error::Error for BlankToken {}

/// The dashboard's token as configured, refused if it is set but blank; `None` stays `None` (no
/// authentication).
pub fn check_token(token: Option<String>) -> Result<Option<String>, BlankToken> {
    match token {
        Some(t) if is_blank(&t) => Err(BlankToken),
        t => Ok(t),
    }
}

fn is_blank(s: &str) -> bool {
    s.trim().is_empty()
}

/// Whether a presented bearer `given` is `token`. An empty or all-whitespace `given` never
/// matches (nor does anything match a blank `token`); otherwise the time taken depends only on
/// `token`'s length, not on where `given` first differs or how long it is.
pub fn bearer_matches(given: &str, token: &str) -> bool {
    if is_blank(given) || is_blank(token) {
        return false;
    }
    let (given, token) = (given.as_bytes(), token.as_bytes());
    let mut diff = given.len() ^ token.len();
    for (i, t) in token.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ t);
    }
    std::hint::black_box(diff) == 0
}

/// The credentials of an `Authorization: Bearer …` value (scheme case-insensitive).
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, rest) = authorization.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_matches(' '))
}

/// The `token` query parameter of `uri`, if any.
pub fn query_token(uri: &Uri) -> Option<std::borrow::Cow<'_, str>> {
    // Percent-decoded, as a browser encodes what it puts in a URL (`%2B` for `+`); a `+` itself
    // stays a `+`, since tokens are no form data. Bytes that decode to invalid UTF-8 match nothing.
    uri.query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .and_then(|v| percent_encoding::percent_decode_str(v).decode_utf8().ok())
}

/// The bearer-token gate of both dashboards (the proxy's and `zerocache watch`'s): with no
/// `token` every request passes; otherwise `Authorization: Bearer T` or `?token=T` (so a browser
/// can open the page, which then sends the header on its API calls) must match, or 401.
pub async fn require(token: Option<&str>, req: Request, next: Next) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    let query = query_token(req.uri());
    let ok = [header, query.as_deref()]
        .into_iter()
        .flatten()
        .any(|given| bearer_matches(given, token));
    if ok {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "dashboard token required\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_tokens_are_no_tokens() {
        assert_eq!(check_token(None), Ok(None));
        assert_eq!(
            check_token(Some("s3cret".into())),
            Ok(Some("s3cret".into()))
        );
        for blank in ["", " ", "\t \n"] {
            assert_eq!(check_token(Some(blank.into())), Err(BlankToken));
            assert!(!bearer_matches(blank, blank));
            assert!(!bearer_matches(blank, "s3cret"));
        }
        assert!(BlankToken.to_string().contains("dashboard.token"));
    }

    #[test]
    fn bearer_comparison() {
        assert!(bearer_matches("s3cret", "s3cret"));
        for wrong in ["s3cre", "s3cret!", "S3cret", "x", "s3cret\0"] {
            assert!(!bearer_matches(wrong, "s3cret"), "{wrong}");
        }
        assert_eq!(bearer("Bearer s3cret"), Some("s3cret"));
        assert_eq!(bearer("bearer  s3cret "), Some("s3cret"));
        assert_eq!(bearer("Basic s3cret"), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearer "), Some(""));
        let uri: Uri = "/?a=1&token=s3cret".parse().expect("uri");
        assert_eq!(query_token(&uri).as_deref(), Some("s3cret"));
        let uri: Uri = "/?token=a%2Bb%2Fc%3D%3D".parse().expect("uri");
        assert_eq!(query_token(&uri).as_deref(), Some("a+b/c=="));
        let uri: Uri = "/?token=a+b".parse().expect("uri");
        assert_eq!(
            query_token(&uri).as_deref(),
            Some("a+b"),
            "no form decoding"
        );
        let uri: Uri = "/?token=%FF%FE".parse().expect("uri");
        assert_eq!(query_token(&uri), None, "invalid UTF-8 matches nothing");
    }
}

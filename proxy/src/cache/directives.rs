//! `Cache-Control` directives (RFC 9111 §5.2), parsed once per message. Values are read leniently
//! where §5.2 allows (quoted or unquoted numbers); for a duplicated directive the first
//! occurrence wins (§4.2.1); unknown directives are ignored. The qualified forms `no-cache="a, b"`
//! and `private="a"` keep their field names.

use std::borrow::Cow;

/// Response directives.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResponseDirectives {
    /// `no-store`.
    pub no_store: bool,
    /// Unqualified `no-cache`: store, but revalidate before every use.
    pub no_cache: bool,
    /// Field names of a qualified `no-cache="..."`: never sent without revalidation.
    pub no_cache_fields: Vec<String>,
    /// Unqualified `private`: a shared cache must not store.
    pub private: bool,
    /// Field names of a qualified `private="..."`: a shared cache must not store those fields.
    pub private_fields: Vec<String>,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `proxy-revalidate`.
    pub proxy_revalidate: bool,
    /// `immutable` (RFC 8246).
    pub immutable: bool,
    /// `must-understand` (§5.2.2.3): store only if the status code's caching rules are known.
    pub must_understand: bool,
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
    /// `stale-while-revalidate` (RFC 5861).
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error` (RFC 5861).
    pub stale_if_error: Option<u64>,
}

/// Request directives.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestDirectives {
    /// `max-age`: the client wants a response no older than this.
    pub max_age: Option<u64>,
    /// `max-stale`: the client accepts a response stale by up to this (`None` inside: any).
    pub max_stale: Option<Option<u64>>,
    /// `min-fresh`: the response must stay fresh at least this much longer.
    pub min_fresh: Option<u64>,
    /// `no-cache` (or `Pragma: no-cache` without `Cache-Control`): revalidate before use.
    pub no_cache: bool,
    /// `no-store`: do not store the response.
    pub no_store: bool,
    /// `only-if-cached`: answer from the cache or with 504.
    pub only_if_cached: bool,
}

/// A directive's name (lower-cased) and argument, borrowed from the field's value unless a
/// name had upper case or an argument was a quoted-string: this runs for every stored response
/// and every entry read back on a hit, which had made three allocations a directive.
type Directive<'a> = (Cow<'a, str>, Option<Cow<'a, str>>);

/// Splits a field value into `(name, argument)` pairs, respecting quoted strings (a quoted
/// `no-cache="a, b"` contains a comma). Each list member must be a `cache-directive` exactly
/// (§5.2: `token [ "=" ( token / quoted-string ) ]`, no whitespace around `=`): a member that is
/// not (`max-age = 600`, `max-age="60`, `a b`) is ignored like an unknown directive, never read
/// as the directive it resembles.
fn parts(value: &str) -> Vec<Directive<'_>> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.extend(directive(value[start..i].trim_matches([' ', '\t'])));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.extend(directive(value[start..].trim_matches([' ', '\t'])));
    out
}

/// One list member as a `cache-directive`, or None if it is not one (or is empty).
fn directive(member: &str) -> Option<Directive<'_>> {
    let (name, arg) = match member.split_once('=') {
        Some((n, a)) => (n, Some(a)),
        None => (member, None),
    };
    if !is_token(name) {
        return None;
    }
    let arg = match arg {
        None => None,
        Some(a) if is_token(a) => Some(Cow::Borrowed(a)),
        Some(a) => Some(Cow::Owned(quoted_string(a)?)),
    };
    let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    };
    Some((name, arg))
}

/// RFC 9110 §5.6.2's `token`: one or more tchar.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The content of `s` if the whole of it is one quoted-string (RFC 9110 §5.6.4), its
/// quoted-pairs unescaped.
fn quoted_string(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c if c == '\t' || c == ' ' || (c as u32 >= 0x21 && c as u32 != 0x7f) => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

fn seconds(arg: Option<&str>) -> Option<u64> {
    // A delta-seconds too large to represent is treated as the largest value (§1.2.2).
    let a = arg?.trim();
    if a.is_empty() || !a.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(a.parse::<u64>().unwrap_or(u64::MAX / 4))
}

fn field_list(arg: Option<&str>) -> Vec<String> {
    arg.map(|a| {
        a.split(',')
            .map(|f| f.trim().to_ascii_lowercase())
            .filter(|f| !f.is_empty())
            .collect()
    })
    .unwrap_or_default()
}

/// Parses a response's (joined) `Cache-Control`.
pub fn response(value: Option<&str>) -> ResponseDirectives {
    let mut d = ResponseDirectives::default();
    let mut seen: Vec<Cow<'_, str>> = Vec::new();
    for (name, arg) in parts(value.unwrap_or("")) {
        if seen.contains(&name) {
            continue; // §4.2.1: the first occurrence wins.
        }
        seen.push(name.clone());
        match &*name {
            "no-store" => d.no_store = true,
            "no-cache" if arg.is_some() => d.no_cache_fields = field_list(arg.as_deref()),
            "no-cache" => d.no_cache = true,
            "private" if arg.is_some() => d.private_fields = field_list(arg.as_deref()),
            "private" => d.private = true,
            "public" => d.public = true,
            "must-revalidate" => d.must_revalidate = true,
            "proxy-revalidate" => d.proxy_revalidate = true,
            "immutable" => d.immutable = true,
            "must-understand" => d.must_understand = true,
            "max-age" => d.max_age = seconds(arg.as_deref()),
            "s-maxage" => d.s_maxage = seconds(arg.as_deref()),
            "stale-while-revalidate" => d.stale_while_revalidate = seconds(arg.as_deref()),
            "stale-if-error" => d.stale_if_error = seconds(arg.as_deref()),
            _ => {}
        }
    }
    d
}

/// Parses a request's `Cache-Control`, falling back to `Pragma: no-cache` when there is none
/// (§5.4).
pub fn request(cache_control: Option<&str>, pragma: Option<&str>) -> RequestDirectives {
    let mut d = RequestDirectives::default();
    let Some(value) = cache_control else {
        d.no_cache = pragma.is_some_and(|p| parts(p).iter().any(|(n, _)| n == "no-cache"));
        return d;
    };
    let mut seen: Vec<Cow<'_, str>> = Vec::new();
    for (name, arg) in parts(value) {
        if seen.contains(&name) {
            continue;
        }
        seen.push(name.clone());
        match &*name {
            "max-age" => d.max_age = seconds(arg.as_deref()),
            "max-stale" => d.max_stale = Some(seconds(arg.as_deref())),
            "min-fresh" => d.min_fresh = seconds(arg.as_deref()),
            "no-cache" => d.no_cache = true,
            "no-store" => d.no_store = true,
            "only-if-cached" => d.only_if_cached = true,
            _ => {}
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9111_5_2_response_directives_parse_leniently() {
        let d = response(Some(
            "public, max-age=\"60\", s-maxage=30, max-age=5, X-Unknown, no-cache=\"Set-Cookie, X-A\", private=\"X-B\", immutable",
        ));
        assert_eq!((d.max_age, d.s_maxage), (Some(60), Some(30)));
        assert!(d.public && d.immutable && !d.no_cache && !d.private);
        assert_eq!(d.no_cache_fields, vec!["set-cookie", "x-a"]);
        assert_eq!(d.private_fields, vec!["x-b"]);
        assert!(response(Some("No-Store")).no_store);
        assert_eq!(response(Some("max-age=abc")).max_age, None);
        assert_eq!(
            response(Some("max-age=99999999999999999999999")).max_age,
            Some(u64::MAX / 4)
        );
    }

    /// `max-age = 600` was read as `max-age=600` (a 304 carrying it refreshed the entry for 10
    /// minutes): a member that is not a `cache-directive` is ignored, beside its exact twin.
    #[test]
    fn rfc9111_5_2_a_member_off_the_grammar_is_ignored_not_guessed() {
        for hostile in [
            "max-age = 600",
            "max-age =600",
            "max-age= 600",
            "max-age=\"600",
            "max-age=600\"",
            "max-age=6 00",
            "max age=600",
            "max-age=\"6\"00",
            "=600",
        ] {
            let d = response(Some(hostile));
            assert_eq!(d, ResponseDirectives::default(), "{hostile}");
            assert_eq!(request(Some(hostile), None).max_age, None, "{hostile}");
        }
        assert_eq!(response(Some(" max-age=600 ,\tpublic")).max_age, Some(600));
        assert_eq!(response(Some("max-age=\"600\"")).max_age, Some(600));
        // A quoted-pair unescapes; the comma inside quotes does not split.
        let d = response(Some("no-cache=\"a\\\"b, c\", max-age=1"));
        assert_eq!(d.no_cache_fields, vec!["a\"b", "c"]);
        assert_eq!(d.max_age, Some(1));
        // The bad member alone is dropped: its neighbours stand.
        let d = response(Some("max-age = 600, s-maxage=5, no-store"));
        assert_eq!((d.max_age, d.s_maxage, d.no_store), (None, Some(5), true));
    }

    #[test]
    fn rfc9111_5_2_1_request_directives_and_pragma() {
        let d = request(
            Some("max-age=0, max-stale, min-fresh=\"5\", only-if-cached"),
            None,
        );
        assert_eq!(
            (d.max_age, d.max_stale, d.min_fresh),
            (Some(0), Some(None), Some(5))
        );
        assert!(d.only_if_cached && !d.no_cache);
        assert_eq!(
            request(Some("max-stale=10"), None).max_stale,
            Some(Some(10))
        );
        assert!(request(None, Some("no-cache")).no_cache);
        assert!(
            !request(Some("max-age=5"), Some("no-cache")).no_cache,
            "Pragma only without Cache-Control"
        );
    }

    /// The splitter that made a String per member, name and argument: the borrowing one must
    /// give what it gave for every string of up to five characters over the grammar's hard
    /// cases (quotes, escapes, commas, `=`, SP, HTAB, upper case, a non-ASCII letter) and for
    /// longer real values.
    fn old_parts(value: &str) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        let mut escaped = false;
        for c in value.chars() {
            match c {
                _ if escaped => {
                    escaped = false;
                    cur.push(c);
                }
                '\\' if quoted => {
                    escaped = true;
                    cur.push(c);
                }
                '"' => {
                    quoted = !quoted;
                    cur.push(c);
                }
                ',' if !quoted => {
                    out.push(std::mem::take(&mut cur));
                }
                _ => cur.push(c),
            }
        }
        out.push(cur);
        out.into_iter()
            .filter_map(|p| old_directive(p.trim_matches([' ', '\t'])))
            .collect()
    }

    fn old_directive(member: &str) -> Option<(String, Option<String>)> {
        let (name, arg) = match member.split_once('=') {
            Some((n, a)) => (n, Some(a)),
            None => (member, None),
        };
        if !is_token(name) {
            return None;
        }
        let arg = match arg {
            None => None,
            Some(a) if is_token(a) => Some(a.to_string()),
            Some(a) => Some(quoted_string(a)?),
        };
        Some((name.to_ascii_lowercase(), arg))
    }

    #[test]
    fn the_borrowing_splitter_gives_what_the_allocating_one_gave() {
        let same = |v: &str| {
            let new: Vec<(String, Option<String>)> = parts(v)
                .into_iter()
                .map(|(n, a)| (n.into_owned(), a.map(Cow::into_owned)))
                .collect();
            assert_eq!(new, old_parts(v), "{v:?}");
        };
        let alphabet = ['a', 'A', '=', '"', ',', ' ', '\\', '\t', '1', 'é'];
        let mut v = String::new();
        fn each(v: &mut String, left: usize, alphabet: &[char], same: &dyn Fn(&str)) {
            same(v);
            if left == 0 {
                return;
            }
            for &c in alphabet {
                v.push(c);
                each(v, left - 1, alphabet, same);
                v.pop();
            }
        }
        each(&mut v, 5, &alphabet, &same);
        for real in [
            "public, max-age=\"60\", s-maxage=30, max-age=5, X-Unknown, no-cache=\"Set-Cookie, X-A\", private=\"X-B\", immutable",
            "no-cache=\"a\\\"b, c\", MAX-AGE=10,, ,\tstale-while-revalidate=30 ",
            "max-age=\"600",
        ] {
            same(real);
        }
    }
}

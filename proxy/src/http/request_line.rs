//! The request line's checks: its target's form (origin, absolute or `*`; see
//! [`split_target`]), and, made on the raw bytes before httparse sees them, the version exactly
//! as RFC 9112 §2.3 spells it (1.2 to 1.9 taken as 1.1, RFC 9110 §2.5) and no bare CR or LF
//! anywhere in the head, since a recipient that accepts one and a recipient that doesn't read
//! two different messages from the same bytes.
use super::request::RequestError;

/// Where the request line's version stands, checked before httparse, which refuses every
/// version but 1.0 and 1.1 alike.
pub(super) enum Version {
    /// 1.0 or 1.1, or the line is not complete yet.
    Plain,
    /// HTTP/1.2 to 1.9: handled as 1.1 (RFC 9110 §2.5); the minor digit is at this offset.
    LaterMinor(usize),
}

/// Checks the request line's version: `HTTP/` DIGIT `.` DIGIT exactly, major version 1.
pub(super) fn request_line_version(buf: &[u8]) -> Result<Version, RequestError> {
    // RFC 9112 §2.2: empty lines before the request line are ignored.
    let mut start = 0;
    while buf[start..].starts_with(b"\r\n") {
        start += 2;
    }
    let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') else {
        return Ok(Version::Plain);
    };
    let Some(line) = buf[start..start + nl].strip_suffix(b"\r") else {
        return Err(RequestError::Malformed("bare LF in request line".into()));
    };
    let sp = line.iter().rposition(|b| *b == b' ').unwrap_or(0);
    let v = &line[sp + 1..];
    if v.len() != 8 || &v[..5] != b"HTTP/" || v[6] != b'.' {
        return Err(RequestError::Malformed("invalid HTTP version".into()));
    }
    let (major, minor) = (v[5], v[7]);
    if !major.is_ascii_digit() || !minor.is_ascii_digit() {
        return Err(RequestError::Malformed("invalid HTTP version".into()));
    }
    if major != b'1' {
        return Err(RequestError::Version);
    }
    Ok(if minor > b'1' {
        Version::LaterMinor(start + sp + 1 + 7)
    } else {
        Version::Plain
    })
}

/// True when a CR is not followed by LF or an LF not preceded by CR: RFC 9112 §2.2 allows a
/// recipient to take a bare LF as a line end, but one that does and one that doesn't read two
/// different messages from the same bytes, so a proxy refuses both.
pub(super) fn bare_cr_or_lf(head: &[u8]) -> bool {
    head.iter().enumerate().any(|(i, &b)| match b {
        b'\n' => i == 0 || head[i - 1] != b'\r',
        b'\r' => head.get(i + 1) != Some(&b'\n'),
        _ => false,
    })
}

/// Length of the first line of `buf`, up to (not including) its LF.
pub(super) fn first_line_len(buf: &[u8]) -> usize {
    buf.iter().position(|b| *b == b'\n').unwrap_or(buf.len())
}

/// Origin-form targets are normalised (see [`super::target`]); absolute-form
/// (`http://host/path`) gives its validated authority and its normalised path; `*` (OPTIONS)
/// passes.
pub(super) fn split_target(
    method: &str,
    t: &str,
    rules: super::target::PathRules,
) -> Result<(String, Option<String>), RequestError> {
    let bad = |e: super::target::Invalid| RequestError::Malformed(e.0.into());
    // RFC 9112 §3.2: a target is visible ASCII (raw non-ASCII and controls are no URI), and a
    // fragment is never sent (RFC 9110 §4.2.4): a client that sends one means something the
    // origin and the cache may read differently.
    if !t.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(RequestError::Malformed(
            "request target has a byte that is not visible ASCII".into(),
        ));
    }
    if t.contains('#') {
        return Err(RequestError::Malformed("fragment in request target".into()));
    }
    if t.starts_with('/') {
        return Ok((super::target::normalise(t, rules).map_err(bad)?, None));
    }
    if t == "*" {
        // asterisk-form is OPTIONS's alone (RFC 9112 §3.2.4).
        if method != "OPTIONS" {
            return Err(RequestError::Malformed(
                "asterisk-form target with a method other than OPTIONS".into(),
            ));
        }
        return Ok((t.to_string(), None));
    }
    let lower = t.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
    let rest = if lower.starts_with("http://") {
        &t[7..]
    } else if lower.starts_with("https://") {
        &t[8..]
    } else {
        return Err(RequestError::Malformed(
            "request target is not origin- or absolute-form".into(),
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    if authority.contains('@') {
        // RFC 9110 §4.2.4: userinfo is deprecated in http(s) URIs and only ever used to deceive.
        return Err(RequestError::Malformed("userinfo in target".into()));
    }
    let host = super::target::authority(authority, "80").map_err(bad)?;
    if host.is_empty() {
        return Err(RequestError::Malformed("empty authority".into()));
    }
    Ok((
        super::target::normalise(&path, rules).map_err(bad)?,
        Some(host),
    ))
}

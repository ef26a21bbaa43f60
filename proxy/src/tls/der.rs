//! The few DER elements the TLS code reads by hand (a certificate's validity for a pinned
//! origin, an OCSP response's status and dates): definite lengths only, as DER requires, and
//! every length checked against what is there.

/// One DER element at the start of `b`: (tag, contents, what follows). Definite lengths only,
/// as DER requires.
pub(crate) fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &d| (a << 8) | d as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
pub(crate) fn time(tag: u8, b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?.strip_suffix('Z')?;
    // Digits before any slicing: `1é123456789Z` is 12 bytes of UTF-8 whose byte 2 is inside a
    // character, and an OCSP file can come from a responder over plain HTTP.
    if !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, s.len()) {
        (0x17, 12) => {
            let yy: i64 = s[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        (0x18, 14) => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day, h, m, sec) = (n(0)?, n(2)?, n(4)?, n(6)?, n(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let days = crate::http::date::days_from_civil(year, month as u32, day as u32);
    Some(days * 86_400 + h * 3600 + m * 60 + sec)
}

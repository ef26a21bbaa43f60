//! HTTP dates read as RFC 9110 §5.6.7 asks of recipients: leniently. The three formats
//! (IMF-fixdate, RFC 850, asctime) are accepted with month, weekday and zone names in any case,
//! and the weekday is ignored, so `Thu, 08 Aug 2050 ...` (a Monday) is 8 August 2050. The
//! `httpdate` crate rejects both; origins send both (hand-written `Expires`, old frameworks), and a
//! rejected `Expires` makes a response stale where its sender meant it fresh for decades.
//!
//! Lenient in names, strict in numbers: digits are ASCII digits, the day must exist in its month,
//! the time of day must be valid (a leap second, 60, reads as 59) and the zone must be GMT or
//! UTC. Anything else is `None`, which callers treat as the RFC says for an invalid date.
//! Formatting stays with `httpdate` (we only ever send IMF-fixdate).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// Parses an HTTP date in any of the three formats, leniently as described in the module doc.
pub fn parse(s: &str) -> Option<SystemTime> {
    let s = s.trim_matches([' ', '\t']);
    // IMF-fixdate and RFC 850 put the weekday before a comma; asctime puts it first with no comma.
    let (rest, asctime) = match s.split_once(',') {
        Some((_, rest)) => (rest, false),
        None => (s.split_once([' ', '\t'])?.1, true),
    };
    let words: Vec<&str> = rest.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    let (day, month, year, time) = if asctime {
        // Aug  8 12:00:00 2050
        let [month, day, time, year] = words.as_slice() else {
            return None;
        };
        (*day, *month, number(year)?, *time)
    } else {
        match words.as_slice() {
            // 08 Aug 2050 12:00:00 GMT
            [day, month, year, time, zone] => {
                gmt(zone)?;
                (*day, *month, number(year)?, *time)
            }
            // 08-Aug-50 12:00:00 GMT
            [dmy, time, zone] => {
                gmt(zone)?;
                let mut parts = dmy.split('-');
                let (Some(day), Some(month), Some(yy), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return None;
                };
                (day, month, two_digit_year(yy)?, *time)
            }
            _ => return None,
        }
    };
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month))? as u32 + 1;
    let day = u32::try_from(number(day)?).ok()?;
    if !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    let mut hms = time.split(':');
    let (Some(h), Some(m), Some(sec), None) = (hms.next(), hms.next(), hms.next(), hms.next())
    else {
        return None;
    };
    let (h, m, sec) = (number(h)?, number(m)?, number(sec)?);
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let sec = sec.min(59);
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + (h * 3600 + m * 60 + sec);
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// 1 to 4 ASCII digits (no sign, no spaces: `u64::from_str` alone would take a `+`).
fn number(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn gmt(zone: &str) -> Option<()> {
    (zone.eq_ignore_ascii_case("gmt") || zone.eq_ignore_ascii_case("utc")).then_some(())
}

/// RFC 850's two-digit year: a year more than 50 years in the future is read as the most recent
/// past year with the same last two digits (RFC 9110 §5.6.7).
fn two_digit_year(yy: &str) -> Option<i64> {
    if yy.len() != 2 {
        return number(yy); // some senders write four digits here
    }
    let yy = number(yy)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1970, |d| 1970 + d.as_secs() as i64 / 31_556_952);
    let mut year = now - now.rem_euclid(100) + yy;
    if year > now + 50 {
        year -= 100;
    }
    Some(year)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Option<SystemTime> {
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn rfc9110_5_6_7_the_three_formats() {
        // 1994-11-06 08:49:37 UTC, the RFC's own example.
        let t = at(784_111_777);
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:37 GMT"), t);
        assert_eq!(parse("Sunday, 06-Nov-94 08:49:37 GMT"), t);
        assert_eq!(parse("Sun Nov  6 08:49:37 1994"), t);
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT"), at(0));
        assert_eq!(parse("Tue, 29 Feb 2000 12:00:00 GMT"), at(951_825_600));
        // Agrees with httpdate on a well-formed date.
        let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        assert_eq!(parse(&httpdate::fmt_http_date(now)), Some(now));
    }

    #[test]
    fn rfc9110_5_6_7_lenient_weekday_and_case() {
        // 8 August 2050 is a Monday.
        let t = at(2_543_572_800);
        assert_eq!(parse("Mon, 08 Aug 2050 12:00:00 GMT"), t);
        assert_eq!(parse("Thu, 08 Aug 2050 12:00:00 GMT"), t);
        assert_eq!(parse("thu, 08 aug 2050 12:00:00 gmt"), t);
        assert_eq!(parse("THU, 08 AUG 2050 12:00:00 UTC"), t);
        assert_eq!(parse("Xyz, 08 Aug 2050 12:00:00 GMT"), t);
        assert_eq!(parse("Mon, 8 Aug 2050 12:00:00 GMT"), t);
        assert_eq!(parse("Mon, 08 Aug 2050 12:00:60 GMT"), at(2_543_572_859));
    }

    #[test]
    fn hostile_dates_are_none() {
        for bad in [
            "",
            "0",
            "-1",
            "Mon, 31 Feb 2050 12:00:00 GMT",
            "Mon, 29 Feb 2100 12:00:00 GMT",
            "Mon, 00 Aug 2050 12:00:00 GMT",
            "Mon, 08 Aug 2050 24:00:00 GMT",
            "Mon, 08 Aug 2050 12:60:00 GMT",
            "Mon, 08 Aug 2050 12:00:61 GMT",
            "Mon, 08 Aug 2050 12:00:99 GMT",
            "Mon, 08 Aug 2050 12:00:00 PST",
            "Mon, 08 Aug 2050 12:00:00 +0000",
            "Mon, 08 Aug 2050 12:00 GMT",
            "Mon, 08 Aug 2050 12:00:00:00 GMT",
            "Mon, 08 Agu 2050 12:00:00 GMT",
            "Mon, +8 Aug 2050 12:00:00 GMT",
            "Mon, 08 Aug 2050 12:00:00 GMT extra",
            "Mon, 08 Aug ２０５０ 12:00:00 GMT",
            "Mon, 08 Aug 20500 12:00:00 GMT",
            "Mon, 08-Aug 12:00:00 GMT",
            "Mon Aug  8 12:00:00",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}

//! HTTP dates (RFC 9110 §5.6.7): the three formats of the grammar and nothing else. An invalid
//! `Expires` means "already expired" (RFC 9111 §5.3), so a date read by guesswork would keep
//! fresh what its sender's cache-tests expect stale: a one-digit hour, an RFC 850 date with a
//! four-digit year, two spaces, a `UTC` zone or a second `Expires` line are all invalid.
//!
//! Exact in form: single spaces, two-digit day, hour, minute and second (a one-digit day only in
//! asctime, after a space), a four-digit year (two in RFC 850), the zone `GMT`, the day name
//! spelled out in RFC 850 and abbreviated in the other two. Lenient only where the RFC lets a
//! recipient be: names of days, months and `GMT` in any case, a weekday that does not match the
//! date (ignored: `Thu, 08 Aug 2050 ...`, a Monday, is 8 August 2050), and a leap second (60,
//! read as 59). The day must exist in its month. Formatting stays with `httpdate` (we only ever
//! send IMF-fixdate).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const DAYS_LONG: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Parses an HTTP date in one of the three formats, as described in the module doc.
pub fn parse(s: &str) -> Option<SystemTime> {
    let words: Vec<&str> = s.split(' ').collect();
    let (year, month, day, time) = match words.as_slice() {
        // asctime with a one-digit day: Sun Nov  6 08:49:37 1994 (before IMF-fixdate, which
        // also has six words).
        [wd, month, "", day, time, year] => {
            named(wd, &DAYS)?;
            (digits(year, 4)?, *month, digits(day, 1)?, *time)
        }
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, day, month, year, time, zone] => {
            named(wd.strip_suffix(',')?, &DAYS)?;
            gmt(zone)?;
            (digits(year, 4)?, *month, digits(day, 2)?, *time)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [wd, dmy, time, zone] => {
            named(wd.strip_suffix(',')?, &DAYS_LONG)?;
            gmt(zone)?;
            let mut parts = dmy.split('-');
            let (Some(day), Some(month), Some(yy), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            (
                two_digit_year(digits(yy, 2)?),
                month,
                digits(day, 2)?,
                *time,
            )
        }
        // asctime with a two-digit day: Sun Nov 16 08:49:37 1994
        [wd, month, day, time, year] => {
            named(wd, &DAYS)?;
            (digits(year, 4)?, *month, digits(day, 2)?, *time)
        }
        _ => return None,
    };
    let month = named(month, &MONTHS)? as u32 + 1;
    let day = u32::try_from(day).ok()?;
    if !(1..=days_in_month(year, month)).contains(&day) {
        return None;
    }
    let mut hms = time.split(':');
    let (Some(h), Some(m), Some(sec), None) = (hms.next(), hms.next(), hms.next(), hms.next())
    else {
        return None;
    };
    let (h, m, sec) = (digits(h, 2)?, digits(m, 2)?, digits(sec, 2)?);
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let sec = sec.min(59);
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + (h * 3600 + m * 60 + sec);
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Exactly `n` ASCII digits (no sign, no spaces: `i64::from_str` alone would take a `+`).
fn digits(s: &str, n: usize) -> Option<i64> {
    if s.len() != n || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The index of `s` in `names`, compared without case.
fn named(s: &str, names: &[&str]) -> Option<usize> {
    names.iter().position(|n| n.eq_ignore_ascii_case(s))
}

fn gmt(zone: &str) -> Option<()> {
    zone.eq_ignore_ascii_case("gmt").then_some(())
}

/// RFC 850's two-digit year: a year more than 50 years in the future is read as the most recent
/// past year with the same last two digits (RFC 9110 §5.6.7).
fn two_digit_year(yy: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1970, |d| 1970 + d.as_secs() as i64 / 31_556_952);
    let mut year = now - now.rem_euclid(100) + yy;
    if year > now + 50 {
        year -= 100;
    }
    year
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
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
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
        assert_eq!(parse("THU, 08 AUG 2050 12:00:00 GMT"), t);
        assert_eq!(parse("Mon, 08 Aug 2050 12:00:60 GMT"), at(2_543_572_859));
        assert_eq!(parse("SUNDAY, 06-nov-94 08:49:37 gmt"), at(784_111_777));
        assert_eq!(parse("sun nov  6 08:49:37 1994"), at(784_111_777));
        assert_eq!(
            parse("Sun Nov 16 08:49:37 1994"),
            at(784_111_777 + 10 * 86_400)
        );
    }

    /// The invalid forms of the HTTP cache conformance suite (`freshness-expires-invalid-*`):
    /// each means "already expired" in `Expires`, so each must not parse.
    #[test]
    fn rfc9111_5_3_the_cache_tests_invalid_expires_forms_are_none() {
        for bad in [
            "Mon, 08 Aug 2050 1:00:00 GMT",   // 1-digit hour
            "Mon, 08-Aug-2050 12:00:00 GMT",  // date with dashes in IMF-fixdate
            "Mon,  08 Aug 2050 12:00:00 GMT", // multiple spaces
            "Mon, 08 Aug 2050  12:00:00 GMT",
            "Mon, 08 Aug 2050 12:00:00 UTC", // utc
            "Monday, 08-Aug-2050 12:00:00 GMT",
            "Mon, 8 Aug 2050 12:00:00 GMT",
            "Xyz, 08 Aug 2050 12:00:00 GMT",
            "Monday, 08 Aug 2050 12:00:00 GMT",
            "Mon, 08-Aug-50 12:00:00 GMT",
            "Mon Aug 8 12:00:00 2050",
            "Mon Aug  08 12:00:00 2050",
            "Mon\t08 Aug 2050 12:00:00 GMT",
            " Mon, 08 Aug 2050 12:00:00 GMT",
            "Mon, 08 Aug 2050 12:00:00 GMT ",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
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
            "Mon Aug  8 12:00:00 -2050",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}

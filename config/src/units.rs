//! Sizes and durations as an nginx operator writes them, so nobody is surprised.
//!
//! Sizes: a bare number is bytes; `k`, `m`, `g`, `t` (either case, as in nginx, where `1g` is
//! 1 GiB) and `KiB`, `MiB`, `GiB`, `TiB` are binary; `KB`, `MB`, `GB`, `TB` are decimal, as
//! written. A fraction is allowed before a unit (`1.5GiB`) and rounded down to whole bytes.
//! `zerocache check` prints every size in bytes and in its binary form.
//!
//! Durations: a bare number is seconds, as in nginx (`30` is `30s`); otherwise humantime's
//! forms (`500ms`, `30s`, `5m`, `1h`, `1day`, `1h 30m`). Where zero makes no sense (a timeout)
//! validation refuses it.
//!
//! Used through `#[serde(with = "crate::units::size")]` and friends, so the fields keep their
//! types (`ByteSize`, `Duration`) and the data plane never sees a unit.

use bytesize::ByteSize;
use std::time::Duration;

/// Parses a size; the error says what is accepted.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let bad = || {
        format!(
            "`{s}` is not a size: write bytes (`1048576`) or a number with a unit: k, m, g, t or \
             KiB, MiB, GiB, TiB (binary, `1g` = 1 GiB as in nginx), KB, MB, GB, TB (decimal)"
        )
    };
    if number.is_empty() || number.starts_with('.') || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let factor: u64 = match unit {
        "" | "b" | "B" => 1,
        "k" | "K" | "KiB" | "kib" | "Kib" => 1 << 10,
        "m" | "M" | "MiB" | "mib" | "Mib" => 1 << 20,
        "g" | "G" | "GiB" | "gib" | "Gib" => 1 << 30,
        "t" | "T" | "TiB" | "tib" | "Tib" => 1 << 40,
        "KB" | "kB" | "kb" => 1_000,
        "MB" | "mb" => 1_000_000,
        "GB" | "gb" => 1_000_000_000,
        "TB" | "tb" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let bytes = match number.split_once('.') {
        None => number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(factor)),
        Some((int, frac)) if factor > 1 && !frac.is_empty() && frac.len() <= 9 => {
            let whole = int.parse::<u64>().ok().and_then(|i| i.checked_mul(factor));
            let scale = 10u64.pow(frac.len() as u32);
            let part = frac.parse::<u64>().ok().map(|f| {
                // f / scale of a unit, in whole bytes (u128: factor * f can exceed u64).
                (u128::from(factor) * u128::from(f) / u128::from(scale)) as u64
            });
            whole.zip(part).and_then(|(w, p)| w.checked_add(p))
        }
        Some(_) => None,
    };
    bytes.ok_or_else(bad)
}

/// A size in its binary form, as `check` shows it: `64 MiB`, `1.5 GiB`, `1000 B`.
pub fn binary(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            let whole = bytes / size;
            let hundredths = (bytes % size) * 100 / size;
            return match hundredths {
                0 if bytes.is_multiple_of(size) => format!("{whole} {name}"),
                h if h % 10 == 0 => format!("{whole}.{} {name}", h / 10),
                h => format!("{whole}.{h:02} {name}"),
            };
        }
    }
    format!("{bytes} B")
}

/// The longest duration a config may give: beyond it a timeout means "never", which is never
/// what was meant, and `Instant::now() + d` could overflow (a panic) where it is used.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

fn capped(d: Duration, written: &str) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!(
            "`{written}` is longer than 10 years: give a real duration (`30s`, `5m`, `1day`)"
        ));
    }
    Ok(d)
}

/// The units a duration may be written in, as documented: humantime reads many more (`seconds`,
/// `weeks`, `months` of 30.44 days), and a config that says `60 seconds` or `1 month` should be
/// refused with the units it may use, not read as whatever humantime makes of it.
const DURATION_UNITS: [&str; 7] = ["ms", "s", "m", "h", "d", "day", "days"];

/// Parses a duration: bare seconds, or numbers each with one of [`DURATION_UNITS`] (`1h 30m`), at
/// most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map_err(|_| format!("`{s}` seconds is too long"))
            .and_then(|n| capped(Duration::from_secs(n), s));
    }
    // Every unit must be a documented one: the alphabetic runs between the numbers.
    let numbers = t.bytes().any(|b| b.is_ascii_digit());
    for unit in t
        .split(|c: char| c.is_ascii_digit() || c.is_whitespace())
        .filter(|u| numbers && !u.is_empty())
    {
        if !DURATION_UNITS.contains(&unit) {
            return Err(format!(
                "`{s}`: `{unit}` is not a duration unit here: write seconds (`30`) or a number with \
                 one of ms, s, m, h, d or day (`500ms`, `30s`, `5m`, `1h`, `1day`)"
            ));
        }
    }
    humantime::parse_duration(t)
        .map_err(|_| {
            format!(
                "`{s}` is not a duration: write seconds (`30`) or a number with a unit (`500ms`, \
             `30s`, `5m`, `1h`, `1day`)"
            )
        })
        .and_then(|d| capped(d, s))
}

/// Reads a scalar that may be a number or a string, so an error points at the value itself
/// (an untagged enum would report it at the enclosing mapping).
struct Scalar<T> {
    expecting: &'static str,
    from_number: fn(u64) -> Result<T, String>,
    from_text: fn(&str) -> Result<T, String>,
}

impl<'de, T> serde::de::Visitor<'de> for Scalar<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
        (self.from_number)(n).map_err(E::custom)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
        match u64::try_from(n) {
            Ok(n) => (self.from_number)(n).map_err(E::custom),
            Err(_) => Err(E::custom(format!("`{n}` is negative: {}", self.expecting))),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
        (self.from_text)(s).map_err(E::custom)
    }
}

const SIZE: &str = "a size: bytes, or a number with a unit (`64MiB`, `1g`)";
const DURATION: &str = "a duration: seconds, or a number with a unit (`30s`, `5m`)";

fn size_scalar() -> Scalar<ByteSize> {
    Scalar {
        expecting: SIZE,
        from_number: |n| Ok(ByteSize::b(n)),
        from_text: |s| parse_size(s).map(ByteSize::b),
    }
}

fn duration_scalar() -> Scalar<Duration> {
    Scalar {
        expecting: DURATION,
        from_number: |n| capped(Duration::from_secs(n), &n.to_string()),
        from_text: parse_duration,
    }
}

/// `#[serde(with = "crate::units::size")]` for a `ByteSize` field; serialises as bytes.
pub mod size {
    use super::*;

    /// Reads a size (see the module doc).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        d.deserialize_any(size_scalar())
    }

    /// Writes the size as a number of bytes.
    pub fn serialize<S: serde::Serializer>(v: &ByteSize, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.as_u64())
    }
}

/// `#[serde(with = "crate::units::duration")]` for a `Duration` field; serialises as humantime.
pub mod duration {
    use super::*;

    /// Reads a duration (see the module doc).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(duration_scalar())
    }

    /// Writes the duration as humantime (`30s`).
    pub fn serialize<S: serde::Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*v).to_string())
    }
}

/// An optional [`Scalar`]: `null` or an absent key is `None`.
struct OptScalar<T>(Scalar<T>);

impl<'de, T> serde::de::Visitor<'de> for OptScalar<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.0.expecting)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self.0).map(Some)
    }
}

/// `#[serde(with = "crate::units::opt_duration")]` for an `Option<Duration>` field.
pub mod opt_duration {
    use super::*;

    /// Reads an optional duration (`null` or absent: `None`).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        d.deserialize_option(OptScalar(duration_scalar()))
    }

    /// Writes the duration as humantime, or null.
    pub fn serialize<S: serde::Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }
}

/// `#[serde(with = "crate::units::opt_size")]` for an `Option<ByteSize>` field.
pub mod opt_size {
    use super::*;

    /// Reads an optional size (`null` or absent: `None`).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ByteSize>, D::Error> {
        d.deserialize_option(OptScalar(size_scalar()))
    }

    /// Writes the size as a number of bytes, or null.
    pub fn serialize<S: serde::Serializer>(v: &Option<ByteSize>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_u64(b.as_u64()),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nginx_operators_write_them() {
        for (s, n) in [
            ("0", 0),
            ("1048576", 1 << 20),
            ("512k", 512 << 10),
            ("512K", 512 << 10),
            ("1m", 1 << 20),
            ("1g", 1 << 30),
            ("2T", 2 << 40),
            ("64MiB", 64 << 20),
            ("64 MiB", 64 << 20),
            ("1GiB", 1 << 30),
            ("1.5GiB", 3 << 29),
            ("1KB", 1_000),
            ("100MB", 100_000_000),
            ("1GB", 1_000_000_000),
            ("10B", 10),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
        for bad in [
            "",
            "g",
            "1x",
            "-1",
            "+1",
            "1.g",
            ".5g",
            "1.2.3g",
            "1 g b",
            "１g",
            "1e3",
            "1.5",
            "99999999999999999999",
            "20000000T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn binary_forms() {
        assert_eq!(binary(0), "0 B");
        assert_eq!(binary(1000), "1000 B");
        assert_eq!(binary(1 << 30), "1 GiB");
        assert_eq!(binary(3 << 29), "1.5 GiB");
        assert_eq!(binary(1_000_000_000), "953.67 MiB");
        assert_eq!(binary(64 << 20), "64 MiB");
    }

    #[test]
    fn durations_bare_seconds_or_humantime() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1day"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert!(parse_duration("3650days").is_ok());
        for bad in [
            "",
            "s",
            "-5",
            "5 parsecs",
            "99999999999999999999",
            "18446744073709551615",
            "3651days",
            "500years",
            "60 seconds",
            "1 month",
            "2weeks",
            "5min",
            "1.5h",
            "30S",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_duration("60 seconds"),
            Err("`60 seconds`: `seconds` is not a duration unit here: write seconds (`30`) or a number with one of ms, s, m, h, d or day (`500ms`, `30s`, `5m`, `1h`, `1day`)".into())
        );
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
    }
}

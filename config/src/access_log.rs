//! `logging.access_log_format`: one of the named formats, or a template of nginx-style variables
//! (`$time $client "$method $target" $status $cache_status`), checked when the config is read so
//! a misspelt variable names itself instead of logging `-` for ever.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Access log line formats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One space-separated line.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
    /// Apache/nginx "combined", with the cache status appended, for existing log tooling.
    Combined,
    /// A template: text with `$variables` (or `${variable}` beside a letter), `$$` for a `$`.
    Template(String),
}

/// The variables a template may use, and what each says (`-` where a value is absent).
pub const VARIABLES: &[(&str, &str)] = &[
    (
        "time",
        "the time the response ended, RFC 3339 UTC with milliseconds",
    ),
    (
        "time_local",
        "the same as nginx's $time_local (`05/Dec/2026:09:27:01 +0000`)",
    ),
    (
        "client",
        "the client's address (a PROXY header's, when the listener takes one)",
    ),
    ("client_port", "the client's port"),
    ("method", "the request method"),
    ("target", "the request target"),
    ("protocol", "HTTP/1.0, HTTP/1.1 or HTTP/2.0"),
    ("host", "the normalised Host"),
    ("status", "the status code"),
    ("bytes", "body bytes sent"),
    (
        "duration",
        "seconds from the request head to the last byte, to the microsecond",
    ),
    (
        "complete",
        "complete, or aborted when the response was cut short",
    ),
    (
        "cache_status",
        "the X-Cache value (HIT, MISS, ...; a fleet owner's when relayed)",
    ),
    (
        "zero_copy",
        "yes when the body went by sendfile, no when copied, - without a body",
    ),
    (
        "upstream_addr",
        "the upstream server asked, also when it failed",
    ),
    ("upstream_status", "its status code"),
    (
        "upstream_time",
        "seconds from sending the request upstream to its response head",
    ),
    ("request_id", "the request id (logging.request_id_header)"),
    ("route", "the route's name (routes[].name, else its index)"),
    (
        "rule",
        "the names of the route's rules that matched, comma-separated",
    ),
    (
        "slices",
        "a response from slices (routes[].slice): the slices its body came from",
    ),
    (
        "slices_fetched",
        "and how many slices were fetched from the origin for it",
    ),
    ("user_agent", "User-Agent"),
    ("referer", "Referer"),
    (
        "tls_version",
        "TLSv1.2 or TLSv1.3, as nginx's $ssl_protocol",
    ),
    ("tls_cipher", "the cipher suite by its IANA name"),
    ("tls_sni", "the server name the client asked for"),
];

/// A piece of a template: text as written, or a variable (an index into [`VARIABLES`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text.
    Literal(String),
    /// `$name`.
    Var(&'static str),
}

/// The parts of `template`, or why it is not one.
pub fn parts(template: &str) -> Result<Vec<Part>, String> {
    use crate::template::TemplatePart;
    let out: Vec<Part> = crate::template::scan(template, VARIABLES, false, "")?
        .into_iter()
        .filter_map(|p| match p {
            TemplatePart::Literal(t) => Some(Part::Literal(t)),
            TemplatePart::Var(v) => Some(Part::Var(v)),
            // Not scanned for (`groups` is false).
            TemplatePart::Group(_) => None,
        })
        .collect();
    if !out.iter().any(|p| matches!(p, Part::Var(_))) {
        return Err("a template needs at least one $variable".into());
    }
    if template.contains(['\n', '\r']) {
        return Err("a template is one line: no line breaks".into());
    }
    Ok(out)
}

impl TryFrom<String> for AccessLogFormat {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "text" => Ok(AccessLogFormat::Text),
            "json" => Ok(AccessLogFormat::Json),
            "combined" => Ok(AccessLogFormat::Combined),
            t if t.contains('$') => parts(t).map(|_| AccessLogFormat::Template(s)),
            other => Err(format!(
                "`{other}` is not a format: write text, json, combined, or a template of $variables such as '$time $client \"$method $target\" $status $cache_status'"
            )),
        }
    }
}

/// Read as text and checked where it is written, so an error names
/// `logging.access_log_format` and its line and column.
impl<'de> Deserialize<'de> for AccessLogFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, so the error is raised at the value (serde_yaml places it there).
        struct Format;
        impl serde::de::Visitor<'_> for Format {
            type Value = AccessLogFormat;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("text, json, combined, or a template of $variables")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AccessLogFormat, E> {
                AccessLogFormat::try_from(v.to_string()).map_err(E::custom)
            }
        }
        d.deserialize_str(Format)
    }
}

impl Serialize for AccessLogFormat {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from(self.clone()))
    }
}

impl From<AccessLogFormat> for String {
    fn from(f: AccessLogFormat) -> String {
        match f {
            AccessLogFormat::Text => "text".into(),
            AccessLogFormat::Json => "json".into(),
            AccessLogFormat::Combined => "combined".into(),
            AccessLogFormat::Template(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_into_text_and_variables_and_misspellings_are_named() {
        assert_eq!(
            parts("$client - \"$method $target\" ${status}xx $$5").expect("valid"),
            [
                Part::Var("client"),
                Part::Literal(" - \"".into()),
                Part::Var("method"),
                Part::Literal(" ".into()),
                Part::Var("target"),
                Part::Literal("\" ".into()),
                Part::Var("status"),
                Part::Literal("xx $5".into()),
            ]
        );
        let e = parts("$time $cach_status").expect_err("misspelt");
        assert!(e.starts_with("`$cach_status` is not a variable"), "{e}");
        assert!(e.contains("$cache_status"), "{e}");
        assert_eq!(
            parts("${status").expect_err("open"),
            "`${status` has no closing `}`"
        );
        assert_eq!(
            parts("no variables").expect_err("none"),
            "a template needs at least one $variable"
        );
        assert_eq!(parts("$").expect_err("bare"), {
            let names: Vec<String> = VARIABLES.iter().map(|(v, _)| format!("${v}")).collect();
            format!(
                "`$` is not a variable; write `$$` for a `$`; the variables: {}",
                names.join(", ")
            )
        });
        assert!(parts("$status\n$status").is_err());
        for f in ["text", "json", "combined", "$status $route"] {
            let back: String = AccessLogFormat::try_from(f.to_string())
                .expect("valid")
                .into();
            assert_eq!(back, f);
        }
        assert!(AccessLogFormat::try_from("xml".to_string()).is_err());
    }
}

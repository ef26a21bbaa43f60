//! Config errors that name the file, line, column and key path, and suggest the key the author
//! probably meant.

use crate::validate::Invalid;

/// Why a config was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {error}")]
    Read {
        /// The file.
        file: String,
        /// The OS error.
        error: String,
    },
    /// The YAML is malformed or does not fit the schema, or a value is invalid.
    #[error("{file}:{line}:{column}: {message}")]
    At {
        /// The file.
        file: String,
        /// 1-based line, 0 when unknown.
        line: usize,
        /// 1-based column, 0 when unknown.
        column: usize,
        /// Key path and what is wrong.
        message: String,
    },
    /// Several problems, in file order: `check` reports them all at once.
    #[error("{}", join(.0))]
    Many(Vec<ConfigError>),
}

fn join(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// One error, or [`ConfigError::Many`] for several (sorted by line, duplicates removed).
    pub(crate) fn from_list(mut errors: Vec<ConfigError>) -> ConfigError {
        let key = |e: &ConfigError| match e {
            ConfigError::At { line, column, .. } => (*line, *column),
            _ => (0, 0),
        };
        // The whole file's first error and its section's copy are the same error: equal in
        // place and message. Two different problems located at one key are both kept.
        errors.sort_by_key(key);
        errors.dedup();
        if errors.len() == 1 {
            errors.remove(0)
        } else {
            ConfigError::Many(errors)
        }
    }

    /// Every single error: itself, or each of [`ConfigError::Many`].
    pub fn each(&self) -> Vec<&ConfigError> {
        match self {
            ConfigError::Many(v) => v.iter().collect(),
            e => vec![e],
        }
    }
}

pub(crate) fn from_yaml(file: &str, text: &str, e: &serde_yaml::Error) -> ConfigError {
    let mut out = from_yaml_at(file, e, 0);
    // libyaml's words for a tab where indentation is read; YAML indents with spaces only.
    if let ConfigError::At {
        line,
        column,
        message,
        ..
    } = &mut out
        && *line > 0
        && text
            .lines()
            .nth(*line - 1)
            .and_then(|l| l.chars().nth(column.saturating_sub(1)))
            == Some('\t')
    {
        *message = "a tab cannot indent YAML: indent with spaces".into();
    }
    if let ConfigError::At {
        line,
        column,
        message,
        ..
    } = &mut out
        && let Some((at, first)) = duplicate_key_line(text, message, *line, *column)
    {
        // libyaml places a duplicate key at the start of its mapping (1:1 for a top-level
        // one): the operator needs the line to delete, and where the key was first.
        *message = format!("{message} (its first is on line {first})");
        *line = at;
    }
    out
}

/// For serde_yaml's `duplicate entry with key "K"` about the block mapping that starts at
/// `line`:`column`, the line of the key's second occurrence in that mapping and of its first.
/// `None` for anything else (a flow mapping, a key written another way): the mapping's start
/// stays the place said.
fn duplicate_key_line(
    text: &str,
    message: &str,
    line: usize,
    column: usize,
) -> Option<(usize, usize)> {
    let quoted = message.split("duplicate entry with key ").nth(1)?;
    let key = quoted.trim_matches('"');
    let indent = column.checked_sub(1)?;
    let mut seen = Vec::new();
    for (i, l) in text.lines().enumerate().skip(line.checked_sub(1)?) {
        if l.trim().is_empty() || l.trim_start().starts_with('#') {
            continue;
        }
        let (before, rest) = (l.get(..indent)?, l.get(indent..).unwrap_or(""));
        if i + 1 > line && !before.chars().all(|c| c == ' ') {
            break; // The mapping ended: a line indented less.
        }
        if i + 1 > line && rest.starts_with(' ') {
            continue; // Deeper: a value's own lines.
        }
        let written = [key.to_string(), format!("\"{key}\""), format!("'{key}'")];
        if written.iter().any(|k| {
            rest.strip_prefix(k.as_str())
                .is_some_and(|r| r.trim_start().starts_with(':'))
        }) {
            seen.push(i + 1);
            if let [first, second] = seen[..] {
                return Some((second, first));
            }
        }
    }
    None
}

/// [`from_yaml`] for an error in a part of the file that starts after `line_offset` lines.
pub(crate) fn from_yaml_at(file: &str, e: &serde_yaml::Error, line_offset: usize) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| (l.line() + line_offset, l.column()))
        .unwrap_or((0, 0));
    let mut raw = e.to_string();
    // serde_yaml appends " at line L column C"; the location is already in front.
    if let Some(i) = raw.rfind(" at line ") {
        raw.truncate(i);
    }
    // A syntax error names the construct it was in with a second place ("did not find expected
    // ',' or '}' at line 2 column 1, while parsing a flow mapping"): one place per message, so
    // the construct's start is said as where it starts, not as another error position.
    if let Some(i) = raw.find(" at line ")
        && let Some((place, context)) = raw[i + 9..].split_once(", ")
        && let Some(start) = place
            .split_whitespace()
            .next()
            .and_then(|l| l.parse::<usize>().ok())
    {
        let start = start + line_offset;
        raw = if start == line {
            format!("{} {context}", &raw[..i])
        } else {
            format!("{} {context} that starts on line {start}", &raw[..i])
        };
    }
    let mut message = plain_words(&raw);
    if let Some(suggestion) = suggest(&message) {
        message.push_str(&format!("; did you mean `{suggestion}`?"));
    }
    ConfigError::At {
        file: file.to_string(),
        line,
        column,
        message,
    }
}

/// serde's message in the config's own words: an operator reads "a whole number", not `usize`,
/// and "a mapping of keys", not `struct CacheConfig`.
fn plain_words(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number (0 or more)"),
        ("expected u8", "expected a whole number (0 or more)"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected a boolean", "expected true or false"),
        (
            "expected a sequence",
            "expected a list (`[a, b]`, or `- a` lines)",
        ),
        ("expected a map", "expected a mapping (`key: value` lines)"),
    ];
    let mut out = message.to_string();
    for (from, to) in WORDS {
        out = out.replace(from, to);
    }
    // `expected struct CacheConfig`, `expected enum Foo`, `expected tuple struct X`.
    for kind in [
        "expected struct ",
        "expected tuple struct ",
        "expected enum ",
    ] {
        while let Some(i) = out.find(kind) {
            let rest = &out[i + kind.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let replacement = if kind == "expected enum " {
                "expected one of the values this key accepts"
            } else {
                "expected a mapping (`key: value` lines)"
            };
            out = format!("{}{replacement}{}", &out[..i], &rest[end..]);
        }
    }
    out
}

/// For "unknown field `x`, expected one of `a`, `b`", the closest of the keys serde lists (the
/// keys valid at that very place, so the list can never fall behind the schema) within a small
/// edit distance.
fn suggest(message: &str) -> Option<String> {
    let rest = message.split("unknown field `").nth(1)?;
    let field = rest.split('`').next()?;
    let expected = rest.split("expected ").nth(1)?;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|k| (strsim::damerau_levenshtein(field, k), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k.to_string())
}

pub(crate) fn from_validation(file: &str, text: &str, v: Invalid) -> ConfigError {
    let (line, column) = locate(text, &v.path);
    ConfigError::At {
        file: file.to_string(),
        line,
        column,
        message: format!("{}: {}", v.path, v.message),
    }
}

enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, rest) = part.split_once('[').unwrap_or((part, ""));
        if !key.is_empty() {
            out.push(Segment::Key(key));
        }
        for idx in rest.split('[') {
            if let Ok(n) = idx.trim_end_matches(']').parse() {
                out.push(Segment::Index(n));
            }
        }
    }
    out
}

/// Finds the line and column (1-based) of a key path such as `routes[2].upstream` in block-style
/// YAML. Validation runs on typed values, which have lost their positions; walking the path
/// through the indentation finds the right occurrence even when a key appears more than once.
/// Inside flow collections (`{ ... }`, `[ ... ]`) it stops at the enclosing key.
fn locate(text: &str, path: &str) -> (usize, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let (mut start, mut end, mut parent) = (0usize, lines.len(), -1i64);
    let mut found = (0, 0);
    for seg in segments(path) {
        match seg {
            Segment::Key(k) => {
                let hit = (start..end).find_map(|i| {
                    let l = lines[i];
                    let t = l.trim_start();
                    let (col, t) = match t.strip_prefix("- ") {
                        Some(rest) => (
                            indent(l) + 2 + (rest.len() - rest.trim_start().len()),
                            rest.trim_start(),
                        ),
                        None => (indent(l), t),
                    };
                    let is_key = t
                        .strip_prefix(k)
                        .is_some_and(|r| r.trim_start().starts_with(':'));
                    (is_key && col as i64 > parent).then_some((i, col))
                });
                let Some((i, col)) = hit else { return found };
                found = (i + 1, col + 1);
                let stop = (i + 1..end)
                    .find(|&j| {
                        !lines[j].trim().is_empty()
                            && indent(lines[j]) <= col
                            && !lines[j].trim_start().starts_with('#')
                    })
                    .unwrap_or(end);
                (start, end, parent) = (i + 1, stop, col as i64);
            }
            Segment::Index(n) => {
                let dashes: Vec<usize> = (start..end)
                    .filter(|&i| {
                        lines[i].trim_start().starts_with("- ") && indent(lines[i]) as i64 >= parent
                    })
                    .collect();
                // The list's items are the dashes at its first one's indent; deeper ones belong to
                // lists inside the items (a route's `rules`).
                let depth = dashes.first().map(|&i| indent(lines[i]));
                let items: Vec<usize> = dashes
                    .into_iter()
                    .filter(|&i| Some(indent(lines[i])) == depth)
                    .collect();
                let Some(&i) = items.get(n) else { return found };
                let col = indent(lines[i]);
                found = (i + 1, col + 1);
                let stop = items.get(n + 1).copied().unwrap_or(end);
                // The item's own first key sits on the dash line.
                (start, end, parent) = (i, stop, col as i64);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        assert_eq!(
            suggest("routes[0]: unknown field `upstrem`, expected one of `match`, `upstream`")
                .as_deref(),
            Some("upstream")
        );
        assert_eq!(
            suggest("unknown field `alowed_hosts`, expected one of `token`, `allowed_hosts`")
                .as_deref(),
            Some("allowed_hosts")
        );
        assert_eq!(
            suggest("unknown field `zzzzzzzz`, expected one of `match`, `upstream`"),
            None
        );
    }

    #[test]
    fn locates_key_paths() {
        let text = "listen: a\nroutes:\n  - match: {}\n    upstream: a\n  - match: {}\n    upstream: orgin\ndashboard:\n  listen: b\n";
        assert_eq!(locate(text, "routes[1].upstream"), (6, 5));
        assert_eq!(locate(text, "routes[0].match"), (3, 5));
        assert_eq!(locate(text, "routes"), (2, 1));
        assert_eq!(locate(text, "listen"), (1, 1));
        assert_eq!(locate(text, "dashboard.listen"), (8, 3));
        // A list inside a list's item is not more items of the outer one.
        let nested = "routes:\n  - name: a\n    rules:\n      - name: x\n      - name: y\n        deny: 1\n  - name: b\n";
        assert_eq!(locate(nested, "routes[0].rules[1].deny"), (6, 9));
        assert_eq!(locate(nested, "routes[1].name"), (7, 5));
    }
}

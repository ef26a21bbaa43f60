//! A stored header block: the `Name: value\r\n` lines an entry keeps (written once by
//! `cache::policy::stored_fields` from a parsed response, so every line is well formed), read
//! back in one way. Entries, hits, 304 merges and the targeted-field filter all walk it through
//! [`StoredFields::lines`], so a rule about names or whitespace is written once.

/// A stored header block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredFields<'a>(pub &'a [u8]);

/// One line of a stored block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredLine<'a> {
    /// The field name; empty when it is not UTF-8 (then it matches no name).
    pub name: &'a str,
    /// The value without surrounding SP/HTAB.
    pub value: &'a [u8],
    /// The whole line as stored, `\r\n` included: what is copied into a response head.
    pub raw: &'a [u8],
}

/// RFC 9110 §5.6.3: optional whitespace is SP and HTAB, nothing else.
fn trim_ows(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !matches!(c, b' ' | b'\t'));
    let Some(start) = start else { return &[] };
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(start);
    &b[start..=end]
}

impl<'a> StoredFields<'a> {
    /// Every non-empty line, in order.
    pub(crate) fn lines(self) -> impl Iterator<Item = StoredLine<'a>> {
        self.0.split_inclusive(|b| *b == b'\n').filter_map(|raw| {
            let line = raw.strip_suffix(b"\n").unwrap_or(raw);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                return None;
            }
            let colon = line.iter().position(|b| *b == b':');
            let (name, value) = match colon {
                Some(i) => (&line[..i], &line[i + 1..]),
                None => (line, &[][..]),
            };
            let name = std::str::from_utf8(trim_ows(name)).unwrap_or("");
            Some(StoredLine {
                name,
                value: trim_ows(value),
                raw,
            })
        })
    }

    /// The lines named `name` (case-insensitively).
    pub(crate) fn named(self, name: &str) -> impl Iterator<Item = StoredLine<'a>> {
        self.lines()
            .filter(move |l| l.name.eq_ignore_ascii_case(name))
    }

    /// The first UTF-8 value of `name` (entries find theirs in one pass, held to this).
    #[cfg(test)]
    pub(crate) fn get(self, name: &str) -> Option<&'a str> {
        self.named(name)
            .find_map(|l| std::str::from_utf8(l.value).ok())
    }

    /// Every UTF-8 value of `name`, comma-joined (RFC 9110 §5.3: a repeated list field is one
    /// list); `None` when there is none. Entries find theirs in one pass over every field
    /// (`cache::entry`); this is what that pass is held to.
    #[cfg(test)]
    pub(crate) fn joined(self, name: &str) -> Option<String> {
        let values: Vec<&str> = self
            .named(name)
            .filter_map(|l| std::str::from_utf8(l.value).ok())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_their_bytes_and_trim_only_sp_and_htab() {
        let block =
            b"ETag: \"a\"\r\nCache-Control: max-age=5\r\ncache-control:\tpublic \r\nX: \x0bv\r\n";
        let f = StoredFields(block);
        let lines: Vec<_> = f.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].raw, b"ETag: \"a\"\r\n");
        assert_eq!(lines[2].value, b"public");
        // A vertical tab is not whitespace in HTTP.
        assert_eq!(lines[3].value, b"\x0bv");
        assert_eq!(f.get("etag"), Some("\"a\""));
        assert_eq!(
            f.joined("CACHE-CONTROL").as_deref(),
            Some("max-age=5, public")
        );
        assert_eq!(f.joined("vary"), None);
        let raw: Vec<u8> = f.lines().flat_map(|l| l.raw.iter().copied()).collect();
        assert_eq!(raw, block, "raw lines rebuild the block exactly");
    }

    #[test]
    fn hostile_lines_match_nothing_they_should_not() {
        // A name that is not UTF-8, a line without a colon, an empty value, a bare LF.
        let block = b"\xffETag: x\r\nnocolon\r\nEmpty:\r\n\r\nLast-Modified: y\n";
        let f = StoredFields(block);
        assert_eq!(f.get("etag"), None);
        assert_eq!(f.get("nocolon"), Some(""));
        assert_eq!(f.get("empty"), Some(""));
        assert_eq!(f.get("last-modified"), Some("y"));
        assert_eq!(f.lines().count(), 4);
        // A value that is not UTF-8 is skipped by get, not mangled.
        let f = StoredFields(b"ETag: \xff\r\nETag: ok\r\n");
        assert_eq!(f.get("etag"), Some("ok"));
        assert_eq!(f.joined("etag").as_deref(), Some("ok"));
    }
}

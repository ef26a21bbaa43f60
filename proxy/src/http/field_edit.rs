//! Edits of a response head's fields that the rules ask for (`response_headers`), made where
//! every head is finished ([`super::head::Head::end`]), so hits, misses and the proxy's own
//! answers get them alike, and a hit's body still goes by sendfile: only the head, which is
//! written per response anyway, changes. The stored entry is never touched.

/// What an edit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Remove every line of the name.
    Remove,
    /// Remove every line of the name, then add this one.
    Set,
    /// Add a line.
    Append,
}

/// A list of field edits, their names and values in one buffer that a connection reuses: a
/// request's edits cost no allocation once it has grown, and nothing is shared (no reference
/// count bounced between the workers' caches).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FieldEdits {
    /// Text, not bytes: names are tokens and values come from templates (text from the config,
    /// the request's host and path), so no name is checked again each time it is read.
    text: String,
    /// (what, where the name starts, where the value starts, where it ends) in `text`.
    edits: Vec<(Op, u32, u32, u32)>,
}

impl FieldEdits {
    /// Empties it (keeping its room).
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.edits.clear();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Adds an edit of `name`, its value written by `value`; one whose value holds a CR, LF or
    /// NUL is left out. Returns whether it was added.
    pub(crate) fn push(&mut self, op: Op, name: &str, value: impl FnOnce(&mut String)) -> bool {
        let start = self.text.len();
        self.text.push_str(name);
        let at = self.text.len();
        value(&mut self.text);
        if self.text[at..].contains(['\r', '\n', '\0']) {
            self.text.truncate(start);
            return false;
        }
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        self.edits.push((op, n(start), n(at), n(self.text.len())));
        true
    }

    /// The edits in order: what, the name, the value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Op, &str, &[u8])> {
        self.edits.iter().map(|&(op, a, b, c)| {
            let t = &self.text;
            (
                op,
                &t[a as usize..b as usize],
                &t.as_bytes()[b as usize..c as usize],
            )
        })
    }
}

impl super::head::HeadBuf {
    /// Makes the rules' edits, unless the head is an interim (1xx) one.
    pub(super) fn edit(&mut self) {
        if self.edits.is_empty() {
            return;
        }
        let interim = match &self.h2 {
            Some(h) => h.status < 200,
            None => self.wire.get(9) == Some(&b'1'),
        };
        if interim {
            return;
        }
        let edits = std::mem::take(&mut self.edits);
        if self.h2.is_none() {
            // One pass over the head drops every line a Remove or Set names; then the lines
            // added, as if each edit had run in turn (a later Remove or Set of the name drops
            // an earlier edit's line).
            // The names a line goes for, on the stack for the usual few.
            let (mut few, mut many): ([&[u8]; 8], Vec<&[u8]>) = ([&[]; 8], Vec::new());
            let mut n = 0;
            for (_, name, _) in edits.iter().filter(|(op, _, _)| *op != Op::Append) {
                if n < few.len() {
                    few[n] = name.as_bytes();
                } else {
                    if many.is_empty() {
                        many.extend_from_slice(&few);
                    }
                    many.push(name.as_bytes());
                }
                n += 1;
            }
            remove_named_lines(
                &mut self.wire,
                if n <= few.len() { &few[..n] } else { &many },
            );
            for (i, (op, name, value)) in edits.iter().enumerate() {
                let superseded = edits
                    .iter()
                    .skip(i + 1)
                    .any(|(later, n, _)| later != Op::Append && n.eq_ignore_ascii_case(name));
                if op != Op::Remove && !superseded {
                    self.put(name, value);
                }
            }
            self.edits = edits;
            return;
        }
        for (op, name, value) in edits.iter() {
            if op != Op::Append
                && let Some(h) = &mut self.h2
            {
                let name = name.to_ascii_lowercase();
                for v in h.fields.get_all(name.as_str()) {
                    h.size -= name.len() + v.len() + 4;
                }
                h.fields.remove(name.as_str());
            }
            if op != Op::Remove {
                self.put(name, value);
            }
        }
        self.edits = edits;
    }
}

/// Removes the lines named `name` from an HTTP/1.1 head being written (status line and field
/// lines, no blank line yet); returns the bytes removed.
#[cfg(test)]
pub(crate) fn remove_lines(wire: &mut Vec<u8>, name: &str) -> usize {
    remove_named_lines(wire, &[name.as_bytes()])
}

/// Removes, in one pass, the field lines of an HTTP/1.1 head being written named by any of
/// `names` (any case; never the status line); returns the bytes removed.
///
/// Every response a rule edits goes through here, and usually nothing is removed (a `set` names
/// a field the head lacks): one search finds the line ends of the whole head, a line is
/// one of a name's when the byte after the name's length is its `:` (so most lines cost one
/// comparison a name), and the head is rewritten only from the first line that goes.
pub(crate) fn remove_named_lines(wire: &mut Vec<u8>, names: &[&[u8]]) -> usize {
    let len = wire.len();
    let Some(first) = memchr::memchr(b'\n', wire) else {
        return 0;
    };
    let named = |line: &[u8]| {
        names
            .iter()
            .any(|n| line.get(n.len()) == Some(&b':') && line[..n.len()].eq_ignore_ascii_case(n))
    };
    let mut start = first + 1;
    // Where the kept lines end once one has gone (nothing is moved before).
    let mut write: Option<usize> = None;
    let mut moves: Vec<(usize, usize)> = Vec::new();
    // One vector search over the whole head for its line ends: a search per line, or a plain
    // or word-at-a-time scan, each cost more (callgrind: 1,450, 1,500 and 1,200 instructions a
    // head, against 900).
    let from = start;
    let ends = memchr::memchr_iter(b'\n', &wire[from..]).map(|i| from + i + 1);
    for end in ends.chain(std::iter::once(len)) {
        if end <= start {
            continue;
        }
        if named(&wire[start..end]) {
            write.get_or_insert(start);
        } else if write.is_some() {
            moves.push((start, end));
        }
        start = end;
    }
    let Some(mut w) = write else {
        return 0;
    };
    for (a, b) in moves {
        wire.copy_within(a..b, w);
        w += b - a;
    }
    wire.truncate(w);
    len - w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_with_a_line_break_is_left_out_and_the_rest_kept() {
        let mut e = FieldEdits::default();
        assert!(e.push(Op::Set, "X-A", |v| v.push('1')));
        assert!(!e.push(Op::Append, "X-B", |v| { v.push_str("a\r\nSet-Cookie: s") }));
        assert!(e.push(Op::Remove, "Server", |_| {}));
        let got: Vec<_> = e.iter().collect();
        assert_eq!(
            got,
            vec![
                (Op::Set, "X-A", &b"1"[..]),
                (Op::Remove, "Server", &b""[..])
            ]
        );
        e.clear();
        assert!(e.is_empty());
    }

    #[test]
    fn edits_read_in_turn_whoever_wrote_the_line() {
        use super::super::head::{Head, HeadBuf};
        let mut e = FieldEdits::default();
        e.push(Op::Append, "X-A", |v| v.push('1'));
        e.push(Op::Set, "x-a", |v| v.push('2'));
        e.push(Op::Append, "X-B", |v| v.push('3'));
        e.push(Op::Remove, "Server", |_| {});
        e.push(Op::Append, "X-A", |v| v.push('4'));
        for h2 in [false, true] {
            let mut buf = if h2 { HeadBuf::h2() } else { HeadBuf::h1(256) };
            buf.edits = e.clone();
            let mut h = Head::new(&mut buf, 200, "OK");
            h.field("Server", b"origin")
                .field("X-A", b"0")
                .field("Via", b"1.1 o");
            h.end(false);
            let got: Vec<(String, String)> = match buf.take_h2() {
                Some(h) => h
                    .fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                    .collect(),
                None => String::from_utf8_lossy(buf.wire())
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(": "))
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                    .collect(),
            };
            let want: Vec<(String, String)> =
                [("via", "1.1 o"), ("x-a", "2"), ("x-b", "3"), ("x-a", "4")]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
            let (mut got, mut want) = (got, want);
            if h2 {
                // A HeaderMap groups a name's values; the order within a name is kept.
                got.sort_by(|a, b| a.0.cmp(&b.0));
                want.sort_by(|a, b| a.0.cmp(&b.0));
            }
            assert_eq!(got, want, "h2: {h2}");
        }
    }

    #[test]
    fn lines_of_a_name_go_and_nothing_else() {
        let mut w =
            b"HTTP/1.1 200 OK\r\nServer: a\r\nX-Server: b\r\nserver: c\r\nServerX: d\r\n".to_vec();
        assert_eq!(remove_lines(&mut w, "Server"), 22);
        assert_eq!(w, b"HTTP/1.1 200 OK\r\nX-Server: b\r\nServerX: d\r\n");
        assert_eq!(remove_lines(&mut w, "Absent"), 0);
        // The status line is never a field, whatever it says.
        let mut w = b"HTTP/1.1 200 Server: x\r\n".to_vec();
        assert_eq!(remove_lines(&mut w, "HTTP/1.1 200 Server"), 0);
        // The first field line, the last, one without its line end yet, and a run of them.
        let head = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nA: 3\r\nA: 4\r\nC: 5\r\nA: 6";
        let mut w = head.to_vec();
        assert_eq!(remove_lines(&mut w, "a"), 22);
        assert_eq!(w, b"HTTP/1.1 200 OK\r\nB: 2\r\nC: 5\r\n");
        let mut w = head.to_vec();
        assert_eq!(remove_lines(&mut w, "C"), 6);
        assert_eq!(
            w,
            b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nA: 3\r\nA: 4\r\nA: 6"
        );
        // A line without a colon is no field of any name.
        let mut w = b"HTTP/1.1 200 OK\r\nA\r\nA: 1\r\n".to_vec();
        assert_eq!(remove_lines(&mut w, "A"), 6);
        assert_eq!(w, b"HTTP/1.1 200 OK\r\nA\r\n");
    }
}

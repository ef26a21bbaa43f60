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
    /// the request's host and path), so no name is checked again each time it is read. Each
    /// edit is an HTTP/1.1 field line, `name: value\r\n`, which an HTTP/1.1 head copies whole.
    text: String,
    /// (what, where its line starts, where its name ends, where its line ends) in `text`, and
    /// the name's [`name_bits`].
    edits: Vec<(Op, u32, u32, u32, u128)>,
    /// Two edits may name one field (their names' bits are the same): a later one may then
    /// undo an earlier one's line.
    repeats: bool,
}

impl FieldEdits {
    /// Empties it (keeping its room).
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.edits.clear();
        self.repeats = false;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Adds an edit of `name`, its value written by `value`; one whose value holds a CR, LF or
    /// NUL is left out (looked for when `check`: a value made of the config's text alone was
    /// checked when it was read). Returns whether it was added.
    #[cfg(test)]
    pub(crate) fn push(
        &mut self,
        op: Op,
        name: &str,
        check: bool,
        value: impl FnOnce(&mut String),
    ) -> bool {
        self.push_named(op, (name, name_bits(name.as_bytes())), check, value)
    }

    /// [`FieldEdits::push`] with the name's [`name_bits`] found before (when the config was
    /// read).
    pub(crate) fn push_named(
        &mut self,
        op: Op,
        (name, bits): (&str, u128),
        check: bool,
        value: impl FnOnce(&mut String),
    ) -> bool {
        debug_assert_eq!(bits, name_bits(name.as_bytes()));
        let start = self.text.len();
        self.text.push_str(name);
        self.text.push_str(": ");
        let at = self.text.len();
        value(&mut self.text);
        if check
            && self.text.as_bytes()[at..]
                .iter()
                .any(|&b| matches!(b, b'\r' | b'\n' | 0))
        {
            self.text.truncate(start);
            return false;
        }
        debug_assert!(!self.text[at..].contains(['\r', '\n', '\0']));
        self.text.push_str("\r\n");
        self.record(op, start, name.len(), bits);
        true
    }

    /// Adds an edit whose whole line (`name: value\r\n`, its name `name_len` bytes) was made
    /// and checked when the config was read.
    pub(crate) fn push_line(&mut self, op: Op, line: &str, name_len: usize, bits: u128) {
        debug_assert!(line.ends_with("\r\n") && line[name_len..].starts_with(": "));
        debug_assert!(!line[..line.len() - 2].contains(['\r', '\n', '\0']));
        let start = self.text.len();
        self.text.push_str(line);
        self.record(op, start, name_len, bits);
    }

    /// Adds `other`'s edits after these (a rule's edits made once, when the config was read).
    pub(crate) fn extend(&mut self, other: &FieldEdits) {
        if self.edits.is_empty() {
            // The first rule's: a copy.
            self.text.clear();
            self.text.push_str(&other.text);
            self.edits.extend_from_slice(&other.edits);
            self.repeats = other.repeats;
            return;
        }
        self.repeats |= other.repeats
            || other
                .edits
                .iter()
                .any(|o| self.edits.iter().any(|e| e.4 == o.4));
        let at = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.text.push_str(&other.text);
        self.edits.extend(
            other
                .edits
                .iter()
                .map(|&(op, a, b, c, bits)| (op, a + at, b + at, c + at, bits)),
        );
    }

    fn record(&mut self, op: Op, start: usize, name_len: usize, bits: u128) {
        self.repeats |= self.edits.iter().any(|e| e.4 == bits);
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        self.edits
            .push((op, n(start), n(start + name_len), n(self.text.len()), bits));
    }

    /// The edits in order: what, the name, the value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Op, &str, &[u8])> {
        self.edits.iter().map(|&(op, a, b, c, _)| {
            let t = &self.text;
            (
                op,
                &t[a as usize..b as usize],
                &t.as_bytes()[b as usize + 2..c as usize - 2],
            )
        })
    }
}

impl FieldEdits {
    /// Whether an edit removes lines (`Set`, `Remove`), and whether one that does may name a
    /// field of the set `names` (see [`names_of`]).
    fn removals(&self, names: u128) -> (bool, bool) {
        let (mut removes, mut may) = (false, false);
        for &(op, .., bits) in &self.edits {
            if op != Op::Append {
                removes = true;
                may |= names & bits == bits;
            }
        }
        (removes, may)
    }

    /// Whether a later edit than the `i`th removes its name's lines (`Set`, `Remove`).
    fn superseded(&self, i: usize) -> bool {
        if !self.repeats {
            return false;
        }
        let (_, a, b, _, bits) = self.edits[i];
        let name = &self.text.as_bytes()[a as usize..b as usize];
        self.edits[i + 1..].iter().any(|&(op, c, d, _, other)| {
            op != Op::Append
                && other == bits
                && self.text.as_bytes()[c as usize..d as usize].eq_ignore_ascii_case(name)
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
        if self.h2.is_none() {
            let super::head::HeadBuf {
                wire, edits, named, ..
            } = self;
            edit_h1(wire, *named, edits);
            return;
        }
        let edits = std::mem::take(&mut self.edits);
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

/// [`HeadBuf::edit`] of an HTTP/1.1 head, `wire`: one pass over the head drops every line a Remove
/// or Set names; then the lines added, as if each edit had run in turn (a later Remove or
/// Set of the name drops an earlier edit's line). Lines whose names are known not to be
/// among those (`HeadBuf::named`: an entry's stored fields and the proxy's own, usually; what a
/// rule sets is seldom what the origin sent) are not looked at.
fn edit_h1(wire: &mut Vec<u8>, (known, names): (usize, u128), edits: &FieldEdits) {
    let (removes, may) = edits.removals(names);
    if removes && (may || known < wire.len()) {
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
            wire,
            if n <= few.len() { &few[..n] } else { &many },
            if may { 0 } else { known },
        );
    }
    if !edits.repeats && !edits.edits.iter().any(|e| e.0 == Op::Remove) {
        // Every edit adds its line, in order: the text is those lines.
        wire.extend_from_slice(edits.text.as_bytes());
        return;
    }
    for (i, &(op, a, _, c, _)) in edits.edits.iter().enumerate() {
        if op != Op::Remove && !edits.superseded(i) {
            wire.extend_from_slice(&edits.text.as_bytes()[a as usize..c as usize]);
        }
    }
}

/// Removes the lines named `name` from an HTTP/1.1 head being written (status line and field
/// lines, no blank line yet); returns the bytes removed.
#[cfg(test)]
pub(crate) fn remove_lines(wire: &mut Vec<u8>, name: &str) -> usize {
    remove_named_lines(wire, &[name.as_bytes()], 0)
}

/// A field name's two bits in a 128-bit set of names (a Bloom filter; any case: a name and its
/// upper-case spelling have the same bits): a set that lacks either does not hold the name. With
/// a head's dozen names, about one name in fifty that a head lacks still looks held.
pub(crate) const fn name_bits(name: &[u8]) -> u128 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < name.len() {
        h = (h ^ (name[i] | 0x20) as u64).wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h ^= h >> 29;
    (1u128 << (h & 127)) | (1u128 << ((h >> 7) & 127))
}

/// The set of the field names in `lines` (a head's field lines, or a status line and its field
/// lines: a line without a `:` names nothing), [`name_bits`] each.
pub(crate) fn names_of(lines: &[u8]) -> u128 {
    lines
        .split(|&b| b == b'\n')
        .filter_map(|line| memchr::memchr(b':', line).map(|i| name_bits(&line[..i])))
        .fold(0, |set, bits| set | bits)
}

/// Removes, in one pass, the field lines of an HTTP/1.1 head being written named by any of
/// `names` (any case; never the status line), looking at none before byte `skip` (a line
/// boundary, or 0); returns the bytes removed.
///
/// Every response a rule edits goes through here, and usually nothing is removed (a `set` names
/// a field the head lacks): one search finds the line ends of the whole head, a line is
/// one of a name's when the byte after the name's length is its `:` (so most lines cost one
/// comparison a name), and the head is rewritten only from the first line that goes.
pub(crate) fn remove_named_lines(wire: &mut Vec<u8>, names: &[&[u8]], skip: usize) -> usize {
    let len = wire.len();
    let Some(first) = memchr::memchr(b'\n', wire) else {
        return 0;
    };
    let first = first.max(skip.saturating_sub(1));
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
    fn a_resumed_head_is_looked_at_only_past_the_names_it_lacks() {
        use super::super::head::{Head, HeadBuf};
        let stored =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nETag: \"a\"\r\nContent-Length: 3\r\n";
        let names = names_of(stored);
        let held = |n: &str| names & name_bits(n.as_bytes()) == name_bits(n.as_bytes());
        for n in [
            "content-type",
            "CONTENT-TYPE",
            "ETag",
            "etag",
            "Content-Length",
        ] {
            assert!(held(n), "{n}");
        }
        assert_eq!(
            name_bits(b"Strict-Transport-Security"),
            name_bits(b"strict-transport-security")
        );
        for n in [
            "Strict-Transport-Security",
            "X-Edge",
            "X-Cache",
            "Age",
            "Via",
            "Server",
        ] {
            assert!(!held(n), "{n} looks held");
        }
        let run = |edits: &[(Op, &str)], names: u128| {
            let mut buf = HeadBuf::h1(256);
            for (op, n) in edits {
                buf.edits.push(*op, n, false, |v| v.push('1'));
            }
            let mut h = Head::resume_named(&mut buf, stored, names);
            h.field("X-Cache", b"HIT");
            h.end(false);
            String::from_utf8_lossy(buf.wire()).into_owned()
        };
        // A name the stored lines hold is removed from them; one they lack, from what follows.
        assert_eq!(
            run(&[(Op::Set, "content-type"), (Op::Remove, "x-cache")], names),
            "HTTP/1.1 200 OK\r\nETag: \"a\"\r\nContent-Length: 3\r\ncontent-type: 1\r\n\r\n"
        );
        assert_eq!(
            run(&[(Op::Set, "X-Edge")], names),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nETag: \"a\"\r\nContent-Length: 3\r\nX-Cache: HIT\r\nX-Edge: 1\r\n\r\n"
        );
        // The set is what spares the look: a wrong one (empty) would leave a stored line, which
        // is why it is only ever found from the lines themselves.
        assert_eq!(
            run(&[(Op::Set, "etag"), (Op::Append, "X-Edge")], names),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nX-Cache: HIT\r\netag: 1\r\nX-Edge: 1\r\n\r\n"
        );
        assert!(run(&[(Op::Remove, "ETag")], 0).contains("ETag"));
        assert!(!run(&[(Op::Remove, "ETag")], names).contains("ETag"));
    }

    #[test]
    fn an_edit_with_a_line_break_is_left_out_and_the_rest_kept() {
        let mut e = FieldEdits::default();
        assert!(e.push(Op::Set, "X-A", true, |v| v.push('1')));
        assert!(!e.push(Op::Append, "X-B", true, |v| {
            v.push_str("a\r\nSet-Cookie: s")
        }));
        assert!(e.push(Op::Remove, "Server", true, |_| {}));
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
        e.push(Op::Append, "X-A", true, |v| v.push('1'));
        e.push(Op::Set, "x-a", true, |v| v.push('2'));
        e.push(Op::Append, "X-B", true, |v| v.push('3'));
        e.push(Op::Remove, "Server", true, |_| {});
        e.push(Op::Append, "X-A", true, |v| v.push('4'));
        // Made in two parts (two rules' edits, each made once) and joined, they are the same
        // edits; and a name two parts share is seen to repeat.
        let mut a = FieldEdits::default();
        a.push(Op::Append, "X-A", true, |v| v.push('1'));
        a.push(Op::Set, "x-a", true, |v| v.push('2'));
        let mut b = FieldEdits::default();
        b.push(Op::Append, "X-B", true, |v| v.push('3'));
        b.push(Op::Remove, "Server", true, |_| {});
        b.push(Op::Append, "X-A", true, |v| v.push('4'));
        let mut joined = FieldEdits::default();
        joined.extend(&a);
        joined.extend(&b);
        assert_eq!(joined, e);
        let (mut c, mut d) = (FieldEdits::default(), FieldEdits::default());
        c.push(Op::Append, "X-C", true, |v| v.push('1'));
        d.push(Op::Set, "x-c", true, |v| v.push('2'));
        assert!(!c.repeats && !d.repeats);
        c.extend(&d);
        assert!(c.repeats);
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

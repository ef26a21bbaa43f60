//! An incremental decoder for the chunked transfer coding (RFC 9112 §7.1), for upstream response
//! bodies and client request bodies. It never trusts a size line: the grammar is exact, because a
//! decoder more lenient than the peer behind the proxy is a request-smuggling gap. A chunk size is
//! `1*HEXDIG` (no sign, no `0x`, no spaces before it), then optional SP/HTAB only before `;`
//! extensions; every line ends in CRLF (a bare CR or LF is an error); trailer lines are
//! `field-name ":" value`. Sizes that overflow, missing CRLFs and over-long lines are errors, not
//! guesses.

use super::framing::{is_ows, is_tchar};
use bytes::{Buf, BytesMut};

/// Longest chunk-size line (with extensions) or trailer line accepted.
const MAX_LINE: usize = 4096;

/// Decoder state between calls.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: State,
    remaining: u64,
    /// Bytes of trailer lines so far: they are discarded, so only this bound keeps a peer from
    /// sending them forever.
    trailer_bytes: usize,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum State {
    #[default]
    Size,
    Data,
    DataEnd,
    Trailer,
    Done,
}

/// A chunked body that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked encoding: {0}")]
pub struct ChunkError(pub &'static str);

impl ChunkedDecoder {
    /// Consumes what it can of `buf`, appending body bytes to `out`. Returns `Ok(true)` once the
    /// last chunk and the trailer section are consumed; bytes after that stay in `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, ChunkError> {
        loop {
            match self.state {
                State::Done => return Ok(true),
                State::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(false);
                    };
                    self.remaining = chunk_size(&line)?;
                    self.state = if self.remaining == 0 {
                        State::Trailer
                    } else {
                        State::Data
                    };
                }
                State::Data => {
                    if buf.is_empty() {
                        return Ok(false);
                    }
                    let n = usize::try_from(self.remaining)
                        .unwrap_or(usize::MAX)
                        .min(buf.len());
                    out.extend_from_slice(&buf[..n]);
                    buf.advance(n);
                    self.remaining -= n as u64;
                    if self.remaining == 0 {
                        self.state = State::DataEnd;
                    }
                }
                State::DataEnd => {
                    if buf.first().is_some_and(|b| *b != b'\r')
                        || buf.get(1).is_some_and(|b| *b != b'\n')
                    {
                        return Err(ChunkError("missing CRLF after chunk data"));
                    }
                    if buf.len() < 2 {
                        return Ok(false);
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailer => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(false);
                    };
                    if line.is_empty() {
                        self.state = State::Done;
                    } else {
                        self.trailer_bytes += line.len() + 2;
                        if self.trailer_bytes > MAX_TRAILER {
                            return Err(ChunkError("trailer section too large"));
                        }
                        check_trailer_field(&line)?;
                    }
                }
            }
        }
    }

    /// True once the whole body has been decoded (the fuzz target's end-of-body property).
    #[cfg(feature = "fuzzing")]
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }
}

/// Largest trailer section accepted, as for a request head's fields.
const MAX_TRAILER: usize = 16 * 1024;

/// Most hex digits in a chunk size: 16 fill a `u64`, so no size can overflow.
const MAX_SIZE_DIGITS: usize = 16;

/// The size of a chunk-size line (without its CRLF): `1*HEXDIG [ BWS ";" chunk-ext ]`.
fn chunk_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError("chunk size is not 1*HEXDIG"));
    }
    if digits > MAX_SIZE_DIGITS {
        return Err(ChunkError("chunk size too large"));
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        size = (size << 4) | u64::from(d);
    }
    let rest = &line[digits..];
    let ws = rest.iter().take_while(|b| is_ows(**b)).count();
    match rest.get(ws) {
        None if ws == 0 => Ok(size),
        Some(b';') => {
            // chunk-ext: visible ASCII, SP, HTAB, obs-text; never CR, LF or other controls.
            if rest[ws + 1..]
                .iter()
                .all(|b| is_ows(*b) || b.is_ascii_graphic() || *b >= 0x80)
            {
                Ok(size)
            } else {
                Err(ChunkError("invalid chunk extension"))
            }
        }
        _ => Err(ChunkError("invalid chunk-size line")),
    }
}

/// A trailer line must be `field-name ":" field-value` (RFC 9112 §7.1.2, §5): a token, directly a
/// colon, then visible ASCII, SP, HTAB or obs-text. No obs-fold, no whitespace before the colon.
fn check_trailer_field(line: &[u8]) -> Result<(), ChunkError> {
    let name = line.iter().take_while(|b| is_tchar(**b)).count();
    if name == 0 || line.get(name) != Some(&b':') {
        return Err(ChunkError("invalid trailer field"));
    }
    if line[name + 1..]
        .iter()
        .all(|b| is_ows(*b) || b.is_ascii_graphic() || *b >= 0x80)
    {
        Ok(())
    } else {
        Err(ChunkError("invalid trailer field value"))
    }
}

/// Takes one CRLF-terminated line (without the CRLF), or `None` if incomplete. A bare CR or LF is
/// an error, and so is a line longer than [`MAX_LINE`], however the bytes arrived.
fn take_line(buf: &mut BytesMut) -> Result<Option<Vec<u8>>, ChunkError> {
    let window = &buf[..buf.len().min(MAX_LINE + 2)];
    match window.iter().position(|b| *b == b'\r' || *b == b'\n') {
        Some(p) if buf[p] == b'\n' => Err(ChunkError("bare LF")),
        Some(p) if p > MAX_LINE => Err(ChunkError("line too long")),
        Some(p) => match buf.get(p + 1) {
            Some(b'\n') => {
                let line = buf[..p].to_vec();
                buf.advance(p + 2);
                Ok(Some(line))
            }
            Some(_) => Err(ChunkError("bare CR")),
            None => Ok(None),
        },
        None if buf.len() > MAX_LINE => Err(ChunkError("line too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_endless_trailer_section_is_an_error() {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut buf = BytesMut::from(&b"0\r\n"[..]);
        assert_eq!(d.decode(&mut buf, &mut out), Ok(false));
        let mut failed = None;
        for i in 0..2000 {
            buf.extend_from_slice(format!("X-T{i}: {}\r\n", "v".repeat(20)).as_bytes());
            if let Err(e) = d.decode(&mut buf, &mut out) {
                failed = Some((i, e));
                break;
            }
        }
        let (at, e) = failed.expect("bounded");
        assert_eq!(e, ChunkError("trailer section too large"));
        assert!(at < 700, "{at}");
    }
    use super::*;

    #[test]
    fn decodes_across_arbitrary_splits() {
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for split in 0..wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut out = Vec::new();
            let mut buf = BytesMut::from(&wire[..split]);
            let mut done = d.decode(&mut buf, &mut out).expect("first half");
            buf.extend_from_slice(&wire[split..]);
            if !done {
                done = d.decode(&mut buf, &mut out).expect("second half");
            }
            assert!(done, "split {split}");
            assert_eq!(out, b"hello world");
            assert_eq!(&buf[..], b"NEXT");
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"ffffffffffffffffff\r\n"] {
            let mut d = ChunkedDecoder::default();
            let mut out = Vec::new();
            assert!(
                d.decode(&mut BytesMut::from(bad), &mut out).is_err(),
                "{bad:?}"
            );
        }
    }

    /// Decodes `wire` in one piece and byte by byte; both must agree. Returns the body and the
    /// bytes left after it, or the error.
    fn decode_all(wire: &[u8]) -> Result<(Vec<u8>, Vec<u8>), ChunkError> {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut buf = BytesMut::from(wire);
        let whole = match d.decode(&mut buf, &mut out) {
            Ok(true) => Ok((out, buf.to_vec())),
            Ok(false) => Err(ChunkError("incomplete")),
            Err(e) => Err(e),
        };
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut buf = BytesMut::new();
        let mut bytewise = Err(ChunkError("incomplete"));
        for b in wire {
            buf.extend_from_slice(&[*b]);
            match d.decode(&mut buf, &mut out) {
                Ok(true) => {
                    bytewise = Ok((std::mem::take(&mut out), buf.to_vec()));
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    bytewise = Err(e);
                    break;
                }
            }
        }
        if let (Ok((body, _)), Ok((bytewise_body, _))) = (&whole, &bytewise) {
            assert_eq!(body, bytewise_body, "{wire:?}");
        } else {
            assert_eq!(whole.is_ok(), bytewise.is_ok(), "{wire:?}");
        }
        whole
    }

    #[test]
    fn chunk_size_lines_are_exact() {
        // Friendly: leading zeros, BWS before extensions, tab, quoted extension values.
        for good in [
            &b"005\r\nhello\r\n0\r\n\r\n"[..],
            b"5 ;ext\r\nhello\r\n0\r\n\r\n",
            b"5\t;a=b\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"q\"\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"q d\"\r\nhello\r\n000 ; last\r\n\r\n",
            b"5;\xc2\xa0\r\nhello\r\n0\r\n\r\n",
            b"0000000000000005\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: a b\r\nX-U:\r\n\r\n",
        ] {
            assert_eq!(
                decode_all(good),
                Ok((b"hello".to_vec(), Vec::new())),
                "{:?}",
                String::from_utf8_lossy(good)
            );
        }
        assert_eq!(
            decode_all(b"A\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\nrest"),
            Ok((b"0123456789abcdefghij".to_vec(), b"rest".to_vec()))
        );
        // Hostile: signs, prefixes, spaces other than BWS-before-`;`, Unicode spaces, bare CR/LF.
        for bad in [
            &b"+5\r\nhello\r\n0\r\n\r\n"[..],
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"\t5\r\nhello\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"5\xc2\xa0\r\nhello\r\n0\r\n\r\n",
            b"\xc2\xa05\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"\r\nhello\r\n0\r\n\r\n",
            b";ext\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"5,5\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5;a\x00b\r\nhello\r\n0\r\n\r\n",
            b"5;a\x7f\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\rhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\r\n0\r\n\r\n",
            b"00000000000000005\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
        ] {
            assert!(
                decode_all(bad).is_err(),
                "{:?} decoded as {:?}",
                String::from_utf8_lossy(bad),
                decode_all(bad)
            );
        }
        assert_eq!(
            decode_all(b"+5\r\nhello\r\n0\r\n\r\n"),
            Err(ChunkError("chunk size is not 1*HEXDIG"))
        );
        assert_eq!(
            decode_all(b"5\xc2\xa0\r\nhello\r\n0\r\n\r\n"),
            Err(ChunkError("invalid chunk-size line"))
        );
        assert_eq!(
            decode_all(b"5;a\rb\r\nhello\r\n0\r\n\r\n"),
            Err(ChunkError("bare CR"))
        );
        assert_eq!(
            decode_all(b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
            Err(ChunkError("bare LF"))
        );
        assert_eq!(
            decode_all(b"5;a\x00b\r\nhello\r\n0\r\n\r\n"),
            Err(ChunkError("invalid chunk extension"))
        );
        assert_eq!(
            decode_all(b"ffffffffffffffff\r\n"),
            Err(ChunkError("incomplete")),
            "16 hex digits is the largest legal size"
        );
    }

    #[test]
    fn trailer_lines_are_fields() {
        assert_eq!(
            decode_all(b"5\r\nhello\r\n0\r\nX-Sum: 1\r\nY:2\r\n\r\nNEXT"),
            Ok((b"hello".to_vec(), b"NEXT".to_vec()))
        );
        for bad in [
            &b"5\r\nhello\r\n0\r\nNoColon\r\n\r\n"[..],
            b"5\r\nhello\r\n0\r\nX-Sum: 1\n\r\n",
            b"5\r\nhello\r\n0\r\nX-Sum: 1\r\n\n",
            b"5\r\nhello\r\n0\r\nX-Sum: 1\rX: 2\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-Sum : 1\r\n\r\n",
            b"5\r\nhello\r\n0\r\n: 1\r\n\r\n",
            b"5\r\nhello\r\n0\r\n X-Sum: 1\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-Sum: 1\r\n continued\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-Sum: a\x00b\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX\xc2\xa0: 1\r\n\r\n",
        ] {
            assert!(
                decode_all(bad).is_err(),
                "{:?} decoded as {:?}",
                String::from_utf8_lossy(bad),
                decode_all(bad)
            );
        }
        assert_eq!(
            decode_all(b"5\r\nhello\r\n0\r\nNoColon\r\n\r\n"),
            Err(ChunkError("invalid trailer field"))
        );
        assert_eq!(
            decode_all(b"5\r\nhello\r\n0\r\nX-Sum: 1\n\r\n"),
            Err(ChunkError("bare LF"))
        );
    }

    #[test]
    fn line_limit_holds_however_the_bytes_arrive() {
        let mut at_limit = b"5;".to_vec();
        at_limit.resize(MAX_LINE, b'x');
        at_limit.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert_eq!(decode_all(&at_limit), Ok((b"hello".to_vec(), Vec::new())));
        let mut over = b"5;".to_vec();
        over.resize(MAX_LINE + 1, b'x');
        over.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert_eq!(decode_all(&over), Err(ChunkError("line too long")));
        let mut unterminated = b"5;".to_vec();
        unterminated.resize(MAX_LINE + 1, b'x');
        assert_eq!(decode_all(&unterminated), Err(ChunkError("line too long")));
    }
}

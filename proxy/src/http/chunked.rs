//! An incremental decoder for the chunked transfer coding (RFC 9112 §7.1), for upstream response
//! bodies and client request bodies. It never trusts a size line: sizes that overflow, missing
//! CRLFs and over-long lines are errors, not guesses.

use bytes::{Buf, BytesMut};

/// Longest chunk-size line (with extensions) or trailer line accepted.
const MAX_LINE: usize = 4096;

/// Decoder state between calls.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: State,
    remaining: u64,
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
                    let size = line.split(|b| *b == b';').next().unwrap_or(&[]);
                    let size = std::str::from_utf8(size)
                        .map_err(|_| ChunkError("size"))?
                        .trim();
                    if size.is_empty() || size.len() > 15 {
                        return Err(ChunkError("chunk size"));
                    }
                    self.remaining =
                        u64::from_str_radix(size, 16).map_err(|_| ChunkError("chunk size"))?;
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
                    let n = (self.remaining as usize).min(buf.len());
                    out.extend_from_slice(&buf[..n]);
                    buf.advance(n);
                    self.remaining -= n as u64;
                    if self.remaining == 0 {
                        self.state = State::DataEnd;
                    }
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(false);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ChunkError("missing CRLF after chunk data"));
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
                    }
                }
            }
        }
    }

    /// True once the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }
}

/// Takes one CRLF-terminated line (without the CRLF), or `None` if incomplete.
fn take_line(buf: &mut BytesMut) -> Result<Option<Vec<u8>>, ChunkError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(p) => {
            let line = buf[..p].to_vec();
            buf.advance(p + 2);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(ChunkError("line too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
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
}

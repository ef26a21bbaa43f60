//! A raw HTTP/2 client for hostile tests: frames written byte by byte (RFC 9113 §4.1) and header
//! blocks as HPACK literals without indexing (RFC 7541 §6.2.2), so a test can send what no
//! well-behaved client library would (upper-case names, CRLF in values, pseudo-header fields out
//! of order, floods), and read back which frames the proxy answered with.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame read back.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The bytes of one frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
fn int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A header block of literal fields without indexing, names and values exactly as given.
pub fn block(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name);
        int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

/// The usual pseudo-header fields of a GET for `path`, then `extra`.
pub fn get(path: &str, extra: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut f: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"GET"),
        (b":scheme", b"http"),
        (b":authority", b"a.example"),
        (b":path", path.as_bytes()),
    ];
    f.extend_from_slice(extra);
    block(&f)
}

/// A prior-knowledge (h2c) connection that has sent the preface and an empty SETTINGS frame
/// (`settings` otherwise: (identifier, value) pairs).
pub struct RawH2 {
    pub sock: TcpStream,
    buf: Vec<u8>,
}

impl RawH2 {
    pub fn connect(addr: SocketAddr, settings: &[(u16, u32)]) -> RawH2 {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        let mut c = RawH2 {
            sock,
            buf: Vec::new(),
        };
        let mut s = Vec::new();
        for (id, v) in settings {
            s.extend_from_slice(&id.to_be_bytes());
            s.extend_from_slice(&v.to_be_bytes());
        }
        let mut first = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        first.extend(frame(SETTINGS, 0, 0, &s));
        c.send(&first);
        c
    }

    /// Writes raw bytes; false once the proxy has closed the connection.
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        self.sock.write_all(bytes).is_ok()
    }

    /// The next frame, acknowledging the proxy's SETTINGS on the way; None on close or after
    /// `wait` with nothing.
    pub fn next(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            if self.buf.len() >= 9 {
                let len = (self.buf[0] as usize) << 16
                    | (self.buf[1] as usize) << 8
                    | self.buf[2] as usize;
                if self.buf.len() >= 9 + len {
                    let f = Frame {
                        kind: self.buf[3],
                        flags: self.buf[4],
                        stream: u32::from_be_bytes([
                            self.buf[5],
                            self.buf[6],
                            self.buf[7],
                            self.buf[8],
                        ]) & 0x7fff_ffff,
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    if f.kind == SETTINGS && f.flags & 1 == 0 {
                        let _ = self.sock.write_all(&frame(SETTINGS, 1, 0, &[]));
                    }
                    return Some(f);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.sock.set_read_timeout(Some(left)).expect("timeout");
            let mut chunk = [0u8; 16384];
            match self.sock.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }

    /// Frames until one on `stream` that answers it (HEADERS or RST_STREAM) or a GOAWAY; None if
    /// the connection closed or `wait` passed first.
    pub fn answer(&mut self, stream: u32, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let f = self.next(left)?;
            if f.kind == GOAWAY || (f.stream == stream && matches!(f.kind, HEADERS | RST_STREAM)) {
                return Some(f);
            }
        }
    }

    /// Every frame until `stream` ends (END_STREAM or RST_STREAM) or a GOAWAY, within `wait`.
    pub fn until_end(&mut self, stream: u32, wait: Duration) -> Vec<Frame> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        while let Some(f) = self.next(deadline.saturating_duration_since(Instant::now())) {
            let ends = f.kind == GOAWAY
                || (f.stream == stream
                    && (f.kind == RST_STREAM
                        || f.flags & END_STREAM != 0 && matches!(f.kind, DATA | HEADERS)));
            out.push(f);
            if ends {
                break;
            }
        }
        out
    }
}

//! A strict HTTP/1.1 client: Content-Length, chunked and close-delimited bodies, interim
//! responses; every way a response can fail is named, so the verdict can say which.

use super::*;

pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) keep: bool,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How an exchange failed.
pub(crate) enum IoFail {
    /// Closed (or reset) before a complete response head.
    BeforeHead(String),
    /// Closed (or reset) mid-body: the status, and the body bytes received so far.
    MidBody(String, u16, Vec<u8>),
    Timeout(String),
    Protocol(String),
}

pub(crate) enum ReadErr {
    Eof,
    Timeout,
    Io(String),
}

pub(crate) struct HttpConn {
    pub(crate) sock: TcpStream,
    pub(crate) buf: Vec<u8>,
    pub(crate) scratch: Vec<u8>,
}

pub(crate) fn crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

impl HttpConn {
    pub(crate) fn connect(addr: SocketAddr) -> std::io::Result<HttpConn> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        sock.set_read_timeout(Some(CLIENT_READ_TIMEOUT))?;
        sock.set_write_timeout(Some(CLIENT_READ_TIMEOUT))?;
        sock.set_nodelay(true)?;
        Ok(HttpConn {
            sock,
            buf: Vec::with_capacity(1 << 18),
            scratch: vec![0; 1 << 18],
        })
    }

    pub(crate) fn fill(&mut self, deadline: Instant) -> Result<(), ReadErr> {
        if Instant::now() > deadline {
            return Err(ReadErr::Timeout);
        }
        match self.sock.read(&mut self.scratch) {
            Ok(0) => Err(ReadErr::Eof),
            Ok(n) => {
                self.buf.extend_from_slice(&self.scratch[..n]);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ReadErr::Timeout)
            }
            Err(e) => Err(ReadErr::Io(e.to_string())),
        }
    }

    /// Sends `req` and reads one response (`head_only`: the request was HEAD).
    pub(crate) fn exchange(&mut self, req: &[u8], head_only: bool) -> Result<Response, IoFail> {
        let started = Instant::now();
        let deadline = started + REQUEST_DEADLINE;
        if let Err(e) = self.sock.write_all(req) {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    IoFail::Timeout("writing the request".into())
                }
                _ => IoFail::BeforeHead(format!("writing the request: {e}")),
            });
        }
        let (status, headers) = loop {
            match parse_head(&self.buf).map_err(IoFail::Protocol)? {
                Some((status, headers, n)) => {
                    self.buf.drain(..n);
                    if (100..200).contains(&status) && status != 101 {
                        continue;
                    }
                    break (status, headers);
                }
                None => self.fill(deadline).map_err(|e| match e {
                    ReadErr::Timeout => IoFail::Timeout(format!(
                        "no response head after {:.1} s",
                        started.elapsed().as_secs_f64()
                    )),
                    ReadErr::Eof => IoFail::BeforeHead("closed before the response".into()),
                    ReadErr::Io(e) => IoFail::BeforeHead(e),
                })?,
            }
        };
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_ascii_lowercase())
        };
        let chunked = find("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let close = find("connection").is_some_and(|v| v.contains("close"));
        let length = match find("content-length") {
            Some(v) => Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| IoFail::Protocol(format!("Content-Length `{v}`")))?,
            ),
            None => None,
        };
        let (body, keep) = if head_only || status == 204 || status == 304 {
            (Vec::new(), !close)
        } else if chunked {
            (self.read_chunked(status, deadline, started)?, !close)
        } else if let Some(n) = length {
            (self.read_length(status, n, deadline, started)?, !close)
        } else {
            (self.read_to_eof(status, deadline, started)?, false)
        };
        Ok(Response {
            status,
            headers,
            body,
            keep,
        })
    }

    pub(crate) fn mid_body(e: ReadErr, status: u16, got: Vec<u8>, started: Instant) -> IoFail {
        match e {
            ReadErr::Timeout => IoFail::Timeout(format!(
                "{status} body stalled at {} bytes after {:.1} s",
                got.len(),
                started.elapsed().as_secs_f64()
            )),
            ReadErr::Eof => IoFail::MidBody(
                format!("{status} closed after {} body bytes", got.len()),
                status,
                got,
            ),
            ReadErr::Io(s) => IoFail::MidBody(
                format!("{status} {s} after {} body bytes", got.len()),
                status,
                got,
            ),
        }
    }

    pub(crate) fn read_length(
        &mut self,
        status: u16,
        n: usize,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        while self.buf.len() < n {
            if let Err(e) = self.fill(deadline) {
                let got = std::mem::take(&mut self.buf);
                return Err(Self::mid_body(e, status, got, started));
            }
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    pub(crate) fn read_to_eof(
        &mut self,
        status: u16,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        loop {
            match self.fill(deadline) {
                Ok(()) => {}
                Err(ReadErr::Eof) => return Ok(std::mem::take(&mut self.buf)),
                Err(e) => {
                    let got = std::mem::take(&mut self.buf);
                    return Err(Self::mid_body(e, status, got, started));
                }
            }
        }
    }

    pub(crate) fn read_chunked(
        &mut self,
        status: u16,
        deadline: Instant,
        started: Instant,
    ) -> Result<Vec<u8>, IoFail> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = crlf(&self.buf) {
                    break p;
                }
                if let Err(e) = self.fill(deadline) {
                    return Err(Self::mid_body(e, status, body, started));
                }
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| IoFail::Protocol(format!("chunk size line `{line}`")))?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                loop {
                    match crlf(&self.buf) {
                        Some(0) => {
                            self.buf.drain(..2);
                            return Ok(body);
                        }
                        Some(p) => {
                            self.buf.drain(..p + 2);
                        }
                        None => {
                            if let Err(e) = self.fill(deadline) {
                                return Err(Self::mid_body(e, status, body, started));
                            }
                        }
                    }
                }
            }
            while self.buf.len() < size + 2 {
                if let Err(e) = self.fill(deadline) {
                    let have = self.buf.len().min(size);
                    body.extend_from_slice(&self.buf[..have]);
                    return Err(Self::mid_body(e, status, body, started));
                }
            }
            body.extend_from_slice(&self.buf[..size]);
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(IoFail::Protocol("chunk not followed by CRLF".into()));
            }
            self.buf.drain(..size + 2);
        }
    }
}

//! A minimal blocking HTTP/1.1 client for the demo's traffic and the benchmark's warm-up checks:
//! keep-alive, Content-Length bodies only (what zerocache and nginx send for cached objects).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One response.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Fetched {
    /// First value of `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A keep-alive connection.
pub struct SimpleClient {
    sock: TcpStream,
    buf: Vec<u8>,
}

impl SimpleClient {
    /// Connects.
    pub fn connect(addr: SocketAddr) -> std::io::Result<SimpleClient> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        sock.set_read_timeout(Some(Duration::from_secs(30)))?;
        sock.set_nodelay(true)?;
        Ok(SimpleClient {
            sock,
            buf: Vec::new(),
        })
    }

    /// GET `path` with `Host: host`; `close` asks the server to close afterwards.
    pub fn get(&mut self, host: &str, path: &str, close: bool) -> std::io::Result<Fetched> {
        self.get_with(host, path, &[], close)
    }

    /// GET `path` with `Host: host` and the `extra` fields (`Range`, ...).
    pub fn get_with(
        &mut self,
        host: &str,
        path: &str,
        extra: &[(&str, &str)],
        close: bool,
    ) -> std::io::Result<Fetched> {
        let conn = if close { "Connection: close\r\n" } else { "" };
        let mut fields = String::new();
        for (k, v) in extra {
            fields.push_str(&format!("{k}: {v}\r\n"));
        }
        self.sock.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{fields}{conn}\r\n").as_bytes(),
        )?;
        let (status, headers, n) = loop {
            if let Ok(Some(head)) = parse_head(&self.buf) {
                break head;
            }
            self.fill()?;
        };
        self.buf.drain(..n);
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while self.buf.len() < len {
            self.fill()?;
        }
        let body = self.buf.drain(..len).collect();
        Ok(Fetched {
            status,
            headers,
            body,
        })
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 65536];
        let n = self.sock.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

/// A response head: status, fields (values decoded lossily), and its length in bytes.
pub type Head = (u16, Vec<(String, String)>, usize);

/// Parses a response head from the start of `buf`: `Ok(None)` while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut h = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut h);
    match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let headers = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            Ok(Some((r.code.unwrap_or(0), headers, n)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(format!("unparseable response head: {e}")),
    }
}

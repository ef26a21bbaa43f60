//! A raw keep-alive HTTP/1.1 client that keeps the exact bytes it received.

use super::Proxy;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use zerocache_origin::body;

/// A response as received.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Bytes of the head (status line through the blank line).
    pub head_len: usize,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// `Cache-Status` without its `ttl` parameter (which moves with the clock).
    pub fn cache_status(&self) -> Option<String> {
        self.header("cache-status").map(|v| {
            v.split("; ")
                .filter(|p| !p.starts_with("ttl="))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    pub fn x_cache(&self) -> &str {
        self.header("x-cache").unwrap_or("")
    }
}

/// A raw keep-alive HTTP/1.1 client.
pub struct Client {
    pub sock: TcpStream,
    buf: Vec<u8>,
    /// The `Host` it sends: `test.example`, or the dashboard's own address (which only answers
    /// to its own names).
    pub host: String,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        sock.set_nodelay(true).expect("nodelay");
        Client {
            sock,
            buf: Vec::new(),
            host: "test.example".into(),
        }
    }

    /// A client for the dashboard at `addr`, sending `Host: addr` as a browser would.
    pub fn connect_dashboard(addr: SocketAddr) -> Client {
        let mut c = Client::connect(addr);
        c.host = addr.to_string();
        c
    }

    /// Sends raw bytes.
    pub fn send(&mut self, raw: &[u8]) {
        self.sock.write_all(raw).expect("send");
    }

    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.send(req.as_bytes());
        self.read_response(method == "HEAD")
    }

    /// Sends a request with a body.
    pub fn send_with_body(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut raw = req.into_bytes();
        raw.extend_from_slice(body);
        self.send(&raw);
        self.read_response(method == "HEAD")
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.request("GET", path, headers)
    }

    fn fill(&mut self) -> usize {
        // Read straight into the buffer's spare capacity: no intermediate copy.
        let len = self.buf.len();
        self.buf.resize(len + 256 * 1024, 0);
        // A signal to the test process (a child's exit) may interrupt a read: read again.
        let n = loop {
            match self.sock.read(&mut self.buf[len..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r.expect("read"),
            }
        };
        self.buf.truncate(len + n);
        n
    }

    /// Reads one response; `Ok(None)`-like panics are test failures.
    pub fn read_response(&mut self, head_only: bool) -> Response {
        self.try_read_response(head_only)
            .expect("complete response")
    }

    /// Reads one final response (skipping 1xx), or None if the connection closed first.
    pub fn try_read_response(&mut self, head_only: bool) -> Option<Response> {
        loop {
            let (status, headers, n) = loop {
                let mut h = [httparse::EMPTY_HEADER; 64];
                let mut r = httparse::Response::new(&mut h);
                if let Ok(httparse::Status::Complete(n)) = r.parse(&self.buf) {
                    let headers: Vec<(String, String)> = r
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    break (r.code.unwrap_or(0), headers, n);
                }
                if self.fill() == 0 {
                    return None;
                }
            };
            self.buf.drain(..n);
            let mut resp = Response {
                status,
                headers,
                body: Vec::new(),
                head_len: n,
                chunked: false,
            };
            if (100..200).contains(&status) {
                continue;
            }
            if head_only || status == 204 || status == 304 {
                return Some(resp);
            }
            if let Some(cl) = resp.header("content-length") {
                let cl: usize = cl.parse().expect("content-length");
                while self.buf.len() < cl {
                    if self.fill() == 0 {
                        return None;
                    }
                }
                // split_off + swap are memcpy; drain().collect() goes byte by byte in a debug
                // build and would put milliseconds of test-client time into latency figures.
                let rest = self.buf.split_off(cl);
                resp.body = std::mem::replace(&mut self.buf, rest);
            } else if resp
                .header("transfer-encoding")
                .is_some_and(|t| t.contains("chunked"))
            {
                resp.chunked = true;
                loop {
                    let line_end = loop {
                        if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                            break p;
                        }
                        if self.fill() == 0 {
                            return None;
                        }
                    };
                    let size = usize::from_str_radix(
                        std::str::from_utf8(&self.buf[..line_end])
                            .expect("utf8")
                            .trim(),
                        16,
                    )
                    .expect("chunk size");
                    self.buf.drain(..line_end + 2);
                    while self.buf.len() < size + 2 {
                        if self.fill() == 0 {
                            return None;
                        }
                    }
                    resp.body.extend_from_slice(&self.buf[..size]);
                    self.buf.drain(..size + 2);
                    if size == 0 {
                        break;
                    }
                }
            } else {
                loop {
                    if self.fill() == 0 {
                        break;
                    }
                }
                resp.body = std::mem::take(&mut self.buf);
            }
            return Some(resp);
        }
    }

    /// True if the server has closed the connection (read returns EOF).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.sock.read(&mut b), Ok(0) | Err(_))
    }
}

/// Asks for the 64 MiB object with `Connection: close` and reads it slowly on a thread, so the
/// transfer stays in flight for a while; the thread returns every byte received, head included.
pub fn slow_64mib_hit(proxy: &Proxy, pause: Duration) -> std::thread::JoinHandle<Vec<u8>> {
    let mut c = proxy.client();
    c.send(b"GET /obj/67108864 HTTP/1.1\r\nHost: test.example\r\nConnection: close\r\n\r\n");
    std::thread::spawn(move || {
        let mut all = Vec::with_capacity((64 << 20) + 1024);
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = c.sock.read(&mut chunk).expect("read");
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&chunk[..n]);
            std::thread::sleep(pause);
        }
    })
}

/// Asserts that `all` is a complete 64 MiB hit: head, then every body byte exact.
pub fn assert_complete_64mib_hit(all: &[u8]) {
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let head = String::from_utf8_lossy(&all[..head_end]);
    assert!(head.contains("X-Cache: HIT"), "{head}");
    assert_eq!(
        all.len() - head_end,
        64 << 20,
        "the in-flight transfer must finish intact"
    );
    assert!(all[head_end..] == body(64 << 20)[..], "body bytes differ");
}

/// How a connection the test stopped sending on ended, as its reader saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The proxy closed it (FIN or reset) after sending these bytes.
    Closed(Vec<u8>),
    /// Still open when the guard ran out (`guard` is a bound on a hang, not a measured time: a
    /// closed connection ends the read the moment the proxy closes it).
    Open(Vec<u8>),
}

/// Sends `bytes` on a new connection to `addr`, then FIN when `fin`, and reads until the proxy
/// closes it or `guard` passes.
pub fn send_then_read_to_close(
    addr: std::net::SocketAddr,
    bytes: &[u8],
    fin: bool,
    guard: std::time::Duration,
) -> Ending {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(guard)).expect("timeout");
    s.write_all(bytes).expect("write");
    if fin {
        s.shutdown(std::net::Shutdown::Write).expect("fin");
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ending::Closed(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ending::Open(got);
            }
            // A reset: the proxy closed with the peeked bytes still unread.
            Err(_) => return Ending::Closed(got),
        }
    }
}

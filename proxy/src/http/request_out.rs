//! The one writer of the request heads zerocache sends upstream: the request line, the fields,
//! the blank line. The fetch's request (`server::fetch::forward`) and the health check's GET
//! (`upstream::health`) are written with it, so a request line or a field is spelled in one place;
//! what fields a request carries is its caller's business.

use super::headers::{put, put_num};

/// A request head being written into a buffer; [`RequestOut::end`] finishes it.
pub(crate) struct RequestOut<'b> {
    buf: &'b mut Vec<u8>,
}

impl<'b> RequestOut<'b> {
    /// Appends the request line `<method> <target> HTTP/1.1` to `buf`.
    pub(crate) fn new(buf: &'b mut Vec<u8>, method: &str, target: &str) -> RequestOut<'b> {
        buf.extend_from_slice(method.as_bytes());
        buf.push(b' ');
        buf.extend_from_slice(target.as_bytes());
        buf.extend_from_slice(b" HTTP/1.1\r\n");
        RequestOut { buf }
    }

    /// `name: value`.
    pub(crate) fn field(&mut self, name: &str, value: &[u8]) -> &mut Self {
        put(self.buf, name, value);
        self
    }

    /// `name: n`, without allocating.
    pub(crate) fn num(&mut self, name: &str, n: u64) -> &mut Self {
        put_num(self.buf, name, n);
        self
    }

    /// The blank line that ends the head.
    pub(crate) fn end(self) {
        self.buf.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_is_written_in_order() {
        let mut buf = Vec::new();
        let mut r = RequestOut::new(&mut buf, "GET", "/health?x=1");
        r.field("Host", b"a.example").num("Content-Length", 0);
        r.end();
        assert_eq!(
            buf,
            b"GET /health?x=1 HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\n\r\n"
        );
    }
}

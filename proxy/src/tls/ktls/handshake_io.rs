//! The client socket under a TLS handshake. When the keys may go to the kernel afterwards, it
//! reads one TLS record at a time (the 5-byte header, then exactly the length it gives), so
//! rustls never holds bytes past the last whole record it was given: a request the client sent
//! right behind its Finished stays in the socket for the kernel to decrypt, instead of sitting
//! half-read in rustls where the hand-over would lose it. Whole records rustls did read are
//! decrypted by it and handed over as plaintext. Otherwise (no kTLS for this connection) it
//! reads as much as rustls asks, as the bare socket did.
//!
//! It also counts the bytes written, the handshake's, which a kTLS connection reports beside
//! its heads: the probe sees them on the socket, and they are not body bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TLS record header: type, version (2), length (2).
const HEADER: usize = 5;

/// The handshake's socket (see the module doc).
pub struct HandshakeIo {
    tcp: TcpStream,
    at_boundaries: bool,
    header: [u8; HEADER],
    header_len: usize,
    left_in_record: usize,
    written: u64,
}

impl HandshakeIo {
    /// `at_boundaries`: read record by record (the connection may be handed to the kernel).
    pub fn new(tcp: TcpStream, at_boundaries: bool) -> HandshakeIo {
        HandshakeIo {
            tcp,
            at_boundaries,
            header: [0; HEADER],
            header_len: 0,
            left_in_record: 0,
            written: 0,
        }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Reads as much as asked from now on (the connection stays in user space).
    pub fn read_freely(&mut self) {
        self.at_boundaries = false;
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Whether the reads so far ended exactly at a record boundary.
    pub fn at_record_boundary(&self) -> bool {
        self.header_len == 0 && self.left_in_record == 0
    }

    /// The socket, for the kernel.
    pub fn into_tcp(self) -> TcpStream {
        self.tcp
    }
}

impl AsyncRead for HandshakeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.at_boundaries || buf.remaining() == 0 {
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        }
        let in_header = this.left_in_record == 0;
        let want = if in_header {
            HEADER - this.header_len
        } else {
            this.left_in_record
        }
        .min(buf.remaining());
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(want));
        ready!(Pin::new(&mut this.tcp).poll_read(cx, &mut part))?;
        let n = part.filled().len();
        if in_header {
            this.header[this.header_len..this.header_len + n].copy_from_slice(part.filled());
            this.header_len += n;
            if this.header_len == HEADER {
                this.header_len = 0;
                this.left_in_record =
                    usize::from(u16::from_be_bytes([this.header[3], this.header[4]]));
            }
        } else {
            this.left_in_record -= n;
        }
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for HandshakeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.tcp).poll_write(cx, buf))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two records and a request's first bytes arrive in one segment: read by record, the
    /// reads stop at each record's end and never take a byte of what follows.
    #[tokio::test]
    async fn reads_stop_at_record_ends() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (s, _) = l.accept().await.expect("accept");
        let mut wire = vec![0x16, 3, 3, 0, 3, b'a', b'b', b'c'];
        wire.extend_from_slice(&[0x14, 3, 3, 0, 0]); // an empty record
        wire.extend_from_slice(&[0x17, 3, 3, 0, 2, b'x', b'y']);
        wire.extend_from_slice(b"AFTER");
        c.write_all(&wire).await.expect("write");
        let mut io = HandshakeIo::new(s, true);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let mut reads = Vec::new();
        while got.len() < wire.len() - 5 {
            let n = io.read(&mut buf).await.expect("read");
            assert!(n > 0);
            reads.push(n);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, wire[..wire.len() - 5]);
        assert_eq!(reads, [5, 3, 5, 5, 2]);
        assert!(io.at_record_boundary());
        let mut rest = [0u8; 5];
        let n = io.tcp().peek(&mut rest).await.expect("peek");
        assert_eq!(&rest[..n], b"AFTER");
        io.read_freely();
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"AFTER");
        io.write_all(b"12345").await.expect("write");
        assert_eq!(io.written(), 5);
    }

    /// A header split across segments is put together before the body is read.
    #[tokio::test]
    async fn a_split_header_is_joined() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut c = TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (s, _) = l.accept().await.expect("accept");
        let mut io = HandshakeIo::new(s, true);
        c.write_all(&[0x17, 3]).await.expect("write");
        let mut buf = [0u8; 64];
        assert_eq!(io.read(&mut buf).await.expect("read"), 2);
        assert!(!io.at_record_boundary());
        c.write_all(&[3, 0, 1, b'z', b'N']).await.expect("write");
        let mut all = buf[..2].to_vec();
        while all.len() < 6 {
            let n = io.read(&mut buf).await.expect("read");
            all.extend_from_slice(&buf[..n]);
        }
        assert_eq!(all, [0x17, 3, 3, 0, 1, b'z']);
        assert!(io.at_record_boundary());
    }
}

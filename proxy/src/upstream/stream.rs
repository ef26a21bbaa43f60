//! A connection to an upstream server, plain TCP or TLS (an `https://` server). Everything that
//! talks to an origin goes through this type; the plain case is the bare tokio socket, so plain
//! origins keep their exact syscalls.

use crate::tls::movable::Movable;
use bytes::BytesMut;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// An upstream connection.
pub enum UpstreamStream {
    /// Plain HTTP.
    Plain(TcpStream),
    /// HTTPS (rustls).
    Tls(Box<tokio_rustls::client::TlsStream<Movable>>),
}

impl UpstreamStream {
    /// The TCP socket underneath (none only after a failed move between runtimes).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            UpstreamStream::Plain(s) => Some(s),
            UpstreamStream::Tls(t) => t.get_ref().0.get(),
        }
    }

    /// The server's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?
            .peer_addr()
    }

    /// Moves the connection to the current worker's runtime (an idle pooled connection taken by
    /// another worker).
    pub fn rehome(self) -> io::Result<UpstreamStream> {
        match self {
            UpstreamStream::Plain(s) => {
                Ok(UpstreamStream::Plain(TcpStream::from_std(s.into_std()?)?))
            }
            UpstreamStream::Tls(mut t) => {
                t.get_mut().0.rehome()?;
                Ok(UpstreamStream::Tls(t))
            }
        }
    }

    /// Writes all of `buf` and flushes it: rustls may hold records back until a flush.
    pub async fn send_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write_all(buf).await?;
        self.flush().await
    }

    /// Reads what is there without waiting (WouldBlock when nothing is).
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            UpstreamStream::Plain(s) => s.try_read_buf(buf),
            UpstreamStream::Tls(_) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut read = std::pin::pin!(self.read_buf(buf));
                match read.as_mut().poll(&mut cx) {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

use std::future::Future;

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

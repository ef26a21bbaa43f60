//! A TCP stream under a TLS session that can move from one worker's runtime to another's. A
//! tokio socket is registered with the epoll of the runtime that made it; an idle pooled
//! upstream connection taken by another worker must be re-registered there. For a plain
//! socket that is `into_std` + `from_std`; under rustls the socket is inside the TLS stream,
//! so it sits in this slot, taken out and put back re-registered.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The socket slot (empty only if re-registering failed, and then every I/O fails).
pub struct Movable(Option<TcpStream>);

impl Movable {
    /// Wraps a connected socket.
    pub fn new(s: TcpStream) -> Movable {
        Movable(Some(s))
    }

    /// The socket, if the slot holds one.
    pub fn get(&self) -> Option<&TcpStream> {
        self.0.as_ref()
    }

    /// Re-registers the socket with the current runtime.
    pub fn rehome(&mut self) -> io::Result<()> {
        let s = self.0.take().ok_or_else(gone)?;
        self.0 = Some(TcpStream::from_std(s.into_std()?)?);
        Ok(())
    }

    fn pin(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.0.as_mut().map(Pin::new).ok_or_else(gone)
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "socket lost while moving runtimes",
    )
}

impl AsyncRead for Movable {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().pin() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Movable {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().pin() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().pin() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().pin() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

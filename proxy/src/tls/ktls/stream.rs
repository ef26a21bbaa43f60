//! A client connection after its keys went to the kernel. Writes are plain socket writes (the
//! kernel makes the records), so the data plane uses it as a plain socket: the head in one
//! send with `MSG_MORE`, the body by sendfile.
//!
//! Reads differ. The kernel hands application data to `read`, but fails a plain read of any
//! other record with EIO, so every read is a `recvmsg` that asks for the record type
//! (`TLS_GET_RECORD_TYPE`): data is returned; the client's `close_notify` is the end of input;
//! another warning alert is passed over, a fatal one is an error named by its code; a handshake
//! message (TLS 1.3 KeyUpdate, the only one a client may send now) ends input too, since the kernels users run (before 6.14)
//! cannot take the new keys and every later record would fail to decrypt. The connection then
//! closes as after close_notify: what was asked before is answered, then the closing alert.
//!
//! Plaintext rustls had already decrypted before the hand-over is read first.

use super::crypto_info::{Cipher, Version};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, TlsGetRecordType, recvmsg};
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The alert record type, and close_notify at warning level (RFC 8446 §6.1).
const ALERT: u8 = 21;
const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// A kTLS connection (see the module doc).
pub struct KtlsStream {
    tcp: TcpStream,
    early: Vec<u8>,
    early_at: usize,
    /// The client ended its side (close_notify, FIN, or a KeyUpdate the kernel cannot follow).
    read_done: bool,
    close_notify_sent: bool,
    /// The record-type control message's buffer, made once.
    cmsg: Vec<u8>,
    /// Bytes written that are neither heads nor bodies (handshake, alerts), not yet reported.
    control_bytes: u64,
    version: Version,
    cipher: Cipher,
}

impl KtlsStream {
    /// The socket with both directions in the kernel; `early`: plaintext rustls decrypted
    /// before the hand-over (`closed`: and the client's close_notify after it);
    /// `handshake_bytes`: what the handshake wrote.
    pub fn new(
        tcp: TcpStream,
        early: Vec<u8>,
        closed: bool,
        handshake_bytes: u64,
        version: Version,
        cipher: Cipher,
    ) -> KtlsStream {
        KtlsStream {
            tcp,
            early,
            early_at: 0,
            read_done: closed,
            close_notify_sent: false,
            cmsg: nix::cmsg_space!(u8),
            control_bytes: handshake_bytes,
            version,
            cipher,
        }
    }

    /// The socket: writes, sendfile and socket options go straight to it.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// The version and cipher the kernel runs, for the log.
    pub fn describe(&self) -> String {
        format!("{} {}", self.version.name(), self.cipher.name())
    }

    /// Handshake and alert bytes written since the last call.
    pub fn take_control_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.control_bytes)
    }
}

/// What one `recvmsg` got.
enum Record {
    Data(usize),
    Alert([u8; 2]),
    Handshake,
    Other(u8),
}

fn recv_record(fd: RawFd, buf: &mut [u8], cmsg: &mut [u8]) -> io::Result<Record> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(cmsg), MsgFlags::empty())?;
    let n = msg.bytes;
    let kind = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::TlsGetRecordType(t) => Some(t),
        _ => None,
    });
    Ok(match kind {
        None | Some(TlsGetRecordType::ApplicationData) => Record::Data(n),
        Some(TlsGetRecordType::Alert) if n >= 2 => Record::Alert([buf[0], buf[1]]),
        Some(TlsGetRecordType::Alert) => Record::Other(ALERT),
        Some(TlsGetRecordType::Handshake) => Record::Handshake,
        Some(TlsGetRecordType::ChangeCipherSpec) => Record::Other(20),
        Some(TlsGetRecordType::Unknown(t)) => Record::Other(t),
        Some(_) => Record::Other(0),
    })
}

/// Sends one alert record through the kernel: `sendmsg` with `TLS_SET_RECORD_TYPE`.
fn send_alert(fd: RawFd, alert: [u8; 2]) -> io::Result<usize> {
    // A cmsghdr-aligned buffer with room for one byte of data.
    let mut space = [0u64; 4];
    // SAFETY: CMSG_SPACE is arithmetic on a constant.
    let space_len = unsafe { libc::CMSG_SPACE(1) } as usize;
    debug_assert!(space_len <= std::mem::size_of_val(&space));
    let mut iov = libc::iovec {
        iov_base: alert.as_ptr() as *mut libc::c_void,
        iov_len: alert.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = space_len;
    // SAFETY: the control buffer is aligned for cmsghdr (u64) and at least CMSG_SPACE(1) long,
    // so CMSG_FIRSTHDR is non-null and its header and one data byte lie inside `space`; the
    // iovec points at `alert`, which outlives the call; sendmsg reads only these.
    let sent = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_TLS;
        (*c).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as usize;
        *libc::CMSG_DATA(c) = ALERT;
        libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

impl AsyncRead for KtlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.early_at < this.early.len() {
            let n = (this.early.len() - this.early_at).min(buf.remaining());
            buf.put_slice(&this.early[this.early_at..this.early_at + n]);
            this.early_at += n;
            if this.early_at == this.early.len() {
                this.early = Vec::new();
                this.early_at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        if this.read_done || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let fd = this.tcp.as_raw_fd();
        loop {
            ready!(this.tcp.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let cmsg = &mut this.cmsg;
            match this
                .tcp
                .try_io(Interest::READABLE, || recv_record(fd, unfilled, cmsg))
            {
                Ok(Record::Data(n)) => {
                    if n == 0 {
                        this.read_done = true;
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Record::Alert(CLOSE_NOTIFY)) | Ok(Record::Alert([2, 0])) => {
                    this.read_done = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(Record::Alert([1, code])) => {
                    // A warning (user_canceled, TLS 1.2 no_renegotiation): noted, read on.
                    tracing::debug!(code, "kTLS: client sent a warning alert");
                    continue;
                }
                Ok(Record::Alert([level, code])) => {
                    this.read_done = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("client sent TLS alert {code} (level {level})"),
                    )));
                }
                Ok(Record::Handshake) => {
                    tracing::debug!(
                        "kTLS: client sent a handshake message (KeyUpdate); the kernel cannot take new keys, closing"
                    );
                    this.read_done = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(Record::Other(t)) => {
                    this.read_done = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected TLS record type {t} after the handshake"),
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for KtlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    /// One writev: the kernel seals what it is given into records of up to 16 KiB whatever
    /// the slices.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    /// close_notify through the kernel, then FIN.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let fd = this.tcp.as_raw_fd();
        while !this.close_notify_sent {
            ready!(this.tcp.poll_write_ready(cx))?;
            match this
                .tcp
                .try_io(Interest::WRITABLE, || send_alert(fd, CLOSE_NOTIFY))
            {
                Ok(n) => {
                    this.close_notify_sent = true;
                    this.control_bytes += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

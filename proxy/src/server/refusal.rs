//! Refusing connections the process cannot serve: out of file descriptors (EMFILE, ENFILE) an
//! accept loop spends one reserved descriptor to take a connection off the backlog and answer it
//! 503 with `Retry-After`, instead of leaving clients in the backlog until they time out; and the
//! accept-failure warning, rate-limited since any client can trigger it.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// What a connection accepted only to be refused, out of file descriptors, is sent before it is
/// closed.
static OUT_OF_FDS_RESPONSE: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut out = crate::http::head::HeadBuf::h1(128);
    crate::http::head::text_response(
        &mut out,
        503,
        &[("Retry-After", "1")],
        None,
        true,
        b"503 Service Unavailable\n",
    );
    out.into_wire()
});

/// How long an accept loop pauses after a failed accept. Out of fds, accept(2) fails before it
/// even looks at the backlog and the listener's readiness is never cleared, so without a pause the
/// loop would spin at full CPU (and, before the warning was rate-limited, log 178 lines a second).
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Most connections refused in one go while out of fds, before pausing: enough to drain a burst
/// from the backlog, few enough that freed fds are soon given to real accepts again.
const REFUSE_BATCH: usize = 32;

/// One descriptor held in reserve (an open `/dev/null`), as nginx and libev advise: out of fds,
/// an accept loop closes it to take one connection off the backlog and answer 503, so the client
/// is told to come back instead of waiting in the backlog until it times out.
///
/// One for all workers, not one each: when the fd a worker gave up is taken meanwhile (say by the
/// placement valve reading /proc), the fd that thread later frees must go back to the reserve.
/// With a reserve per worker, another worker that still had its own would serve the connection
/// that took that fd, and the worker without a reserve could refuse nobody.
pub(super) struct Reserve(Option<std::fs::File>);

/// Whether `e` says the process (EMFILE) or the system (ENFILE) is out of file descriptors.
pub(super) fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

impl Reserve {
    pub(super) fn new() -> Reserve {
        let mut r = Reserve(None);
        if let Err(e) = r.open() {
            tracing::warn!(error = %e, "cannot open /dev/null as a spare fd; out of fds, new connections will wait in the backlog unanswered");
        }
        r
    }

    fn open(&mut self) -> io::Result<()> {
        self.0 = Some(std::fs::File::open("/dev/null")?);
        Ok(())
    }

    /// Takes the reserve back if it was given up; true if that failed for want of fds (another
    /// thread took the one it gave up), false if the reserve is held (or cannot be had at all).
    pub(super) fn refill_at_limit(&mut self) -> bool {
        self.0.is_none() && self.open().as_ref().is_err_and(out_of_fds)
    }

    /// Out of fds: spends the reserve to accept up to [`REFUSE_BATCH`] pending connections one at
    /// a time, answering each with [`OUT_OF_FDS_RESPONSE`] and closing it; then takes the reserve
    /// back. Returns how many were refused.
    pub(super) fn refuse_pending(&mut self, listener: &TcpListener) -> u64 {
        use nix::sys::socket::{SockFlag, accept4};
        self.0 = None;
        let mut refused = 0;
        while refused < REFUSE_BATCH as u64 {
            // Non-blocking: an empty backlog (or an fd taken meanwhile) ends the batch.
            match accept4(listener, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK) {
                Ok(fd) => {
                    refuse(std::net::TcpStream::from(fd));
                    refused += 1;
                }
                Err(_) => break,
            }
        }
        self.refill_at_limit();
        refused
    }
}

/// Sends [`OUT_OF_FDS_RESPONSE`] on a just-accepted non-blocking socket and closes it: for a
/// proxy out of fds or at `limits.max_connections`.
pub(super) fn refuse(sock: std::net::TcpStream) {
    // A fresh socket's send buffer takes the whole response at once; a client that cannot take
    // it is not waited for.
    let _ = (&sock).write(&OUT_OF_FDS_RESPONSE);
    // Closing with unread request bytes would make the kernel send RST, not FIN, and an RST can
    // discard the 503 before the client reads it: finish our side and read what has arrived.
    let _ = sock.shutdown(std::net::Shutdown::Write);
    let mut scratch = [0u8; 4096];
    let _ = (&sock).read(&mut scratch);
}

/// Rate limit of the accept-failure warning, shared by the workers: at most one line a second,
/// which says how many failures it stands for.
#[derive(Default)]
pub(super) struct AcceptFailures {
    last_logged: Option<Instant>,
    /// Failures since the last line that it did not log.
    suppressed: u64,
    /// Connections answered 503 since the last line, out of fds.
    pub(super) refused: u64,
}

impl AcceptFailures {
    pub(super) fn failed(&mut self, error: &io::Error, refused: u64) {
        self.refused += refused;
        if self
            .last_logged
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            %error,
            suppressed = self.suppressed,
            refused_with_503 = self.refused,
            "accept failed"
        );
        *self = AcceptFailures {
            last_logged: Some(Instant::now()),
            ..AcceptFailures::default()
        };
    }
}

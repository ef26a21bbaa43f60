//! Where access log lines go: a file opened for appending (reopened on SIGUSR1), the process's
//! stdout or stderr (a container's log shipper, journald under systemd), or syslog: `syslog`
//! writes to `/dev/log`, `syslog:PATH` to another socket, one datagram a line, `<134>` (local0,
//! info) then `zerocache[PID]: ` and the line, the form journald's and rsyslog's syslog sockets
//! read.

use std::io::{self, BufWriter, Write};
use std::os::unix::net::UnixDatagram;

/// The syslog priority of a line: facility local0 (16), severity info (6).
const PRIORITY: u8 = 16 * 8 + 6;

/// An open target.
pub(super) enum Sink {
    /// A file or a standard stream, buffered (flushed when the queue runs dry).
    Stream(BufWriter<Box<dyn Write + Send>>),
    /// A syslog socket (and its path, to reconnect): each line is a datagram of its own.
    Syslog(UnixDatagram, String),
}

impl Sink {
    /// Opens `target`: `stdout`, `stderr`, `syslog`, `syslog:PATH`, or a file path.
    pub(super) fn open(target: &str) -> io::Result<Sink> {
        let stream: Box<dyn Write + Send> = match target {
            "stdout" => Box::new(io::stdout()),
            "stderr" => Box::new(io::stderr()),
            "syslog" => return syslog("/dev/log"),
            t if t.starts_with("syslog:") => return syslog(&t["syslog:".len()..]),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        Ok(Sink::Stream(BufWriter::with_capacity(64 * 1024, stream)))
    }

    /// Writes `line` (newline included); false when it was lost. A syslog daemon restarted
    /// since (rsyslog re-creates `/dev/log`) is connected to again and the line sent once more,
    /// as syslog(3) does; one that takes nothing within a second loses the line (counted), rather
    /// than holding the writer.
    pub(super) fn line(&mut self, line: &str) -> bool {
        match self {
            Sink::Stream(w) => w.write_all(line.as_bytes()).is_ok(),
            Sink::Syslog(s, path) => {
                let msg = format!(
                    "<{PRIORITY}>zerocache[{}]: {}",
                    std::process::id(),
                    line.trim_end_matches('\n')
                );
                if s.send(msg.as_bytes()).is_ok() {
                    return true;
                }
                match connect(path) {
                    Ok(again) => {
                        *s = again;
                        s.send(msg.as_bytes()).is_ok()
                    }
                    Err(_) => false,
                }
            }
        }
    }

    pub(super) fn flush(&mut self) {
        if let Sink::Stream(w) = self {
            let _ = w.flush();
        }
    }
}

fn syslog(path: &str) -> io::Result<Sink> {
    let s = connect(path)
        .map_err(|e| io::Error::new(e.kind(), format!("syslog socket {path}: {e}")))?;
    Ok(Sink::Syslog(s, path.to_string()))
}

fn connect(path: &str) -> io::Result<UnixDatagram> {
    let s = UnixDatagram::unbound()?;
    s.connect(path)?;
    s.set_write_timeout(Some(std::time::Duration::from_secs(1)))?;
    Ok(s)
}

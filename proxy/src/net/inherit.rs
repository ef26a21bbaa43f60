//! Listening sockets a process is given instead of binding its own: by systemd's socket
//! activation (`LISTEN_FDS` from fd 3, for the pid in `LISTEN_PID`, named by `LISTEN_FDNAMES`),
//! or by the process it replaces in a SIGUSR2 upgrade ([`UPGRADE_FDS`]: `fd=name,...`). A socket
//! handed down keeps its backlog across a restart or an upgrade, so no connection is refused
//! while no process listens.
//!
//! Each socket is matched to a listener of the config by the address it is bound to, and by its
//! name when it has one of ours (`data`, `tls`, `dashboard`, as a `FileDescriptorName=`): a
//! listener with no socket is bound as usual, and a socket no listener wants (the config changed
//! across the hand-over) is closed with a warning, so its clients are refused rather than left
//! waiting in a backlog nobody accepts from. A handed fd that is not a listening TCP socket stops
//! the start-up: serving on the wrong socket, or silently on none, is worse.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The variable the old process sets for its successor in a SIGUSR2 upgrade.
pub(crate) const UPGRADE_FDS: &str = "ZEROCACHE_LISTEN_FDS";
/// The variable naming the process that started a successor: the upgrade's variables are for
/// its child only (as systemd's `LISTEN_PID`), never for a process they leaked to.
pub(crate) const FROM: &str = "ZEROCACHE_UPGRADE_FROM";
/// systemd's variables (`sd_listen_fds(3)`).
pub(crate) const SYSTEMD_VARS: [&str; 3] = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];
/// systemd's first passed fd.
const SD_LISTEN_FDS_START: RawFd = 3;
/// More than any config has listeners; a larger count is a mistake, not a config.
const MAX_FDS: usize = 256;

/// What a listener is for: also the socket's name in `LISTEN_FDNAMES` and in [`UPGRADE_FDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A `listen` entry.
    Data,
    /// A `tls.listen` entry.
    Tls,
    /// `dashboard.listen`.
    Dashboard,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Tls => "tls",
            Role::Dashboard => "dashboard",
        }
    }

    fn of(name: &str) -> Option<Role> {
        [Role::Data, Role::Tls, Role::Dashboard]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

/// Whether this process was started by an upgrade: [`FROM`] names its parent. The variables
/// leak to whatever such a process starts, which must not take them for its own.
pub(crate) fn started_by_upgrade() -> bool {
    let from = std::env::var(FROM).ok().and_then(|v| v.parse::<u32>().ok());
    from.is_some() && from == Some(std::os::unix::process::parent_id())
}

/// One fd as the environment names it: its number and its name, if it is one of ours.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) fd: RawFd,
    pub(crate) role: Option<Role>,
}

/// The sockets handed to this process, not yet matched to a listener.
#[derive(Default)]
pub(crate) struct Inherited {
    sockets: Vec<(OwnedFd, SocketAddr, Option<Role>)>,
    /// Who handed them: for the logs.
    source: &'static str,
}

impl Inherited {
    /// Reads the environment of this process (pid `me`): the upgrade's variable first, then
    /// systemd's. Must run before anything else opens a file, while the fds named are still the
    /// ones handed down; they are set close-on-exec at once.
    pub(crate) fn from_env(me: u32) -> Result<Inherited, String> {
        let var = |k: &str| std::env::var(k).ok();
        let upgrade = var(UPGRADE_FDS).filter(|_| started_by_upgrade());
        let (named, source) = match upgrade {
            Some(v) => (parse_upgrade(&v)?, "the previous process (SIGUSR2 upgrade)"),
            None => (
                parse_systemd(
                    var("LISTEN_FDS"),
                    var("LISTEN_PID"),
                    var("LISTEN_FDNAMES"),
                    me,
                )?,
                "systemd (socket activation)",
            ),
        };
        let mut sockets = Vec::with_capacity(named.len());
        for n in named {
            // Owned only once known to be open: closing a number that is not ours would close
            // whatever this process opened under it.
            // SAFETY: F_GETFD only reads the flags of a number (or fails for a closed one).
            if unsafe { libc::fcntl(n.fd, libc::F_GETFD) } == -1 {
                return Err(format!("{source} names fd {}, which is not open", n.fd));
            }
            // SAFETY: the fd was handed to this process to own (by the two protocols above), is
            // open, and is taken once: the parsers refuse a number named twice.
            let fd = unsafe { OwnedFd::from_raw_fd(n.fd) };
            let addr = listening_addr(&fd).map_err(|e| {
                format!(
                    "{source} handed fd {}, which is not a listening TCP socket: {e}",
                    n.fd
                )
            })?;
            // SAFETY: sets a flag on an fd this process now owns.
            if unsafe { libc::fcntl(n.fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
                let e = std::io::Error::last_os_error();
                return Err(format!("fd {}: cannot set close-on-exec: {e}", n.fd));
            }
            sockets.push((fd, addr, n.role));
        }
        Ok(Inherited { sockets, source })
    }

    /// The socket bound to `addr`, for a listener of `role`, if one was handed down. A socket
    /// named for another role is a mismatch between the unit and the config: an error.
    pub(crate) fn take(&mut self, addr: SocketAddr, role: Role) -> Result<Option<OwnedFd>, String> {
        let Some(i) = self.sockets.iter().position(|(_, a, _)| *a == addr) else {
            return Ok(None);
        };
        let (fd, _, named) = self.sockets.swap_remove(i);
        if let Some(named) = named
            && named != role
        {
            return Err(format!(
                "{} handed a socket on {addr} named {:?}, but the config listens there as {:?}",
                self.source,
                named.name(),
                role.name()
            ));
        }
        tracing::info!(%addr, role = role.name(), from = self.source, "listening socket handed down");
        Ok(Some(fd))
    }

    /// Closes the sockets no listener took, each with a warning.
    pub(crate) fn close_rest(self) {
        for (fd, addr, role) in self.sockets {
            tracing::warn!(%addr, role = ?role.map(Role::name), from = self.source, fd = fd.as_raw_fd(), "a handed-down listening socket matches no listener of the config; closed");
        }
    }
}

/// `ZEROCACHE_LISTEN_FDS`: `fd=name` pairs separated by commas (`5=data,7=dashboard`).
pub(crate) fn parse_upgrade(v: &str) -> Result<Vec<Named>, String> {
    let mut out: Vec<Named> = Vec::new();
    for pair in v.split(',').filter(|p| !p.is_empty()) {
        let (fd, name) = pair
            .split_once('=')
            .ok_or_else(|| format!("{UPGRADE_FDS}: {pair:?} is not fd=name"))?;
        let fd: RawFd = fd
            .parse()
            .ok()
            .filter(|fd| *fd >= SD_LISTEN_FDS_START)
            .ok_or_else(|| format!("{UPGRADE_FDS}: {fd:?} is not an fd number of 3 or more"))?;
        let role =
            Role::of(name).ok_or_else(|| format!("{UPGRADE_FDS}: {name:?} is not a listener"))?;
        if out.iter().any(|n| n.fd == fd) {
            return Err(format!("{UPGRADE_FDS}: fd {fd} named twice"));
        }
        out.push(Named {
            fd,
            role: Some(role),
        });
    }
    if out.len() > MAX_FDS {
        return Err(format!("{UPGRADE_FDS}: more than {MAX_FDS} fds"));
    }
    Ok(out)
}

/// systemd's `LISTEN_FDS`, `LISTEN_PID` and `LISTEN_FDNAMES` for process `me`: nothing unless
/// `LISTEN_PID` is `me` (the variables were meant for another process, as `sd_listen_fds(3)`
/// says); names other than ours (systemd's default is the socket unit's name) name no role.
pub(crate) fn parse_systemd(
    fds: Option<String>,
    pid: Option<String>,
    names: Option<String>,
    me: u32,
) -> Result<Vec<Named>, String> {
    let (Some(fds), Some(pid)) = (fds, pid) else {
        return Ok(Vec::new());
    };
    if pid.trim().parse::<u32>().ok() != Some(me) {
        return Ok(Vec::new());
    }
    let n: usize = fds
        .trim()
        .parse()
        .ok()
        .filter(|n| *n <= MAX_FDS)
        .ok_or_else(|| format!("LISTEN_FDS={fds:?} is not a count of at most {MAX_FDS}"))?;
    let names: Vec<&str> = names
        .as_deref()
        .map(|s| s.split(':').collect())
        .unwrap_or_default();
    if !names.is_empty() && names.len() != n {
        return Err(format!(
            "LISTEN_FDNAMES has {} names for LISTEN_FDS={n}",
            names.len()
        ));
    }
    Ok((0..n)
        .map(|i| Named {
            fd: SD_LISTEN_FDS_START + i as RawFd,
            role: names.get(i).and_then(|name| Role::of(name)),
        })
        .collect())
}

/// The address `fd` listens on, if it is a listening TCP socket.
fn listening_addr(fd: &OwnedFd) -> Result<SocketAddr, String> {
    use nix::sys::socket::{SockaddrStorage, getsockname, getsockopt, sockopt};
    let accepting = getsockopt(fd, sockopt::AcceptConn).map_err(|e| e.to_string())?;
    if !accepting {
        return Err("it does not listen".into());
    }
    let kind = getsockopt(fd, sockopt::SockType).map_err(|e| e.to_string())?;
    if kind != nix::sys::socket::SockType::Stream {
        return Err(format!("it is a {kind:?} socket"));
    }
    let addr: SockaddrStorage = getsockname(fd.as_raw_fd()).map_err(|e| e.to_string())?;
    if let Some(v4) = addr.as_sockaddr_in() {
        return Ok(SocketAddr::V4((*v4).into()));
    }
    if let Some(v6) = addr.as_sockaddr_in6() {
        return Ok(SocketAddr::V6((*v6).into()));
    }
    Err("it is not an IPv4 or IPv6 socket".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_fds_are_numbers_with_our_names() {
        assert_eq!(
            parse_upgrade("5=data,7=dashboard,9=tls"),
            Ok(vec![
                Named {
                    fd: 5,
                    role: Some(Role::Data)
                },
                Named {
                    fd: 7,
                    role: Some(Role::Dashboard)
                },
                Named {
                    fd: 9,
                    role: Some(Role::Tls)
                },
            ])
        );
        assert_eq!(parse_upgrade(""), Ok(vec![]));
        // Hostile or mistaken values are refused with the reason, never half taken.
        for bad in [
            "5",
            "x=data",
            "2=data",
            "-1=data",
            "5=admin",
            "5=data,5=tls",
            "99999999999=data",
        ] {
            assert!(parse_upgrade(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn systemd_fds_start_at_3_and_are_only_for_their_pid() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            parse_systemd(s("2"), s("42"), s("data:dashboard"), 42),
            Ok(vec![
                Named {
                    fd: 3,
                    role: Some(Role::Data)
                },
                Named {
                    fd: 4,
                    role: Some(Role::Dashboard)
                },
            ])
        );
        // Another process's variables (inherited through a fork) are not ours.
        assert_eq!(parse_systemd(s("2"), s("41"), None, 42), Ok(vec![]));
        assert_eq!(parse_systemd(None, None, None, 42), Ok(vec![]));
        // systemd's default name (the unit's) names no role; no names at all is allowed.
        assert_eq!(
            parse_systemd(s("1"), s("42"), s("zerocache.socket"), 42),
            Ok(vec![Named { fd: 3, role: None }])
        );
        assert_eq!(
            parse_systemd(s("1"), s("42"), None, 42),
            Ok(vec![Named { fd: 3, role: None }])
        );
        assert!(parse_systemd(s("2"), s("42"), s("data"), 42).is_err());
        assert!(parse_systemd(s("many"), s("42"), None, 42).is_err());
        assert!(parse_systemd(s("100000"), s("42"), None, 42).is_err());
    }

    #[test]
    fn a_listening_socket_is_matched_by_address_and_its_name() {
        let l = crate::net::listen::bind_listener("127.0.0.1:0".parse().expect("addr"), 16)
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let fd = OwnedFd::from(l);
        assert_eq!(listening_addr(&fd), Ok(addr));
        let mut inh = Inherited {
            sockets: vec![(fd, addr, Some(Role::Dashboard))],
            source: "a test",
        };
        let other: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert!(matches!(inh.take(other, Role::Data), Ok(None)));
        assert!(inh.take(addr, Role::Data).is_err(), "named dashboard");
        // A bound socket that does not listen is refused.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        assert!(listening_addr(&OwnedFd::from(s)).is_err());
    }
}

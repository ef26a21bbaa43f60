//! What /proc says about processes and their fds: resolving `comm` watch targets to PIDs, and
//! finding which fds of a newly watched process are sockets (the kernel side only learns that for
//! fds created while watching).

use std::fs;

/// PIDs whose /proc/PID/comm is exactly `comm`.
pub fn pids_by_comm(comm: &str) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| read_comm(*pid).as_deref() == Some(comm))
        .collect()
}

/// /proc/PID/comm without the newline.
pub fn read_comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// True while /proc/PID exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised comm, which may itself contain ") ".
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The fd numbers of `pid` that are sockets right now.
pub fn socket_fds(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse::<u32>().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            target.to_str()?.starts_with("socket:[").then_some(fd)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_comm_and_sockets() {
        let me = std::process::id();
        let comm = read_comm(me).expect("own comm");
        assert!(pids_by_comm(&comm).contains(&me));
        assert!(alive(me));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        use std::os::fd::AsRawFd;
        let fd = listener.as_raw_fd() as u32;
        assert!(socket_fds(me).contains(&fd));
        assert!(!alive(u32::MAX));
    }
}

//! The proxy process under test: started, sampled for CPU and memory, stopped.

use super::*;

pub(crate) struct Proxy {
    pub(crate) child: Child,
}

impl Proxy {
    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, then SIGKILL after 10 s; the exit status.
    pub(crate) fn stop(&mut self) -> String {
        if let Ok(Some(s)) = self.child.try_wait() {
            return format!("had exited ({s})");
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return format!("exited on SIGTERM ({s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        "did not exit within 10 s of SIGTERM: killed".into()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// (VmRSS in KiB, open fds) of `pid`.
pub(crate) fn sample(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

pub(crate) fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening ({status})");
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

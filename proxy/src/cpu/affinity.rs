//! The CPU side of the data plane: which CPUs the process may run on, pinning a worker thread to
//! one of them, and which CPU a connection's packets arrive on (`SO_INCOMING_CPU`).
//!
//! Why: a connection is cheapest when the thread that sends on it runs on the CPU where its
//! packets are received. On loopback that is the client's CPU; on a NIC it is the CPU of the
//! receive queue the flow hashes to. There the ACKs that clock the sender are processed, the
//! socket lock is taken, and the segments are queued. Everything stays in one CPU's caches and one
//! backlog queue, so the flow is never reordered. See `server::workers` for what that measured.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use std::io;
use std::os::fd::AsRawFd;

/// The CPUs this process may run on (its affinity mask, which honours `taskset` and cpusets), in
/// ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // Pid 0: the calling thread.
    let set = sched_getaffinity(Pid::from_raw(0))?;
    // Every index below the set's capacity (CPU_SETSIZE) is valid, so is_set cannot fail.
    Ok((0..CpuSet::count())
        .filter(|c| set.is_set(*c).unwrap_or(false))
        .collect())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    allow_current_thread(&[cpu])
}

/// Lets the calling thread run on exactly `cpus`. CPUs beyond `CPU_SETSIZE` are ignored.
pub fn allow_current_thread(cpus: &[usize]) -> io::Result<()> {
    allow_thread(0, cpus)
}

/// The calling thread's kernel thread id, for [`allow_thread`] and [`wait_stats`].
pub fn current_tid() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Lets thread `tid` (0: the calling thread) run on exactly `cpus`. CPUs beyond `CPU_SETSIZE`
/// are ignored.
pub fn allow_thread(tid: i32, cpus: &[usize]) -> io::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        // Fails (EINVAL) only for CPUs beyond the set's capacity, which are ignored.
        let _ = set.set(cpu);
    }
    sched_setaffinity(Pid::from_raw(tid), &set)?;
    Ok(())
}

/// How long a thread of this process has waited on a run queue for a CPU, in total, and how many
/// times it was given one: `/proc/self/task/TID/schedstat` (scheduler delay accounting, present
/// without `CONFIG_SCHEDSTATS`). The wait is added when the thread gets its CPU, so a thread that
/// never gets it shows no wait at all: see [`runnable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// Nanoseconds spent runnable but not running.
    pub waited_ns: u64,
    /// Times the thread was put on a CPU.
    pub runs: u64,
}

/// Reads [`WaitStats`] of thread `tid` of this process.
pub fn wait_stats(tid: i32) -> io::Result<WaitStats> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
    parse_schedstat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected schedstat line {text:?}"),
        )
    })
}

fn parse_schedstat(text: &str) -> Option<WaitStats> {
    let mut fields = text.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    let _on_cpu_ns = fields.next()??;
    Some(WaitStats {
        waited_ns: fields.next()??,
        runs: fields.next()??,
    })
}

/// CPU time used by thread `tid` of this process, from its thread CPU clock: exact, where
/// schedstat's figure for a running thread only moves at scheduler ticks (and hardly at all on a
/// `nohz_full` CPU).
pub fn thread_cpu_time(tid: i32) -> io::Result<std::time::Duration> {
    // The kernel's encoding of a thread's CPU clock (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)):
    // !tid << 3, | 4 for "thread", | 2 for the scheduler clock. Any thread of the calling process
    // may be read.
    // nix's ClockId has no constructor for another thread's CPU clock (only the process's),
    // so the raw id goes through from_raw.
    let clock = nix::time::ClockId::from_raw(((!tid) << 3) | 6);
    let ts = nix::time::clock_gettime(clock)?;
    Ok(std::time::Duration::new(
        ts.tv_sec() as u64,
        ts.tv_nsec() as u32,
    ))
}

/// Whether thread `tid` of this process is runnable (state `R` in `/proc/self/task/TID/stat`):
/// running, or waiting for a CPU.
pub fn runnable(tid: i32) -> io::Result<bool> {
    let bytes = std::fs::read(format!("/proc/self/task/{tid}/stat"))?;
    // The state follows the command name, which is in parentheses and may hold any byte (not
    // even UTF-8): find the last ')' and the first non-space after it.
    let state = bytes
        .iter()
        .rposition(|b| *b == b')')
        .and_then(|i| bytes[i + 1..].iter().find(|b| !b.is_ascii_whitespace()));
    match state {
        Some(s) => Ok(*s == b'R'),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected stat line {:?}", String::from_utf8_lossy(&bytes)),
        )),
    }
}

/// The CPU that processed the last packet received on `sock`, if the kernel recorded one.
pub fn incoming_cpu(sock: &impl AsRawFd) -> Option<usize> {
    // nix has no wrapper for SO_INCOMING_CPU (no sockopt::IncomingCpu).
    let mut cpu: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cpu`, an int as SO_INCOMING_CPU expects.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            (&raw mut cpu).cast(),
            &mut len,
        )
    };
    (r == 0 && cpu >= 0).then_some(cpu as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_wait_and_runs() {
        assert_eq!(
            parse_schedstat("5188212 73102 41\n"),
            Some(WaitStats {
                waited_ns: 73102,
                runs: 41
            })
        );
        assert_eq!(parse_schedstat("5188212 73102\n"), None);
        let now = wait_stats(current_tid()).expect("own schedstat");
        assert!(now.runs >= 1, "{now:?}");
        // The calling thread is running, so runnable; a thread blocked on a channel is not.
        assert!(runnable(current_tid()).expect("own stat"));
        // Its CPU clock moves while it spins (no scheduler tick needed for a millisecond).
        let before = thread_cpu_time(current_tid()).expect("own clock");
        let spin = std::time::Instant::now();
        while thread_cpu_time(current_tid()).expect("own clock") - before
            < std::time::Duration::from_millis(1)
        {
            assert!(spin.elapsed() < std::time::Duration::from_secs(5));
        }
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(current_tid()).expect("send");
            let _ = done_rx.recv();
        });
        let tid = rx.recv().expect("tid");
        let mut blocked = false;
        for _ in 0..200 {
            if !runnable(tid).expect("stat") {
                blocked = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(blocked, "a thread blocked in recv stayed runnable");
        // Another thread's clock can be read, and a blocked thread's does not move.
        let a = thread_cpu_time(tid).expect("other thread's clock");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(thread_cpu_time(tid).expect("other thread's clock"), a);
        done_tx.send(()).expect("send");
        t.join().expect("join");
    }

    /// A loopback connection made from a thread pinned to a CPU arrives on that CPU: the client's
    /// softirq processes the handshake.
    #[test]
    fn a_connection_arrives_on_the_connecting_threads_cpu() {
        let cpus = allowed_cpus().expect("affinity");
        assert!(!cpus.is_empty());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        for &cpu in &cpus {
            let client = std::thread::spawn(move || {
                pin_current_thread(cpu).expect("pin");
                std::net::TcpStream::connect(addr).expect("connect")
            });
            let (server, _) = listener.accept().expect("accept");
            let _client = client.join().expect("client");
            assert_eq!(incoming_cpu(&server), Some(cpu));
        }
    }
}

//! The CPU side of the data plane: which CPUs the process may run on, pinning a worker thread to
//! one of them, and which CPU a connection's packets arrive on (`SO_INCOMING_CPU`).
//!
//! Why: a connection is cheapest when the thread that sends on it runs on the CPU where its
//! packets are received. On loopback that is the client's CPU; on a NIC it is the CPU of the
//! receive queue the flow hashes to. There the ACKs that clock the sender are processed, the
//! socket lock is taken, and the segments are queued. Everything stays in one CPU's caches and one
//! backlog queue, so the flow is never reordered. See `workers` for what that measured.

use std::io;
use std::os::fd::AsRawFd;

/// The CPUs this process may run on (its affinity mask, which honours `taskset` and cpusets), in
/// ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for the calling thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        set
    };
    // SAFETY: CPU_ISSET reads the set filled above, for indexes below its capacity.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
        .collect())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    allow_current_thread(&[cpu])
}

/// Lets the calling thread run on exactly `cpus`. CPUs beyond `CPU_SETSIZE` are ignored.
pub fn allow_current_thread(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t with bits set below its capacity, passed with its size, for the
    // calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|c| **c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The CPU that processed the last packet received on `sock`, if the kernel recorded one.
pub fn incoming_cpu(sock: &impl AsRawFd) -> Option<usize> {
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

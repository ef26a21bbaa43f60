//! `cargo xtask bench --h2-data`: what HTTP/2 DATA by sendfile(2) would save, measured on a
//! prototype that owns its write side (#45, item 4).
//!
//! The proxy's h2 connections are the `h2` crate's: it owns the write side and the windows, and
//! takes DATA as buffers it frames and writes itself, so a body must be read into user space
//! first. Before building a write side of our own, this measures what it would buy: a minimal
//! h2c server (prior knowledge, every stream answered with one file, windows honoured) in two
//! modes, driven by the same h2load as `bench --tls --h2`:
//! - **sendfile**: each DATA frame's 9-byte header by send(2) with `MSG_MORE`, its payload by
//!   sendfile(2) from the file, as the proxy's HTTP/1.1 hits;
//! - **copy**: the frames' payloads pread(2) into a 64 KiB buffer beside their headers, a frame
//!   split across writes where it does not fit, and written together: the gathered writes the
//!   proxy makes today (one copy fewer than the proxy makes: no `h2` crate between, no channel).
//!
//! Both at the default SETTINGS_MAX_FRAME_SIZE (16 KiB) and at a client's 1 MiB (`h2load -f`),
//! for 64 KiB and 1 MiB bodies. Streams are answered one after another (no interleaving), which
//! favours neither mode. The server runs on threads of this process, so its CPU is this
//! process's (`getrusage`, ended threads included; h2load is another process).

use crate::bench::{median, size_name};
use anyhow::Context;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::Instant;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SIZES: [usize; 2] = [65_536, 1_048_576];
/// The client's SETTINGS_MAX_FRAME_SIZE: the default, and 1 MiB.
const FRAMES: [usize; 2] = [16_384, 1_048_576];
/// The copy mode's gathered write, as the proxy's output buffer (`server/h2/output.rs`).
const GATHER: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Sendfile,
    /// As `Sendfile`, with `TCP_CORK` held while answers are written and let go before the
    /// server waits (nginx's `tcp_nopush`): full segments, not one push per frame.
    Corked,
    Copy,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sendfile => "frame header, then sendfile",
            Mode::Corked => "the same, TCP_CORK while answering",
            Mode::Copy => "pread into a buffer, gathered write",
        }
    }
}

/// One stream waiting for its answer: its id, its window and the body bytes sent.
struct Stream {
    id: u32,
    window: i64,
    sent: u64,
}

/// One client connection of the prototype.
struct Conn {
    sock: TcpStream,
    file: File,
    size: u64,
    mode: Mode,
    max_frame: usize,
    initial_window: i64,
    window: i64,
    streams: VecDeque<Stream>,
    input: Vec<u8>,
    /// What goes out next: `out[..filled]`. Zeroed once, so a pread needs no zeroing (xtask is
    /// a debug build, where zeroing a frame's buffer cost more than the copy measured).
    out: Vec<u8>,
    filled: usize,
    closed: bool,
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

impl Conn {
    /// Reads what has arrived (waiting for it when `block`) and acts on every whole frame.
    fn read_frames(&mut self, block: bool) -> anyhow::Result<()> {
        let mut buf = [0u8; 16 * 1024];
        let flags = if block { 0 } else { libc::MSG_DONTWAIT };
        // SAFETY: `buf` is a live, writable buffer of the length given.
        let n = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
            )
        };
        if n == 0 {
            self.closed = true;
            return Ok(());
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(());
            }
            self.closed = true;
            return Ok(());
        }
        self.input.extend_from_slice(&buf[..n as usize]);
        while self.input.len() >= 9 {
            let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            if self.input.len() < 9 + len {
                break;
            }
            let (kind, flags) = (self.input[3], self.input[4]);
            let stream =
                u32::from_be_bytes([self.input[5], self.input[6], self.input[7], self.input[8]])
                    & 0x7fff_ffff;
            let payload: Vec<u8> = self.input[9..9 + len].to_vec();
            self.input.drain(..9 + len);
            self.on_frame(kind, flags, stream, &payload)?;
        }
        Ok(())
    }

    fn on_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> anyhow::Result<()> {
        match kind {
            // HEADERS: a request; every one gets the file.
            0x1 => self.streams.push_back(Stream {
                id: stream,
                window: self.initial_window,
                sent: 0,
            }),
            // SETTINGS, not an ack: the sizes it sets, then the ack.
            0x4 if flags & 1 == 0 => {
                for s in payload.chunks_exact(6) {
                    let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                    match u16::from_be_bytes([s[0], s[1]]) {
                        0x4 => {
                            let delta = i64::from(v) - self.initial_window;
                            self.initial_window = i64::from(v);
                            self.streams.iter_mut().for_each(|s| s.window += delta);
                        }
                        0x5 => self.max_frame = v as usize,
                        _ => {}
                    }
                }
                self.sock.write_all(&frame_header(0, 0x4, 1, 0))?;
            }
            // PING: its ack.
            0x6 if flags & 1 == 0 => {
                let mut pong = frame_header(8, 0x6, 1, 0).to_vec();
                pong.extend_from_slice(payload);
                self.sock.write_all(&pong)?;
            }
            0x7 => self.closed = true,
            // WINDOW_UPDATE.
            0x8 if payload.len() == 4 => {
                let inc = i64::from(
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                        & 0x7fff_ffff,
                );
                if stream == 0 {
                    self.window += inc;
                } else if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
                    s.window += inc;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The HEADERS of an answer: `:status 200` (static index 8) and `content-length` (a literal
    /// with the static name 28, not indexed).
    fn headers(&self, stream: u32) -> Vec<u8> {
        let len = self.size.to_string();
        let mut block = vec![0x88, 0x0f, 0x0d, len.len() as u8];
        block.extend_from_slice(len.as_bytes());
        let mut f = frame_header(block.len(), 0x1, 0x4, stream).to_vec();
        f.extend_from_slice(&block);
        f
    }

    /// Answers the first waiting stream as far as the windows allow; false when they allow
    /// nothing.
    fn answer(&mut self) -> anyhow::Result<bool> {
        let Some(mut s) = self.streams.pop_front() else {
            return Ok(false);
        };
        if s.sent == 0 {
            let h = self.headers(s.id);
            self.queue(&h)?;
        }
        let fd = self.sock.as_raw_fd();
        let mut progressed = false;
        while s.sent < self.size {
            let n = (self.size - s.sent)
                .min(self.max_frame as u64)
                .min(self.window.max(0) as u64)
                .min(s.window.max(0) as u64) as usize;
            if n == 0 {
                break;
            }
            let last = s.sent + n as u64 == self.size;
            let head = frame_header(n, 0x0, u8::from(last), s.id);
            match self.mode {
                Mode::Sendfile | Mode::Corked => {
                    self.queue(&head)?;
                    self.flush(libc::MSG_MORE)?;
                    let mut off = s.sent as libc::off_t;
                    let end = s.sent + n as u64;
                    while (off as u64) < end {
                        let left = (end - off as u64) as usize;
                        // SAFETY: both descriptors are open for the call; `off` is a live
                        // off_t the kernel advances.
                        let r =
                            unsafe { libc::sendfile(fd, self.file.as_raw_fd(), &mut off, left) };
                        anyhow::ensure!(r > 0, "sendfile: {}", std::io::Error::last_os_error());
                    }
                }
                Mode::Copy => {
                    // The payload is read straight into the gathered write, a piece at a time
                    // as room allows (never more than GATHER per write, as the proxy's output
                    // buffer), so a frame larger than the buffer is not read whole first.
                    self.queue(&head)?;
                    let (mut at, end) = (s.sent, s.sent + n as u64);
                    while at < end {
                        if self.filled == GATHER {
                            self.flush(0)?;
                        }
                        let take = (GATHER - self.filled).min((end - at) as usize);
                        let f = self.filled;
                        self.file.read_exact_at(&mut self.out[f..f + take], at)?;
                        self.filled += take;
                        at += take as u64;
                    }
                }
            }
            s.sent += n as u64;
            s.window -= n as i64;
            self.window -= n as i64;
            progressed = true;
        }
        if s.sent < self.size {
            self.streams.push_front(s);
        }
        Ok(progressed)
    }

    /// Adds bytes to what goes out next.
    fn queue(&mut self, b: &[u8]) -> anyhow::Result<()> {
        if self.filled + b.len() > GATHER {
            self.flush(0)?;
        }
        self.out[self.filled..self.filled + b.len()].copy_from_slice(b);
        self.filled += b.len();
        Ok(())
    }

    /// Writes what is queued, with send(2) `flags`.
    fn flush(&mut self, flags: libc::c_int) -> anyhow::Result<()> {
        let mut at = 0;
        while at < self.filled {
            let rest = &self.out[at..self.filled];
            // SAFETY: `rest` is a live buffer of the length given.
            let r = unsafe {
                libc::send(
                    self.sock.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    flags | libc::MSG_NOSIGNAL,
                )
            };
            anyhow::ensure!(r > 0, "send: {}", std::io::Error::last_os_error());
            at += r as usize;
        }
        self.filled = 0;
        Ok(())
    }

    fn cork(&self, on: bool) -> anyhow::Result<()> {
        let v = libc::c_int::from(on);
        // SAFETY: `v` is a live c_int of the size given.
        let r = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CORK,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        anyhow::ensure!(r == 0, "TCP_CORK: {}", std::io::Error::last_os_error());
        Ok(())
    }

    fn serve(mut self) -> anyhow::Result<()> {
        let mut preface = [0u8; 24];
        self.sock.read_exact(&mut preface)?;
        anyhow::ensure!(preface == PREFACE, "not an h2 preface");
        self.sock.write_all(&frame_header(0, 0x4, 0, 0))?;
        if self.mode == Mode::Corked {
            self.cork(true)?;
        }
        while !self.closed {
            let progressed = self.answer()?;
            if self.streams.is_empty() || !progressed {
                self.flush(0)?;
                if self.mode == Mode::Corked {
                    // Let go, so what waits leaves now, and cork again for the next answers.
                    self.cork(false)?;
                    self.cork(true)?;
                }
            }
            // Waits for frames only when nothing can be sent.
            self.read_frames(self.streams.is_empty() || !progressed)?;
        }
        Ok(())
    }
}

/// The prototype server on `listener`, a thread per connection, until the process ends.
fn run_server(listener: TcpListener, path: std::path::PathBuf, size: u64, mode: Mode) {
    std::thread::spawn(move || {
        for sock in listener.incoming().flatten() {
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let conn = Conn {
                sock,
                file,
                size,
                mode,
                max_frame: 16_384,
                initial_window: 65_535,
                window: 65_535,
                streams: VecDeque::new(),
                input: Vec::new(),
                out: vec![0; GATHER],
                filled: 0,
                closed: false,
            };
            std::thread::spawn(move || {
                let _ = conn.serve();
            });
        }
    });
}

#[derive(Clone, Copy, Default)]
struct Sample {
    rps: f64,
    cpu_s_per_gb: f64,
    cpu_us_per_req: f64,
}

/// This process's CPU time so far, its ended threads included (a connection's thread ends with
/// it, and `/proc/self/task` forgets it).
fn own_cpu_ns() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF counts every thread of this process, ended ones too.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

fn h2load(port: u16, frame: usize, size: usize, secs: u64) -> anyhow::Result<Sample> {
    let before = own_cpu_ns();
    let out = Command::new("h2load")
        .args(["-t", "2", "-c", "10", "-m", "10", "-w", "30", "-W", "30"])
        .args(["-f", &frame.to_string(), "-D", &secs.to_string()])
        .arg(format!("http://127.0.0.1:{port}/obj"))
        .output()
        .context("running h2load (nghttp2-client)")?;
    let cpu = own_cpu_ns().saturating_sub(before) as f64 / 1e9;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "h2load failed: {text}");
    let field = |prefix: &str, word: &str| -> Option<f64> {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))?;
        line.split(", ").find_map(|p| {
            let mut w = p.trim_start_matches(prefix).split_whitespace();
            let n = w.next()?;
            (w.next()? == word).then(|| n.parse().ok())?
        })
    };
    let done = field("requests: ", "succeeded").unwrap_or(0.0);
    let failed = field("requests: ", "failed").unwrap_or(0.0)
        + field("requests: ", "errored").unwrap_or(0.0);
    anyhow::ensure!(done > 0.0 && failed == 0.0, "h2load: {text}");
    // Every answer's body whole: h2load counts DATA payload bytes.
    let data = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("traffic: "))
        .and_then(|l| l.split(", ").find(|p| p.ends_with(" data")))
        .and_then(|p| p.split(" (").nth(1))
        .and_then(|p| p.split(')').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0);
    anyhow::ensure!(
        data >= done * size as f64,
        "h2load read {data} body bytes for {done} answers"
    );
    let bytes = done * size as f64;
    Ok(Sample {
        rps: done / secs as f64,
        cpu_s_per_gb: cpu / (bytes / 1e9),
        cpu_us_per_req: cpu * 1e6 / done,
    })
}

/// Runs the prototype in both modes and writes `xtask/bench/results/h2-data.md`.
pub fn bench_h2_data(duration: u64, reps: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("zerocache-h2-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut ports = Vec::new();
    for size in SIZES {
        let path = dir.join(format!("obj-{size}"));
        std::fs::write(
            &path,
            (0..size).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )?;
        for mode in [Mode::Sendfile, Mode::Corked, Mode::Copy] {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let port = listener.local_addr()?.port();
            run_server(listener, path.clone(), size as u64, mode);
            ports.push((size, mode, port));
        }
    }
    let mut samples: Vec<(usize, usize, Mode, Vec<Sample>)> = Vec::new();
    // Rotated each repetition, so neither mode always runs first.
    for _ in 0..reps {
        for &frame in &FRAMES {
            for &(size, mode, port) in &ports {
                let s = h2load(port, frame, size, duration)?;
                match samples
                    .iter_mut()
                    .find(|(f, z, m, _)| *f == frame && *z == size && *m == mode)
                {
                    Some(e) => e.3.push(s),
                    None => samples.push((frame, size, mode, vec![s])),
                }
            }
        }
        ports.rotate_left(1);
    }
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let mut md = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    writeln!(
        md,
        "# HTTP/2 DATA by sendfile, on a prototype: `cargo xtask bench --h2-data`\n\n{} UTC. Kernel {}. h2c (no TLS), h2load -t 2 -c 10 -m 10 -w 30 -W 30, {duration} s per run, {reps} repetitions, medians. CPU is the prototype server's, per GB of body. Took {:.0} s. See xtask/src/bench_h2_data.rs.\n",
        crate::bench_index::utc_now(),
        kernel.trim(),
        started.elapsed().as_secs_f64()
    )?;
    writeln!(
        md,
        "| body | max frame | mode | req/s | CPU µs/req | CPU-s/GB | CPU-s/GB ÷ copy's |\n|---|---|---|---|---|---|---|"
    )?;
    for &frame in &FRAMES {
        for size in SIZES {
            let get = |mode| {
                samples
                    .iter()
                    .find(|(f, z, m, _)| *f == frame && *z == size && *m == mode)
                    .map(|e| e.3.clone())
                    .unwrap_or_default()
            };
            let copy = med(&get(Mode::Copy), |s| s.cpu_s_per_gb);
            for mode in [Mode::Sendfile, Mode::Corked, Mode::Copy] {
                let v = get(mode);
                let gb = med(&v, |s| s.cpu_s_per_gb);
                writeln!(
                    md,
                    "| {} | {} | {} | {:.0} | {:.1} | {gb:.3} | {:.2}× |",
                    size_name(size),
                    size_name(frame),
                    mode.name(),
                    med(&v, |s| s.rps),
                    med(&v, |s| s.cpu_us_per_req),
                    gb / copy,
                )?;
            }
        }
    }
    let out = crate::root().join("xtask/bench/results/h2-data.md");
    std::fs::write(&out, &md)?;
    print!("{md}");
    println!("wrote {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

//! Data-plane threads: one single-threaded runtime per core, each accepting from the shared
//! listening socket and keeping every connection it accepts for that connection's whole life.
//!
//! Why not one work-stealing runtime: with a single epoll instance and tasks that move between
//! worker threads, one connection's sendfile calls run on whichever CPU happens to poll, so its
//! segments leave from two CPUs. On loopback each CPU delivers what it sends through its own
//! backlog queue, and two queues reorder a flow: measured at 64 MiB hits, ~110 out-of-order
//! queue events per GB against nginx's ~20, the receiver's out-of-order and SACK work charged to
//! the proxy, and the socket lock contended between the sender and the CPU processing its ACKs.
//! A connection owned by one thread with its own epoll is what nginx's worker processes do, and
//! it lets the scheduler's wake-up affinity keep a connection's sender next to its reader.
//!
//! Which worker serves a connection. Every worker polls the same listening socket (not
//! `SO_REUSEPORT`), and whoever accepts hands the connection, through a queue, to the worker that
//! should serve it, as HAProxy's listeners hand connections to other threads:
//! - Workers are pinned one per allowed CPU, and a connection goes to the worker on the CPU its
//!   packets arrive on (`SO_INCOMING_CPU`, see `affinity`). Its sends, the ACKs that clock them
//!   and its receiver's wake-ups then stay on one CPU. 64 MiB hits measured 0.062–0.079
//!   CPU-s/GB with no out-of-order segments, against 0.071–0.093 and 4–37 out-of-order events
//!   per GB with least-loaded placement alone, and p99 fell from 0.64–1.28 s to 0.32–0.48 s. At
//!   16 MiB it was 0.072–0.077 CPU-s/GB against 0.134–0.148.
//! - Unless that worker has more than [`SLACK`] connections above the least loaded one: then the
//!   least loaded worker gets it. Locality must not pile every connection onto one thread when
//!   they all arrive on one CPU (one client thread, a single-queue NIC). Accepting alone balances
//!   nothing either: wrk opens its connections in one burst, the first worker to wake accepts
//!   them all, and such runs cost ~1.6× the CPU per GB.
//!
//! Control-plane work (signals, the dashboard, the probe) stays on the main runtime, unpinned.

use super::{Shared, affinity, conn};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

thread_local! {
    /// This thread's worker number; `usize::MAX` on threads that are not data-plane workers.
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// The data-plane worker running on this thread (`usize::MAX` elsewhere): sockets are polled by
/// the runtime that registered them, so per-worker state such as idle upstream connections is
/// tagged with it.
pub fn current() -> usize {
    WORKER.with(|w| w.get())
}

/// A connection handed from the worker that accepted it to the one that will serve it.
type Handoff = (std::net::TcpStream, SocketAddr);

/// Open connections per worker: what the balancing reads and `/metrics` shows.
pub struct Loads(Vec<AtomicUsize>);

impl Loads {
    /// Zero connections on each of `workers` workers (at least one).
    pub fn new(workers: usize) -> Loads {
        Loads((0..workers.max(1)).map(|_| AtomicUsize::new(0)).collect())
    }

    /// Open connections per worker, by worker number.
    pub fn snapshot(&self) -> Vec<u64> {
        self.0
            .iter()
            .map(|l| l.load(Ordering::Relaxed) as u64)
            .collect()
    }
}

/// How many connections the worker on a connection's incoming CPU may have above the least loaded
/// worker and still be given it. Small, so that locality never costs much balance: the open
/// connections of any two workers differ by at most `SLACK + 1`.
pub const SLACK: usize = 2;

/// What every worker sees of the others: their open connections and their queues.
struct Pool {
    loads: Arc<Loads>,
    queues: Vec<mpsc::UnboundedSender<Handoff>>,
    /// The CPU each worker is pinned to; empty when the workers are not pinned.
    cpus: Vec<usize>,
}

impl Pool {
    /// The worker that should serve a connection accepted by worker `me` whose packets arrive on
    /// `incoming`: the worker pinned there unless it is more than [`SLACK`] above the least
    /// loaded, else the least loaded (`me` on a tie).
    fn pick(&self, me: usize, incoming: Option<usize>) -> usize {
        let loads = &self.loads.0;
        let least = self.least_loaded(me);
        let local = incoming.and_then(|cpu| self.cpus.iter().position(|c| *c == cpu));
        match local {
            Some(w)
                if loads[w].load(Ordering::Relaxed)
                    <= loads[least].load(Ordering::Relaxed) + SLACK =>
            {
                w
            }
            _ => least,
        }
    }

    /// The worker with the fewest open connections, `me` on a tie.
    fn least_loaded(&self, me: usize) -> usize {
        let loads = &self.loads.0;
        let mut best = me;
        let mut best_load = loads[me].load(Ordering::Relaxed);
        for (i, l) in loads.iter().enumerate() {
            let l = l.load(Ordering::Relaxed);
            if l < best_load {
                best = i;
                best_load = l;
            }
        }
        best
    }
}

/// The running workers: [`Workers::stopped`] resolves once all of them have stopped accepting.
pub struct Workers {
    stopped: mpsc::Receiver<()>,
    count: usize,
}

impl Workers {
    /// Starts one worker thread per entry of `loads`, accepting from `listener` until
    /// `shared.shutdown`.
    pub fn start(
        listener: std::net::TcpListener,
        shared: Arc<Shared>,
        loads: Arc<Loads>,
    ) -> io::Result<Workers> {
        listener.set_nonblocking(true)?;
        let count = loads.0.len();
        let (tx, stopped) = mpsc::channel(count);
        let mut inboxes = Vec::with_capacity(count);
        let mut queues = Vec::with_capacity(count);
        for _ in 0..count {
            let (q, inbox) = mpsc::unbounded_channel();
            queues.push(q);
            inboxes.push(inbox);
        }
        // One worker per allowed CPU, each pinned to its own; otherwise (more workers than CPUs,
        // or the mask unreadable) nobody is pinned and placement is by load alone.
        let cpus = match affinity::allowed_cpus() {
            Ok(cpus) if cpus.len() == count => cpus,
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the CPU affinity mask; workers not pinned");
                Vec::new()
            }
        };
        let pool = Arc::new(Pool {
            loads,
            queues,
            cpus,
        });
        for (me, inbox) in inboxes.into_iter().enumerate() {
            let listener = listener.try_clone()?;
            let shared = shared.clone();
            let pool = pool.clone();
            let tx = tx.clone();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("zerocache-w{me}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(me));
                    if let Some(&cpu) = pool.cpus.get(me)
                        && let Err(e) = affinity::pin_current_thread(cpu)
                    {
                        tracing::warn!(worker = me, cpu, error = %e, "cannot pin worker; it runs unpinned");
                    }
                    rt.block_on(async move {
                        tokio::spawn(receive(me, inbox, shared.clone(), pool.clone()));
                        match TcpListener::from_std(listener) {
                            Ok(l) => accept_loop(me, l, shared, pool).await,
                            Err(e) => {
                                tracing::error!(worker = me, error = %e, "worker cannot poll the listener")
                            }
                        }
                        let _ = tx.send(()).await;
                        // Connections owned here still run on this thread: keep driving them
                        // until the process exits (after the main runtime's drain).
                        std::future::pending::<()>().await
                    })
                })?;
        }
        Ok(Workers { stopped, count })
    }

    /// Waits until every worker has stopped accepting and closed its copy of the listener.
    pub async fn stopped(&mut self) {
        for _ in 0..self.count {
            if self.stopped.recv().await.is_none() {
                return;
            }
        }
    }
}

/// Accepts connections until shutdown and hands each to the least loaded worker; the listener
/// copy is closed when this returns, so once every worker has returned new connections are refused.
async fn accept_loop(me: usize, listener: TcpListener, shared: Arc<Shared>, pool: Arc<Pool>) {
    let mut stop = shared.shutdown.subscribe();
    let mut last_full_warning: Option<Instant> = None;
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, peer)) => {
                    let max = shared.ctx.load().max_connections;
                    if shared.open.load(Ordering::Relaxed) >= max {
                        if last_full_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            tracing::warn!(max, "limits.max_connections reached; closing new connections");
                            last_full_warning = Some(Instant::now());
                        }
                        drop(sock);
                        continue;
                    }
                    shared.open.fetch_add(1, Ordering::Relaxed);
                    let to = pool.pick(me, affinity::incoming_cpu(&sock));
                    pool.loads.0[to].fetch_add(1, Ordering::Relaxed);
                    if to == me {
                        spawn_serve(me, sock, peer, &shared, &pool);
                        continue;
                    }
                    // Deregister from this worker's epoll; the receiver registers it with its own.
                    let handed = sock
                        .into_std()
                        .map_err(|e| e.to_string())
                        .and_then(|s| pool.queues[to].send((s, peer)).map_err(|e| e.to_string()));
                    if let Err(e) = handed {
                        tracing::warn!(worker = to, error = %e, "cannot hand a connection over");
                        finished(to, &shared, &pool);
                    }
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}

/// Serves the connections other workers hand to worker `me`.
async fn receive(
    me: usize,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
    shared: Arc<Shared>,
    pool: Arc<Pool>,
) {
    while let Some((sock, peer)) = inbox.recv().await {
        match tokio::net::TcpStream::from_std(sock) {
            Ok(sock) => spawn_serve(me, sock, peer, &shared, &pool),
            Err(e) => {
                tracing::warn!(worker = me, error = %e, "cannot poll a handed-over connection");
                finished(me, &shared, &pool);
            }
        }
    }
}

/// Runs one connection on worker `me` (the current thread), counted until it ends.
fn spawn_serve(
    me: usize,
    sock: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
) {
    let (shared, pool) = (shared.clone(), pool.clone());
    tokio::spawn(async move {
        conn::serve(sock, peer, shared.clone()).await;
        finished(me, &shared, &pool);
    });
}

/// A connection of worker `me` ended (or never started).
fn finished(me: usize, shared: &Shared, pool: &Pool) {
    pool.loads.0[me].fetch_sub(1, Ordering::Relaxed);
    if shared.open.fetch_sub(1, Ordering::Relaxed) == 1 {
        shared.closed_all.notify_waiters();
    }
}

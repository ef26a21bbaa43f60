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
//! The listener is shared, not `SO_REUSEPORT`: every worker polls the same socket, and whoever
//! accepts a connection gives it to the worker with the fewest open connections (itself on a
//! tie), through that worker's queue, as HAProxy's listeners hand connections to the least loaded
//! thread. Accepting alone does not balance: wrk opens its connections in one burst and the first
//! worker to wake accepts them all, and a 64 MiB hit served with every connection on one thread
//! costs the proxy ~1.6× the CPU per GB of a balanced run. Control-plane work (signals, the
//! dashboard, the probe) stays on the main runtime.
//!
//! While workers are pinned (`workers.cpu_affinity`, see `crate::cpu::placement`), a connection
//! goes to the least loaded worker pinned on the CPU its packets arrive on (`SO_INCOMING_CPU`, see
//! `crate::cpu::affinity`) unless that worker has more than [`SLACK`] connections above the least
//! loaded of all. Its sends, the ACKs that clock them and the socket lock then stay on one CPU and one
//! backlog queue, so the flow is never reordered: 0 out-of-order events per GB at 16 and 64 MiB
//! hits, against 4–120 unpinned. A worker's blocking-pool threads (cold-hit read-ahead) are not
//! pinned: they would compete with their own worker for its CPU.

use super::refusal::{ACCEPT_BACKOFF, AcceptFailures, Reserve, out_of_fds, refuse};
use super::{Shared, conn};
use crate::cpu::affinity;
use crate::cpu::placement::Placement;
use crate::net::client_sock::ClientSock;
use crate::net::listen::Accepting;
use crate::worker_id;
use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use zerocache_ledger::RejectReason;

/// A connection handed from the worker that accepted it to the one that will serve it, and
/// whether it came in on the TLS listener (its handshake runs on the worker that serves it).
type Handoff = (std::net::TcpStream, SocketAddr, Accepting);

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

/// With CPU affinity on, how many connections the worker on a connection's incoming CPU may have
/// above the least loaded worker and still be given it. Small, so that locality never costs much
/// balance (no worker is given a connection while it has more than `SLACK` above the least
/// loaded), and not zero, so that a burst from one client CPU is not scattered at once.
pub const SLACK: usize = 2;

/// What every worker sees of the others: their open connections, their queues, their CPUs.
struct Pool {
    loads: Arc<Loads>,
    queues: Vec<mpsc::UnboundedSender<Handoff>>,
    placement: Arc<Placement>,
    reserve: Mutex<Reserve>,
    accept_failures: Mutex<AcceptFailures>,
}

impl Pool {
    /// The worker that should serve a connection accepted by worker `me`: the least loaded (`me`
    /// on a tie); while workers are pinned, the least loaded pinned on the connection's incoming
    /// CPU unless it has more than [`SLACK`] above that.
    fn pick(&self, me: usize, sock: &tokio::net::TcpStream) -> usize {
        let least = self.least_loaded(me, |_| true);
        if !self.placement.pins() {
            return least;
        }
        let Some(cpu) = affinity::incoming_cpu(sock) else {
            return least;
        };
        let on_cpu = |w| self.placement.cpu_of(w) == Some(cpu);
        let local = self.least_loaded(me, on_cpu);
        if on_cpu(local) && self.load(local) <= self.load(least) + SLACK {
            local
        } else {
            least
        }
    }

    fn load(&self, worker: usize) -> usize {
        self.loads.0[worker].load(Ordering::Relaxed)
    }

    /// The worker with the fewest open connections among those `eligible` accepts, `me` on a tie
    /// (and `me` if none is eligible).
    fn least_loaded(&self, me: usize, eligible: impl Fn(usize) -> bool) -> usize {
        let mut best = me;
        let mut best_load = if eligible(me) {
            self.load(me)
        } else {
            usize::MAX
        };
        for w in (0..self.loads.0.len()).filter(|w| eligible(*w)) {
            let l = self.load(w);
            if l < best_load {
                best = w;
                best_load = l;
            }
        }
        best
    }
}

/// Clears a worker's place if its thread unwinds (workers otherwise never end): its thread id
/// may then be reused by another thread.
struct Leave(Arc<Placement>, usize);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// The running workers: [`Workers::stopped`] resolves once all of them have stopped accepting.
pub struct Workers {
    stopped: mpsc::Receiver<()>,
    count: usize,
}

impl Workers {
    /// Starts one worker thread per entry of `loads`, accepting from every one of `listeners` until
    /// `shared.shutdown`, each placed as `placement` says (which must have one slot per worker).
    /// Each listener comes with what its connections start with (TLS, a PROXY header).
    pub fn start(
        listeners: Vec<(std::net::TcpListener, Accepting)>,
        shared: Arc<Shared>,
        loads: Arc<Loads>,
        placement: Arc<Placement>,
    ) -> io::Result<Workers> {
        for (l, _) in &listeners {
            l.set_nonblocking(true)?;
        }
        let count = loads.0.len();
        let (tx, stopped) = mpsc::channel(count);
        let mut inboxes = Vec::with_capacity(count);
        let mut queues = Vec::with_capacity(count);
        for _ in 0..count {
            let (q, inbox) = mpsc::unbounded_channel();
            queues.push(q);
            inboxes.push(inbox);
        }
        if placement.workers() != count {
            return Err(io::Error::other(format!(
                "{} worker places for {count} workers",
                placement.workers()
            )));
        }
        let pool = Arc::new(Pool {
            loads,
            queues,
            placement,
            reserve: Mutex::new(Reserve::new()),
            accept_failures: Mutex::new(AcceptFailures::default()),
        });
        for (me, inbox) in inboxes.into_iter().enumerate() {
            let mine = listeners
                .iter()
                .map(|(l, accepting)| Ok((l.try_clone()?, accepting.clone())))
                .collect::<io::Result<Vec<_>>>()?;
            let shared = shared.clone();
            let pool = pool.clone();
            let tx = tx.clone();
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder.enable_all();
            if pool.placement.pins() {
                // Blocking-pool threads are spawned from the pinned worker and would inherit its
                // one CPU: give them the whole mask back.
                let placement = pool.placement.clone();
                builder.on_thread_start(move || {
                    if let Err(e) = affinity::allow_current_thread(placement.allowed()) {
                        tracing::warn!(error = %e, "cannot unpin a blocking-pool thread");
                    }
                });
            }
            let rt = builder.build()?;
            std::thread::Builder::new()
                .name(format!("zerocache-w{me}"))
                .spawn(move || {
                    worker_id::set(me);
                    pool.placement.enter(me);
                    let _leave = Leave(pool.placement.clone(), me);
                    rt.block_on(async move {
                        tokio::spawn(receive(me, inbox, shared.clone(), pool.clone()));
                        // One accept loop per listening socket; the worker has stopped accepting
                        // once every one has returned.
                        let mut loops = Vec::with_capacity(mine.len());
                        for (listener, accepting) in mine {
                            match TcpListener::from_std(listener) {
                                Ok(l) => loops.push(tokio::spawn(accept_loop(
                                    me,
                                    l,
                                    accepting,
                                    shared.clone(),
                                    pool.clone(),
                                ))),
                                Err(e) => {
                                    tracing::error!(worker = me, error = %e, "worker cannot poll a listener")
                                }
                            }
                        }
                        for l in loops {
                            let _ = l.await;
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

/// Accepts connections until shutdown and hands each to the worker `Pool::pick` chooses; the listener
/// copy is closed when this returns, so once every worker has returned new connections are refused.
async fn accept_loop(
    me: usize,
    listener: TcpListener,
    accepting: Accepting,
    shared: Arc<Shared>,
    pool: Arc<Pool>,
) {
    let mut stop = shared.shutdown.subscribe();
    let mut last_full_warning: Option<Instant> = None;
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, peer)) => {
                    let mut reserve = pool.reserve.lock();
                    if reserve.refill_at_limit() {
                        // Not one fd to spare: this connection could not be served (an upstream
                        // socket, a cache file), and without the reserve the next ones could not
                        // even be told so. Refuse it and make its fd the reserve.
                        if let Ok(sock) = sock.into_std() {
                            refuse(sock);
                        }
                        reserve.refill_at_limit();
                        drop(reserve);
                        pool.accept_failures.lock().refused += 1;
                        shared
                            .ctx
                            .load()
                            .accounting
                            .connections_rejected(RejectReason::OutOfFds, 1);
                        continue;
                    }
                    drop(reserve);
                    let max = shared.ctx.load().max_connections;
                    if !shared.admit(max) {
                        if last_full_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            tracing::warn!(max, "limits.max_connections reached; answering new connections 503");
                            last_full_warning = Some(Instant::now());
                        }
                        // Answered at once, without waiting for a request: a full proxy must be
                        // no slowloris amplifier, and a client told 503 with Retry-After backs
                        // off where a reset would make it retry at once.
                        if let Ok(sock) = sock.into_std() {
                            refuse(sock);
                        }
                        shared
                            .ctx
                            .load()
                            .accounting
                            .connections_rejected(RejectReason::MaxConnections, 1);
                        continue;
                    }
                    let to = pool.pick(me, &sock);
                    pool.loads.0[to].fetch_add(1, Ordering::Relaxed);
                    if to == me {
                        spawn_serve(me, sock, peer, accepting.clone(), &shared, &pool);
                        continue;
                    }
                    // Deregister from this worker's epoll; the receiver registers it with its own.
                    let handed = sock
                        .into_std()
                        .map_err(|e| e.to_string())
                        .and_then(|s| pool.queues[to].send((s, peer, accepting.clone())).map_err(|e| e.to_string()));
                    if let Err(e) = handed {
                        tracing::warn!(worker = to, error = %e, "cannot hand a connection over");
                        finished(to, &shared, &pool);
                    }
                }
                Err(e) => {
                    let refused = if out_of_fds(&e) {
                        pool.reserve.lock().refuse_pending(&listener)
                    } else {
                        0
                    };
                    pool.accept_failures.lock().failed(&e, refused);
                    if refused > 0 {
                        shared
                            .ctx
                            .load()
                            .accounting
                            .connections_rejected(RejectReason::OutOfFds, refused);
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // wait_for looks at the current value first: a loop that subscribed after the
            // shutdown was sent (a SIGTERM right after start) stops at once instead of never.
            _ = async { stop.wait_for(|stopping| *stopping).await.map(|_| ()) } => return,
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
    while let Some((sock, peer, accepting)) = inbox.recv().await {
        match tokio::net::TcpStream::from_std(sock) {
            Ok(sock) => spawn_serve(me, sock, peer, accepting, &shared, &pool),
            Err(e) => {
                tracing::warn!(worker = me, error = %e, "cannot poll a handed-over connection");
                finished(me, &shared, &pool);
            }
        }
    }
}

/// Runs one connection on worker `me` (the current thread), counted until it ends: after its
/// PROXY header on a listener that takes one (whose source is then the client's address), and a
/// TLS one after its handshake.
fn spawn_serve(
    me: usize,
    mut sock: tokio::net::TcpStream,
    mut peer: SocketAddr,
    accepting: Accepting,
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
) {
    /// Gives the connection's place back however its task ends: a panic in one request must
    /// not leak a `max_connections` slot (or hold up the drain) forever.
    struct Finished(usize, Arc<Shared>, Arc<Pool>);
    impl Drop for Finished {
        fn drop(&mut self) {
            finished(self.0, &self.1, &self.2);
        }
    }
    let done = Finished(me, shared.clone(), pool.clone());
    tokio::spawn(async move {
        if let Some(from) = &accepting.proxy_from {
            let ctx = done.1.ctx.load_full();
            match proxy_header(&mut sock, peer, from, ctx.client.header_timeout).await {
                Ok(client) => peer = client,
                Err(why) => {
                    // A client can cause this; debug, not warn.
                    tracing::debug!(%peer, why, "connection closed: PROXY protocol");
                    return;
                }
            }
        }
        let shared = done.1.clone();
        if accepting.tls {
            let ctx = shared.ctx.load_full();
            let accepted =
                crate::tls::server::accept(sock, peer, ctx.tls.as_deref(), &ctx.accounting).await;
            drop(ctx);
            match accepted {
                Some(a) if a.h2 => super::h2::serve(a.conn.into(), peer, shared).await,
                Some(a) => conn::serve(a.conn.into(), peer, shared).await,
                None => return,
            }
        } else if accepting.h2c {
            let wait = shared.ctx.load().client.header_timeout;
            match super::h2::opening(&sock, wait).await {
                super::h2::Opening::H2 => {
                    super::h2::serve(ClientSock::Plain(sock), peer, shared).await
                }
                super::h2::Opening::Http1 => {
                    conn::serve(ClientSock::Plain(sock), peer, shared).await
                }
                super::h2::Opening::Close => {
                    tracing::debug!(%peer, "connection closed: no whole request or preface before header_timeout, or a FIN");
                }
            }
        } else {
            conn::serve(ClientSock::Plain(sock), peer, shared).await;
        }
        drop(done);
    });
}

/// The client's address from the PROXY header at the start of `sock`, sent by `peer`: only a
/// peer in `from` may send one, and it must be whole and well formed within `wait`. A header
/// that names no address (a load balancer's health check) leaves `peer`.
async fn proxy_header(
    sock: &mut tokio::net::TcpStream,
    peer: SocketAddr,
    from: &[zerocache_config::cidr::Cidr],
    wait: Duration,
) -> Result<SocketAddr, &'static str> {
    if !from.iter().any(|c| c.contains(peer.ip())) {
        return Err("peer not in proxy_protocol_from");
    }
    let deadline = tokio::time::Instant::now() + wait;
    let client = crate::net::proxy_protocol::read(sock, deadline).await?;
    Ok(client.unwrap_or(peer))
}

/// A connection of worker `me` ended (or never started).
fn finished(me: usize, shared: &Shared, pool: &Pool) {
    pool.loads.0[me].fetch_sub(1, Ordering::Relaxed);
    shared.release();
}

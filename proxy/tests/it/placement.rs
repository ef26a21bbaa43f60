//! Where the data-plane workers run by default (`workers.cpu_affinity: auto`): pinned one per
//! CPU, moved off a CPU that a real-time task holds, and pinned again once it is free. Its own
//! test binary, because it starves one CPU for a few seconds and `cargo test` (which `cargo xtask
//! test` runs) runs test binaries one at a time: no other test's pinned worker shares that CPU
//! meanwhile. A runner that runs binaries in parallel (nextest) would let it slow others down.

use crate::support::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zerocache::exports::{allow_current_thread, allowed_cpus, pin_current_thread};

/// `Cpus_allowed_list` text (`0-2,5`) as CPU numbers.
fn cpu_list(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<usize>().expect("cpu")..=b.parse::<usize>().expect("cpu"));
    }
    out
}

/// A `SCHED_FIFO` thread spinning on `cpu` until `stop` (or 15 s, so that a failing test never
/// leaves a CPU starved). Ordinary threads pinned there get only what RT throttling leaves them,
/// which must be on (`kernel.sched_rt_runtime_us` not -1), or the CPU's kernel threads would
/// starve as well.
fn realtime_hog(cpu: usize, stop: &'static AtomicBool) -> std::thread::JoinHandle<()> {
    let rt_runtime = std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
        .expect("sched_rt_runtime_us");
    assert_ne!(
        rt_runtime.trim(),
        "-1",
        "RT throttling is off: a real-time hog would starve the CPU outright"
    );
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let hog = std::thread::spawn(move || {
        pin_current_thread(cpu).expect("pin the hog");
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: plain syscall on the calling thread with a valid parameter block.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        let set = if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        let failed = set.is_err();
        ready_tx.send(set).expect("ready");
        if failed {
            return;
        }
        let until = Instant::now() + Duration::from_secs(15);
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::hint::spin_loop();
        }
    });
    ready
        .recv()
        .expect("hog ready")
        .expect("SCHED_FIFO needs CAP_SYS_NICE and a real-time budget (the tests run as root)");
    hog
}

/// By default each worker is pinned to one CPU, round robin. A `SCHED_FIFO` task spinning on
/// worker 0's CPU starves it (it gets 5% of the CPU, and a hit took 935 ms): within a few valve
/// ticks worker 0 is allowed only the other CPUs, `/metrics` shows it unpinned and counts the
/// unpin, and hits on its connection are answered byte for byte. Once the task stops, worker 0
/// is pinned to its own CPU again. Fails without the valve: worker 0 stays on its CPU through
/// 600 hits in 10 s.
#[test]
fn auto_pins_workers_and_lets_one_off_a_cpu_a_realtime_task_holds() {
    if !require::cpus(2, "moves a worker off one CPU onto another") {
        return;
    }
    if !require::root("runs a SCHED_FIFO task, which needs CAP_SYS_NICE") {
        return;
    }
    static STOP: AtomicBool = AtomicBool::new(false);
    let cpus = allowed_cpus().expect("affinity mask");
    assert!(cpus.len() >= 2, "needs two CPUs, has {cpus:?}");
    let (origin, _rt) = origin();
    let proxy = Proxy::start(origin.addr(), Opts::default());
    let pid = proxy.child.id();
    // One per CPU, unless a CPU quota allows fewer.
    let workers = worker_count(&proxy);
    assert!(workers >= 2, "{workers} workers");
    let pinned: Vec<Vec<usize>> = (0..workers).map(|w| vec![cpus[w % cpus.len()]]).collect();
    let lists =
        || -> Vec<Vec<usize>> { worker_cpu_lists(pid).iter().map(|l| cpu_list(l)).collect() };
    let flags = || {
        let m = proxy.metrics();
        (0..workers)
            .map(|w| metric(&m, &format!("zerocache_worker_pinned{{worker=\"{w}\"}}")))
            .collect::<Vec<_>>()
    };
    assert_eventually_eq(
        "workers pinned, in the kernel and in /metrics",
        Duration::from_secs(5),
        || (lists(), flags()),
        (pinned.clone(), vec![1; workers]),
    );
    let m = proxy.metrics();
    let unpins = metric(&m, "zerocache_worker_unpins_total");
    assert_workers_drain(&proxy, workers);

    // A connection made from the first CPU arrives there and goes to worker 0.
    let mut c = std::thread::scope(|s| {
        s.spawn(|| {
            pin_current_thread(cpus[0]).expect("pin the client");
            let mut c = proxy.client();
            assert_eq!(c.get("/obj/1024", &[]).body, body(1024));
            c
        })
        .join()
        .expect("client")
    });
    let mut want = vec![0; workers];
    want[0] = 1;
    assert_eq!(worker_loads(&proxy, workers), want);

    // The client keeps off the CPU it is about to lose.
    let elsewhere: Vec<usize> = cpus[1..].to_vec();
    allow_current_thread(&elsewhere).expect("move the client");
    let hog = realtime_hog(cpus[0], &STOP);
    let started = Instant::now();
    let mut hits = 0;
    while lists()[0] != elsewhere {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "worker 0 still {:?} after {hits} hits",
            lists()[0]
        );
        let r = c.get("/obj/1024", &[]);
        assert_eq!((r.x_cache(), r.body.len()), ("HIT", 1024));
        hits += 1;
    }
    let m = proxy.metrics();
    assert_eq!(
        metric(&m, "zerocache_worker_pinned{worker=\"0\"}"),
        0,
        "moved after {:?}",
        started.elapsed()
    );
    assert!(metric(&m, "zerocache_worker_unpins_total") > unpins);
    for _ in 0..20 {
        let r = c.get("/obj/1024", &[]);
        assert_eq!((r.x_cache(), &r.body), ("HIT", &body(1024)));
    }

    STOP.store(true, Ordering::Relaxed);
    hog.join().expect("hog");
    // Holds double while the CPU stays taken (1, 2, 4 s ...); the hog ran a few seconds at most.
    assert_eventually_eq(
        "worker 0 pinned again",
        Duration::from_secs(20),
        lists,
        pinned.clone(),
    );
    let m = proxy.metrics();
    assert_eq!(metric(&m, "zerocache_worker_pinned{worker=\"0\"}"), 1);
    let r = c.get("/obj/1024", &[]);
    assert_eq!((r.x_cache(), &r.body), ("HIT", &body(1024)));
}

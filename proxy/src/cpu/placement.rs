//! Where the data-plane workers run: each pinned to one CPU or not, and, with
//! `workers.cpu_affinity: auto` (the default), the loop that applies the `valve`'s decisions.
//!
//! Why pin: a connection is cheapest when the thread that sends on it runs where its packets are
//! received (see `affinity`). Pinned and steered there, a 16 MiB hit cost the proxy 0.069–0.085
//! CPU-s/GB against 0.086–0.160 unpinned in side-by-side runs, because the flow's segments all
//! leave from one CPU's backlog queue and are never reordered (docs/benchmark.md, "Speed and the
//! benchmark"). Placing connections on the CPU an unpinned worker happens to be on does not keep
//! that: the scheduler reshuffles the worker and client threads within a second of a burst of
//! connections (measured: 0.067–0.142, half the runs unaligned).
//!
//! Why not always: a pinned worker cannot leave a CPU that a real-time task holds (see `valve`
//! for what that measured, and the rules). This file reads each pinned worker's scheduler figures
//! every [`valve::TICK`] and moves it off its CPU, or back, when the valve says so. It moves it to
//! the other allowed CPUs, not to all of them: a runnable thread whose mask still holds its CPU
//! stays queued there until a load balancer pulls it. CPUs that another worker has been moved off
//! are left out too, so two starved workers do not trade places.

use super::affinity;
use super::valve::{self, Action, Reading, Valve};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Instant;
use zerocache_config::schema::CpuAffinity;

/// One worker's place.
struct Slot {
    /// The CPU it is pinned to when pinned; `None`: never pinned.
    cpu: Option<usize>,
    /// Its kernel thread id while its thread runs; 0 before and after (a thread id is reused).
    tid: AtomicI32,
    /// Whether it is pinned right now.
    pinned: AtomicBool,
    /// Pinning it failed when it started: the valve leaves it alone.
    failed: AtomicBool,
}

/// The workers' CPUs, shared by the workers (which pin themselves on start), the accepting
/// workers (which steer connections to the worker pinned on their incoming CPU), the valve and
/// `/metrics`.
pub struct Placement {
    mode: CpuAffinity,
    allowed: Vec<usize>,
    slots: Vec<Slot>,
    unpins: AtomicU64,
}

impl Placement {
    /// `workers` workers (at least one), pinned round robin over `allowed` unless `mode` is off or
    /// no allowed CPU is known.
    pub fn new(workers: usize, mode: CpuAffinity, allowed: Vec<usize>) -> Placement {
        let pin = mode != CpuAffinity::Off && !allowed.is_empty();
        let slots = (0..workers.max(1))
            .map(|w| Slot {
                cpu: pin.then(|| allowed[w % allowed.len()]),
                tid: AtomicI32::new(0),
                pinned: AtomicBool::new(false),
                failed: AtomicBool::new(false),
            })
            .collect();
        Placement {
            mode,
            allowed,
            slots,
            unpins: AtomicU64::new(0),
        }
    }

    /// How many workers there are.
    pub fn workers(&self) -> usize {
        self.slots.len()
    }

    /// Whether workers are pinned at all (so their blocking-pool threads need the whole mask).
    pub fn pins(&self) -> bool {
        self.slots.iter().any(|s| s.cpu.is_some())
    }

    /// Every CPU the process may use.
    pub fn allowed(&self) -> &[usize] {
        &self.allowed
    }

    /// The CPU worker `w` is pinned to right now, if it is.
    pub fn cpu_of(&self, w: usize) -> Option<usize> {
        let s = &self.slots[w];
        s.cpu.filter(|_| s.pinned.load(Ordering::Relaxed))
    }

    /// Whether each worker is pinned right now, by worker number.
    pub fn pinned(&self) -> Vec<bool> {
        self.slots
            .iter()
            .map(|s| s.pinned.load(Ordering::Relaxed))
            .collect()
    }

    /// How many times the valve has moved a worker off its CPU.
    pub fn unpins(&self) -> u64 {
        self.unpins.load(Ordering::Relaxed)
    }

    /// Called on worker `w`'s own thread as it starts: records its thread id and pins it.
    pub fn enter(&self, w: usize) {
        let s = &self.slots[w];
        if let Some(cpu) = s.cpu {
            match affinity::pin_current_thread(cpu) {
                Ok(()) => s.pinned.store(true, Ordering::Relaxed),
                Err(e) => {
                    s.failed.store(true, Ordering::Relaxed);
                    tracing::warn!(worker = w, cpu, error = %e, "cannot pin worker; it runs unpinned")
                }
            }
        }
        s.tid.store(affinity::current_tid(), Ordering::Relaxed);
    }

    /// Called as worker `w`'s thread ends (only by unwinding): its thread id may be given to
    /// another thread, which the valve must not move.
    pub fn leave(&self, w: usize) {
        let s = &self.slots[w];
        s.tid.store(0, Ordering::Relaxed);
        s.pinned.store(false, Ordering::Relaxed);
    }

    /// Runs the valve for as long as the runtime does; returns at once unless the mode is `auto`,
    /// workers are pinned and there is another CPU to move one to.
    pub async fn valve(&self) {
        if self.mode != CpuAffinity::Auto || !self.pins() || self.allowed.len() < 2 {
            return;
        }
        let start = Instant::now();
        let mut valves: Vec<Valve> = self.slots.iter().map(|_| Valve::new(start)).collect();
        let mut warned = vec![Warned::default(); self.slots.len()];
        let mut quota = Quota::find();
        let mut tick = tokio::time::interval(valve::TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let throttled = quota.as_mut().is_some_and(Quota::throttled);
            let now = Instant::now();
            for w in 0..self.slots.len() {
                self.turn(w, &mut valves[w], &mut warned[w], throttled, now);
            }
        }
    }

    /// One tick of the valve for worker `w`.
    fn turn(&self, w: usize, v: &mut Valve, warned: &mut Warned, throttled: bool, now: Instant) {
        let slot = &self.slots[w];
        let tid = slot.tid.load(Ordering::Relaxed);
        let Some(cpu) = slot.cpu else { return };
        if tid == 0 || slot.failed.load(Ordering::Relaxed) {
            return;
        }
        let reading = match read(tid) {
            Ok(r) => {
                warned.read = false;
                r
            }
            Err(e) => {
                if !warned.read {
                    tracing::warn!(worker = w, error = %e, "cannot read a worker's scheduler figures; it stays as it is");
                    warned.read = true;
                }
                return;
            }
        };
        // The workers that wait for this CPU with it: pinned there, started, not failed.
        let siblings = self
            .slots
            .iter()
            .filter(|s| {
                s.cpu == Some(cpu)
                    && s.pinned.load(Ordering::Relaxed)
                    && s.tid.load(Ordering::Relaxed) != 0
                    && !s.failed.load(Ordering::Relaxed)
            })
            .count()
            .max(1) as u32;
        let pinned = slot.pinned.load(Ordering::Relaxed);
        match v.step(pinned, reading, siblings, throttled, now) {
            Action::Stay => {}
            Action::Unpin {
                waited,
                runs,
                starved,
                hold,
            } => {
                let elsewhere = self.elsewhere(cpu);
                let moved = if elsewhere.is_empty() {
                    Err(std::io::Error::other("every other CPU is taken too"))
                } else {
                    affinity::allow_thread(tid, &elsewhere)
                };
                if let Err(e) = moved {
                    v.unpin_failed(now);
                    // Once per episode: it is retried every second while the CPU stays taken.
                    if !warned.moving {
                        tracing::warn!(worker = w, cpu, error = %e, "cannot move a waiting worker off its CPU");
                        warned.moving = true;
                    }
                    return;
                }
                warned.moving = false;
                slot.pinned.store(false, Ordering::Relaxed);
                self.unpins.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    worker = w,
                    cpu,
                    ?elsewhere,
                    waited_us = waited.as_micros() as u64,
                    runs,
                    starved,
                    hold_s = hold.as_secs(),
                    "a pinned worker keeps waiting for its CPU; it runs on the others for a while"
                );
            }
            Action::Repin => match affinity::allow_thread(tid, &[cpu]) {
                Ok(()) => {
                    slot.pinned.store(true, Ordering::Relaxed);
                    tracing::info!(worker = w, cpu, "worker pinned again");
                }
                Err(e) => {
                    v.repin_failed(now);
                    tracing::warn!(worker = w, cpu, error = %e, "cannot pin worker again");
                }
            },
        }
    }

    /// The allowed CPUs other than `cpu` and those another worker has been moved off.
    fn elsewhere(&self, cpu: usize) -> Vec<usize> {
        let fled: Vec<usize> = self
            .slots
            .iter()
            .filter(|s| {
                s.tid.load(Ordering::Relaxed) != 0
                    && !s.failed.load(Ordering::Relaxed)
                    && !s.pinned.load(Ordering::Relaxed)
            })
            .filter_map(|s| s.cpu)
            .collect();
        self.allowed
            .iter()
            .copied()
            .filter(|c| *c != cpu && !fled.contains(c))
            .collect()
    }
}

/// Warnings already given for one worker, so that a lasting condition is logged once.
#[derive(Clone, Copy, Default)]
struct Warned {
    read: bool,
    moving: bool,
}

/// One tick's reading of thread `tid`.
fn read(tid: i32) -> std::io::Result<Reading> {
    let waits = affinity::wait_stats(tid)?;
    Ok(Reading {
        waited_ns: waits.waited_ns,
        runs: waits.runs,
        cpu_ns: affinity::thread_cpu_time(tid)?.as_nanos() as u64,
        runnable: affinity::runnable(tid)?,
    })
}

/// The CPU quotas over this process (cgroup v2: its own cgroup's `cpu.max` and its ancestors'):
/// while one is throttled its threads count as waiting, which says nothing about their CPUs.
/// cgroup v1 quotas are not seen.
struct Quota {
    stats: Vec<std::path::PathBuf>,
    throttled: Vec<Option<u64>>,
    last_tick: bool,
}

impl Quota {
    /// The `cpu.stat` of every cgroup from this process's up to the root whose `cpu.max` sets a
    /// quota; `None` if there is none.
    fn find() -> Option<Quota> {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
        let root = std::path::Path::new("/sys/fs/cgroup");
        let own = root.join(path.trim_start_matches('/'));
        let stats: Vec<_> = own
            .ancestors()
            .take_while(|d| d.starts_with(root))
            .filter(|d| {
                std::fs::read_to_string(d.join("cpu.max"))
                    .is_ok_and(|m| m.split_whitespace().next().is_some_and(|q| q != "max"))
            })
            .map(|d| d.join("cpu.stat"))
            .collect();
        (!stats.is_empty()).then(|| Quota {
            throttled: vec![None; stats.len()],
            stats,
            last_tick: false,
        })
    }

    /// Whether a quota throttled this tick or the one before. The tick before too: the valve's
    /// thread, in the same cgroup, tends to run as the throttling lifts, before the workers'
    /// waits have been added up.
    fn throttled(&mut self) -> bool {
        let mut now = false;
        for (stat, before) in self.stats.iter().zip(&mut self.throttled) {
            let n = std::fs::read_to_string(stat).ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("nr_throttled "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            });
            now |= matches!((*before, n), (Some(b), Some(n)) if n > b);
            *before = n;
        }
        let answer = now || self.last_tick;
        self.last_tick = now;
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_over_the_allowed_cpus_unless_off() {
        let p = Placement::new(3, CpuAffinity::Auto, vec![2, 5]);
        let cpus: Vec<_> = p.slots.iter().map(|s| s.cpu).collect();
        assert_eq!(cpus, [Some(2), Some(5), Some(2)]);
        // Not pinned until the worker enters.
        assert_eq!(p.cpu_of(0), None);
        let off = Placement::new(2, CpuAffinity::Off, vec![0, 1]);
        assert!(!off.pins());
        let unknown = Placement::new(2, CpuAffinity::On, Vec::new());
        assert!(!unknown.pins());
    }

    /// A worker is moved to the CPUs no other worker has fled: with three CPUs and worker 1
    /// already moved off CPU 1, worker 0 may only go to CPU 2; a worker that never started or
    /// could not be pinned has fled nothing.
    #[test]
    fn elsewhere_leaves_out_cpus_other_workers_fled() {
        let p = Placement::new(4, CpuAffinity::Auto, vec![0, 1, 2]);
        assert_eq!(p.elsewhere(0), [1, 2]);
        for (w, s) in p.slots.iter().enumerate() {
            s.tid.store(100 + w as i32, Ordering::Relaxed);
            s.pinned.store(true, Ordering::Relaxed);
        }
        p.slots[1].pinned.store(false, Ordering::Relaxed);
        assert_eq!(p.elsewhere(0), [2]);
        assert_eq!(p.cpu_of(1), None);
        assert_eq!(p.cpu_of(3), Some(0));
        p.slots[1].failed.store(true, Ordering::Relaxed);
        assert_eq!(p.elsewhere(0), [1, 2]);
        p.leave(3);
        assert_eq!(p.elsewhere(1), [0, 2]);
        assert_eq!(p.pinned(), [true, false, true, false]);
    }
}

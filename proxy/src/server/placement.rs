//! Where the data-plane workers run: each pinned to one CPU or free to run anywhere, and, with
//! `workers.cpu_affinity: auto` (the default), the valve that unpins a worker while it keeps
//! waiting for its CPU.
//!
//! Why pin: a connection is cheapest when the thread that sends on it runs where its packets are
//! received (see `affinity`). Pinned and steered there, a 16 MiB hit costs the proxy 0.061–0.063
//! CPU-s/GB against 0.087–0.160 unpinned, because the flow's segments all leave from one CPU's
//! backlog queue and are never reordered (README, "Speed and the benchmark"). Placing connections
//! on the CPU an unpinned worker happens to be on does not keep that: the scheduler reshuffles the
//! worker and client threads within a second of a burst of connections (measured: half the runs
//! ended up unaligned, 0.095–0.142).
//!
//! Why the valve: a pinned worker cannot leave a CPU that another task holds. On this kernel
//! (6.18, EEVDF) an ordinary busy loop costs it little, because a waking worker preempts the loop
//! at once: with two busy loops on its CPU, a pinned worker waited ~300 µs per run and the slowest
//! of 50 sequential 1 KiB hits took 4.7 ms. What it cannot preempt is a real-time task: behind a
//! `SCHED_FIFO` loop it gets the 5% the kernel's RT throttling leaves, and one hit took 935 ms,
//! where an unpinned worker simply moves to the other CPU. So every [`TICK`] the valve reads each
//! pinned worker's scheduler figures (`/proc/self/task/TID/schedstat`). It unpins a worker
//! whose runs waited more than [`WAIT_PER_RUN`] on average and [`MIN_WAIT`] in all within the
//! tick, or which stayed runnable without running for two ticks in a row (a starved thread's
//! wait is only added once it runs: with this check, and the worker moved off its CPU rather
//! than merely allowed off it, the worst hit behind the real-time task fell from 935 ms to
//! 285 ms). The worker may then run on every other allowed CPU for a hold time,
//! after which it is pinned again. Under saturating load the worst tick measured was
//! 1.4 ms per run and 6.9 ms in all (sharing each CPU with a wrk thread that copies megabytes
//! per read), so pinning survives a benchmark. A hold starts at [`MIN_HOLD`] and doubles up to
//! [`MAX_HOLD`] each time contention returns within [`STEADY`] of pinning again.

use super::affinity;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zerocache_config::schema::CpuAffinity;

/// How often the valve reads the pinned workers' scheduler delay. 10 reads per second per worker,
/// each a small procfs read: nothing measurable against a data plane.
pub const TICK: Duration = Duration::from_millis(100);
/// Average wait per run above which a pinned worker is unpinned: above the worst tick measured
/// under saturating load (1.4 ms), far below a real-time neighbour's (~100 ms).
pub const WAIT_PER_RUN: Duration = Duration::from_millis(2);
/// Least total wait within one tick that counts: a tenth of the tick.
pub const MIN_WAIT: Duration = Duration::from_millis(10);
/// First hold time of an unpinned worker.
pub const MIN_HOLD: Duration = Duration::from_secs(1);
/// Longest hold time.
pub const MAX_HOLD: Duration = Duration::from_secs(64);
/// A worker pinned this long without contention starts again from [`MIN_HOLD`].
pub const STEADY: Duration = Duration::from_secs(10);

/// One worker's place.
struct Slot {
    /// The CPU it is pinned to when pinned; `None`: never pinned.
    cpu: Option<usize>,
    /// Its kernel thread id once it has started; 0 before.
    tid: AtomicI32,
    /// Whether it is pinned right now.
    pinned: AtomicBool,
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

    /// How many times the valve has unpinned a worker.
    pub fn unpins(&self) -> u64 {
        self.unpins.load(Ordering::Relaxed)
    }

    /// Called on worker `w`'s own thread as it starts: records its thread id and pins it.
    pub fn enter(&self, w: usize) {
        let s = &self.slots[w];
        s.tid.store(affinity::current_tid(), Ordering::Relaxed);
        if let Some(cpu) = s.cpu {
            match affinity::pin_current_thread(cpu) {
                Ok(()) => s.pinned.store(true, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(worker = w, cpu, error = %e, "cannot pin worker; it runs unpinned")
                }
            }
        }
    }

    /// Runs the valve until `stop` changes (returns at once unless the mode is `auto` and
    /// workers are pinned).
    pub async fn valve(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        if self.mode != CpuAffinity::Auto || !self.pins() {
            return;
        }
        let mut states: Vec<Valve> = self.slots.iter().map(|_| Valve::new()).collect();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            for (w, (slot, state)) in self.slots.iter().zip(&mut states).enumerate() {
                self.turn(w, slot, state, now);
            }
        }
    }

    /// One tick of the valve for worker `w`.
    fn turn(&self, w: usize, slot: &Slot, state: &mut Valve, now: Instant) {
        let (Some(cpu), tid) = (slot.cpu, slot.tid.load(Ordering::Relaxed)) else {
            return;
        };
        if tid == 0 {
            return;
        }
        let stats = match affinity::wait_stats(tid) {
            Ok(s) => s,
            Err(e) => {
                if !state.read_failed {
                    tracing::warn!(worker = w, error = %e, "cannot read a worker's scheduler delay; it stays as it is");
                    state.read_failed = true;
                }
                return;
            }
        };
        let last = state.last.replace(stats);
        if slot.pinned.load(Ordering::Relaxed) {
            let Some(last) = last else { return };
            let waited = Duration::from_nanos(stats.waited_ns.saturating_sub(last.waited_ns));
            let runs = stats.runs.saturating_sub(last.runs);
            // No run and no CPU time for a whole tick: asleep, or starved. Only a starved thread
            // is runnable; two ticks in a row so that a worker caught just as it wakes is not.
            let idle = runs == 0 && stats.on_cpu_ns == last.on_cpu_ns;
            state.starved_ticks = if idle && affinity::runnable(tid).unwrap_or(false) {
                state.starved_ticks + 1
            } else {
                0
            };
            let starved = state.starved_ticks >= 2;
            if !contended(waited, runs) && !starved {
                return;
            }
            state.starved_ticks = 0;
            // Every other CPU rather than every CPU: a runnable thread whose mask still holds its
            // CPU stays queued there until a load balancer pulls it; one whose mask does not is
            // moved at once.
            let elsewhere: Vec<usize> =
                self.allowed.iter().copied().filter(|c| *c != cpu).collect();
            if elsewhere.is_empty() {
                return;
            }
            if let Err(e) = affinity::allow_thread(tid, &elsewhere) {
                tracing::warn!(worker = w, error = %e, "cannot unpin a waiting worker");
                return;
            }
            slot.pinned.store(false, Ordering::Relaxed);
            self.unpins.fetch_add(1, Ordering::Relaxed);
            state.hold = match state.pinned_at {
                Some(at) if now.duration_since(at) < STEADY => (state.hold * 2).min(MAX_HOLD),
                _ => MIN_HOLD,
            };
            state.until = now + state.hold;
            tracing::info!(
                worker = w,
                cpu,
                waited_us = waited.as_micros() as u64,
                runs,
                starved,
                hold_s = state.hold.as_secs(),
                "a pinned worker keeps waiting for its CPU; it runs on the others for a while"
            );
        } else if now >= state.until {
            match affinity::allow_thread(tid, &[cpu]) {
                Ok(()) => {
                    slot.pinned.store(true, Ordering::Relaxed);
                    state.pinned_at = Some(now);
                    tracing::info!(worker = w, cpu, "worker pinned again");
                }
                Err(e) => {
                    state.hold = (state.hold * 2).min(MAX_HOLD);
                    state.until = now + state.hold;
                    tracing::warn!(worker = w, cpu, error = %e, "cannot pin worker again");
                }
            }
        }
    }
}

/// Whether `waited` over `runs` in one tick is a worker held off its CPU by another task.
pub fn contended(waited: Duration, runs: u64) -> bool {
    runs > 0 && waited >= MIN_WAIT && waited / runs.min(u32::MAX as u64) as u32 > WAIT_PER_RUN
}

/// The valve's memory of one worker.
struct Valve {
    last: Option<affinity::WaitStats>,
    hold: Duration,
    until: Instant,
    pinned_at: Option<Instant>,
    read_failed: bool,
    starved_ticks: u32,
}

impl Valve {
    fn new() -> Valve {
        Valve {
            last: None,
            hold: MIN_HOLD,
            until: Instant::now() + MIN_HOLD,
            pinned_at: None,
            read_failed: false,
            starved_ticks: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thresholds against what was measured: the worst ticks under saturating load (1.4 ms
    /// per run, 6.9 ms in all; 270 µs per run, 50 ms in all) and two busy loops (~300 µs per run)
    /// are not contention; a real-time neighbour (935 ms over 9 runs) is; one late wake-up alone
    /// is not.
    #[test]
    fn contention_is_long_waits_not_many_short_ones() {
        let us = Duration::from_micros;
        assert!(!contended(us(6900), 5));
        assert!(!contended(us(270) * 181, 181));
        assert!(!contended(us(300) * 10, 10));
        assert!(contended(us(935_217), 9));
        assert!(!contended(us(9_000), 1));
        assert!(contended(us(10_000), 1));
        assert!(!contended(us(10_000), 5));
        assert!(!contended(Duration::ZERO, 0));
    }

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
}

//! The valve's policy: from what the scheduler reports of a pinned worker each tick, whether to
//! move it off its CPU, and when to pin it again. Pure (readings in, an action out), so that
//! every rule below is pinned by a unit test; `placement` does the reading and the pinning.
//!
//! Why a valve: a pinned worker cannot leave a CPU that another task holds. On this kernel (6.18,
//! EEVDF) an ordinary busy loop costs it little, because a waking worker preempts the loop at
//! once: with two busy loops on its CPU, a pinned worker waited ~300 µs per run and the slowest of
//! 50 sequential 1 KiB hits took 4.7 ms. What it cannot preempt is a real-time task: behind a
//! `SCHED_FIFO` loop it gets the 5% that RT throttling leaves, and one hit took 935 ms, where an
//! unpinned worker simply moves to the other CPU.
//!
//! The rules:
//! - **Contended**: within one [`TICK`], the worker's runs waited more than [`WAIT_PER_RUN`] on
//!   average (times the workers pinned to the same CPU, which wait for one another) and at least
//!   [`MIN_WAIT`] in all. Under saturating wrk load at every benchmark size the worst tick
//!   measured was 1.4 ms per run and 6.9 ms in all (a wrk thread copying megabytes per read
//!   shares each CPU); behind the real-time task, ~100 ms per run.
//! - **Starved**: runnable, yet no run and no CPU time, for two ticks in a row. The scheduler
//!   adds a wait only when the thread finally runs, so a starved worker shows nothing else. One
//!   tick alone could be a worker caught just as it woke. With this rule, and the worker moved off
//!   its CPU rather than merely allowed off it, the worst hit behind the real-time task fell from
//!   935 ms to 285 ms.
//! - **Throttled**: a tick in which the process's cgroup hit its CPU quota says nothing about the
//!   CPU: throttled time counts as waiting. Such ticks decide nothing.
//! - **Hold**: an unpinned worker is pinned again after its hold. The first hold is [`MIN_HOLD`];
//!   each next one doubles, up to [`MAX_HOLD`], unless the worker made [`CALM_RUNS`] runs pinned
//!   without contention in between (counted in runs, not seconds, so that an idle worker does not
//!   look calm). A CPU that stays taken thus costs one stall per hold, and holds grow quickly.

use std::time::{Duration, Instant};

/// How often the pinned workers are read: 10 small procfs reads per second per worker, nothing
/// measurable against a data plane.
pub const TICK: Duration = Duration::from_millis(100);
/// Average wait per run (per worker sharing the CPU) above which a worker is contended.
pub const WAIT_PER_RUN: Duration = Duration::from_millis(2);
/// Least total wait within one tick that counts as contention: a tenth of the tick.
pub const MIN_WAIT: Duration = Duration::from_millis(10);
/// First hold of an unpinned worker.
pub const MIN_HOLD: Duration = Duration::from_secs(1);
/// Longest hold.
pub const MAX_HOLD: Duration = Duration::from_secs(64);
/// Runs without contention, pinned, after which the next hold starts again from [`MIN_HOLD`]:
/// about a second of a busy worker, a minute of a lightly loaded one.
pub const CALM_RUNS: u64 = 1000;

/// What the scheduler reports of one worker thread at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// Total time waited on a run queue, ns.
    pub waited_ns: u64,
    /// Times put on a CPU.
    pub runs: u64,
    /// CPU time used, ns (a precise clock: schedstat's only moves at scheduler ticks).
    pub cpu_ns: u64,
    /// Running or waiting for a CPU, rather than sleeping.
    pub runnable: bool,
}

/// What to do with a worker after a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave it as it is.
    Stay,
    /// Move it off its CPU for `hold`.
    Unpin {
        /// What the tick showed (zero when starved).
        waited: Duration,
        /// Runs in the tick.
        runs: u64,
        /// Whether it was starved rather than contended.
        starved: bool,
        /// How long it stays off.
        hold: Duration,
    },
    /// Its hold is over: pin it again.
    Repin,
}

/// The valve's memory of one worker.
#[derive(Debug)]
pub struct Valve {
    last: Option<Reading>,
    hold: Duration,
    until: Instant,
    unpinned_before: bool,
    calm_runs: u64,
    starved_ticks: u32,
    /// After an unpin that could not be applied: decide nothing until then.
    quiet_until: Option<Instant>,
    /// The hold state before the last proposed unpin, restored if it could not be applied.
    before_unpin: Option<(Duration, Instant, bool, u64)>,
}

impl Valve {
    /// A worker not seen yet.
    pub fn new(now: Instant) -> Valve {
        Valve {
            last: None,
            hold: MIN_HOLD,
            until: now,
            unpinned_before: false,
            calm_runs: 0,
            starved_ticks: 0,
            quiet_until: None,
            before_unpin: None,
        }
    }

    /// One tick: the worker is `pinned` now and reads `r`; `siblings` workers (itself
    /// included) are pinned to its CPU; `throttled` says the cgroup hit its quota this tick.
    pub fn step(
        &mut self,
        pinned: bool,
        r: Reading,
        siblings: u32,
        throttled: bool,
        now: Instant,
    ) -> Action {
        let last = self.last.replace(r);
        if !pinned {
            return if now >= self.until {
                Action::Repin
            } else {
                Action::Stay
            };
        }
        let Some(last) = last else {
            return Action::Stay;
        };
        if throttled || self.quiet_until.is_some_and(|q| now < q) {
            self.starved_ticks = 0;
            return Action::Stay;
        }
        self.quiet_until = None;
        let waited = Duration::from_nanos(r.waited_ns.saturating_sub(last.waited_ns));
        let runs = r.runs.saturating_sub(last.runs);
        let ran = runs > 0 || r.cpu_ns != last.cpu_ns;
        self.starved_ticks = if !ran && r.runnable {
            self.starved_ticks + 1
        } else {
            0
        };
        let starved = self.starved_ticks >= 2;
        if !starved && !contended(waited, runs, siblings) {
            self.calm_runs = self.calm_runs.saturating_add(runs);
            return Action::Stay;
        }
        self.starved_ticks = 0;
        self.before_unpin = Some((self.hold, self.until, self.unpinned_before, self.calm_runs));
        self.hold = if self.unpinned_before && self.calm_runs < CALM_RUNS {
            (self.hold * 2).min(MAX_HOLD)
        } else {
            MIN_HOLD
        };
        self.unpinned_before = true;
        self.calm_runs = 0;
        self.until = now + self.hold;
        Action::Unpin {
            waited,
            runs,
            starved,
            hold: self.hold,
        }
    }

    /// The unpin `step` asked for could not be made: it did not happen, so the holds are as
    /// they were, and nothing is decided for [`MIN_HOLD`], rather than fail every tick.
    pub fn unpin_failed(&mut self, now: Instant) {
        if let Some((hold, until, unpinned_before, calm_runs)) = self.before_unpin.take() {
            (self.hold, self.until, self.unpinned_before, self.calm_runs) =
                (hold, until, unpinned_before, calm_runs);
        }
        self.quiet_until = Some(now + MIN_HOLD);
    }

    /// The re-pin `step` asked for could not be made: try again after a longer hold.
    pub fn repin_failed(&mut self, now: Instant) {
        self.hold = (self.hold * 2).min(MAX_HOLD);
        self.until = now + self.hold;
    }
}

/// Whether `waited` over `runs` in one tick, with `siblings` workers pinned to the CPU, is a
/// worker held off its CPU by another task.
pub fn contended(waited: Duration, runs: u64, siblings: u32) -> bool {
    let per_run = WAIT_PER_RUN.as_nanos() * u128::from(siblings.max(1));
    runs > 0 && waited >= MIN_WAIT && waited.as_nanos() > per_run * u128::from(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The thresholds against what was measured: the worst ticks under saturating load (1.4 ms
    /// per run, 6.9 ms in all; 270 µs per run, 50 ms in all) and two busy loops (~300 µs per run)
    /// are not contention; a real-time neighbour (935 ms over 9 runs) is; one late wake-up below a
    /// tenth of the tick is not; siblings on the CPU raise the bar.
    #[test]
    fn contention_is_long_waits_not_many_short_ones() {
        let us = Duration::from_micros;
        assert!(!contended(us(6900), 5, 1));
        assert!(!contended(us(270) * 181, 181, 1));
        assert!(!contended(us(300) * 10, 10, 1));
        assert!(contended(us(935_217), 9, 1));
        assert!(!contended(us(9_999), 1, 1));
        assert!(contended(us(10_000), 1, 1));
        assert!(!contended(us(10_000), 5, 1));
        assert!(contended(us(30_000), 5, 2));
        assert!(!contended(us(30_000), 5, 3));
        assert!(!contended(Duration::ZERO, 0, 1));
    }

    /// Readings that advance by `waited` ms, `runs` runs and `cpu` ms per tick.
    struct Feed {
        r: Reading,
        now: Instant,
    }

    impl Feed {
        fn new() -> Feed {
            Feed {
                r: Reading::default(),
                now: Instant::now(),
            }
        }
        fn tick(&mut self, waited: u64, runs: u64, cpu: u64, runnable: bool) -> (Reading, Instant) {
            self.r.waited_ns += waited * 1_000_000;
            self.r.runs += runs;
            self.r.cpu_ns += cpu * 1_000_000;
            self.r.runnable = runnable;
            self.now += TICK;
            (self.r, self.now)
        }
    }

    fn unpin(hold: Duration, starved: bool) -> impl Fn(Action) -> bool {
        move |a| matches!(a, Action::Unpin { hold: h, starved: s, .. } if h == hold && s == starved)
    }

    #[test]
    fn contention_unpins_for_a_hold_then_repins() {
        let mut f = Feed::new();
        let mut v = Valve::new(f.now);
        let (r, now) = f.tick(0, 0, 0, false);
        assert_eq!(
            v.step(true, r, 1, false, now),
            Action::Stay,
            "first reading"
        );
        let (r, now) = f.tick(1, 200, 50, false);
        assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        let (r, now) = f.tick(300, 3, 5, true);
        let a = v.step(true, r, 1, false, now);
        assert_eq!(
            a,
            Action::Unpin {
                waited: 300 * MS,
                runs: 3,
                starved: false,
                hold: MIN_HOLD
            }
        );
        // Held for ten ticks, then pinned again. Waits while unpinned (on a busy other CPU)
        // neither end the hold nor count after it.
        for _ in 0..9 {
            let (r, now) = f.tick(500, 5, 10, true);
            assert_eq!(v.step(false, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(500, 5, 10, true);
        assert_eq!(v.step(false, r, 1, false, now), Action::Repin);
        // The reading taken while unpinned is the base of the next pinned tick: no stale delta
        // (counted from before the hold, the 5 s of waits above would unpin it at once).
        let (r, now) = f.tick(1, 100, 50, false);
        assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
    }

    #[test]
    fn holds_double_while_contention_returns_and_reset_after_calm_runs() {
        let mut f = Feed::new();
        let mut v = Valve::new(f.now);
        let (r, now) = f.tick(0, 0, 0, false);
        v.step(true, r, 1, false, now);
        let mut holds = Vec::new();
        for _ in 0..8 {
            let (r, now) = f.tick(500, 5, 1, true);
            match v.step(true, r, 1, false, now) {
                Action::Unpin { hold, .. } => holds.push(hold.as_secs()),
                a => panic!("{a:?}"),
            }
            // Pinned again at once (the hold's end is not what this test is about).
            let (r, now) = f.tick(0, 0, 0, false);
            v.step(true, r, 1, false, now);
        }
        assert_eq!(holds, [1, 2, 4, 8, 16, 32, 64, 64]);
        // An idle minute is not calm: no runs.
        for _ in 0..600 {
            let (r, now) = f.tick(0, 0, 0, false);
            assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(500, 5, 1, true);
        assert!(unpin(MAX_HOLD, false)(v.step(true, r, 1, false, now)));
        // CALM_RUNS runs without contention are.
        for _ in 0..CALM_RUNS / 100 {
            let (r, now) = f.tick(1, 100, 50, false);
            assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(500, 5, 1, true);
        assert!(unpin(MIN_HOLD, false)(v.step(true, r, 1, false, now)));
    }

    #[test]
    fn starvation_takes_two_silent_runnable_ticks() {
        let mut f = Feed::new();
        let mut v = Valve::new(f.now);
        let (r, now) = f.tick(0, 0, 0, false);
        v.step(true, r, 1, false, now);
        // Asleep: silent but not runnable.
        for _ in 0..5 {
            let (r, now) = f.tick(0, 0, 0, false);
            assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        }
        // Running flat out without a context switch: CPU time moves, no new run.
        for _ in 0..5 {
            let (r, now) = f.tick(0, 0, 100, true);
            assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        }
        // Caught just as it wakes, once: not yet.
        let (r, now) = f.tick(0, 0, 0, true);
        assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        let (r, now) = f.tick(0, 1, 1, false);
        assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        // Runnable and silent twice in a row: starved.
        let (r, now) = f.tick(0, 0, 0, true);
        assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        let (r, now) = f.tick(0, 0, 0, true);
        assert!(unpin(MIN_HOLD, true)(v.step(true, r, 1, false, now)));
    }

    #[test]
    fn throttled_ticks_and_failed_unpins_decide_nothing() {
        let mut f = Feed::new();
        let mut v = Valve::new(f.now);
        let (r, now) = f.tick(0, 0, 0, false);
        v.step(true, r, 1, false, now);
        // The cgroup's quota ran out: waits say nothing about the CPU.
        let (r, now) = f.tick(80, 4, 20, true);
        assert_eq!(v.step(true, r, 1, true, now), Action::Stay);
        let (r, now) = f.tick(80, 4, 20, true);
        assert!(unpin(MIN_HOLD, false)(v.step(true, r, 1, false, now)));
        // Say that unpin failed: it did not happen, so the next one is again the first (1 s),
        // after a hold's worth of quiet.
        v.unpin_failed(now);
        for _ in 0..9 {
            let (r, now) = f.tick(80, 4, 20, true);
            assert_eq!(v.step(true, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(80, 4, 20, true);
        assert!(unpin(MIN_HOLD, false)(v.step(true, r, 1, false, now)));
        // Held 1 s; at its end a re-pin is asked for, and fails: the next try is a doubled hold
        // (2 s) later, not sooner.
        for _ in 0..9 {
            let (r, now) = f.tick(0, 0, 0, false);
            assert_eq!(v.step(false, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(0, 0, 0, false);
        assert_eq!(v.step(false, r, 1, false, now), Action::Repin);
        v.repin_failed(now);
        for _ in 0..19 {
            let (r, now) = f.tick(0, 0, 0, false);
            assert_eq!(v.step(false, r, 1, false, now), Action::Stay);
        }
        let (r, now) = f.tick(0, 0, 0, false);
        assert_eq!(v.step(false, r, 1, false, now), Action::Repin);
    }
}

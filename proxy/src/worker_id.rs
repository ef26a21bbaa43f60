//! Which data-plane worker the calling thread is. A thread-local set once by each worker thread
//! (`server::workers`) and read wherever per-worker state is kept: sockets are polled by the
//! runtime that registered them, so idle upstream connections (`upstream::pool`) are tagged with
//! the worker that polls them.
//!
//! A module of its own, below both `server` and `upstream`, so that the upstream layer never
//! imports the server layer above it: the data plane's dependencies point one way.

use std::cell::Cell;

thread_local! {
    /// This thread's worker number; `usize::MAX` on threads that are not data-plane workers.
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The data-plane worker running on this thread (`usize::MAX` elsewhere): sockets are polled by
/// the runtime that registered them, so per-worker state such as idle upstream connections is
/// tagged with it.
pub fn current() -> usize {
    WORKER.with(|w| w.get())
}

/// Marks the calling thread as data-plane worker `me`; called once by each worker thread as it
/// starts.
pub fn set(me: usize) {
    WORKER.with(|w| w.set(me));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_no_worker_until_it_says_so() {
        std::thread::spawn(|| {
            assert_eq!(current(), usize::MAX);
            set(3);
            assert_eq!(current(), 3);
        })
        .join()
        .expect("thread");
    }
}

//! Process exit and the runtime's own threads.
//!
//! A runtime kept in a static is never dropped, so its background threads (a manifold's watchdog,
//! the reaper of a cancelled launch) still run when the process exits. The C runtime's exit
//! handlers then tear the CUDA driver down (its context, the pinned memory the queues live in)
//! while such a thread may be inside `cuStreamQuery` or reading a mapped heartbeat: a crash in
//! the driver, after everything the program did has succeeded. (Twice seen under
//! compute-sanitizer, whose teardown is slow, with no error of the program's; RELIABILITY.md.)
//!
//! So those threads touch the driver only while they hold a [`Busy`] from [`enter`], and an exit
//! handler, registered once the driver is loaded (so it runs before the driver's own, which run
//! in reverse order of registration), refuses new ones and waits a bounded time for those held to
//! be dropped. A thread refused leaves without touching the driver again, leaking what it held:
//! the process is ending.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Whether the process is exiting, and how many threads hold leave to touch the driver.
struct Gate {
    exiting: AtomicBool,
    busy: AtomicUsize,
}

static GATE: Gate = Gate::new();
static INSTALL: Once = Once::new();

/// How long the exit handler waits for threads inside the driver: longer than a watchdog's
/// longest look (a hang's abort waits up to 2 s for the kernel), short enough not to matter when
/// one is stuck in the driver for good.
const EXIT_WAIT: Duration = Duration::from_secs(3);

impl Gate {
    const fn new() -> Gate {
        Gate {
            exiting: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
        }
    }

    fn enter(&'static self) -> Option<Busy> {
        // Counted first, then checked: with `close`'s store-then-load, all sequentially
        // consistent, either `close` sees this thread busy or this thread sees the exit.
        self.busy.fetch_add(1, Ordering::SeqCst);
        if self.exiting.load(Ordering::SeqCst) {
            self.busy.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Busy(self))
    }

    /// Refuses leave from now on, and waits up to `wait` for what was given to be dropped.
    /// Whether it was.
    fn close(&self, wait: Duration) -> bool {
        self.exiting.store(true, Ordering::SeqCst);
        let start = Instant::now();
        loop {
            if self.busy.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if start.elapsed() >= wait {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A background thread's leave to call the driver or read driver-owned memory, until dropped.
#[must_use = "the leave lasts as long as the value"]
pub(crate) struct Busy(&'static Gate);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Leave to touch the driver, or `None` once the process is exiting (the thread should end,
/// leaking rather than freeing what it holds).
pub(crate) fn enter() -> Option<Busy> {
    GATE.enter()
}

/// Registers the exit handler, once per process. Call it with the driver loaded, before starting
/// a thread that uses [`enter`].
pub(crate) fn install() {
    INSTALL.call_once(|| {
        unsafe extern "C" {
            fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
        }
        // SAFETY: registers a plain function with the C runtime, which calls it once, at exit.
        // Should registration fail, the threads are as unguarded as before.
        let failed = unsafe { atexit(on_exit) } != 0;
        if failed {
            tracing::warn!("cannot register the exit handler that stops pptm's threads at exit");
        }
    });
}

extern "C" fn on_exit() {
    GATE.close(EXIT_WAIT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn leave_is_given_until_close_and_refused_after() {
        static GATE: Gate = Gate::new();
        let busy = GATE.enter().expect("open");
        assert_eq!(GATE.busy.load(Ordering::SeqCst), 1);
        drop(busy);
        assert!(GATE.close(Duration::ZERO), "nobody busy");
        assert!(GATE.enter().is_none());
        assert_eq!(GATE.busy.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn close_waits_for_the_leave_given_and_gives_up_on_one_never_dropped() {
        static GATE: Gate = Gate::new();
        static DONE: AtomicU64 = AtomicU64::new(0);
        let busy = GATE.enter().expect("open");
        let worker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            DONE.store(1, Ordering::SeqCst);
            drop(busy);
        });
        // Returns only once the worker dropped its leave, after its last write.
        assert!(GATE.close(Duration::from_secs(60)));
        assert_eq!(DONE.load(Ordering::SeqCst), 1);
        worker.join().unwrap();
        // A leave never dropped: close reports it rather than waiting forever.
        static STUCK: Gate = Gate::new();
        let held = STUCK.enter().expect("open");
        assert!(!STUCK.close(Duration::from_millis(10)));
        drop(held);
    }
}

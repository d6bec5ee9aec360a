//! The synchronization primitives the ring protocol (`gpu::queue`) is written against: std's,
//! or loom's under `--cfg loom`, so that the protocol can be model-checked (`gpu::queue_loom`).
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p pptm-runtime --release --lib queue_loom
//! ```
//!
//! Only the queue goes through this module. Its `Arc<Cell>` handles stay std's even under loom:
//! they cross into the manifold and the tickets (plain std code), and their reference counts are
//! no part of the protocol. A loom build is for running the models only: it compiles the whole
//! crate, but ring memory that is not made of loom atomics (the GPU's mapped memory) must not be
//! handed to a queue there.

#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, OnceLock};

/// Shares model state between loom threads (only the models use it; std's outside loom).
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::Arc;

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;

pub(crate) mod atomic {
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
}

#[cfg(loom)]
pub(crate) use loom_once::OnceLock;

/// loom has no `OnceLock`: this one keeps std's interface (`get` returns a reference, `set` waits
/// for a racing `set` to finish before it fails) on a loom atomic state word and a loom
/// `UnsafeCell`, so loom checks both the publication of the value and its data races.
#[cfg(loom)]
mod loom_once {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU8, Ordering};

    const EMPTY: u8 = 0;
    const WRITING: u8 = 1;
    const READY: u8 = 2;

    pub(crate) struct OnceLock<T> {
        state: AtomicU8,
        value: UnsafeCell<Option<T>>,
    }

    // SAFETY: as std's OnceLock: the value is written once, by the thread that won the state
    // word, and only read (shared) after `READY` is published with release ordering.
    unsafe impl<T: Send + Sync> Sync for OnceLock<T> {}
    unsafe impl<T: Send> Send for OnceLock<T> {}

    impl<T> OnceLock<T> {
        pub(crate) fn new() -> Self {
            OnceLock {
                state: AtomicU8::new(EMPTY),
                value: UnsafeCell::new(None),
            }
        }

        pub(crate) fn get(&self) -> Option<&T> {
            if self.state.load(Ordering::Acquire) != READY {
                return None;
            }
            // SAFETY: READY was stored (release) after the only write, which the acquire load
            // above orders before this read; the value is never written again.
            self.value.with(|p| unsafe { (*p).as_ref() })
        }

        pub(crate) fn set(&self, value: T) -> Result<(), T> {
            match self
                .state
                .compare_exchange(EMPTY, WRITING, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: winning EMPTY -> WRITING makes this the only writer, and no reader
                    // dereferences the value before READY.
                    self.value.with_mut(|p| unsafe { *p = Some(value) });
                    self.state.store(READY, Ordering::Release);
                    Ok(())
                }
                Err(_) => {
                    // As std: a losing `set` returns once the winner's value is in place.
                    while self.state.load(Ordering::Acquire) != READY {
                        loom::thread::yield_now();
                    }
                    Err(value)
                }
            }
        }
    }

    impl<T: std::fmt::Debug> std::fmt::Debug for OnceLock<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_tuple("OnceLock").field(&self.get()).finish()
        }
    }
}

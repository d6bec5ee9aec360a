//! One thread that watches the items async code awaits ([`crate::Ticket`] as a `Future`), so that
//! a service awaiting pptm work needs no thread per wait: it polls their completion entries and
//! wakes each task when its item has a result (or its manifold stopped).
//!
//! The thread starts with the first watch and sleeps on a condition variable while nothing is
//! watched. While something is, it polls as a waiting thread does: yielding for the first 200 µs
//! after a new watch (latency), then every 20 µs; and once a millisecond it checks that each
//! watched manifold's kernel is still alive, so a faulted device fails its items instead of
//! leaving their tasks asleep.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::{Cell, Manifold};

struct Watch {
    manifold: Arc<Manifold>,
    cell: Arc<Cell>,
    waker: Waker,
}

#[derive(Default)]
struct Watched {
    items: Vec<Watch>,
    /// When the last watch came in.
    newest: Option<Instant>,
}

struct Watcher {
    watched: Mutex<Watched>,
    wake: Condvar,
}

fn watcher() -> &'static Watcher {
    static WATCHER: OnceLock<&'static Watcher> = OnceLock::new();
    WATCHER.get_or_init(|| {
        let w: &'static Watcher = Box::leak(Box::new(Watcher {
            watched: Mutex::new(Watched::default()),
            wake: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("pptm-watcher".into())
            .spawn(move || run(w));
        if let Err(e) = spawned {
            // Without the thread, watches are polled by `watch` itself (each poll of the future).
            tracing::error!("pptm: cannot start the watcher thread: {e}");
        }
        w
    })
}

/// Wakes `waker` once `cell` has its result. A cell watched again replaces its waker (a task that
/// moved to another worker).
pub(crate) fn watch(manifold: &Arc<Manifold>, cell: &Arc<Cell>, waker: &Waker) {
    let w = watcher();
    let mut watched = w.watched.lock().unwrap_or_else(|e| e.into_inner());
    match watched
        .items
        .iter_mut()
        .find(|x| Arc::ptr_eq(&x.cell, cell))
    {
        Some(x) => x.waker.clone_from(waker),
        None => watched.items.push(Watch {
            manifold: manifold.clone(),
            cell: cell.clone(),
            waker: waker.clone(),
        }),
    }
    watched.newest = Some(Instant::now());
    drop(watched);
    w.wake.notify_one();
}

fn run(w: &'static Watcher) {
    let mut next_check = Instant::now();
    loop {
        let mut watched = w.watched.lock().unwrap_or_else(|e| e.into_inner());
        while watched.items.is_empty() {
            watched = w.wake.wait(watched).unwrap_or_else(|e| e.into_inner());
        }
        let now = Instant::now();
        let check = now >= next_check;
        if check {
            next_check = now + Duration::from_millis(1);
        }
        let mut ready = Vec::new();
        watched.items.retain(|x| {
            if check {
                x.manifold.check_alive_now();
            }
            if x.manifold.poll(&x.cell) {
                ready.push(x.waker.clone());
                false
            } else {
                true
            }
        });
        let fresh = watched
            .newest
            .is_some_and(|t| now - t < Duration::from_micros(200));
        drop(watched);
        for waker in ready {
            waker.wake();
        }
        if fresh {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

//! The watchdog and the device's own checks, on a GPU (RELIABILITY.md lists what each test proves).
//!
//! Each test opens its own runtime (the watchdog aborts and relaunches manifolds, which the shared
//! test runtime must not see), one at a time: a manifold is a whole-GPU grid. Without a GPU they
//! say SKIPPED (and fail under PPTM_REQUIRE_GPU=1).

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_close, kl_reference, positive};
use pptm::chains::KlComplexity;
use pptm::{Config, Error, Injection, Runtime};

/// One GPU runtime at a time in this process.
static GPU: Mutex<()> = Mutex::new(());

fn gpu_runtime(test: &str, config: Config) -> Option<Runtime> {
    let rt = common::open_gpu(test, config)?;
    eprintln!("{test}: {}", rt.describe());
    Some(rt)
}

/// An injected hang behind good items and in front of more: the good ones before it complete, the
/// hang and every item queued behind it fail with `Error::Hang` naming the hung item, threads
/// blocked on those tickets all return, and the next submission runs on a fresh manifold.
#[test]
fn injected_hang_fails_every_pending_item_and_the_next_submission_succeeds() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "injected_hang_fails_every_pending_item_and_the_next_submission_succeeds";
    let Some(rt) = gpu_runtime(test, Config::default()) else {
        return;
    };
    let deadline = rt.config().watchdog.expect("on by default");
    let (q, p) = (positive(4097), positive(4097));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    for _ in 0..3 {
        let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, want, "before the hang");
    }

    let start = Instant::now();
    let hang = rt.inject::<KlComplexity>(Injection::Hang).unwrap();
    let hang_seq = hang.seq().expect("a manifold item");
    let behind: Vec<_> = (0..6)
        .map(|_| KlComplexity::submit(&rt, &qb, &pb).unwrap())
        .collect();
    // Waiters on several threads: each must come back with the hang.
    let failed_after = std::thread::scope(|s| {
        let mut waiters = vec![s.spawn(move || (hang.wait().map(|_| 0.0f32), start.elapsed()))];
        for t in behind {
            waiters.push(s.spawn(move || (t.wait(), start.elapsed())));
        }
        let mut latest = Duration::ZERO;
        for w in waiters {
            let (r, at) = w.join().expect("no waiter panics");
            latest = latest.max(at);
            match r {
                Err(Error::Hang {
                    seq,
                    chain,
                    recovered,
                    stalled,
                    ..
                }) => {
                    assert_eq!(seq, hang_seq, "the error names the hung item");
                    assert_eq!(chain, "injected hang");
                    assert!(recovered, "the injected hang leaves on the abort");
                    assert!(stalled >= deadline);
                }
                other => panic!("expected Error::Hang, got {other:?}"),
            }
        }
        latest
    });
    eprintln!(
        "{test}: hang detected and 7 pending items failed {:.1} ms after the hang was submitted (watchdog deadline {deadline:?})",
        failed_after.as_secs_f64() * 1e3
    );

    // The next submission launches a fresh manifold and computes the right thing.
    let t = Instant::now();
    let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
    assert_close(got, want, "after the hang");
    eprintln!(
        "{test}: first item after the hang (relaunch included) {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    for _ in 0..100 {
        let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, want, "after the relaunch");
    }
    rt.shutdown().unwrap();
}

/// An item that runs five watchdog deadlines but reports progress is not a hang.
#[test]
fn a_long_item_with_progress_does_not_trip_the_watchdog() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "a_long_item_with_progress_does_not_trip_the_watchdog";
    let Some(rt) = gpu_runtime(test, Config::default()) else {
        return;
    };
    let deadline = rt.config().watchdog.expect("on by default");
    let (q, p) = (positive(1000), positive(1000));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    let t = Instant::now();
    let slow = rt
        .inject::<KlComplexity>(Injection::Slow(deadline * 5))
        .unwrap();
    let after = KlComplexity::submit(&rt, &qb, &pb).unwrap();
    slow.wait().expect("a long item with progress completes");
    assert_close(after.wait().unwrap(), want, "behind the long item");
    eprintln!(
        "{test}: a {:?} item completed in {:.1} ms",
        deadline * 5,
        t.elapsed().as_secs_f64() * 1e3
    );
    rt.shutdown().unwrap();
}

/// The launched variant's watchdog: an injected hang in an ordinary launch fails with
/// `Error::Hang` naming it, within the deadline and the abort (bar: twice the deadline plus
/// `common::SCHEDULING_MARGIN` for a loaded machine; the figure is printed), the thread that waited returns, and the next item of the same runtime runs.
#[test]
fn injected_hang_in_a_launched_item_is_a_hang_and_the_next_item_runs() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "injected_hang_in_a_launched_item_is_a_hang_and_the_next_item_runs";
    let config = Config {
        variant: pptm::Variant::FusedLaunched,
        ..Config::default()
    };
    let Some(rt) = gpu_runtime(test, config) else {
        return;
    };
    let deadline = rt.config().watchdog.expect("on by default");
    let (q, p) = (positive(4097), positive(4097));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    assert_close(
        KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap(),
        want,
        "before the hang",
    );
    let start = Instant::now();
    match rt.inject::<KlComplexity>(Injection::Hang) {
        Err(Error::Hang {
            variant,
            chain,
            recovered,
            stalled,
            seq,
            ..
        }) => {
            assert_eq!(variant, pptm::Variant::FusedLaunched);
            assert_eq!(chain, "injected hang");
            assert_eq!(seq, 2, "the launcher's second item");
            assert!(recovered, "the injected hang leaves on the abort");
            assert!(stalled >= deadline);
        }
        other => panic!("expected Error::Hang, got {other:?}"),
    }
    let failed_after = start.elapsed();
    eprintln!(
        "{test}: hang detected and failed {:.1} ms after the launch (watchdog deadline {deadline:?})",
        failed_after.as_secs_f64() * 1e3
    );
    assert!(
        failed_after < deadline * 2 + common::SCHEDULING_MARGIN,
        "the hang took {failed_after:?} to fail (deadline {deadline:?}, margin {:?})",
        common::SCHEDULING_MARGIN
    );
    for _ in 0..20 {
        let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, want, "after the hang");
    }
}

/// A launched item that runs five watchdog deadlines but reports progress is not a hang.
#[test]
fn a_long_launched_item_with_progress_does_not_trip_the_watchdog() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "a_long_launched_item_with_progress_does_not_trip_the_watchdog";
    let config = Config {
        variant: pptm::Variant::FusedLaunched,
        ..Config::default()
    };
    let Some(rt) = gpu_runtime(test, config) else {
        return;
    };
    let deadline = rt.config().watchdog.expect("on by default");
    let t = Instant::now();
    rt.inject::<KlComplexity>(Injection::Slow(deadline * 5))
        .expect("a long launched item with progress completes")
        .wait()
        .unwrap();
    let took = t.elapsed();
    assert!(took >= deadline * 5, "the item ran {took:?}");
    eprintln!(
        "{test}: a {:?} launched item completed in {:.1} ms",
        deadline * 5,
        took.as_secs_f64() * 1e3
    );
}

/// A descriptor the device's checks refuse gets a status word in its completion entry, a typed
/// error on the host, and the manifold carries on.
#[test]
fn a_descriptor_the_device_refuses_is_a_status_word_and_the_manifold_carries_on() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "a_descriptor_the_device_refuses_is_a_status_word_and_the_manifold_carries_on";
    let Some(rt) = gpu_runtime(test, Config::default()) else {
        return;
    };
    let (q, p) = (positive(777), positive(777));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    for _ in 0..3 {
        match rt
            .inject::<KlComplexity>(Injection::MisalignedArgument)
            .unwrap()
            .wait()
        {
            Err(Error::Device { status, chain, .. }) => {
                assert_eq!(status, 2, "PPTM_STATUS_BAD_ARGUMENT");
                assert_eq!(chain, "KlComplexity");
            }
            other => panic!("expected Error::Device, got {other:?}"),
        }
        let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, want, "after a refused item");
    }
    rt.shutdown().unwrap();
}

/// Fault injection is for the persistent manifold only; elsewhere it is a typed error.
#[test]
fn injection_outside_the_manifold_is_a_typed_error() {
    let rt = Runtime::cpu();
    assert!(matches!(
        rt.inject::<KlComplexity>(Injection::Hang),
        Err(Error::Config(_))
    ));
}

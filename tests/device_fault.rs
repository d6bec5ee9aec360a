//! A real device fault (an illegal address), injected. CUDA makes it sticky for the whole process,
//! so this test has a binary of its own. Without a GPU it says SKIPPED (and fails under
//! PPTM_REQUIRE_GPU=1).

mod common;

use std::time::Instant;

use common::{assert_close, kl_reference, positive};
use pptm::chains::KlComplexity;
use pptm::{Error, Injection};

/// The faulting item and every item queued behind it fail with `Error::DeviceFault` naming the
/// faulting item; threads waiting on them return; later calls are typed errors, not hangs or
/// panics.
#[test]
fn an_injected_fault_names_the_faulting_item_and_nothing_hangs() {
    let test = "an_injected_fault_names_the_faulting_item_and_nothing_hangs";
    let Some(rt) = common::open_gpu(test, pptm::Config::default()) else {
        return;
    };
    let (q, p) = (positive(4097), positive(4097));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
    assert_close(got, want, "before the fault");

    let start = Instant::now();
    let fault = rt.inject::<KlComplexity>(Injection::Fault).unwrap();
    let fault_seq = fault.seq().expect("a manifold item");
    let behind: Vec<_> = (0..4)
        .map(|_| KlComplexity::submit(&rt, &qb, &pb))
        .collect();
    let latest = std::thread::scope(|s| {
        let mut waiters = vec![s.spawn(move || (fault.wait().map(|_| 0.0f32), start.elapsed()))];
        for t in behind {
            match t {
                Ok(t) => waiters.push(s.spawn(move || (t.wait(), start.elapsed()))),
                // The fault may already have been noticed: then submitting is refused.
                Err(e) => assert!(
                    matches!(e, Error::ManifoldStopped { .. }),
                    "unexpected {e:?}"
                ),
            }
        }
        let mut latest = std::time::Duration::ZERO;
        for w in waiters {
            let (r, at) = w.join().expect("no waiter panics");
            latest = latest.max(at);
            match r {
                Err(Error::DeviceFault {
                    seq, chain, reason, ..
                }) => {
                    assert_eq!(seq, fault_seq, "the error names the faulting item");
                    assert_eq!(chain, "injected fault");
                    assert!(!reason.is_empty());
                }
                other => panic!("expected Error::DeviceFault, got {other:?}"),
            }
        }
        latest
    });
    eprintln!(
        "{test}: fault reported to every pending item {:.1} ms after it was submitted",
        latest.as_secs_f64() * 1e3
    );
    // Later calls: typed errors, promptly.
    let t = Instant::now();
    let later = KlComplexity::submit(&rt, &qb, &pb).and_then(|t| t.wait());
    assert!(later.is_err(), "the process's GPU context is gone");
    eprintln!(
        "{test}: a later submission: {} ({:.1} ms)",
        later.unwrap_err(),
        t.elapsed().as_secs_f64() * 1e3
    );
    assert!(rt.upload(&q).is_err(), "uploads fail too, as errors");
    drop(rt);
}

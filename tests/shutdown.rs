//! Shutdown and residency: tests that create their own runtimes, so they run one at a time and in
//! a test binary of their own (a manifold is a whole-GPU grid).

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_close, kl_reference, positive};
use pptm::chains::KlComplexity;
use pptm::{Error, Runtime};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn runtimes() -> Vec<Runtime> {
    common::init_logging();
    let mut v = vec![Runtime::cpu()];
    v.extend(common::open_gpu(
        "the GPU half of a shutdown test",
        pptm::Config::default(),
    ));
    v
}

/// Whether a GPU runtime opens here (a missing GPU is skipped loudly, or fails under
/// PPTM_REQUIRE_GPU). The tests that use it make runtimes of their own.
fn gpu_present() -> bool {
    runtimes()
        .iter()
        .any(|r| r.backend() == pptm::BackendKind::Gpu)
}

#[test]
fn dropping_the_runtime_with_items_in_flight_resolves_every_ticket() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for rt in runtimes() {
        let n = 1 << 16;
        let (q, p) = (positive(n), positive(n));
        let want = kl_reference(&q, &p);
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let tickets: Vec<_> = (0..1000)
            .map(|_| KlComplexity::submit(&rt, &qb, &pb).unwrap())
            .collect();
        let limit = rt.config().shutdown_timeout;
        let started = Instant::now();
        drop(rt);
        let dropped_in = started.elapsed();
        let (mut ok, mut shut) = (0, 0);
        for t in tickets {
            match t.wait() {
                Ok(v) => {
                    assert_close(v, want, "drained item");
                    ok += 1;
                }
                Err(Error::ShutDown) => shut += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert_eq!(ok + shut, 1000);
        // Items submitted before the drop are drained, not dropped.
        assert_eq!(ok, 1000, "every item submitted before the drop completes");
        // Not a speed bound: a drop that drains (as this one did) finished before its shutdown
        // timeout, past which it would have given up on the manifold and leaked it.
        assert!(
            dropped_in < limit,
            "drop took {dropped_in:?}, past the shutdown timeout {limit:?}"
        );
        // Buffers outlive the runtime.
        assert_eq!(qb.to_vec().unwrap(), q);
    }
}

#[test]
fn shutdown_drains_and_a_later_submission_relaunches() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for rt in runtimes() {
        let (qh, ph) = (positive(10), positive(10));
        let want = kl_reference(&qh, &ph);
        let (q, p) = (rt.upload(&qh).unwrap(), rt.upload(&ph).unwrap());
        rt.prepare::<KlComplexity>().unwrap();
        let v = KlComplexity::submit(&rt, &q, &p).unwrap().wait().unwrap();
        assert_close(v, want, "before the shutdown");
        rt.shutdown().unwrap();
        if rt.backend() == pptm::BackendKind::Gpu {
            // The manifold is gone; a new submission launches a fresh one, which computes.
            let v = KlComplexity::submit(&rt, &q, &p).unwrap().wait().unwrap();
            assert_close(v, want, "after the shutdown");
        }
    }
}

#[test]
fn runtimes_beyond_the_gpus_capacity_fail_to_launch_instead_of_hanging() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !gpu_present() {
        return;
    }
    // Resident for good: a runtime that parks when idle gives the GPU back, and the next one
    // would fit (docs/embedding.md).
    let cfg = pptm::Config {
        launch_timeout: Duration::from_millis(500),
        park_when_idle: None,
        ..Default::default()
    };
    let mut live = Vec::new();
    let mut refused = None;
    for _ in 0..8 {
        let rt = Runtime::gpu_with(cfg.clone()).unwrap();
        let t = Instant::now();
        match rt.prepare::<KlComplexity>() {
            Ok(()) => live.push(rt),
            Err(e) => {
                refused = Some((e, t.elapsed()));
                break;
            }
        }
    }
    let (err, took) = refused.expect("eight whole-GPU manifolds cannot all be resident");
    assert!(matches!(err, Error::Launch { .. }), "{err}");
    eprintln!("a launch that cannot be resident was refused after {took:?}");
    assert!(
        took < cfg.launch_timeout + common::SCHEDULING_MARGIN,
        "refusal took {took:?} (launch timeout {:?}, margin {:?})",
        cfg.launch_timeout,
        common::SCHEDULING_MARGIN
    );
    // The resident ones still work.
    for rt in &live {
        let (qh, ph) = (positive(1000), positive(1000));
        let (q, p) = (rt.upload(&qh).unwrap(), rt.upload(&ph).unwrap());
        let got = KlComplexity::submit(rt, &q, &p).unwrap().wait().unwrap();
        assert_close(got, kl_reference(&qh, &ph), "a resident runtime");
    }
    drop(live);
    // Once they are gone, a new runtime launches (the cancelled launch exits when it starts).
    let rt = Runtime::gpu().unwrap();
    rt.prepare::<KlComplexity>().unwrap();
    rt.submit_noop::<KlComplexity>().unwrap().wait().unwrap();
}

/// Runs `f` on a thread of its own and fails the test if it has not returned within `limit`,
/// instead of hanging the test binary.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what} panicked (its message is above)")
        }
    }
}

/// Freeing pinned host memory waits for every running kernel, and a manifold runs until it is
/// shut down: a runtime with several manifolds once hung shutting its first one down, while the
/// others still ran. The same holds for a runtime dropped beside another runtime's manifold.
#[test]
fn manifolds_shut_down_one_by_one_beside_others_still_resident() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !gpu_present() {
        return;
    }
    use pptm::Chain as _;
    use pptm::chains::{DistanceKth, GemvAxpbySum};
    within(
        Duration::from_secs(60),
        "a three-domain runtime's shutdown",
        || {
            let rt = Runtime::gpu().unwrap();
            rt.prepare_domains(&[
                KlComplexity::DOMAIN,
                DistanceKth::DOMAIN,
                GemvAxpbySum::DOMAIN,
            ])
            .unwrap();
            let (q, p) = (positive(1000), positive(1000));
            let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
            let got = KlComplexity::submit(&rt, &qb, &pb).unwrap().wait().unwrap();
            assert_close(got, kl_reference(&q, &p), "three domains, then shutdown");
            rt.shutdown().unwrap();
        },
    );
    within(
        Duration::from_secs(60),
        "dropping a runtime beside another's manifold",
        || {
            let half = |_| {
                let rt = Runtime::gpu_with(pptm::Config {
                    max_sms: Some(32),
                    ..Default::default()
                })
                .unwrap();
                rt.prepare::<KlComplexity>().unwrap();
                rt
            };
            let (first, second) = (half(0), half(1));
            drop(first);
            let (q, p) = (positive(1000), positive(1000));
            let (qb, pb) = (second.upload(&q).unwrap(), second.upload(&p).unwrap());
            let got = KlComplexity::submit(&second, &qb, &pb)
                .unwrap()
                .wait()
                .unwrap();
            assert_close(got, kl_reference(&q, &p), "beside a dropped runtime");
            drop(second);
        },
    );
}

/// `cuGraphInstantiate` beside a resident manifold can hang inside the driver (runtime/src/gpu/
/// graphs.rs): the linear-algebra tests hung that way when their unfused-graph items met new
/// shapes while the manifold ran. The graph variant now makes its graphs before any manifold is
/// resident and only updates them afterwards. Here it meets 60 new shapes, more than it has graphs,
/// beside a resident manifold, and every result must still be right.
#[test]
fn unfused_graph_items_of_new_shapes_beside_a_resident_manifold_complete() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !gpu_present() {
        return;
    }
    use pptm::chains::GemvAxpbySum;
    within(
        Duration::from_secs(120),
        "unfused-graph items beside a manifold",
        || {
            let resident = Runtime::gpu().unwrap();
            resident.prepare::<GemvAxpbySum>().unwrap();
            let graph = Runtime::gpu_with(pptm::Config {
                variant: pptm::Variant::UnfusedGraph,
                ..Default::default()
            })
            .unwrap();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            };
            for shape in 0..60 {
                let (m, n) = (1 + 37 * shape, 1 + (shape * 113) % 300);
                let x: Vec<f32> = (0..n).map(|_| next()).collect();
                let a: Vec<f32> = (0..m * n).map(|_| next()).collect();
                let y: Vec<f32> = (0..m).map(|_| next()).collect();
                let want: f64 = (0..m)
                    .map(|i| {
                        let ax: f64 = (0..n)
                            .map(|j| f64::from(a[i * n + j]) * f64::from(x[j]))
                            .sum();
                        let z = 0.5 * ax - 2.0 * f64::from(y[i]);
                        z * z
                    })
                    .sum();
                let (xb, ab, yb) = (
                    graph.upload(&x).unwrap(),
                    graph.upload(&a).unwrap(),
                    graph.upload(&y).unwrap(),
                );
                let got = GemvAxpbySum::submit(&graph, &xb, &ab, &yb, 0.5, -2.0)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_close(
                    got,
                    want,
                    format!("graph variant, shape {shape}: m={m} n={n}"),
                );
            }
            // The manifold is still resident and answering.
            let (x, a, y) = (
                resident.upload(&[1.0f32, 2.0]).unwrap(),
                resident.upload(&[1.0f32, 1.0]).unwrap(),
                resident.upload(&[0.0f32]).unwrap(),
            );
            assert_eq!(
                GemvAxpbySum::submit(&resident, &x, &a, &y, 1.0, 1.0)
                    .unwrap()
                    .wait()
                    .unwrap(),
                9.0
            );
        },
    );
}

/// A `cuStreamCreate` beside resident manifolds once stopped inside the driver, like graph
/// instantiation: streams and events are made when the device opens and lent out (runtime/src/gpu/
/// driver.rs). Launched-variant runtimes made one after another beside a resident manifold take
/// them until none is left; the next one fails with a typed error instead of making one, and
/// once the others are dropped their streams and events serve again.
#[test]
fn runtimes_beside_a_resident_manifold_use_lent_streams_and_are_refused_when_none_are_left() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !gpu_present() {
        return;
    }
    within(
        Duration::from_secs(120),
        "launched runtimes beside a manifold",
        || {
            let resident = Runtime::gpu().unwrap();
            resident.prepare::<KlComplexity>().unwrap();
            let (q, p) = (positive(1000), positive(1000));
            let want = kl_reference(&q, &p);
            let run = |rt: &Runtime| -> Result<f32, Error> {
                let (qb, pb) = (rt.upload(&q)?, rt.upload(&p)?);
                KlComplexity::submit(rt, &qb, &pb)?.wait()
            };
            let mut launched = Vec::new();
            let refused = loop {
                assert!(
                    launched.len() < 500,
                    "500 launched runtimes beside a manifold and no refusal: streams and events are not lent"
                );
                let rt = Runtime::gpu_with(pptm::Config {
                    variant: pptm::Variant::FusedLaunched,
                    ..Default::default()
                })
                .unwrap();
                match run(&rt) {
                    Ok(got) => {
                        assert_close(got, want, format!("launched runtime {}", launched.len()))
                    }
                    Err(e @ Error::DriverObjectsUnavailable { .. }) => break e,
                    Err(e) => panic!("launched runtime {}: {e}", launched.len()),
                }
                launched.push(rt);
            };
            eprintln!("after {} launched runtimes: {refused}", launched.len());
            assert!(
                launched.len() >= 16,
                "only {} launched runtimes before the refusal",
                launched.len()
            );
            drop(launched);
            let again = Runtime::gpu_with(pptm::Config {
                variant: pptm::Variant::FusedLaunched,
                ..Default::default()
            })
            .unwrap();
            assert_close(
                run(&again).unwrap(),
                want,
                "a launched runtime after the others dropped",
            );
            assert_close(run(&resident).unwrap(), want, "the resident manifold");
        },
    );
}

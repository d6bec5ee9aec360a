//! Tickets and pipelines as futures (issue 34): awaited by an async runtime (tokio, one thread),
//! many at once, on every backend, against f64 with outputs poisoned; and on the manifolds, the
//! first poll of a long pipeline returns at once (Pending) instead of blocking the task's thread,
//! and pptm's watcher thread wakes the task when it completes.

#[macro_use]
mod common;

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::uniform;
use pptm::chains::KlComplexity;
use pptm::ops::Axpby;
use pptm::{BackendKind, FusionBuilder, Runtime, Variant};

/// α x + β y, in a domain of its own.
#[derive(FusionBuilder)]
#[fusion(domain = "async_tickets")]
pub struct BlendAsync {
    #[stage(1)]
    blend: Axpby,
}

const SIZES: [usize; 4] = [1, 7, 1023, (1 << 20) + 3];

fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Σ q (ln q − ln p) in f64.
fn kl(q: &[f32], p: &[f32]) -> f64 {
    q.iter()
        .zip(p)
        .map(|(&q, &p)| {
            let (q, p) = (f64::from(q), f64::from(p));
            q * (q.ln() - p.ln())
        })
        .sum()
}

/// Many tickets in flight, awaited one after the other on one thread: each resolves to what
/// `wait` gives.
fn tickets_resolve_as_futures(rt: &Runtime) {
    let what = rt.describe();
    one_thread().block_on(async {
        for n in SIZES {
            let (q, p) = (uniform(n, 0.1, 1.0), uniform(n, 0.1, 1.0));
            let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
            let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
            let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
            let mut outs: Vec<_> = (0..4)
                .map(|_| rt.upload(&vec![f32::NAN; n]).unwrap())
                .collect();
            let scalars: Vec<_> = (0..8)
                .map(|_| KlComplexity::submit(rt, &qb, &pb).unwrap())
                .collect();
            let vectors: Vec<_> = outs
                .iter_mut()
                .enumerate()
                .map(|(k, out)| BlendAsync::submit(rt, &xb, &cb, 0.5, k as f32, out).unwrap())
                .collect();
            let want = kl(&q, &p);
            let scale: f64 = q
                .iter()
                .zip(&p)
                .map(|(&q, &p)| (f64::from(q) * (f64::from(q).ln() - f64::from(p).ln())).abs())
                .sum();
            for t in scalars {
                let got = f64::from(t.await.unwrap());
                assert!(
                    (got - want).abs() <= 1e-5 * scale + 1e-6,
                    "{what}: KL, n = {n}: awaited {got}, f64 reference {want}"
                );
            }
            for v in vectors {
                v.await.unwrap();
            }
            for (k, out) in outs.iter().enumerate() {
                let got = out.to_vec().unwrap();
                for i in 0..n {
                    let w = 0.5 * f64::from(x[i]) + k as f64 * f64::from(c[i]);
                    assert!(
                        (f64::from(got[i]) - w).abs() <= 1e-6 * w.abs().max(1.0),
                        "{what}: blend {k}, n = {n}, element {i}: got {}, f64 reference {w}",
                        got[i]
                    );
                }
            }
        }
        // An awaited ticket is consumed: its result is taken once.
        let (qb, pb) = (rt.upload(&[0.5f32]).unwrap(), rt.upload(&[0.5f32]).unwrap());
        assert_eq!(
            KlComplexity::submit(rt, &qb, &pb).unwrap().await.unwrap(),
            0.0
        );
    });
}

/// A pipeline of a 1000-iteration device loop (2000 dependent steps), awaited: on the manifolds
/// its first poll returns Pending at once (the loop takes milliseconds), and the watcher wakes the
/// task when it completes; everywhere, the result is what f64 gives.
fn pipelines_resolve_as_futures(rt: &Runtime) {
    let what = rt.describe();
    const ITERATIONS: u32 = 1000;
    let n = 4099;
    let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
    let cb = rt.upload(&c).unwrap();
    let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
    let mut v = rt.upload(&x).unwrap();
    let iterations = {
        let mut p = rt.pipeline();
        let ci = p.input(&cb);
        let (uo, vo) = (p.output(&mut u), p.output(&mut v));
        let lp = p
            .repeat(ITERATIONS, |p| {
                BlendAsync::push(p, vo, ci, 1.0, 0.001, uo)?;
                BlendAsync::push(p, uo, ci, 1.0, 0.001, vo)?;
                Ok(())
            })
            .unwrap();
        let mut waiting = Box::pin(p.wait_async());
        let first = waiting
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        let on_manifolds =
            rt.backend() == BackendKind::Gpu && rt.config().variant == Variant::Fused;
        if on_manifolds {
            assert!(
                first.is_pending(),
                "{what}: the first poll of a 2000-step pipeline must not wait for it"
            );
        }
        let results = match first {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => one_thread()
                .block_on(async { tokio::time::timeout(Duration::from_secs(60), waiting).await })
                .expect("the watcher wakes the task")
                .unwrap(),
        };
        results.iterations(lp).unwrap()
    };
    assert_eq!(iterations, ITERATIONS, "{what}");
    let got = v.to_vec().unwrap();
    for i in 0..n {
        let w = f64::from(x[i]) + 2.0 * f64::from(c[i]);
        assert!(
            (f64::from(got[i]) - w).abs() <= 5e-4,
            "{what}: element {i}: got {}, f64 reference {w}",
            got[i]
        );
    }
}

/// A ticket can move to a task on another worker thread (a multi-threaded async runtime).
#[test]
fn tickets_are_send() {
    fn send<T: Send>(_: &T) {}
    let rt = Runtime::cpu();
    let (qb, pb) = (rt.upload(&[0.5f32]).unwrap(), rt.upload(&[0.5f32]).unwrap());
    let t = KlComplexity::submit(&rt, &qb, &pb).unwrap();
    send(&t);
    assert_eq!(t.wait().unwrap(), 0.0);
}

on_every_backend!(tickets_resolve_as_futures, pipelines_resolve_as_futures);

//! The CPU backend's fast path (elementwise chains fused per element, in parallel chunks, over
//! the f32 inputs where they lie) against the whole-tensor f64 reference it replaces
//! (`Runtime::cpu_reference`), on fresh random inputs at odd sizes and around the chunk size,
//! outputs poisoned: tensors bit for bit, sums to f32 rounding, and the same on every run. And
//! items run on pptm's worker pool after `submit` returns: many in flight at once, a leaked
//! ticket's item finishing before anything reads its buffers.

mod common;

use common::uniform;
use pptm::Runtime;
use pptm::chains::{AccuracyPipeline, GemvAxpbySum, KlComplexity, KlTerms};

const SIZES: [usize; 7] = [1, 7, 1023, 16_384, 16_385, 100_003, (1 << 20) + 3];

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn the_fast_path_gives_what_the_reference_gives() {
    let (fast, reference) = (Runtime::cpu(), Runtime::cpu_reference());
    assert!(
        fast.describe().contains("in parallel"),
        "{}",
        fast.describe()
    );
    assert!(
        reference.describe().contains("reference"),
        "{}",
        reference.describe()
    );
    for n in SIZES {
        let (q, p) = (uniform(n, 0.01, 1.0), uniform(n, 0.01, 1.0));
        let (obs, pred, prec) = (
            uniform(n, -2.0, 2.0),
            uniform(n, -2.0, 2.0),
            uniform(n, 0.0, 3.0),
        );
        let mut scalars = Vec::new();
        let mut terms = Vec::new();
        for rt in [&fast, &reference, &fast] {
            let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
            let (ob, rb, wb) = (
                rt.upload(&obs).unwrap(),
                rt.upload(&pred).unwrap(),
                rt.upload(&prec).unwrap(),
            );
            let kl = KlComplexity::submit(rt, &qb, &pb).unwrap().wait().unwrap();
            let acc = AccuracyPipeline::submit(rt, &ob, &rb, &wb)
                .unwrap()
                .wait()
                .unwrap();
            let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
            KlTerms::submit(rt, &qb, &pb, &mut out)
                .unwrap()
                .wait()
                .unwrap();
            scalars.push((kl, acc));
            terms.push(out.to_vec().unwrap());
        }
        let (f, r, again) = (scalars[0], scalars[1], scalars[2]);
        assert!(
            close(f.0, r.0),
            "KL, n = {n}: fast {} reference {}",
            f.0,
            r.0
        );
        assert!(
            close(f.1, r.1),
            "accuracy, n = {n}: fast {} reference {}",
            f.1,
            r.1
        );
        assert_eq!(f, again, "n = {n}: the fast path is deterministic");
        assert_eq!(terms[0], terms[1], "KL terms, n = {n}: bit for bit");
        assert_eq!(terms[0], terms[2], "KL terms, n = {n}: again");
    }
}

/// A chain the fast path does not take (a GEMV) runs the reference on both runtimes.
#[test]
fn other_chains_run_the_reference() {
    let (fast, reference) = (Runtime::cpu(), Runtime::cpu_reference());
    let (m, n) = (37, 1023);
    let (x, a, y) = (
        uniform(n, -1.0, 1.0),
        uniform(m * n, -1.0, 1.0),
        uniform(m, -1.0, 1.0),
    );
    let run = |rt: &Runtime| {
        let (xb, ab, yb) = (
            rt.upload(&x).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&y).unwrap(),
        );
        GemvAxpbySum::submit(rt, &xb, &ab, &yb, 1.0, 0.5)
            .unwrap()
            .wait()
            .unwrap()
    };
    assert_eq!(run(&fast), run(&reference));
}

/// Many items in flight at once on one thread (large ones go to the pool), each checked against
/// a plain f64 loop; then again with every ticket resolved before it is waited.
#[test]
fn tickets_overlap_and_each_resolves_to_its_own_result() {
    let rt = Runtime::cpu();
    let n = (1 << 18) + 3;
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..12)
        .map(|_| (uniform(n, 0.01, 1.0), uniform(n, 0.01, 1.0)))
        .collect();
    let buffers: Vec<_> = inputs
        .iter()
        .map(|(q, p)| (rt.upload(q).unwrap(), rt.upload(p).unwrap()))
        .collect();
    let expected: Vec<f64> = inputs
        .iter()
        .map(|(q, p)| {
            q.iter()
                .zip(p)
                .map(|(&q, &p)| f64::from(q) * (f64::from(q).ln() - f64::from(p).ln()))
                .sum()
        })
        .collect();
    for poll_first in [false, true] {
        let tickets: Vec<_> = buffers
            .iter()
            .map(|(q, p)| KlComplexity::submit(&rt, q, p).unwrap())
            .collect();
        if poll_first {
            while !tickets.iter().all(|t| t.is_ready()) {
                std::thread::yield_now();
            }
        }
        for (k, (t, want)) in tickets.into_iter().zip(&expected).enumerate() {
            let got = f64::from(t.wait().unwrap());
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "item {k}: {got} against {want}"
            );
        }
    }
}

/// A leaked ticket ends the borrow of its buffers while its item may still run on the pool: the
/// item holds their memory and locks, so the output read next waits for it and is complete, and
/// the input can be rewritten once it is done.
#[test]
fn a_leaked_tickets_item_finishes_before_its_buffers_are_read() {
    let rt = Runtime::cpu();
    for n in [7, (1 << 20) + 3] {
        let (q, p) = (uniform(n, 0.01, 1.0), uniform(n, 0.01, 1.0));
        let (mut qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        std::mem::forget(KlTerms::submit(&rt, &qb, &pb, &mut out).unwrap());
        let got = out.to_vec().unwrap();
        for (i, (&g, (&q, &p))) in got.iter().zip(q.iter().zip(&p)).enumerate() {
            let want = f64::from(q) * (f64::from(q).ln() - f64::from(p).ln());
            assert!(
                (f64::from(g) - want).abs() <= 1e-6 * want.abs().max(1e-6),
                "n = {n}, element {i}: {g} against {want}"
            );
        }
        qb.fill(0.5).unwrap();
        drop((qb, pb, out));
    }
}

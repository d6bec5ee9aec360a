//! `#[stage(n, finite = true)]`: a NaN or an infinity in a checked stage fails the item with
//! `Error::NonFinite` on every backend and variant, wherever the value arises (a streaming
//! element, a GEMV's prologue or epilogue, a reduction's result, any block), the outputs are still
//! written, and the next item is unaffected.
//!
//! The chains are declared here, in a domain of their own, as an application would declare them.

#[macro_use]
mod common;

use common::{assert_close, kl_reference, kl_term, positive};
use pptm::ops::{
    BeliefUpdate, GemvT, KlDivergence, PrecisionWeight, PredictionError, SumReduction,
};
use pptm::{Error, FusionBuilder, Runtime};
use rand::Rng;

/// KL divergence whose total must be finite (checked once, on the reduction's result).
#[derive(FusionBuilder)]
#[fusion(domain = "checked")]
pub struct CheckedKl {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true, finite = true)]
    total: SumReduction,
}

/// Per-element KL terms, each checked where it is computed.
#[derive(FusionBuilder)]
#[fusion(domain = "checked")]
pub struct CheckedKlTerms {
    #[stage(1, finite = true)]
    kl: KlDivergence,
}

/// A belief update whose prediction error (the GEMV-T's prologue) and update (its epilogue) are
/// checked.
#[derive(FusionBuilder)]
#[fusion(domain = "checked")]
pub struct CheckedBeliefUpdate {
    #[stage(1, finite = true)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3)]
    gradient: GemvT,
    #[stage(4, finite = true)]
    update: BeliefUpdate,
}

/// The same chain with only the prediction error (the GEMV-T's prologue) checked: an infinity
/// there must fail the item although the unchecked epilogue would let it through.
#[derive(FusionBuilder)]
#[fusion(domain = "checked")]
pub struct CheckedPredictionError {
    #[stage(1, finite = true)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3)]
    gradient: GemvT,
    #[stage(4)]
    update: BeliefUpdate,
}

const SIZES: &[usize] = &[1, 7, 1023, (1 << 20) + 3];

fn expect_non_finite<T: std::fmt::Debug>(got: pptm::Result<T>, chain: &str, what: &str) {
    match got {
        Err(Error::NonFinite { chain: c }) if c == chain => {}
        other => panic!("{what}: expected Error::NonFinite for {chain}, got {other:?}"),
    }
}

fn checked_reduction_fails_on_an_infinite_total(rt: &Runtime) {
    let mut rng = common::rng();
    for &n in SIZES {
        let q = positive(n);
        let mut p = positive(n);
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let got = CheckedKl::submit(rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, kl_reference(&q, &p), format_args!("n = {n}"));
        // q > 0 = p at one element, anywhere (any block's share): the total is +inf.
        let at = rng.random_range(0..n);
        p[at] = 0.0;
        let pb = rt.upload(&p).unwrap();
        expect_non_finite(
            CheckedKl::submit(rt, &qb, &pb).unwrap().wait(),
            "CheckedKl",
            &format!("n = {n}, p[{at}] = 0"),
        );
        // NaN in, NaN out.
        let mut qn = q.clone();
        qn[n - 1] = f32::NAN;
        expect_non_finite(
            CheckedKl::submit(rt, &rt.upload(&qn).unwrap(), &rt.upload(&q).unwrap())
                .unwrap()
                .wait(),
            "CheckedKl",
            &format!("n = {n}, q[last] = NaN"),
        );
    }
}

fn checked_elements_fail_and_are_still_written(rt: &Runtime) {
    let mut rng = common::rng();
    for &n in SIZES {
        let q = positive(n);
        let mut p = positive(n);
        let bad = rng.random_range(0..n);
        p[bad] = 0.0;
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let mut out = rt.alloc::<f32>(n).unwrap();
        out.fill(-7.0).unwrap(); // poison: an unwritten element shows as -7
        expect_non_finite(
            CheckedKlTerms::submit(rt, &qb, &pb, &mut out)
                .unwrap()
                .wait(),
            "CheckedKlTerms",
            &format!("n = {n}, p[{bad}] = 0"),
        );
        let got = out.to_vec().unwrap();
        assert_eq!(got[bad], f32::INFINITY, "n = {n}: the failing element");
        for (i, &g) in got.iter().enumerate().filter(|&(i, _)| i != bad) {
            let want = kl_term(q[i], p[i]);
            assert!(
                (f64::from(g) - want).abs() <= 1e-5 * want.abs().max(f64::from(q[i])),
                "n = {n}, element {i}: got {g}, want {want}"
            );
        }
        // The flag belongs to the item: the next one, on good data, succeeds.
        let p = positive(n);
        CheckedKlTerms::submit(rt, &qb, &rt.upload(&p).unwrap(), &mut out)
            .unwrap()
            .wait()
            .unwrap();
    }
}

/// `mu + lr · Jᵀ (prec ⊙ (obs − pred))` in f64.
fn belief_reference(
    obs: &[f32],
    pred: &[f32],
    prec: &[f32],
    jac: &[f32],
    mu: &[f32],
    lr: f32,
) -> Vec<f64> {
    let n = mu.len();
    let mut g = vec![0.0f64; n];
    for r in 0..obs.len() {
        let w = f64::from(prec[r]) * (f64::from(obs[r]) - f64::from(pred[r]));
        for (c, gc) in g.iter_mut().enumerate() {
            *gc += f64::from(jac[r * n + c]) * w;
        }
    }
    g.iter()
        .zip(mu)
        .map(|(&g, &m)| f64::from(m) + f64::from(lr) * g)
        .collect()
}

fn checked_gemv_prologue_and_epilogue(rt: &Runtime) {
    let mut rng = common::rng();
    let mut uniform = |k: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..k).map(|_| rng.random_range(lo..hi)).collect()
    };
    for (m, n) in [(1, 1), (7, 5), (1023, 17), (3, 4099), (2049, 300)] {
        let (obs, pred) = (uniform(m, -1.0, 1.0), uniform(m, -1.0, 1.0));
        let prec = uniform(m, 0.1, 2.0);
        let jac = uniform(m * n, -1.0, 1.0);
        let mu = uniform(n, -1.0, 1.0);
        let up = |v: &[f32]| rt.upload(v).unwrap();
        let (ob, pb, wb, jb, mb) = (up(&obs), up(&pred), up(&prec), up(&jac), up(&mu));
        let mut out = up(&vec![-7.0; n]);
        // Benign: matches the reference.
        CheckedBeliefUpdate::submit(rt, &ob, &pb, &wb, &jb, &mb, 0.05, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let want = belief_reference(&obs, &pred, &prec, &jac, &mu, 0.05);
        for (c, (&g, &w)) in out.to_vec().unwrap().iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-4 * (1.0 + w.abs()) * (m as f64).sqrt(),
                "m={m} n={n} output {c}: got {g}, want {w}"
            );
        }
        // An infinite observation: caught in the prologue (stage 1).
        let mut bad_obs = obs.clone();
        bad_obs[m / 2] = f32::INFINITY;
        expect_non_finite(
            CheckedBeliefUpdate::submit(rt, &up(&bad_obs), &pb, &wb, &jb, &mb, 0.05, &mut out)
                .unwrap()
                .wait(),
            "CheckedBeliefUpdate",
            &format!("m={m} n={n}, obs[{}] = inf", m / 2),
        );
        // Caught in the prologue itself: with only stage 1 checked, the same observation fails
        // the item, so no later check can be what caught it above.
        expect_non_finite(
            CheckedPredictionError::submit(rt, &up(&bad_obs), &pb, &wb, &jb, &mb, 0.05, &mut out)
                .unwrap()
                .wait(),
            "CheckedPredictionError",
            &format!("m={m} n={n}, obs[{}] = inf, prologue check only", m / 2),
        );
        CheckedPredictionError::submit(rt, &ob, &pb, &wb, &jb, &mb, 0.05, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        // Finite inputs whose update overflows f32 (every gradient is 2m, the step 3e38):
        // caught in the epilogue. The outputs are poisoned first, so each infinity below was
        // written by this item.
        let (ones, zeros, twos) = (up(&vec![1.0; m]), up(&vec![0.0; m]), up(&vec![2.0; m]));
        let all_ones = up(&vec![1.0; m * n]);
        out.fill(-7.0).unwrap();
        expect_non_finite(
            CheckedBeliefUpdate::submit(rt, &ones, &zeros, &twos, &all_ones, &mb, 3.0e38, &mut out)
                .unwrap()
                .wait(),
            "CheckedBeliefUpdate",
            &format!("m={m} n={n}, lr = 3e38"),
        );
        let got = out.to_vec().unwrap();
        assert!(
            got.iter().all(|&v| v == f32::INFINITY),
            "m={m} n={n}: every output overflowed to +inf and was written: {:?}",
            &got[..got.len().min(8)]
        );
        // And the next item is clean again.
        CheckedBeliefUpdate::submit(rt, &ob, &pb, &wb, &jb, &mb, 0.05, &mut out)
            .unwrap()
            .wait()
            .unwrap();
    }
}

on_every_backend!(
    checked_reduction_fails_on_an_infinite_total,
    checked_elements_fail_and_are_still_written,
    checked_gemv_prologue_and_epilogue,
);

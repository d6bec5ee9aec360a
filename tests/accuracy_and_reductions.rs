//! AccuracyPipeline and the mean/max reductions on every backend, against f64 references.

#[macro_use]
mod common;

use common::{assert_close, positive};
use pptm::chains::AccuracyPipeline;
use pptm::ops::{KlDivergence, MaxReduction, MeanReduction, PredictionError};
use pptm::{FusionBuilder, Runtime};
use rand::Rng;

/// Mean KL term: exercises a reduction whose `finish` divides by n.
#[derive(FusionBuilder)]
#[fusion(domain = "reductions")]
pub struct MeanKlTerm {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true)]
    mean: MeanReduction,
}

/// Largest prediction error: a reduction with a -inf identity and max as its combine.
#[derive(FusionBuilder)]
#[fusion(domain = "reductions")]
pub struct LargestError {
    #[stage(1)]
    error: PredictionError,
    #[stage(2, reduction = true)]
    largest: MaxReduction,
}

/// n values uniform in [-1, 1).
fn signed(n: usize) -> Vec<f32> {
    let mut rng = common::rng();
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn accuracy_reference(obs: &[f32], pred: &[f32], prec: &[f32]) -> f64 {
    obs.iter()
        .zip(pred)
        .zip(prec)
        .map(|((&o, &p), &w)| {
            let e = f64::from(o) - f64::from(p);
            -0.5 * f64::from(w) * e * e
        })
        .sum()
}

fn accuracy_pipeline_matches_f64_reference(rt: &Runtime) {
    for n in [1usize, 7, 1023, 4096, (1 << 20) + 3, 1 << 26] {
        let (obs, pred, prec) = (signed(n), signed(n), positive(n));
        let want = accuracy_reference(&obs, &pred, &prec);
        let (o, p, w) = (
            rt.upload(&obs).unwrap(),
            rt.upload(&pred).unwrap(),
            rt.upload(&prec).unwrap(),
        );
        let got = AccuracyPipeline::submit(rt, &o, &p, &w)
            .unwrap()
            .wait()
            .unwrap();
        assert_close(got, want, format_args!("n = {n}"));
    }
    // Perfect predictions are perfectly accurate.
    let x = rt.upload(&signed(5000)).unwrap();
    let w = rt.upload(&positive(5000)).unwrap();
    assert_eq!(
        AccuracyPipeline::submit(rt, &x, &x, &w)
            .unwrap()
            .wait()
            .unwrap(),
        0.0
    );
}

fn mean_reduction_divides_by_n(rt: &Runtime) {
    for n in [1usize, 7, 4096, (1 << 20) + 3] {
        let (q, p) = (positive(n), positive(n));
        let got = MeanKlTerm::submit(rt, &rt.upload(&q).unwrap(), &rt.upload(&p).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        // Random terms of both signs can nearly cancel: the allowance for their f32 rounding.
        common::assert_kl_mean_close(got, &q, &p, format_args!("n = {n}"));
    }
    let empty = rt.upload::<f32>(&[]).unwrap();
    assert!(
        MeanKlTerm::submit(rt, &empty, &empty)
            .unwrap()
            .wait()
            .unwrap()
            .is_nan(),
        "the mean of nothing is NaN"
    );
}

fn max_reduction_finds_the_largest(rt: &Runtime) {
    for n in [1usize, 7, 1023, 8193, (1 << 20) + 3] {
        let (obs, pred) = (signed(n), signed(n));
        let want = obs
            .iter()
            .zip(&pred)
            .map(|(&o, &p)| f64::from(o) - f64::from(p))
            .fold(f64::NEG_INFINITY, f64::max);
        let got = LargestError::submit(rt, &rt.upload(&obs).unwrap(), &rt.upload(&pred).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        // The device subtracts in f32: one rounding off the f64 reference.
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * want.abs().max(1.0),
            "n = {n}: got {got}, want {want}"
        );
    }
    // All negative: max is the least negative, not 0.
    let obs = vec![-3.0f32, -2.0, -5.0];
    let zero = vec![0.0f32; 3];
    let got = LargestError::submit(rt, &rt.upload(&obs).unwrap(), &rt.upload(&zero).unwrap())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got, -2.0);
    let empty = rt.upload::<f32>(&[]).unwrap();
    assert_eq!(
        LargestError::submit(rt, &empty, &empty)
            .unwrap()
            .wait()
            .unwrap(),
        f32::NEG_INFINITY
    );
}

on_every_backend!(
    accuracy_pipeline_matches_f64_reference,
    mean_reduction_divides_by_n,
    max_reduction_finds_the_largest,
);

//! `precision = "fp64"` on elementwise stages and reductions: the stage widens its f32 inputs,
//! computes in f64 and passes f64 on to the next fp64 stage or reduction (an f32 stage after it
//! narrows; stored outputs are f32, and so are the values the unfused variants pass from one
//! stage's launch to the next). Each chain is checked on every backend against an f64
//! reference, where an f32 stage could not pass: the GELU of a very negative pre-activation is
//! `x/2 (1 + erf(x/√2))` with `erf` within an ulp of -1, which f32 cannot resolve.
//!
//! The chains are declared here, in a domain of their own, as an application would declare them.

#[macro_use]
mod common;

use common::{gelu, kl_term, positive, uniform};
use pptm::ops::{
    AddBias, AddDigamma, BeliefUpdate, Digamma, Gelu, GemvT, KlDivergence, Matmul, MeanReduction,
    PrecisionWeight, PredictionError, Square, SumReduction,
};
use pptm::{BackendKind, FusionBuilder, Runtime, Variant};

/// `gelu(A W + b)`: the product in f32 on CUDA cores, the bias and the GELU in f64.
#[derive(FusionBuilder)]
#[fusion(domain = "wide")]
pub struct MatmulBiasGeluWide {
    #[stage(1)]
    product: Matmul,
    #[stage(2, precision = "fp64")]
    bias: AddBias,
    #[stage(3, precision = "fp64")]
    activation: Gelu,
}

/// [`MatmulBiasGeluWide`] with its epilogue in f32, for comparison (in this domain, so the tests
/// need no second domain beside it on the GPU).
#[derive(FusionBuilder)]
#[fusion(domain = "wide")]
pub struct MatmulBiasGeluNarrow {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// KL divergence with its terms and their sum in f64.
#[derive(FusionBuilder)]
#[fusion(domain = "wide")]
pub struct KlWide {
    #[stage(1, precision = "fp64")]
    kl: KlDivergence,
    #[stage(2, reduction = true, precision = "fp64")]
    total: SumReduction,
}

/// Mixed precisions: ψ(x) in f64, squared in f32, the mean in f64, then ψ(k) added in f64.
#[derive(FusionBuilder)]
#[fusion(domain = "wide")]
pub struct DigammaMix {
    #[stage(1, precision = "fp64")]
    psi: Digamma,
    #[stage(2)]
    square: Square,
    #[stage(3, reduction = true, precision = "fp64")]
    mean: MeanReduction,
    #[stage(4, precision = "fp64")]
    plus: AddDigamma,
}

/// The belief update with the GEMV-T's prologue (error, weighting) and epilogue in f64.
#[derive(FusionBuilder)]
#[fusion(domain = "wide")]
pub struct BeliefUpdateWide {
    #[stage(1, precision = "fp64")]
    error: PredictionError,
    #[stage(2, precision = "fp64")]
    weighted: PrecisionWeight,
    #[stage(3)]
    gradient: GemvT,
    #[stage(4, precision = "fp64")]
    update: BeliefUpdate,
}

const SIZES: &[usize] = &[1, 7, 1023, (1 << 20) + 3];

/// d gelu / dx = Φ(x) + x φ(x).
fn gelu_slope(x: f64) -> f64 {
    let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * phi
}

/// The largest error of `got` against gelu(pre + b) relative to what the bar allows: 1e-4 of the
/// value, plus the f32 product's error (1e-4 of its terms' magnitude, as tests/linear_algebra.rs
/// judges the pre-activation) carried through the GELU's slope. Below 1 passes.
fn gelu_tail_error(got: &[f32], pre: &[f64], scale: &[f64], b: &[f32]) -> (f64, usize) {
    let n = b.len();
    let mut worst = (0.0f64, 0);
    for (at, (&g, (&p, &s))) in got.iter().zip(pre.iter().zip(scale)).enumerate() {
        let x = p + f64::from(b[at % n]);
        let want = gelu(x);
        let tol = 1e-4 * want.abs() + gelu_slope(x).abs() * 1e-4 * s;
        // NaN (an unwritten output) counts as the worst.
        let e = (f64::from(g) - want).abs() / tol;
        let e = if e.is_nan() { f64::INFINITY } else { e };
        if e > worst.0 {
            worst = (e, at);
        }
    }
    worst
}

fn gelu_tail_needs_fp64(rt: &Runtime) {
    for (m, k, n) in [
        (1, 1, 1),
        (7, 17, 33),
        (64, 64, 64),
        (65, 1000, 33),
        (256, 300, 130),
    ] {
        // Products within ±1, biases in [-6.5, -4]: pre-activations in about [-7.5, -3], where
        // gelu is between -3e-13 and -4e-3 and f32's erf has no digits left to give.
        let a = uniform(m * k, -1.0, 1.0);
        let w: Vec<f32> = uniform(k * n, -1.0, 1.0)
            .into_iter()
            .map(|v| v / k as f32)
            .collect();
        let b = uniform(n, -6.5, -4.0);
        let mut pre = vec![0.0f64; m * n];
        let mut scale = vec![0.0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let aip = f64::from(a[i * k + p]);
                for j in 0..n {
                    let t = aip * f64::from(w[p * n + j]);
                    pre[i * n + j] += t;
                    scale[i * n + j] += t.abs();
                }
            }
        }
        let (ab, wb, bb) = (
            rt.upload(&a).unwrap(),
            rt.upload(&w).unwrap(),
            rt.upload(&b).unwrap(),
        );
        let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
        MatmulBiasGeluWide::submit(rt, &ab, &wb, &bb, &mut out, m, k)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        let (worst, at) = gelu_tail_error(&got, &pre, &scale, &b);
        assert!(
            worst < 1.0,
            "fp64 epilogue, m={m} k={k} n={n} at {at}: got {}, f64 reference {}, {worst:.3} of the tolerance",
            got[at],
            gelu(pre[at] + f64::from(b[at % n]))
        );
        // The same layer with an f32 epilogue misses the bar on the device, which computes it in
        // f32 (the CPU backend computes every stage in f64): fp64 is what makes the difference.
        if rt.backend() == BackendKind::Gpu && m * n >= 64 {
            let mut out32 = rt.upload(&vec![f32::NAN; m * n]).unwrap();
            MatmulBiasGeluNarrow::submit(rt, &ab, &wb, &bb, &mut out32, m, k)
                .unwrap()
                .wait()
                .unwrap();
            let (worst32, _) = gelu_tail_error(&out32.to_vec().unwrap(), &pre, &scale, &b);
            assert!(
                worst32 > 1.0,
                "m={m} k={k} n={n}: the f32 epilogue was within the bar ({worst32:.3}): the input does not test fp64"
            );
        }
    }
}

fn kl_sum_in_fp64(rt: &Runtime) {
    for &n in SIZES {
        let (q, p) = (positive(n), positive(n));
        let terms: Vec<f64> = q.iter().zip(&p).map(|(&a, &b)| kl_term(a, b)).collect();
        let want: f64 = terms.iter().sum();
        let magnitude: f64 = terms.iter().map(|t| t.abs()).sum();
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let got = KlWide::submit(rt, &qb, &pb).unwrap().wait().unwrap();
        // f64 terms summed in f64: all that is left is the result's rounding to f32. The unfused
        // variants pass every stage's values to the next through f32 memory, so there each term
        // is also rounded to f32 before the sum.
        let unfused = matches!(
            rt.config().variant,
            Variant::Unfused | Variant::UnfusedGraph
        );
        let terms_rounding = if unfused { 2f64.powi(-24) } else { 1e-12 };
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-7 * want.abs() + terms_rounding * magnitude,
            "n = {n}: got {got}, f64 reference {want}, error {err:e}"
        );
    }
}

fn mixed_precisions_flow(rt: &Runtime) {
    let k = 5u32;
    for &n in SIZES {
        let x = uniform(n, 0.25, 20.0);
        // ψ in f64, rounded to f32 for the f32 square (done here in f64: exact for f32 inputs
        // within 2^-24 relative), the mean in f64, ψ(k) added in f64.
        let squares: Vec<f64> = x
            .iter()
            .map(|&v| {
                let psi = f64::from(common::digamma(f64::from(v)) as f32);
                psi * psi
            })
            .collect();
        let want = squares.iter().sum::<f64>() / n as f64 + common::digamma(f64::from(k));
        let xb = rt.upload(&x).unwrap();
        let got = DigammaMix::submit(rt, &xb, k).unwrap().wait().unwrap();
        let err = (f64::from(got) - want).abs();
        // Each square's f32 rounding (2^-24 of it) and the result's.
        let bar =
            2.0 * f64::from(f32::EPSILON) * (squares.iter().sum::<f64>() / n as f64 + want.abs());
        assert!(
            err <= bar,
            "n = {n}: got {got}, f64 reference {want}, error {err:e}, bar {bar:e}"
        );
    }
}

fn belief_update_with_fp64_ends(rt: &Runtime) {
    for (m, n) in [(1, 1), (7, 5), (1023, 17), (3, 4099), (2049, 4096)] {
        let (obs, pred) = (uniform(m, -1.0, 1.0), uniform(m, -1.0, 1.0));
        let prec = uniform(m, 0.1, 2.0);
        let jac = uniform(m * n, -1.0, 1.0);
        let mu = uniform(n, -1.0, 1.0);
        let lr = 0.05f32;
        // The error and its weighting in f64, rounded to f32 for the f32 GEMV-T.
        let e: Vec<f64> = (0..m)
            .map(|i| {
                let v = f64::from(prec[i]) * (f64::from(obs[i]) - f64::from(pred[i]));
                f64::from(v as f32)
            })
            .collect();
        let up = |v: &[f32]| rt.upload(v).unwrap();
        let (ob, pb, wb, jb, mb) = (up(&obs), up(&pred), up(&prec), up(&jac), up(&mu));
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        BeliefUpdateWide::submit(rt, &ob, &pb, &wb, &jb, &mb, lr, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for c in 0..n {
            let (mut g, mut scale) = (0.0f64, 0.0f64);
            for i in 0..m {
                let t = f64::from(jac[i * n + c]) * e[i];
                g += t;
                scale += t.abs();
            }
            let want = f64::from(mu[c]) + f64::from(lr) * g;
            let scale = f64::from(mu[c]).abs() + f64::from(lr) * scale;
            let err = (f64::from(got[c]) - want).abs() / scale;
            assert!(
                err < 1e-4,
                "m={m} n={n} output {c}: got {}, f64 reference {want}, error {err:e} of scale {scale}",
                got[c]
            );
        }
    }
}

on_every_backend!(
    gelu_tail_needs_fp64,
    kl_sum_in_fp64,
    mixed_precisions_flow,
    belief_update_with_fp64_ends,
);

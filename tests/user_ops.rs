//! `#[pptm::op]`: elementwise ops and reductions written as Rust functions (issue 32). The macro
//! keeps the function (the op's CPU reference), checks it against the op subset and adds the op's
//! marker type with its description and translated device code. Chains in this crate name such
//! ops like built-in ones: build.rs and the derive find them in the sources, and the chains run on
//! every backend against f64 references written here. They fuse like built-ins: an op of one's own
//! as a prologue of a reduction, a reduction of one's own after a prologue or as a GEMV's
//! epilogue, and an f64 op in fp64 stages. A reduction after a pairwise op folds each point's row
//! of pair values: the row-wise form of any reduction, one's own or built-in; with
//! `per_row = true` a reduction folds each row of a matrix the same way.

#[macro_use]
mod common;

use common::uniform;
use pptm::__private::{ChainSpec, CpuImpl, StageSpec, Ty, lower_with};
use pptm::ops::{
    ChebyshevDistance, Gemv, MaxReduction, MeanReduction, Sigmoid, Square, SumReduction,
};
use pptm::{FusionBuilder, Op, Runtime, op};

/// Σ swish(x; β): an op of this crate's own, then a built-in reduction.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct SwishSum {
    #[stage(1)]
    act: Swish,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// Σ w (pred − obs)²: an op with an input of its own and a value passed by value.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct WeightedLoss {
    #[stage(1)]
    err: WeightedSqErr,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// log Σ exp(x): a reduction of this crate's own (log-add-exp as the combine).
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct LogSumExpOf {
    #[stage(1, reduction = true)]
    lse: LogSumExp,
}

/// log Σ exp(swish(x; β)): an elementwise op of one's own as the prologue of a reduction of one's
/// own.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct SwishLogSumExp {
    #[stage(1)]
    act: Swish,
    #[stage(2, reduction = true)]
    lse: LogSumExp,
}

/// log Σ exp(A x): the reduction as the epilogue of a built-in GEMV (logits to a log-partition).
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct LogPartition {
    #[stage(1)]
    logits: Gemv,
    #[stage(2, reduction = true)]
    lse: LogSumExp,
}

/// Each point's Chebyshev distance to its nearest other point: a reduction of one's own (the
/// smaller of two) folds each point's row of distances; one value per point is stored.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct NearestDistance {
    #[stage(1)]
    distance: ChebyshevDistance,
    #[stage(2, reduction = true)]
    nearest: Smallest,
}

/// Σᵢ log Σ_{j≠i} exp(dᵢⱼ): one's own reduction row-wise, then a built-in one over the points.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct RowLogSumExpTotal {
    #[stage(1)]
    distance: ChebyshevDistance,
    #[stage(2, reduction = true)]
    lse: LogSumExp,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// The largest over points of the mean distance to the others: built-in reductions, the first
/// row-wise (its `finish` divides by the n − 1 pairs of a row), the second over the points.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct WidestMeanDistance {
    #[stage(1)]
    distance: ChebyshevDistance,
    #[stage(2, reduction = true)]
    mean: MeanReduction,
    #[stage(3, reduction = true)]
    widest: MaxReduction,
}

/// Σⱼ w (predᵢⱼ − obsᵢⱼ)² for each row i of a rows × cols matrix (a χ² per spectrum): an op of
/// one's own as the prologue of a built-in reduction that folds each row (`per_row = true`).
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct RowWeightedLoss {
    #[stage(1)]
    err: WeightedSqErr,
    #[stage(2, reduction = true, per_row = true)]
    chi2: SumReduction,
}

/// log Σⱼ exp(xᵢⱼ) of each row (the log-partition of each row of logits): a reduction of one's
/// own, row-wise.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct RowLogSumExp {
    #[stage(1, reduction = true, per_row = true)]
    lse: LogSumExp,
}

/// sigmoid(meanⱼ swish(xᵢⱼ; β)) of each row: a built-in row-wise reduction between an op of one's
/// own and an epilogue on each row's value.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct RowMeanSwish {
    #[stage(1)]
    act: Swish,
    #[stage(2, reduction = true, per_row = true)]
    mean: MeanReduction,
    #[stage(3)]
    squash: Sigmoid,
}

/// maxᵢ sqrt(meanⱼ xᵢⱼ²): a reduction of one's own with a `finish` row-wise, then a built-in one
/// over the rows, which is the chain's.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct WorstRowRms {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true, per_row = true)]
    rms: RootMean,
    #[stage(3, reduction = true)]
    worst: MaxReduction,
}

/// sqrt(mean(x²)): a built-in prologue, then a reduction of one's own with a `finish`.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct Rms {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true)]
    root_mean: RootMean,
}

/// Σ huber(r; δ) in f64: an f64 op of one's own in fp64 stages.
#[derive(FusionBuilder)]
#[fusion(domain = "user_ops")]
pub struct HuberSum {
    #[stage(1, precision = "fp64")]
    loss: Huber,
    #[stage(2, reduction = true, precision = "fp64")]
    total: SumReduction,
}

/// log Σ exp over f64 values (a max shift first).
fn lse_f64(v: impl Iterator<Item = f64> + Clone) -> f64 {
    let m = v.clone().fold(f64::NEG_INFINITY, f64::max);
    m + v.map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn user_reductions_match_f64_references(rt: &Runtime) {
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let x = uniform(n, -30.0, 30.0);
        let got = LogSumExpOf::submit(rt, &rt.upload(&x).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        let want = lse_f64(x.iter().map(|&v| f64::from(v)));
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "log-sum-exp, n = {n}: got {got}, f64 reference {want}"
        );

        let beta = 1.3f32;
        let got = SwishLogSumExp::submit(rt, &rt.upload(&x).unwrap(), beta)
            .unwrap()
            .wait()
            .unwrap();
        let want = lse_f64(x.iter().map(|&v| {
            let v = f64::from(v);
            v / (1.0 + (-f64::from(beta) * v).exp())
        }));
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "log-sum-exp of swish, n = {n}: got {got}, f64 reference {want}"
        );

        let got = Rms::submit(rt, &rt.upload(&x).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        let want = (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * want,
            "rms, n = {n}: got {got}, f64 reference {want}"
        );

        let r = uniform(n, -3.0, 3.0);
        let delta = 1.25f32;
        let got = HuberSum::submit(rt, &rt.upload(&r).unwrap(), delta)
            .unwrap()
            .wait()
            .unwrap();
        // Computed in f64 throughout: only the result's rounding to f32 remains.
        let want: f64 = r.iter().map(|&v| huber(f64::from(v), delta)).sum();
        assert!(
            (f64::from(got) - want).abs() <= 1.2e-7 * want + 1e-30,
            "huber sum in f64, n = {n}: got {got}, f64 reference {want}"
        );
    }
    for (m, n) in [(1usize, 1usize), (7, 33), (1023, 257), (4099, 1000)] {
        let a = uniform(m * n, -1.0, 1.0);
        let x = uniform(n, -1.0, 1.0);
        let got = LogPartition::submit(rt, &rt.upload(&x).unwrap(), &rt.upload(&a).unwrap(), m)
            .unwrap()
            .wait()
            .unwrap();
        let rows = (0..m).map(|i| {
            (0..n)
                .map(|j| f64::from(a[i * n + j]) * f64::from(x[j]))
                .sum::<f64>()
        });
        let want = lse_f64(rows);
        // Each logit carries the f32 GEMV's error, at most ~n·2⁻²⁴ of Σ|a||x| ≤ n; the
        // log-sum-exp passes on at most the largest.
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * n as f64 + 1e-6 * want.abs(),
            "log-partition of a {m}x{n} GEMV: got {got}, f64 reference {want}"
        );
    }
}

fn user_op_chains_match_f64_references(rt: &Runtime) {
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let x = uniform(n, -4.0, 4.0);
        let beta = 0.7f32;
        let got = SwishSum::submit(rt, &rt.upload(&x).unwrap(), beta)
            .unwrap()
            .wait()
            .unwrap();
        let (mut want, mut magnitude) = (0.0f64, 0.0f64);
        for &v in &x {
            let v = f64::from(v);
            let t = v / (1.0 + (-f64::from(beta) * v).exp());
            want += t;
            magnitude += t.abs();
        }
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-5 * magnitude + 1e-30,
            "swish sum, n = {n}: got {got}, f64 reference {want}, error {err:e} of {magnitude:e}"
        );

        let (pred, obs) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let w = 0.5f32;
        let got =
            WeightedLoss::submit(rt, &rt.upload(&pred).unwrap(), w, &rt.upload(&obs).unwrap())
                .unwrap()
                .wait()
                .unwrap();
        let want: f64 = pred
            .iter()
            .zip(&obs)
            .map(|(&p, &o)| f64::from(w) * (f64::from(p) - f64::from(o)).powi(2))
            .sum();
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * want.abs() + 1e-30,
            "weighted loss, n = {n}: got {got}, f64 reference {want}"
        );
    }
}

/// Chebyshev distances of every pair of the n points (rows of x, d coordinates), in f64, row by
/// row (j != i).
fn chebyshev_rows(x: &[f32], n: usize, d: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|i| {
            (0..n)
                .filter(|&j| j != i)
                .map(|j| {
                    (0..d)
                        .map(|c| (f64::from(x[i * d + c]) - f64::from(x[j * d + c])).abs())
                        .fold(0.0, f64::max)
                })
                .collect()
        })
        .collect()
}

fn row_wise_reductions_match_f64_references(rt: &Runtime) {
    let what = rt.describe();
    // One point has an empty row: the reductions' identities, finished (+inf, -inf, NaN for a
    // mean, which the largest over points ignores).
    for (n, d) in [(1, 2), (2, 1), (7, 3), (33, 2), (1023, 3), (2049, 4)] {
        let x = uniform(n * d, -1.0, 1.0);
        let xb = rt.upload(&x).unwrap();
        let rows = chebyshev_rows(&x, n, d);

        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        NearestDistance::submit(rt, &xb, &mut out, d)
            .unwrap()
            .wait()
            .unwrap();
        for (i, &g) in out.to_vec().unwrap().iter().enumerate() {
            let want = rows[i].iter().copied().fold(f64::INFINITY, f64::min);
            // Distances are |a - b| of f32 coordinates, maximised: within an ulp of f64's.
            assert!(
                f64::from(g) == want || (f64::from(g) - want).abs() <= 2.5e-7 * want.max(1e-30),
                "{what}: nearest distance, n = {n}, d = {d}, point {i}: got {g}, f64 reference {want}"
            );
        }

        let got = RowLogSumExpTotal::submit(rt, &xb, n, d)
            .unwrap()
            .wait()
            .unwrap();
        let want: f64 = rows
            .iter()
            .map(|r| {
                let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (m + r.iter().map(|&v| (v - m).exp()).sum::<f64>().ln()).powi(2)
            })
            .sum();
        assert!(
            f64::from(got) == want || (f64::from(got) - want).abs() <= 1e-5 * want,
            "{what}: Σ (row log-sum-exp)², n = {n}, d = {d}: got {got}, f64 reference {want}"
        );

        let got = WidestMeanDistance::submit(rt, &xb, n, d)
            .unwrap()
            .wait()
            .unwrap();
        let want = rows
            .iter()
            .map(|r| r.iter().sum::<f64>() / r.len() as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            f64::from(got) == want || (f64::from(got) - want).abs() <= 1e-6 * want,
            "{what}: widest mean distance, n = {n}, d = {d}: got {got}, f64 reference {want}"
        );
    }
}

/// Whether `got` (an f32 result) is within `rel` of the f64 reference `want` (or equal to it:
/// infinities, and NaN for NaN).
fn close(got: f32, want: f64, rel: f64) -> bool {
    let g = f64::from(got);
    g == want || (want.is_nan() && g.is_nan()) || (g - want).abs() <= rel * want.abs().max(1e-30)
}

/// Reductions with `per_row = true` fold each row of a rows × cols matrix: one value per row,
/// stored (poisoned first, so a row left unwritten shows), or folded on over the rows.
fn matrix_row_reductions_match_f64_references(rt: &Runtime) {
    let what = rt.describe();
    // Odd shapes: a single element, rows longer and shorter than a warp, and a row of 2^20 + 3.
    for (rows, cols) in [
        (1, 1),
        (7, 1023),
        (1023, 7),
        (33, 32),
        (4099, 33),
        (3, (1 << 20) + 3),
    ] {
        let n = rows * cols;
        let (pred, obs, x) = (
            uniform(n, -2.0, 2.0),
            uniform(n, -2.0, 2.0),
            uniform(n, -4.0, 4.0),
        );
        let w = 0.75f32;
        let (beta, xb) = (1.5f32, rt.upload(&x).unwrap());
        let row = |r: usize, v: &[f32]| -> Vec<f64> {
            v[r * cols..(r + 1) * cols]
                .iter()
                .map(|&a| f64::from(a))
                .collect()
        };
        let poisoned = || rt.upload(&vec![f32::NAN; rows]).unwrap();

        let mut out = poisoned();
        let (pb, ob) = (rt.upload(&pred).unwrap(), rt.upload(&obs).unwrap());
        RowWeightedLoss::submit(rt, &pb, w, &ob, &mut out, cols)
            .unwrap()
            .wait()
            .unwrap();
        for (r, &g) in out.to_vec().unwrap().iter().enumerate() {
            let want: f64 = row(r, &pred)
                .iter()
                .zip(row(r, &obs))
                .map(|(p, o)| f64::from(w) * (p - o).powi(2))
                .sum();
            assert!(
                close(g, want, 1e-5),
                "{what}: row χ², {rows} x {cols}, row {r}: got {g}, f64 reference {want}"
            );
        }

        let mut out = poisoned();
        RowLogSumExp::submit(rt, &xb, &mut out, cols)
            .unwrap()
            .wait()
            .unwrap();
        for (r, &g) in out.to_vec().unwrap().iter().enumerate() {
            let v = row(r, &x);
            let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let want = m + v.iter().map(|&a| (a - m).exp()).sum::<f64>().ln();
            assert!(
                close(g, want, 1e-5),
                "{what}: row log-sum-exp, {rows} x {cols}, row {r}: got {g}, f64 reference {want}"
            );
        }

        let mut out = poisoned();
        RowMeanSwish::submit(rt, &xb, beta, &mut out, cols)
            .unwrap()
            .wait()
            .unwrap();
        for (r, &g) in out.to_vec().unwrap().iter().enumerate() {
            let b = f64::from(beta);
            let v = row(r, &x);
            let mean = v.iter().map(|&a| a / (1.0 + (-b * a).exp())).sum::<f64>() / cols as f64;
            let want = 1.0 / (1.0 + (-mean).exp());
            assert!(
                close(g, want, 2e-6),
                "{what}: sigmoid(row mean swish), {rows} x {cols}, row {r}: got {g}, f64 reference {want}"
            );
        }

        let got = WorstRowRms::submit(rt, &xb, rows, cols)
            .unwrap()
            .wait()
            .unwrap();
        let want = (0..rows)
            .map(|r| (row(r, &x).iter().map(|a| a * a).sum::<f64>() / cols as f64).sqrt())
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            close(got, want, 1e-6),
            "{what}: worst row RMS, {rows} x {cols}: got {got}, f64 reference {want}"
        );
    }
    // A matrix that does not have rows × cols elements is refused, not read past its end.
    let x = rt.upload(&uniform(10, -1.0, 1.0)).unwrap();
    let mut out = rt.upload(&[0.0f32; 3]).unwrap();
    let e = RowLogSumExp::submit(rt, &x, &mut out, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rows x cols = 3 x 4"), "{what}: {e}");
}

on_every_backend!(
    user_op_chains_match_f64_references,
    user_reductions_match_f64_references,
    row_wise_reductions_match_f64_references,
    matrix_row_reductions_match_f64_references
);

#[op]
fn swish(x: f32, beta: f32) -> f32 {
    x / (1.0 + (-beta * x).exp())
}

#[op(tensors(obs))]
fn weighted_sq_err(pred: f32, w: f32, obs: f32) -> f32 {
    let d = pred - obs;
    w * d * d
}

#[op]
fn huber(r: f64, delta: f32) -> f64 {
    let a = r.abs();
    let d = delta as f64;
    if a <= d {
        0.5 * r * r
    } else {
        d * (a - 0.5 * d)
    }
}

/// The smaller of two: the combine of a minimum (identity +inf).
#[op(reduction(identity = f64::INFINITY))]
fn smallest(a: f64, b: f64) -> f64 {
    a.min(b)
}

/// log(eᵃ + eᵇ), without overflow: an associative, commutative combine with identity -inf.
#[op(reduction(identity = f64::NEG_INFINITY))]
fn log_sum_exp(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if m == f64::NEG_INFINITY {
        m
    } else {
        m + ((a - m).exp() + (b - m).exp()).ln()
    }
}

/// A sum whose finish takes the root of the mean.
#[op(reduction(identity = 0.0, finish = |total, n| (total / n).sqrt()))]
fn root_mean(a: f64, b: f64) -> f64 {
    a + b
}

fn cpu_of(def: &pptm::__private::OpDef) -> fn(&[f64]) -> f64 {
    match def.cpu {
        CpuImpl::Elementwise(f) => f.one,
        _ => panic!("{} is not elementwise", def.name),
    }
}

#[test]
fn an_op_is_described_and_its_cpu_reference_is_the_function() {
    let d = Swish::DEF;
    assert_eq!(d.name, "Swish");
    assert_eq!(d.device, "pptm_user_swish");
    assert!(
        d.cuda
            .contains("float pptm_user_swish(float x, float beta)"),
        "{}",
        d.cuda
    );
    let kinds: Vec<(&str, Ty)> = d.inputs.iter().map(|p| (p.name, p.ty)).collect();
    assert_eq!(kinds, vec![("x", Ty::Like), ("beta", Ty::F32)]);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    };
    for _ in 0..1000 {
        let (x, b) = (next(), next());
        assert_eq!(
            cpu_of(d)(&[f64::from(x), f64::from(b)]),
            f64::from(swish(x, b))
        );
    }
    // The CPU backend passes [flow, inputs of their own, by-value values]: the macro puts each
    // back in the function's order.
    let w = WeightedSqErr::DEF;
    let kinds: Vec<(&str, Ty)> = w.inputs.iter().map(|p| (p.name, p.ty)).collect();
    assert_eq!(
        kinds,
        vec![("pred", Ty::Like), ("w", Ty::F32), ("obs", Ty::Like)]
    );
    assert_eq!(
        cpu_of(w)(&[1.0, 3.0, 2.0]),
        f64::from(weighted_sq_err(1.0, 2.0, 3.0))
    );
    let h = Huber::DEF;
    assert_eq!(
        h.precisions.len(),
        2,
        "an f64 op serves fp32 and fp64 stages"
    );
    assert_eq!(cpu_of(h)(&[3.0, 1.0]), huber(3.0, 1.0));
}

#[test]
fn a_chain_naming_an_op_of_ones_own_lowers_with_its_definition() {
    let stage = |number: u32, op: &str, reduction: bool| StageSpec {
        field: format!("s{number}"),
        number,
        op: op.into(),
        reduction: reduction.then_some(true),
        ..Default::default()
    };
    let spec = ChainSpec {
        name: "WeightedLoss".into(),
        domain: "user".into(),
        stages: vec![
            stage(1, "WeightedSqErr", false),
            stage(2, "SumReduction", true),
        ],
    };
    let ir = lower_with(&spec, &[WeightedSqErr::DEF, Swish::DEF]).unwrap();
    let names: Vec<&str> = ir.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(&names[..3], &["pred", "w", "obs"], "{names:?}");
    // Without the definition it is an unknown op.
    let e = lower_with(&spec, &[]).unwrap_err();
    assert!(e.to_string().contains("unknown op `WeightedSqErr`"), "{e}");
}

#[test]
fn a_reduction_of_ones_own_is_described_and_its_cpu_reference_is_the_function() {
    let d = LogSumExp::DEF;
    assert_eq!(d.name, "LogSumExp");
    assert_eq!(d.output, Ty::Scalar);
    assert!(
        d.cuda.contains("struct pptm_user_log_sum_exp_reducer"),
        "{}",
        d.cuda
    );
    let CpuImpl::Reduction {
        identity,
        combine,
        fold,
        finish,
    } = d.cpu
    else {
        panic!("LogSumExp is not a reduction: {:?}", d.cpu);
    };
    assert_eq!(identity, f64::NEG_INFINITY);
    assert_eq!(combine(1.0, 2.0), log_sum_exp(1.0, 2.0));
    assert_eq!(
        fold(1.0, &[2.0, 3.0]),
        log_sum_exp(log_sum_exp(1.0, 2.0), 3.0)
    );
    assert_eq!(finish(3.5, 10), 3.5);
    let CpuImpl::Reduction {
        identity, finish, ..
    } = RootMean::DEF.cpu
    else {
        panic!("RootMean is not a reduction");
    };
    assert_eq!(identity, 0.0);
    assert_eq!(finish(36.0, 4), 3.0);
}

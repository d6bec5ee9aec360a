//! Property tests of the public API (the "reliability" issue): random shapes (0, 1, odd sizes,
//! lengths that disagree between arguments, wrong and huge dimension parameters), random values
//! (NaN, ±inf, negative, subnormal, huge), wrong element types and argument lists through
//! `Runtime::submit_chain`, and buffers of another runtime, on several chains.
//!
//! The property: a call never panics. It returns either `Ok`, with a result that matches an f64
//! reference written here within the integration tests' tolerances whenever the input is valid
//! and its values finite and moderate, or the typed `pptm::Error` for the fault
//! (`LengthMismatch` naming an argument whose length breaks a shape rule, with that rule's
//! numbers; `BadArguments` for an argument list that does not fit, a size product that overflows,
//! or an op's own check; `DTypeMismatch`; `ForeignBuffer`).
//!
//! Every property runs on the CPU backend, and on the GPU runtime when one is present. Each runs
//! 256 cases by default (well under a second in all); `PROPTEST_CASES=N` runs N.

mod common;

use std::sync::OnceLock;

use common::gelu;
use pptm::chains::{
    AccuracyPipeline, BeliefUpdateStep, DistanceKth, GemvAxpbySum, KlComplexity, KlTerms,
    MatmulBiasGelu, MatmulBiasGeluBf16, MatmulBiasGeluF16, MatmulBiasGeluGuarded, MatmulBiasRelu,
    MatmulBiasSigmoid, MatmulBiasTanh, TeReduction,
};
use pptm::{Arg, Buffer, Chain, DType, Element, Error, InputBuffer, Runtime, bf16, f16};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// Backends and configuration
// ---------------------------------------------------------------------------------------------

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // A failing case is saved (and replayed first by every later run, on every backend) in
        // proptest-regressions/api_properties.txt beside Cargo.toml: commit it with the fix.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/api_properties.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

/// The CPU backend, shared by every case of this binary.
fn cpu() -> &'static Runtime {
    static CPU: OnceLock<Runtime> = OnceLock::new();
    CPU.get_or_init(Runtime::cpu)
}

/// Another runtime, whose buffers every other runtime must refuse.
fn other() -> &'static Runtime {
    static OTHER: OnceLock<Runtime> = OnceLock::new();
    OTHER.get_or_init(Runtime::cpu)
}

/// The CPU backend, and the GPU runtime where there is one.
fn backends() -> Vec<&'static Runtime> {
    let mut v = vec![cpu()];
    if let Some(gpu) = common::gpu() {
        // The properties use chains of all four domains, in any order: their manifolds must
        // start together (a module cannot be loaded once a manifold is resident).
        static PREPARED: OnceLock<()> = OnceLock::new();
        PREPARED.get_or_init(|| {
            gpu.prepare_domains(&[
                pptm::chains::KlComplexity::DOMAIN,
                pptm::chains::DistanceKth::DOMAIN,
                pptm::chains::GemvAxpbySum::DOMAIN,
                pptm::chains::MatmulBiasGeluBf16::DOMAIN,
            ])
            .expect("the four domains start together");
        });
        v.push(gpu);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Values and shapes
// ---------------------------------------------------------------------------------------------

/// Below this (and finite) a value is "moderate": products and sums of a few of them stay far
/// from f32's range, so the device's f32 arithmetic and the f64 reference can be compared.
const MODERATE: f32 = 1e6;

fn moderate_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -2.0f32..2.0,
        1 => select(vec![
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::MIN_POSITIVE / 4.0, // subnormal
            1e-45,                   // the smallest subnormal
            -1e-45,
            1e-20,
            MODERATE,
            -MODERATE,
            -1234.5,
        ]),
    ]
}

fn wild_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => moderate_value(),
        1 => select(vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            1e30,
            -1e30,
            3e19,
        ]),
        1 => any::<f32>(),
    ]
}

/// `len` values: all moderate (about two cases in three), or anything at all.
fn values(len: usize) -> BoxedStrategy<Vec<f32>> {
    prop_oneof![
        2 => prop::collection::vec(moderate_value(), len),
        1 => prop::collection::vec(wild_value(), len),
    ]
    .boxed()
}

/// `len` values of a distribution: non-negative (zeros included), or anything at all.
fn probabilities(len: usize) -> BoxedStrategy<Vec<f32>> {
    let p = prop_oneof![
        8 => 0.0f32..2.0,
        1 => select(vec![0.0f32, f32::MIN_POSITIVE, f32::MIN_POSITIVE / 4.0, 1e-45, MODERATE]),
    ];
    prop_oneof![2 => prop::collection::vec(p, len), 1 => values(len)].boxed()
}

fn is_moderate(v: &[f32]) -> bool {
    v.iter().all(|x| x.is_finite() && x.abs() <= MODERATE)
}

/// A small size: 0, 1, odd and even, once in a while a larger one.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        3 => Just(1usize),
        10 => 2usize..10,
        1 => select(vec![17usize, 31, 33, 64, 65]),
    ]
}

/// A length near `want`: mostly `want`, else off by a little or another size.
fn near(want: usize) -> BoxedStrategy<usize> {
    prop_oneof![
        8 => Just(want),
        1 => Just(want + 1),
        1 => Just(want.saturating_sub(1)),
        1 => size(),
    ]
    .boxed()
}

/// A dimension parameter: mostly right, else wrong, zero, or so large its products overflow.
fn dim_param(right: usize) -> BoxedStrategy<usize> {
    prop_oneof![
        12 => Just(right),
        1 => Just(right + 1),
        1 => Just(0usize),
        1 => select(vec![
            usize::MAX,
            usize::MAX / 2,
            usize::MAX / 3 + 1,
            1usize << 32,
            (1usize << 62) + 1,
        ]),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// The expected outcome of a submission
// ---------------------------------------------------------------------------------------------

/// One shape rule of a chain: argument `arg` must hold the product of `dims` elements.
struct Rule {
    arg: &'static str,
    len: usize,
    dims: Vec<usize>,
}

fn rule(arg: &'static str, len: usize, dims: &[usize]) -> Rule {
    Rule {
        arg,
        len,
        dims: dims.to_vec(),
    }
}

/// What a submission must come to.
#[derive(Debug)]
enum Want {
    /// Every rule holds: the chain runs.
    Ok,
    /// Some rule is broken: `LengthMismatch` for one of these (arg, expected, got), or
    /// `BadArguments` if `overflow` (a rule whose product does not fit).
    Shape {
        broken: Vec<(&'static str, usize, usize)>,
        overflow: bool,
    },
    /// The shapes hold but an op refuses a by-value argument or a size (`BadArguments`).
    OpCheck,
}

/// Applies the rules; `op_ok` says whether the ops' own checks pass.
fn want(rules: &[Rule], op_ok: bool) -> Want {
    let mut broken = Vec::new();
    let mut overflow = false;
    for r in rules {
        // Every size must be below the descriptor's limit (pptm_spec::MAX_DIM, 2^48).
        if r.dims.iter().any(|&d| d as u64 >= pptm_spec::MAX_DIM) {
            overflow = true;
        }
        // The product, and its bytes as f32, must fit in a usize.
        let product = r
            .dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|p| p.checked_mul(4).is_some());
        match product {
            None => overflow = true,
            Some(p) if p != r.len => broken.push((r.arg, p, r.len)),
            Some(_) => {}
        }
    }
    if overflow || !broken.is_empty() {
        Want::Shape { broken, overflow }
    } else if op_ok {
        Want::Ok
    } else {
        Want::OpCheck
    }
}

/// Checks a submission's outcome against `want`; `Ok(Some(ticket))` when it ran.
fn check_outcome<T>(
    chain: &str,
    got: Result<T, Error>,
    want: &Want,
) -> Result<Option<T>, TestCaseError> {
    match (want, got) {
        (Want::Ok, Ok(t)) => Ok(Some(t)),
        (Want::Ok, Err(e)) => Err(TestCaseError::fail(format!(
            "{chain}: valid input refused: {e:?}"
        ))),
        (_, Ok(_)) => Err(TestCaseError::fail(format!(
            "{chain}: accepted input that should fail ({want:?})"
        ))),
        (
            Want::Shape { broken, .. },
            Err(Error::LengthMismatch {
                arg,
                expected,
                got,
                ref rule,
                ..
            }),
        ) => {
            prop_assert!(
                broken.contains(&(arg, expected, got)),
                "{chain}: LengthMismatch {{ arg: {arg}, expected: {expected}, got: {got}, rule: {rule} }} is none of the broken rules {broken:?}"
            );
            prop_assert!(!rule.is_empty(), "{chain}: LengthMismatch without its rule");
            Ok(None)
        }
        (Want::Shape { overflow: true, .. } | Want::OpCheck, Err(Error::BadArguments { .. })) => {
            Ok(None)
        }
        (_, Err(e)) => Err(TestCaseError::fail(format!(
            "{chain}: expected {want:?}, got {e:?}"
        ))),
    }
}

/// Waits for a ticket of a chain that writes `out`; whether there was one.
fn wait(ticket: Option<pptm::Ticket<'_, ()>>) -> Result<bool, TestCaseError> {
    match ticket {
        Some(t) => {
            t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// |got − want| within `rel` of `scale` (the magnitude the f32 arithmetic's error is judged on),
/// plus four f32 ulps of the result (its rounding, and the device's transcendental functions:
/// a sigmoid is about 0.5 however small its input) and a slack for values flushed to zero
/// (subnormals, on a device that flushes them).
fn assert_near(
    what: &str,
    got: f32,
    want: f64,
    scale: f64,
    rel: f64,
    terms: usize,
) -> Result<(), TestCaseError> {
    let tol = rel * scale
        + 4.0 * f64::from(f32::EPSILON) * want.abs()
        + (terms as f64 + 1.0) * f64::from(f32::MIN_POSITIVE);
    let err = (f64::from(got) - want).abs();
    prop_assert!(
        err <= tol,
        "{what}: got {got}, f64 reference {want}, error {err:e}, tolerance {tol:e} (scale {scale:e})"
    );
    Ok(())
}

/// Whether a reference can be compared with f32 arithmetic: finite and far from f32's limits.
fn comparable(want: f64, scale: f64) -> bool {
    want.is_finite() && scale.is_finite() && scale < 1e30
}

fn upload<T: Element>(rt: &Runtime, v: &[T]) -> Buffer<T> {
    rt.upload(v).expect("a small upload")
}

/// A buffer of `len` elements, from this runtime or (`foreign`) from another.
fn buffer(rt: &Runtime, v: &[f32], foreign: bool) -> Buffer<f32> {
    upload(if foreign { other() } else { rt }, v)
}

// ---------------------------------------------------------------------------------------------
// KlComplexity and KlTerms: q, p of n elements
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct KlCase {
    q: Vec<f32>,
    p: Vec<f32>,
    out_len: usize,
    foreign: Option<usize>,
}

fn kl_case() -> impl Strategy<Value = KlCase> {
    size()
        .prop_flat_map(|n| (Just(n), near(n), near(n)))
        .prop_flat_map(|(n, p_len, out_len)| {
            (
                probabilities(n),
                probabilities(p_len),
                Just(out_len),
                prop::option::weighted(0.1, 0usize..3),
            )
        })
        .prop_map(|(q, p, out_len, foreign)| KlCase {
            q,
            p,
            out_len,
            foreign,
        })
}

fn kl_properties(rt: &Runtime, c: &KlCase) -> Result<(), TestCaseError> {
    let (n, p_len) = (c.q.len(), c.p.len());
    let qb = buffer(rt, &c.q, c.foreign == Some(0));
    let pb = buffer(rt, &c.p, c.foreign == Some(1));
    let mut out = buffer(rt, &vec![f32::NAN; c.out_len], c.foreign == Some(2));
    // The reference: Σ q (ln q − ln p) with 0 ln 0 = 0, and the terms' magnitude before they
    // cancel, Σ q (|ln q| + |ln p|).
    let terms: Vec<(f64, f64)> =
        c.q.iter()
            .zip(&c.p)
            .map(|(&q, &p)| {
                let (qd, pd) = (f64::from(q), f64::from(p));
                let scale = if q == 0.0 {
                    0.0
                } else {
                    qd.abs() * (qd.ln().abs() + pd.ln().abs())
                };
                (common::kl_term(q, p), scale)
            })
            .collect();
    // Valid for comparison: q >= 0, p a normal positive number, all moderate.
    let valid = is_moderate(&c.q)
        && is_moderate(&c.p)
        && c.q.iter().all(|&q| q >= 0.0)
        && c.p.iter().all(|&p| p >= f32::MIN_POSITIVE);

    // KlComplexity: the total (`out` is not one of its arguments).
    let got = KlComplexity::submit(rt, &qb, &pb);
    match c.foreign {
        Some(f @ 0..=1) => expect_foreign("KlComplexity", got, &[["q", "p"][f]])?,
        _ => {
            let w = want(&[rule("q", n, &[n]), rule("p", p_len, &[n])], true);
            if let Some(t) = check_outcome("KlComplexity", got, &w)? {
                let v = t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
                let want: f64 = terms.iter().map(|t| t.0).sum();
                let scale: f64 = terms.iter().map(|t| t.1).sum();
                if valid && comparable(want, scale) {
                    assert_near("KlComplexity", v, want, scale, common::REL_TOL, n)?;
                }
            }
        }
    }

    // KlTerms: each term, to `out`.
    let got = KlTerms::submit(rt, &qb, &pb, &mut out);
    match c.foreign {
        Some(f) => expect_foreign("KlTerms", got, &[["q", "p", "out"][f]])?,
        None => {
            let w = want(
                &[
                    rule("q", n, &[n]),
                    rule("p", p_len, &[n]),
                    rule("out", c.out_len, &[n]),
                ],
                true,
            );
            if wait(check_outcome("KlTerms", got, &w)?)? {
                let got = out
                    .to_vec()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if valid {
                    for (i, (&g, &(want, scale))) in got.iter().zip(&terms).enumerate() {
                        if comparable(want, scale) {
                            assert_near(&format!("KlTerms[{i}]"), g, want, scale, 1e-5, 1)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A submission with a buffer of another runtime: `ForeignBuffer` naming it.
fn expect_foreign<T>(
    chain: &str,
    got: Result<T, Error>,
    args: &[&'static str],
) -> Result<(), TestCaseError> {
    match got {
        Err(Error::ForeignBuffer { arg, .. }) if args.contains(&arg) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!(
            "{chain}: expected ForeignBuffer for one of {args:?}, got {e:?}"
        ))),
        Ok(_) => Err(TestCaseError::fail(format!(
            "{chain}: accepted a buffer of another runtime ({args:?})"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// AccuracyPipeline: −½ Σ prec (obs − pred)²
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct AccuracyCase {
    obs: Vec<f32>,
    pred: Vec<f32>,
    prec: Vec<f32>,
    foreign: Option<usize>,
}

fn accuracy_case() -> impl Strategy<Value = AccuracyCase> {
    size()
        .prop_flat_map(|n| (Just(n), near(n), near(n)))
        .prop_flat_map(|(n, a, b)| {
            (
                values(n),
                values(a),
                values(b),
                prop::option::weighted(0.1, 0usize..3),
            )
        })
        .prop_map(|(obs, pred, prec, foreign)| AccuracyCase {
            obs,
            pred,
            prec,
            foreign,
        })
}

fn accuracy_properties(rt: &Runtime, c: &AccuracyCase) -> Result<(), TestCaseError> {
    let n = c.obs.len();
    let ob = buffer(rt, &c.obs, c.foreign == Some(0));
    let pb = buffer(rt, &c.pred, c.foreign == Some(1));
    let wb = buffer(rt, &c.prec, c.foreign == Some(2));
    let got = AccuracyPipeline::submit(rt, &ob, &pb, &wb);
    if let Some(f) = c.foreign {
        return expect_foreign("AccuracyPipeline", got, &[["obs", "pred", "prec"][f]]);
    }
    let w = want(
        &[
            rule("obs", n, &[n]),
            rule("pred", c.pred.len(), &[n]),
            rule("prec", c.prec.len(), &[n]),
        ],
        true,
    );
    if let Some(t) = check_outcome("AccuracyPipeline", got, &w)? {
        let v = t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The reference as written, and as a device that flushes subnormal inputs to zero sees
        // it: a subnormal precision times a squared error of 10^12 is a term far above the
        // slack `assert_near` gives flushed values, and either answer is right.
        let reference = |flush: bool| {
            let f = |v: f32| {
                if flush && v.is_subnormal() {
                    0.0
                } else {
                    f64::from(v)
                }
            };
            let (mut want, mut scale) = (0.0f64, 0.0f64);
            for i in 0..n {
                let (o, p, w) = (f(c.obs[i]), f(c.pred[i]), f(c.prec[i]));
                want += -0.5 * w * (o - p) * (o - p);
                scale += 0.5 * w.abs() * (o.abs() + p.abs()).powi(2);
            }
            (want, scale)
        };
        if is_moderate(&c.obs) && is_moderate(&c.pred) && is_moderate(&c.prec) {
            let (want, scale) = reference(false);
            prop_assert!(comparable(want, scale), "moderate values stay comparable");
            let (flushed, flushed_scale) = reference(true);
            let near =
                |want, scale| assert_near("AccuracyPipeline", v, want, scale, common::REL_TOL, n);
            if near(flushed, flushed_scale).is_err() {
                near(want, scale)?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// GemvAxpbySum: Σ (α A x + β y)², A m×n
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct GemvCase {
    x: Vec<f32>,
    a: Vec<f32>,
    y: Vec<f32>,
    alpha: f32,
    beta: f32,
}

fn gemv_case() -> impl Strategy<Value = GemvCase> {
    (size(), size())
        .prop_flat_map(|(m, n)| (near(n), near(m * n), near(m)))
        .prop_flat_map(|(x, a, y)| (values(x), values(a), values(y), wild_value(), wild_value()))
        .prop_map(|(x, a, y, alpha, beta)| GemvCase {
            x,
            a,
            y,
            alpha,
            beta,
        })
}

fn gemv_properties(rt: &Runtime, c: &GemvCase) -> Result<(), TestCaseError> {
    let (n, m) = (c.x.len(), c.y.len());
    let (xb, ab, yb) = (upload(rt, &c.x), upload(rt, &c.a), upload(rt, &c.y));
    let got = GemvAxpbySum::submit(rt, &xb, &ab, &yb, c.alpha, c.beta);
    // n comes from x, m from y; a must be m x n.
    let w = want(
        &[
            rule("x", n, &[n]),
            rule("a", c.a.len(), &[m, n]),
            rule("y", m, &[m]),
        ],
        true,
    );
    if let Some(t) = check_outcome("GemvAxpbySum", got, &w)? {
        let v = t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (alpha, beta) = (f64::from(c.alpha), f64::from(c.beta));
        let (mut want, mut scale) = (0.0f64, 0.0f64);
        for i in 0..m {
            let (mut ax, mut mag) = (0.0f64, 0.0f64);
            for j in 0..n {
                let t = f64::from(c.a[i * n + j]) * f64::from(c.x[j]);
                ax += t;
                mag += t.abs();
            }
            let z = alpha * ax + beta * f64::from(c.y[i]);
            let s = alpha.abs() * mag + beta.abs() * f64::from(c.y[i]).abs();
            want += z * z;
            scale += s * s;
        }
        let ok = is_moderate(&c.x)
            && is_moderate(&c.a)
            && is_moderate(&c.y)
            && is_moderate(&[c.alpha, c.beta]);
        if ok && comparable(want, scale) {
            assert_near("GemvAxpbySum", v, want, scale, 1e-4, m * n)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// BeliefUpdateStep: mu + lr Jᵀ (prec ⊙ (obs − pred)), J m×n
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct BeliefCase {
    obs: Vec<f32>,
    pred: Vec<f32>,
    prec: Vec<f32>,
    jac: Vec<f32>,
    mu: Vec<f32>,
    lr: f32,
    out_len: usize,
    foreign: Option<usize>,
}

fn belief_case() -> impl Strategy<Value = BeliefCase> {
    (size(), size())
        .prop_flat_map(|(m, n)| (Just(m), near(m), near(m), near(m * n), near(n), near(n)))
        .prop_flat_map(|(m, pred, prec, jac, mu, out)| {
            (
                values(m),
                values(pred),
                values(prec),
                values(jac),
                values(mu),
                wild_value(),
                Just(out),
                prop::option::weighted(0.1, 0usize..6),
            )
        })
        .prop_map(
            |(obs, pred, prec, jac, mu, lr, out_len, foreign)| BeliefCase {
                obs,
                pred,
                prec,
                jac,
                mu,
                lr,
                out_len,
                foreign,
            },
        )
}

fn belief_properties(rt: &Runtime, c: &BeliefCase) -> Result<(), TestCaseError> {
    let f = |i| c.foreign == Some(i);
    let (ob, pb, wb) = (
        buffer(rt, &c.obs, f(0)),
        buffer(rt, &c.pred, f(1)),
        buffer(rt, &c.prec, f(2)),
    );
    let (jb, mb) = (buffer(rt, &c.jac, f(3)), buffer(rt, &c.mu, f(4)));
    let mut out = buffer(rt, &vec![f32::NAN; c.out_len], f(5));
    let got = BeliefUpdateStep::submit(rt, &ob, &pb, &wb, &jb, &mb, c.lr, &mut out);
    if let Some(i) = c.foreign {
        let names = ["obs", "pred", "prec", "a", "mu", "out"];
        return expect_foreign("BeliefUpdateStep", got, &[names[i]]);
    }
    // m comes from obs, n from mu; the Jacobian is argument `a`, m x n.
    let (m, n) = (c.obs.len(), c.mu.len());
    let w = want(
        &[
            rule("obs", m, &[m]),
            rule("pred", c.pred.len(), &[m]),
            rule("prec", c.prec.len(), &[m]),
            rule("a", c.jac.len(), &[m, n]),
            rule("mu", n, &[n]),
            rule("out", c.out_len, &[n]),
        ],
        true,
    );
    if wait(check_outcome("BeliefUpdateStep", got, &w)?)? {
        let got = out
            .to_vec()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let ok = [&c.obs, &c.pred, &c.prec, &c.jac, &c.mu]
            .iter()
            .all(|v| is_moderate(v))
            && is_moderate(&[c.lr]);
        if !ok {
            return Ok(());
        }
        let lr = f64::from(c.lr);
        for (col, &out_col) in got.iter().enumerate() {
            let (mut g, mut mag) = (0.0f64, 0.0f64);
            for i in 0..m {
                let (o, p, w) = (
                    f64::from(c.obs[i]),
                    f64::from(c.pred[i]),
                    f64::from(c.prec[i]),
                );
                let j = f64::from(c.jac[i * n + col]);
                g += j * w * (o - p);
                mag += (j * w).abs() * (o.abs() + p.abs());
            }
            let mu = f64::from(c.mu[col]);
            let (want, scale) = (mu + lr * g, mu.abs() + lr.abs() * mag);
            if comparable(want, scale) {
                assert_near(
                    &format!("BeliefUpdateStep m={m} n={n} out[{col}]"),
                    out_col,
                    want,
                    scale,
                    1e-4,
                    m,
                )?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// DistanceKth: each point's k-th nearest Chebyshev distance; x n×d
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct DistanceCase {
    x: Vec<f32>,
    d: usize,
    k: u32,
    out_len: usize,
}

fn distance_case() -> impl Strategy<Value = DistanceCase> {
    (size(), prop_oneof![4 => 0usize..5, 1 => Just(128usize), 1 => Just(129usize)])
        .prop_flat_map(|(n, d)| {
            (
                dim_param(d),
                near(n * d),
                near(n),
                prop_oneof![8 => 1u32..6, 1 => Just(0u32), 1 => Just(16u32), 1 => Just(17u32), 1 => any::<u32>()],
            )
        })
        .prop_flat_map(|(d, x_len, out_len, k)| (values(x_len), Just(d), Just(k), Just(out_len)))
        .prop_map(|(x, d, k, out_len)| DistanceCase {
            x,
            d,
            k,
            out_len,
        })
}

fn distance_properties(rt: &Runtime, c: &DistanceCase) -> Result<(), TestCaseError> {
    let xb = upload(rt, &c.x);
    let mut out = upload(rt, &vec![f32::NAN; c.out_len]);
    let got = DistanceKth::submit(rt, &xb, c.k, &mut out, c.d);
    // n comes from out; x must be n x d. The op takes 1 <= k <= 16, k < n (for n > 0), and at
    // most 128 coordinates a point.
    let n = c.out_len;
    let k = c.k as usize;
    let op_ok = (1..=16).contains(&k) && (n == 0 || k < n) && c.d <= 128;
    let w = want(
        &[rule("x", c.x.len(), &[n, c.d]), rule("out", n, &[n])],
        op_ok,
    );
    let Some(t) = check_outcome("DistanceKth", got, &w)? else {
        return Ok(());
    };
    t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let got = out
        .to_vec()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    if !c.x.iter().all(|v| v.is_finite()) {
        return Ok(());
    }
    // Distances are f32 differences on both sides: equal, not just close.
    let d = c.d;
    let mut row = Vec::with_capacity(n);
    for (i, &g) in got.iter().enumerate() {
        row.clear();
        row.extend((0..n).filter(|&j| j != i).map(|j| {
            (0..d)
                .map(|col| f64::from((c.x[i * d + col] - c.x[j * d + col]).abs()))
                .fold(0.0, f64::max)
        }));
        row.sort_unstable_by(f64::total_cmp);
        prop_assert_eq!(
            f64::from(g),
            row[k - 1],
            "point {} of {} (d = {}, k = {})",
            i,
            n,
            d,
            k
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// MatmulBias{Relu,Sigmoid,Tanh,Gelu}: act(A W + b), A m×k, W k×n
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MatmulCase {
    a: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    out_len: usize,
    m: usize,
    k: usize,
    act: usize,
    foreign: Option<usize>,
}

fn matmul_case() -> impl Strategy<Value = MatmulCase> {
    (size(), size(), size())
        .prop_flat_map(|(m, k, n)| {
            (
                dim_param(m),
                dim_param(k),
                near(m * k),
                near(k * n),
                near(n),
                near(m * n),
            )
        })
        .prop_flat_map(|(m, k, a, w, b, out)| {
            (
                values(a),
                values(w),
                values(b),
                Just(out),
                Just(m),
                Just(k),
                0usize..4,
                prop::option::weighted(0.1, 0usize..4),
            )
        })
        .prop_map(|(a, w, b, out_len, m, k, act, foreign)| MatmulCase {
            a,
            w,
            b,
            out_len,
            m,
            k,
            act,
            foreign,
        })
}

type Submit = for<'a> fn(
    &Runtime,
    &'a Buffer<f32>,
    &'a Buffer<f32>,
    &'a Buffer<f32>,
    &'a mut Buffer<f32>,
    usize,
    usize,
) -> Result<pptm::Ticket<'a, ()>, Error>;

/// An activation's chain: its name, its submit, and the activation in f64.
type Layer = (&'static str, Submit, fn(f64) -> f64);

/// Each activation's chain.
const LAYERS: [Layer; 4] = [
    ("MatmulBiasRelu", MatmulBiasRelu::submit, |x| x.max(0.0)),
    ("MatmulBiasSigmoid", MatmulBiasSigmoid::submit, |x| {
        1.0 / (1.0 + (-x).exp())
    }),
    ("MatmulBiasTanh", MatmulBiasTanh::submit, f64::tanh),
    ("MatmulBiasGelu", MatmulBiasGelu::submit, gelu),
];

/// The pre-activation `A W + b` in f64 and each output's terms' magnitude.
fn matmul_reference(a: &[f64], w: &[f64], b: &[f32], m: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let n = b.len();
    if m.checked_mul(n).is_none_or(|len| len == 0) {
        // No outputs (whatever m or k say).
        return (Vec::new(), Vec::new());
    }
    let mut pre: Vec<f64> = (0..m * n).map(|i| f64::from(b[i % n.max(1)])).collect();
    let mut scale: Vec<f64> = pre.iter().map(|x| x.abs()).collect();
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                let t = a[i * k + p] * w[p * n + j];
                pre[i * n + j] += t;
                scale[i * n + j] += t.abs();
            }
        }
    }
    (pre, scale)
}

fn matmul_properties(rt: &Runtime, c: &MatmulCase) -> Result<(), TestCaseError> {
    let (name, submit, act) = LAYERS[c.act];
    let f = |i| c.foreign == Some(i);
    let (ab, wb, bb) = (
        buffer(rt, &c.a, f(0)),
        buffer(rt, &c.w, f(1)),
        buffer(rt, &c.b, f(2)),
    );
    let mut out = buffer(rt, &vec![f32::NAN; c.out_len], f(3));
    let got = submit(rt, &ab, &wb, &bb, &mut out, c.m, c.k);
    if let Some(i) = c.foreign {
        return expect_foreign(name, got, &[["a", "w", "b", "out"][i]]);
    }
    // n comes from b; m and k are parameters.
    let (m, k, n) = (c.m, c.k, c.b.len());
    let w = want(
        &[
            rule("a", c.a.len(), &[m, k]),
            rule("w", c.w.len(), &[k, n]),
            rule("b", n, &[n]),
            rule("out", c.out_len, &[m, n]),
        ],
        true,
    );
    let Some(t) = check_outcome(name, got, &w)? else {
        return Ok(());
    };
    t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let got = out
        .to_vec()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    if !(is_moderate(&c.a) && is_moderate(&c.w) && is_moderate(&c.b)) {
        return Ok(());
    }
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (pre, scale) = matmul_reference(&wide(&c.a), &wide(&c.w), &c.b, m, k);
    for (i, ((&g, &x), &s)) in got.iter().zip(&pre).zip(&scale).enumerate() {
        // Every activation here has slope at most 1.13: the pre-activation's error passes
        // through scaled by it.
        let want = act(x);
        if comparable(want, s) {
            assert_near(
                &format!("{name} m={m} k={k} n={n} out[{i}]"),
                g,
                want,
                s,
                1e-4,
                k,
            )?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tensor-core chains: 16-bit operands, element types through submit_chain, the guarded chain
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct TensorCase {
    m: usize,
    k: usize,
    a: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    /// Element type of `a` and `w` as passed: 0 f32, 1 bf16, 2 f16.
    a_type: usize,
    w_type: usize,
    chain: usize,
}

fn tensor_case() -> impl Strategy<Value = TensorCase> {
    (size(), size(), size())
        .prop_flat_map(|(m, k, n)| {
            (
                Just(m),
                Just(k),
                prop::collection::vec(-1.0f32..1.0, m * k),
                prop::collection::vec(-1.0f32..1.0, k * n),
                values(n),
                prop_oneof![3 => Just(None), 1 => (0usize..3).prop_map(Some)],
                prop_oneof![3 => Just(None), 1 => (0usize..3).prop_map(Some)],
                0usize..4,
            )
        })
        .prop_map(|(m, k, a, w, b, at, wt, chain)| {
            // The chain's own operand type unless a fault is drawn.
            let own = [1, 2, 0, 0][chain];
            TensorCase {
                m,
                k,
                a,
                w,
                b,
                a_type: at.unwrap_or(own),
                w_type: wt.unwrap_or(own),
                chain,
            }
        })
}

/// A buffer of `v` in element type `t` (0 f32, 1 bf16, 2 f16), kept so an `InputBuffer` can
/// borrow it.
enum Typed {
    F32(Buffer<f32>),
    Bf16(Buffer<bf16>),
    F16(Buffer<f16>),
}

impl Typed {
    fn new(rt: &Runtime, v: &[f32], t: usize) -> Typed {
        match t {
            0 => Typed::F32(upload(rt, v)),
            1 => Typed::Bf16(upload(
                rt,
                &v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(),
            )),
            _ => Typed::F16(upload(
                rt,
                &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
            )),
        }
    }

    fn input(&self) -> InputBuffer<'_> {
        match self {
            Typed::F32(b) => b.into(),
            Typed::Bf16(b) => b.into(),
            Typed::F16(b) => b.into(),
        }
    }

    /// The values as the chain reads them (16-bit values widened exactly).
    fn wide(&self) -> Vec<f64> {
        match self {
            Typed::F32(b) => b.to_vec().unwrap().into_iter().map(f64::from).collect(),
            Typed::Bf16(b) => b
                .to_vec()
                .unwrap()
                .into_iter()
                .map(|x| x.to_f64())
                .collect(),
            Typed::F16(b) => b
                .to_vec()
                .unwrap()
                .into_iter()
                .map(|x| x.to_f64())
                .collect(),
        }
    }
}

fn submit_tensor<C: Chain<Output = ()>>(
    rt: &Runtime,
    a: &Typed,
    w: &Typed,
    b: &Buffer<f32>,
    out: &mut Buffer<f32>,
    m: usize,
    k: usize,
) -> Result<(), Error> {
    rt.submit_chain::<C>(vec![
        Arg::Input("a", a.input()),
        Arg::Input("w", w.input()),
        Arg::Input("b", b.into()),
        Arg::Output("out", out),
        Arg::Dim("m", m),
        Arg::Dim("k", k),
    ])?
    .wait()
}

fn tensor_properties(rt: &Runtime, c: &TensorCase) -> Result<(), TestCaseError> {
    let (m, k, n) = (c.m, c.k, c.b.len());
    let (a, w) = (
        Typed::new(rt, &c.a, c.a_type),
        Typed::new(rt, &c.w, c.w_type),
    );
    let bb = upload(rt, &c.b);
    let mut out = upload(rt, &vec![f32::NAN; m * n]);
    let (name, own, got) = match c.chain {
        0 => (
            "MatmulBiasGeluBf16",
            DType::Bf16,
            submit_tensor::<MatmulBiasGeluBf16>(rt, &a, &w, &bb, &mut out, m, k),
        ),
        1 => (
            "MatmulBiasGeluF16",
            DType::F16,
            submit_tensor::<MatmulBiasGeluF16>(rt, &a, &w, &bb, &mut out, m, k),
        ),
        2 => (
            "MatmulBiasGeluGuarded",
            DType::F32,
            submit_tensor::<MatmulBiasGeluGuarded>(rt, &a, &w, &bb, &mut out, m, k),
        ),
        _ => (
            "MatmulBiasGelu",
            DType::F32,
            submit_tensor::<MatmulBiasGelu>(rt, &a, &w, &bb, &mut out, m, k),
        ),
    };
    let dtype = |t: usize| [DType::F32, DType::Bf16, DType::F16][t];
    let wrong: Vec<(&str, DType)> = [("a", dtype(c.a_type)), ("w", dtype(c.w_type))]
        .into_iter()
        .filter(|(_, t)| *t != own)
        .collect();
    if !wrong.is_empty() {
        return match got {
            Err(Error::DTypeMismatch {
                arg, expected, got, ..
            }) if expected == own && wrong.contains(&(arg, got)) => Ok(()),
            other => Err(TestCaseError::fail(format!(
                "{name}: {wrong:?} of the wrong element type (the chain reads {own}): {other:?}"
            ))),
        };
    }
    got.map_err(|e| TestCaseError::fail(format!("{name}: valid input refused: {e:?}")))?;
    let got = out
        .to_vec()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    if !is_moderate(&c.b) {
        return Ok(());
    }
    // The reference multiplies the operand values the chain reads: 16-bit ones widened exactly,
    // so what is judged is the f32 accumulation (1e-4 of the terms' magnitude). The guarded
    // chain rounds its f32 operands to fp16 where its check passes: its tolerance, 1e-2.
    let (pre, scale) = matmul_reference(&a.wide(), &w.wide(), &c.b, m, k);
    let bar = if c.chain == 2 { 1e-2 } else { 1e-4 };
    for (i, ((&g, &x), &s)) in got.iter().zip(&pre).zip(&scale).enumerate() {
        assert_near(
            &format!("{name} m={m} k={k} n={n} out[{i}]"),
            g,
            gelu(x),
            s.max(1e-3),
            bar,
            k,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Argument lists through submit_chain
// ---------------------------------------------------------------------------------------------

/// One argument as a list describes it.
#[derive(Debug, Clone, PartialEq)]
enum Spec {
    Input(&'static str, usize),
    Output(&'static str, usize),
    F32(&'static str, f32),
    U32(&'static str, u32),
    Dim(&'static str, usize),
}

impl Spec {
    /// Name and kind: what the runtime matches a list against.
    fn signature(&self) -> (&'static str, u8) {
        match *self {
            Spec::Input(n, _) => (n, 0),
            Spec::Output(n, _) => (n, 1),
            Spec::F32(n, _) => (n, 2),
            Spec::U32(n, _) => (n, 3),
            Spec::Dim(n, _) => (n, 4),
        }
    }

    fn renamed(&self, to: &'static str) -> Spec {
        match *self {
            Spec::Input(_, l) => Spec::Input(to, l),
            Spec::Output(_, l) => Spec::Output(to, l),
            Spec::F32(_, v) => Spec::F32(to, v),
            Spec::U32(_, v) => Spec::U32(to, v),
            Spec::Dim(_, v) => Spec::Dim(to, v),
        }
    }

    /// The same name as another kind.
    fn rekinded(&self, kind: u8) -> Spec {
        let n = self.signature().0;
        match kind % 5 {
            0 => Spec::Input(n, 3),
            1 => Spec::Output(n, 3),
            2 => Spec::F32(n, 1.0),
            3 => Spec::U32(n, 1),
            _ => Spec::Dim(n, 3),
        }
    }
}

/// One edit of a correct argument list.
#[derive(Debug, Clone)]
enum ListEdit {
    Drop(Index),
    Duplicate(Index),
    Swap(Index, Index),
    Rename(Index, Index),
    Rekind(Index, u8),
    Append(u8),
}

fn list_edit() -> impl Strategy<Value = ListEdit> {
    prop_oneof![
        any::<Index>().prop_map(ListEdit::Drop),
        any::<Index>().prop_map(ListEdit::Duplicate),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| ListEdit::Swap(a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| ListEdit::Rename(a, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(a, k)| ListEdit::Rekind(a, k)),
        any::<u8>().prop_map(ListEdit::Append),
    ]
}

const NAMES: [&str; 10] = ["q", "p", "out", "a", "w", "b", "m", "k", "n", "x"];

fn edit_list(mut list: Vec<Spec>, edits: &[ListEdit]) -> Vec<Spec> {
    for e in edits {
        let len = list.len();
        match e {
            ListEdit::Append(kind) => list.push(Spec::Dim("n", 3).rekinded(*kind)),
            _ if len == 0 => {}
            ListEdit::Drop(i) => {
                list.remove(i.index(len));
            }
            ListEdit::Duplicate(i) => {
                let s = list[i.index(len)].clone();
                list.insert(i.index(len), s);
            }
            ListEdit::Swap(i, j) => list.swap(i.index(len), j.index(len)),
            ListEdit::Rename(i, to) => {
                let i = i.index(len);
                list[i] = list[i].renamed(NAMES[to.index(NAMES.len())]);
            }
            ListEdit::Rekind(i, kind) => {
                let i = i.index(len);
                list[i] = list[i].rekinded(*kind);
            }
        }
    }
    list
}

/// Submits `list` to chain `C`; a list whose names and kinds are not exactly `correct`'s must be
/// `BadArguments`, and `correct` itself must run.
fn submit_list<C: Chain>(
    rt: &Runtime,
    correct: &[Spec],
    list: &[Spec],
) -> Result<(), TestCaseError> {
    let inputs: Vec<Buffer<f32>> = list
        .iter()
        .map(|s| match s {
            Spec::Input(_, l) => upload(rt, &vec![0.5; *l]),
            _ => upload(rt, &[]),
        })
        .collect();
    let mut outputs: Vec<Buffer<f32>> = list
        .iter()
        .map(|s| match s {
            Spec::Output(_, l) => upload(rt, &vec![0.0; *l]),
            _ => upload(rt, &[]),
        })
        .collect();
    let args: Vec<Arg<'_>> = list
        .iter()
        .zip(&inputs)
        .zip(outputs.iter_mut())
        .map(|((s, i), o)| match *s {
            Spec::Input(n, _) => Arg::Input(n, i.into()),
            Spec::Output(n, _) => Arg::Output(n, o),
            Spec::F32(n, v) => Arg::F32(n, v),
            Spec::U32(n, v) => Arg::U32(n, v),
            Spec::Dim(n, v) => Arg::Dim(n, v),
        })
        .collect();
    let same = list.len() == correct.len()
        && list
            .iter()
            .zip(correct)
            .all(|(a, b)| a.signature() == b.signature());
    // The correct list itself, values and all, must run: no refusal is acceptable for it.
    let exact = list == correct;
    let got = rt.submit_chain::<C>(args);
    match got {
        Err(e) if exact => Err(TestCaseError::fail(format!(
            "{}: the correct argument list {list:?} was refused: {e:?}",
            C::NAME
        ))),
        Ok(t) if same => {
            t.wait()
                .map_err(|e| TestCaseError::fail(format!("{}: {e:?}", C::NAME)))?;
            Ok(())
        }
        Err(Error::BadArguments { .. }) if !same => Ok(()),
        // Same structure, other values: lengths and values may still be refused.
        Err(Error::LengthMismatch { .. } | Error::BadArguments { .. }) if same => Ok(()),
        Ok(_) => Err(TestCaseError::fail(format!(
            "{}: accepted {list:?}",
            C::NAME
        ))),
        Err(e) => Err(TestCaseError::fail(format!(
            "{}: {list:?} (same structure: {same}) gave {e:?}",
            C::NAME
        ))),
    }
}

fn argument_list_properties(
    rt: &Runtime,
    chain: usize,
    edits: &[ListEdit],
) -> Result<(), TestCaseError> {
    use Spec::*;
    match chain {
        0 => {
            let correct = vec![Input("q", 5), Input("p", 5)];
            submit_list::<KlComplexity>(rt, &correct, &correct)?;
            submit_list::<KlComplexity>(rt, &correct, &edit_list(correct.clone(), edits))
        }
        1 => {
            let correct = vec![
                Input("a", 6),
                Input("w", 12),
                Input("b", 4),
                Output("out", 8),
                Dim("m", 2),
                Dim("k", 3),
            ];
            submit_list::<MatmulBiasRelu>(rt, &correct, &correct)?;
            submit_list::<MatmulBiasRelu>(rt, &correct, &edit_list(correct.clone(), edits))
        }
        2 => {
            let correct = vec![Input("x", 12), U32("k", 2), Output("out", 4), Dim("d", 3)];
            submit_list::<DistanceKth>(rt, &correct, &correct)?;
            submit_list::<DistanceKth>(rt, &correct, &edit_list(correct.clone(), edits))
        }
        _ => {
            let correct = vec![
                Input("x", 3),
                Input("a", 6),
                Input("y", 2),
                F32("alpha", 1.0),
                F32("beta", 0.5),
            ];
            submit_list::<GemvAxpbySum>(rt, &correct, &correct)?;
            submit_list::<GemvAxpbySum>(rt, &correct, &edit_list(correct.clone(), edits))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TeReduction: coordinate counts, including ones whose sum overflows
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct TeCase {
    d: [usize; 3],
    lens: [usize; 4],
    k: u32,
}

fn te_case() -> impl Strategy<Value = TeCase> {
    let d = || prop_oneof![4 => 0usize..4, 1 => Just(64usize), 1 => Just(usize::MAX), 1 => Just(usize::MAX / 2 + 2)];
    (
        prop_oneof![1 => Just(0usize), 2 => 1usize..6],
        d(),
        d(),
        d(),
    )
        .prop_flat_map(|(n, dx, dy, dz)| {
            let len = |d: usize| n.checked_mul(d).filter(|&l| l <= 64).unwrap_or(0);
            (
                Just([dx, dy, dz]),
                near(len(dx)),
                near(len(dy)),
                near(len(dz)),
                near(n),
                prop_oneof![4 => 1u32..4, 1 => Just(0u32)],
            )
        })
        .prop_map(|(d, x, y, z, eps, k)| TeCase {
            d,
            lens: [x, y, z, eps],
            k,
        })
}

fn te_properties(rt: &Runtime, c: &TeCase) -> Result<(), TestCaseError> {
    let bufs: Vec<Buffer<f32>> = c
        .lens
        .iter()
        .map(|&l| {
            upload(
                rt,
                &(0..l).map(|i| (i % 5) as f32 * 0.25).collect::<Vec<_>>(),
            )
        })
        .collect();
    let [dx, dy, dz] = c.d;
    let got = TeReduction::submit(rt, &bufs[0], &bufs[1], &bufs[2], &bufs[3], c.k, dx, dy, dz);
    // n comes from eps; x, y, z are n x dx, n x dy, n x dz; at most 128 coordinates in all.
    let n = c.lens[3];
    let op_ok = dx
        .checked_add(dy)
        .and_then(|s| s.checked_add(dz))
        .is_some_and(|s| s <= 128);
    let w = want(
        &[
            rule("x", c.lens[0], &[n, dx]),
            rule("y", c.lens[1], &[n, dy]),
            rule("z", c.lens[2], &[n, dz]),
            rule("eps", n, &[n]),
        ],
        op_ok,
    );
    if let Some(t) = check_outcome("TeReduction", got, &w)? {
        t.wait().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The properties, on every backend
// ---------------------------------------------------------------------------------------------

fn on_every_backend(
    f: impl Fn(&Runtime) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    for rt in backends() {
        f(rt).map_err(|e| TestCaseError::fail(format!("{}: {e}", rt.describe())))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn kl_chains(c in kl_case()) {
        on_every_backend(|rt| kl_properties(rt, &c))?;
    }

    #[test]
    fn accuracy_pipeline(c in accuracy_case()) {
        on_every_backend(|rt| accuracy_properties(rt, &c))?;
    }

    #[test]
    fn gemv_axpby_sum(c in gemv_case()) {
        on_every_backend(|rt| gemv_properties(rt, &c))?;
    }

    #[test]
    fn belief_update_step(c in belief_case()) {
        on_every_backend(|rt| belief_properties(rt, &c))?;
    }

    #[test]
    fn distance_kth(c in distance_case()) {
        on_every_backend(|rt| distance_properties(rt, &c))?;
    }

    #[test]
    fn matmul_bias_activation(c in matmul_case()) {
        on_every_backend(|rt| matmul_properties(rt, &c))?;
    }

    #[test]
    fn tensor_core_chains_and_element_types(c in tensor_case()) {
        on_every_backend(|rt| tensor_properties(rt, &c))?;
    }

    #[test]
    fn argument_lists(chain in 0usize..4, edits in prop::collection::vec(list_edit(), 1..4)) {
        on_every_backend(|rt| argument_list_properties(rt, chain, &edits))?;
    }

    #[test]
    fn te_reduction_coordinate_counts(c in te_case()) {
        on_every_backend(|rt| te_properties(rt, &c))?;
    }
}

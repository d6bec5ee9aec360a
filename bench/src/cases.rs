//! What is measured: every chain at a small, a medium and a large size. Each case knows how to
//! generate its inputs (with the generator bench/peers.py reproduces, so PyTorch runs on the same
//! numbers), how to submit it to a runtime, how many bytes and flops the chain must move and do,
//! and its f64 reference, written here independently of the op catalog.

use std::time::Duration;

use pptm::chains::{
    AccuracyPipeline, BatchedMatmulBiasGeluBf16, BeliefUpdateStep, BeliefUpdateStepBf16,
    DistanceKth, GemvAxpbySum, GemvAxpbySumBf16, GemvAxpbySumFp8, GemvAxpbySumFp16, KlComplexity,
    MatmulBiasGelu, MatmulBiasGeluBf16, MatmulBiasGeluBf16x3, MatmulBiasGeluFp8, TeReduction,
};
use pptm::{Chain, Runtime};

/// ψ(x) for x > 0 in f64, written here rather than taken from the op catalog (which the CPU
/// backend runs): recurrence up to x >= 20, then the asymptotic series, below 2e-13 there.
fn digamma(x: f64) -> f64 {
    let (mut x, mut acc) = (x, 0.0);
    while x < 20.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    acc + x.ln() - 0.5 / x - r * (1.0 / 12.0 - r * (1.0 / 120.0 - r / 252.0))
}

pub use crate::inputs::uniform;

/// What a variant's result must match.
pub enum Expect {
    /// A scalar, judged relative to `scale` (the magnitude of the terms it sums).
    Scalar { value: f64, scale: f64 },
    /// Sampled elements of the output: (index, value, scale). `exact`: bit-equal as f32.
    Elements {
        at: Vec<(usize, f64, f64)>,
        exact: bool,
    },
}

/// What a run returned.
pub enum Got {
    Scalar(f64),
    Vector(Vec<f32>),
}

impl Got {
    /// One number to cross-check against PyTorch: the scalar, or the sum of the output.
    pub fn summary(&self) -> f64 {
        match self {
            Got::Scalar(v) => *v,
            Got::Vector(v) => v.iter().map(|&x| f64::from(x)).sum(),
        }
    }
}

/// One submit → result; the output is read back (outside any timing) when asked for.
pub struct Sample {
    pub device: Option<Duration>,
    pub got: Option<Got>,
}

pub type Runner<'a> = Box<dyn FnMut(bool) -> pptm::Result<Sample> + 'a>;
type Prepare = Box<dyn for<'a> Fn(&'a Runtime) -> pptm::Result<Runner<'a>>>;

pub struct Case {
    pub chain: &'static str,
    pub domain: &'static str,
    /// small, medium or large.
    pub size: &'static str,
    pub shape: String,
    /// The size axis of the plot (elements, points or matrix side).
    pub x: f64,
    /// Bytes the chain must move and flops it must do at this size (for GB/s and TFLOP/s).
    pub bytes: f64,
    pub flops: f64,
    /// Uploads the inputs to a runtime and returns what runs the case there.
    pub prepare: Prepare,
    pub expect: Box<dyn Fn() -> Expect>,
}

/// The relative error of `got` against `want`, or why it is wrong.
pub fn check(want: &Expect, got: &Got) -> Result<f64, String> {
    let rel = |g: f64, v: f64, scale: f64| (g - v).abs() / scale.abs().max(v.abs()).max(1e-30);
    match (want, got) {
        (Expect::Scalar { value, scale }, Got::Scalar(g)) => {
            if g.is_finite() {
                Ok(rel(*g, *value, *scale))
            } else {
                Err(format!("result {g} is not finite (f64 reference {value})"))
            }
        }
        (Expect::Elements { at, exact }, Got::Vector(v)) => {
            let mut worst = 0.0f64;
            for &(i, value, scale) in at {
                let g = *v
                    .get(i)
                    .ok_or_else(|| format!("output has {} elements, wanted {}", v.len(), i + 1))?;
                let e = match exact {
                    true if g == value as f32 => 0.0,
                    true => f64::INFINITY,
                    false => rel(f64::from(g), value, scale),
                };
                if !e.is_finite() {
                    return Err(format!("element {i}: {g} vs reference {value}"));
                }
                worst = worst.max(e);
            }
            Ok(worst)
        }
        _ => Err("result of the wrong kind".into()),
    }
}

/// Indices to check in an output of `len` elements: both ends and 62 spread between.
fn sample_indices(len: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (0..64).map(|s| s * len / 64).collect();
    at.push(len - 1);
    at.dedup();
    at
}

/// Input stream numbers, shared with peers.py.
pub mod seed {
    pub const KL_Q: u64 = 1;
    pub const KL_P: u64 = 2;
    pub const ACC_OBS: u64 = 3;
    pub const ACC_PRED: u64 = 4;
    pub const ACC_PREC: u64 = 5;
    pub const BEL_OBS: u64 = 6;
    pub const BEL_PRED: u64 = 7;
    pub const BEL_PREC: u64 = 8;
    pub const BEL_J: u64 = 9;
    pub const BEL_MU: u64 = 10;
    pub const DIST_X: u64 = 11;
    pub const TE_X: u64 = 12;
    pub const TE_Y: u64 = 13;
    pub const TE_Z: u64 = 14;
    pub const TE_EPS: u64 = 15;
    pub const GEMV_A: u64 = 16;
    pub const GEMV_X: u64 = 17;
    pub const GEMV_Y: u64 = 18;
    pub const MM_A: u64 = 19;
    pub const MM_W: u64 = 20;
    pub const MM_B: u64 = 21;
    pub const MM16_A: u64 = 22;
    pub const MM16_W: u64 = 23;
    pub const MM16_B: u64 = 24;
    pub const RES_X: u64 = 25;
    pub const RES_Y: u64 = 26;
}

/// Fixed parameters, shared with peers.py.
pub const BELIEF_LR: f32 = 0.1;
pub const GEMV_ALPHA: f32 = 1.0;
pub const GEMV_BETA: f32 = 0.5;
pub const KTH_K: u32 = 4;
pub const KTH_D: usize = 4;
pub const TE_K: u32 = 4;
/// TE radii are 0.1 × uniform: a few per cent of the points fall inside.
pub const TE_EPS_SCALE: f32 = 0.1;

const SIZES: [&str; 3] = ["small", "medium", "large"];

/// Every case, in domain order (each domain's manifold is timed on its own).
pub fn all() -> Vec<Case> {
    let mut cases = Vec::new();
    for (size, n) in SIZES.into_iter().zip([4096usize, 1 << 20, 1 << 26]) {
        cases.push(kl_complexity(size, n));
        cases.push(accuracy_pipeline(size, n));
    }
    // J in f32, and stored in bf16 (the transposed GEMV reads half the bytes, on CUDA cores).
    for storage in [Storage::F32, Storage::Bf16] {
        for (size, n) in SIZES.into_iter().zip([256usize, 1024, 4096]) {
            cases.push(belief_update(storage, size, n));
        }
    }
    for (size, n) in SIZES.into_iter().zip([1024usize, 4096, 16384]) {
        cases.push(distance_kth(size, n));
        cases.push(te_reduction(size, n));
    }
    for (size, n) in SIZES.into_iter().zip([256usize, 4096, 16384]) {
        cases.push(gemv_axpby_sum(Storage::F32, size, n));
    }
    // The same GEMVs with A stored in bf16 or fp8 (tensor cores), or fp16 (CUDA cores): half or a
    // quarter of the bytes.
    for storage in [Storage::Bf16, Storage::Fp8, Storage::F16] {
        for (size, n) in SIZES.into_iter().zip([256usize, 4096, 16384]) {
            cases.push(gemv_axpby_sum(storage, size, n));
        }
    }
    for (size, (m, k, n)) in SIZES.into_iter().zip([
        (64usize, 256usize, 256usize),
        (1024, 1024, 1024),
        (4096, 4096, 4096),
    ]) {
        cases.push(matmul_bias_gelu(false, size, m, k, n));
        cases.push(matmul_bias_gelu(true, size, m, k, n));
    }
    for (size, (m, k, n)) in SIZES.into_iter().zip([
        (64usize, 256usize, 256usize),
        (1024, 1024, 1024),
        (8192, 8192, 8192),
    ]) {
        cases.push(matmul_bias_gelu_bf16(false, size, 1, m, k, n));
        cases.push(matmul_bias_gelu_fp8(size, m, k, n));
    }
    // Many small products of one shape: bench/src/cublas.rs times cuBLAS's strided batched GEMM
    // on the same shapes.
    for (size, (batch, m, k, n)) in SIZES.into_iter().zip([
        (128usize, 64usize, 64usize, 64usize),
        (256, 128, 128, 128),
        (64, 512, 512, 512),
    ]) {
        cases.push(matmul_bias_gelu_bf16(true, size, batch, m, k, n));
    }
    // One chain with built-in ops and with the same ops of one's own, side by side.
    for (size, n) in SIZES.into_iter().zip([4096usize, 1 << 20, 1 << 26]) {
        cases.push(squared_residual(false, size, n));
        cases.push(squared_residual(true, size, n));
    }
    // Dependent steps of 4096 elements (each reads what the one before wrote): waited one by
    // one, pushed as one pipeline, that pipeline kept and run again, and fused at build time;
    // and dependent 256 x 256 GEMVs, which no pass can fuse (each reads the whole step before).
    for (size, stages) in SIZES.into_iter().zip([8usize, 32, 170]) {
        for how in [Steps::Waited, Steps::Pipeline, Steps::Kept, Steps::Fused] {
            cases.push(dependent_steps(how, size, stages));
        }
        for how in [Steps::Waited, Steps::Pipeline, Steps::Kept] {
            cases.push(dependent_gemv(how, size, stages));
        }
    }
    // 18,030 geodesics by RK4 on a Christoffel grid (examples/geodesics.rs), each integration
    // one submission: 100 steps and 1000.
    for (size, steps) in [("small", 100usize), ("large", 1000)] {
        cases.push(geodesics(size, steps));
    }
    // Molecular dynamics with a learned force field (examples/md.rs): 100 velocity Verlet steps
    // of 10 to 10,000 atoms, one submission (the list by the cell list from 512 atoms).
    for (size, atoms) in MD_SIZES {
        cases.push(md(size, atoms));
    }
    // The same terms summed per row of a matrix: as many elements, rows of 64 to 4096.
    for (size, (rows, cols)) in
        SIZES
            .into_iter()
            .zip([(64usize, 64usize), (1024, 1024), (16384, 4096)])
    {
        cases.push(row_squared_residual(size, rows, cols));
    }
    cases
}

/// The chains, as named in results, in report order.
pub const CHAINS: [&str; 27] = [
    "kl_complexity",
    "accuracy_pipeline",
    "squared_residual",
    "squared_residual_own_ops",
    "row_squared_residual",
    "dependent_steps_waited",
    "dependent_steps_pipeline",
    "dependent_steps_kept",
    "dependent_steps_fused",
    "dependent_gemv_waited",
    "dependent_gemv_pipeline",
    "dependent_gemv_kept",
    "belief_update",
    "belief_update_bf16",
    "distance_kth",
    "te_reduction",
    "gemv_axpby_sum",
    "gemv_axpby_sum_bf16",
    "gemv_axpby_sum_fp8",
    "gemv_axpby_sum_fp16",
    "matmul_bias_gelu",
    "matmul_bias_gelu_bf16x3",
    "matmul_bias_gelu_bf16",
    "matmul_bias_gelu_fp8",
    "batched_matmul_bias_gelu_bf16",
    "geodesics",
    "md",
];

fn scalar(t: pptm::Timed<f32>, read: bool) -> Sample {
    Sample {
        device: t.device,
        got: read.then(|| Got::Scalar(f64::from(t.value))),
    }
}

fn vector(device: Option<Duration>, out: &pptm::Buffer<f32>, read: bool) -> pptm::Result<Sample> {
    Ok(Sample {
        device,
        got: if read {
            Some(Got::Vector(out.to_vec()?))
        } else {
            None
        },
    })
}

fn kl_complexity(size: &'static str, n: usize) -> Case {
    Case {
        chain: "kl_complexity",
        domain: KlComplexity::DOMAIN.name,
        size,
        shape: format!("n = {n}"),
        x: n as f64,
        bytes: 8.0 * n as f64,
        flops: 4.0 * n as f64,
        prepare: Box::new(move |rt| {
            let (q, p) = (
                rt.upload(&uniform(seed::KL_Q, n))?,
                rt.upload(&uniform(seed::KL_P, n))?,
            );
            Ok(Box::new(move |read| {
                Ok(scalar(
                    KlComplexity::submit(rt, &q, &p)?.wait_timed()?,
                    read,
                ))
            }))
        }),
        expect: Box::new(move || {
            let (value, scale) = kl_reference(&uniform(seed::KL_Q, n), &uniform(seed::KL_P, n));
            Expect::Scalar { value, scale }
        }),
    }
}

/// Σ q (ln q − ln p) in f64, and the sum of the terms' magnitudes (the scale errors are judged by).
pub fn kl_reference(q: &[f32], p: &[f32]) -> (f64, f64) {
    let (mut value, mut scale) = (0.0, 0.0);
    for (&q, &p) in q.iter().zip(p) {
        let (q, p) = (f64::from(q), f64::from(p));
        let t = q * (q.ln() - p.ln());
        value += t;
        scale += t.abs();
    }
    (value, scale)
}

/// Σ (α x + β y)², with built-in ops or with the same ops written with `#[pptm::op]`
/// (src/own_ops.rs): the same chain, the same domain.
fn squared_residual(own_ops: bool, size: &'static str, n: usize) -> Case {
    use crate::own_ops::{SquaredResidual, SquaredResidualOwnOps};
    const ALPHA: f32 = 1.0;
    const BETA: f32 = -0.5;
    Case {
        chain: if own_ops {
            "squared_residual_own_ops"
        } else {
            "squared_residual"
        },
        domain: SquaredResidual::DOMAIN.name,
        size,
        shape: format!("n = {n}"),
        x: n as f64,
        bytes: 8.0 * n as f64,
        flops: 5.0 * n as f64,
        prepare: Box::new(move |rt| {
            let (x, y) = (
                rt.upload(&uniform(seed::RES_X, n))?,
                rt.upload(&uniform(seed::RES_Y, n))?,
            );
            Ok(Box::new(move |read| {
                let timed = if own_ops {
                    SquaredResidualOwnOps::submit(rt, &x, &y, ALPHA, BETA)?.wait_timed()?
                } else {
                    SquaredResidual::submit(rt, &x, &y, ALPHA, BETA)?.wait_timed()?
                };
                Ok(scalar(timed, read))
            }))
        }),
        expect: Box::new(move || {
            let value = uniform(seed::RES_X, n)
                .iter()
                .zip(&uniform(seed::RES_Y, n))
                .map(|(&x, &y)| {
                    (f64::from(ALPHA) * f64::from(x) + f64::from(BETA) * f64::from(y)).powi(2)
                })
                .sum();
            Expect::Scalar {
                value,
                scale: value,
            }
        }),
    }
}

/// How the dependent steps are run.
#[derive(Clone, Copy, PartialEq)]
enum Steps {
    /// Each waited before the next is submitted.
    Waited,
    /// All pushed as one pipeline, waited once: built at every run.
    Pipeline,
    /// That pipeline built once (`wait_and_keep`) and run again.
    Kept,
    /// One item of a chain whose stage is repeated at build time (`repeat = stages`): the steps
    /// fused into one pass, as torch.compile fuses them.
    Fused,
}

/// Pushes `stages` dependent steps into `p`, each by `step` (from, to): u and v take turns as
/// output, the first step reads `x`. Returns the last step's output.
fn push_steps<'p>(
    p: &mut pptm::Pipeline<'p>,
    stages: usize,
    x: &'p pptm::Buffer<f32>,
    (u, v): (&'p mut pptm::Buffer<f32>, &'p mut pptm::Buffer<f32>),
    step: impl Fn(&mut pptm::Pipeline<'p>, pptm::PipeInput<'p>, pptm::PipeOutput) -> pptm::Result<()>,
) -> pptm::Result<pptm::PipeOutput> {
    let xi = p.input(x);
    let (uo, vo) = (p.output(u), p.output(v));
    for k in 0..stages {
        let (from, to): (pptm::PipeInput<'_>, _) = match k {
            0 => (xi, uo),
            k if k % 2 == 0 => (vo.into(), uo),
            _ => (uo.into(), vo),
        };
        step(p, from, to)?;
    }
    // The last step (stages - 1) wrote u if it is even, v if odd.
    Ok(if stages % 2 == 1 { uo } else { vo })
}

/// Pushes `stages` dependent blends u ← α u + β c (see [`dependent_steps`]).
fn push_blends<'p>(
    p: &mut pptm::Pipeline<'p>,
    stages: usize,
    (x, c, u, v): (
        &'p pptm::Buffer<f32>,
        &'p pptm::Buffer<f32>,
        &'p mut pptm::Buffer<f32>,
        &'p mut pptm::Buffer<f32>,
    ),
) -> pptm::Result<pptm::PipeOutput> {
    use crate::own_ops::Blend;
    let ci = p.input(c);
    push_steps(p, stages, x, (u, v), |p, from, to| {
        Blend::push(p, from, ci, DEP_ALPHA, DEP_BETA, to).map(|_| ())
    })
}

const DEP_ALPHA: f32 = 0.5;
const DEP_BETA: f32 = 0.25;

/// `stages` dependent steps u ← α u + β c over 4096 elements (u and v taking turns, the first
/// step reading x), run as `how` says (src/own_ops.rs, `Blend`).
fn dependent_steps(how: Steps, size: &'static str, stages: usize) -> Case {
    use crate::own_ops::Blend;
    const N: usize = 4096;
    const ALPHA: f32 = DEP_ALPHA;
    const BETA: f32 = DEP_BETA;
    Case {
        chain: match how {
            Steps::Waited => "dependent_steps_waited",
            Steps::Pipeline => "dependent_steps_pipeline",
            Steps::Kept => "dependent_steps_kept",
            Steps::Fused => "dependent_steps_fused",
        },
        domain: Blend::DOMAIN.name,
        size,
        shape: format!("{stages} steps of n = {N}"),
        x: stages as f64,
        bytes: 12.0 * (N * stages) as f64,
        flops: 3.0 * (N * stages) as f64,
        prepare: Box::new(move |rt| {
            let (x, c) = (
                rt.upload(&uniform(seed::RES_X, N))?,
                rt.upload(&uniform(seed::RES_Y, N))?,
            );
            let (mut u, mut v) = (rt.alloc::<f32>(N)?, rt.alloc::<f32>(N)?);
            if how == Steps::Kept {
                // The kept pipeline borrows its buffers for as long as the runner lives, and the
                // runner owns the pipeline: the buffers are leaked (four of 16 KB per size and
                // runtime, for the benchmark's life) to outlive both.
                let (x, c) = (&*Box::leak(Box::new(x)), &*Box::leak(Box::new(c)));
                let (u, v) = (Box::leak(Box::new(u)), Box::leak(Box::new(v)));
                let mut p = rt.pipeline();
                let last = push_blends(&mut p, stages, (x, c, u, v))?;
                let (_, mut kept) = p.wait_and_keep()?;
                return Ok(Box::new(move |read| {
                    kept.run()?;
                    vector(None, kept.buffer(last)?, read)
                }));
            }
            Ok(Box::new(move |read| {
                if how == Steps::Fused {
                    use crate::own_ops::{Blend8, Blend32, Blend170};
                    match stages {
                        8 => Blend8::submit(rt, &x, &c, ALPHA, BETA, &mut v)?.wait()?,
                        32 => Blend32::submit(rt, &x, &c, ALPHA, BETA, &mut v)?.wait()?,
                        170 => Blend170::submit(rt, &x, &c, ALPHA, BETA, &mut v)?.wait()?,
                        _ => unreachable!("a fused chain is declared for 8, 32 and 170 steps"),
                    }
                    return vector(None, &v, read);
                }
                if how == Steps::Pipeline {
                    let mut p = rt.pipeline();
                    push_blends(&mut p, stages, (&x, &c, &mut u, &mut v))?;
                    p.wait()?;
                } else {
                    for k in 0..stages {
                        match k {
                            0 => Blend::submit(rt, &x, &c, ALPHA, BETA, &mut u)?.wait()?,
                            k if k % 2 == 0 => {
                                Blend::submit(rt, &v, &c, ALPHA, BETA, &mut u)?.wait()?
                            }
                            _ => Blend::submit(rt, &u, &c, ALPHA, BETA, &mut v)?.wait()?,
                        }
                    }
                }
                // The last step (stages - 1) wrote u if it is even, v if odd.
                let last = if stages % 2 == 1 { &u } else { &v };
                vector(None, last, read)
            }))
        }),
        expect: Box::new(move || {
            let (a, b) = (f64::from(ALPHA), f64::from(BETA));
            let c = uniform(seed::RES_Y, N);
            let mut w: Vec<f64> = uniform(seed::RES_X, N)
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            for _ in 0..stages {
                for (w, &c) in w.iter_mut().zip(&c) {
                    *w = a * *w + b * f64::from(c);
                }
            }
            let at = sample_indices(N)
                .into_iter()
                .map(|i| (i, w[i], w[i].abs().max(1.0)))
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// The side of the dependent GEMVs' matrix.
const GEMV_STEP_N: usize = 256;

/// The dependent GEMVs' matrix: uniform (0, 1] over 128 (exact in f32, and in peers.py), so that
/// its Perron root is about 1 and 170 products neither overflow nor vanish (all positive: no
/// cancellation to lose the f64 reference's digits in).
fn gemv_step_matrix() -> Vec<f32> {
    uniform(seed::GEMV_A, GEMV_STEP_N * GEMV_STEP_N)
        .into_iter()
        .map(|v| v / 128.0)
        .collect()
}

/// `stages` dependent products u ← A u, A 256 x 256 (u and v taking turns, the first step
/// reading x), run as `how` says (src/own_ops.rs, `GemvStep`). No fused form: a GEMV reads the
/// whole of the vector the step before wrote.
fn dependent_gemv(how: Steps, size: &'static str, stages: usize) -> Case {
    use crate::own_ops::GemvStep;
    const N: usize = GEMV_STEP_N;
    Case {
        chain: match how {
            Steps::Waited => "dependent_gemv_waited",
            Steps::Pipeline => "dependent_gemv_pipeline",
            Steps::Kept => "dependent_gemv_kept",
            Steps::Fused => unreachable!("dependent GEMVs have no fused form"),
        },
        domain: GemvStep::DOMAIN.name,
        size,
        shape: format!("{stages} steps of {N} x {N}"),
        x: stages as f64,
        bytes: 4.0 * ((N * N + 2 * N) * stages) as f64,
        flops: 2.0 * (N * N * stages) as f64,
        prepare: Box::new(move |rt| {
            let (x, a) = (
                rt.upload(&uniform(seed::GEMV_X, N))?,
                rt.upload(&gemv_step_matrix())?,
            );
            let (mut u, mut v) = (rt.alloc::<f32>(N)?, rt.alloc::<f32>(N)?);
            if how == Steps::Kept {
                // Leaked for the benchmark's life, as dependent_steps's kept buffers.
                let (x, a) = (&*Box::leak(Box::new(x)), &*Box::leak(Box::new(a)));
                let (u, v) = (Box::leak(Box::new(u)), Box::leak(Box::new(v)));
                let mut p = rt.pipeline();
                let ai = p.input(a);
                let last = push_steps(&mut p, stages, x, (u, v), |p, from, to| {
                    GemvStep::push(p, from, ai, to).map(|_| ())
                })?;
                let (_, mut kept) = p.wait_and_keep()?;
                return Ok(Box::new(move |read| {
                    kept.run()?;
                    vector(None, kept.buffer(last)?, read)
                }));
            }
            Ok(Box::new(move |read| {
                if how == Steps::Pipeline {
                    let mut p = rt.pipeline();
                    let ai = p.input(&a);
                    push_steps(&mut p, stages, &x, (&mut u, &mut v), |p, from, to| {
                        GemvStep::push(p, from, ai, to).map(|_| ())
                    })?;
                    p.wait()?;
                } else {
                    for k in 0..stages {
                        match k {
                            0 => GemvStep::submit(rt, &x, &a, &mut u)?.wait()?,
                            k if k % 2 == 0 => GemvStep::submit(rt, &v, &a, &mut u)?.wait()?,
                            _ => GemvStep::submit(rt, &u, &a, &mut v)?.wait()?,
                        }
                    }
                }
                let last = if stages % 2 == 1 { &u } else { &v };
                vector(None, last, read)
            }))
        }),
        expect: Box::new(move || {
            let a: Vec<f64> = gemv_step_matrix().iter().map(|&v| f64::from(v)).collect();
            let mut w: Vec<f64> = uniform(seed::GEMV_X, N)
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            for _ in 0..stages {
                w = (0..N)
                    .map(|i| (0..N).map(|j| a[i * N + j] * w[j]).sum())
                    .collect();
            }
            let top = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let at = sample_indices(N)
                .into_iter()
                .map(|i| (i, w[i], top))
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// Σⱼ (α xᵢⱼ + β yᵢⱼ)² of each row of rows × cols matrices (src/own_ops.rs).
fn row_squared_residual(size: &'static str, rows: usize, cols: usize) -> Case {
    use crate::own_ops::RowSquaredResidual;
    const ALPHA: f32 = 1.0;
    const BETA: f32 = -0.5;
    let n = rows * cols;
    Case {
        chain: "row_squared_residual",
        domain: RowSquaredResidual::DOMAIN.name,
        size,
        shape: format!("{rows} x {cols}"),
        x: n as f64,
        bytes: 8.0 * n as f64 + 4.0 * rows as f64,
        flops: 5.0 * n as f64,
        prepare: Box::new(move |rt| {
            let (x, y) = (
                rt.upload(&uniform(seed::RES_X, n))?,
                rt.upload(&uniform(seed::RES_Y, n))?,
            );
            let mut out = rt.alloc::<f32>(rows)?;
            Ok(Box::new(move |read| {
                let t = RowSquaredResidual::submit(rt, &x, &y, ALPHA, BETA, &mut out, cols)?
                    .wait_timed()?;
                vector(t.device, &out, read)
            }))
        }),
        expect: Box::new(move || {
            let (x, y) = (uniform(seed::RES_X, n), uniform(seed::RES_Y, n));
            let at = sample_indices(rows)
                .into_iter()
                .map(|r| {
                    let v: f64 = (r * cols..(r + 1) * cols)
                        .map(|e| {
                            (f64::from(ALPHA) * f64::from(x[e]) + f64::from(BETA) * f64::from(y[e]))
                                .powi(2)
                        })
                        .sum();
                    (r, v, v)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

fn accuracy_pipeline(size: &'static str, n: usize) -> Case {
    Case {
        chain: "accuracy_pipeline",
        domain: AccuracyPipeline::DOMAIN.name,
        size,
        shape: format!("n = {n}"),
        x: n as f64,
        bytes: 12.0 * n as f64,
        flops: 4.0 * n as f64,
        prepare: Box::new(move |rt| {
            let (o, p, w) = (
                rt.upload(&uniform(seed::ACC_OBS, n))?,
                rt.upload(&uniform(seed::ACC_PRED, n))?,
                rt.upload(&uniform(seed::ACC_PREC, n))?,
            );
            Ok(Box::new(move |read| {
                Ok(scalar(
                    AccuracyPipeline::submit(rt, &o, &p, &w)?.wait_timed()?,
                    read,
                ))
            }))
        }),
        expect: Box::new(move || {
            let (o, p, w) = (
                uniform(seed::ACC_OBS, n),
                uniform(seed::ACC_PRED, n),
                uniform(seed::ACC_PREC, n),
            );
            let value: f64 = (0..n)
                .map(|i| {
                    let e = f64::from(o[i]) - f64::from(p[i]);
                    -0.5 * f64::from(w[i]) * e * e
                })
                .sum();
            Expect::Scalar {
                value,
                scale: value.abs(),
            }
        }),
    }
}

/// belief_update with m = n: mu + lr · Jᵀ (prec ⊙ (obs − pred)), J m×n, stored in f32 or (its
/// values rounded) bf16.
fn belief_update(storage: Storage, size: &'static str, n: usize) -> Case {
    let m = n;
    let (chain, domain, j_bytes, note) = match storage {
        Storage::F32 => ("belief_update", BeliefUpdateStep::DOMAIN.name, 4.0, ""),
        Storage::Bf16 => (
            "belief_update_bf16",
            BeliefUpdateStepBf16::DOMAIN.name,
            2.0,
            ", J bf16",
        ),
        Storage::Fp8 | Storage::F16 => unreachable!("no belief_update chain stores J so"),
    };
    Case {
        chain,
        domain,
        size,
        shape: format!("m = n = {n}{note}"),
        x: n as f64,
        bytes: j_bytes * (m * n) as f64 + 4.0 * (3 * m + 2 * n) as f64,
        flops: 2.0 * (m * n) as f64 + 4.0 * m as f64,
        prepare: Box::new(move |rt| {
            let (o, p, w, mu) = (
                rt.upload(&uniform(seed::BEL_OBS, m))?,
                rt.upload(&uniform(seed::BEL_PRED, m))?,
                rt.upload(&uniform(seed::BEL_PREC, m))?,
                rt.upload(&uniform(seed::BEL_MU, n))?,
            );
            let mut out = rt.alloc::<f32>(n)?;
            let j32 = uniform(seed::BEL_J, m * n);
            let run: Runner<'_> = match storage {
                Storage::Bf16 => {
                    let j: Vec<pptm::bf16> = j32.into_iter().map(pptm::bf16::from_f32).collect();
                    let j = rt.upload(&j)?;
                    Box::new(move |read| {
                        let t = BeliefUpdateStepBf16::submit(
                            rt, &o, &p, &w, &j, &mu, BELIEF_LR, &mut out,
                        )?
                        .wait_timed()?;
                        vector(t.device, &out, read)
                    })
                }
                _ => {
                    let j = rt.upload(&j32)?;
                    Box::new(move |read| {
                        let t =
                            BeliefUpdateStep::submit(rt, &o, &p, &w, &j, &mu, BELIEF_LR, &mut out)?
                                .wait_timed()?;
                        vector(t.device, &out, read)
                    })
                }
            };
            Ok(run)
        }),
        expect: Box::new(move || {
            let (o, p, w, mu) = (
                uniform(seed::BEL_OBS, m),
                uniform(seed::BEL_PRED, m),
                uniform(seed::BEL_PREC, m),
                uniform(seed::BEL_MU, n),
            );
            // J's values as the chain stores them.
            let j: Vec<f64> = uniform(seed::BEL_J, m * n)
                .into_iter()
                .map(|v| match storage {
                    Storage::Bf16 => pptm::bf16::from_f32(v).to_f64(),
                    _ => f64::from(v),
                })
                .collect();
            let g: Vec<f64> = (0..m)
                .map(|i| f64::from(w[i]) * (f64::from(o[i]) - f64::from(p[i])))
                .collect();
            let lr = f64::from(BELIEF_LR);
            let at = sample_indices(n)
                .into_iter()
                .map(|c| {
                    let (mut s, mut a) = (0.0, 0.0);
                    for (i, gi) in g.iter().enumerate() {
                        let t = j[i * n + c] * gi;
                        s += t;
                        a += t.abs();
                    }
                    let base = f64::from(mu[c]);
                    (c, base + lr * s, base.abs() + lr * a)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// Chebyshev distance between points i and j of x (n × d), in f32 as the chain promises.
fn cheb(x: &[f32], d: usize, i: usize, j: usize) -> f32 {
    (0..d)
        .map(|c| (x[i * d + c] - x[j * d + c]).abs())
        .fold(0.0, f32::max)
}

fn distance_kth(size: &'static str, n: usize) -> Case {
    let d = KTH_D;
    Case {
        chain: "distance_kth",
        domain: DistanceKth::DOMAIN.name,
        size,
        shape: format!("n = {n}, d = {d}, k = {KTH_K}"),
        x: n as f64,
        bytes: 4.0 * (n * d + n) as f64,
        // Per ordered pair and coordinate: a difference, an absolute value, a max.
        flops: 3.0 * (n * (n - 1) * d) as f64,
        prepare: Box::new(move |rt| {
            let x = rt.upload(&uniform(seed::DIST_X, n * d))?;
            let mut out = rt.alloc::<f32>(n)?;
            Ok(Box::new(move |read| {
                let t = DistanceKth::submit(rt, &x, KTH_K, &mut out, d)?.wait_timed()?;
                vector(t.device, &out, read)
            }))
        }),
        expect: Box::new(move || {
            let x = uniform(seed::DIST_X, n * d);
            let at = sample_indices(n)
                .into_iter()
                .map(|i| {
                    let mut row: Vec<f32> = (0..n)
                        .filter(|&j| j != i)
                        .map(|j| cheb(&x, d, i, j))
                        .collect();
                    row.sort_unstable_by(f32::total_cmp);
                    let v = f64::from(row[KTH_K as usize - 1]);
                    (i, v, v)
                })
                .collect();
            Expect::Elements { at, exact: true }
        }),
    }
}

/// te_reduction with one coordinate per subspace: ψ(k) + mean(ψ(n_z+1) − ψ(n_xz+1) − ψ(n_yz+1)).
fn te_reduction(size: &'static str, n: usize) -> Case {
    let inputs = move || {
        let eps: Vec<f32> = uniform(seed::TE_EPS, n)
            .into_iter()
            .map(|e| e * TE_EPS_SCALE)
            .collect();
        (
            uniform(seed::TE_X, n),
            uniform(seed::TE_Y, n),
            uniform(seed::TE_Z, n),
            eps,
        )
    };
    Case {
        chain: "te_reduction",
        domain: TeReduction::DOMAIN.name,
        size,
        shape: format!("n = {n}, d = 1 each, k = {TE_K}"),
        x: n as f64,
        bytes: 16.0 * n as f64,
        // Per ordered pair: three differences and absolute values, two maxima, three compares.
        flops: 11.0 * (n * (n - 1)) as f64,
        prepare: Box::new(move |rt| {
            let (x, y, z, eps) = inputs();
            let (x, y, z, eps) = (
                rt.upload(&x)?,
                rt.upload(&y)?,
                rt.upload(&z)?,
                rt.upload(&eps)?,
            );
            Ok(Box::new(move |read| {
                Ok(scalar(
                    TeReduction::submit(rt, &x, &y, &z, &eps, TE_K, 1, 1, 1)?.wait_timed()?,
                    read,
                ))
            }))
        }),
        expect: Box::new(move || {
            let (x, y, z, eps) = inputs();
            let (mut sum, mut abs) = (0.0, 0.0);
            for i in 0..n {
                let e = eps[i];
                let (mut nxz, mut nyz, mut nz) = (0u32, 0u32, 0u32);
                for j in (0..n).filter(|&j| j != i) {
                    let (dx, dy, dz) = (
                        (x[i] - x[j]).abs(),
                        (y[i] - y[j]).abs(),
                        (z[i] - z[j]).abs(),
                    );
                    nxz += u32::from(dx.max(dz) < e);
                    nyz += u32::from(dy.max(dz) < e);
                    nz += u32::from(dz < e);
                }
                let term = digamma(f64::from(nz) + 1.0)
                    - digamma(f64::from(nxz) + 1.0)
                    - digamma(f64::from(nyz) + 1.0);
                sum += term;
                abs += term.abs();
            }
            let psi_k = digamma(f64::from(TE_K));
            Expect::Scalar {
                value: psi_k + sum / n as f64,
                scale: psi_k.abs() + abs / n as f64,
            }
        }),
    }
}

/// How a GEMV case stores its matrix.
#[derive(Clone, Copy)]
enum Storage {
    F32,
    Bf16,
    Fp8,
    F16,
}

/// gemv_axpby_sum with m = n: z = αAx + βy, Σz²; A stored in f32 (CUDA cores), or its values
/// rounded to bf16 or fp8 (E4M3) and multiplied on tensor cores by the f32 x, or rounded to fp16
/// and widened to f32 on CUDA cores.
fn gemv_axpby_sum(storage: Storage, size: &'static str, n: usize) -> Case {
    let m = n;
    let a32 = move || uniform(seed::GEMV_A, m * n);
    let (chain, domain, a_bytes, note) = match storage {
        Storage::F32 => ("gemv_axpby_sum", GemvAxpbySum::DOMAIN.name, 4.0, ""),
        Storage::Bf16 => (
            "gemv_axpby_sum_bf16",
            GemvAxpbySumBf16::DOMAIN.name,
            2.0,
            ", A bf16",
        ),
        Storage::Fp8 => (
            "gemv_axpby_sum_fp8",
            GemvAxpbySumFp8::DOMAIN.name,
            1.0,
            ", A fp8",
        ),
        Storage::F16 => (
            "gemv_axpby_sum_fp16",
            GemvAxpbySumFp16::DOMAIN.name,
            2.0,
            ", A fp16 (CUDA cores)",
        ),
    };
    Case {
        chain,
        domain,
        size,
        shape: format!("m = n = {n}{note}"),
        x: n as f64,
        bytes: a_bytes * (m * n) as f64 + 4.0 * (m + n) as f64,
        flops: 2.0 * (m * n) as f64 + 5.0 * m as f64,
        prepare: Box::new(move |rt| {
            let (x, y) = (
                rt.upload(&uniform(seed::GEMV_X, n))?,
                rt.upload(&uniform(seed::GEMV_Y, m))?,
            );
            let (alpha, beta) = (GEMV_ALPHA, GEMV_BETA);
            let run: Box<dyn Fn(bool) -> pptm::Result<Sample> + '_> = match storage {
                Storage::F32 => {
                    let a = rt.upload(&a32())?;
                    Box::new(move |read| {
                        let t = GemvAxpbySum::submit(rt, &x, &a, &y, alpha, beta)?;
                        Ok(scalar(t.wait_timed()?, read))
                    })
                }
                Storage::Bf16 => {
                    let a: Vec<pptm::bf16> = a32().into_iter().map(pptm::bf16::from_f32).collect();
                    let a = rt.upload(&a)?;
                    Box::new(move |read| {
                        let t = GemvAxpbySumBf16::submit(rt, &x, &a, &y, alpha, beta)?;
                        Ok(scalar(t.wait_timed()?, read))
                    })
                }
                Storage::Fp8 => {
                    let a: Vec<pptm::F8E4M3> =
                        a32().into_iter().map(pptm::F8E4M3::from_f32).collect();
                    let a = rt.upload(&a)?;
                    Box::new(move |read| {
                        let t = GemvAxpbySumFp8::submit(rt, &x, &a, &y, alpha, beta)?;
                        Ok(scalar(t.wait_timed()?, read))
                    })
                }
                Storage::F16 => {
                    let a: Vec<pptm::f16> = a32().into_iter().map(pptm::f16::from_f32).collect();
                    let a = rt.upload(&a)?;
                    Box::new(move |read| {
                        let t = GemvAxpbySumFp16::submit(rt, &x, &a, &y, alpha, beta)?;
                        Ok(scalar(t.wait_timed()?, read))
                    })
                }
            };
            Ok(run)
        }),
        expect: Box::new(move || {
            let (x, y) = (uniform(seed::GEMV_X, n), uniform(seed::GEMV_Y, m));
            // A's values as the chain stores them.
            let a: Vec<f64> = a32()
                .into_iter()
                .map(|v| match storage {
                    Storage::F32 => f64::from(v),
                    Storage::Bf16 => pptm::bf16::from_f32(v).to_f64(),
                    Storage::Fp8 => pptm::F8E4M3::from_f32(v).to_f64(),
                    Storage::F16 => pptm::f16::from_f32(v).to_f64(),
                })
                .collect();
            let value: f64 = (0..m)
                .map(|i| {
                    let row = &a[i * n..(i + 1) * n];
                    let ax: f64 = row.iter().zip(&x).map(|(&a, &x)| a * f64::from(x)).sum();
                    let z = f64::from(GEMV_ALPHA) * ax + f64::from(GEMV_BETA) * f64::from(y[i]);
                    z * z
                })
                .sum();
            Expect::Scalar {
                value,
                scale: value,
            }
        }),
    }
}

/// matmul_bias_gelu in f32: gelu(A W + b), A m×k, W k×n, exact (erf) GELU. On CUDA cores
/// (MatmulBiasGelu), or with `bf16x3` on tensor cores at f32's accuracy (MatmulBiasGeluBf16x3,
/// chain `matmul_bias_gelu_bf16x3`): the same f32 inputs and check.
fn matmul_bias_gelu(bf16x3: bool, size: &'static str, m: usize, k: usize, n: usize) -> Case {
    let (chain, domain) = if bf16x3 {
        ("matmul_bias_gelu_bf16x3", MatmulBiasGeluBf16x3::DOMAIN.name)
    } else {
        ("matmul_bias_gelu", MatmulBiasGelu::DOMAIN.name)
    };
    Case {
        chain,
        domain,
        size,
        shape: format!("{m}×{k}×{n} f32"),
        x: m as f64,
        bytes: 4.0 * (m * k + k * n + n + m * n) as f64,
        flops: 2.0 * (m * k * n) as f64,
        prepare: Box::new(move |rt| {
            let (a, w, b) = (
                rt.upload(&uniform(seed::MM_A, m * k))?,
                rt.upload(&uniform(seed::MM_W, k * n))?,
                rt.upload(&uniform(seed::MM_B, n))?,
            );
            let mut out = rt.alloc::<f32>(m * n)?;
            Ok(Box::new(move |read| {
                let t = if bf16x3 {
                    MatmulBiasGeluBf16x3::submit(rt, &a, &w, &b, &mut out, m, k)?.wait_timed()?
                } else {
                    MatmulBiasGelu::submit(rt, &a, &w, &b, &mut out, m, k)?.wait_timed()?
                };
                vector(t.device, &out, read)
            }))
        }),
        expect: Box::new(move || {
            let (a, w, b) = (
                uniform(seed::MM_A, m * k),
                uniform(seed::MM_W, k * n),
                uniform(seed::MM_B, n),
            );
            let at = sample_indices(m * n)
                .into_iter()
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    let (mut s, mut abs) = (f64::from(b[j]), f64::from(b[j]).abs());
                    for p in 0..k {
                        let t = f64::from(a[i * k + p]) * f64::from(w[p * n + j]);
                        s += t;
                        abs += t.abs();
                    }
                    let gelu = 0.5 * s * (1.0 + libm::erf(s / std::f64::consts::SQRT_2));
                    (e, gelu, abs)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// The bf16 operands of matmul_bias_gelu_bf16 (also cuBLAS's, bench/src/cublas.rs): stream
/// `seed` centred on 0 and rounded to bf16; the bias stays f32.
pub fn centred_bf16(seed: u64, n: usize) -> Vec<pptm::bf16> {
    uniform(seed, n)
        .into_iter()
        .map(|u| pptm::bf16::from_f32(u - 0.5))
        .collect()
}

pub fn centred(seed: u64, n: usize) -> Vec<f32> {
    uniform(seed, n).into_iter().map(|u| u - 0.5).collect()
}

/// `batch` products A[s] W[s] of m×k and k×n bf16 matrices, stacked: "m×k×n bf16", or
/// "batch × m×k×n bf16".
pub fn matmul_shape(batch: usize, m: usize, k: usize, n: usize) -> String {
    if batch == 1 {
        format!("{m}×{k}×{n} bf16")
    } else {
        format!("{batch} × {m}×{k}×{n} bf16")
    }
}

/// gelu(A W + b) on tensor cores: A (m×k) and W (k×n) bf16, f32 accumulation, bias and f32
/// output. `batched`: gelu(A[s] W[s] + b) for `batch` such products stacked (a bias shared by
/// all), by BatchedMatmulBiasGeluBf16, whose tiles of every product spread over the GPU together;
/// otherwise one product (batch 1) by MatmulBiasGeluBf16.
fn matmul_bias_gelu_bf16(
    batched: bool,
    size: &'static str,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
) -> Case {
    let (chain, domain) = if batched {
        (
            "batched_matmul_bias_gelu_bf16",
            BatchedMatmulBiasGeluBf16::DOMAIN.name,
        )
    } else {
        assert_eq!(batch, 1, "one product is a batch of 1");
        ("matmul_bias_gelu_bf16", MatmulBiasGeluBf16::DOMAIN.name)
    };
    Case {
        chain,
        domain,
        size,
        shape: matmul_shape(batch, m, k, n),
        x: (batch * m) as f64,
        bytes: (2 * batch * (m * k + k * n) + 4 * (n + batch * m * n)) as f64,
        flops: 2.0 * (batch * m * k * n) as f64,
        prepare: Box::new(move |rt| {
            let (a, w, b) = (
                rt.upload(&centred_bf16(seed::MM16_A, batch * m * k))?,
                rt.upload(&centred_bf16(seed::MM16_W, batch * k * n))?,
                rt.upload(&centred(seed::MM16_B, n))?,
            );
            let mut out = rt.alloc::<f32>(batch * m * n)?;
            Ok(Box::new(move |read| {
                let t = if batched {
                    BatchedMatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, batch, m, k)?
                        .wait_timed()?
                } else {
                    MatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, m, k)?.wait_timed()?
                };
                vector(t.device, &out, read)
            }))
        }),
        expect: Box::new(move || {
            let (a, w, b) = (
                centred_bf16(seed::MM16_A, batch * m * k),
                centred_bf16(seed::MM16_W, batch * k * n),
                centred(seed::MM16_B, n),
            );
            let at = sample_indices(batch * m * n)
                .into_iter()
                .map(|e| {
                    // Element e is row e / n of the stacked output: product e / n / m.
                    let (i, j) = (e / n, e % n);
                    let (s, abs) = bf16_dot_bias(&a, &w, &b, k, n, i, j, i / m * k);
                    let gelu = 0.5 * s * (1.0 + libm::erf(s / std::f64::consts::SQRT_2));
                    (e, gelu, abs)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// (A W)[i, j] + b[j] in f64 from bf16 operands, and the magnitude of its terms; W's rows start
/// at row `w0` (a batched product's W in the stack; 0 for one product).
#[allow(
    clippy::too_many_arguments,
    reason = "the operands, their shape and the element"
)]
pub fn bf16_dot_bias(
    a: &[pptm::bf16],
    w: &[pptm::bf16],
    b: &[f32],
    k: usize,
    n: usize,
    i: usize,
    j: usize,
    w0: usize,
) -> (f64, f64) {
    dot_bias(a, w, b, (k, n), (i, j), w0, |v| v.to_f64())
}

/// [`bf16_dot_bias`] for operands of any storage, widened by `wide`.
fn dot_bias<T: Copy>(
    a: &[T],
    w: &[T],
    b: &[f32],
    (k, n): (usize, usize),
    (i, j): (usize, usize),
    w0: usize,
    wide: impl Fn(T) -> f64,
) -> (f64, f64) {
    let (mut s, mut abs) = (f64::from(b[j]), f64::from(b[j]).abs());
    for p in 0..k {
        let t = wide(a[i * k + p]) * wide(w[(w0 + p) * n + j]);
        s += t;
        abs += t.abs();
    }
    (s, abs)
}

/// The fp8 operands of matmul_bias_gelu_fp8: stream `seed` centred on 0 and rounded to E4M3.
fn centred_fp8(seed: u64, n: usize) -> Vec<pptm::F8E4M3> {
    uniform(seed, n)
        .into_iter()
        .map(|u| pptm::F8E4M3::from_f32(u - 0.5))
        .collect()
}

/// gelu(A W + b) with A (m×k) and W (k×n) stored in fp8 (E4M3), widened to fp16 for the tensor
/// cores (MatmulBiasGeluFp8): the same shapes as matmul_bias_gelu_bf16, a quarter of the f32
/// operand bytes.
fn matmul_bias_gelu_fp8(size: &'static str, m: usize, k: usize, n: usize) -> Case {
    Case {
        chain: "matmul_bias_gelu_fp8",
        domain: MatmulBiasGeluFp8::DOMAIN.name,
        size,
        shape: format!("{m}×{k}×{n} fp8"),
        x: m as f64,
        bytes: ((m * k + k * n) + 4 * (n + m * n)) as f64,
        flops: 2.0 * (m * k * n) as f64,
        prepare: Box::new(move |rt| {
            let (a, w, b) = (
                rt.upload(&centred_fp8(seed::MM16_A, m * k))?,
                rt.upload(&centred_fp8(seed::MM16_W, k * n))?,
                rt.upload(&centred(seed::MM16_B, n))?,
            );
            let mut out = rt.alloc::<f32>(m * n)?;
            Ok(Box::new(move |read| {
                let t = MatmulBiasGeluFp8::submit(rt, &a, &w, &b, &mut out, m, k)?.wait_timed()?;
                vector(t.device, &out, read)
            }))
        }),
        expect: Box::new(move || {
            let (a, w, b) = (
                centred_fp8(seed::MM16_A, m * k),
                centred_fp8(seed::MM16_W, k * n),
                centred(seed::MM16_B, n),
            );
            let at = sample_indices(m * n)
                .into_iter()
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    let (s, abs) = dot_bias(&a, &w, &b, (k, n), (i, j), 0, |v| v.to_f64());
                    let gelu = 0.5 * s * (1.0 + libm::erf(s / std::f64::consts::SQRT_2));
                    (e, gelu, abs)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// The geodesics example's system (examples/geodesics/system.rs, shared with the example): every
/// geodesic's end state (c, v, A) after `steps` RK4 steps over t in [0, 1], one submission.
/// The reference is the CPU backend, which runs the op's f64 function.
fn geodesics(size: &'static str, steps: usize) -> Case {
    use crate::geodesic_system::{COLS, Geo, Geodesics100, Geodesics1000, ROWS, problem};
    use pptm::State;
    let n = problem().start.len();
    let geodesic_steps = (n * steps) as f64;
    Case {
        chain: "geodesics",
        domain: Geodesics1000::DOMAIN.name,
        size,
        shape: format!("{n} geodesics x {steps} steps, Γ {ROWS} x {COLS}"),
        x: steps as f64,
        // The states in and out, each geodesic's column and α, and Γ once; four Γ lookups a step
        // of four values each come from L1/L2, not counted.
        bytes: (n * (3 * 4 * 2 + 8) + ROWS * COLS * 4) as f64,
        // About 120 flops a step (four stages: a bilinear lookup, tanh, the updates).
        flops: 120.0 * geodesic_steps,
        prepare: Box::new(move |rt| {
            let p = problem();
            let (start, col, alpha, gamma) = (
                rt.upload(&Geo::flatten(&p.start))?,
                rt.upload(&p.col)?,
                rt.upload(&p.alpha)?,
                rt.upload(&p.gamma)?,
            );
            let mut end = rt.upload(&vec![f32::NAN; 3 * n])?;
            let dt = 1.0 / steps as f32;
            Ok(Box::new(move |read| {
                let (s, c, a, g) = (&start, &col, &alpha, &gamma);
                let timed = match steps {
                    100 => Geodesics100::submit(rt, s, c, a, g, dt, &mut end, ROWS, COLS)?
                        .wait_timed()?,
                    _ => Geodesics1000::submit(rt, s, c, a, g, dt, &mut end, ROWS, COLS)?
                        .wait_timed()?,
                };
                vector(timed.device, &end, read)
            }))
        }),
        expect: Box::new(move || {
            let p = problem();
            let want = crate::geodesic_system::end_states(&Runtime::cpu(), &p, steps)
                .expect("the CPU backend integrates the reference");
            // Each value against its geodesic's largest field, as the example measures.
            let at = sample_indices(3 * want.len())
                .into_iter()
                .map(|i| {
                    let g = &want[i / 3];
                    let scale = g.c.abs().max(g.v.abs()).max(g.a.abs()).max(1e-6);
                    (i, [g.c, g.v, g.a][i % 3], scale)
                })
                .collect();
            Expect::Elements { at, exact: false }
        }),
    }
}

/// The case `md`'s sizes, named by their atoms (bench/peers_md.py names its rows alike).
pub const MD_SIZES: [(&str, usize); 5] = [
    ("10 atoms", 10),
    ("50 atoms", 50),
    ("100 atoms", 100),
    ("1000 atoms", 1000),
    ("10000 atoms", 10000),
];

/// Steps of one timed run of the case `md`.
pub const MD_STEPS: usize = 100;

/// The molecular-dynamics example's system (examples/md/system.rs, shared with it): `MD_STEPS`
/// velocity Verlet steps of `atoms` atoms from the start state, one pipeline (one submission on
/// the GPU; the run also evaluates the forces at its start and end). The check is the total
/// energy at the end against the start's, which the f64 CPU backend evaluates: the run conserves
/// it (examples/md.rs measures the drift over 1000 steps), and a wrong force would not.
fn md(size: &'static str, atoms: usize) -> Case {
    use crate::md_system::{FILTER_POINTS, Md, Model, VerletStep, list_columns, start};
    const WIDTH: usize = 64;
    let slots = list_columns(&start(atoms));
    let (n, f, m) = (atoms as f64, WIDTH as f64, slots as f64);
    Case {
        chain: "md",
        domain: VerletStep::DOMAIN.name,
        size,
        shape: format!("{atoms} atoms x {MD_STEPS} steps, width {WIDTH}, a list of {slots}"),
        x: atoms as f64,
        // The state in and out and the filter tables once (the rest stays in L2).
        bytes: n * 6.0 * 4.0 * 2.0 + 3.0 * FILTER_POINTS as f64 * 2.0 * f * 4.0,
        // A step: 19 dense layers of n x F x F (forward, backward), and six convolutions over
        // n x M edges of F features, about 12 flops a feature-edge.
        flops: MD_STEPS as f64 * (19.0 * 2.0 * n * f * f + 6.0 * 12.0 * n * m * f),
        prepare: Box::new(move |rt| {
            let a = start(atoms);
            let mut md = Md::new(rt, &Model::new(WIDTH), &a, slots, FILTER_POINTS)?;
            Ok(Box::new(move |read| {
                let end = md.run(rt, MD_STEPS)?;
                Ok(Sample {
                    device: None,
                    got: read.then_some(Got::Scalar(end.potential + end.kinetic)),
                })
            }))
        }),
        expect: Box::new(move || {
            let cpu = Runtime::cpu();
            let a = start(atoms);
            let (_, at, _) = Md::new(&cpu, &Model::new(WIDTH), &a, slots, FILTER_POINTS)
                .and_then(|mut md| md.evaluate(&cpu))
                .expect("the CPU backend evaluates the start state");
            Expect::Scalar {
                value: at.potential + at.kinetic,
                scale: at.kinetic,
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case `md` on the CPU backend passes its own check: a run of MD_STEPS steps ends at
    /// the start's total energy, within pptm-bench's bar.
    #[test]
    fn the_md_case_conserves_energy_on_the_cpu() {
        let case = md("small", 10);
        let want = (case.expect)();
        let rt = Runtime::cpu();
        let mut run = (case.prepare)(&rt).unwrap();
        let got = run(true).unwrap().got.unwrap();
        let err = check(&want, &got).unwrap();
        assert!(err < 1e-4, "{err:e}");
    }

    #[test]
    fn generator_is_counter_based_and_in_range() {
        let long = uniform(3, 1000);
        assert_eq!(&long[..10], &uniform(3, 10)[..]);
        assert!(long.iter().all(|&v| v > 0.0 && v <= 1.0));
        assert_ne!(uniform(3, 10), uniform(4, 10));
        // The first values of stream 1: bench/peers.py checks it reproduces these same bits.
        let bits: Vec<u32> = uniform(1, 3).iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, [1054667070, 1061088142, 1061144647]);
    }

    #[test]
    fn check_flags_wrong_results() {
        let want = Expect::Scalar {
            value: 2.0,
            scale: 2.0,
        };
        assert!(check(&want, &Got::Scalar(2.0)).unwrap() == 0.0);
        assert!(check(&want, &Got::Scalar(2.1)).unwrap() > 1e-2);
        assert!(check(&want, &Got::Scalar(f64::NAN)).is_err());
        let want = Expect::Elements {
            at: vec![(0, 1.0, 1.0), (2, 3.0, 3.0)],
            exact: true,
        };
        assert!(check(&want, &Got::Vector(vec![1.0, 9.0, 3.0])).unwrap() == 0.0);
        assert!(check(&want, &Got::Vector(vec![1.0, 9.0, 3.5])).is_err());
        assert!(check(&want, &Got::Vector(vec![1.0])).is_err());
    }

    #[test]
    fn every_case_has_a_reference_on_the_cpu_backend() {
        // The small cases, end to end on the CPU backend: inputs, submission, read-back, check.
        let rt = Runtime::cpu();
        for case in all().into_iter().filter(|c| c.size == "small") {
            let mut run = (case.prepare)(&rt).unwrap();
            let got = run(true).unwrap().got.unwrap();
            let err = check(&(case.expect)(), &got).unwrap();
            assert!(
                err < 1e-4,
                "{} {}: relative error {err}",
                case.chain,
                case.shape
            );
        }
    }
}

//! One step of active inference as one pipeline: 84 belief-update iterations (each a `Predict`
//! GEMV, pred = J mu, then a fused `BeliefUpdateStep`, mu ← mu + lr Jᵀ (prec ⊙ (obs − pred))),
//! then the accuracy of the last prediction and the KL complexity of the beliefs: 170 dependent
//! stages over two domains, pushed without waiting and resolved by one wait (docs/pipelines.md).
//! Run at 256 x 256 and 4096 x 4096, checked against the CPU backend, and timed against the same
//! stages waited one by one.
//!
//!     cargo run --release --example active_inference_step

use std::error::Error;

use pptm::chains::{AccuracyPipeline, BeliefUpdateStep, KlComplexity};
use pptm::ops::Gemv;
use pptm::timing::measure;
use pptm::{BackendKind, Buffer, FusionBuilder, Runtime};
use rand::Rng;

/// Predictions from beliefs: pred = J mu (J: m x n, argument `a`).
#[derive(FusionBuilder)]
#[fusion(domain = "active_inference_step")]
pub struct PredictStep {
    #[stage(1)]
    gemv: Gemv,
}

/// Belief-update iterations in one step: 2 stages each, plus the accuracy and the complexity.
const ITERATIONS: usize = 84;
const LEARNING_RATE: f32 = 0.5;

/// The model and data of one step, on the host.
struct Problem {
    m: usize,
    n: usize,
    jac: Vec<f32>,
    obs: Vec<f32>,
    prec: Vec<f32>,
    /// The prior the complexity is measured against (q is the softmax of the beliefs' magnitude,
    /// here a fixed positive vector, so the KL stage has work of its own).
    q: Vec<f32>,
    p: Vec<f32>,
}

impl Problem {
    fn new(m: usize, n: usize) -> Self {
        let mut rng = rand::rng();
        let scale = 1.0 / (m as f32).sqrt();
        let jac: Vec<f32> = (0..m * n)
            .map(|_| rng.random_range(-scale..scale))
            .collect();
        let truth: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let obs = (0..m)
            .map(|i| {
                let y: f32 = (0..n).map(|j| jac[i * n + j] * truth[j]).sum();
                y + 0.01 * rng.random_range(-1.0f32..1.0)
            })
            .collect();
        let q = (0..n).map(|_| rng.random_range(0.1f32..1.0)).collect();
        let p = (0..n).map(|_| rng.random_range(0.1f32..1.0)).collect();
        Problem {
            m,
            n,
            jac,
            obs,
            prec: vec![1.0; m],
            q,
            p,
        }
    }
}

/// The step's result: the final beliefs, the last prediction's accuracy, the complexity.
struct Step {
    mu: Vec<f32>,
    accuracy: f32,
    complexity: f32,
}

/// The problem's buffers on one runtime.
struct Buffers {
    jac: Buffer<f32>,
    obs: Buffer<f32>,
    prec: Buffer<f32>,
    q: Buffer<f32>,
    p: Buffer<f32>,
    mu0: Buffer<f32>,
    mu: [Buffer<f32>; 2],
    pred: Buffer<f32>,
}

impl Buffers {
    fn new(rt: &Runtime, pb: &Problem) -> pptm::Result<Self> {
        Ok(Buffers {
            jac: rt.upload(&pb.jac)?,
            obs: rt.upload(&pb.obs)?,
            prec: rt.upload(&pb.prec)?,
            q: rt.upload(&pb.q)?,
            p: rt.upload(&pb.p)?,
            mu0: rt.upload(&vec![0.0f32; pb.n])?,
            mu: [rt.alloc(pb.n)?, rt.alloc(pb.n)?],
            pred: rt.alloc(pb.m)?,
        })
    }

    /// The step as one pipeline: every stage pushed, one wait.
    fn pipelined(&mut self, rt: &Runtime) -> pptm::Result<(f32, f32)> {
        let mut p = rt.pipeline();
        let (jac, obs, prec) = (p.input(&self.jac), p.input(&self.obs), p.input(&self.prec));
        let (q, prior, mu0) = (p.input(&self.q), p.input(&self.p), p.input(&self.mu0));
        let [a, b] = &mut self.mu;
        let mus = [p.output(a), p.output(b)];
        let pred = p.output(&mut self.pred);
        let mut mu: pptm::PipeInput<'_> = mu0;
        for k in 0..ITERATIONS {
            PredictStep::push(&mut p, mu, jac, pred)?;
            let next = mus[k % 2];
            BeliefUpdateStep::push(&mut p, obs, pred, prec, jac, mu, LEARNING_RATE, next)?;
            mu = next.into();
        }
        PredictStep::push(&mut p, mu, jac, pred)?;
        let accuracy = AccuracyPipeline::push(&mut p, obs, pred, prec)?;
        let complexity = KlComplexity::push(&mut p, q, prior)?;
        let r = p.wait()?;
        Ok((r.get(accuracy)?, r.get(complexity)?))
    }

    /// The same stages, each waited before the next is submitted.
    fn waited(&mut self, rt: &Runtime) -> pptm::Result<(f32, f32)> {
        let [a, b] = &mut self.mu;
        for k in 0..ITERATIONS {
            let (cur, next): (&Buffer<f32>, &mut Buffer<f32>) = match k {
                0 => (&self.mu0, &mut *a),
                k if k % 2 == 0 => (&*b, &mut *a),
                _ => (&*a, &mut *b),
            };
            PredictStep::submit(rt, cur, &self.jac, &mut self.pred)?.wait()?;
            BeliefUpdateStep::submit(
                rt,
                &self.obs,
                &self.pred,
                &self.prec,
                &self.jac,
                cur,
                LEARNING_RATE,
                next,
            )?
            .wait()?;
        }
        let last = &self.mu[(ITERATIONS - 1) % 2];
        PredictStep::submit(rt, last, &self.jac, &mut self.pred)?.wait()?;
        let accuracy = AccuracyPipeline::submit(rt, &self.obs, &self.pred, &self.prec)?.wait()?;
        let complexity = KlComplexity::submit(rt, &self.q, &self.p)?.wait()?;
        Ok((accuracy, complexity))
    }

    fn result(&self, (accuracy, complexity): (f32, f32)) -> pptm::Result<Step> {
        Ok(Step {
            mu: self.mu[(ITERATIONS - 1) % 2].to_vec()?,
            accuracy,
            complexity,
        })
    }
}

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1.0)
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    println!(
        "pptm: one active-inference step as one pipeline, on the {}",
        rt.describe()
    );
    let cpu = Runtime::cpu();
    for (m, n) in [(256usize, 256usize), (4096, 4096)] {
        let pb = Problem::new(m, n);
        let mut bufs = Buffers::new(&rt, &pb)?;
        let r = bufs.pipelined(&rt)?;
        let got = bufs.result(r)?;
        // The same step, waited stage by stage, agrees with it exactly (same device code).
        let w = bufs.waited(&rt)?;
        let again = bufs.result(w)?;
        // And the CPU backend (f64 reference code) within f32 rounding (on the CPU backend
        // itself, the waited run is that reference).
        let want = if rt.backend() == BackendKind::Gpu {
            let mut cbufs = Buffers::new(&cpu, &pb)?;
            let c = cbufs.pipelined(&cpu)?;
            cbufs.result(c)?
        } else {
            bufs.result(w)?
        };
        let worst_mu = got
            .mu
            .iter()
            .zip(&want.mu)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let ok = worst_mu <= 1e-3
            && close(got.accuracy, want.accuracy, 1e-3)
            && close(got.complexity, want.complexity, 1e-4)
            && got.mu == again.mu
            && got.accuracy == again.accuracy;
        println!(
            "\n{m} x {n}: {} stages; accuracy {:.6} (CPU {:.6}), complexity {:.6} (CPU {:.6}), \
             largest |mu - mu_cpu| {worst_mu:.2e}",
            2 * ITERATIONS + 3,
            got.accuracy,
            want.accuracy,
            got.complexity,
            want.complexity
        );
        if !ok {
            return Err(format!("{m} x {n}: the pipelined step disagrees with the CPU backend or with the waited one").into());
        }
        if rt.backend() == BackendKind::Gpu {
            let reps = if m > 1024 { 20 } else { 200 };
            let pipelined = measure(reps / 10, reps, || bufs.pipelined(&rt).map(|_| ()))?;
            let waited = measure(reps / 10, reps, || bufs.waited(&rt).map(|_| ()))?;
            println!("  one pipeline, one wait:  {pipelined}");
            println!("  each stage waited:       {waited}");
            println!(
                "  pipelined / waited: {:.2}",
                pipelined.median_us / waited.median_us
            );
        }
    }
    println!("\nall results agree with the CPU backend");
    Ok(())
}

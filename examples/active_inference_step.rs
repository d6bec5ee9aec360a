//! One step of active inference as one pipeline: 84 belief-update iterations (each a `Predict`
//! GEMV, pred = J mu, then a fused `BeliefUpdateStep`, mu ← mu + lr Jᵀ (prec ⊙ (obs − pred))),
//! then the accuracy of the last prediction and the KL complexity of the beliefs: 170 dependent
//! stages over two domains, pushed without waiting and resolved by one wait (docs/pipelines.md).
//! Run at 256 x 256 and 4096 x 4096, checked against the CPU backend, and timed against the same
//! stages waited one by one.
//!
//! The two domains' manifolds share every SM (`Config::overlap_domains`: one block of each fits
//! on an SM), so each stage runs on the whole GPU; `--split` gives each half the GPU (the
//! default of `Config`), `--sms N` N SMs' worth of blocks each (`Config::domain_sms`), to
//! compare.
//!
//!     cargo run --release --example active_inference_step [-- --split | --sms 66]

use std::error::Error;

use pptm::chains::{AccuracyPipeline, BeliefUpdateStep, KlComplexity};
use pptm::ops::Gemv;
use pptm::timing::{Stats, measure};
use pptm::{BackendKind, Buffer, Chain, DeviceTime, FusionBuilder, PipeItem, Runtime};
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

/// An iterated stage of the pipeline, to read its time on the GPU.
#[derive(Clone, Copy)]
enum Stage {
    Predict(PipeItem<()>),
    Update(PipeItem<()>),
}

/// The step pushed into a pipeline ([`Buffers::push`]): the items whose results or times are read.
struct Pushed<'p> {
    pipeline: pptm::Pipeline<'p>,
    accuracy: PipeItem<f32>,
    complexity: PipeItem<f32>,
    stages: Vec<Stage>,
}

/// A kept pipeline's figures ([`Buffers::kept`]).
struct Kept {
    host: Stats,
    device: Option<DeviceTime>,
    predict_us: Option<f64>,
    update_us: Option<f64>,
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

    /// The step's stages pushed into a pipeline: the accuracy and complexity items with it.
    fn push<'p>(&'p mut self, rt: &'p Runtime) -> pptm::Result<Pushed<'p>> {
        let mut p = rt.pipeline();
        let (jac, obs, prec) = (p.input(&self.jac), p.input(&self.obs), p.input(&self.prec));
        let (q, prior, mu0) = (p.input(&self.q), p.input(&self.p), p.input(&self.mu0));
        let [a, b] = &mut self.mu;
        let mus = [p.output(a), p.output(b)];
        let pred = p.output(&mut self.pred);
        let mut mu: pptm::PipeInput<'_> = mu0;
        let mut stages = Vec::with_capacity(2 * ITERATIONS + 1);
        for k in 0..ITERATIONS {
            stages.push(Stage::Predict(PredictStep::push(&mut p, mu, jac, pred)?));
            let next = mus[k % 2];
            stages.push(Stage::Update(BeliefUpdateStep::push(
                &mut p,
                obs,
                pred,
                prec,
                jac,
                mu,
                LEARNING_RATE,
                next,
            )?));
            mu = next.into();
        }
        stages.push(Stage::Predict(PredictStep::push(&mut p, mu, jac, pred)?));
        let accuracy = AccuracyPipeline::push(&mut p, obs, pred, prec)?;
        let complexity = KlComplexity::push(&mut p, q, prior)?;
        Ok(Pushed {
            pipeline: p,
            accuracy,
            complexity,
            stages,
        })
    }

    /// The step as one pipeline: every stage pushed, one wait.
    fn pipelined(&mut self, rt: &Runtime) -> pptm::Result<(f32, f32)> {
        let pushed = self.push(rt)?;
        let r = pushed.pipeline.wait()?;
        Ok((r.get(pushed.accuracy)?, r.get(pushed.complexity)?))
    }

    /// The pipeline kept and run `reps` times after `reps / 10` warm-up runs: the host time of
    /// a run, the last run's time on the GPU (span, stages, hand-offs), and the mean time on the
    /// GPU of a `PredictStep` and of a `BeliefUpdateStep` stage in it.
    fn kept(&mut self, rt: &Runtime, reps: usize) -> pptm::Result<Kept> {
        let Pushed {
            pipeline, stages, ..
        } = self.push(rt)?;
        let (_, mut kept) = pipeline.wait_and_keep()?;
        let mut last = None;
        let host = measure(reps / 10, reps, || {
            last = Some(kept.run()?);
            Ok::<(), pptm::Error>(())
        })?;
        let last = last.expect("reps >= 1");
        let mean = |predict: bool| {
            let spans: Vec<u64> = stages
                .iter()
                .filter_map(|s| match *s {
                    Stage::Predict(item) if predict => last.device_span(item),
                    Stage::Update(item) if !predict => last.device_span(item),
                    _ => None,
                })
                .map(|(a, b)| b.saturating_sub(a))
                .collect();
            (!spans.is_empty()).then(|| spans.iter().sum::<u64>() as f64 / spans.len() as f64 / 1e3)
        };
        Ok(Kept {
            host,
            device: last.device_time(),
            predict_us: mean(true),
            update_us: mean(false),
        })
    }

    /// One `PredictStep` and one `BeliefUpdateStep` submitted alone: their time on the GPU (µs).
    fn alone(&mut self, rt: &Runtime) -> pptm::Result<(Option<f64>, Option<f64>)> {
        let us = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e6);
        let [a, b] = &mut self.mu;
        let predict =
            PredictStep::submit(rt, &self.mu0, &self.jac, &mut self.pred)?.wait_timed()?;
        let update = BeliefUpdateStep::submit(
            rt,
            &self.obs,
            &self.pred,
            &self.prec,
            &self.jac,
            a,
            LEARNING_RATE,
            b,
        )?
        .wait_timed()?;
        Ok((us(predict.device), us(update.device)))
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
    // The two domains alternate, one stage each: with `Config::overlap_domains` each has the
    // whole GPU for its stages (one block of each fits on an SM). `--split` runs them on halves
    // (the default of `Config`), `--sms N` on N SMs' worth of blocks each, to compare.
    let args: Vec<String> = std::env::args().collect();
    let sms = match args.iter().position(|a| a == "--sms") {
        Some(i) => Some(
            args.get(i + 1)
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or("--sms takes a number of SMs")?,
        ),
        None => None,
    };
    let rt = Runtime::with_config(pptm::Config {
        overlap_domains: !args.iter().any(|a| a == "--split"),
        domain_sms: sms.map_or_else(Vec::new, |n| {
            vec![
                (BeliefUpdateStep::DOMAIN.name.into(), n),
                (PredictStep::DOMAIN.name.into(), n),
            ]
        }),
        ..Default::default()
    })?;
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
            let kept = bufs.kept(&rt, reps)?;
            println!("  the pipeline kept, run again: {}", kept.host);
            if let Some(d) = kept.device {
                println!(
                    "  on the GPU (kept): span {:.1} µs, stages {:.1} µs, mean hand-off {:.2} µs over {} stages",
                    d.span.as_secs_f64() * 1e6,
                    d.items.as_secs_f64() * 1e6,
                    d.mean_handoff().as_secs_f64() * 1e6,
                    d.count
                );
            }
            let (predict, update) = bufs.alone(&rt)?;
            let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2} µs"));
            println!(
                "  a stage on the GPU, in the kept pipeline / alone: PredictStep {} / {}, BeliefUpdateStep {} / {}",
                us(kept.predict_us),
                us(predict),
                us(kept.update_us),
                us(update)
            );
            println!(
                "  pipelined / waited: {:.2}",
                pipelined.median_us / waited.median_us
            );
        }
    }
    if let (Some(p), Some(u)) = (
        rt.manifold_blocks::<PredictStep>(),
        rt.manifold_blocks::<BeliefUpdateStep>(),
    ) {
        println!(
            "\nmanifolds: {p} blocks ({}), {u} blocks ({}), fetchers included",
            PredictStep::DOMAIN.name,
            BeliefUpdateStep::DOMAIN.name
        );
    }
    println!("\nall results agree with the CPU backend");
    Ok(())
}

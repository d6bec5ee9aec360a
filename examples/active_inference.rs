//! An active-inference perception loop on the GPU (or the CPU backend): beliefs `mu` about hidden
//! causes are updated by gradient steps on precision-weighted prediction errors, each step one
//! fused `BeliefUpdateStep` (error → weighting → Jᵀ · → update) plus a `Predict` GEMV and an
//! `AccuracyPipeline` to report the fit. Prints the accuracy as it improves and what a step cost.
//!
//!     cargo run --release --example active_inference

use std::error::Error;

use pptm::chains::{AccuracyPipeline, BeliefUpdateStep};
use pptm::ops::Gemv;
use pptm::timing::{measure, variants};
use pptm::{BackendKind, FusionBuilder, Runtime};
use rand::Rng;

/// Predictions from beliefs: pred = J mu.
#[derive(FusionBuilder)]
#[fusion(domain = "active_inference")]
pub struct Predict {
    #[stage(1)]
    gemv: Gemv,
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    println!("pptm active inference on the {}", rt.describe());
    let (m, n) = (256usize, 256usize);
    let mut rng = rand::rng();
    let scale = 1.0 / (m as f32).sqrt();
    let jac: Vec<f32> = (0..m * n)
        .map(|_| rng.random_range(-scale..scale))
        .collect();
    let truth: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    // Observations from the true causes, plus noise.
    let obs: Vec<f32> = (0..m)
        .map(|i| {
            let y: f32 = (0..n).map(|j| jac[i * n + j] * truth[j]).sum();
            y + 0.01 * rng.random_range(-1.0f32..1.0)
        })
        .collect();
    let prec = vec![1.0f32; m];

    let (jb, ob, wb) = (rt.upload(&jac)?, rt.upload(&obs)?, rt.upload(&prec)?);
    let mut mu = rt.upload(&vec![0.0f32; n])?;
    let mut next = rt.alloc::<f32>(n)?;
    let mut pred = rt.alloc::<f32>(m)?;
    let lr = 0.5f32;
    println!("\nJ: {m} x {n}, learning rate {lr}");
    println!("{:>6}  {:>14}  {:>16}", "step", "accuracy", "|mu - truth|");
    for step in 0..=40 {
        Predict::submit(&rt, &mu, &jb, &mut pred)?.wait()?;
        if step % 10 == 0 {
            let acc = AccuracyPipeline::submit(&rt, &ob, &pred, &wb)?.wait()?;
            let dist: f32 = mu
                .to_vec()?
                .iter()
                .zip(&truth)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            println!("{step:>6}  {acc:>14.6}  {dist:>16.6}");
        }
        BeliefUpdateStep::submit(&rt, &ob, &pred, &wb, &jb, &mu, lr, &mut next)?.wait()?;
        std::mem::swap(&mut mu, &mut next);
    }

    let reps = if rt.backend() == BackendKind::Gpu {
        2000
    } else {
        20
    };
    let (mu_host, pred_host) = (mu.to_vec()?, pred.to_vec()?);
    for (how, rt) in variants(rt)? {
        let (jb, ob, wb) = (rt.upload(&jac)?, rt.upload(&obs)?, rt.upload(&prec)?);
        let (mu, mut pred) = (rt.upload(&mu_host)?, rt.upload(&pred_host)?);
        let mut next = rt.alloc::<f32>(n)?;
        let update = measure(reps / 10, reps, || {
            BeliefUpdateStep::submit(&rt, &ob, &pred, &wb, &jb, &mu, lr, &mut next)?.wait()
        })?;
        let predict = measure(reps / 10, reps, || {
            Predict::submit(&rt, &mu, &jb, &mut pred)?.wait()
        })?;
        let accuracy = measure(reps / 10, reps, || {
            AccuracyPipeline::submit(&rt, &ob, &pred, &wb)?
                .wait()
                .map(|_| ())
        })?;
        println!("\n{how} (host-visible, submit -> result; {reps} repetitions):");
        println!("  belief_update {m} x {n}: {update}");
        println!("  predict (GEMV) {m} x {n}: {predict}");
        println!("  accuracy_pipeline {m}: {accuracy}");
        println!("  ({})", rt.describe());
    }
    Ok(())
}

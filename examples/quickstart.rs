//! pptm quickstart: declare a fused chain, run it on the GPU if there is one (else on the CPU
//! backend), check it against an f64 reference, and print what it cost.
//!
//!     cargo run --release --example quickstart

use std::error::Error;
use std::time::{Duration, Instant};

use pptm::ops::{KlDivergence, SumReduction};
use pptm::{FusionBuilder, Runtime};
use rand::Rng;

/// KL divergence Σ q (ln q − ln p), fused into one pass: build.rs turns this declaration into PTX
/// (generated/inference/), and the derive gives `KlComplexity::submit`.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct KlComplexity {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

fn distribution(n: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    let v: Vec<f32> = (0..n).map(|_| 1.0 - rng.random::<f32>()).collect();
    let sum: f64 = v.iter().map(|&x| f64::from(x)).sum();
    v.into_iter().map(|x| (f64::from(x) / sum) as f32).collect()
}

fn median_p99(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (
        us(t[t.len() / 2]),
        us(t[(t.len() * 99 / 100).min(t.len() - 1)]),
    )
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    println!("pptm quickstart on the {}", rt.describe());
    println!();
    println!(
        "{:>10}  {:>13}  {:>13}  {:>9}  {:>12}  {:>9}  {:>8}",
        "n", "KL (pptm)", "KL (f64 ref)", "rel err", "median µs", "p99 µs", "GB/s"
    );
    let mut worst = 0.0f64;
    for n in [4096usize, 1 << 20, 1 << 24] {
        let (q, p) = (distribution(n), distribution(n));
        let reference: f64 = q
            .iter()
            .zip(&p)
            .map(|(&q, &p)| {
                if q == 0.0 {
                    0.0
                } else {
                    f64::from(q) * (f64::from(q).ln() - f64::from(p).ln())
                }
            })
            .sum();
        let (qb, pb) = (rt.upload(&q)?, rt.upload(&p)?);

        let kl = KlComplexity::submit(&rt, &qb, &pb)?.wait()?;
        let rel = (f64::from(kl) - reference).abs() / reference.abs();
        worst = worst.max(rel);

        let reps = match (rt.backend(), n <= 1 << 20) {
            (pptm::BackendKind::Gpu, true) => 500,
            (pptm::BackendKind::Gpu, false) => 50,
            (pptm::BackendKind::Cpu, _) => 3,
        };
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            KlComplexity::submit(&rt, &qb, &pb)?.wait()?;
            times.push(t.elapsed());
        }
        let (median, p99) = median_p99(times);
        let gbs = 8.0 * n as f64 / (median * 1e-6) / 1e9;
        println!(
            "{n:>10}  {kl:>13.7}  {reference:>13.7}  {rel:>9.2e}  {median:>12.2}  {p99:>9.2}  {gbs:>8.1}"
        );
    }

    let mut times = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t = Instant::now();
        rt.submit_noop::<KlComplexity>()?.wait()?;
        times.push(t.elapsed());
    }
    let (median, p99) = median_p99(times);
    println!();
    println!("no-op submit -> completion round trip: median {median:.2} µs, p99 {p99:.2} µs");
    println!("now running: {}", rt.describe());
    if worst > 1e-5 {
        return Err(format!("relative error {worst:e} exceeds 1e-5").into());
    }
    println!("all results within 1e-5 of the f64 reference (worst {worst:.2e})");
    Ok(())
}

//! A small MLP layer and a GEMV solve step on the GPU (or the CPU backend):
//! `MatmulBiasGelu` computes gelu(X W + b) with the bias and activation fused into the matmul's
//! output (`MatmulBiasGeluBf16`: the same layer with bf16 X and W on tensor cores);
//! `RichardsonStep` (GEMV → axpby) iterates x ← B x + ω y with B = I − ω A to solve
//! A x = y, and `GemvAxpbySum` reports the residual ‖y − A x‖² in the same pass as its GEMV.
//!
//!     cargo run --release --example linear_algebra

use std::error::Error;

use pptm::chains::{GemvAxpbySum, MatmulBiasGelu, MatmulBiasGeluBf16};
use pptm::ops::{Axpby, Gemv};
use pptm::timing::{measure, variants};
use pptm::{BackendKind, FusionBuilder, Runtime, bf16};
use rand::Rng;

/// x_next = alpha (B x) + beta y: one Richardson iteration with alpha = 1, beta = ω.
#[derive(FusionBuilder)]
#[fusion(domain = "richardson")]
pub struct RichardsonStep {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    println!("pptm linear algebra on the {}", rt.describe());
    let gpu = rt.backend() == BackendKind::Gpu;
    let mut rng = rand::rng();
    let mut uniform =
        |len: usize, r: f32| -> Vec<f32> { (0..len).map(|_| rng.random_range(-r..r)).collect() };

    // 1. A dense layer.
    let (m, k, n) = (64usize, 256usize, 256usize);
    let (x, w, b) = (
        uniform(m * k, 1.0),
        uniform(k * n, 1.0 / 16.0),
        uniform(n, 0.1),
    );
    let (xb, wb, bb) = (rt.upload(&x)?, rt.upload(&w)?, rt.upload(&b)?);
    let mut h = rt.alloc::<f32>(m * n)?;
    MatmulBiasGelu::submit(&rt, &xb, &wb, &bb, &mut h, m, k)?.wait()?;
    let hv = h.to_vec()?;
    let active = hv.iter().filter(|&&v| v > 0.0).count();
    println!(
        "\nMLP layer gelu(X W + b), X {m} x {k}, W {k} x {n}: {active} of {} outputs positive, h[0] = {:.5}",
        m * n,
        hv[0]
    );

    // The same layer with bf16 operands, on tensor cores (f32 accumulation and output).
    let to_bf16 = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
    let (x16, w16) = (to_bf16(&x), to_bf16(&w));
    let (x16b, w16b) = (rt.upload(&x16)?, rt.upload(&w16)?);
    let mut h16 = rt.alloc::<f32>(m * n)?;
    MatmulBiasGeluBf16::submit(&rt, &x16b, &w16b, &bb, &mut h16, m, k)?.wait()?;
    let worst = h16
        .to_vec()?
        .iter()
        .zip(&hv)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "the same layer with bf16 X and W (tensor cores on the GPU backend): largest difference from f32 {worst:.2e} (bf16 rounding of the operands)"
    );

    // 2. Solve A x = y for a well-conditioned A = I + small noise, by Richardson iteration.
    let d = 1024usize;
    let mut a = uniform(d * d, 0.2 / (d as f32).sqrt());
    for i in 0..d {
        a[i * d + i] += 1.0;
    }
    let y = uniform(d, 1.0);
    let omega = 0.9f32;
    let mut bmat: Vec<f32> = a.iter().map(|v| -omega * v).collect();
    for i in 0..d {
        bmat[i * d + i] += 1.0;
    }
    let (ab, bmb, yb) = (rt.upload(&a)?, rt.upload(&bmat)?, rt.upload(&y)?);
    let mut sol = rt.upload(&vec![0.0f32; d])?;
    let mut next = rt.alloc::<f32>(d)?;
    println!("\nRichardson iteration on A x = y ({d} x {d}, omega = {omega}):");
    for it in 0..=12 {
        if it % 3 == 0 {
            let r2 = GemvAxpbySum::submit(&rt, &sol, &ab, &yb, -1.0, 1.0)?.wait()?;
            println!("  iteration {it:>2}: |y - A x| = {:.3e}", r2.sqrt());
        }
        RichardsonStep::submit(&rt, &sol, &bmb, &yb, 1.0, omega, &mut next)?.wait()?;
        std::mem::swap(&mut sol, &mut next);
    }

    let reps = if gpu { 1000 } else { 5 };
    let sol_host = sol.to_vec()?;
    for (how, rt) in variants(rt)? {
        let (xb, wb, bb) = (rt.upload(&x)?, rt.upload(&w)?, rt.upload(&b)?);
        let (ab, bmb, yb, sol) = (
            rt.upload(&a)?,
            rt.upload(&bmat)?,
            rt.upload(&y)?,
            rt.upload(&sol_host)?,
        );
        let (x16b, w16b) = (rt.upload(&x16)?, rt.upload(&w16)?);
        let (mut h, mut next) = (rt.alloc::<f32>(m * n)?, rt.alloc::<f32>(d)?);
        let layer = measure(reps / 10, reps, || {
            MatmulBiasGelu::submit(&rt, &xb, &wb, &bb, &mut h, m, k)?.wait()
        })?;
        let layer16 = measure(reps / 10, reps, || {
            MatmulBiasGeluBf16::submit(&rt, &x16b, &w16b, &bb, &mut h, m, k)?.wait()
        })?;
        let step = measure(reps / 10, reps, || {
            RichardsonStep::submit(&rt, &sol, &bmb, &yb, 1.0, omega, &mut next)?.wait()
        })?;
        let resid = measure(reps / 10, reps, || {
            GemvAxpbySum::submit(&rt, &sol, &ab, &yb, -1.0, 1.0)?
                .wait()
                .map(|_| ())
        })?;
        println!("\n{how} (host-visible, submit -> result; {reps} repetitions):");
        println!("  matmul_bias_gelu {m} x {k} x {n}: {layer}");
        println!("  matmul_bias_gelu bf16 {m} x {k} x {n}: {layer16}");
        println!("  richardson step (gemv + axpby) {d}^2: {step}");
        println!("  gemv_axpby_sum {d}^2: {resid}");
        if gpu {
            let big = 16384usize;
            let (ax, xx, yx) = (
                rt.upload(&vec![0.5f32; big * big])?,
                rt.upload(&vec![1.0f32; big])?,
                rt.upload(&vec![1.0f32; big])?,
            );
            let t = measure(5, 50, || {
                GemvAxpbySum::submit(&rt, &xx, &ax, &yx, 1.0, 1.0)?
                    .wait()
                    .map(|_| ())
            })?;
            let gbs = 4.0 * (big * big) as f64 / (t.median_us * 1e-6) / 1e9;
            println!("  gemv_axpby_sum {big}^2: {t} ({gbs:.0} GB/s of A)");
        }
        println!("  ({})", rt.describe());
    }
    Ok(())
}

//! Transfer entropy between two coupled series, estimated on the GPU (or the CPU backend) with the
//! KSG estimator: `DistanceKth` gives each point's k-th neighbour distance in the joint space, and
//! `TeReduction` counts neighbours within it in three subspaces, applies digamma and averages,
//! in one pass over the pairs. Prints the estimates both ways and what each step cost.
//!
//!     cargo run --release --example transfer_entropy

use std::error::Error;

use pptm::chains::{DistanceKth, TeReduction};
use pptm::timing::{measure, variants};
use pptm::{BackendKind, Runtime};
use rand::Rng;

/// x drives y: x_t = 0.5 x_{t-1} + noise, y_t = 0.4 y_{t-1} + 0.8 x_{t-1} + noise.
fn coupled_series(len: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = rand::rng();
    let (mut x, mut y) = (vec![0.0f32; len], vec![0.0f32; len]);
    for t in 1..len {
        x[t] = 0.5 * x[t - 1] + rng.random_range(-1.0..1.0);
        y[t] = 0.4 * y[t - 1] + 0.8 * x[t - 1] + 0.3 * rng.random_range(-1.0f32..1.0);
    }
    (x, y)
}

/// TE source → target, history 1: X = source_t, Y = target_{t+1}, Z = target_t.
fn transfer_entropy(
    rt: &Runtime,
    source: &[f32],
    target: &[f32],
    k: u32,
) -> Result<f32, Box<dyn Error>> {
    let n = source.len() - 1;
    let x = &source[..n];
    let y = &target[1..];
    let z = &target[..n];
    let joint: Vec<f32> = (0..n).flat_map(|i| [x[i], y[i], z[i]]).collect();
    let (xb, yb, zb, jb) = (
        rt.upload(x)?,
        rt.upload(y)?,
        rt.upload(z)?,
        rt.upload(&joint)?,
    );
    let mut eps = rt.alloc::<f32>(n)?;
    DistanceKth::submit(rt, &jb, k, &mut eps, 3)?.wait()?;
    Ok(TeReduction::submit(rt, &xb, &yb, &zb, &eps, k, 1, 1, 1)?.wait()?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    println!("pptm transfer entropy on the {}", rt.describe());
    let gpu = rt.backend() == BackendKind::Gpu;
    let (len, k) = (if gpu { 4097 } else { 1025 }, 4);
    let (x, y) = coupled_series(len);
    let te_xy = transfer_entropy(&rt, &x, &y, k)?;
    let te_yx = transfer_entropy(&rt, &y, &x, k)?;
    println!("\n{len} samples, k = {k} (KSG estimator, nats):");
    println!("  TE x -> y = {te_xy:.4}   (x drives y)");
    println!("  TE y -> x = {te_yx:.4}   (no coupling that way: near 0)");

    // What each step costs, per variant: 4096 points, as in the targets.
    let n = if gpu { 4096 } else { 512 };
    let mut rng = rand::rng();
    let mut pts = |d: usize| -> Vec<f32> { (0..n * d).map(|_| rng.random::<f32>()).collect() };
    let (p4, p1a, p1b, p1c) = (pts(4), pts(1), pts(1), pts(1));
    for (how, rt) in variants(rt)? {
        let reps = if gpu { 500 } else { 3 };
        let (p4b, xb, yb, zb) = (
            rt.upload(&p4)?,
            rt.upload(&p1a)?,
            rt.upload(&p1b)?,
            rt.upload(&p1c)?,
        );
        let mut out = rt.alloc::<f32>(n)?;
        let kth = measure(reps / 10, reps, || {
            DistanceKth::submit(&rt, &p4b, 4, &mut out, 4)?.wait()
        })?;
        let eps = out;
        let te = measure(reps / 10, reps, || {
            TeReduction::submit(&rt, &xb, &yb, &zb, &eps, 4, 1, 1, 1)?
                .wait()
                .map(|_| ())
        })?;
        println!("\n{how} (host-visible, submit -> result; {reps} repetitions):");
        println!("  distance_kth  {n} points, d = 4, k = 4: {kth}");
        println!("  te_reduction  {n} points, d = 1 each:   {te}");
        println!("  ({})", rt.describe());
    }
    Ok(())
}

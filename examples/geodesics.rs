//! 18,030 geodesics integrated by classical RK4 on a Christoffel grid, each whole integration one
//! submission (the system, its op and its chains: geodesics/system.rs).
//!
//! It runs N = 100 and N = 1000 steps on the runtime `Runtime::new()` picks (the GPU if there is
//! one, else the CPU backend), checks the end points against the CPU backend, which computes in
//! f64 (relative error ≤ 1e-4 on a GPU), and prints the time per integration (median, p99),
//! geodesic-steps per second and the table reads' rate. bench/peers_geodesics.py times PyTorch on
//! the same system; pptm-bench's case `geodesics` runs the same chains beside it.
//!
//!     cargo run --release --example geodesics

use std::error::Error;

use pptm::timing::Stats;
use pptm::{BackendKind, Runtime, State};

#[path = "geodesics/system.rs"]
mod system;
use system::*;

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    let p = problem();
    let n = p.start.len();
    match rt.gpu_info() {
        Some(g) => println!("backend: GPU ({}, {} SMs)", g.name, g.sm_count),
        None => println!("backend: CPU (no usable GPU); the figures below are the CPU backend's"),
    }
    println!(
        "{n} geodesics, Γ table {ROWS} x {COLS} in f32 ({:.1} MB)",
        (ROWS * COLS * 4) as f64 / 1e6
    );
    let cpu = Runtime::cpu();
    let mut ends = Vec::new();
    let mut u = upload(&rt, &p)?;
    for steps in [100usize, 1000] {
        let got = end_states(&rt, &p, steps)?;
        if rt.backend() == BackendKind::Gpu {
            // The CPU backend runs the op's f64 function: the f64 reference.
            let want = end_states(&cpu, &p, steps)?;
            let worst = max_rel_err(&got, &want);
            println!(
                "N = {steps}: end points within {worst:.2e} (relative) of the f64 CPU backend"
            );
            if worst > 1e-4 {
                return Err(format!(
                    "N = {steps}: end-point error {worst:e} exceeds 1e-4 of the f64 reference"
                )
                .into());
            }
        }
        // Each integration is one submission: time it whole, many times.
        let reps = if rt.backend() == BackendKind::Gpu {
            30
        } else {
            2
        };
        let mut host = Vec::with_capacity(reps);
        let mut device = Vec::with_capacity(reps);
        let mut end = vec![0.0f32; 3 * n];
        for _ in 0..reps + 1 {
            let t = std::time::Instant::now();
            let d = integrate(&rt, &mut u, steps)?;
            u.end.read_into(&mut end)?;
            host.push(t.elapsed());
            device.extend(d);
        }
        // (The first run is the warm-up.)
        host.remove(0);
        if !device.is_empty() {
            device.remove(0);
        }
        let host = Stats::of(host);
        println!("N = {steps}: host {host} (submission to the end states on the host)");
        let (median_s, what) = if device.is_empty() {
            (host.median_us * 1e-6, "host")
        } else {
            let d = Stats::of(device);
            println!("N = {steps}: device {d} (one submission, {} runs)", d.reps);
            (d.median_us * 1e-6, "device")
        };
        let geodesic_steps = (n * steps) as f64;
        // Four Γ lookups a step, four table values each.
        let table_bytes = geodesic_steps * 4.0 * 4.0 * 4.0;
        println!(
            "N = {steps}: {:.3e} geodesic-steps/s; Γ reads {:.0} GB/s ({what} median), {:.1} MB of state and table from memory",
            geodesic_steps / median_s,
            table_bytes / median_s / 1e9,
            (n * 3 * 4 * 2 + n * 8 + ROWS * COLS * 4) as f64 / 1e6
        );
        ends.push(got);
    }
    // Γ stored in f16: the same integration against the CPU backend's f64 run on the same f16
    // table (what the storage changes is Γ, by up to 2^-11 of each value).
    let gamma16: Vec<pptm::f16> = p.gamma.iter().map(|&g| pptm::f16::from_f32(g)).collect();
    let run16 = |rt: &Runtime| -> Result<(Vec<Geo>, Option<std::time::Duration>), Box<dyn Error>> {
        let (s, col, alpha, gamma) = (
            rt.upload(&Geo::flatten(&p.start))?,
            rt.upload(&p.col)?,
            rt.upload(&p.alpha)?,
            rt.upload(&gamma16)?,
        );
        let mut out = rt.upload(&vec![f32::NAN; 3 * n])?;
        let dt = 1.0 / 1000.0f32;
        let t = Geodesics1000F16::submit(rt, &s, &col, &alpha, &gamma, dt, &mut out, ROWS, COLS)?
            .wait_timed()?;
        Ok((Geo::unflatten(&out.to_vec()?)?, t.device))
    };
    let (got16, _) = run16(&rt)?;
    println!(
        "N = 1000, Γ in f16: end points within {:.2e} (relative) of the f32-table run",
        max_rel_err(&got16, &ends[1])
    );
    if rt.backend() == BackendKind::Gpu {
        let (want16, _) = run16(&cpu)?;
        let worst = max_rel_err(&got16, &want16);
        println!("N = 1000, Γ in f16: within {worst:.2e} of the f64 CPU backend on the same table");
        if worst > 1e-4 {
            return Err(format!("f16 table: end-point error {worst:e} exceeds 1e-4").into());
        }
        let mut device = Vec::new();
        for _ in 0..10 {
            device.extend(run16(&rt)?.1);
        }
        if !device.is_empty() {
            println!("N = 1000, Γ in f16: device {}", Stats::of(device));
        }
    }
    // The same fused pass as an ordinary kernel launch per integration (`Variant::FusedLaunched`):
    // what the resident manifold costs or saves against launching the same code.
    if rt.backend() == BackendKind::Gpu {
        let launched = Runtime::gpu_with(pptm::Config {
            variant: pptm::Variant::FusedLaunched,
            ..Default::default()
        })?;
        let mut u = upload(&launched, &p)?;
        let (mut host, mut device) = (Vec::new(), Vec::new());
        for _ in 0..11 {
            let t = std::time::Instant::now();
            device.extend(integrate(&launched, &mut u, 1000)?);
            host.push(t.elapsed());
        }
        let got = Geo::unflatten(&u.end.to_vec()?)?;
        let device = match device.len() {
            0 => "not measured".to_string(),
            _ => Stats::of(device).to_string(),
        };
        println!(
            "N = 1000, the same pass as one kernel launch: device {device}, host {}; \
             end points within {:.2e} of the manifold's",
            Stats::of(host[1..].to_vec()),
            max_rel_err(&got, &ends[1])
        );
    }
    // RK4's own error: the 100-step end points against the 1000-step ones.
    println!(
        "RK4 at N = 100 against N = 1000: {:.2e} (relative)",
        max_rel_err(&ends[0], &ends[1])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RK4 step in f64, written apart from the op: Γ by a bilinear interpolation of its own.
    fn step64(p: &Problem, k: usize, s: (f64, f64, f64), h: f64) -> (f64, f64, f64) {
        let col = f64::from(p.col[k]) as usize;
        let alpha = f64::from(p.alpha[k]);
        let gamma = |c: f64| {
            let x = ((c + 1.0) * 0.5 * (ROWS - 1) as f64).clamp(0.0, (ROWS - 1) as f64);
            let i0 = x.floor() as usize;
            let i1 = (i0 + 1).min(ROWS - 1);
            let g = |i: usize| f64::from(p.gamma[i * COLS + col]);
            g(i0) + (x - x.floor()) * (g(i1) - g(i0))
        };
        let f = |c: f64, v: f64| (v, -gamma(c) * v * v, alpha * c.tanh() * v);
        let k1 = f(s.0, s.1);
        let k2 = f(s.0 + 0.5 * h * k1.0, s.1 + 0.5 * h * k1.1);
        let k3 = f(s.0 + 0.5 * h * k2.0, s.1 + 0.5 * h * k2.1);
        let k4 = f(s.0 + h * k3.0, s.1 + h * k3.1);
        let w = h / 6.0;
        (
            s.0 + w * (k1.0 + 2.0 * k2.0 + 2.0 * k3.0 + k4.0),
            s.1 + w * (k1.1 + 2.0 * k2.1 + 2.0 * k3.1 + k4.1),
            s.2 + w * (k1.2 + 2.0 * k2.2 + 2.0 * k3.2 + k4.2),
        )
    }

    /// The CPU backend's 100 steps match an RK4 written here, for every geodesic (the GPU suite
    /// runs `main`, which holds the GPU to the CPU backend).
    #[test]
    fn the_cpu_backend_integrates_as_an_f64_rk4_does() {
        let p = problem();
        let got = end_states(&Runtime::cpu(), &p, 100).unwrap();
        let h = f64::from(1.0f32 / 100.0);
        let want: Vec<Geo> = (0..p.start.len())
            .map(|k| {
                let s0 = p.start[k];
                let mut s = (
                    f64::from(s0.c as f32),
                    f64::from(s0.v as f32),
                    f64::from(s0.a as f32),
                );
                for _ in 0..100 {
                    s = step64(&p, k, s, h);
                }
                Geo {
                    c: s.0,
                    v: s.1,
                    a: s.2,
                }
            })
            .collect();
        // The CPU backend computes in f64 and stores f32.
        let worst = max_rel_err(&got, &want);
        assert!(worst < 1e-6, "end points {worst:e} from the f64 RK4");
    }
}

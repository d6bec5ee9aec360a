//! 18,030 geodesics integrated by classical RK4 on a Christoffel grid, each whole integration one
//! submission: the state (c, v, A) of every geodesic is a `#[derive(pptm::State)]`, the RK4 step
//! is an op of this example's own (`#[pptm::op]`), Γ is a 2000 x 601 table read by bilinear
//! interpolation (`pptm::Table`), and `repeat = N` runs the N steps in registers, in one pass.
//!
//! The system (one geodesic per concentration transition and wavelength):
//!
//!   dc/dt = v,   dv/dt = −Γ(c, λ) v²,   dA/dt = α(λ) tanh(c) v,
//!
//! with Γ = ½ g⁻¹ ∂g/∂c of the metric g(c, λ) = 1 + 0.3 c² + 0.2 sin(3c + 2πλ), tabulated at
//! 2000 concentrations in [−1, 1] by 601 wavelengths, stored in f32.
//!
//! It runs N = 100 and N = 1000 steps on the runtime `Runtime::new()` picks (the GPU if there is
//! one, else the CPU backend), checks the end points against the CPU backend, which computes in
//! f64 (relative error ≤ 1e-4 on a GPU), and prints the time per integration (median, p99),
//! geodesic-steps per second and the table reads' rate. bench/peers_geodesics.py times PyTorch on
//! the same system.
//!
//!     cargo run --release --example geodesics

use std::error::Error;

use pptm::timing::Stats;
use pptm::{BackendKind, Buffer, FusionBuilder, Runtime, State, Table, op};

/// One geodesic's state: concentration, its rate, absorbance.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Geo {
    pub c: f64,
    pub v: f64,
    pub a: f64,
}

/// One classical RK4 step of the system, of length `dt`; `col` is the geodesic's wavelength
/// column in the Γ table and `alpha` its coupling α(λ). The table's rows span c in [−1, 1]; Γ is
/// read four times, once per RK4 stage (an op calls no function of its own, so each is written
/// out). Its f32 form runs on fp32 stages.
#[op(f32_form, tensors(col, alpha))]
pub fn geodesic_rk4(s: Geo, col: f64, alpha: f64, gamma: Table, dt: f32) -> Geo {
    let h = dt as f64;
    let to_row = 0.5 * (gamma.rows() as f64 - 1.0);
    let g1 = gamma.bilinear((s.c + 1.0) * to_row, col);
    let k1c = s.v;
    let k1v = -g1 * s.v * s.v;
    let k1a = alpha * s.c.tanh() * s.v;
    let c2 = s.c + 0.5 * h * k1c;
    let v2 = s.v + 0.5 * h * k1v;
    let g2 = gamma.bilinear((c2 + 1.0) * to_row, col);
    let k2c = v2;
    let k2v = -g2 * v2 * v2;
    let k2a = alpha * c2.tanh() * v2;
    let c3 = s.c + 0.5 * h * k2c;
    let v3 = s.v + 0.5 * h * k2v;
    let g3 = gamma.bilinear((c3 + 1.0) * to_row, col);
    let k3c = v3;
    let k3v = -g3 * v3 * v3;
    let k3a = alpha * c3.tanh() * v3;
    let c4 = s.c + h * k3c;
    let v4 = s.v + h * k3v;
    let g4 = gamma.bilinear((c4 + 1.0) * to_row, col);
    let k4c = v4;
    let k4v = -g4 * v4 * v4;
    let k4a = alpha * c4.tanh() * v4;
    let w = h / 6.0;
    Geo {
        c: s.c + w * (k1c + 2.0 * k2c + 2.0 * k3c + k4c),
        v: s.v + w * (k1v + 2.0 * k2v + 2.0 * k3v + k4v),
        a: s.a + w * (k1a + 2.0 * k2a + 2.0 * k3a + k4a),
    }
}

/// 100 RK4 steps of every geodesic: one item, one pass.
#[derive(FusionBuilder)]
#[fusion(domain = "geodesics")]
pub struct Geodesics100 {
    #[stage(1, repeat = 100)]
    step: GeodesicRk4,
}

/// 1000 RK4 steps of every geodesic: one item, one pass.
#[derive(FusionBuilder)]
#[fusion(domain = "geodesics")]
pub struct Geodesics1000 {
    #[stage(1, repeat = 1000)]
    step: GeodesicRk4,
}

/// 1000 RK4 steps with Γ stored in f16: half the table's bytes, read and widened on the fly.
#[derive(FusionBuilder)]
#[fusion(domain = "geodesics")]
pub struct Geodesics1000F16 {
    #[stage(1, repeat = 1000, tables = "fp16")]
    step: GeodesicRk4,
}

/// Concentrations of the Γ grid's rows, wavelengths of its columns.
const ROWS: usize = 2000;
const COLS: usize = 601;
/// The concentration levels whose ordered pairs are the 30 transitions.
const LEVELS: [f64; 6] = [-0.75, -0.45, -0.15, 0.15, 0.45, 0.75];

/// The problem: Γ (row-major, f32), each geodesic's column and α, and the initial states.
struct Problem {
    gamma: Vec<f32>,
    col: Vec<f32>,
    alpha: Vec<f32>,
    start: Vec<Geo>,
}

fn problem() -> Problem {
    let lambda = |j: usize| j as f64 / (COLS - 1) as f64;
    let mut gamma = Vec::with_capacity(ROWS * COLS);
    for i in 0..ROWS {
        let c = -1.0 + 2.0 * i as f64 / (ROWS - 1) as f64;
        for j in 0..COLS {
            let phase = 3.0 * c + std::f64::consts::TAU * lambda(j);
            let g = 1.0 + 0.3 * c * c + 0.2 * phase.sin();
            let dg = 0.6 * c + 0.6 * phase.cos();
            gamma.push((0.5 * dg / g) as f32);
        }
    }
    let (mut col, mut alpha, mut start) = (Vec::new(), Vec::new(), Vec::new());
    for (a, &from) in LEVELS.iter().enumerate() {
        for (b, &to) in LEVELS.iter().enumerate() {
            if a == b {
                continue;
            }
            for j in 0..COLS {
                col.push(j as f32);
                alpha.push((-((lambda(j) - 0.5) / 0.2).powi(2)).exp() as f32);
                start.push(Geo {
                    c: from,
                    v: to - from,
                    a: 0.0,
                });
            }
        }
    }
    Problem {
        gamma,
        col,
        alpha,
        start,
    }
}

/// The problem's buffers on one runtime.
struct Uploaded {
    start: Buffer<f32>,
    col: Buffer<f32>,
    alpha: Buffer<f32>,
    gamma: Buffer<f32>,
    end: Buffer<f32>,
}

fn upload(rt: &Runtime, p: &Problem) -> pptm::Result<Uploaded> {
    Ok(Uploaded {
        start: rt.upload(&Geo::flatten(&p.start))?,
        col: rt.upload(&p.col)?,
        alpha: rt.upload(&p.alpha)?,
        gamma: rt.upload(&p.gamma)?,
        // Poisoned: an end state the integration does not write shows as NaN.
        end: rt.upload(&vec![f32::NAN; 3 * p.start.len()])?,
    })
}

/// Integrates every geodesic over t in [0, 1] in `steps` RK4 steps, as one submission; returns
/// the device time where the backend measures one. The end states are in `u.end`.
fn integrate(
    rt: &Runtime,
    u: &mut Uploaded,
    steps: usize,
) -> Result<Option<std::time::Duration>, Box<dyn Error>> {
    let dt = 1.0 / steps as f32;
    let (s, col, alpha, gamma) = (&u.start, &u.col, &u.alpha, &u.gamma);
    let timed = match steps {
        100 => Geodesics100::submit(rt, s, col, alpha, gamma, dt, &mut u.end, ROWS, COLS)?
            .wait_timed()?,
        1000 => Geodesics1000::submit(rt, s, col, alpha, gamma, dt, &mut u.end, ROWS, COLS)?
            .wait_timed()?,
        other => return Err(format!("no chain of {other} steps").into()),
    };
    Ok(timed.device)
}

/// The end states of one integration of `steps` steps on `rt`.
fn end_states(rt: &Runtime, p: &Problem, steps: usize) -> Result<Vec<Geo>, Box<dyn Error>> {
    let mut u = upload(rt, p)?;
    integrate(rt, &mut u, steps)?;
    Ok(Geo::unflatten(&u.end.to_vec()?)?)
}

/// Per geodesic, the largest error of a field over the largest field of the reference; the
/// worst geodesic's.
fn max_rel_err(got: &[Geo], want: &[Geo]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let err = (g.c - w.c)
                .abs()
                .max((g.v - w.v).abs())
                .max((g.a - w.a).abs());
            let scale = w.c.abs().max(w.v.abs()).max(w.a.abs()).max(1e-6);
            if err.is_nan() {
                f64::INFINITY
            } else {
                err / scale
            }
        })
        .fold(0.0, f64::max)
}

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

//! The geodesics system: 18,030 geodesics integrated by classical RK4 on a Christoffel grid, as
//! examples/geodesics.rs runs it and pptm-bench times it (case `geodesics`). Both declare this
//! file as a module (`#[path = "..."] mod system;`), so the op, its state and its chains are
//! written once; pptm's codegen follows such paths.
//!
//! The state (c, v, A) of every geodesic is a `#[derive(pptm::State)]`, the RK4 step is an op of
//! this file's own (`#[pptm::op]`), Γ is a 2000 x 601 table read by bilinear interpolation
//! (`pptm::Table`), and `repeat = N` runs the N steps in registers, in one pass.
//!
//! The system (one geodesic per concentration transition and wavelength):
//!
//!   dc/dt = v,   dv/dt = −Γ(c, λ) v²,   dA/dt = α(λ) tanh(c) v,
//!
//! with Γ = ½ g⁻¹ ∂g/∂c of the metric g(c, λ) = 1 + 0.3 c² + 0.2 sin(3c + 2πλ), tabulated at
//! 2000 concentrations in [−1, 1] by 601 wavelengths, stored in f32.

use std::error::Error;

use pptm::{Buffer, FusionBuilder, Runtime, State, Table, op};

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
pub const ROWS: usize = 2000;
pub const COLS: usize = 601;
/// The concentration levels whose ordered pairs are the 30 transitions.
pub const LEVELS: [f64; 6] = [-0.75, -0.45, -0.15, 0.15, 0.45, 0.75];

/// The problem: Γ (row-major, f32), each geodesic's column and α, and the initial states.
pub struct Problem {
    pub gamma: Vec<f32>,
    pub col: Vec<f32>,
    pub alpha: Vec<f32>,
    pub start: Vec<Geo>,
}

pub fn problem() -> Problem {
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
pub struct Uploaded {
    pub start: Buffer<f32>,
    pub col: Buffer<f32>,
    pub alpha: Buffer<f32>,
    pub gamma: Buffer<f32>,
    pub end: Buffer<f32>,
}

pub fn upload(rt: &Runtime, p: &Problem) -> pptm::Result<Uploaded> {
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
pub fn integrate(
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
pub fn end_states(rt: &Runtime, p: &Problem, steps: usize) -> Result<Vec<Geo>, Box<dyn Error>> {
    let mut u = upload(rt, p)?;
    integrate(rt, &mut u, steps)?;
    Ok(Geo::unflatten(&u.end.to_vec()?)?)
}

/// Per geodesic, the largest error of a field over the largest field of the reference; the
/// worst geodesic's.
pub fn max_rel_err(got: &[Geo], want: &[Geo]) -> f64 {
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

//! The spectral fit computed directly in f64, written apart from the ops of system.rs (a whole
//! Thomas solve per row, a Householder QR per fit, residuals summed directly), and the synthetic
//! data the example fits.

use super::inputs::uniform;
use super::system::{Grid, LIGHT_SPEED, Templates, Velocities};

/// Template row `row` broadened by its vsini, in f64.
pub fn broadened(t: &Templates, row: usize) -> Vec<f64> {
    let (raw, vsini) = t.rows[row];
    let n = t.grid.len;
    let y = &t.fluxes[raw * n..(raw + 1) * n];
    // The scalars as the ops receive them (f32).
    let (start, step, eps) = (
        f64::from(t.grid.start as f32),
        f64::from(t.grid.step as f32),
        f64::from(t.limb as f32),
    );
    let vsini = f64::from(vsini as f32);
    (0..n)
        .map(|i| {
            let dv = if t.grid.log {
                LIGHT_SPEED * step
            } else {
                LIGHT_SPEED * step / (start + i as f64 * step)
            };
            let reach = if vsini > 0.0 { vsini / dv } else { 0.0 };
            let half = if reach >= 1.0 {
                reach.floor() as i64
            } else {
                0
            };
            let (mut acc, mut norm) = (0.0, 0.0);
            for k in -half..=half {
                let x = if half == 0 { 0.0 } else { k as f64 / reach };
                let q = 1.0 - x * x;
                let g =
                    2.0 * (1.0 - eps) * q.max(0.0).sqrt() + 0.5 * std::f64::consts::PI * eps * q;
                let j = (i as i64 + k).clamp(0, n as i64 - 1) as usize;
                acc += g * f64::from(y[j]);
                norm += g;
            }
            acc / norm
        })
        .collect()
}

/// The natural cubic spline's second derivatives through (i, y_i), by a whole Thomas solve.
pub fn second_derivatives(y: &[f64]) -> Vec<f64> {
    let n = y.len();
    let mut m = vec![0.0; n];
    if n < 3 {
        return m;
    }
    let (mut c, mut d) = (vec![0.0; n], vec![0.0; n]);
    for j in 1..n - 1 {
        let r = 6.0 * (y[j + 1] - 2.0 * y[j] + y[j - 1]);
        let denom = 4.0 - c[j - 1];
        c[j] = 1.0 / denom;
        d[j] = (r - d[j - 1]) / denom;
    }
    for j in (1..n - 1).rev() {
        m[j] = d[j] - c[j] * m[j + 1];
    }
    m
}

/// The spline through (i, y_i) with second derivatives `m`, at u (clamped to the knots).
pub fn spline(y: &[f64], m: &[f64], u: f64) -> f64 {
    let n = y.len();
    if n == 1 {
        return y[0];
    }
    let uc = u.clamp(0.0, (n - 1) as f64);
    let k = (uc.floor() as usize).min(n - 2);
    let t = uc - k as f64;
    let q = 1.0 - t;
    q * y[k] + t * y[k + 1] + ((q * q * q - q) * m[k] + (t * t * t - t) * m[k + 1]) / 6.0
}

/// Template coordinate of pixel `p` at velocity `v` (km/s).
pub fn coordinate(templates: &Grid, pixels: &Grid, p: usize, v: f64) -> f64 {
    let eta = (v / LIGHT_SPEED).atanh();
    let lambda = pixels.wavelength(p);
    if templates.log {
        (lambda.ln() - eta - templates.start) / templates.step
    } else {
        (lambda * (-eta).exp() - templates.start) / templates.step
    }
}

/// Chebyshev polynomials T_0..T_degree at x.
pub fn chebyshev(x: f64, degree: usize) -> Vec<f64> {
    let mut t = vec![1.0; degree + 1];
    if degree >= 1 {
        t[1] = x;
    }
    for n in 2..=degree {
        t[n] = 2.0 * x * t[n - 1] - t[n - 2];
    }
    t
}

/// min over c of Σ_p w_p (d_p − model_p Σ_j c_j T_j(x_p))², by Householder QR of the weighted
/// design matrix and the residuals summed directly. NaN when no pixel has weight.
#[allow(clippy::needless_range_loop)] // column loops over a row-major matrix read clearest so
pub fn chi2(flux: &[f32], ivar: &[f32], model: &[f64], degree: usize) -> f64 {
    let np = flux.len();
    let cols = degree + 1;
    let mut a: Vec<Vec<f64>> = Vec::new(); // rows of √w m T_j(x)
    let mut rhs = Vec::new();
    let mut kept = Vec::new();
    for p in 0..np {
        let w = f64::from(ivar[p]);
        if w > 0.0 {
            let x = if np > 1 {
                2.0 * p as f64 / (np - 1) as f64 - 1.0
            } else {
                0.0
            };
            let sw = w.sqrt();
            a.push(
                chebyshev(x, degree)
                    .iter()
                    .map(|t| sw * model[p] * t)
                    .collect(),
            );
            rhs.push(sw * f64::from(flux[p]));
            kept.push(p);
        }
    }
    if kept.is_empty() {
        return f64::NAN;
    }
    let rows = a.len();
    // Householder: R in the top of `a`, Qᵀ rhs in `rhs`.
    let mut rank_cols = Vec::new();
    for j in 0..cols.min(rows) {
        let norm: f64 = (j..rows).map(|i| a[i][j] * a[i][j]).sum::<f64>().sqrt();
        if norm == 0.0 {
            continue;
        }
        let alpha = if a[j][j] > 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = (j..rows).map(|i| a[i][j]).collect();
        v[0] -= alpha;
        let vv: f64 = v.iter().map(|x| x * x).sum();
        if vv == 0.0 {
            continue;
        }
        for k in j..cols {
            let dot: f64 = (j..rows).map(|i| v[i - j] * a[i][k]).sum();
            for i in j..rows {
                a[i][k] -= 2.0 * dot / vv * v[i - j];
            }
        }
        let dot: f64 = (j..rows).map(|i| v[i - j] * rhs[i]).sum();
        for i in j..rows {
            rhs[i] -= 2.0 * dot / vv * v[i - j];
        }
        rank_cols.push(j);
    }
    // R c = (Qᵀ rhs)_top, by back substitution (a dropped column's coefficient is 0).
    let mut c = vec![0.0; cols];
    for &j in rank_cols.iter().rev() {
        let mut s = rhs[j];
        for k in j + 1..cols {
            s -= a[j][k] * c[k];
        }
        c[j] = s / a[j][j];
    }
    kept.iter()
        .map(|&p| {
            let x = if np > 1 {
                2.0 * p as f64 / (np - 1) as f64 - 1.0
            } else {
                0.0
            };
            let cont: f64 = chebyshev(x, degree)
                .iter()
                .zip(&c)
                .map(|(t, c)| t * c)
                .sum();
            let r = f64::from(flux[p]) - model[p] * cont;
            f64::from(ivar[p]) * r * r
        })
        .sum()
}

/// The χ² grid of one spectrum (rows x velocities), directly.
pub fn chi2_row(
    splines: &[(Vec<f64>, Vec<f64>)],
    t: &Templates,
    pixels: &Grid,
    velocities: &Velocities,
    flux: &[f32],
    ivar: &[f32],
    degree: usize,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(splines.len() * velocities.count);
    for (y, m) in splines {
        for r in 0..velocities.count {
            let v = velocities.at(r);
            let model: Vec<f64> = (0..pixels.len)
                .map(|p| spline(y, m, coordinate(&t.grid, pixels, p, v)))
                .collect();
            out.push(chi2(flux, ivar, &model, degree));
        }
    }
    out
}

/// Every row's broadened values and second derivatives.
pub fn splines(t: &Templates) -> Vec<(Vec<f64>, Vec<f64>)> {
    (0..t.rows.len())
        .map(|b| {
            let y = broadened(t, b);
            let m = second_derivatives(&y);
            (y, m)
        })
        .collect()
}

/// `count` absorption-line templates on `grid`: a continuum of 1 less `lines` Gaussian lines
/// each (depth 0.05 to 0.75, σ 0.05 to 0.35 Å), from input stream `seed` upward.
pub fn synthetic_templates(count: usize, grid: Grid, lines: usize, seed: u64) -> Vec<f32> {
    let (lo, hi) = (grid.wavelength(0), grid.wavelength(grid.len - 1));
    let mut out = Vec::with_capacity(count * grid.len);
    for t in 0..count {
        let u = uniform(seed + t as u64, 3 * lines);
        let lines: Vec<(f64, f64, f64)> = (0..lines)
            .map(|l| {
                let centre = lo + (hi - lo) * f64::from(u[3 * l]);
                let depth = 0.05 + 0.7 * f64::from(u[3 * l + 1]);
                let sigma = 0.05 + 0.3 * f64::from(u[3 * l + 2]);
                (centre, depth, sigma)
            })
            .collect();
        for i in 0..grid.len {
            let lambda = grid.wavelength(i);
            let mut y = 1.0;
            for &(c, d, s) in &lines {
                let z = (lambda - c) / s;
                if z.abs() < 8.0 {
                    y -= d * (-0.5 * z * z).exp();
                }
            }
            out.push(y.max(0.02) as f32);
        }
    }
    out
}

/// Synthetic spectra and what made them.
pub struct Spectra {
    pub flux: Vec<f32>,
    pub ivar: Vec<f32>,
    /// Each spectrum's template row and velocity.
    pub truth: Vec<(usize, f64)>,
}

/// `n` spectra on `pixels`: spectrum s is row s % B at a velocity drawn from the middle 80 % of
/// `velocities`' span, times a smooth continuum (about 1000 counts), with Gaussian noise of
/// σ = model / `snr`; one pixel in 100 is masked (weight 0, flux NaN).
pub fn synthetic_spectra(
    t: &Templates,
    splines: &[(Vec<f64>, Vec<f64>)],
    pixels: &Grid,
    velocities: &Velocities,
    n: usize,
    snr: f64,
    seed: u64,
) -> Spectra {
    let span = velocities.step * (velocities.count.max(2) - 1) as f64;
    let (mut flux, mut ivar, mut truth) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..n {
        let b = s % splines.len();
        let u = uniform(seed + s as u64, 2 * pixels.len + 8);
        let v = velocities.start + span * (0.1 + 0.8 * f64::from(u[0]));
        let cont = [
            1000.0 * (0.8 + 0.4 * f64::from(u[1])),
            100.0 * (2.0 * f64::from(u[2]) - 1.0),
            50.0 * (2.0 * f64::from(u[3]) - 1.0),
            20.0 * (2.0 * f64::from(u[4]) - 1.0),
        ];
        let (y, m) = &splines[b];
        for p in 0..pixels.len {
            let x = if pixels.len > 1 {
                2.0 * p as f64 / (pixels.len - 1) as f64 - 1.0
            } else {
                0.0
            };
            let c: f64 = chebyshev(x, 3).iter().zip(&cont).map(|(t, c)| t * c).sum();
            let model = spline(y, m, coordinate(&t.grid, pixels, p, v)) * c;
            let sigma = model.abs() / snr + 1.0;
            // Box–Muller from two of the stream's values.
            let (u1, u2) = (f64::from(u[8 + 2 * p]), f64::from(u[9 + 2 * p]));
            let g = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            if (u2 * 1e4) as u64 % 100 == 7 {
                flux.push(f32::NAN);
                ivar.push(0.0);
            } else {
                flux.push((model + sigma * g) as f32);
                ivar.push((1.0 / (sigma * sigma)) as f32);
            }
        }
        truth.push((b, v));
    }
    Spectra { flux, ivar, truth }
}

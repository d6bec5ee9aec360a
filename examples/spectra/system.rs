//! Spectral fitting, written with pptm's general mechanisms: ops of this file's own
//! (`#[pptm::op]` with loops over tables and local arrays), states, and pipelines.
//! examples/spectra.rs runs it; bench/peers_spectra.py computes the same grid with NumPy/SciPy
//! (the reference) and PyTorch.
//!
//! For every observed spectrum s, every template row b and every trial radial velocity v_r, the
//! χ² of the best fit of "template b Doppler-shifted by v_r, times a polynomial continuum of
//! degree D ≤ 10", the continuum marginalised analytically:
//!
//! * **Templates.** T raw templates on a wavelength grid of P knots, log-spaced (uniform in
//!   ln λ) or linear. A template row b is a raw template t and a rotation vsini.
//! * **Rotational broadening** ([`broaden`]): each row is convolved with the rotation kernel
//!   G(x) = 2(1 − ε)√(1 − x²) + (πε/2)(1 − x²), x = Δv / vsini, sampled at the knots within
//!   vsini of the knot and normalised (its edges extend the row's end values).
//! * **Cubic spline** ([`spline_sweep`], [`spline_back`]): the natural cubic spline through the
//!   broadened row, in the knot index as coordinate (ln λ on a log grid, λ on a linear one), by
//!   the Thomas algorithm. Each element runs the two sweeps over the window of knots that
//!   influence it: the system is diagonally dominant (1, 4, 1), so a knot's influence decays by
//!   2 − √3 = 0.268 a knot and [`SWEEP_WINDOW`] = 32 knots reach 5e-19, far below f64 rounding.
//!   Near the ends, where the window reaches the boundary, the sweeps are exactly Thomas's.
//! * **Doppler shift** ([`model_grid`]): pixel p at velocity v_r reads the spline at template
//!   coordinate u = A_p F_r + G_p + H_r (a log grid: u = (ln λ_p − η_r − a) / h; a linear one:
//!   u = (λ_p e^(−η_r) − a) / h; η = atanh(v / c)). The four terms come from the host in f64
//!   (each as an f32 pair, hi + lo): ln λ in f32 would misplace the shift by 0.05 knots.
//! * **χ² with the continuum marginalised**: Chebyshev polynomials T_0..T_D of x ∈ [−1, 1] across
//!   the pixels. The normal equations A_jk = Σ w m² T_j T_k need only the 2D + 1 moments
//!   μ_n = Σ w m² T_n (T_j T_k = (T_(j+k) + T_|j−k|) / 2), and b_j = Σ w d m T_j; accumulated
//!   in f64, Cholesky-factored in f64 (A = L Lᵀ), and χ² = Σ w d² − |L⁻¹ b|².
//! * **Best fit** ([`best_fit`]): per spectrum the lowest χ² over (b, r), with the velocity
//!   refined by the parabola through the grid's three points around it.
//!
//! Every spectrum shares the pixel grid, so the model of each (pixel, row, velocity) is one
//! table, made once per fitter; each χ² reads its column.
//!
//! Work is spread as one element a thread: (row, knot) for the templates, (pixel, row, velocity)
//! for the models, (spectrum, row, velocity) for the χ² grid, a spectrum for the best fit. Each op finds its element's coordinates
//! from an index tensor (0, 1, 2, ...), held in f32: exact up to 2^24 elements, which caps a
//! batch (`Fitter` checks it).

// The ops are in the op subset, which has no `saturating_sub`.
#![allow(clippy::implicit_saturating_sub)]

use pptm::{Buffer, FusionBuilder, Pipeline, Runtime, State, Table, op};

/// The speed of light, km/s.
pub const LIGHT_SPEED: f64 = 299_792.458;
/// Knots each element's Thomas sweeps run over (see the module's notes).
pub const SWEEP_WINDOW: usize = 32;
/// The largest continuum degree (the ops' local arrays hold 2 · 10 + 1 moments).
pub const MAX_DEGREE: u32 = 10;
/// The largest |v| accepted, km/s.
pub const MAX_VELOCITY: f64 = 0.5 * LIGHT_SPEED;
/// The largest vsini accepted, km/s (a kernel of vsini / Δv knots each side per element).
pub const MAX_VSINI: f64 = 1000.0;
/// Index tensors are f32: a batch of the χ² grid holds at most this many elements.
pub const MAX_ELEMENTS: usize = 1 << 24;

/// The forward sweep's coefficients at a knot: c′ and d′ of the Thomas algorithm.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Sweep {
    pub c: f64,
    pub d: f64,
}

/// A knot of a template row's spline: the broadened value and its second derivative.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Knot {
    pub y: f64,
    pub m: f64,
}

/// A spectrum's best fit: its χ², the template row and the velocity (km/s).
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Fit {
    pub chi2: f64,
    pub row: f64,
    pub velocity: f64,
}

/// Template row b = idx / P at knot i = idx % P, broadened: `rows` holds each row's raw
/// template index and vsini (km/s); `start`, `step` give the knots' grid (ln λ of the first knot
/// and the step in ln λ when `log_grid` is 1, else λ and the step in λ); `limb` is ε.
#[op]
pub fn broaden(
    idx: f64,
    templates: Table,
    rows: Table,
    start: f32,
    step: f32,
    log_grid: u32,
    limb: f32,
) -> f64 {
    let e = idx as u32;
    let knots = templates.cols();
    let b = e / knots;
    let i = e % knots;
    let t = rows.at(b, 0) as u32;
    let vsini = rows.at(b, 1);
    // The velocity between two knots here.
    let dv = if log_grid == 1 {
        299_792.458 * step as f64
    } else {
        299_792.458 * step as f64 / (start as f64 + i as f64 * step as f64)
    };
    let reach = if vsini > 0.0 { vsini / dv } else { 0.0 };
    let half = if reach >= 1.0 { reach as u32 } else { 0 };
    let eps = limb as f64;
    let mut acc = 0.0_f64;
    let mut norm = 0.0_f64;
    for j in 0..2 * half + 1 {
        let x = if half == 0 {
            0.0
        } else {
            (j as f64 - half as f64) / reach
        };
        let q = 1.0 - x * x;
        let g = 2.0 * (1.0 - eps) * q.max(0.0).sqrt() + 0.5 * std::f64::consts::PI * eps * q;
        // Knot i + j − half, the row's first knot below it (`at` clamps above).
        let col = if i + j >= half { i + j - half } else { 0 };
        acc += g * templates.at(t, col);
        norm += g;
    }
    acc / norm
}

/// The Thomas algorithm's forward sweep for row b = idx / P at knot i = idx % P, on the natural
/// spline's system M_(j−1) + 4 M_j + M_(j+1) = 6 (y_(j+1) − 2 y_j + y_(j−1)), j = 1..P−2
/// (M_0 = M_(P−1) = 0). It starts [`SWEEP_WINDOW`] knots back, or at the row's start, where it is
/// exact; c′ starts at its limit 2 − √3 there, d′ at 0, whose trace has decayed by 0.268^32.
#[op]
pub fn spline_sweep(idx: f64, y: Table) -> Sweep {
    let e = idx as u32;
    let n = y.cols();
    let b = e / n;
    let i = e % n;
    let mut c = 0.0_f64;
    let mut d = 0.0_f64;
    if n >= 3 && i >= 1 && i + 2 <= n {
        let first = if i > 32 { i - 32 } else { 1 };
        if first > 1 {
            c = 2.0_f64 - 3.0_f64.sqrt();
        }
        for j in first..i + 1 {
            let r = 6.0 * (y.at(b, j + 1) - 2.0 * y.at(b, j) + y.at(b, j - 1));
            let denom = 4.0 - c;
            d = (r - d) / denom;
            c = 1.0 / denom;
        }
    }
    Sweep { c, d }
}

/// The back substitution M_j = d′_j − c′_j M_(j+1) for row b = idx / P at knot i = idx % P, from
/// [`SWEEP_WINDOW`] knots ahead (M = 0 there, its trace decayed by 0.268^32) or from the row's
/// last interior knot, where it is exact. `sweep` holds the rows' [`Sweep`]s; the knot's value
/// comes along, so that the χ² grid reads one table.
#[op]
pub fn spline_back(idx: f64, sweep: Table, y: Table) -> Knot {
    let e = idx as u32;
    let n = y.cols();
    let b = e / n;
    let i = e % n;
    let mut m = 0.0_f64;
    if n >= 3 && i >= 1 && i + 2 <= n {
        let last = if i + 32 < n - 2 { i + 32 } else { n - 2 };
        for k in 0..last - i + 1 {
            let j = last - k;
            m = sweep.at(b, 2 * j + 1) - sweep.at(b, 2 * j) * m;
        }
    }
    Knot { y: y.at(b, i), m }
}

/// The model of pixel p at template row b and velocity r, idx = p (B R) + b R + r: row b's
/// spline at template coordinate u = A_p F_r + G_p + H_r. `knots`: the rows' [`Knot`]s;
/// `coords`: the Doppler shift's terms, one row per pixel (A hi, A lo, G hi, G lo), then one per
/// velocity (F hi, F lo, H hi, H lo). Every spectrum shares the pixel grid, so this table is made
/// once and each χ² reads it: pixel-major, so that a warp's consecutive velocities read
/// consecutive values.
#[op]
pub fn model_grid(idx: f64, knots: Table, coords: Table, pixels: u32) -> f64 {
    let e = idx as u32;
    let velocities = coords.rows() - pixels;
    let grid = knots.rows() * velocities;
    let p = e / grid;
    let b = (e % grid) / velocities;
    let r = e % velocities;
    let points = knots.cols() / 2;
    let last = if points >= 2 { points - 2 } else { 0 };
    let f = coords.at(pixels + r, 0) + coords.at(pixels + r, 1);
    let h = coords.at(pixels + r, 2) + coords.at(pixels + r, 3);
    let u = (coords.at(p, 0) + coords.at(p, 1)) * f + (coords.at(p, 2) + coords.at(p, 3)) + h;
    let uc = u.max(0.0).min(last as f64 + 1.0);
    let cell = uc as u32;
    let k = if cell > last { last } else { cell };
    let t = uc - k as f64;
    let q = 1.0 - t;
    q * knots.at(b, 2 * k)
        + t * knots.at(b, 2 * k + 2)
        + ((q * q * q - q) * knots.at(b, 2 * k + 1) + (t * t * t - t) * knots.at(b, 2 * k + 3))
            / 6.0
}

/// χ² of spectrum s against template row b at velocity r, idx = s (B R) + b R + r, the
/// continuum (degree `degree`, at most 10) marginalised. `flux` and `ivar`: the spectra, a row
/// each, its pixels' fluxes and inverse variances (two tables, so that a batch is uploaded
/// straight from the caller's arrays); `models`: [`model_grid`]'s table (pixels x B R). A pixel
/// of zero weight is left out (its flux may be NaN); a spectrum with none gives NaN.
#[op]
pub fn chi2_grid(idx: f64, flux: Table, ivar: Table, models: Table, degree: u32) -> f64 {
    let e = idx as u32;
    let pixels = models.rows();
    let j = e % models.cols();
    let s = e / models.cols();
    let scale = if pixels > 1 {
        2.0 / (pixels - 1) as f64
    } else {
        0.0
    };
    let mut mom = [0.0_f64; 21];
    let mut rhs = [0.0_f64; 11];
    let mut dd = 0.0_f64;
    for p in 0..pixels {
        let w = ivar.at(s, p);
        if w > 0.0 {
            let d = flux.at(s, p);
            let model = models.at(p, j);
            let x = p as f64 * scale - 1.0;
            let wm = w * model;
            let wmm = wm * model;
            let wdm = wm * d;
            dd += w * d * d;
            mom[0] += wmm;
            rhs[0] += wdm;
            mom[1] += wmm * x;
            rhs[1] += wdm * x;
            let mut before = 1.0_f64;
            let mut now = x;
            for n in 2..21 {
                let next = 2.0 * x * now - before;
                before = now;
                now = next;
                mom[n] += wmm * next;
                if n < 11 {
                    rhs[n] += wdm * next;
                }
            }
        }
    }
    let nb = if degree < 10 { degree + 1 } else { 11 };
    // A = L Lᵀ in the lower triangle of `a` (row-major, 11 x 11). A column whose pivot has
    // vanished (a continuum term the weights cannot see) is dropped.
    let mut a = [0.0_f64; 121];
    for j in 0..nb {
        for k in 0..j + 1 {
            a[11 * j + k] = 0.5 * (mom[j + k] + mom[j - k]);
        }
    }
    for j in 0..nb {
        let diagonal = a[12 * j];
        let mut pivot = diagonal;
        for k in 0..j {
            pivot -= a[11 * j + k] * a[11 * j + k];
        }
        let l = if pivot > 1e-13 * diagonal {
            pivot.sqrt()
        } else {
            0.0
        };
        a[12 * j] = l;
        for i in j + 1..nb {
            let mut v = a[11 * i + j];
            for k in 0..j {
                v -= a[11 * i + k] * a[11 * j + k];
            }
            a[11 * i + j] = if l > 0.0 { v / l } else { 0.0 };
        }
    }
    // bᵀ A⁻¹ b = |z|², z = L⁻¹ b.
    let mut z = [0.0_f64; 11];
    let mut fit = 0.0_f64;
    for j in 0..nb {
        let mut v = rhs[j];
        for k in 0..j {
            v -= a[11 * j + k] * z[k];
        }
        z[j] = if a[12 * j] > 0.0 { v / a[12 * j] } else { 0.0 };
        fit += z[j] * z[j];
    }
    if mom[0] > 0.0 { dd - fit } else { f64::NAN }
}

/// Spectrum idx's best fit over its row of the χ² grid (B x R values, velocity fastest): the
/// lowest χ² (NaN left out; the first of equals), its template row, and the velocity
/// `start + r step`, refined by the parabola through its neighbours in r where both exist and
/// it opens upward.
#[op]
pub fn best_fit(idx: f64, chi2: Table, start: f32, step: f32, velocities: u32) -> Fit {
    let s = idx as u32;
    let mut at: u32 = 0;
    let mut lowest = f64::INFINITY;
    for c in 0..chi2.cols() {
        let v = chi2.at(s, c);
        if v < lowest {
            lowest = v;
            at = c;
        }
    }
    let r = at % velocities;
    let mut velocity = start as f64 + r as f64 * step as f64;
    if r > 0 && r + 1 < velocities && lowest < f64::INFINITY {
        let below = chi2.at(s, at - 1);
        let above = chi2.at(s, at + 1);
        let curve = below - 2.0 * lowest + above;
        if curve > 0.0 {
            velocity += 0.5 * (below - above) / curve * step as f64;
        }
    }
    Fit {
        chi2: if lowest < f64::INFINITY {
            lowest
        } else {
            f64::NAN
        },
        row: (at / velocities) as f64,
        velocity,
    }
}

/// The rows' broadened templates, over (row, knot).
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct Broadening {
    #[stage(1)]
    taps: Broaden,
}

/// The spline's forward sweeps, over (row, knot).
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct ForwardSweep {
    #[stage(1)]
    sweep: SplineSweep,
}

/// The spline's second derivatives, over (row, knot).
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct SecondDerivatives {
    #[stage(1)]
    back: SplineBack,
}

/// The models every spectrum is fitted with, over (pixel, row, velocity).
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct Models {
    #[stage(1)]
    model: ModelGrid,
}

/// The χ² grid, over (spectrum, row, velocity).
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct ChiSquares {
    #[stage(1)]
    fit: Chi2Grid,
}

/// Each spectrum's best fit.
#[derive(FusionBuilder)]
#[fusion(domain = "spectra")]
pub struct BestFits {
    #[stage(1)]
    best: BestFit,
}

/// A wavelength grid: knots or pixels at `start + i step`, in ln λ (`log`) or in λ (Å).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub log: bool,
    pub start: f64,
    pub step: f64,
    pub len: usize,
}

impl Grid {
    /// The wavelength (Å) of point i.
    pub fn wavelength(&self, i: usize) -> f64 {
        let x = self.start + i as f64 * self.step;
        if self.log { x.exp() } else { x }
    }
}

/// The templates: `fluxes` holds `count` raw templates of `grid.len` knots each, row-major;
/// each of `rows` is (raw template, vsini in km/s); `limb` is the limb darkening ε.
#[derive(Debug, Clone)]
pub struct Templates {
    pub grid: Grid,
    pub count: usize,
    pub fluxes: Vec<f32>,
    pub rows: Vec<(usize, f64)>,
    pub limb: f64,
}

/// A uniform grid of trial velocities, km/s: `start + r step`, r < `count`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Velocities {
    pub start: f64,
    pub step: f64,
    pub count: usize,
}

impl Velocities {
    pub fn at(&self, r: usize) -> f64 {
        self.start + r as f64 * self.step
    }
}

fn bad(reason: String) -> pptm::Error {
    pptm::Error::BadArguments {
        chain: "spectra",
        reason,
    }
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// An f64 as an f32 pair whose sum is it to about 2^-48 relative.
fn split(x: f64) -> [f32; 2] {
    let hi = x as f32;
    [hi, (x - f64::from(hi)) as f32]
}

/// The Doppler shift's terms: pixel p at velocity r reads template coordinate
/// u = A_p F_r + G_p + H_r; [`model_grid`]'s `coords` table, one row of (hi, lo, hi, lo) per pixel
/// and then per velocity.
pub fn shift_terms(templates: &Grid, pixels: &Grid, velocities: &Velocities) -> Vec<f32> {
    let mut out = Vec::with_capacity(4 * (pixels.len + velocities.count));
    let mut push = |x: f64, y: f64| {
        out.extend(split(x));
        out.extend(split(y));
    };
    for p in 0..pixels.len {
        let lambda = pixels.wavelength(p);
        if templates.log {
            push(0.0, (lambda.ln() - templates.start) / templates.step);
        } else {
            push(lambda / templates.step, -templates.start / templates.step);
        }
    }
    for r in 0..velocities.count {
        let eta = (velocities.at(r) / LIGHT_SPEED).atanh();
        if templates.log {
            push(0.0, -eta / templates.step);
        } else {
            push((-eta).exp(), 0.0);
        }
    }
    out
}

/// The templates' rows, broadened and splined on a runtime: B x 2P values, each knot's (y, M).
pub fn prepare(rt: &Runtime, t: &Templates) -> pptm::Result<Buffer<f32>> {
    let (knots, rows) = (t.grid.len, t.rows.len());
    if knots < 2 || t.count == 0 || rows == 0 {
        return Err(bad(format!(
            "{} templates of {knots} knots in {rows} rows: at least one template of 2 knots and one row",
            t.count
        )));
    }
    if t.fluxes.len() != t.count * knots {
        return Err(bad(format!(
            "{} template values for {} templates of {knots} knots",
            t.fluxes.len(),
            t.count
        )));
    }
    if rows * knots > MAX_ELEMENTS {
        return Err(bad(format!(
            "{rows} rows of {knots} knots: at most {MAX_ELEMENTS} knots in all"
        )));
    }
    for (b, &(raw, vsini)) in t.rows.iter().enumerate() {
        if raw >= t.count || !(0.0..=MAX_VSINI).contains(&vsini) {
            return Err(bad(format!(
                "row {b}: template {raw} of {}, vsini {vsini} km/s (0 to {MAX_VSINI})",
                t.count
            )));
        }
    }
    if !(0.0..=1.0).contains(&t.limb) || t.grid.step.is_nan() || t.grid.step <= 0.0 {
        return Err(bad(format!(
            "limb darkening {} (0 to 1), grid step {}",
            t.limb, t.grid.step
        )));
    }
    let up = |v: &[f32]| rt.upload(v);
    let poisoned = |len: usize| rt.upload(&vec![f32::NAN; len]);
    let idx = up(&iota(rows * knots))?;
    let raw = up(&t.fluxes)?;
    let table: Vec<f32> = t
        .rows
        .iter()
        .flat_map(|&(raw, vsini)| [raw as f32, vsini as f32])
        .collect();
    let row_table = up(&table)?;
    let mut broadened = poisoned(rows * knots)?;
    let mut sweeps = poisoned(2 * rows * knots)?;
    let mut out = poisoned(2 * rows * knots)?;
    let mut p = rt.pipeline();
    let (idx, raw, row_table) = (p.input(&idx), p.input(&raw), p.input(&row_table));
    let broadened = p.output(&mut broadened);
    let sweeps = p.output(&mut sweeps);
    let knots_out = p.output(&mut out);
    Broadening::push(
        &mut p,
        idx,
        raw,
        row_table,
        t.grid.start as f32,
        t.grid.step as f32,
        u32::from(t.grid.log),
        t.limb as f32,
        broadened,
        t.count,
        knots,
        rows,
        2,
    )?;
    ForwardSweep::push(&mut p, idx, broadened, sweeps, rows, knots)?;
    SecondDerivatives::push(
        &mut p,
        idx,
        sweeps,
        broadened,
        knots_out,
        rows,
        2 * knots,
        rows,
        knots,
    )?;
    p.wait()?;
    Ok(out)
}

/// The χ² grid and best fits of batches of spectra against prepared templates, on one runtime.
pub struct Fitter {
    rows: usize,
    pixels: usize,
    velocities: Velocities,
    degree: u32,
    batch: usize,
    knots: Buffer<f32>,
    /// [`model_grid`]'s table, made once: pixels x (rows x velocities).
    models: Buffer<f32>,
    idx_grid: Buffer<f32>,
    idx_spectra: Buffer<f32>,
    /// The batch's spectra, a row each: fluxes and inverse variances.
    flux: Buffer<f32>,
    ivar: Buffer<f32>,
    /// The number of spectra of the loaded batch (the rest of the rows have zero weight).
    loaded: usize,
    chi2: Buffer<f32>,
    fits: Buffer<f32>,
}

/// One batch's results: the χ² grid (spectrum, row, velocity) and each spectrum's best fit.
pub struct BatchFit {
    pub chi2: Vec<f32>,
    pub fits: Vec<Fit>,
}

impl Fitter {
    /// A fitter of batches of up to `batch` spectra on the `pixels` grid against `knots` (from
    /// [`prepare`] of `templates`, on `rt`). It computes the models every spectrum is fitted
    /// with (one item).
    pub fn new(
        rt: &Runtime,
        templates: &Templates,
        knots: Buffer<f32>,
        pixels: &Grid,
        velocities: Velocities,
        degree: u32,
        batch: usize,
    ) -> pptm::Result<Fitter> {
        let (rows, points) = (templates.rows.len(), templates.grid.len);
        if knots.len() != 2 * rows * points {
            return Err(bad(format!(
                "{} knot values for {rows} rows of {points} knots",
                knots.len()
            )));
        }
        if degree > MAX_DEGREE {
            return Err(bad(format!(
                "continuum degree {degree}: at most {MAX_DEGREE}"
            )));
        }
        if velocities.count == 0
            || (0..velocities.count).any(|r| {
                let v = velocities.at(r).abs();
                v.is_nan() || v > MAX_VELOCITY
            })
        {
            return Err(bad(format!(
                "{} velocities from {} km/s by {} km/s: at least one, each within ±{MAX_VELOCITY} km/s",
                velocities.count, velocities.start, velocities.step
            )));
        }
        if pixels.len == 0 || pixels.step.is_nan() || pixels.step <= 0.0 || batch == 0 {
            return Err(bad(format!(
                "{} pixels of step {}, batches of {batch}: at least one pixel and one spectrum",
                pixels.len, pixels.step
            )));
        }
        let grid = batch * rows * velocities.count;
        if grid > MAX_ELEMENTS {
            return Err(bad(format!(
                "a batch of {batch} spectra x {rows} rows x {} velocities is {grid} χ² values: at most {MAX_ELEMENTS}",
                velocities.count
            )));
        }
        let models_len = pixels.len * rows * velocities.count;
        if models_len > MAX_ELEMENTS {
            return Err(bad(format!(
                "{} pixels x {rows} rows x {} velocities is {models_len} models: at most {MAX_ELEMENTS}",
                pixels.len, velocities.count
            )));
        }
        let up = |v: &[f32]| rt.upload(v);
        let poisoned = |len: usize| rt.upload(&vec![f32::NAN; len]);
        let coords = up(&shift_terms(&templates.grid, pixels, &velocities))?;
        let mut models = poisoned(models_len)?;
        Models::submit(
            rt,
            &up(&iota(models_len))?,
            &knots,
            &coords,
            pixels.len as u32,
            &mut models,
            rows,
            2 * points,
            pixels.len + velocities.count,
            4,
        )?
        .wait()?;
        Fitter::with_batch_buffers(
            rt,
            (rows, pixels.len, velocities, degree, batch),
            knots,
            models,
        )
    }

    /// A fitter of the same templates, grid and batch size with batch buffers of its own, so
    /// that one loads a batch while the other runs ([`Fitter::start`]). The knots and models are
    /// copied on the device, not recomputed.
    pub fn twin(&self, rt: &Runtime) -> pptm::Result<Fitter> {
        let copy = |b: &Buffer<f32>| -> pptm::Result<Buffer<f32>> {
            let mut c = rt.upload(&vec![f32::NAN; b.len()])?;
            c.copy_from(b)?;
            Ok(c)
        };
        Fitter::with_batch_buffers(
            rt,
            (
                self.rows,
                self.pixels,
                self.velocities,
                self.degree,
                self.batch,
            ),
            copy(&self.knots)?,
            copy(&self.models)?,
        )
    }

    /// A fitter over made knots and models (checked by the caller), its batch buffers new: the
    /// spectra of zero weight, the outputs poisoned.
    fn with_batch_buffers(
        rt: &Runtime,
        (rows, pixels, velocities, degree, batch): (usize, usize, Velocities, u32, usize),
        knots: Buffer<f32>,
        models: Buffer<f32>,
    ) -> pptm::Result<Fitter> {
        let up = |v: &[f32]| rt.upload(v);
        let poisoned = |len: usize| rt.upload(&vec![f32::NAN; len]);
        let grid = batch * rows * velocities.count;
        Ok(Fitter {
            rows,
            pixels,
            velocities,
            degree,
            batch,
            knots,
            models,
            idx_grid: up(&iota(grid))?,
            idx_spectra: up(&iota(batch))?,
            flux: poisoned(batch * pixels)?,
            ivar: up(&vec![0.0; batch * pixels])?,
            loaded: 0,
            chi2: poisoned(grid)?,
            fits: poisoned(3 * batch)?,
        })
    }

    /// Loads a batch: `flux` and `ivar`, each `pixels` values a spectrum, for up to
    /// [`Fitter::batch`] spectra. The batch's other places get spectra of zero weight, whose
    /// χ² are NaN (and cost little: their pixels are skipped). Returns the number of spectra.
    pub fn load(&mut self, flux: &[f32], ivar: &[f32]) -> pptm::Result<usize> {
        let n = flux.len() / self.pixels;
        if flux.len() != ivar.len() || !flux.len().is_multiple_of(self.pixels) || n > self.batch {
            return Err(bad(format!(
                "{} flux and {} inverse-variance values: the same number, a whole number of {}-pixel spectra, at most {}",
                flux.len(),
                ivar.len(),
                self.pixels,
                self.batch
            )));
        }
        // Straight from the caller's arrays; the rows past the batch's spectra get zero weight
        // (once: a later batch as long leaves them so).
        self.flux.write_at(0, flux)?;
        self.ivar.write_at(0, ivar)?;
        if n < self.loaded {
            let zeros = vec![0.0; (self.loaded - n) * self.pixels];
            self.ivar.write_at(ivar.len(), &zeros)?;
        }
        self.loaded = n;
        Ok(n)
    }

    /// The χ² grid and best fits of the loaded batch, as one pipeline (one submission): the
    /// grid, then the fits.
    pub fn run(&mut self, rt: &Runtime) -> pptm::Result<()> {
        self.start(rt)?.wait()?;
        Ok(())
    }

    /// [`Fitter::run`] without waiting: the pipeline is dispatched and returned, so the host can
    /// load another fitter's batch while this one runs. Wait on it before reading the results.
    pub fn start<'a>(&'a mut self, rt: &'a Runtime) -> pptm::Result<Pipeline<'a>> {
        let (rows, r) = (self.rows, self.velocities.count);
        let mut p = rt.pipeline();
        let idx_grid = p.input(&self.idx_grid);
        let idx_spectra = p.input(&self.idx_spectra);
        let (flux, ivar) = (p.input(&self.flux), p.input(&self.ivar));
        let models = p.input(&self.models);
        let chi2 = p.output(&mut self.chi2);
        let fits = p.output(&mut self.fits);
        ChiSquares::push(
            &mut p,
            idx_grid,
            flux,
            ivar,
            models,
            self.degree,
            chi2,
            self.batch,
            self.pixels,
            self.batch,
            self.pixels,
            self.pixels,
            rows * r,
        )?;
        BestFits::push(
            &mut p,
            idx_spectra,
            chi2,
            self.velocities.start as f32,
            self.velocities.step as f32,
            r as u32,
            fits,
            self.batch,
            rows * r,
        )?;
        p.flush()?;
        Ok(p)
    }

    /// The prepared template rows: each knot's (y, M), row by row.
    pub fn knots(&self) -> pptm::Result<Vec<f32>> {
        self.knots.to_vec()
    }

    /// The last run's results for its first `spectra` spectra.
    pub fn results(&self, spectra: usize) -> pptm::Result<BatchFit> {
        let n = spectra.min(self.batch);
        let mut chi2 = self.chi2.to_vec()?;
        chi2.truncate(n * self.rows * self.velocities.count);
        let mut fits = Fit::unflatten(&self.fits.to_vec()?)?;
        fits.truncate(n);
        Ok(BatchFit { chi2, fits })
    }
}

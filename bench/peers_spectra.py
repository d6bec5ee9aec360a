#!/usr/bin/env python3
"""Peers and float64 reference of examples/spectra.rs: χ² grids of template fits with a marginalised
polynomial continuum.

    python3 bench/peers_spectra.py --check DIR [--spectra 16] [--out FILE] [--no-scipy]
    python3 bench/peers_spectra.py --torch DIR [--batch 256] [--variants eager,compile] [--quick]
                                   [--out FILE]
    python3 bench/peers_spectra.py --cpu-smoke [--no-scipy]

DIR is a case written by `cargo run --release --example spectra -- --write-case DIR`: case.json and
little-endian float32 files (row-major): templates.f32 (T x P raw template fluxes at the knots),
flux.f32 and ivar.f32 (S x Np; a pixel of ivar 0 is masked and its flux may be NaN), pptm's
chi2.f32 (S x B x R, index (s B + b) R + r), best.f32 (S x 3: χ², row b*, velocity) and, where
written, knots.f32 (B x 2P: the broadened row and its spline second derivatives, interleaved).

The model, in float64 in the reference (C = case.json's light_speed, km/s):

  * knots: a log grid has ln λ_i = a + i h, a linear one λ_i = a + i h (i < P).
  * rotational broadening of template row b = (raw template t, vsini, km/s) at knot i: the velocity
    a knot dv_i = C h (log) or C h / (a + i h) (linear); hw = vsini / dv_i (0 if vsini = 0);
    K = floor(hw) if hw >= 1 else 0; taps k = −K..K with x = k / hw (K = 0: the single tap 0),
    g_k = 2(1 − ε) √max(0, 1 − x²) + (π ε / 2)(1 − x²); yb_i = Σ_k g_k y_t[clamp(i + k, 0, P − 1)]
    / Σ_k g_k.
  * spline: the natural cubic spline through (i, yb_i), the knot index as coordinate; second
    derivatives M_0 = M_(P−1) = 0, M_(i−1) + 4 M_i + M_(i+1) = 6 (yb_(i+1) − 2 yb_i + yb_(i−1))
    (P < 3: M = 0). At u: uc = clip(u, 0, P − 1), k = min(floor uc, P − 2), t = uc − k,
    S(u) = (1 − t) yb_k + t yb_(k+1) + ((1 − t)³ − (1 − t)) M_k / 6 + (t³ − t) M_(k+1) / 6
    (P = 1: yb_0).
  * Doppler shift: v_r = v0 + r dv, η_r = atanh(v_r / C); pixel p has λ_p = l0 + p dl and reads the
    template at u = (ln λ_p − η_r − a) / h (log grid) or u = (λ_p e^(−η_r) − a) / h (linear).
  * continuum: Chebyshev T_0..T_D of x_p = 2p / (Np − 1) − 1 (x = 0 when Np = 1).
  * χ²(s, b, r) = min over c of Σ_p w_p (d_p − S_b(u_pr) Σ_j c_j T_j(x_p))², w = ivar, d = flux,
    the pixels of w = 0 left out; NaN when no pixel is left. The reference solves each fit by
    np.linalg.lstsq on the weighted design matrix √w S T_j (an SVD solve) and sums the weighted
    squared residuals directly.
  * best fit of a spectrum: the first lowest χ² over the flat index b R + r (NaN skipped); its
    velocity v0 + r* dv, refined where 0 < r* < R − 1 and denom = χ_(r*−1) − 2 χ_(r*) + χ_(r*+1) > 0
    (same row) to v0 + (r* + ½ (χ_(r*−1) − χ_(r*+1)) / denom) dv. A spectrum of NaNs only:
    (NaN, 0, v0).

SciPy, where importable (and not --no-scipy), gives the spline's second derivatives
(scipy.interpolate.CubicSpline, natural); otherwise a Thomas solve vectorised across the rows
computes the same. The spline is evaluated by the formula above either way (so clamping matches).

--check recomputes the grid of the first --spectra spectra and prints the largest |pptm − ref| /
|ref| over them (NaN must meet NaN), the best-fit table's differences and the knots' (relative to
the row's largest |yb| and |M|); exit status 1 when the grid's exceeds 1e-3. It times the
reference on one CPU process, a spectrum at a time (the model S_b(u) on the grid and the B x R
fits; the templates' preparation is done once per case and timed apart).

--torch times PyTorch on CUDA over every spectrum of the case, in batches of --batch (the last
padded with spectra of zero weight; a batch whose largest tensor would pass ~2 GB is made
smaller). The templates' preparation (broadening, spline) is the NumPy reference's, once per case,
untimed (its time is printed). Everything else is in the timed per-batch function: the model S_b(u)
on (B, R, Np) (u in float64 from per-pixel and per-velocity terms: float32 ln λ would misplace the
shift by ~0.05 knots; the cubic in the work precision), as every spectrum shares the pixel grid
(not repeated per spectrum); the moments μ_n = Σ_p w S² T_n (n ≤ 2D) and b_j = Σ_p w d S T_j as
GEMMs over the pixels (TF32 off); A_jk = (μ_(j+k) + μ_|j−k|) / 2 and the solve in float64
(Jacobi-scaled Cholesky, a 1e-12 ridge on the unit diagonal; an unseen column gets c = 0);
Σ w d² in float64; χ²; the best fits. Variants:

  * eager, compile                -- float32 per-pixel work; χ² summed from the residuals
                                     w (d − S Σ c_j T_j)² over (batch, B, R, Np) in float32 (χ² is
                                     stationary in c, so the float32 moments cost ~nothing)
  * eager-normal, compile-normal  -- float32 per-pixel work; χ² = Σ w d² − bᵀc in float64: one
                                     pass fewer, but the cancellation (Σ w d² / χ² ~ (S/N)²) turns
                                     the moments' float32 rounding into ~1e-3 of χ²
  * eager-f64, compile-f64        -- the normal form with the per-pixel work in float64 (GEMMs on
                                     the FP64 units)
  * eager-lstsq                   -- as the seed's GPU port fits: each fit's weighted design matrix
                                     (batch, B R, Np, D + 1) in float32, torch.linalg.lstsq
                                     (batched QR), χ² from the residuals; batches cut to keep the
                                     design matrices under ~2 GB
compile is torch.compile of the per-batch function (default mode). Each variant is timed over the
whole case after two warm-up passes (compilation excluded), with CUDA events and the host clock
around synchronised work, 10 repetitions (3 with --quick); median and p99; spectra per second =
S / median. Its grid is compared with pptm's chi2.f32 (largest relative difference).

--out FILE appends one JSON object a line: {"source": "peers", "chain": "spectra", "variant",
"spectra", "templates" (B rows), "velocities", "pixels", "degree", "median_s", "p99_s",
"spectra_per_s", "max_rel_vs_pptm", ...}; for "numpy" (from --check) the times are a spectrum's.

--cpu-smoke needs no CUDA and no case: it synthesises small cases (log and linear grids, degrees
0, 1, 3, 10, masked pixels, a spectrum with no weight), checks SciPy's spline against the Thomas
solve, and PyTorch (if importable) on the CPU against the reference: float64 to 1e-6 relative,
float32 (residual form) to 1e-4. Then it writes one case to a temporary directory (PyTorch's float64 grid standing in for
pptm's) and runs --check and the --torch variants (CPU, eager and compile) on it.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from numpy.polynomial import chebyshev as npcheb

BAR = 1e-3  # --check: pptm's χ² against the float64 reference
RIDGE = 1e-12  # added to the Jacobi-scaled normal matrix's unit diagonal
LARGEST_TENSOR = 2e9  # bytes: a batch's largest tensor stays under this
# variant: (torch.compile?, χ² form, per-pixel precision)
VARIANTS = {
    "eager": (False, "residual", "float32"),
    "compile": (True, "residual", "float32"),
    "eager-normal": (False, "normal", "float32"),
    "compile-normal": (True, "normal", "float32"),
    "eager-f64": (False, "normal", "float64"),
    "compile-f64": (True, "normal", "float64"),
    "eager-lstsq": (False, "lstsq", "float32"),
}


# ------------------------------------------------------------------------------------------------
# The case

class Case:
    """case.json's fields, and the arrays read so far (float32 as stored)."""

    def __init__(self, meta, templates, flux, ivar):
        self.meta = meta
        self.log = meta["template_grid"] == "log"
        if meta["template_grid"] not in ("log", "linear"):
            raise ValueError(f"template_grid {meta['template_grid']!r}: log or linear")
        self.T, self.P = int(meta["templates"]), int(meta["knots"])
        self.a, self.h = float(meta["template_start"]), float(meta["template_step"])
        self.rows = [(int(t), float(v)) for t, v in meta["rows"]]
        self.B = len(self.rows)
        self.eps = float(meta["limb"])
        self.Np = int(meta["pixels"])
        self.l0, self.dl = float(meta["obs_start"]), float(meta["obs_step"])
        self.S = int(meta["spectra"])
        self.v0, self.dv = float(meta["velocity_start"]), float(meta["velocity_step"])
        self.R = int(meta["velocities"])
        self.D = int(meta["degree"])
        self.C = float(meta["light_speed"])
        self.templates, self.flux, self.ivar = templates, flux, ivar

    def describe(self):
        return (f"{self.S} spectra of {self.Np} pixels ({self.l0:.1f} Å by {self.dl:g}); {self.B} "
                f"template rows of {self.T} templates on a {'log' if self.log else 'linear'} grid "
                f"of {self.P} knots; {self.R} velocities from {self.v0:g} km/s by {self.dv:g}; "
                f"continuum degree {self.D}")


def read_f32(path, count=None, shape=None):
    """A little-endian float32 file, or its first `count` values; None if it is absent."""
    if not os.path.exists(path):
        return None
    x = np.fromfile(path, dtype="<f4", count=-1 if count is None else count)
    return x if shape is None else x.reshape(shape)


def load_case(d, spectra=None):
    """The case in directory d, with the first `spectra` spectra (all if None)."""
    with open(os.path.join(d, "case.json")) as f:
        meta = json.load(f)
    n = int(meta["spectra"]) if spectra is None else min(spectra, int(meta["spectra"]))
    T, P, Np = int(meta["templates"]), int(meta["knots"]), int(meta["pixels"])
    templates = read_f32(os.path.join(d, "templates.f32"), T * P, (T, P))
    flux = read_f32(os.path.join(d, "flux.f32"), n * Np, (n, Np))
    ivar = read_f32(os.path.join(d, "ivar.f32"), n * Np, (n, Np))
    if templates is None or flux is None or ivar is None:
        raise FileNotFoundError(f"{d}: templates.f32, flux.f32 and ivar.f32 are needed")
    return Case(meta, templates, flux, ivar)


def load_results(d, case, spectra):
    """pptm's chi2 (n, B, R), best (n, 3) and knots (B, 2P) for the first `spectra` spectra, each
    None where its file is absent."""
    B, R, P = case.B, case.R, case.P
    chi2 = read_f32(os.path.join(d, "chi2.f32"), spectra * B * R)
    best = read_f32(os.path.join(d, "best.f32"), spectra * 3)
    knots = read_f32(os.path.join(d, "knots.f32"), B * 2 * P)
    return (None if chi2 is None else chi2.reshape(spectra, B, R),
            None if best is None else best.reshape(spectra, 3),
            None if knots is None else knots.reshape(B, 2 * P))


def write_case(d, case, chi2, best, knots):
    """Writes a case as examples/spectra.rs --write-case does (used by --cpu-smoke)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case.meta, f)
    for name, x in (("templates", case.templates), ("flux", case.flux), ("ivar", case.ivar),
                    ("chi2", chi2), ("best", best), ("knots", knots)):
        np.ascontiguousarray(x, dtype="<f4").tofile(os.path.join(d, name + ".f32"))


# ------------------------------------------------------------------------------------------------
# The float64 reference (NumPy; SciPy optional)

def import_scipy(disabled):
    """scipy.interpolate, or None where it is disabled or not importable."""
    if disabled:
        return None
    try:
        import scipy.interpolate
        return scipy.interpolate
    except ImportError:
        return None


def broaden(case):
    """Every template row rotationally broadened: (B, P) float64."""
    P, h = case.P, case.h
    i = np.arange(P)
    # The velocity between two knots at knot i.
    dv = np.full(P, case.C * h) if case.log else case.C * h / (case.a + i * h)
    out = np.empty((case.B, P))
    for b, (t, vsini) in enumerate(case.rows):
        y = case.templates[t].astype(np.float64)
        hw = vsini / dv if vsini > 0 else np.zeros(P)
        K = np.where(hw >= 1, np.floor(hw), 0).astype(np.int64)
        safe_hw = np.where(K > 0, hw, 1.0)
        acc, norm = np.zeros(P), np.zeros(P)
        # Taps k = −K_i..K_i at knot i: loop over k up to the largest K, masking the others.
        for k in range(-int(K.max()), int(K.max()) + 1):
            x = np.where(K > 0, k / safe_hw, 0.0)
            g = (2 * (1 - case.eps) * np.sqrt(np.maximum(0.0, 1 - x * x))
                 + 0.5 * math.pi * case.eps * (1 - x * x))
            g = np.where(abs(k) <= K, g, 0.0)
            acc += g * y[np.clip(i + k, 0, P - 1)]
            norm += g
        out[b] = acc / norm
    return out


def second_derivatives(yb, interp=None):
    """The natural spline's second derivatives at the knots, (B, P): by SciPy's CubicSpline where
    `interp` (scipy.interpolate) is given, else by the Thomas algorithm, vectorised across rows."""
    B, P = yb.shape
    if P < 3:
        return np.zeros_like(yb)
    if interp is not None:
        knots = np.arange(P, dtype=np.float64)
        return interp.CubicSpline(knots, yb, axis=1, bc_type="natural")(knots, 2)
    # Interior rows j = 1..P−2: M_(j−1) + 4 M_j + M_(j+1) = r_j, with M_0 = M_(P−1) = 0. The
    # matrix is the same for every row, so c′ is a vector and d′ a (B, P − 2) array.
    rhs = 6 * (yb[:, 2:] - 2 * yb[:, 1:-1] + yb[:, :-2])
    n = P - 2
    c = np.empty(n)
    d = np.empty((B, n))
    c_prev, d_prev = 0.0, np.zeros(B)
    for j in range(n):
        denom = 4.0 - c_prev
        c[j] = c_prev = 1.0 / denom
        d[:, j] = d_prev = (rhs[:, j] - d_prev) / denom
    m = np.zeros((B, P))
    for j in range(n - 1, -1, -1):
        m[:, j + 1] = d[:, j] - c[j] * m[:, j + 2]
    return m


def prepare(case, interp=None):
    """The templates' preparation, once per case: (yb, M), each (B, P) float64."""
    yb = broaden(case)
    return yb, second_derivatives(yb, interp)


def coordinates(case):
    """Template coordinate u of pixel p at velocity r: (R, Np) float64."""
    v = case.v0 + np.arange(case.R) * case.dv
    eta = np.arctanh(v / case.C)
    lam = case.l0 + np.arange(case.Np) * case.dl
    if case.log:
        return (np.log(lam)[None, :] - eta[:, None] - case.a) / case.h
    return (lam[None, :] * np.exp(-eta)[:, None] - case.a) / case.h


def spline_eval(yb, m, u):
    """The rows' splines at u (any shape): (B, *u.shape)."""
    P = yb.shape[1]
    if P == 1:
        return np.broadcast_to(yb[:, :1].reshape((-1,) + (1,) * u.ndim), (yb.shape[0],) + u.shape)
    uc = np.clip(u, 0.0, P - 1.0)
    k = np.minimum(np.floor(uc).astype(np.int64), P - 2)
    t = uc - k
    q = 1.0 - t
    return (q * yb[:, k] + t * yb[:, k + 1]
            + ((q ** 3 - q) * m[:, k] + (t ** 3 - t) * m[:, k + 1]) / 6.0)


def pixel_x(n):
    """The continuum's abscissa x_p in [−1, 1]."""
    return 2.0 * np.arange(n) / (n - 1) - 1.0 if n > 1 else np.zeros(1)


def reference_spectrum(yb, m, u, vander, flux, ivar):
    """One spectrum's χ² grid (B, R) in float64: the model on the grid, then a least-squares fit
    per (b, r), its weighted squared residuals summed directly."""
    model = spline_eval(yb, m, u)  # (B, R, Np)
    B, R = model.shape[:2]
    out = np.full((B, R), np.nan)
    live = ivar > 0
    if not live.any():
        return out
    w = ivar[live].astype(np.float64)
    d = flux[live].astype(np.float64)
    sw = np.sqrt(w)
    V = vander[live]
    model = model[:, :, live]
    for b in range(B):
        for r in range(R):
            s = model[b, r]
            c = np.linalg.lstsq((sw * s)[:, None] * V, sw * d, rcond=None)[0]
            resid = d - s * (V @ c)
            out[b, r] = np.sum(w * resid * resid)
    return out


def best_fits(chi2, v0, dv):
    """Each spectrum's (χ², row, velocity) from its (B, R) grid: (n, 3) float64."""
    n, B, R = chi2.shape
    out = np.empty((n, 3))
    for s in range(n):
        flat = chi2[s].reshape(-1).astype(np.float64)
        finite = np.where(np.isnan(flat), np.inf, flat)
        i = int(np.argmin(finite))  # the first of equals
        if not np.isfinite(finite[i]):
            out[s] = (np.nan, 0.0, v0)
            continue
        r = i % R
        v = v0 + r * dv
        if 0 < r < R - 1:
            below, above = flat[i - 1], flat[i + 1]
            denom = below - 2 * flat[i] + above
            if denom > 0:  # False for NaN
                v = v0 + (r + 0.5 * (below - above) / denom) * dv
        out[s] = (flat[i], i // R, v)
    return out


# ------------------------------------------------------------------------------------------------
# Comparisons

def max_rel(got, want):
    """(largest |got − want| / |want| where want is a number, its flat index, NaN mismatches).
    A NaN on one side only counts as infinitely wrong."""
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    gn, wn = np.isnan(got), np.isnan(want)
    mismatched = int(np.count_nonzero(gn != wn))
    both = ~gn & ~wn
    rel = np.zeros_like(want)
    rel[both] = np.abs(got[both] - want[both]) / np.maximum(np.abs(want[both]), 1e-30)
    rel[gn != wn] = np.inf
    if rel.size == 0:
        return 0.0, 0, 0
    at = int(np.argmax(rel))
    return float(rel[at]), at, mismatched


def best_differences(got, want, dv):
    """pptm's best-fit table against a reference: (largest relative χ² difference, rows that
    differ, largest |Δv| in velocity steps)."""
    rel, _, _ = max_rel(got[:, 0], want[:, 0])
    rows = int(np.count_nonzero(np.round(got[:, 1]) != want[:, 1]))
    same = np.round(got[:, 1]) == want[:, 1]
    dv_steps = float(np.max(np.abs(got[same, 2] - want[same, 2])) / abs(dv)) if same.any() else 0.0
    return rel, rows, dv_steps


def knot_differences(knots, yb, m):
    """pptm's knots (B x 2P, y and M interleaved) against the reference: the largest |Δy| over
    the row's largest |y| and |ΔM| over the row's largest |M| (and over its largest |y|)."""
    ky, km = knots[:, 0::2].astype(np.float64), knots[:, 1::2].astype(np.float64)
    ys = np.maximum(np.abs(yb).max(axis=1, keepdims=True), 1e-30)
    ms = np.maximum(np.abs(m).max(axis=1, keepdims=True), 1e-30)
    nan = np.isnan(ky).any() or np.isnan(km).any()
    dy = np.inf if nan else float((np.abs(ky - yb) / ys).max())
    dm = np.inf if nan else float((np.abs(km - m) / ms).max())
    dm_y = np.inf if nan else float((np.abs(km - m) / ys).max())
    return dy, dm, dm_y


def percentile99(ts):
    ts = sorted(ts)
    return ts[min(len(ts) - 1, len(ts) * 99 // 100)]


def append_json(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def json_row(case, variant, spectra, median_s, p99_s, rate, rel, **extra):
    row = dict(source="peers", chain="spectra", variant=variant, spectra=spectra,
               templates=case.B, velocities=case.R, pixels=case.Np, degree=case.D,
               median_s=median_s, p99_s=p99_s, spectra_per_s=rate, max_rel_vs_pptm=rel)
    row.update(extra)
    return row


# ------------------------------------------------------------------------------------------------
# --check

def reference_grid(case, prep, timings=None):
    """The reference χ² grid of every spectrum loaded in `case`, (n, B, R); each spectrum's
    seconds appended to `timings` if given."""
    yb, m = prep
    u = coordinates(case)
    vander = npcheb.chebvander(pixel_x(case.Np), case.D)
    out = np.empty((case.flux.shape[0], case.B, case.R))
    for s in range(case.flux.shape[0]):
        t0 = time.perf_counter()
        # The coordinates and the Chebyshev table are the case's, like the template
        # preparation; the model on the grid and the fits are the spectrum's.
        out[s] = reference_spectrum(yb, m, u, vander, case.flux[s], case.ivar[s])
        if timings is not None:
            timings.append(time.perf_counter() - t0)
    return out


def run_check(d, spectra, out, no_scipy):
    """--check: returns the exit status (1 when the grid's difference exceeds the bar)."""
    case = load_case(d, spectra)
    n = case.flux.shape[0]
    interp = import_scipy(no_scipy)
    print(f"--check {d}: {case.describe()}; checking the first {n}")
    t0 = time.perf_counter()
    prep = prepare(case, interp)
    prep_s = time.perf_counter() - t0
    print(f"  templates prepared in float64 ({'SciPy CubicSpline' if interp else 'NumPy Thomas'}"
          f" spline) in {prep_s * 1e3:.1f} ms (once per case, not in the rate)")
    timings = []
    ref = reference_grid(case, prep, timings)
    med = statistics.median(timings)
    print(f"  reference χ² grid ({case.B} x {case.R} lstsq fits a spectrum, one CPU process): "
          f"median {med * 1e3:.1f} ms a spectrum (p99 {percentile99(timings) * 1e3:.1f}): "
          f"{1 / med:.2f} spectra/s")
    got, best, knots = load_results(d, case, n)
    status, rel = 0, None
    if got is None:
        print("  chi2.f32: not in the case; nothing to compare")
        status = 1
    else:
        rel, at, mismatched = max_rel(got, ref)
        s, b, r = np.unravel_index(at, ref.shape)
        print(f"  χ² grid, pptm against the reference: largest relative difference {rel:.2e} at "
              f"(s {s}, b {b}, r {r}) over {ref.size} values; NaN placed differently: {mismatched} "
              f"(bar {BAR:.0e})")
        if not rel <= BAR:
            print(f"  FAIL: {rel:.2e} exceeds {BAR:.0e}")
            status = 1
    if best is None:
        print("  best.f32: not in the case")
    else:
        want = best_fits(ref, case.v0, case.dv)
        brel, rows, dvs = best_differences(best, want, case.dv)
        print(f"  best fits: χ² {brel:.2e} relative; rows that differ: {rows} of {n}; velocity "
              f"(same rows) {dvs:.2e} velocity steps")
    if knots is None:
        print("  knots.f32: not in the case")
    else:
        dy, dm, dm_y = knot_differences(knots, *prep)
        print(f"  knots: broadened rows {dy:.2e} of the row's largest |y|; second derivatives "
              f"{dm:.2e} of the row's largest |M| ({dm_y:.2e} of its largest |y|)")
    if out:
        append_json(out, json_row(case, "numpy", n, med, percentile99(timings), 1 / med, rel,
                                  timed="a spectrum, one CPU process", prep_s=prep_s,
                                  scipy=interp is not None))
        print(f"  appended the numpy row to {out}")
    return status


# ------------------------------------------------------------------------------------------------
# PyTorch

def torch_tables(torch, case, prep, work, device):
    """The per-case tensors the batch function reads: the knots (y, M) in the work precision
    ((B, max(P, 2)): one knot is repeated, so the cubic's cell is always defined), the shift's
    terms in float64 (u_pr = A_p F_r + G_p + H_r), the Chebyshev table T_0..T_2D (2D + 1, Np) in
    the work precision, and the index tables of A_jk = (μ_(j+k) + μ_|j−k|) / 2."""
    yb, m = prep
    if yb.shape[1] == 1:  # a constant spline: two equal knots, M = 0
        yb, m = np.repeat(yb, 2, axis=1), np.zeros((yb.shape[0], 2))
    lam = case.l0 + np.arange(case.Np) * case.dl
    eta = np.arctanh((case.v0 + np.arange(case.R) * case.dv) / case.C)
    if case.log:
        A, G = np.zeros(case.Np), (np.log(lam) - case.a) / case.h
        F, H = np.zeros(case.R), -eta / case.h
    else:
        A, G = lam / case.h, np.full(case.Np, -case.a / case.h)
        F, H = np.exp(-eta), np.zeros(case.R)
    cheb = npcheb.chebvander(pixel_x(case.Np), 2 * case.D).T
    j = np.arange(case.D + 1)
    f64 = torch.float64

    def put(x, dtype):
        return torch.as_tensor(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

    return (put(yb, work), put(m, work), put(A, f64), put(G, f64), put(F, f64), put(H, f64),
            put(cheb, work), put(j[:, None] + j[None, :], torch.long),
            put(np.abs(j[:, None] - j[None, :]), torch.long), float(case.P - 1))


def best_fits_torch(torch, chi2, v0, dv):
    """best_fits on tensors: (n, B, R) float64 → (n, 3) float64."""
    n, B, R = chi2.shape
    flat = chi2.reshape(n, B * R)
    finite = torch.where(torch.isnan(flat), torch.full_like(flat, math.inf), flat)
    i = finite.argmin(dim=1, keepdim=True)  # the first of equals
    low = finite.gather(1, i)[:, 0]
    found = torch.isfinite(low)
    r = i[:, 0] % R
    # The neighbours as they are (NaN stays NaN, and then no refinement).
    below = flat.gather(1, (i - 1).clamp(min=0))[:, 0]
    above = flat.gather(1, (i + 1).clamp(max=B * R - 1))[:, 0]
    denom = below - 2 * low + above
    refine = found & (r > 0) & (r < R - 1) & (denom > 0)
    delta = torch.where(refine, 0.5 * (below - above) / torch.where(refine, denom, 1.0), 0.0)
    velocity = v0 + (r.to(chi2.dtype) + delta) * dv
    row = torch.where(found, (i[:, 0] // R).to(chi2.dtype), 0.0)
    return torch.stack([torch.where(found, low, math.nan), row, velocity], dim=1)


def make_chi2_batch(torch, form, v0, dv):
    """The per-batch function: (flux, ivar (n, Np) float32, the case's tables) → (χ² (n, B, R)
    float64, best fits (n, 3) float64). `form`: "residual" or "normal" (see the docstring); the
    per-pixel precision is the tables' (float32 or float64)."""
    f64 = torch.float64

    def chi2_batch(flux, ivar, y, m, pa, pg, vf, vh, cheb, jk_sum, jk_diff, top):
        work = y.dtype
        n, npx = flux.shape
        B, P = y.shape
        R = vf.shape[0]
        D1 = jk_sum.shape[0]
        # The model S_b(u_pr), (B, R, Np): u in float64, the cubic in the work precision.
        u = pa[None, :] * vf[:, None] + pg[None, :] + vh[:, None]
        uc = u.clamp(0.0, top)
        k = uc.floor().clamp(max=P - 2).long()
        t = (uc - k).to(work)
        q = 1.0 - t
        S = (q * y[:, k] + t * y[:, k + 1]
             + ((q * q * q - q) * m[:, k] + (t * t * t - t) * m[:, k + 1]) / 6.0)
        S = S.reshape(B * R, npx)
        # The spectra: masked pixels weigh 0 and read 0 (their flux may be NaN).
        live = ivar > 0
        w = torch.where(live, ivar, 0.0).to(work)
        d = torch.where(live, flux, 0.0).to(work)
        dd = (w.to(f64) * d.to(f64) ** 2).sum(dim=1)  # Σ w d², float64
        # Moments over the pixels as GEMMs: μ_n = Σ w S² T_n (n ≤ 2D), b_j = Σ w d S T_j (j ≤ D).
        g2 = ((S * S)[:, None, :] * cheb[None, :, :]).reshape(-1, npx)
        g1 = (S[:, None, :] * cheb[None, :D1, :]).reshape(-1, npx)
        mu = (w @ g2.T).reshape(n, B * R, -1).to(f64)
        rhs = ((w * d) @ g1.T).reshape(n, B * R, D1).to(f64)
        # The normal equations in float64, Jacobi-scaled; a column no pixel sees gets c = 0.
        A = 0.5 * (mu[..., jk_sum] + mu[..., jk_diff])  # (n, B R, D1, D1)
        diag = A.diagonal(dim1=-2, dim2=-1)
        seen = diag > 0
        scale = torch.where(seen, diag.clamp(min=1e-300).rsqrt(), 0.0)
        ridge = torch.where(seen, torch.full_like(diag, RIDGE), torch.ones_like(diag))
        As = A * scale[..., :, None] * scale[..., None, :] + torch.diag_embed(ridge)
        L, _ = torch.linalg.cholesky_ex(As)
        c = torch.cholesky_solve((rhs * scale)[..., None], L)[..., 0] * scale
        if form == "lstsq":
            # As the seed's GPU port does it: every fit's weighted design matrix, (n, B R, Np,
            # D + 1), solved by a batched least-squares solve (QR), χ² from the residuals. The
            # normal equations above are left unused.
            sw = w.sqrt()
            X = (sw[:, None, :, None] * S[None, :, :, None]) * cheb[:D1].T[None, None, :, :]
            y = (sw * d)[:, None, :, None].expand(n, B * R, npx, 1)
            coef = torch.linalg.lstsq(X, y).solution
            res = y - X @ coef
            chi2 = (res * res).sum(dim=(-2, -1)).to(f64)
        elif form == "normal":
            chi2 = dd[:, None] - (rhs * c).sum(dim=-1)
        else:
            # Σ_p w (d − S Σ_j c_j T_j)², over (n, B R, Np) in the work precision.
            cont = c.to(work) @ cheb[:D1]
            res = d[:, None, :] - S[None, :, :] * cont
            chi2 = (w[:, None, :] * res * res).sum(dim=-1).to(f64)
        chi2 = torch.where(live.any(dim=1)[:, None], chi2, math.nan).reshape(n, B, R)
        return chi2, best_fits_torch(torch, chi2, v0, dv)

    return chi2_batch


def batch_bytes(case, form, work_bytes, batch):
    """The largest tensor of a batch, bytes."""
    per_spectrum = {
        "residual": case.B * case.R * case.Np * work_bytes,
        "lstsq": case.B * case.R * case.Np * (case.D + 1) * work_bytes,
    }.get(form, 0)
    fixed = case.B * case.R * (2 * case.D + 1) * case.Np * work_bytes  # the μ GEMM's operand
    return max(batch * per_spectrum, fixed, batch * case.B * case.R * (case.D + 1) ** 2 * 8)


def run_torch_variant(torch, variant, case, prep, flux, ivar, batch, reps, device, fns):
    """Times one variant over the whole case; returns (device s or None, host s, χ², best)."""
    compiled, form, precision = VARIANTS[variant]
    work = getattr(torch, precision)
    cuda = device == "cuda"
    tables = torch_tables(torch, case, prep, work, device)
    key = (compiled, form, precision)
    if key not in fns:
        fn = make_chi2_batch(torch, form, case.v0, case.dv)
        fns[key] = torch.compile(fn) if compiled else fn
    fn = fns[key]
    S, total = case.S, flux.shape[0]
    chi2 = torch.empty((total, case.B, case.R), dtype=torch.float64, device=device)
    best = torch.empty((total, 3), dtype=torch.float64, device=device)

    def whole_case():
        for lo in range(0, total, batch):
            c, b = fn(flux[lo:lo + batch], ivar[lo:lo + batch], *tables)
            chi2[lo:lo + batch].copy_(c)
            best[lo:lo + batch].copy_(b)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2):  # warm-up: compilation, autotuning of the libraries, allocator
        whole_case()
    sync()
    device_s, host_s = [], []
    for _ in range(reps):
        sync()
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        t0 = time.perf_counter()
        whole_case()
        if cuda:
            ev1.record()
        sync()
        host_s.append(time.perf_counter() - t0)
        if cuda:
            device_s.append(ev0.elapsed_time(ev1) * 1e-3)
    return (device_s or None), host_s, chi2[:S].cpu().numpy(), best[:S].cpu().numpy()


def run_torch(d, variants, batch, quick, out, device, no_scipy):
    """--torch: times every variant over the whole case; returns {variant: (largest relative
    difference from pptm's grid or None where the case has none, χ² grid, best fits), or None
    where the variant failed}."""
    try:
        import torch
    except ImportError as e:
        print(f"peers_spectra.py: PyTorch is not importable ({e})", file=sys.stderr)
        sys.exit(2)
    if device == "cuda" and not torch.cuda.is_available():
        print("peers_spectra.py: CUDA is not available (--device cpu runs the peers on the CPU)",
              file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 GEMMs in float32
    torch.set_float32_matmul_precision("highest")
    case = load_case(d)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"--torch {d}: {case.describe()}; torch {torch.__version__} on {name}")
    interp = import_scipy(no_scipy)
    t0 = time.perf_counter()
    prep = prepare(case, interp)
    print(f"  templates prepared by the NumPy reference (float64) in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms, once per case, untimed")
    pptm_chi2, pptm_best, _ = load_results(d, case, case.S)
    reps = 3 if quick else 10
    results, fns, resident = {}, {}, [None, None, None]
    with torch.no_grad():
        for variant in variants:
            _, form, precision = VARIANTS[variant]
            work_bytes = 4 if precision == "float32" else 8
            n = batch
            while n > 1 and batch_bytes(case, form, work_bytes, n) > LARGEST_TENSOR:
                n //= 2
            if n != batch:
                print(f"  {variant}: batches of {n} (a batch of {batch} would hold a tensor of "
                      f"{batch_bytes(case, form, work_bytes, batch) / 1e9:.1f} GB)")
            n = min(n, case.S)
            # The spectra on the device, padded to whole batches with spectra of zero weight (one
            # shape, one compilation); kept for the next variant of the same batch size.
            total = -(-case.S // n) * n
            if resident[0] != total:
                resident[:] = [None, None, None]
                flux = torch.zeros((total, case.Np), dtype=torch.float32, device=device)
                ivar = torch.zeros((total, case.Np), dtype=torch.float32, device=device)
                flux[:case.S] = torch.from_numpy(case.flux).to(device)
                ivar[:case.S] = torch.from_numpy(case.ivar).to(device)
                resident[:] = [total, flux, ivar]
            _, flux, ivar = resident
            try:
                dev, host, chi2, best = run_torch_variant(torch, variant, case, prep, flux, ivar,
                                                          n, reps, device, fns)
            except Exception as e:  # a failing peer is reported; the others still run
                note = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"  {variant:<15} failed: {note}", flush=True)
                results[variant] = None
                if device == "cuda":
                    torch.cuda.empty_cache()
                if out:
                    append_json(out, json_row(case, variant, case.S, None, None, None, None,
                                              status="failed", note=note))
                continue
            timed = dev or host
            med, p99 = statistics.median(timed), percentile99(timed)
            rel = None
            line = (f"  {variant:<15} {med * 1e3:9.2f} ms for {case.S} spectra (p99 "
                    f"{p99 * 1e3:.2f}; host {statistics.median(host) * 1e3:.2f}): "
                    f"{case.S / med:,.0f} spectra/s")
            if pptm_chi2 is not None:
                rel, at, mismatched = max_rel(chi2, pptm_chi2)
                line += f"; against pptm: χ² {rel:.1e}"
                if mismatched:
                    line += f" ({mismatched} NaN misplaced)"
            if pptm_best is not None:
                _, rows, dvs = best_differences(pptm_best, best, case.dv)
                line += f", best rows differ {rows}, velocities {dvs:.1e} steps"
            print(line, flush=True)
            results[variant] = (rel, chi2, best)
            if out:
                append_json(out, json_row(case, variant, case.S, med, p99, case.S / med, rel,
                                          status="ok", host_median_s=statistics.median(host),
                                          batch=n, reps=reps, form=form, precision=precision,
                                          device=name, torch=torch.__version__))
    if out:
        print(f"  appended {len(variants)} rows to {out}")
    return results


# ------------------------------------------------------------------------------------------------
# --cpu-smoke

def synthetic_case(log, degree, spectra=8, pixels=300, velocities=16, seed=1):
    """A small case like examples/spectra.rs's (Gaussian absorption lines, a cubic continuum of
    ~1000 counts, S/N 50, 1 % of pixels masked with NaN flux), with spectrum S − 2 of no weight
    and spectrum S − 1 90 % masked. Returns (case, truth rows)."""
    rng = np.random.default_rng(seed)
    C = 299792.458
    l0, dl = 5000.0, 0.2
    v0, dv = -75.0, 10.0
    lo, hi = l0 * 0.996, (l0 + (pixels - 1) * dl) * 1.004
    if log:
        h = 1e-5
        a = math.log(lo)
        P = int(math.ceil(math.log(hi / lo) / h)) + 1
        lam = np.exp(a + np.arange(P) * h)
    else:
        h = 0.05
        a = lo
        P = int(math.ceil((hi - lo) / h)) + 1
        lam = a + np.arange(P) * h
    T = 2
    templates = np.ones((T, P))
    for t in range(T):
        n_lines = int(hi - lo)
        centre = rng.uniform(lo, hi, n_lines)
        depth = rng.uniform(0.05, 0.75, n_lines)
        sigma = rng.uniform(0.05, 0.35, n_lines)
        for c_, d_, s_ in zip(centre, depth, sigma):
            templates[t] -= d_ * np.exp(-0.5 * ((lam - c_) / s_) ** 2)
    templates = np.maximum(templates, 0.02).astype(np.float32)
    meta = {"templates": T, "knots": P, "template_grid": "log" if log else "linear",
            "template_start": a, "template_step": h,
            "rows": [[0, 0.0], [1, 25.0], [0, 40.0]], "limb": 0.6, "pixels": pixels,
            "obs_start": l0, "obs_step": dl, "spectra": spectra, "velocity_start": v0,
            "velocity_step": dv, "velocities": velocities, "degree": degree, "light_speed": C}
    case = Case(meta, templates, None, None)
    yb, m = prepare(case)
    x = pixel_x(pixels)
    lam_p = l0 + np.arange(pixels) * dl
    flux = np.empty((spectra, pixels), np.float32)
    ivar = np.empty((spectra, pixels), np.float32)
    truth = []
    for s in range(spectra):
        b = s % case.B
        v = v0 + (velocities - 1) * dv * rng.uniform(0.1, 0.9)
        eta = math.atanh(v / C)
        u = ((np.log(lam_p) - eta - a) / h) if log else ((lam_p * math.exp(-eta) - a) / h)
        cont = npcheb.chebval(x, [1000 * rng.uniform(0.8, 1.2), 100 * rng.uniform(-1, 1),
                                  50 * rng.uniform(-1, 1), 20 * rng.uniform(-1, 1)])
        model = spline_eval(yb[b:b + 1], m[b:b + 1], u)[0] * cont
        sigma = np.abs(model) / 50 + 1
        flux[s] = model + sigma * rng.standard_normal(pixels)
        ivar[s] = 1 / sigma ** 2
        masked = rng.uniform(size=pixels) < (0.9 if s == spectra - 1 else 0.01)
        if s == spectra - 2:
            masked[:] = True
        flux[s, masked] = np.nan
        ivar[s, masked] = 0
        truth.append(b)
    case.flux, case.ivar = flux, ivar
    return case, truth


def smoke(a):
    """--cpu-smoke: returns the exit status."""
    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(what)
            print(f"  FAIL: {what}")

    interp = import_scipy(a.no_scipy)
    try:
        import torch
        torch.set_float32_matmul_precision("highest")
    except ImportError as e:
        torch = None
        print(f"PyTorch is not importable ({e}): the NumPy reference only")
    print(f"numpy {np.__version__}; SciPy: "
          f"{'yes' if interp else ('disabled' if a.no_scipy else 'not importable')}; PyTorch: "
          f"{torch.__version__ if torch else 'no'}")
    for log, degree in ((True, 3), (False, 10), (True, 0), (False, 1)):
        case, truth = synthetic_case(log, degree)
        print(f"{'log' if log else 'linear'} grid, degree {degree}: {case.describe()}")
        thomas = prepare(case, None)
        prep = thomas
        if interp is not None:
            prep = prepare(case, interp)
            diff = np.abs(prep[1] - thomas[1]).max() / np.abs(prep[1]).max()
            print(f"  spline second derivatives, SciPy against Thomas: {diff:.1e}")
            expect(diff < 1e-10, "SciPy and Thomas splines differ")
        # The spline must pass through the knots, and M must solve the natural spline's system.
        yb, m = prep
        through = np.abs(spline_eval(yb, m, np.arange(case.P, dtype=np.float64)) - yb).max()
        system = m[:, :-2] + 4 * m[:, 1:-1] + m[:, 2:] - 6 * (yb[:, 2:] - 2 * yb[:, 1:-1]
                                                               + yb[:, :-2])
        err = np.abs(system).max() / np.abs(m).max()
        print(f"  spline: through the knots {through:.1e}; the tridiagonal system's residual "
              f"{err:.1e} of the largest |M|; M at the ends {np.abs(m[:, [0, -1]]).max():.1e}")
        expect(through < 1e-12 and err < 1e-10 and np.abs(m[:, [0, -1]]).max() < 1e-12,
               "the spline")
        timings = []
        ref = reference_grid(case, prep, timings)
        ref_best = best_fits(ref, case.v0, case.dv)
        found = sum(int(ref_best[s, 1]) == truth[s] for s in range(case.S - 2))
        print(f"  reference: {statistics.median(timings) * 1e3:.1f} ms a spectrum; best rows at "
              f"the truth {found} of {case.S - 2} (weighted spectra); NaN spectra: "
              f"{int(np.isnan(ref).all(axis=(1, 2)).sum())}")
        expect(np.isnan(ref[case.S - 2]).all() and not np.isnan(ref[:case.S - 2]).any()
               and not np.isnan(ref[case.S - 1]).any(), "NaN only for the spectrum of no weight")
        expect(found >= case.S - 3, "best fits away from the truth")
        if torch is None:
            continue
        for precision in ("float64", "float32"):
            work = getattr(torch, precision)
            tables = torch_tables(torch, case, prep, work, "cpu")
            for form in ("residual", "normal"):
                fn = make_chi2_batch(torch, form, case.v0, case.dv)
                with torch.no_grad():
                    chi2, best = fn(torch.from_numpy(case.flux), torch.from_numpy(case.ivar),
                                    *tables)
                rel, at, mismatched = max_rel(chi2.numpy(), ref)
                brel, rows, dvs = best_differences(best.numpy(), ref_best, case.dv)
                print(f"  torch {precision} {form:<8}: χ² {rel:.1e} (NaN misplaced "
                      f"{mismatched}); best: χ² {brel:.1e}, rows differ {rows}, velocity "
                      f"{dvs:.1e} steps")
                if precision == "float64":
                    expect(rel <= 1e-6 and rows == 0 and dvs <= 1e-6,
                           f"torch float64 {form} against the reference")
                elif form == "residual":
                    expect(rel <= 1e-4, "torch float32 residual against the reference")
    # The file path: a case on disk, the float64 PyTorch grid standing in for pptm's.
    case, _ = synthetic_case(True, 3, spectra=12)
    prep = prepare(case, interp)
    with tempfile.TemporaryDirectory() as d:
        if torch is not None:
            tables = torch_tables(torch, case, prep, torch.float64, "cpu")
            chi2, best = make_chi2_batch(torch, "residual", case.v0, case.dv)(
                torch.from_numpy(case.flux), torch.from_numpy(case.ivar), *tables)
            chi2, best = chi2.numpy(), best.numpy()
        else:
            chi2 = reference_grid(case, prep)
            best = best_fits(chi2, case.v0, case.dv)
        knots = np.stack([prep[0], prep[1]], axis=2).reshape(case.B, 2 * case.P)
        write_case(d, case, chi2, best, knots)
        print(f"case written to {d}; --check on it:")
        out = os.path.join(d, "rows.jsonl")
        expect(run_check(d, 8, out, a.no_scipy) == 0, "--check on the written case")
        if torch is not None:
            results = run_torch(d, ["eager", "compile", "eager-normal", "eager-f64"], 5, True,
                                out, "cpu", a.no_scipy)
            for v, r in results.items():
                expect(r is not None and r[0] <= (1e-4 if v != "eager-normal" else 1e-2),
                       f"--torch {v} on the written case")
        rows = [json.loads(line) for line in open(out)]
        print(f"{out}: {len(rows)} rows: " + ", ".join(
            f"{r['variant']} {r['spectra_per_s']:.1f}/s" for r in rows if r["spectra_per_s"]))
    if failures:
        print(f"cpu-smoke: {len(failures)} failures")
        return 1
    print("cpu-smoke: ok")
    return 0


# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="DIR", help="recompute pptm's grid in float64 and compare")
    ap.add_argument("--spectra", type=int, default=16, help="--check: the first N spectra")
    ap.add_argument("--torch", metavar="DIR", help="time the PyTorch peers on the case")
    ap.add_argument("--batch", type=int, default=256, help="--torch: spectra a batch")
    ap.add_argument("--variants", default="eager,compile",
                    help=f"--torch: comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--quick", action="store_true", help="--torch: 3 repetitions, not 10")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="--torch: cpu only to test the code")
    ap.add_argument("--out", metavar="FILE", help="append one JSON object a variant here")
    ap.add_argument("--no-scipy", action="store_true", help="the NumPy fallbacks, not SciPy")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no CUDA, no case: synthetic cases, the reference against PyTorch (CPU)")
    a = ap.parse_args()
    if a.cpu_smoke:
        sys.exit(smoke(a))
    if not (a.check or a.torch):
        ap.error("one of --check DIR, --torch DIR or --cpu-smoke")
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}: of {','.join(VARIANTS)}")
    status = 0
    if a.check:
        status = max(status, run_check(a.check, a.spectra, a.out, a.no_scipy))
    if a.torch:
        run_torch(a.torch, variants, a.batch, a.quick, a.out, a.device, a.no_scipy)
    sys.exit(status)


if __name__ == "__main__":
    main()

//! DistanceKth and TeReduction (domain `transfer_entropy`) on every backend, against f64
//! references written here, independently of the op catalog.
//!
//! Coordinates are drawn from a coarse grid and some points are duplicated, so equal distances
//! (ties) and neighbours exactly at the radius are common: the k-th distance counts tied
//! neighbours once each, and the radius count is strict, on every backend alike.

#[macro_use]
mod common;

use common::rel_err;
use pptm::chains::{DistanceKth, TeReduction};
use pptm::{Error, Runtime};
use rand::Rng;

/// n points with d coordinates on a grid of step 1/8 in [-2, 2), about one in ten a copy of an
/// earlier point.
fn points(n: usize, d: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    let mut x: Vec<f32> = (0..n * d)
        .map(|_| rng.random_range(-16i32..16) as f32 / 8.0)
        .collect();
    for i in 1..n {
        if rng.random_range(0..10) == 0 {
            let j = rng.random_range(0..i);
            for c in 0..d {
                x[i * d + c] = x[j * d + c];
            }
        }
    }
    x
}

/// Chebyshev distance between rows i and j, as f32 differences (what the chain promises).
fn cheb(x: &[f32], d: usize, i: usize, j: usize) -> f64 {
    (0..d)
        .map(|c| f64::from((x[i * d + c] - x[j * d + c]).abs()))
        .fold(0.0, f64::max)
}

/// For each k in `ks`, every point's k-th smallest distance to the others (each row is sorted
/// once for all the k).
fn kth_reference(x: &[f32], n: usize, d: usize, ks: &[u32]) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::with_capacity(n); ks.len()];
    let mut row = Vec::with_capacity(n);
    for i in 0..n {
        row.clear();
        row.extend((0..n).filter(|&j| j != i).map(|j| cheb(x, d, i, j)));
        row.sort_unstable_by(f64::total_cmp);
        for (o, &k) in out.iter_mut().zip(ks) {
            o.push(row.get(k as usize - 1).copied().unwrap_or(f64::NAN));
        }
    }
    out
}

const KS: [u32; 3] = [1, 4, 10];

fn distance_kth_matches_f64_reference(rt: &Runtime) {
    for n in [5usize, 1000, 4097] {
        for d in [1usize, 3, 8] {
            let x = points(n, d);
            let xb = rt.upload(&x).unwrap();
            let wants = kth_reference(&x, n, d, &KS);
            for (k, want) in KS.into_iter().zip(wants) {
                let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
                let r = DistanceKth::submit(rt, &xb, k, &mut out, d);
                if k as usize >= n {
                    assert!(
                        matches!(r, Err(Error::BadArguments { .. })),
                        "n={n} k={k}: {r:?}"
                    );
                    continue;
                }
                r.unwrap().wait().unwrap();
                let got = out.to_vec().unwrap();
                for i in 0..n {
                    // Distances are exact f32 values on both sides: equal, not just close.
                    assert_eq!(f64::from(got[i]), want[i], "n={n} d={d} k={k} point {i}");
                }
            }
        }
    }
}

fn digamma(x: f64) -> f64 {
    // ψ(x) for x >= 1 by recurrence to x >= 12 and the asymptotic series.
    let (mut x, mut acc) = (x, 0.0);
    while x < 12.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    acc + x.ln() - 0.5 / x - r * (1.0 / 12.0 - r * (1.0 / 120.0 - r / 252.0))
}

/// Coupled series embedded as points: z_t, x_t = z_t + noise, y_t = x_t + noise, each with
/// `d` coordinates (delay embedding is the caller's business).
fn coupled(n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let z = points(n, d);
    let mut rng = rand::rng();
    let x: Vec<f32> = z
        .iter()
        .map(|v| v + rng.random_range(-4i32..4) as f32 / 8.0)
        .collect();
    let y: Vec<f32> = x
        .iter()
        .map(|v| v + rng.random_range(-4i32..4) as f32 / 8.0)
        .collect();
    (x, y, z)
}

/// The KSG estimate and the mean magnitude of its terms (the scale its error is judged on).
fn te_reference(x: &[f32], y: &[f32], z: &[f32], d: usize, eps: &[f32], k: u32) -> (f64, f64) {
    let n = eps.len();
    let (mut sum, mut abs) = (0.0, 0.0);
    for (i, &radius) in eps.iter().enumerate() {
        let (mut nxz, mut nyz, mut nz) = (0.0, 0.0, 0.0);
        let e = f64::from(radius);
        for j in (0..n).filter(|&j| j != i) {
            let (dx, dy, dz) = (cheb(x, d, i, j), cheb(y, d, i, j), cheb(z, d, i, j));
            nxz += f64::from(u8::from(dx.max(dz) < e));
            nyz += f64::from(u8::from(dy.max(dz) < e));
            nz += f64::from(u8::from(dz < e));
        }
        let term = digamma(nz + 1.0) - digamma(nxz + 1.0) - digamma(nyz + 1.0);
        sum += term;
        abs += term.abs();
    }
    let psi_k = digamma(f64::from(k));
    (psi_k + sum / n as f64, psi_k.abs() + abs / n as f64)
}

fn te_reduction_matches_f64_reference(rt: &Runtime) {
    for n in [5usize, 1000, 4097] {
        for d in [1usize, 3, 8] {
            let (x, y, z) = coupled(n, d);
            // Radii: each point's k-th neighbour distance in the joint (x, y, z) space.
            let joint: Vec<f32> = (0..n)
                .flat_map(|i| {
                    x[i * d..(i + 1) * d]
                        .iter()
                        .chain(&y[i * d..(i + 1) * d])
                        .chain(&z[i * d..(i + 1) * d])
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            let radii = kth_reference(&joint, n, 3 * d, &KS);
            for (k, radius) in KS.into_iter().zip(radii) {
                if k as usize >= n {
                    continue;
                }
                let eps: Vec<f32> = radius.into_iter().map(|v| v as f32).collect();
                let (want, scale) = te_reference(&x, &y, &z, d, &eps, k);
                let (xb, yb, zb, eb) = (
                    rt.upload(&x).unwrap(),
                    rt.upload(&y).unwrap(),
                    rt.upload(&z).unwrap(),
                    rt.upload(&eps).unwrap(),
                );
                let got = TeReduction::submit(rt, &xb, &yb, &zb, &eb, k, d, d, d)
                    .unwrap()
                    .wait()
                    .unwrap();
                let err = (f64::from(got) - want).abs() / scale;
                assert!(
                    err < 1e-4,
                    "n={n} d={d} k={k}: got {got}, f64 reference {want} (term scale {scale}), error {err:e}; relative {:e}",
                    rel_err(f64::from(got), want)
                );
            }
        }
    }
}

fn bad_shapes_are_typed_errors(rt: &Runtime) {
    let x = rt.upload(&points(10, 3)).unwrap();
    let mut out = rt.alloc::<f32>(10).unwrap();
    // 30 coordinates are not 10 points of 4.
    assert!(matches!(
        DistanceKth::submit(rt, &x, 2, &mut out, 4),
        Err(Error::LengthMismatch {
            arg: "x",
            expected: 40,
            got: 30,
            ..
        })
    ));
    assert!(matches!(
        DistanceKth::submit(rt, &x, 0, &mut out, 3),
        Err(Error::BadArguments { .. })
    ));
    assert!(matches!(
        DistanceKth::submit(rt, &x, 17, &mut out, 3),
        Err(Error::BadArguments { .. })
    ));
    // Too many coordinates per point for the device's per-point buffer.
    let wide = rt.upload(&vec![0.0f32; 2 * 129]).unwrap();
    let mut two = rt.alloc::<f32>(2).unwrap();
    assert!(matches!(
        DistanceKth::submit(rt, &wide, 1, &mut two, 129),
        Err(Error::BadArguments { .. })
    ));
    let eps = rt.alloc::<f32>(9).unwrap();
    assert!(matches!(
        TeReduction::submit(rt, &x, &x, &x, &eps, 2, 3, 3, 3),
        Err(Error::LengthMismatch { .. })
    ));
}

on_every_backend!(
    distance_kth_matches_f64_reference,
    te_reduction_matches_f64_reference,
    bad_shapes_are_typed_errors,
);

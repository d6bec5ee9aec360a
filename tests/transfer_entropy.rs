//! DistanceKth and TeReduction (domain `transfer_entropy`) on every backend, against f64
//! references written here, independently of the op catalog.
//!
//! Coordinates are drawn from a coarse grid and some points are duplicated, so equal distances
//! (ties) and neighbours exactly at the radius are common: the k-th distance counts tied
//! neighbours once each, and the radius count is strict, on every backend alike.

#[macro_use]
mod common;

use common::{cheb, digamma, kth_reference, rel_err};
use pptm::chains::{DistanceKth, TeReduction};
use pptm::ops::{KsgDigamma, RadiusCount, SubspaceDistances};
use pptm::{Chain, Error, FusionBuilder, Runtime};

/// TeReduction without its mean: each point's KSG term ψ(n_z+1) − ψ(n_xz+1) − ψ(n_yz+1), written
/// out per point. An off-by-one count moves a term by 1/(c+1) >= 1/n, which the per-point check
/// below resolves with ten times to spare; in the mean over n points it would be 1/(c·n), within
/// any bar an f32 estimate can be held to. (A domain of its own, for tests: every test here starts
/// it beside `transfer_entropy` first.)
#[derive(FusionBuilder)]
#[fusion(domain = "neighbour_counts")]
pub struct KsgTerms {
    #[stage(1)]
    distances: SubspaceDistances,
    #[stage(2)]
    counts: RadiusCount,
    #[stage(3)]
    terms: KsgDigamma,
}

use rand::Rng;

/// n points with d coordinates on a grid of step 1/8 in [-2, 2), about one in ten a copy of an
/// earlier point.
fn points(n: usize, d: usize) -> Vec<f32> {
    let mut rng = common::rng();
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

const KS: [u32; 3] = [1, 4, 10];

/// Starts both domains of this file's chains together (a second domain cannot be loaded once a
/// manifold is resident); every test body calls it first, and all but the first find them
/// running.
fn start(rt: &Runtime) {
    rt.prepare_domains(&[TeReduction::DOMAIN, KsgTerms::DOMAIN])
        .unwrap();
}

/// Coordinates per point (per space) at n points. From 8448 points (132 SMs x 16 warps x 4) a
/// warp takes four points at once (pattern/pairwise.cuh); the f64 references are n² work, so the
/// largest n runs the two smaller dimensions.
fn dims(n: usize) -> &'static [usize] {
    if n > 8192 { &[1, 3] } else { &[1, 3, 8] }
}

fn distance_kth_matches_f64_reference(rt: &Runtime) {
    start(rt);
    for n in [5usize, 1000, 4097, 9001] {
        for &d in dims(n) {
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

/// Coupled series embedded as points: z_t, x_t = z_t + noise, y_t = x_t + noise, each with
/// `d` coordinates (delay embedding is the caller's business).
fn coupled(n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let z = points(n, d);
    let mut rng = common::rng();
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

/// Each point's counts (n_xz, n_yz, n_z) of other points strictly within `eps[i]`.
fn counts_reference(x: &[f32], y: &[f32], z: &[f32], d: usize, eps: &[f32]) -> Vec<[u32; 3]> {
    let n = eps.len();
    (0..n)
        .map(|i| {
            let e = f64::from(eps[i]);
            let mut c = [0u32; 3];
            for j in (0..n).filter(|&j| j != i) {
                let (dx, dy, dz) = (cheb(x, d, i, j), cheb(y, d, i, j), cheb(z, d, i, j));
                c[0] += u32::from(dx.max(dz) < e);
                c[1] += u32::from(dy.max(dz) < e);
                c[2] += u32::from(dz < e);
            }
            c
        })
        .collect()
}

/// The KSG estimate and the mean magnitude of its terms (the scale its error is judged on).
fn te_reference(x: &[f32], y: &[f32], z: &[f32], d: usize, eps: &[f32], k: u32) -> (f64, f64) {
    let n = eps.len();
    let (mut sum, mut abs) = (0.0, 0.0);
    for [nxz, nyz, nz] in counts_reference(x, y, z, d, eps) {
        let (nxz, nyz, nz) = (f64::from(nxz), f64::from(nyz), f64::from(nz));
        let term = digamma(nz + 1.0) - digamma(nxz + 1.0) - digamma(nyz + 1.0);
        sum += term;
        abs += term.abs();
    }
    let psi_k = digamma(f64::from(k));
    (psi_k + sum / n as f64, psi_k.abs() + abs / n as f64)
}

/// Radii that make ties at the radius common: each point's k-th neighbour distance in the joint
/// (x, y, z) space, as TeReduction's callers compute them.
fn joint_radii(x: &[f32], y: &[f32], z: &[f32], n: usize, d: usize) -> Vec<Vec<f64>> {
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
    kth_reference(&joint, n, 3 * d, &KS)
}

/// Every point's neighbour counts, checked through its KSG term: each term within 2^-20 of its
/// three ψ values' magnitude (a few f32 ulps each), a bar below half of 1/(n+1), the least an
/// off-by-one count can move it, so any count that is off fails here.
fn neighbour_counts_are_exact(rt: &Runtime) {
    start(rt);
    for n in [5usize, 1000, 4097, 9001] {
        for &d in dims(n) {
            let (x, y, z) = coupled(n, d);
            for (k, radius) in KS.into_iter().zip(joint_radii(&x, &y, &z, n, d)) {
                if k as usize >= n {
                    continue;
                }
                let eps: Vec<f32> = radius.into_iter().map(|v| v as f32).collect();
                let counts = counts_reference(&x, &y, &z, d, &eps);
                let (xb, yb, zb, eb) = (
                    rt.upload(&x).unwrap(),
                    rt.upload(&y).unwrap(),
                    rt.upload(&z).unwrap(),
                    rt.upload(&eps).unwrap(),
                );
                let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
                KsgTerms::submit(rt, &xb, &yb, &zb, &eb, &mut out, d, d, d)
                    .unwrap()
                    .wait()
                    .unwrap();
                let got = out.to_vec().unwrap();
                for (i, &[nxz, nyz, nz]) in counts.iter().enumerate() {
                    let psi = |c: u32| digamma(f64::from(c) + 1.0);
                    let want = psi(nz) - psi(nxz) - psi(nyz);
                    let bar = 2f64.powi(-20) * (psi(nz).abs() + psi(nxz).abs() + psi(nyz).abs());
                    assert!(bar < 0.5 / (n as f64 + 1.0), "the bar resolves one count");
                    let err = (f64::from(got[i]) - want).abs();
                    assert!(
                        err <= bar,
                        "n={n} d={d} k={k} point {i}: term {} vs {want} (counts n_xz {nxz}, \
                         n_yz {nyz}, n_z {nz}): error {err:e}, bar {bar:e}",
                        got[i]
                    );
                }
            }
        }
    }
}

fn te_reduction_matches_f64_reference(rt: &Runtime) {
    start(rt);
    for n in [5usize, 1000, 4097, 9001] {
        for &d in dims(n) {
            let (x, y, z) = coupled(n, d);
            let radii = joint_radii(&x, &y, &z, n, d);
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
    start(rt);
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
    neighbour_counts_are_exact,
    te_reduction_matches_f64_reference,
    bad_shapes_are_typed_errors,
);

//! Nearest-neighbour statistics over point sets: pairwise Chebyshev distances, the k-th
//! neighbour distance, radius counts and the digamma terms of the KSG transfer-entropy estimator
//! (device side: kernels/pptm/ops/neighbours.cuh and kernels/pptm/pattern/pairwise.cuh).
//!
//! Distances are computed as the device computes them: the difference of two f32 coordinates,
//! rounded to f32, then its absolute value; the maximum of those is exact. So the CPU reference
//! and the GPU agree bit for bit on every distance, and a neighbour exactly at the radius is
//! counted (or not) the same way on both.

use super::{CpuImpl, FusionClass, OpDef, Ty, param};
use crate::Precision;

const HEADER: &str = "pptm/ops/neighbours.cuh";

/// Largest `k` [`KTH_SMALLEST`] supports: each thread keeps its k smallest distances in registers.
pub const MAX_K: u32 = 16;

fn f32_dist(a: f64, b: f64) -> f64 {
    f64::from((a as f32 - b as f32).abs())
}

/// Chebyshev distance between points i and j of a row-major matrix with `d` columns.
fn chebyshev(x: &[f64], d: usize, i: usize, j: usize) -> f64 {
    (0..d)
        .map(|c| f32_dist(x[i * d + c], x[j * d + c]))
        .fold(0.0, f64::max)
}

/// Checks that a point's coordinates (the sum of `letters`) fit the device's per-point buffer.
fn features_fit(dims: &[(&'static str, usize)], letters: &[&str]) -> Result<(), String> {
    // Saturating: sizes come from the caller, and a sum that wrapped would pass the check.
    let total = dims
        .iter()
        .filter(|(l, _)| letters.contains(l))
        .fold(0usize, |acc, d| acc.saturating_add(d.1));
    let max = crate::work::PAIRWISE_MAX_FEATURES;
    if total > max {
        return Err(format!(
            "points have {total} coordinates; at most {max} are supported"
        ));
    }
    Ok(())
}

/// Max-norm distance between every pair of the `n` points (rows) of `x` (n×d).
pub const CHEBYSHEV_DISTANCE: OpDef = OpDef {
    name: "ChebyshevDistance",
    class: FusionClass::Pairwise,
    inputs: &[param("x", Ty::Matrix("n", "d"))],
    output: Ty::Pairs("n"),
    flow_channels: Some(1),
    out_channels: Some(1),
    states: crate::ops::StateTypes::NONE,
    precisions: &[Precision::Fp32],
    tensor_precisions: &[],
    lanes: 1,
    header: HEADER,
    cuda: "",
    device: "pptm_op_chebyshev",
    cpu: CpuImpl::Pair(|t, i, j, out| out[0] = chebyshev(t.flow, t.dim("d"), i, j)),
    check: Some(|_, dims| features_fit(dims, &["d"])),
    doc: "Chebyshev (max-norm) distance between every pair of points (rows of x).",
};

/// For the KSG estimator: the Chebyshev distances of each pair in the joint (x, z), (y, z) and
/// (z) spaces, three values per pair.
pub const SUBSPACE_DISTANCES: OpDef = OpDef {
    name: "SubspaceDistances",
    class: FusionClass::Pairwise,
    inputs: &[
        param("x", Ty::Matrix("n", "dx")),
        param("y", Ty::Matrix("n", "dy")),
        param("z", Ty::Matrix("n", "dz")),
    ],
    output: Ty::Pairs("n"),
    flow_channels: Some(1),
    out_channels: Some(3),
    states: crate::ops::StateTypes::NONE,
    precisions: &[Precision::Fp32],
    tensor_precisions: &[],
    lanes: 1,
    header: HEADER,
    cuda: "",
    device: "pptm_op_subspace_distances",
    cpu: CpuImpl::Pair(|t, i, j, out| {
        let dx = chebyshev(t.flow, t.dim("dx"), i, j);
        let dy = chebyshev(t.tensors[0], t.dim("dy"), i, j);
        let dz = chebyshev(t.tensors[1], t.dim("dz"), i, j);
        out[0] = dx.max(dz);
        out[1] = dy.max(dz);
        out[2] = dz;
    }),
    check: Some(|_, dims| features_fit(dims, &["dx", "dy", "dz"])),
    doc: "Chebyshev distances of every pair in the (x,z), (y,z) and (z) spaces (3 channels).",
};

/// The k-th smallest distance from each point to the others (k from 1).
pub const KTH_SMALLEST: OpDef = OpDef {
    name: "KthSmallest",
    class: FusionClass::RowReduction,
    inputs: &[param("d", Ty::Pairs("n")), param("k", Ty::U32)],
    output: Ty::Vector("n"),
    flow_channels: Some(1),
    out_channels: Some(1),
    states: crate::ops::StateTypes::NONE,
    precisions: &[Precision::Fp32],
    tensor_precisions: &[],
    lanes: 1,
    header: HEADER,
    cuda: "",
    device: "pptm_op_kth_smallest",
    cpu: CpuImpl::Row(|t, _i, row, _ch, out| {
        let k = t.scalars[0] as usize;
        let mut r = row.to_vec();
        out[0] = *r.select_nth_unstable_by(k - 1, f64::total_cmp).1;
    }),
    check: Some(|scalars, dims| {
        let k = scalars[0];
        let n = dims.iter().find(|(l, _)| *l == "n").map_or(0, |d| d.1);
        if !(1.0..=f64::from(MAX_K)).contains(&k) {
            return Err(format!("k = {k} is outside 1..={MAX_K}"));
        }
        if n != 0 && k as usize >= n {
            return Err(format!(
                "k = {k} needs more than k points, but there are {n}"
            ));
        }
        Ok(())
    }),
    doc: "k-th smallest distance from each point to the others (ties count once each).",
};

/// For each point i and channel, how many other points are strictly closer than `eps[i]`.
pub const RADIUS_COUNT: OpDef = OpDef {
    name: "RadiusCount",
    class: FusionClass::RowReduction,
    inputs: &[param("d", Ty::Pairs("n")), param("eps", Ty::Vector("n"))],
    output: Ty::Vector("n"),
    flow_channels: None,
    out_channels: None,
    states: crate::ops::StateTypes::NONE,
    precisions: &[Precision::Fp32],
    tensor_precisions: &[],
    lanes: 1,
    header: HEADER,
    cuda: "",
    device: "pptm_op_radius_count",
    cpu: CpuImpl::Row(|t, i, row, ch, out| {
        let eps = t.tensors[0][i];
        for (c, o) in out.iter_mut().enumerate().take(ch) {
            *o = row.chunks(ch).filter(|v| v[c] < eps).count() as f64;
        }
    }),
    check: None,
    doc: "Number of other points strictly within eps[i] of point i, per channel.",
};

/// The digamma function ψ (f64 here; f32 on the device).
pub fn digamma(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::NAN;
    }
    let mut x = x;
    let mut acc = 0.0;
    if x < 0.0 {
        // Reflection: ψ(1 - x) - ψ(x) = π cot(πx).
        let pi = std::f64::consts::PI;
        return digamma(1.0 - x) - pi / (pi * x).tan();
    }
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    acc + x.ln()
        - 0.5 / x
        - r * (1.0 / 12.0 - r * (1.0 / 120.0 - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r / 132.0))))
}

/// `ψ(x)` per element.
pub const DIGAMMA: OpDef = OpDef::elementwise(
    "Digamma",
    &[param("x", Ty::Like)],
    HEADER,
    "pptm_op_digamma",
    crate::element_fn!(|v| digamma(v[0])),
    "The digamma function psi(x).",
);

/// The KSG term of one point from its three neighbour counts (n_xz, n_yz, n_z):
/// `ψ(n_z + 1) - ψ(n_xz + 1) - ψ(n_yz + 1)`.
pub const KSG_DIGAMMA: OpDef = OpDef {
    flow_channels: Some(3),
    ..OpDef::elementwise(
        "KsgDigamma",
        &[param("counts", Ty::Like)],
        HEADER,
        "pptm_op_ksg_digamma",
        crate::element_fn!(|v| digamma(v[2] + 1.0) - digamma(v[0] + 1.0) - digamma(v[1] + 1.0)),
        "KSG term psi(n_z + 1) - psi(n_xz + 1) - psi(n_yz + 1) of the counts (n_xz, n_yz, n_z).",
    )
};

/// `x + ψ(k)`: the constant term of the KSG estimator, added once to the mean.
pub const ADD_DIGAMMA: OpDef = OpDef::elementwise(
    "AddDigamma",
    &[param("x", Ty::Like), param("k", Ty::U32)],
    HEADER,
    "pptm_op_add_digamma",
    crate::element_fn!(|v| v[0] + digamma(v[1])),
    "x + psi(k).",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digamma_reference_values() {
        let euler = 0.577_215_664_901_532_9;
        assert!((digamma(1.0) + euler).abs() < 1e-13);
        assert!((digamma(2.0) - (1.0 - euler)).abs() < 1e-13);
        assert!((digamma(0.5) - (-euler - 2.0 * 2f64.ln())).abs() < 1e-13);
        // ψ(n + 1) = H_n - γ.
        let h: f64 = (1..=1000).map(|k| 1.0 / k as f64).sum();
        assert!((digamma(1001.0) - (h - euler)).abs() < 1e-12);
        // Negative arguments by reflection: ψ(-1/4) = ψ(5/4) + π, with ψ(5/4) = 4 - γ - π/2 - 3 ln 2.
        let pi = std::f64::consts::PI;
        let psi_5_4 = 4.0 - euler - pi / 2.0 - 3.0 * 2f64.ln();
        assert!((digamma(1.25) - psi_5_4).abs() < 1e-13);
        assert!((digamma(-0.25) - (psi_5_4 + pi)).abs() < 1e-12);
        assert!(digamma(f64::NAN).is_nan());
        assert!(digamma(f64::NEG_INFINITY).is_nan());
        assert!(digamma(0.0).is_nan());
        assert!(digamma(-2.0).is_nan());
        assert!(
            (digamma(-0.5)
                - (digamma(1.5) - std::f64::consts::PI / (-std::f64::consts::FRAC_PI_2).tan()))
            .abs()
                < 1e-12
        );
    }

    #[test]
    fn feature_counts_that_overflow_are_refused() {
        // Found by tests/dsl_fuzz.rs: with no points (n = 0) every buffer is empty whatever the
        // coordinate counts, and a sum of them that wrapped (here to 1) passed the check.
        let dims = [("n", 0), ("dx", usize::MAX), ("dy", 2), ("dz", 0)];
        let err = features_fit(&dims, &["dx", "dy", "dz"]).unwrap_err();
        assert!(err.contains("at most 128"), "{err}");
        assert!(features_fit(&[("d", 128)], &["d"]).is_ok());
        assert!(features_fit(&[("d", 129)], &["d"]).is_err());
    }

    #[test]
    fn distances_round_like_f32() {
        let x = [0.1f32 as f64, 0.3f32 as f64];
        assert_eq!(chebyshev(&x, 1, 0, 1), f64::from((0.1f32 - 0.3f32).abs()));
    }
}

//! Divergences between distributions (device side: kernels/pptm/ops/divergence.cuh).

use super::{OpDef, Ty, param};

/// `q (ln q - ln p)` per element, with `0 ln 0 = 0`.
pub const KL_DIVERGENCE: OpDef = OpDef::elementwise(
    "KlDivergence",
    &[param("q", Ty::Like), param("p", Ty::Like)],
    "pptm/ops/divergence.cuh",
    "pptm_op_kl_divergence",
    crate::element_fn!(kl_divergence),
    "One term of the Kullback-Leibler divergence: q (ln q - ln p), with 0 ln 0 = 0.",
);

fn kl_divergence(x: &[f64]) -> f64 {
    let (q, p) = (x[0], x[1]);
    if q == 0.0 { 0.0 } else { q * (q.ln() - p.ln()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        assert_eq!(kl_divergence(&[0.0, 0.0]), 0.0);
        assert_eq!(kl_divergence(&[0.0, 0.5]), 0.0);
        assert_eq!(kl_divergence(&[0.5, 0.5]), 0.0);
        assert!((kl_divergence(&[0.5, 0.25]) - 0.5 * 2f64.ln()).abs() < 1e-15);
        assert_eq!(kl_divergence(&[0.5, 0.0]), f64::INFINITY);
    }
}

//! Ops for other crates' chains: declared here with `#[pptm::op]`, named by chains in crates that
//! depend on this one (tests/downstream/). This crate has no chains of its own.

use pptm::op;

/// softplus(x) = ln(1 + eˣ), computed without overflow for large x. Its f32 form serves fp32
/// stages.
#[op(f32_form)]
pub fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x + (-x).exp()
    } else {
        x.exp().ln_1p()
    }
}

/// The combine of a root-sum-of-squares reduction of already squared terms: their sum, and at
/// the end its square root (the Euclidean norm, with a `Square` stage before it).
#[op(reduction(identity = 0.0, finish = |total| total.sqrt()))]
pub fn root_sum(a: f64, b: f64) -> f64 {
    a + b
}

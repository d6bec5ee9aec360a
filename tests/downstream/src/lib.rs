//! Ops of this crate's own, written once as Rust functions, fused with pptm's built-in ops.
//!
//! Each `#[pptm::op]` function stays an ordinary function (it is the op's CPU reference) and also
//! becomes device code and a marker type (its name in CamelCase) that chains name as a stage.

use pptm::ops::{Axpby, Gemv, Square, SumReduction};
use pptm::{FusionBuilder, op};
use pptm_downstream_ops::{RootSum, Softplus};

/// swish(x; β) = x / (1 + e^(−βx)).
#[op]
pub fn swish(x: f32, beta: f32) -> f32 {
    x / (1.0 + (-beta * x).exp())
}

/// The Huber loss of a residual: quadratic within δ of zero, linear beyond. Written in f64 (its
/// CPU reference, and what fp64 stages run); `f32_form` gives fp32 stages an f32 device form of
/// the same function.
#[op(f32_form)]
pub fn huber(r: f64, delta: f32) -> f64 {
    let a = r.abs();
    let d = delta as f64;
    if a <= d {
        0.5 * r * r
    } else {
        d * (a - 0.5 * d)
    }
}

/// log(eᵃ + eᵇ) without overflow: the combine of a log-sum-exp reduction (associative and
/// commutative; its identity is −∞, the log of an empty sum).
#[op(reduction(identity = f64::NEG_INFINITY))]
pub fn log_sum_exp(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if m == f64::NEG_INFINITY {
        m
    } else {
        m + ((a - m).exp() + (b - m).exp()).ln()
    }
}

/// A dense layer with a swish activation: swish(A x; β), the op fused into the GEMV's epilogue.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct SwishLayer {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    activation: Swish,
}

/// Σ huber(α·pred + β·target; δ): the residual by a built-in op, the loss of one's own, a
/// built-in sum; with α = 1, β = −1 the Huber loss of a prediction.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct HuberLoss {
    #[stage(1)]
    residual: Axpby,
    #[stage(2)]
    loss: Huber,
    #[stage(3, reduction = true)]
    total: SumReduction,
}

/// [`HuberLoss`] with every stage in f64.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct HuberLossF64 {
    #[stage(1, precision = "fp64")]
    residual: Axpby,
    #[stage(2, precision = "fp64")]
    loss: Huber,
    #[stage(3, reduction = true, precision = "fp64")]
    total: SumReduction,
}

/// log Σ exp(A x): a log-partition, the reduction of one's own as the GEMV's epilogue.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct LogPartition {
    #[stage(1)]
    logits: Gemv,
    #[stage(2, reduction = true)]
    lse: LogSumExp,
}

/// log Σ exp(swish(x; β)): one's own elementwise op as the prologue of one's own reduction.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct SwishLogSumExp {
    #[stage(1)]
    activation: Swish,
    #[stage(2, reduction = true)]
    lse: LogSumExp,
}

/// softplus(A x): an op declared in another crate (pptm-downstream-ops) as the GEMV's epilogue.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct SoftplusLayer {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    activation: Softplus,
}

/// Σ softplus(x) in f64: the other crate's op in an fp64 stage (its f64 form).
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct SoftplusSumF64 {
    #[stage(1, precision = "fp64")]
    activation: Softplus,
    #[stage(2, reduction = true, precision = "fp64")]
    total: SumReduction,
}

/// ‖x‖₂ = √Σ x²: a built-in op as the prologue of a reduction declared in another crate.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct EuclideanNorm {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true)]
    norm: RootSum,
}

/// log Σⱼ exp(swish(xᵢⱼ; β)) of each row of a rows × cols matrix (the log-normaliser of a softmax
/// over each row): one's own reduction folding each row (`per_row = true`).
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct RowSwishLogSumExp {
    #[stage(1)]
    activation: Swish,
    #[stage(2, reduction = true, per_row = true)]
    lse: LogSumExp,
}

/// ‖xᵢ‖₂ of each row i: the other crate's reduction, row-wise.
#[derive(FusionBuilder)]
#[fusion(domain = "downstream")]
pub struct RowNorms {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true, per_row = true)]
    norm: RootSum,
}

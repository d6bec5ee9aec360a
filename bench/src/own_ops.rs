//! One chain twice: built-in ops, and the same ops written as ops of one's own (`#[pptm::op]`),
//! in one domain so that both run on the same manifold. pptm-bench times both (cases
//! `squared_residual` and `squared_residual_own_ops`): user ops cost what built-ins cost. And the
//! built-in chain folded per row of a matrix (`row_squared_residual`).

use pptm::ops::{Axpby, Gemv, Square, SumReduction};
use pptm::{FusionBuilder, op};

/// α x + β y, as the built-in `Axpby`.
#[op(tensors(y))]
pub fn own_axpby(x: f32, y: f32, alpha: f32, beta: f32) -> f32 {
    alpha * x + beta * y
}

/// x², as the built-in `Square`.
#[op]
pub fn own_square(x: f32) -> f32 {
    x * x
}

/// a + b, as the built-in `SumReduction` (f64 accumulation).
#[op(reduction(identity = 0.0))]
pub fn own_sum(a: f64, b: f64) -> f64 {
    a + b
}

/// Σ (α x + β y)² with built-in ops.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct SquaredResidual {
    #[stage(1)]
    residual: Axpby,
    #[stage(2)]
    square: Square,
    #[stage(3, reduction = true)]
    total: SumReduction,
}

/// Σ (α x + β y)² with the ops above.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct SquaredResidualOwnOps {
    #[stage(1)]
    residual: OwnAxpby,
    #[stage(2)]
    square: OwnSquare,
    #[stage(3, reduction = true)]
    total: OwnSum,
}

/// Σⱼ (α xᵢⱼ + β yᵢⱼ)² of each row i of rows × cols matrices: the same ops, folded per row
/// (`per_row = true`, the `Rows` pass), one value per row stored.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct RowSquaredResidual {
    #[stage(1)]
    residual: Axpby,
    #[stage(2)]
    square: Square,
    #[stage(3, reduction = true, per_row = true)]
    total: SumReduction,
}

/// α x + β y, stored: the step of the dependent-steps cases (`dependent_steps_waited`,
/// `dependent_steps_pipeline`), each step reading what the one before it wrote.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct Blend {
    #[stage(1)]
    blend: Axpby,
}

/// `Blend` 8 times over in one fused pass (`repeat`): the dependent-steps case
/// `dependent_steps_fused`, small.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct Blend8 {
    #[stage(1, repeat = 8)]
    blend: Axpby,
}

/// `Blend` 32 times over in one fused pass: `dependent_steps_fused`, medium.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct Blend32 {
    #[stage(1, repeat = 32)]
    blend: Axpby,
}

/// `Blend` 170 times over in one fused pass: `dependent_steps_fused`, large.
#[derive(FusionBuilder)]
#[fusion(domain = "ops_compare")]
pub struct Blend170 {
    #[stage(1, repeat = 170)]
    blend: Axpby,
}

/// y ← A x: the step of the dependent-GEMV cases (`dependent_gemv_*`), each step's x what the one
/// before it wrote. A domain of its own, so that its GEMV pattern does not reshape the register
/// allocation of the elementwise chains above.
#[derive(FusionBuilder)]
#[fusion(domain = "gemv_steps")]
pub struct GemvStep {
    #[stage(1)]
    product: Gemv,
}

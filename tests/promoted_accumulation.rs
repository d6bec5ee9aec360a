//! `accumulate = "promoted"` on a bf16 tensor-core product: on Hopper the wgmma path adds its
//! accumulators into f32 sums every 512 of k (kernels/pptm/pattern/wgmma.cuh, PROMOTE), on 128 x
//! 128 tiles; elsewhere the product runs as without it. gelu(A W + b) on every backend against
//! an f64 reference of the same operand values (tests/common/tensor.rs), output poisoned, with
//! the wgmma path and the mma.sync fallback both taken on Hopper. Its own binary and domain: the
//! domain's kernels take a whole SM's shared memory, as tests/tensor_core.rs's do.

#[macro_use]
mod common;

use pptm::FusionBuilder;
use pptm::ops::{AddBias, Gelu, Matmul};

/// gelu(A W + b), the product's partial sums promoted.
#[derive(FusionBuilder)]
#[fusion(domain = "promoted")]
pub struct MatmulBiasGeluPromoted {
    #[stage(1, tensor_eligible = true, precision = "bf16", accumulate = "promoted")]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

fn promoted_sums_match_f64_reference(rt: &pptm::Runtime) {
    common::tensor::promoted_matmul(rt, |rt, a, w, b, out, m, k| {
        MatmulBiasGeluPromoted::submit(rt, a, w, b, out, m, k)
    });
}

on_every_backend!(promoted_sums_match_f64_reference);

//! BatchedMatmul: `gelu(A[s] W[s] + b)` for a batch of small products of one shape, on every
//! backend, against f64 references (the body in tests/common/tensor.rs): bf16 (the library's
//! `BatchedMatmulBiasGeluBf16`), fp16 and fp8 operands on tensor cores, and f32 on CUDA cores.
//! The chains other than the library's are declared here, in its domain `batched`.

#[macro_use]
mod common;

use common::tensor::batched_matmul;
use pptm::chains::BatchedMatmulBiasGeluBf16;
use pptm::ops::{AddBias, BatchedMatmul, Gelu};
use pptm::{Error, F8E4M3, FusionBuilder, Runtime, bf16, f16};

/// [`BatchedMatmulBiasGeluBf16`] with fp16 operands.
#[derive(FusionBuilder)]
#[fusion(domain = "batched_variants")]
pub struct BatchedMatmulBiasGeluF16 {
    #[stage(1, tensor_eligible = true, precision = "fp16")]
    product: BatchedMatmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// [`BatchedMatmulBiasGeluBf16`] with fp8 (E4M3) operands: on Hopper's e4m3 wgmma where the
/// products have 128 x 128 outputs or more and k is whole slices of 128, elsewhere widened to fp16
/// as they are staged for mma.sync.
#[derive(FusionBuilder)]
#[fusion(domain = "batched_variants")]
pub struct BatchedMatmulBiasGeluFp8 {
    #[stage(1, tensor_eligible = true, precision = "fp8")]
    product: BatchedMatmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// The batched product in f32 on CUDA cores.
#[derive(FusionBuilder)]
#[fusion(domain = "batched_variants")]
pub struct BatchedMatmulBiasGeluF32 {
    #[stage(1)]
    product: BatchedMatmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

batched_operand!(bf16, "bf16", BatchedMatmulBiasGeluBf16, bf16::from_f32);
batched_operand!(f16, "fp16", BatchedMatmulBiasGeluF16, f16::from_f32);
batched_operand!(F8E4M3, "fp8", BatchedMatmulBiasGeluFp8, F8E4M3::from_f32);
batched_operand!(f32, "f32", BatchedMatmulBiasGeluF32, |x: f32| x);

fn bf16_batched_matmul_matches_f64_reference(rt: &Runtime) {
    batched_matmul::<bf16>(rt);
}

fn f16_batched_matmul_matches_f64_reference(rt: &Runtime) {
    batched_matmul::<f16>(rt);
}

fn fp8_batched_matmul_matches_f64_reference(rt: &Runtime) {
    batched_matmul::<F8E4M3>(rt);
}

fn f32_batched_matmul_matches_f64_reference(rt: &Runtime) {
    batched_matmul::<f32>(rt);
}

/// Buffers that do not hold `batch` products of the given shape are typed errors, before
/// anything runs.
fn bad_batch_shapes_are_typed_errors(rt: &Runtime) {
    // batch 2, m 2, k 3, n 2: a holds 12, w 12, out 8.
    let a = rt.upload(&[bf16::from_f32(1.0); 12]).unwrap();
    let w = rt.upload(&[bf16::from_f32(1.0); 12]).unwrap();
    let b = rt.upload(&[0.0f32; 2]).unwrap();
    let mut out = rt.alloc::<f32>(8).unwrap();
    BatchedMatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, 2, 2, 3)
        .unwrap()
        .wait()
        .unwrap();
    // A batch of 3 would need 18 values of a.
    let e = BatchedMatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, 3, 2, 3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                arg: "a",
                expected: 18,
                got: 12,
                ..
            }
        ),
        "{e}"
    );
    // m 3: a needs 18 too; m 1, k 6: w would be 2 x 6 x 2 = 24.
    let e = BatchedMatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, 2, 1, 6).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                arg: "w",
                expected: 24,
                got: 12,
                ..
            }
        ),
        "{e}"
    );
    // Sizes whose product overflows are refused, not wrapped.
    let e = BatchedMatmulBiasGeluBf16::submit(rt, &a, &w, &b, &mut out, usize::MAX / 2, 2, 3)
        .unwrap_err();
    assert!(
        matches!(e, Error::BadArguments { .. } | Error::LengthMismatch { .. }),
        "{e}"
    );
}

on_every_backend!(
    bf16_batched_matmul_matches_f64_reference,
    f16_batched_matmul_matches_f64_reference,
    fp8_batched_matmul_matches_f64_reference,
    f32_batched_matmul_matches_f64_reference,
    bad_batch_shapes_are_typed_errors,
);

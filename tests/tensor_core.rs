//! MatmulBiasGelu{Bf16,F16} (16-bit operands on tensor cores, domain `tensor`) on every backend,
//! against f64 references (tests/common/tensor.rs). The fp8 chain is checked by the same body in
//! tests/precision_fp8.rs.
//!
//! On H100/H200 the domain's kernels run one block an SM with 226 KiB of shared memory, so nothing
//! else fits beside a block of them: this binary's persistent runtime takes at most
//! `common::TENSOR_BINARY_SMS` SMs (tests/common/mod.rs), leaving the rest to the launched
//! variants' kernels that its other tests run at the same time.

#[macro_use]
mod common;

use common::tensor::tensor_core_matmul;
use pptm::chains::{MatmulBiasGeluBf16, MatmulBiasGeluF16};
use pptm::{Arg, DType, Error, Runtime, bf16, f16};

operand!(bf16, "bf16", MatmulBiasGeluBf16);
operand!(f16, "fp16", MatmulBiasGeluF16);

fn bf16_matmul_bias_gelu_matches_f64_reference(rt: &Runtime) {
    tensor_core_matmul::<bf16>(rt);
}

fn f16_matmul_bias_gelu_matches_f64_reference(rt: &Runtime) {
    tensor_core_matmul::<f16>(rt);
}

/// A buffer of the wrong element type is a typed error, not a reinterpretation of its bytes.
fn wrong_operand_type_is_a_typed_error(rt: &Runtime) {
    let a = rt.upload(&[1.0f32; 4]).unwrap();
    let w = rt.upload(&[bf16::from_f32(1.0); 4]).unwrap();
    let b = rt.upload(&[0.0f32; 2]).unwrap();
    let mut out = rt.alloc::<f32>(4).unwrap();
    let e = rt
        .submit_chain::<MatmulBiasGeluBf16>(vec![
            Arg::Input("a", (&a).into()),
            Arg::Input("w", (&w).into()),
            Arg::Input("b", (&b).into()),
            Arg::Output("out", &mut out),
            Arg::Dim("m", 2),
            Arg::Dim("k", 2),
        ])
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                arg: "a",
                expected: DType::Bf16,
                got: DType::F32,
                ..
            }
        ),
        "{e}"
    );
}

on_every_backend!(
    bf16_matmul_bias_gelu_matches_f64_reference,
    f16_matmul_bias_gelu_matches_f64_reference,
    wrong_operand_type_is_a_typed_error,
);

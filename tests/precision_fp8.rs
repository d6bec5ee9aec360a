//! `precision = "fp8"` on a tensor-core Matmul: A and W are OCP E4M3 buffers
//! ([`pptm::F8E4M3`]). On Hopper, shapes with k and n multiples of 16 and 2^24 multiply-adds or
//! more run on e4m3 wgmma, each 128 of k summed in f32 (the shapes (1000, 1040, 272) and
//! (130, 4096, 512) of the body); the rest, and every other GPU, widen them exactly to fp16 for
//! `mma.sync`, f32 accumulation. Checked on every backend by the body the bf16/fp16 chains use
//! (tests/common/tensor.rs), with the same shapes and bar, except 1e-3 of the terms' magnitude
//! rather than 1e-4 for the shapes fp8 wgmma may take: the fp8 tensor cores add with about 13
//! mantissa bits within a slice. The chain is
//! the library's (`pptm::chains::MatmulBiasGeluFp8`, domain `fp8`), which pptm-bench times too.

#[macro_use]
mod common;

use common::tensor::tensor_core_matmul;
use pptm::chains::MatmulBiasGeluFp8;
use pptm::{F8E4M3, Runtime};

operand!(F8E4M3, "fp8", MatmulBiasGeluFp8);

fn fp8_matmul_bias_gelu_matches_f64_reference(rt: &Runtime) {
    tensor_core_matmul::<F8E4M3>(rt);
}

/// Values beyond E4M3's range saturate to ±448 on the way in (the host conversion), and the
/// product sees exactly those values.
fn out_of_range_operands_saturate(rt: &Runtime) {
    let (m, k, n) = (2, 8, 8);
    let a: Vec<F8E4M3> = [1000.0f32, -1000.0]
        .iter()
        .flat_map(|&v| std::iter::repeat_n(F8E4M3::from_f32(v), k))
        .collect();
    let w = vec![F8E4M3::from_f32(0.125); k * n];
    let b = vec![0.0f32; n];
    let (ab, wb, bb) = (
        rt.upload(&a).unwrap(),
        rt.upload(&w).unwrap(),
        rt.upload(&b).unwrap(),
    );
    let mut out = rt.upload(&vec![f32::NAN; m * n]).unwrap();
    MatmulBiasGeluFp8::submit(rt, &ab, &wb, &bb, &mut out, m, k)
        .unwrap()
        .wait()
        .unwrap();
    let got = out.to_vec().unwrap();
    // Row 0: 8 x 448 x 0.125 = 448, gelu(448) = 448; row 1: gelu(-448) = -0 (to f32).
    for j in 0..n {
        assert_eq!(got[j], 448.0, "row 0, column {j}");
        assert!(
            got[n + j].abs() < 1e-30,
            "row 1, column {j}: {}",
            got[n + j]
        );
    }
}

on_every_backend!(
    fp8_matmul_bias_gelu_matches_f64_reference,
    out_of_range_operands_saturate,
);

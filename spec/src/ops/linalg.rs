//! Linear algebra and activations (device side: kernels/pptm/ops/linalg.cuh, which builds on the
//! GEMV and matmul patterns of kernels/pptm/pattern/linear.cuh).

use super::{Anchor, CpuImpl, FusionClass, OpDef, OpInputs, Ty, param};
use crate::Precision;

const HEADER: &str = "pptm/ops/linalg.cuh";

const fn output_fusable(
    anchor: Anchor,
    name: &'static str,
    inputs: &'static [super::Param],
    output: Ty,
    device: &'static str,
    f: fn(&OpInputs) -> Vec<f64>,
    doc: &'static str,
) -> OpDef {
    OpDef {
        name,
        class: FusionClass::OutputFusable(anchor),
        inputs,
        output,
        flow_channels: Some(1),
        out_channels: Some(1),
        states: crate::ops::StateTypes::NONE,
        precisions: &[Precision::Fp32],
        tensor_precisions: &[],
        lanes: 1,
        header: HEADER,
        cuda: "",
        device,
        cpu: CpuImpl::Tensor(f),
        check: None,
        doc,
    }
}

/// What a GEMV's precision means on CUDA cores: the storage of A (f32, or bf16, fp16, E4M3: a half
/// or a quarter of the bytes its time is made of), each element widened exactly to f32 as it is
/// loaded; the vector, the sums and the output stay f32 (kernels/pptm/pattern/linear.cuh).
/// fp64 is not offered: the patterns accumulate in f32.
const GEMV_STORAGE: &[Precision] = &[
    Precision::Fp32,
    Precision::Bf16,
    Precision::Fp16,
    Precision::Fp8,
];

/// `A x`: A is m×n row-major, x has n elements; the result has m. On CUDA cores A is f32, bf16,
/// fp16 or E4M3 (`GEMV_STORAGE`); with `tensor_eligible = true` and precision "bf16" or "fp8", A
/// is a bf16 or E4M3 buffer widened exactly to bf16 and multiplied on tensor cores by the f32
/// vector, which is carried as two bf16 parts so that it is not rounded
/// (kernels/pptm/pattern/mma.cuh, pptm_gemv_n_mma). fp16 is not offered there: its range could not
/// carry an f32 vector in two parts.
pub const GEMV: OpDef = OpDef {
    precisions: GEMV_STORAGE,
    tensor_precisions: &[Precision::Bf16, Precision::Fp8],
    lanes: 1,
    ..output_fusable(
        Anchor::Gemv,
        "Gemv",
        &[
            param("x", Ty::Vector("n")),
            param("a", Ty::Matrix("m", "n")),
        ],
        Ty::Vector("m"),
        "pptm_gemv_n",
        |t| {
            let (m, n) = (t.dim("m"), t.dim("n"));
            let a = t.tensors[0];
            (0..m)
                .map(|i| (0..n).map(|j| a[i * n + j] * t.flow[j]).sum())
                .collect()
        },
        "Matrix-vector product A x (A: m x n, row-major): an f32, bf16, fp16 or fp8 A on CUDA cores, or a bf16 or fp8 A on tensor cores, times the f32 vector.",
    )
};

/// `Aᵀ x`: A is m×n row-major, x has m elements; the result has n. A is f32, bf16, fp16 or E4M3
/// (`GEMV_STORAGE`), on CUDA cores.
pub const GEMV_T: OpDef = OpDef {
    precisions: GEMV_STORAGE,
    ..output_fusable(
        Anchor::GemvT,
        "GemvT",
        &[
            param("x", Ty::Vector("m")),
            param("a", Ty::Matrix("m", "n")),
        ],
        Ty::Vector("n"),
        "pptm_gemv_t",
        |t| {
            let (m, n) = (t.dim("m"), t.dim("n"));
            let a = t.tensors[0];
            (0..n)
                .map(|j| (0..m).map(|i| a[i * n + j] * t.flow[i]).sum())
                .collect()
        },
        "Transposed matrix-vector product A^T x (A: m x n, row-major; f32, bf16, fp16 or fp8 A, f32 sums).",
    )
};

/// `A W`: A is m×k, W is k×n, both row-major; the result is m×n. f32 on CUDA cores; with
/// `tensor_eligible = true`, bf16, fp16 or fp8 (E4M3: widened to fp16 as staged for mma.sync, or
/// as they are on Hopper's e4m3 wgmma) operands on tensor cores (f32 accumulation, f32 output),
/// or f32 operands as three bf16 products (bf16x3, pattern/mma.cuh's pptm_matmul_bf16x3).
pub const MATMUL: OpDef = OpDef {
    tensor_precisions: &[
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
        Precision::Bf16x3,
    ],
    lanes: 1,
    ..output_fusable(
        Anchor::Matmul,
        "Matmul",
        &[
            param("a", Ty::Matrix("m", "k")),
            param("w", Ty::Matrix("k", "n")),
        ],
        Ty::Matrix("m", "n"),
        "pptm_matmul",
        |t| matmul_ref(t, 1),
        "Matrix product A W (A: m x k, W: k x n, row-major): f32 on CUDA cores, or bf16/fp16 operands on tensor cores with f32 accumulation.",
    )
};

/// `A[s] W[s]` for every s < batch: `batch` independent products of one shape (the many small
/// GEMMs of attention heads, experts, or a batch of small models), stacked one after another in
/// A (batch×m×k), W (batch×k×n) and the result (batch×m×n). A bias after it (AddBias) is one per
/// column, shared by every product. Precisions as [`MATMUL`] but bf16x3; the tensor-core path is
/// mma.sync (no wgmma: its products are small by intent), its tiles numbered across the whole
/// batch so that small products still fill the GPU.
pub const BATCHED_MATMUL: OpDef = OpDef {
    tensor_precisions: &[Precision::Bf16, Precision::Fp16, Precision::Fp8],
    lanes: 1,
    ..output_fusable(
        Anchor::BatchedMatmul,
        "BatchedMatmul",
        &[
            param("a", Ty::Batch("batch", "m", "k")),
            param("w", Ty::Batch("batch", "k", "n")),
        ],
        Ty::Batch("batch", "m", "n"),
        "pptm_matmul_batched",
        |t| matmul_ref(t, t.dim("batch")),
        "Batched matrix product A[s] W[s] for s < batch (A: batch x m x k, W: batch x k x n, row-major, stacked): f32 on CUDA cores, or bf16/fp16 operands on tensor cores with f32 accumulation.",
    )
};

/// Whether `op` is a matrix product (single or batched): the ops the matmul pattern runs.
pub fn is_matmul(op: &OpDef) -> bool {
    matches!(
        op.class,
        FusionClass::OutputFusable(Anchor::Matmul | Anchor::BatchedMatmul)
    )
}

/// The f64 reference of `batch` stacked products A[s] W[s] (`batch` = 1: one product).
fn matmul_ref(t: &OpInputs, batch: usize) -> Vec<f64> {
    let (m, k, n) = (t.dim("m"), t.dim("k"), t.dim("n"));
    let (a, w) = (t.flow, t.tensors[0]);
    let mut c = vec![0.0; batch * m * n];
    if k == 0 || n == 0 {
        // No terms, or no outputs: m (a size parameter) bounds nothing else, and a loop over it
        // would only spin.
        return c;
    }
    for s in 0..batch {
        let (a, w) = (
            &a[s * m * k..(s + 1) * m * k],
            &w[s * k * n..(s + 1) * k * n],
        );
        let c = &mut c[s * m * n..(s + 1) * m * n];
        for i in 0..m {
            for p in 0..k {
                let aip = a[i * k + p];
                for j in 0..n {
                    c[i * n + j] += aip * w[p * n + j];
                }
            }
        }
    }
    c
}

/// `x[i, j] + b[j]`: a bias per column, broadcast along the rows.
pub const ADD_BIAS: OpDef = OpDef {
    class: FusionClass::Broadcast,
    ..OpDef::elementwise(
        "AddBias",
        &[param("x", Ty::Like), param("b", Ty::Row)],
        HEADER,
        "pptm_op_add_bias",
        crate::element_fn!(|v| v[0] + v[1]),
        "x + b, b broadcast along the rows (one value per column).",
    )
};

/// `x Φ(x) = x/2 (1 + erf(x / √2))`: the exact GELU (PyTorch's default), not the tanh form.
pub const GELU: OpDef = OpDef::elementwise(
    "Gelu",
    &[param("x", Ty::Like)],
    HEADER,
    "pptm_op_gelu",
    crate::element_fn!(|v| 0.5 * v[0] * (1.0 + libm::erf(v[0] / std::f64::consts::SQRT_2))),
    "GELU, exact form: x/2 (1 + erf(x / sqrt 2)).",
);

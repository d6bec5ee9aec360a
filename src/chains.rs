//! Chains that ship with pptm.

use crate::FusionBuilder;
use crate::ops::{
    Accuracy, AddBias, AddDigamma, Axpby, BatchedMatmul, ChebyshevDistance, Gelu, Gemv, GemvT,
    KlDivergence, KsgDigamma, KthSmallest, Matmul, MeanReduction, PrecisionWeight, PredictionError,
    RadiusCount, Relu, Sigmoid, Square, SubspaceDistances, SumReduction, Tanh,
};

/// KL divergence of two distributions: `Σ q_i (ln q_i − ln p_i)`, with `0 ln 0 = 0`, in one fused
/// pass (each block reduces its share; the last block to finish combines the partials).
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct KlComplexity {
    #[stage(1)]
    kl: KlDivergence,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// The per-element KL terms `q_i (ln q_i − ln p_i)`, written to `out`.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct KlTerms {
    #[stage(1)]
    kl: KlDivergence,
}

/// Precision-weighted accuracy of predictions: `−½ Σ prec_i (obs_i − pred_i)²`, in one fused pass.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct AccuracyPipeline {
    #[stage(1)]
    error: PredictionError,
    #[stage(2)]
    accuracy: Accuracy,
    #[stage(3, reduction = true)]
    total: SumReduction,
}

/// One gradient step on beliefs: `mu + lr · Jᵀ (prec ⊙ (obs − pred))` (J: m×n, argument `a`;
/// obs, pred, prec: m; mu, out: n). The weighted error is computed where the transposed GEMV
/// reads it, and the update is applied to each output before it is stored: one pass.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct BeliefUpdateStep {
    #[stage(1)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3)]
    gradient: GemvT,
    #[stage(4)]
    update: crate::ops::BeliefUpdate,
}

/// [`BeliefUpdateStep`] with the Jacobian J stored in bf16: the transposed GEMV that reads it, the
/// chain's cost at large sizes, streams half the bytes. The error, the weighting, the sums and the
/// update stay f32.
///
/// Domain `narrow` holds the GEMVs that read a bf16, fp16 or fp8 matrix on CUDA cores. They are
/// kept out of `inference` and `linear_algebra` because a manifold is one kernel under 64
/// registers a thread: inlined beside the f32 chains, their patterns raised KlComplexity's spills
/// from 8 to 56 bytes and the linear_algebra manifold's from 780 to 1928 (ptxas, sm_90a). Used
/// beside chains of another domain, each domain gets its own manifold and share of the SMs (on
/// demand, or up front with `Runtime::prepare_domains`).
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct BeliefUpdateStepBf16 {
    #[stage(1)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3, precision = "bf16")]
    gradient: GemvT,
    #[stage(4)]
    update: crate::ops::BeliefUpdate,
}

/// For each of n points (rows of `x`, n×d), the Chebyshev distance to its k-th nearest other
/// point, written to `out`. The n×n distance matrix is never stored.
#[derive(FusionBuilder)]
#[fusion(domain = "transfer_entropy")]
pub struct DistanceKth {
    #[stage(1)]
    distances: ChebyshevDistance,
    #[stage(2)]
    kth: KthSmallest,
}

/// The KSG transfer-entropy estimate from radii `eps` (each point's k-th neighbour distance in
/// the joint space): `ψ(k) + mean_i(ψ(n_z+1) − ψ(n_xz+1) − ψ(n_yz+1))`, counting the points
/// strictly within `eps[i]` in the (x,z), (y,z) and (z) spaces, in one pass over the pairs.
#[derive(FusionBuilder)]
#[fusion(domain = "transfer_entropy")]
pub struct TeReduction {
    #[stage(1)]
    distances: SubspaceDistances,
    #[stage(2)]
    counts: RadiusCount,
    #[stage(3)]
    terms: KsgDigamma,
    #[stage(4, reduction = true)]
    mean: MeanReduction,
    #[stage(5)]
    estimate: AddDigamma,
}

/// `z = α A x + β y` (A: m×n), reduced to `Σ z²` in the same pass (a residual norm).
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvAxpbySum {
    #[stage(1)]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// [`GemvAxpbySum`] with A stored in bf16 and multiplied on tensor cores: half the bytes the f32
/// chain streams, which is what a large GEMV's time is. The vector stays f32 (carried to the tensor
/// cores as two bf16 parts), so the result is A's bf16 values times x to f32 accuracy.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvAxpbySumBf16 {
    #[stage(1, tensor_eligible = true, precision = "bf16")]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// `y = A x` with A stored in bf16, on tensor cores (see [`GemvAxpbySumBf16`]); every output
/// element is stored.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvBf16 {
    #[stage(1, tensor_eligible = true, precision = "bf16")]
    product: Gemv,
}

/// [`GemvAxpbySum`] with A stored in fp8 (OCP E4M3, [`crate::F8E4M3`]): a quarter of the f32
/// chain's bytes. Its values are widened exactly to bf16 on the tensor cores; the vector stays f32.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvAxpbySumFp8 {
    #[stage(1, tensor_eligible = true, precision = "fp8")]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// `y = A x` with A stored in fp8 (E4M3), on tensor cores; every output element is stored.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct GemvFp8 {
    #[stage(1, tensor_eligible = true, precision = "fp8")]
    product: Gemv,
}

/// [`GemvAxpbySum`] with A stored in fp16, on CUDA cores: each element widened to f32 as it is
/// loaded, the vector and the sums f32 (fp16 takes no tensor-core GEMV: its range could not carry
/// the f32 vector in two parts).
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct GemvAxpbySumFp16 {
    #[stage(1, precision = "fp16")]
    product: Gemv,
    #[stage(2)]
    axpby: Axpby,
    #[stage(3)]
    square: Square,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// `y = A x` with A stored in fp16, on CUDA cores (see [`GemvAxpbySumFp16`]); every output element
/// is stored.
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct GemvFp16 {
    #[stage(1, precision = "fp16")]
    product: Gemv,
}

/// `y = Aᵀ x` (A: m×n, x: m, y: n) with A stored in bf16: half the bytes of an f32 A, which is
/// what a large transposed GEMV's time is. Each element is widened to f32 as it is loaded; the
/// vector and the sums stay f32 (CUDA cores).
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct GemvTBf16 {
    #[stage(1, precision = "bf16")]
    product: GemvT,
}

/// [`GemvTBf16`] with A stored in fp16.
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct GemvTFp16 {
    #[stage(1, precision = "fp16")]
    product: GemvT,
}

/// [`GemvTBf16`] with A stored in fp8 (OCP E4M3, [`crate::F8E4M3`]): a quarter of an f32 A's bytes.
#[derive(FusionBuilder)]
#[fusion(domain = "narrow")]
pub struct GemvTFp8 {
    #[stage(1, precision = "fp8")]
    product: GemvT,
}

/// A dense layer: `gelu(A W + b)` (A: m×k, W: k×n, b: n), f32 on CUDA cores, the bias and
/// activation applied to each output before it is stored.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasGelu {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// `relu(A W + b)`; see [`MatmulBiasGelu`].
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasRelu {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Relu,
}

/// `sigmoid(A W + b)`; see [`MatmulBiasGelu`].
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasSigmoid {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Sigmoid,
}

/// `tanh(A W + b)`; see [`MatmulBiasGelu`].
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasTanh {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Tanh,
}

/// A dense layer on tensor cores: `gelu(A W + b)` with A (m×k) and W (k×n) in bf16, products
/// accumulated in f32, the f32 bias and activation applied to each accumulator in registers before
/// the f32 output is stored. On H100/H200 (compute_90a) large products run on `wgmma` fed by TMA,
/// the rest on `mma.sync`. Domain `tensor`: its kernels run one block an SM with 226 KiB of shared
/// memory there, which the other domains' chains do not want.
#[derive(FusionBuilder)]
#[fusion(domain = "tensor")]
pub struct MatmulBiasGeluBf16 {
    #[stage(1, tensor_eligible = true, precision = "bf16")]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// The f32 dense layer `gelu(A W + b)` of [`MatmulBiasGelu`] on tensor cores at f32's accuracy
/// (`precision = "bf16x3"`): A, W, the bias and the output are f32; each operand is split into a
/// high and a low bf16 half and the product sums three bf16 products (hi·hi + lo·hi + hi·lo), each
/// term within about 2^-16 of its f32 value. On H100/H200 the item's blocks write the halves into
/// working memory the runtime lends (`ChainIr::scratch`: 4 (m + n) k bytes, about) and multiply them
/// by `wgmma`; elsewhere, and in the launched variants, the product runs in f32 on CUDA cores.
#[derive(FusionBuilder)]
#[fusion(domain = "tensor")]
pub struct MatmulBiasGeluBf16x3 {
    #[stage(1, tensor_eligible = true, precision = "bf16x3")]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// `gelu(A[s] W[s] + b)` for every s < `batch`: many small dense layers of one shape (attention
/// heads, experts, an ensemble) in one item, bf16 operands on tensor cores (`mma.sync`), f32
/// accumulation, the shared f32 bias and the activation applied in registers before the f32 output
/// is stored. A is batch×m×k and W batch×k×n, each product's matrix after the previous one's; the
/// tiles of all products are spread over the GPU together, so a batch of 64×64 products fills it
/// where one would take a single block. Domain `batched`: a chain of the `tensor` domain would
/// be a call from its manifold, whose inlined wgmma loop it would make save registers.
#[derive(FusionBuilder)]
#[fusion(domain = "batched")]
pub struct BatchedMatmulBiasGeluBf16 {
    #[stage(1, tensor_eligible = true, precision = "bf16")]
    product: BatchedMatmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// [`MatmulBiasGeluBf16`] with A and W stored in fp8 (OCP E4M3, [`crate::F8E4M3`]): a quarter of
/// the f32 chain's operand bytes. On Hopper (compute_90a), products with k and n multiples of 16
/// and at least 2^24 multiply-adds run on fp8 tensor cores (e4m3 wgmma: TMA brings the operands,
/// W's slices are transposed in shared memory, and each slice of 128 of k is summed in f32, since
/// the fp8 MMA's own accumulation keeps about 13 bits). Elsewhere the values are widened exactly
/// to fp16 as they are staged and multiplied by `mma.sync`, f32 accumulation. Domain `fp8`: one
/// 512-thread block an SM on Hopper, as the `tensor` domain.
#[derive(FusionBuilder)]
#[fusion(domain = "fp8")]
pub struct MatmulBiasGeluFp8 {
    #[stage(1, tensor_eligible = true, precision = "fp8")]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// [`MatmulBiasGeluBf16`] with fp16 operands.
#[derive(FusionBuilder)]
#[fusion(domain = "tensor")]
pub struct MatmulBiasGeluF16 {
    #[stage(1, tensor_eligible = true, precision = "fp16")]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

/// `gelu(A W + b)` multiplied in fp16 on tensor cores under the accuracy guard: A and W stay f32
/// and are rounded to fp16 as they are read. Before each product the device compares 16 sampled
/// outputs in fp16 and in f32; when they differ by more than 1e-2 of their terms' magnitude (an
/// operand beyond fp16's range becomes infinite), the product runs in f32 on CUDA cores, and the
/// runtime keeps that shape in f32 until [`Runtime::reset_guard`](crate::Runtime::reset_guard).
/// [`Runtime::guard_stats`](crate::Runtime::guard_stats) counts what happened.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct MatmulBiasGeluGuarded {
    #[stage(1, tensor_eligible = true, precision = "fp16", tolerance = 1e-2)]
    product: Matmul,
    #[stage(2)]
    bias: AddBias,
    #[stage(3)]
    activation: Gelu,
}

//! The ops a chain's stages name, one marker type each. What an op computes, how it fuses and its
//! CPU reference are defined in `pptm_spec::ops` (the catalog); its device code is in
//! `kernels/pptm/ops/`.

/// `q (ln q - ln p)` per element, with `0 ln 0 = 0`. Inputs `q`, `p`; elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct KlDivergence;

/// `obs - pred` per element. Inputs `obs`, `pred`; elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct PredictionError;

/// `-1/2 prec e^2` per element: the precision-weighted accuracy of an error. Inputs: the previous
/// stage's vector (or `e`), `prec`; elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Accuracy;

/// Sum of every element (f64 accumulation). Input: the previous stage's vector, or `x`; reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumReduction;

/// Mean of every element (f64 accumulation; NaN for none). Reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct MeanReduction;

/// Largest element (-inf for none; NaN elements ignored). Reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxReduction;

/// `prec e` per element: a precision-weighted prediction error. Inputs: the previous stage's
/// vector (or `e`), `prec`; elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrecisionWeight;

/// `A x` (A: m×n row-major, input `a`): output-fusable (elementwise prologue into `x`,
/// epilogue into each output).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gemv;

/// `Aᵀ x` (A: m×n row-major, input `a`; x has m elements, the result n): output-fusable.
#[derive(Debug, Clone, Copy, Default)]
pub struct GemvT;

/// `A W` (A: m×k, W: k×n, row-major; inputs `a`, `w`), f32 on CUDA cores: output-fusable
/// (elementwise and broadcast epilogues).
#[derive(Debug, Clone, Copy, Default)]
pub struct Matmul;

/// `A[s] W[s]` for s < `batch` (A: batch×m×k, W: batch×k×n, stacked row-major; inputs `a`, `w`):
/// many small products of one shape in one item, f32 on CUDA cores or, with `tensor_eligible`,
/// bf16/fp16/fp8 operands on tensor cores. Output-fusable like [`Matmul`]; a bias after it is one
/// per column, shared by every product.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchedMatmul;

/// `alpha x + beta y` per element; `alpha`, `beta` are f32 arguments. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Axpby;

/// `mu + lr g` per element; `lr` is an f32 argument. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct BeliefUpdate;

/// `x²` per element. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Square;

/// `x[i, j] + b[j]`: a bias per column, broadcast along the rows. Broadcast (a matmul epilogue).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddBias;

/// `max(x, 0)`. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Relu;

/// `1 / (1 + e^-x)`. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sigmoid;

/// `tanh x`. Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tanh;

/// `x/2 (1 + erf(x/√2))` (exact GELU). Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gelu;

/// Chebyshev (max-norm) distance between every pair of the rows of `x` (n×d). Pairwise: never
/// stored, consumed by a row reduction in the same pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChebyshevDistance;

/// Per pair of points, the Chebyshev distances in the (x,z), (y,z) and (z) spaces (inputs `x`,
/// `y`, `z`: n×dx, n×dy, n×dz). Pairwise, three values per pair.
#[derive(Debug, Clone, Copy, Default)]
pub struct SubspaceDistances;

/// The k-th smallest of each point's distances to the others (`k` a u32 argument, 1..=16).
/// Row reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct KthSmallest;

/// How many other points are strictly closer than `eps[i]`, per channel. Row reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct RadiusCount;

/// The digamma function ψ(x). Elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct Digamma;

/// The KSG term ψ(n_z+1) − ψ(n_xz+1) − ψ(n_yz+1) of three neighbour counts. Elementwise (three
/// values in, one out).
#[derive(Debug, Clone, Copy, Default)]
pub struct KsgDigamma;

/// `x + ψ(k)` (`k` a u32 argument): the KSG estimator's constant, added to the mean.
/// Elementwise (runs on the reduced scalar).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddDigamma;

/// The DSL name of every marker type above (a test checks it against the catalog).
pub const NAMES: &[&str] = &[
    "KlDivergence",
    "PredictionError",
    "Accuracy",
    "SumReduction",
    "MeanReduction",
    "MaxReduction",
    "PrecisionWeight",
    "Gemv",
    "GemvT",
    "Matmul",
    "BatchedMatmul",
    "Axpby",
    "BeliefUpdate",
    "Square",
    "AddBias",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Gelu",
    "ChebyshevDistance",
    "SubspaceDistances",
    "KthSmallest",
    "RadiusCount",
    "Digamma",
    "KsgDigamma",
    "AddDigamma",
];

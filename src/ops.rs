//! The ops a chain's stages name, one marker type each. What an op computes, how it fuses and its
//! CPU reference are defined in `pptm_spec::ops` (the catalog). The ops that fit the
//! `#[pptm::op]` subset are each one Rust function there (`pptm_spec::ops::subset`), whose device
//! code is translated from it; the others' device code is hand-written in `kernels/pptm/ops/`.
//! Each marker implements [`crate::Op`] with its catalog entry.

pub use pptm_spec::ops::subset::{
    Accuracy, Axpby, BeliefUpdate, MaxReduction, MeanReduction, PrecisionWeight, PredictionError,
    Relu, Sigmoid, Square, SumReduction, Tanh,
};

/// Declares each marker type with its catalog entry: the struct, its [`crate::Op`] impl, a
/// compile-time check that the entry's name is the type's, and [`NAMES`].
macro_rules! builtin_ops {
    ($($(#[doc = $doc:literal])* $name:ident => $def:ident,)*) => {
        $(
            $(#[doc = $doc])*
            #[derive(Debug, Clone, Copy, Default)]
            pub struct $name;

            impl crate::Op for $name {
                const DEF: &'static pptm_spec::OpDef = &pptm_spec::ops::$def;
            }

            const _: () = assert!(
                crate::__private::str_eq(pptm_spec::ops::$def.name, stringify!($name)),
                concat!("the marker `", stringify!($name), "` names another op's catalog entry")
            );
        )*

        /// The DSL name of every marker type of a hand-written op above (a test checks them and
        /// the subset's against the catalog).
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

builtin_ops! {
    /// `q (ln q - ln p)` per element, with `0 ln 0 = 0`. Inputs `q`, `p`; elementwise.
    KlDivergence => KL_DIVERGENCE,

    /// `A x` (A: m×n row-major, input `a`): output-fusable (elementwise prologue into `x`,
    /// epilogue into each output).
    Gemv => GEMV,

    /// `Aᵀ x` (A: m×n row-major, input `a`; x has m elements, the result n): output-fusable.
    GemvT => GEMV_T,

    /// `A W` (A: m×k, W: k×n, row-major; inputs `a`, `w`), f32 on CUDA cores: output-fusable
    /// (elementwise and broadcast epilogues).
    Matmul => MATMUL,

    /// `A[s] W[s]` for s < `batch` (A: batch×m×k, W: batch×k×n, stacked row-major; inputs `a`, `w`):
    /// many small products of one shape in one item, f32 on CUDA cores or, with `tensor_eligible`,
    /// bf16/fp16/fp8 operands on tensor cores. Output-fusable like [`Matmul`]; a bias after it is one
    /// per column, shared by every product.
    BatchedMatmul => BATCHED_MATMUL,

    /// `x[i, j] + b[j]`: a bias per column, broadcast along the rows. Broadcast (a matmul epilogue).
    AddBias => ADD_BIAS,

    /// `x/2 (1 + erf(x/√2))` (exact GELU). Elementwise.
    Gelu => GELU,

    /// Chebyshev (max-norm) distance between every pair of the rows of `x` (n×d). Pairwise: never
    /// stored, consumed by a row reduction in the same pass.
    ChebyshevDistance => CHEBYSHEV_DISTANCE,

    /// Per pair of points, the Chebyshev distances in the (x,z), (y,z) and (z) spaces (inputs `x`,
    /// `y`, `z`: n×dx, n×dy, n×dz). Pairwise, three values per pair.
    SubspaceDistances => SUBSPACE_DISTANCES,

    /// The k-th smallest of each point's distances to the others (`k` a u32 argument, 1..=16).
    /// Row reduction.
    KthSmallest => KTH_SMALLEST,

    /// How many other points are strictly closer than `eps[i]`, per channel. Row reduction.
    RadiusCount => RADIUS_COUNT,

    /// The digamma function ψ(x). Elementwise.
    Digamma => DIGAMMA,

    /// The KSG term ψ(n_z+1) − ψ(n_xz+1) − ψ(n_yz+1) of three neighbour counts. Elementwise (three
    /// values in, one out).
    KsgDigamma => KSG_DIGAMMA,

    /// `x + ψ(k)` (`k` a u32 argument): the KSG estimator's constant, added to the mean.
    /// Elementwise (runs on the reduced scalar).
    AddDigamma => ADD_DIGAMMA,
}

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

/// The DSL name of every marker type above (a test checks it against the catalog).
pub const NAMES: &[&str] = &[
    "KlDivergence",
    "PredictionError",
    "Accuracy",
    "SumReduction",
    "MeanReduction",
    "MaxReduction",
];

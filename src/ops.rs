//! The ops a chain's stages name, one marker type each. What an op computes, how it fuses and its
//! CPU reference are defined in `pptm_spec::ops` (the catalog); its device code is in
//! `kernels/pptm/ops/`.

/// `q (ln q - ln p)` per element, with `0 ln 0 = 0`. Inputs `q`, `p`; elementwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct KlDivergence;

/// Sum of every element (f64 accumulation). Input: the previous stage's vector, or `x`; reduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumReduction;

/// The DSL name of every marker type above (a test checks it against the catalog).
pub const NAMES: &[&str] = &["KlDivergence", "SumReduction"];

//! Chains that ship with pptm.

use crate::FusionBuilder;
use crate::ops::{Accuracy, KlDivergence, PredictionError, SumReduction};

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

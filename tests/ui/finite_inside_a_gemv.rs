use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{BeliefUpdate, GemvT, PrecisionWeight, PredictionError};

// A GEMV's values stay inside its pattern: `finite` goes on the stage after it.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1)]
    error: PredictionError,
    #[stage(2)]
    weighted: PrecisionWeight,
    #[stage(3, finite = true)]
    gradient: GemvT,
    #[stage(4)]
    update: BeliefUpdate,
}

fn main() {}

use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

#[derive(FusionBuilder)]
#[fusion(domain = "Inference Domain")]
pub struct Chain {
    #[stage(1)]
    kl: KlDivergence,
}

fn main() {}

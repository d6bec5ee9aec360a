use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1, reduction = true)]
    kl: KlDivergence,
}

fn main() {}

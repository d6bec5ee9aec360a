use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1, reduction = true)]
    total: SumReduction,
    #[stage(2)]
    kl: KlDivergence,
}

fn main() {}

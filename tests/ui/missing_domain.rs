use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

#[derive(FusionBuilder)]
pub struct Chain {
    #[stage(1)]
    kl: KlDivergence,
}

fn main() {}

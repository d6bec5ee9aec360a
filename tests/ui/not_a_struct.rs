use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub enum Chain {
    A,
}

fn main() {}

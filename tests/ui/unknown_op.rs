use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{KlDivergence, SumReduction};

/// Not an op pptm knows.
pub struct Softmax;

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1)]
    s: Softmax,
}

fn main() {}

use pptm::FusionBuilder;
use pptm::ops::KlDivergence;

// A valid chain, in a crate (this test's) that has no generated/ folder.
#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1)]
    kl: KlDivergence,
}

fn main() {}

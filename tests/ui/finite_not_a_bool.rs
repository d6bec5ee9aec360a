use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::KlDivergence;

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct Chain {
    #[stage(1, finite = "yes")]
    kl: KlDivergence,
}

fn main() {}

use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{Gemv, Square};

#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct Chain {
    #[stage(1, args(q = "w2"))]
    product: Gemv,
}

fn main() {}

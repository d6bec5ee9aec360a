use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::Gemv;

#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct Chain {
    #[stage(1, args(a = "2nd matrix"))]
    product: Gemv,
}

fn main() {}

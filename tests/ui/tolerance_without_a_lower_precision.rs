use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::Matmul;

#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct Chain {
    #[stage(1, tolerance = 1e-3)]
    product: Matmul,
}

fn main() {}

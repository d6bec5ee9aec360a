use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::Matmul;

#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct Chain {
    #[stage(1, tensor_eligible = true, precision = "fp32")]
    product: Matmul,
}

fn main() {}

use pptm::FusionBuilder;
#[allow(unused_imports)]
use pptm::ops::{Gemv, Square};

// A GEMV accumulates in f32 on CUDA cores only: fp64 is refused at the attribute.
#[derive(FusionBuilder)]
#[fusion(domain = "linear_algebra")]
pub struct Chain {
    #[stage(1, precision = "fp64")]
    product: Gemv,
    #[stage(2)]
    square: Square,
}

fn main() {}

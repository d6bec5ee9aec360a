// A type of one's own that shares a built-in op's name is not that op: the stage's type must be
// the op itself (`pptm::ops::Square`, or a `#[pptm::op]` marker).
use pptm::FusionBuilder;
use pptm::ops::SumReduction;

#[derive(Debug, Default)]
pub struct Square;

#[derive(FusionBuilder)]
#[fusion(domain = "inference")]
pub struct SumOfSquares {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

fn main() {}

// `tables = "..."` takes "fp32" or "fp16", and only on a stage whose op reads a table.

use pptm::FusionBuilder;
use pptm::ops::Square;

#[derive(FusionBuilder)]
#[fusion(domain = "ui")]
pub struct EightBitTables {
    #[stage(1, tables = "fp8")]
    square: Square,
}

#[derive(FusionBuilder)]
#[fusion(domain = "ui")]
pub struct NoTableToStore {
    #[stage(1, tables = "fp16")]
    square: Square,
}

fn main() {}

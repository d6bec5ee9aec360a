use pptm::Pipeline;

// A step names a chain declared in this crate; pptm's own chains are not.
#[derive(Pipeline)]
pub struct OfAnotherCrate {
    #[step(1)]
    kl: pptm::chains::KlComplexity,
}

#[derive(Pipeline)]
pub struct UnknownAttribute {
    #[step(1, depth = 2)]
    kl: pptm::chains::KlComplexity,
}

#[derive(Pipeline)]
pub struct FieldWithoutStep {
    kl: pptm::chains::KlComplexity,
}

#[derive(Pipeline)]
pub struct BadRepeat {
    #[step(1, repeat = 0)]
    kl: pptm::chains::KlComplexity,
}

fn main() {}

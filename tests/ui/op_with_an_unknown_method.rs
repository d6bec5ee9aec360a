#[pptm::op]
fn sign(x: f32) -> f32 {
    x.signum()
}

fn main() {}

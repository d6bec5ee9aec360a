#[pptm::op]
fn geometric(x: f32) -> f32 {
    let mut s = 0.0_f32;
    for _ in 0..3 {
        s += x;
    }
    s
}

fn main() {}

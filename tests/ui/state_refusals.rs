// What `#[derive(pptm::State)]` refuses, each at the offending tokens.

#[derive(Clone, Copy, pptm::State)]
struct NotReprC {
    x: f64,
}

#[derive(Clone, Copy, pptm::State)]
#[repr(C)]
struct Counted {
    x: f64,
    n: u32,
}

#[derive(Clone, Copy, pptm::State)]
#[repr(C)]
struct Unnamed(f64, f64);

#[derive(Clone, Copy, pptm::State)]
#[repr(C)]
struct Empty {}

fn main() {}

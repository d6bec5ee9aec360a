// `f32_form` adds an f32 device form to an f64 elementwise op: refused where there is nothing to
// narrow, or where the op accumulates in f64 by design.

#[pptm::op(f32_form)]
fn already_f32(x: f32) -> f32 { x * 2.0 }

#[pptm::op(reduction(identity = 0.0), f32_form)]
fn a_reduction(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(f32_form, f32_form)]
fn twice(x: f64) -> f64 { x }

fn main() {}

//! What `#[pptm::op(reduction(...))]` refuses, each at its tokens.
#![allow(unused)]

#[pptm::op(reduction())]
fn no_identity(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0, zero = 1))]
fn unknown_argument(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0), reduction(identity = 0.0))]
fn twice(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0), tensors(b))]
fn with_a_tensor(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0_f64.exp()))]
fn computed_identity(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0))]
fn f32_combine(a: f32, b: f32) -> f32 { a + b }

#[pptm::op(reduction(identity = 0.0))]
fn one_operand(a: f64) -> f64 { a }

#[pptm::op(reduction(identity = 0.0, finish = 2.0))]
fn finish_not_a_closure(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0, finish = || 1.0))]
fn finish_without_total(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0, finish = move |t| t))]
fn finish_that_captures(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0, finish = |t: f32| t))]
fn finish_of_an_f32(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0, finish = |t| u))]
fn finish_naming_nothing(a: f64, b: f64) -> f64 { a + b }

#[pptm::op(reduction(identity = 0.0))]
fn combine_outside_the_subset(a: f64, b: f64) -> f64 { a.signum() + b }

fn main() {}

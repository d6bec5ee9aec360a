//! Every construct outside the op subset of `#[pptm::op]`, each refused at its tokens with what
//! the subset allows (one function per construct; the macro keeps a refused function as it is, so
//! each shows one error).
#![allow(unused)]

#[pptm::op]
fn generic<T>(x: f32) -> f32 { x }

#[pptm::op]
const fn constant(x: f32) -> f32 { x }

#[pptm::op]
async fn asynchronous(x: f32) -> f32 { x }

#[pptm::op]
unsafe fn not_safe(x: f32) -> f32 { x }

#[pptm::op]
fn by_reference(x: &f32) -> f32 { *x }

#[pptm::op]
fn integer(x: i32) -> f32 { 1.0 }

#[pptm::op]
fn count_first(n: u32) -> f32 { 1.0 }

#[pptm::op]
fn nothing() -> f32 { 1.0 }

#[pptm::op]
fn no_result(x: f32) {}

#[pptm::op]
fn integer_result(x: f32) -> u32 { 1 }

#[pptm::op]
fn tuple_parameter((a, b): (f32, f32)) -> f32 { a }

#[pptm::op]
fn mutable_parameter(mut x: f32) -> f32 { x }

#[pptm::op]
fn twice(x: f32, x: f32) -> f32 { x }

#[pptm::op]
fn untyped_literal(x: f32) -> f32 { let c = 0.5; x * c }

#[pptm::op]
fn early_return(x: f32) -> f32 { return x; }

#[pptm::op]
fn endless(x: f32) -> f32 { loop {} }

#[pptm::op]
fn a_macro(x: f32) -> f32 { println!("{x}"); x }

#[pptm::op]
fn a_tuple(x: f32) -> f32 { (x, x).0 }

#[pptm::op]
fn unknown_method(x: f32) -> f32 { x.signum() }

#[pptm::op]
fn unknown_name(x: f32) -> f32 { y }

#[pptm::op]
fn mixed_types(x: f32, y: f64) -> f32 { x + y }

#[pptm::op]
fn wrong_result(x: f32) -> f64 { x }

#[pptm::op]
fn if_without_else(x: f32) -> f32 { if x > 0.0 { x } }

#[pptm::op]
fn a_match(x: f32) -> f32 { match x { _ => x } }

#[pptm::op]
fn a_closure(x: f32) -> f32 { (|y: f32| y)(x) }

#[pptm::op]
fn bit_shift(x: f32, k: u32) -> f32 { (k << 1) as f32 }

#[pptm::op]
fn integer_power(x: f32) -> f32 { x.powi(x as i32) }

#[pptm::op]
fn missing_argument(x: f32) -> f32 { x.powf() }

#[pptm::op]
fn unknown_constant(x: f32) -> f32 { f32::NAN_BOX }

#[pptm::op]
fn free_function(x: f32) -> f32 { sqrt(x) }

#[pptm::op]
fn an_assignment(x: f32) -> f32 { let y = x; y = 2.0; y }

#[pptm::op]
fn an_index(x: f32) -> f32 { [x][0] }

#[pptm::op]
fn a_whole_array(x: f32) -> f32 { let a = [x; 4]; a[0] + a }

#[pptm::op]
fn a_float_index(x: f32) -> f32 { let a = [x; 4]; a[x] }

#[pptm::op]
fn an_array_length_not_literal(x: f32, n: u32) -> f32 { let a = [x; n]; a[0] }

#[pptm::op]
fn a_reference(x: f32) -> f32 { let y = &x; x }

#[pptm::op]
fn an_item(x: f32) -> f32 { fn inner() {} x }

#[pptm::op]
fn let_else(x: f32) -> f32 { let y = x else { return 0.0 }; y }

#[pptm::op]
fn let_without_value(x: f32) -> f32 { let y: f32; x }

#[pptm::op]
fn a_method_receiver(x: f32) -> f32 { x.abs::<f32>() }

#[pptm::op]
fn negated_count(x: f32, k: u32) -> f32 { (-k) as f32 }

#[pptm::op]
fn bool_cast(x: f32) -> f32 { (x > 0.0) as u32 as f32 }

#[pptm::op(tensors(missing))]
fn tensor_that_is_not_a_parameter(x: f32, y: f32) -> f32 { x + y }

#[pptm::op(tensors(k))]
fn integer_tensor(x: f32, k: u32) -> f32 { x }

#[pptm::op]
fn f64_by_value(x: f32, y: f64) -> f32 { x }

#[pptm::op(inputs(y))]
fn unknown_attribute(x: f32, y: f32) -> f32 { x + y }

fn main() {}

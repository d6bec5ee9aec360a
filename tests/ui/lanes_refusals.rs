//! What `lanes` refuses, each at its tokens with what it allows (one function per construct).
#![allow(unused)]

use pptm::Table;

#[pptm::op(lanes = 3)]
fn not_a_power_of_two(x: f64, t: Table) -> f64 {
    let mut acc = x;
    for j in lanes(0..t.cols()) { acc += t.at(0, j); }
    acc
}

#[pptm::op(lanes = 4)]
fn no_lanes_loop(x: f64, t: Table) -> f64 {
    let mut acc = x;
    for j in 0..t.cols() { acc += t.at(0, j); }
    acc
}

#[pptm::op]
fn assigned_in_the_loop(x: f64, t: Table) -> f64 {
    let mut acc = x;
    for j in lanes(0..t.cols()) { acc = t.at(0, j); }
    acc
}

#[pptm::op]
fn scaled_in_the_loop(x: f64, t: Table) -> f64 {
    let mut acc = x;
    for j in lanes(0..t.cols()) { acc *= t.at(0, j); }
    acc
}

#[pptm::op]
fn an_outer_array_element(x: f64, t: Table) -> f64 {
    let mut v = [0.0_f64; 2];
    for j in lanes(0..t.cols()) { v[0] += t.at(0, j); }
    v[0]
}

#[pptm::op]
fn nested(x: f64, t: Table) -> f64 {
    let mut acc = x;
    for i in lanes(0..t.rows()) {
        for j in lanes(0..t.cols()) { acc += t.at(i, j); }
    }
    acc
}

#[pptm::op(lanes = 8, reduction(identity = 0.0))]
fn on_a_reduction(a: f64, b: f64) -> f64 { a + b }

fn main() {}

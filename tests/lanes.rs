//! Lanes (`#[op(lanes = N)]` and `for s in lanes(a..b)`): several threads of a warp share each
//! element of an elementwise pass, split the iterations of the op's `lanes` loops among them and
//! sum what those loops accumulate. Each chain runs on every backend against an f64 reference
//! written here, on fresh random tables of odd sizes (rows 1 to 4099, columns 1 to 100, fewer
//! and more than the lanes; and 2^17 + 3 rows, which the device runs without lanes: more elements
//! times lanes than it has threads), with the output poisoned before each run: a start value
//! added once per lane instead of once, an iteration run twice or never, or a lane's share left
//! out of the sum or of the reduction would each show.

#[macro_use]
mod common;

use common::uniform;
use pptm::ops::SumReduction;
use pptm::{FusionBuilder, Runtime, State, Table, op};

/// A particle's position and velocity, for an op whose state's fields accumulate.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Particle {
    pub x: f64,
    pub v: f64,
}

/// Row `idx` of a table folded by the element's 16 lanes, twice (the second pass doubles each
/// value): the row's first value, plus each positive value times `scale`, minus half of each
/// negative one. A `lanes` loop inside a plain loop, with an `if`, from a start value.
#[op(f32_form, lanes = 16)]
pub fn row_fold(idx: f64, t: Table, scale: f32) -> f64 {
    let i = idx as u32;
    let mut acc = t.at(i, 0);
    for pass in 0..2 {
        for j in lanes(1..t.cols()) {
            let x = t.at(i, j) * (1.0 + pass as f64);
            if x > 0.0 {
                acc += x * scale as f64;
            } else {
                acc -= 0.5 * x;
            }
        }
    }
    acc
}

/// The particle pulled by row `idx` of a table: x gains the row's sum, v loses its sum of
/// squares (fields of a state accumulated by the default 8 lanes, which `lanes` is not given).
#[op(tensors(idx))]
pub fn row_pull(s: Particle, idx: f64, t: Table) -> Particle {
    let i = idx as u32;
    let mut out = s;
    for j in lanes(0..t.cols()) {
        let y = t.at(i, j);
        out.x += y;
        out.v -= y * y;
    }
    out
}

/// Each row folded.
#[derive(FusionBuilder)]
#[fusion(domain = "lanes")]
pub struct RowFolds {
    #[stage(1)]
    fold: RowFold,
}

/// The folds summed: lane 0 of each element alone gives its value to the reduction.
#[derive(FusionBuilder)]
#[fusion(domain = "lanes")]
pub struct RowFoldTotal {
    #[stage(1)]
    fold: RowFold,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// Each particle pulled by its row.
#[derive(FusionBuilder)]
#[fusion(domain = "lanes")]
pub struct RowPulls {
    #[stage(1)]
    pull: RowPull,
}

/// The indices 0..n as f32 (the flow the row ops read their row from).
fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// Row i's fold in f64 from the table's f32 values.
fn fold64(table: &[f32], cols: usize, i: usize, scale: f32) -> f64 {
    let row = &table[i * cols..(i + 1) * cols];
    let mut acc = f64::from(row[0]);
    for pass in 0..2 {
        for &y in &row[1..] {
            let x = f64::from(y) * (1.0 + f64::from(pass));
            if x > 0.0 {
                acc += x * f64::from(scale);
            } else {
                acc -= 0.5 * x;
            }
        }
    }
    acc
}

/// The sizes: rows × columns, columns below, at and above the lanes (16 and 8), and rows enough
/// that the pass runs without lanes (more elements times lanes than the GPU's threads).
const SIZES: [(usize, usize); 7] = [
    (1, 1),
    (7, 2),
    (1023, 37),
    (4099, 16),
    (33, 100),
    (500, 9),
    ((1 << 17) + 3, 5),
];

fn lanes_fold_rows(rt: &Runtime) {
    let scale = 1.5f32;
    for (rows, cols) in SIZES {
        let table = uniform(rows * cols, -2.0, 3.0);
        let t = rt.upload(&table).unwrap();
        let idx = rt.upload(&iota(rows)).unwrap();
        let mut out = rt.upload(&vec![f32::NAN; rows]).unwrap();
        RowFolds::submit(rt, &idx, &t, scale, &mut out, rows, cols)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let want = fold64(&table, cols, i, scale);
            // f32 sums of up to 200 terms of magnitude ≤ 6 (the fp32 stage runs the f32 form).
            let bar = 1e-5 * (1.0 + 6.0 * 2.0 * cols as f64);
            assert!(
                (f64::from(g) - want).abs() <= bar,
                "{}: row {i} of {rows} x {cols}: {g} against {want}",
                rt.describe()
            );
        }

        let total = RowFoldTotal::submit(rt, &idx, &t, scale, rows, cols)
            .unwrap()
            .wait()
            .unwrap();
        let want: f64 = (0..rows).map(|i| fold64(&table, cols, i, scale)).sum();
        let bar = 1e-5 * rows as f64 * (1.0 + 12.0 * cols as f64);
        assert!(
            (f64::from(total) - want).abs() <= bar,
            "{}: total of {rows} x {cols}: {total} against {want}",
            rt.describe()
        );
    }
}

fn lanes_accumulate_state_fields(rt: &Runtime) {
    for (rows, cols) in SIZES {
        let table = uniform(rows * cols, -1.0, 1.0);
        let start: Vec<Particle> = uniform(2 * rows, -5.0, 5.0)
            .chunks(2)
            .map(|p| Particle {
                x: f64::from(p[0]),
                v: f64::from(p[1]),
            })
            .collect();
        let mut out = rt.upload(&vec![f32::NAN; 2 * rows]).unwrap();
        RowPulls::submit(
            rt,
            &rt.upload(&Particle::flatten(&start)).unwrap(),
            &rt.upload(&iota(rows)).unwrap(),
            &rt.upload(&table).unwrap(),
            &mut out,
            rows,
            cols,
        )
        .unwrap()
        .wait()
        .unwrap();
        let got = Particle::unflatten(&out.to_vec().unwrap()).unwrap();
        for (i, (g, s)) in got.iter().zip(&start).enumerate() {
            let row = &table[i * cols..(i + 1) * cols];
            let want_x = s.x + row.iter().map(|&y| f64::from(y)).sum::<f64>();
            let want_v = s.v - row.iter().map(|&y| f64::from(y).powi(2)).sum::<f64>();
            let bar = 1e-5 * (5.0 + cols as f64);
            assert!(
                (g.x - want_x).abs() <= bar && (g.v - want_v).abs() <= bar,
                "{}: particle {i} of {rows} x {cols}: ({}, {}) against ({want_x}, {want_v})",
                rt.describe(),
                g.x,
                g.v
            );
        }
    }
}

on_every_backend!(lanes_fold_rows, lanes_accumulate_state_fields);

/// The lanes an op asks for reach its definition, and the default where it gives none.
#[test]
fn ops_carry_their_lanes() {
    use pptm::Op;
    assert_eq!(RowFold::DEF.lanes, 16);
    // (pptm-spec's `op_fn::DEFAULT_LANES`.)
    assert_eq!(RowPull::DEF.lanes, 8);
    assert_eq!(pptm::ops::SumReduction::DEF.lanes, 1);
}

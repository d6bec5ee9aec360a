//! States of several values per element (`#[derive(pptm::State)]`): an op of one's own takes one
//! as its flow and returns one, a chain reads and writes it as its fields interleaved, and
//! `repeat = k` steps it k times in one pass (a run of 8 or more copies as a loop on the device).
//! Each chain runs on every backend against an f64 reference written here, on fresh random
//! states of odd sizes, with the output poisoned before each run.

#[macro_use]
mod common;

use common::{rng, uniform};
use pptm::ops::SumReduction;
use pptm::{FusionBuilder, Op, Runtime, State, Table, op};
use rand::Rng;

/// A damped oscillator's position and velocity.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Osc {
    pub x: f64,
    pub v: f64,
}

/// One semi-implicit Euler step of x'' = −k x − c x' (the f32 form computes it in f32 on
/// fp32 stages).
#[op(f32_form)]
pub fn osc_step(s: Osc, k: f32, c: f32, dt: f32) -> Osc {
    let a = -(k as f64) * s.x - (c as f64) * s.v;
    let v = s.v + (dt as f64) * a;
    Osc {
        x: s.x + (dt as f64) * v,
        v,
    }
}

/// A state from one value: at rest at x0.
#[op(f32_form)]
pub fn at_rest(x0: f64) -> Osc {
    Osc { v: 0.0, x: x0 }
}

/// The oscillator's energy, ½ v² + ½ k x².
#[op(f32_form)]
pub fn energy(s: Osc, k: f32) -> f64 {
    0.5 * s.v * s.v + 0.5 * (k as f64) * s.x * s.x
}

/// A kick by a force of its own per element, the rest of the state kept (`..s`).
#[op(tensors(force))]
pub fn kick(s: Osc, force: f32, dt: f32) -> Osc {
    Osc {
        v: s.v + (dt as f64) * (force as f64),
        ..s
    }
}

/// 100 steps of each oscillator: the device runs them as a loop, in registers.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct Oscillate {
    #[stage(1, repeat = 100)]
    step: OscStep,
}

/// A kick, then 3 steps (inlined one by one), then each oscillator's energy.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct KickedEnergy {
    #[stage(1)]
    kick: Kick,
    #[stage(2, repeat = 3)]
    step: OscStep,
    #[stage(3)]
    energy: Energy,
}

/// From rest at x0, 20 steps, then the total energy.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct TotalEnergy {
    #[stage(1)]
    start: AtRest,
    #[stage(2, repeat = 20)]
    step: OscStep,
    #[stage(3)]
    energy: Energy,
    #[stage(4, reduction = true)]
    total: SumReduction,
}

/// An oscillator whose stiffness is read from a table over (position, column): the table's row
/// coordinate follows the state, the column is each element's own.
#[op(f32_form, tensors(col))]
pub fn table_step(s: Osc, col: f64, stiffness: Table, dt: f32) -> Osc {
    let k = stiffness.bilinear(4.0 * s.x + 8.0, col);
    let v = s.v - (dt as f64) * k * s.x;
    Osc {
        x: s.x + (dt as f64) * v,
        v,
    }
}

/// A table read at computed coordinates, and at indices.
#[op(tensors(col))]
pub fn lookup(x: f32, col: f32, t: Table) -> f32 {
    let nearest = t.at(x.max(0.0) as u32, col as u32) as f32;
    t.bilinear(x, col) - 0.5 * nearest + (t.rows() as f32) - (t.cols() as f32)
}

/// 50 steps through a table.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct TableSteps {
    #[stage(1, repeat = 50)]
    step: TableStep,
}

/// One lookup per element.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct TableLookup {
    #[stage(1)]
    read: Lookup,
}

/// The same lookup with the table stored in f16.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct TableLookup16 {
    #[stage(1, tables = "fp16")]
    read: Lookup,
}

/// Springs to every anchor within reach: a loop over a table of anchors (row j's position in
/// column 0, stiffness in column 1), a `let mut` state whose field accumulates, and an `if`
/// statement for the cutoff. The neighbour sum of a pair potential has this shape.
#[op(f32_form)]
pub fn pull(s: Osc, anchors: Table, reach: f32, dt: f32) -> Osc {
    let mut out = s;
    let mut force = 0.0_f64;
    for j in 0..anchors.rows() {
        let d = anchors.at(j, 0) - s.x;
        if d.abs() < reach as f64 {
            force += anchors.at(j, 1) * d;
        }
    }
    out.v += (dt as f64) * force;
    out.x = s.x + (dt as f64) * out.v;
    out
}

/// 12 pulls in one pass.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct Pulled {
    #[stage(1, repeat = 12)]
    step: Pull,
}

/// A weighted local quadratic fit at `s` through a table of points (x in column 0, y in column
/// 1): the normal equations of the basis (1, d, d²), d = x − s, with Gaussian weights, built and
/// solved by elimination in local arrays; the fit's value at s. A small least-squares problem
/// per element, as a continuum fit per spectrum is.
#[op(f32_form)]
pub fn local_quadratic(s: f64, points: Table, width: f32) -> f64 {
    let mut a = [0.0_f64; 9];
    let mut b = [0.0_f64; 3];
    let w2 = width as f64 * width as f64;
    for j in 0..points.rows() {
        let d = points.at(j, 0) - s;
        let w = (-(d * d) / w2).exp();
        let basis = [1.0, d, d * d];
        for r in 0..3 {
            b[r] += w * basis[r] * points.at(j, 1);
            for c in 0..3 {
                a[3 * r + c] += w * basis[r] * basis[c];
            }
        }
    }
    // Elimination without pivoting: the matrix is symmetric positive definite.
    for k in 0..3 {
        for r in k + 1..3 {
            let f = a[3 * r + k] / a[3 * k + k];
            for c in k..3 {
                a[3 * r + c] -= f * a[3 * k + c];
            }
            b[r] -= f * b[k];
        }
    }
    let mut x = [0.0_f64; 3];
    for i in 0..3 {
        let r = 2 - i;
        let mut acc = b[r];
        for c in r + 1..3 {
            acc -= a[3 * r + c] * x[c];
        }
        x[r] = acc / a[3 * r + r];
    }
    x[0]
}

/// The fit at every element.
#[derive(FusionBuilder)]
#[fusion(domain = "states")]
pub struct LocalFit {
    #[stage(1)]
    fit: LocalQuadratic,
}

/// Whether `submitted` is the unfused-graph variant's typed refusal of a chain of more than a few
/// stages beside a resident manifold (runtime/src/gpu/graphs.rs; docs/ops.md): said, and the
/// check skipped. Any other result, error or not, is the caller's to judge.
fn graph_unavailable<T>(rt: &Runtime, submitted: &pptm::Result<T>) -> bool {
    match submitted {
        Err(e @ pptm::Error::GraphUnavailable { .. })
            if rt.config().variant == pptm::Variant::UnfusedGraph =>
        {
            eprintln!("{}: {e}", rt.describe());
            true
        }
        _ => false,
    }
}

const K: f32 = 1.7;
const C: f32 = 0.05;
const DT: f32 = 0.01;

fn step64(s: (f64, f64), k: f32, c: f32, dt: f32) -> (f64, f64) {
    let (k, c, dt) = (f64::from(k), f64::from(c), f64::from(dt));
    let v = s.1 + dt * (-k * s.0 - c * s.1);
    (s.0 + dt * v, v)
}

fn energy64(s: (f64, f64), k: f32) -> f64 {
    0.5 * s.1 * s.1 + 0.5 * f64::from(k) * s.0 * s.0
}

fn random_states(n: usize) -> Vec<Osc> {
    let mut r = rng();
    (0..n)
        .map(|_| Osc {
            x: f64::from(r.random_range(-2.0f32..2.0)),
            v: f64::from(r.random_range(-1.0f32..1.0)),
        })
        .collect()
}

/// |got − want| within `rel` of the state's scale (positions and velocities are O(1)).
fn assert_state_close(got: &Osc, want: (f64, f64), rel: f64, what: &str) {
    let scale = want.0.abs().max(want.1.abs()).max(1.0);
    let err = (got.x - want.0).abs().max((got.v - want.1).abs());
    assert!(
        err <= rel * scale,
        "{what}: got ({}, {}), f64 reference {want:?}, error {err:e}",
        got.x,
        got.v
    );
}

fn states_step_in_one_pass(rt: &Runtime) {
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let s = random_states(n);
        let input = rt.upload(&Osc::flatten(&s)).unwrap();
        let mut out = rt.upload(&vec![f32::NAN; 2 * n]).unwrap();
        let submitted = Oscillate::submit(rt, &input, K, C, DT, &mut out);
        if graph_unavailable(rt, &submitted) {
            return;
        }
        submitted.unwrap().wait().unwrap();
        let got = Osc::unflatten(&out.to_vec().unwrap()).unwrap();
        assert_eq!(got.len(), n);
        for (i, (g, s0)) in got.iter().zip(&s).enumerate() {
            // The input as stored (f32), stepped in f64.
            let mut want = (f64::from(s0.x as f32), f64::from(s0.v as f32));
            for _ in 0..100 {
                want = step64(want, K, C, DT);
            }
            // 100 f32 steps on the device; the CPU backend steps in f64 and stores f32.
            assert_state_close(g, want, 2e-5, &format!("oscillator {i} of {n}"));
        }
    }
}

fn states_mix_with_values(rt: &Runtime) {
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let s = random_states(n);
        let force = uniform(n, -3.0, 3.0);
        let input = rt.upload(&Osc::flatten(&s)).unwrap();
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        KickedEnergy::submit(rt, &input, &rt.upload(&force).unwrap(), DT, K, C, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            let mut st = (
                f64::from(s[i].x as f32),
                f64::from(s[i].v as f32) + f64::from(DT) * f64::from(force[i]),
            );
            for _ in 0..3 {
                st = step64(st, K, C, DT);
            }
            let want = energy64(st, K);
            let err = (f64::from(got[i]) - want).abs();
            assert!(
                err <= 1e-5 * want.max(1.0),
                "energy {i} of {n}: got {}, f64 reference {want}",
                got[i]
            );
        }

        // From rest: a scalar flow becomes a state, and the energies are summed.
        let x0 = uniform(n, -2.0, 2.0);
        let x0_buffer = rt.upload(&x0).unwrap();
        let submitted = TotalEnergy::submit(rt, &x0_buffer, K, C, DT);
        if graph_unavailable(rt, &submitted) {
            continue;
        }
        let total = submitted.unwrap().wait().unwrap();
        let want: f64 = x0
            .iter()
            .map(|&x| {
                let mut st = (f64::from(x), 0.0);
                for _ in 0..20 {
                    st = step64(st, K, C, DT);
                }
                energy64(st, K)
            })
            .sum();
        let err = (f64::from(total) - want).abs();
        assert!(
            err <= 2e-5 * want.abs() + 1e-12,
            "total energy of {n}: got {total}, f64 reference {want}"
        );
    }
}

/// Bilinear interpolation of a row-major table at grid coordinates, each clamped (an f64
/// reference written apart from pptm's).
fn bilinear64(t: &[f32], rows: usize, cols: usize, x: f64, y: f64) -> f64 {
    let x = x.clamp(0.0, (rows - 1) as f64);
    let y = y.clamp(0.0, (cols - 1) as f64);
    let (i0, j0) = (x.floor() as usize, y.floor() as usize);
    let (i1, j1) = ((i0 + 1).min(rows - 1), (j0 + 1).min(cols - 1));
    let v = |i: usize, j: usize| f64::from(t[i * cols + j]);
    let (tx, ty) = (x - x.floor(), y - y.floor());
    let a = v(i0, j0) + ty * (v(i0, j1) - v(i0, j0));
    let b = v(i1, j0) + ty * (v(i1, j1) - v(i1, j0));
    a + tx * (b - a)
}

fn tables_are_read_at_computed_coordinates(rt: &Runtime) {
    // An odd table, with coordinates beyond its edges on every side.
    let (rows, cols) = (37usize, 23usize);
    let table = uniform(rows * cols, 0.5, 3.0);
    let t = rt.upload(&table).unwrap();
    for n in [1usize, 7, 1023, (1 << 20) + 3] {
        let x = uniform(n, -3.0, 40.0);
        let col = uniform(n, -2.0, 25.0);
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        TableLookup::submit(
            rt,
            &rt.upload(&x).unwrap(),
            &rt.upload(&col).unwrap(),
            &t,
            &mut out,
            rows,
            cols,
        )
        .unwrap()
        .wait()
        .unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            let (xi, ci) = (f64::from(x[i]), f64::from(col[i]));
            let near_i = (xi.max(0.0) as usize).min(rows - 1);
            let near_j = ((ci.max(0.0)) as usize).min(cols - 1);
            let want = bilinear64(&table, rows, cols, xi, ci)
                - 0.5 * f64::from(table[near_i * cols + near_j])
                + rows as f64
                - cols as f64;
            let err = (f64::from(got[i]) - want).abs();
            assert!(
                err <= 1e-5 * want.abs().max(1.0),
                "lookup {i} of {n} at ({xi}, {ci}): got {}, f64 reference {want}",
                got[i]
            );
        }

        // The table stored in f16: the same reads of its f16 values.
        let table16: Vec<pptm::f16> = table.iter().map(|&v| pptm::f16::from_f32(v)).collect();
        let table16_wide: Vec<f32> = table16.iter().map(|v| v.to_f32()).collect();
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        TableLookup16::submit(
            rt,
            &rt.upload(&x).unwrap(),
            &rt.upload(&col).unwrap(),
            &rt.upload(&table16).unwrap(),
            &mut out,
            rows,
            cols,
        )
        .unwrap()
        .wait()
        .unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            let (xi, ci) = (f64::from(x[i]), f64::from(col[i]));
            let near_i = (xi.max(0.0) as usize).min(rows - 1);
            let near_j = (ci.max(0.0) as usize).min(cols - 1);
            let want = bilinear64(&table16_wide, rows, cols, xi, ci)
                - 0.5 * f64::from(table16_wide[near_i * cols + near_j])
                + rows as f64
                - cols as f64;
            let err = (f64::from(got[i]) - want).abs();
            assert!(
                err <= 1e-5 * want.abs().max(1.0),
                "f16 lookup {i} of {n} at ({xi}, {ci}): got {}, f64 reference {want}",
                got[i]
            );
        }

        // 50 steps, the stiffness read where each state is.
        let s = random_states(n);
        let cols_of = uniform(n, 0.0, (cols - 1) as f32);
        let mut out = rt.upload(&vec![f32::NAN; 2 * n]).unwrap();
        let (start, cols_buffer) = (
            rt.upload(&Osc::flatten(&s)).unwrap(),
            rt.upload(&cols_of).unwrap(),
        );
        let submitted = TableSteps::submit(rt, &start, &cols_buffer, &t, DT, &mut out, rows, cols);
        if graph_unavailable(rt, &submitted) {
            continue;
        }
        submitted.unwrap().wait().unwrap();
        let got = Osc::unflatten(&out.to_vec().unwrap()).unwrap();
        for i in 0..n {
            let mut st = (f64::from(s[i].x as f32), f64::from(s[i].v as f32));
            for _ in 0..50 {
                let k = bilinear64(&table, rows, cols, 4.0 * st.0 + 8.0, f64::from(cols_of[i]));
                let v = st.1 - f64::from(DT) * k * st.0;
                st = (st.0 + f64::from(DT) * v, v);
            }
            assert_state_close(&got[i], st, 2e-5, &format!("table steps {i} of {n}"));
        }
    }
}

/// An empty table reads NaN everywhere, and a NaN coordinate reads NaN from any table: on the
/// device as on the CPU (where reads take no branch, an empty table is one cell of NaN there).
fn empty_tables_and_nan_coordinates_read_nan(rt: &Runtime) {
    let n = 7;
    let x = rt.upload(&uniform(n, -1.0, 5.0)).unwrap();
    let col = rt.upload(&uniform(n, -1.0, 5.0)).unwrap();
    let empty = rt.upload::<f32>(&[]).unwrap();
    for (rows, cols) in [(0usize, 4usize), (4, 0), (0, 0)] {
        let mut out = rt.upload(&vec![0.0f32; n]).unwrap();
        TableLookup::submit(rt, &x, &col, &empty, &mut out, rows, cols)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        assert!(
            got.iter().all(|v| v.is_nan()),
            "{rows} x {cols} table: {got:?}"
        );
    }
    let (rows, cols) = (3usize, 5usize);
    let table = rt.upload(&uniform(rows * cols, 0.5, 3.0)).unwrap();
    let mut xs = uniform(n, 0.0, 2.0);
    xs[2] = f32::NAN;
    let mut cs = uniform(n, 0.0, 4.0);
    cs[5] = f32::NAN;
    let mut out = rt.upload(&vec![0.0f32; n]).unwrap();
    let (xb, cb) = (rt.upload(&xs).unwrap(), rt.upload(&cs).unwrap());
    TableLookup::submit(rt, &xb, &cb, &table, &mut out, rows, cols)
        .unwrap()
        .wait()
        .unwrap();
    let got = out.to_vec().unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.is_nan(), i == 2 || i == 5, "element {i}: {v}");
    }
}

/// Loops, `let mut` and assignments in an op (`Pull`): 12 steps over a table of anchors against
/// the same loop written here in f64.
fn ops_loop_over_a_table(rt: &Runtime) {
    let anchors_n = 37usize;
    let mut anchors = Vec::with_capacity(2 * anchors_n);
    for (p, k) in uniform(anchors_n, -4.0, 4.0)
        .into_iter()
        .zip(uniform(anchors_n, 0.1, 2.0))
    {
        anchors.extend([p, k]);
    }
    let t = rt.upload(&anchors).unwrap();
    let (reach, dt) = (1.5f32, 0.01f32);
    for n in [1usize, 7, 1023, 4099] {
        let s = random_states(n);
        let mut out = rt.upload(&vec![f32::NAN; 2 * n]).unwrap();
        let start = rt.upload(&Osc::flatten(&s)).unwrap();
        let submitted = Pulled::submit(rt, &start, &t, reach, dt, &mut out, anchors_n, 2);
        if graph_unavailable(rt, &submitted) {
            return;
        }
        submitted.unwrap().wait().unwrap();
        let got = Osc::unflatten(&out.to_vec().unwrap()).unwrap();
        // The force has a cutoff: an anchor within f32's rounding of `reach` may count on one
        // side and not on the other, and the element then rightly differs by a whole term
        // (seen once in 4099 elements, 1.7e-2 off). Such elements are left out of the
        // comparison: those whose f64 path passes within 2e-5 of the cutoff (f32's drift over
        // the 12 steps is below 1e-5), about one in a hundred.
        let mut ambiguous = 0;
        for i in 0..n {
            let mut st = (f64::from(s[i].x as f32), f64::from(s[i].v as f32));
            let mut closest = f64::INFINITY;
            for _ in 0..12 {
                let mut force = 0.0;
                for j in 0..anchors_n {
                    let d = f64::from(anchors[2 * j]) - st.0;
                    closest = closest.min((d.abs() - f64::from(reach)).abs());
                    if d.abs() < f64::from(reach) {
                        force += f64::from(anchors[2 * j + 1]) * d;
                    }
                }
                let v = st.1 + f64::from(dt) * force;
                st = (st.0 + f64::from(dt) * v, v);
            }
            if closest < 2e-5 {
                ambiguous += 1;
                continue;
            }
            assert_state_close(&got[i], st, 2e-5, &format!("pulled {i} of {n}"));
        }
        assert!(
            ambiguous <= n / 10 + 1,
            "{ambiguous} of {n} elements pass within 2e-5 of the cutoff: too few compared"
        );
    }
}

/// Local arrays in an op (`LocalQuadratic`): a 3 x 3 system per element, against the same fit
/// solved here by Cramer's rule in f64.
fn ops_solve_small_systems_in_local_arrays(rt: &Runtime) {
    let m = 64usize;
    let xs = uniform(m, -4.0, 4.0);
    let ys: Vec<f32> = xs
        .iter()
        .zip(uniform(m, -0.1, 0.1))
        .map(|(&x, e)| (f64::from(x).sin() as f32) + e)
        .collect();
    let table: Vec<f32> = xs.iter().zip(&ys).flat_map(|(&x, &y)| [x, y]).collect();
    let t = rt.upload(&table).unwrap();
    let width = 1.5f32;
    let fit = |s: f64| {
        let (mut a, mut b) = ([[0.0f64; 3]; 3], [0.0f64; 3]);
        for (&x, &y) in xs.iter().zip(&ys) {
            let d = f64::from(x) - s;
            let w = (-(d * d) / f64::from(width).powi(2)).exp();
            let basis = [1.0, d, d * d];
            for r in 0..3 {
                b[r] += w * basis[r] * f64::from(y);
                for c in 0..3 {
                    a[r][c] += w * basis[r] * basis[c];
                }
            }
        }
        let det = |m: [[f64; 3]; 3]| {
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
                - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        };
        let mut first = a;
        for r in 0..3 {
            first[r][0] = b[r];
        }
        det(first) / det(a)
    };
    for n in [1usize, 7, 1023, 4099] {
        let at = uniform(n, -3.0, 3.0);
        let input = rt.upload(&at).unwrap();
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        let submitted = LocalFit::submit(rt, &input, &t, width, &mut out, m, 2);
        if graph_unavailable(rt, &submitted) {
            return;
        }
        submitted.unwrap().wait().unwrap();
        for (i, (&got, &s)) in out.to_vec().unwrap().iter().zip(&at).enumerate() {
            let want = fit(f64::from(s));
            // The CPU backend runs the f64 function; the device its f32 form, where the normal
            // equations lose about their condition number times 2^-24 (about 1e-6 here, in a
            // float32 simulation of the same solve).
            let bar = if rt.backend() == pptm::BackendKind::Cpu {
                1e-6
            } else {
                1e-4
            };
            assert!(
                (f64::from(got) - want).abs() <= bar,
                "{}: fit {i} of {n} at {s}: {got} against {want}",
                rt.describe()
            );
        }
    }
}

on_every_backend!(
    ops_solve_small_systems_in_local_arrays,
    ops_loop_over_a_table,
    states_step_in_one_pass,
    states_mix_with_values,
    tables_are_read_at_computed_coordinates,
    empty_tables_and_nan_coordinates_read_nan
);

#[test]
fn a_state_buffer_of_partial_states_is_a_typed_error() {
    let rt = Runtime::cpu();
    // 3 values are not whole states of 2 fields.
    let input = rt.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut out = rt.upload(&[0.0f32; 3]).unwrap();
    let e = Oscillate::submit(&rt, &input, K, C, DT, &mut out).unwrap_err();
    assert!(e.to_string().contains("2 values each"), "{e}");
    // An output of the wrong number of states.
    let input = rt.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut out = rt.upload(&[0.0f32; 2]).unwrap();
    let e = Oscillate::submit(&rt, &input, K, C, DT, &mut out).unwrap_err();
    assert!(e.to_string().contains("`out` has 2 elements"), "{e}");
}

#[test]
fn a_state_op_is_described_by_its_fields() {
    let d = OscStep::DEF;
    assert_eq!((d.flow_channels, d.out_channels), (Some(2), Some(2)));
    assert_eq!(d.states.flow, Some("Osc"));
    assert!(d.cuda.contains("struct pptm_state_Osc {"), "{}", d.cuda);
    assert!(
        d.cuda
            .contains("pptm_state_Osc_f32 pptm_user_osc_step(pptm_state_Osc_f32 s"),
        "{}",
        d.cuda
    );
    assert_eq!(Osc::FIELDS, &["x", "v"]);
    let e = Energy::DEF;
    assert_eq!((e.flow_channels, e.out_channels), (Some(2), Some(1)));
    assert_eq!(AtRest::DEF.states.out, Some("Osc"));
}

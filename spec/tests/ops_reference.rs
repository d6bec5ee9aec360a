//! Every op of the catalog, evaluated by the f64 evaluator (`ChainIr::eval_f64`, which is the CPU
//! backend's arithmetic), against formulas written here from the ops' documented meaning, on
//! fresh random inputs and on values known in closed form. The integration tests check the same
//! ops through the runtime; these run in milliseconds, so mutation testing (scripts/mutants) can
//! afford them for every mutant of spec/.

use std::collections::HashMap;

use pptm_spec::{
    ArgKind, ArgValue, ChainIr, ChainSpec, EvalArg, Evaluated, StageSpec, lower,
    ops::{CATALOG, MAX_K},
};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// A chain of `ops` (stage n+1 is ops[n]), lowered.
fn chain(ops: &[&str]) -> ChainIr {
    let stages = ops
        .iter()
        .enumerate()
        .map(|(i, op)| StageSpec {
            field: format!("s{i}"),
            number: i as u32 + 1,
            op: op.to_string(),
            ..Default::default()
        })
        .collect();
    lower(&ChainSpec {
        name: "Reference".into(),
        domain: "reference".into(),
        stages,
    })
    .unwrap_or_else(|e| panic!("{ops:?}: {e}"))
}

/// The arguments of one evaluation, by name: buffers, by-value scalars, sizes of dimensions that
/// no buffer gives, and the output's length.
#[derive(Default)]
struct Args {
    buffers: HashMap<&'static str, Vec<f32>>,
    values: HashMap<&'static str, f64>,
    dims: HashMap<&'static str, usize>,
    out: usize,
}

impl Args {
    fn buf(mut self, name: &'static str, v: Vec<f32>) -> Self {
        self.buffers.insert(name, v);
        self
    }
    fn val(mut self, name: &'static str, v: f64) -> Self {
        self.values.insert(name, v);
        self
    }
    fn dim(mut self, name: &'static str, v: usize) -> Self {
        self.dims.insert(name, v);
        self
    }
    fn out(mut self, n: usize) -> Self {
        self.out = n;
        self
    }
}

/// Binds `args` to `ir`'s descriptor slots as the runtime does, then evaluates in f64.
fn eval(ir: &ChainIr, args: &Args) -> Evaluated {
    let mut values = Vec::new();
    let mut eval_args = Vec::new();
    for slot in &ir.args {
        let name = slot.name.as_str();
        match slot.kind {
            ArgKind::Input => {
                let b = args
                    .buffers
                    .get(name)
                    .unwrap_or_else(|| panic!("no buffer `{name}`"));
                values.push(ArgValue::Buffer(b.len()));
                eval_args.push(EvalArg::Input(b));
            }
            ArgKind::Output => {
                values.push(ArgValue::Buffer(args.out));
                eval_args.push(EvalArg::None);
            }
            ArgKind::F32 => {
                let v = args.values[name];
                values.push(ArgValue::F32(v as f32));
                eval_args.push(EvalArg::Value(f64::from(v as f32)));
            }
            ArgKind::U32 => {
                let v = args.values[name];
                values.push(ArgValue::U32(v as u32));
                eval_args.push(EvalArg::Value(v));
            }
            ArgKind::Len => {
                let dim = slot.dim.expect("a length names its dimension");
                if ir.dims[dim].inferred_from.is_some() {
                    values.push(ArgValue::Inferred);
                } else {
                    values.push(ArgValue::Dim(args.dims[name]));
                }
                eval_args.push(EvalArg::None);
            }
            ArgKind::Guard | ArgKind::Scratch => {
                values.push(ArgValue::Inferred);
                eval_args.push(EvalArg::None);
            }
        }
    }
    let sizes = ir
        .bind(&values)
        .unwrap_or_else(|e| panic!("binding {:?}: {e}", ir.name));
    ir.eval_f64(&eval_args, &sizes)
}

fn vector(e: Evaluated) -> Vec<f64> {
    match e {
        Evaluated::Vector(v) => v,
        Evaluated::Scalar(s) => panic!("expected a vector, got the scalar {s}"),
    }
}

fn scalar(e: Evaluated) -> f64 {
    match e {
        Evaluated::Scalar(s) => s,
        Evaluated::Vector(v) => panic!("expected a scalar, got {} values", v.len()),
    }
}

fn rng() -> StdRng {
    let seed: u64 = match std::env::var("PPTM_TEST_SEED") {
        Ok(v) => v.parse().expect("PPTM_TEST_SEED is a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("random inputs: seed {seed} (replay with PPTM_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn f(x: f32) -> f64 {
    f64::from(x)
}

/// `got` equals `want` element by element within 1e-12 of each value's magnitude (both are f64
/// computations of the same formula, in other orders at most).
fn assert_all_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= 1e-12 * w.abs().max(1.0) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

const SIZES: [usize; 4] = [1, 7, 33, 1023];

#[test]
fn elementwise_ops_match_their_formulas() {
    let mut rng = rng();
    for n in SIZES {
        let x = uniform(&mut rng, n, -3.0, 3.0);
        let y = uniform(&mut rng, n, -3.0, 3.0);
        let pos = uniform(&mut rng, n, 0.01, 2.0);
        let pos2 = uniform(&mut rng, n, 0.01, 2.0);
        let one = |op: &str, args: Args, want: Vec<f64>| {
            let got = vector(eval(&chain(&[op]), &args.out(n)));
            assert_all_close(&got, &want, &format!("{op}, n = {n}"));
        };
        let map = |v: &[f32], g: &dyn Fn(f64) -> f64| v.iter().map(|&a| g(f(a))).collect();
        let zip = |a: &[f32], b: &[f32], g: &dyn Fn(f64, f64) -> f64| {
            a.iter().zip(b).map(|(&a, &b)| g(f(a), f(b))).collect()
        };
        one(
            "KlDivergence",
            Args::default().buf("q", pos.clone()).buf("p", pos2.clone()),
            zip(&pos, &pos2, &|q, p| q * (q / p).ln()),
        );
        one(
            "PredictionError",
            Args::default().buf("obs", x.clone()).buf("pred", y.clone()),
            zip(&x, &y, &|o, p| o - p),
        );
        one(
            "PrecisionWeight",
            Args::default().buf("e", x.clone()).buf("prec", pos.clone()),
            zip(&x, &pos, &|e, w| w * e),
        );
        one(
            "Accuracy",
            Args::default().buf("e", x.clone()).buf("prec", pos.clone()),
            zip(&x, &pos, &|e, w| -0.5 * w * e * e),
        );
        let (alpha, beta) = (0.75f32, -1.25f32);
        one(
            "Axpby",
            Args::default()
                .buf("x", x.clone())
                .buf("y", y.clone())
                .val("alpha", f64::from(alpha))
                .val("beta", f64::from(beta)),
            zip(&x, &y, &|a, b| f(alpha) * a + f(beta) * b),
        );
        let lr = 0.3f32;
        one(
            "BeliefUpdate",
            Args::default()
                .buf("g", x.clone())
                .buf("mu", y.clone())
                .val("lr", f64::from(lr)),
            zip(&x, &y, &|g, mu| mu + f(lr) * g),
        );
        let plain = |op: &str, g: &dyn Fn(f64) -> f64| {
            one(op, Args::default().buf("x", x.clone()), map(&x, g))
        };
        plain("Square", &|v| v * v);
        plain("Relu", &|v| if v > 0.0 { v } else { 0.0 });
        plain("Sigmoid", &|v| v.exp() / (1.0 + v.exp()));
        plain("Tanh", &|v| (v.exp() - (-v).exp()) / (v.exp() + (-v).exp()));
        one(
            "Digamma",
            Args::default().buf("x", pos.clone()),
            map(&pos, &digamma),
        );
        one(
            "AddDigamma",
            Args::default().buf("x", x.clone()).val("k", 5.0),
            map(&x, &|v| v + digamma(5.0)),
        );
        // GELU: gelu(x) − gelu(−x) = x exactly (erf is odd), and known values below.
        let ir = chain(&["Gelu"]);
        let g = vector(eval(&ir, &Args::default().buf("x", x.clone()).out(n)));
        let neg: Vec<f32> = x.iter().map(|v| -v).collect();
        let gn = vector(eval(&ir, &Args::default().buf("x", neg).out(n)));
        for i in 0..n {
            assert!(
                (g[i] - gn[i] - f(x[i])).abs() < 1e-12,
                "Gelu odd part at {}",
                x[i]
            );
        }
    }
}

#[test]
fn ops_take_their_closed_form_values() {
    let one = |op: &str, x: f32| {
        vector(eval(
            &chain(&[op]),
            &Args::default().buf("x", vec![x]).out(1),
        ))[0]
    };
    // Φ(1) = 0.8413447460685429...: gelu(1) = Φ(1), gelu(−1) = −Φ(−1) = Φ(1) − 1.
    assert!((one("Gelu", 1.0) - 0.841_344_746_068_542_9).abs() < 1e-13);
    assert!((one("Gelu", -1.0) + 0.158_655_253_931_457_1).abs() < 1e-13);
    assert!((one("Gelu", 2.0) - 1.954_499_736_103_642).abs() < 1e-12);
    assert_eq!(one("Gelu", 0.0), 0.0);
    assert_eq!(one("Relu", -0.0), 0.0);
    assert_eq!(one("Relu", 2.5), 2.5);
    assert_eq!(one("Sigmoid", 0.0), 0.5);
    assert_eq!(one("Tanh", 0.0), 0.0);
    // ψ(1) = −γ, ψ(1/2) = −γ − 2 ln 2, ψ(n + 1) = H_n − γ.
    let euler = 0.577_215_664_901_532_9;
    assert!((one("Digamma", 1.0) + euler).abs() < 1e-13);
    assert!((one("Digamma", 0.5) + euler + 2.0 * 2f64.ln()).abs() < 1e-13);
    let h: f64 = (1..=20).map(|k| 1.0 / f64::from(k)).sum();
    assert!((one("Digamma", 21.0) - (h - euler)).abs() < 1e-13);
    // KL: 0 ln 0 = 0, also where p = 0; q > 0 = p is +inf.
    let kl = |q: f32, p: f32| {
        vector(eval(
            &chain(&["KlDivergence"]),
            &Args::default().buf("q", vec![q]).buf("p", vec![p]).out(1),
        ))[0]
    };
    assert_eq!(kl(0.0, 0.5), 0.0);
    assert_eq!(kl(0.0, 0.0), 0.0);
    assert_eq!(kl(0.5, 0.0), f64::INFINITY);
    assert!((kl(0.5, 0.25) - 0.5 * 2f64.ln()).abs() < 1e-15);
}

#[test]
fn reductions_sum_average_and_take_the_largest() {
    let mut rng = rng();
    for n in SIZES {
        let x = uniform(&mut rng, n, -3.0, 3.0);
        let red = |op: &str, x: Vec<f32>| {
            scalar(eval(&chain(&["Square", op]), &Args::default().buf("x", x)))
        };
        let squares: Vec<f64> = x.iter().map(|&v| f(v) * f(v)).collect();
        let sum: f64 = squares.iter().sum();
        let max = squares.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!((red("SumReduction", x.clone()) - sum).abs() <= 1e-12 * sum);
        assert!((red("MeanReduction", x.clone()) - sum / n as f64).abs() <= 1e-12 * sum);
        assert_eq!(red("MaxReduction", x.clone()), max);
    }
    // No elements: the sum is 0, the mean NaN, the largest −inf.
    let red = |op: &str| {
        scalar(eval(
            &chain(&["Square", op]),
            &Args::default().buf("x", vec![]),
        ))
    };
    assert_eq!(red("SumReduction"), 0.0);
    assert!(red("MeanReduction").is_nan());
    assert_eq!(red("MaxReduction"), f64::NEG_INFINITY);
    // NaN elements are ignored by the largest, and negatives are not lost to a 0 identity.
    let max = |x: Vec<f32>| {
        scalar(eval(&chain(&["PredictionError", "MaxReduction"]), &{
            let n = x.len();
            Args::default().buf("obs", x).buf("pred", vec![0.0; n])
        }))
    };
    assert_eq!(max(vec![-3.0, f32::NAN, -2.0]), -2.0);
    assert_eq!(max(vec![-5.0]), -5.0);
}

#[test]
fn products_match_their_sums() {
    let mut rng = rng();
    for (m, k, n) in [(1, 1, 1), (3, 5, 2), (7, 1, 9), (17, 33, 4)] {
        let a = uniform(&mut rng, m * k, -1.0, 1.0);
        let w = uniform(&mut rng, k * n, -1.0, 1.0);
        let b = uniform(&mut rng, n, -1.0, 1.0);
        let mut want = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k)
                    .map(|p| f(a[i * k + p]) * f(w[p * n + j]))
                    .sum::<f64>()
                    + f(b[j]);
            }
        }
        let args = Args::default()
            .buf("a", a.clone())
            .buf("w", w.clone())
            .buf("b", b.clone())
            .dim("m", m)
            .dim("k", k)
            .out(m * n);
        let got = vector(eval(&chain(&["Matmul", "AddBias"]), &args));
        assert_all_close(&got, &want, &format!("Matmul + AddBias {m}x{k}x{n}"));
        // A batch of two: the second product uses the second halves of A and W.
        let batch = 2;
        let a2: Vec<f32> = a.iter().chain(&a).map(|v| v * 2.0).collect();
        let mut w2 = w.clone();
        w2.extend(uniform(&mut rng, k * n, -1.0, 1.0));
        let mut want2 = Vec::new();
        for s in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    want2.push(
                        (0..k)
                            .map(|p| f(a2[(s * m + i) * k + p]) * f(w2[(s * k + p) * n + j]))
                            .sum::<f64>()
                            + f(b[j]),
                    );
                }
            }
        }
        let args = Args::default()
            .buf("a", a2)
            .buf("w", w2)
            .buf("b", b.clone())
            .dim("batch", batch)
            .dim("m", m)
            .dim("k", k)
            .out(batch * m * n);
        let got = vector(eval(&chain(&["BatchedMatmul", "AddBias"]), &args));
        assert_all_close(
            &got,
            &want2,
            &format!("BatchedMatmul + AddBias 2x{m}x{k}x{n}"),
        );
        // GEMV: A (m×n) x, and Aᵀ x' with x' over the rows.
        let (rows, cols) = (m, k);
        let x = uniform(&mut rng, cols, -1.0, 1.0);
        let xr = uniform(&mut rng, rows, -1.0, 1.0);
        let want: Vec<f64> = (0..rows)
            .map(|i| (0..cols).map(|j| f(a[i * cols + j]) * f(x[j])).sum())
            .collect();
        let got = vector(eval(
            &chain(&["Gemv"]),
            &Args::default()
                .buf("x", x.clone())
                .buf("a", a.clone())
                .out(rows),
        ));
        assert_all_close(&got, &want, &format!("Gemv {rows}x{cols}"));
        let want: Vec<f64> = (0..cols)
            .map(|j| (0..rows).map(|i| f(a[i * cols + j]) * f(xr[i])).sum())
            .collect();
        let got = vector(eval(
            &chain(&["GemvT"]),
            &Args::default().buf("x", xr).buf("a", a.clone()).out(cols),
        ));
        assert_all_close(&got, &want, &format!("GemvT {rows}x{cols}"));
    }
}

/// Chebyshev distance of rows i and j of an n×d matrix, as f32 differences.
fn cheb(x: &[f32], d: usize, i: usize, j: usize) -> f64 {
    (0..d)
        .map(|c| f((x[i * d + c] - x[j * d + c]).abs()))
        .fold(0.0, f64::max)
}

#[test]
fn neighbour_ops_count_and_rank_distances() {
    let mut rng = rng();
    for (n, d) in [(2usize, 1usize), (5, 3), (40, 2)] {
        // A coarse grid: ties and distances exactly at a radius are common.
        let grid = |rng: &mut StdRng, len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| rng.random_range(-4i32..4) as f32 / 4.0)
                .collect()
        };
        let x = grid(&mut rng, n * d);
        for k in [1u32, 2, MAX_K] {
            if k as usize >= n {
                continue;
            }
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let mut row: Vec<f64> = (0..n)
                        .filter(|&j| j != i)
                        .map(|j| cheb(&x, d, i, j))
                        .collect();
                    row.sort_by(f64::total_cmp);
                    row[k as usize - 1]
                })
                .collect();
            let got = vector(eval(
                &chain(&["ChebyshevDistance", "KthSmallest"]),
                &Args::default()
                    .buf("x", x.clone())
                    .val("k", f64::from(k))
                    .dim("d", d)
                    .out(n),
            ));
            assert_eq!(got, want, "KthSmallest n={n} d={d} k={k}");
        }
        // Counts strictly within each point's radius in the (x,z), (y,z) and (z) spaces, then
        // the KSG term of each point and their mean plus ψ(k).
        let (xs, ys, zs) = (
            grid(&mut rng, n * d),
            grid(&mut rng, n * d),
            grid(&mut rng, n * d),
        );
        let eps: Vec<f32> = (0..n)
            .map(|_| rng.random_range(0..6) as f32 / 4.0)
            .collect();
        let counts: Vec<[f64; 3]> = (0..n)
            .map(|i| {
                let mut c = [0.0; 3];
                for j in (0..n).filter(|&j| j != i) {
                    let (dx, dy, dz) = (cheb(&xs, d, i, j), cheb(&ys, d, i, j), cheb(&zs, d, i, j));
                    let e = f(eps[i]);
                    c[0] += f64::from(u8::from(dx.max(dz) < e));
                    c[1] += f64::from(u8::from(dy.max(dz) < e));
                    c[2] += f64::from(u8::from(dz < e));
                }
                c
            })
            .collect();
        let terms: Vec<f64> = counts
            .iter()
            .map(|c| digamma(c[2] + 1.0) - digamma(c[0] + 1.0) - digamma(c[1] + 1.0))
            .collect();
        let args = || {
            Args::default()
                .buf("x", xs.clone())
                .buf("y", ys.clone())
                .buf("z", zs.clone())
                .buf("eps", eps.clone())
                .dim("dx", d)
                .dim("dy", d)
                .dim("dz", d)
                .out(n)
        };
        let got = vector(eval(
            &chain(&["SubspaceDistances", "RadiusCount", "KsgDigamma"]),
            &args(),
        ));
        assert_all_close(&got, &terms, &format!("KSG terms n={n} d={d}"));
        let k = 3.0;
        let got = scalar(eval(
            &chain(&[
                "SubspaceDistances",
                "RadiusCount",
                "KsgDigamma",
                "MeanReduction",
                "AddDigamma",
            ]),
            &args().val("k", k),
        ));
        let want = terms.iter().sum::<f64>() / n as f64 + digamma(k);
        assert!(
            (got - want).abs() < 1e-12,
            "TE n={n} d={d}: {got} vs {want}"
        );
    }
}

#[test]
fn every_op_of_the_catalog_is_checked_here() {
    let checked = [
        "KlDivergence",
        "PredictionError",
        "PrecisionWeight",
        "Accuracy",
        "SumReduction",
        "MeanReduction",
        "MaxReduction",
        "Axpby",
        "BeliefUpdate",
        "Square",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "AddBias",
        "Gemv",
        "GemvT",
        "Matmul",
        "BatchedMatmul",
        "Digamma",
        "AddDigamma",
        "KsgDigamma",
        "ChebyshevDistance",
        "SubspaceDistances",
        "KthSmallest",
        "RadiusCount",
    ];
    for op in CATALOG {
        assert!(
            checked.contains(&op.name),
            "{} has no reference here",
            op.name
        );
    }
}

/// ψ(x) for x > 0, written here: recurrence to x >= 20, then the asymptotic series (below 2e-13 there).
fn digamma(x: f64) -> f64 {
    let (mut x, mut acc) = (x, 0.0);
    while x < 20.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    acc + x.ln() - 0.5 / x - r * (1.0 / 12.0 - r * (1.0 / 120.0 - r / 252.0))
}

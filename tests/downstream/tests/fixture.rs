//! The fixture's chains against f64 references written here, with fresh random inputs at odd
//! sizes, on the CPU backend and on every GPU variant (persistent, one launch per item, unfused,
//! unfused from a CUDA graph). Without a GPU the GPU test says it skipped; with
//! `PPTM_REQUIRE_GPU=1` (GPU hosts) that is a failure.

use pptm::{Config, Error, Runtime, Variant};
use pptm_downstream_fixture::{
    EuclideanNorm, HuberLoss, HuberLossF64, LogPartition, RowNorms, RowSwishLogSumExp,
    SoftplusLayer, SoftplusSumF64, SwishLayer, SwishLogSumExp, huber, swish,
};
use pptm_downstream_ops::softplus;
use rand::Rng;

fn uniform(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn lse_f64(v: impl Iterator<Item = f64> + Clone) -> f64 {
    let m = v.clone().fold(f64::NEG_INFINITY, f64::max);
    m + v.map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn swish_f64(x: f64, beta: f64) -> f64 {
    x / (1.0 + (-beta * x).exp())
}

/// ln(1 + eˣ), written independently of the op (which is also its own CPU reference).
fn softplus_f64(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

const SIZES: [usize; 4] = [1, 7, 1023, (1 << 20) + 3];
const SHAPES: [(usize, usize); 4] = [(1, 1), (7, 33), (1023, 257), (4099, 1000)];

fn every_chain_matches_f64(rt: &Runtime) {
    let what = rt.describe();
    // The fixture's own functions are the ops' CPU references, and agree with f64 here.
    assert!((f64::from(swish(1.5, 0.5)) - swish_f64(1.5, 0.5)).abs() < 1e-6);
    for x in [-40.0, -3.0, 0.0, 0.5, 29.0, 31.0, 80.0] {
        assert!(
            (softplus(x) - softplus_f64(x)).abs() <= 1e-15 * (1.0 + x.abs()),
            "{x}"
        );
    }

    for &(m, n) in &SHAPES {
        let (a, x) = (uniform(m * n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let beta = 0.8f32;
        let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
        SwishLayer::submit(
            rt,
            &rt.upload(&x).unwrap(),
            &rt.upload(&a).unwrap(),
            beta,
            &mut out,
        )
        .unwrap()
        .wait()
        .unwrap();
        let got = out.to_vec().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let (mut dot, mut mag) = (0.0f64, 0.0f64);
            for j in 0..n {
                let t = f64::from(a[i * n + j]) * f64::from(x[j]);
                dot += t;
                mag += t.abs();
            }
            let want = swish_f64(dot, f64::from(beta));
            assert!(
                (f64::from(g) - want).abs() <= 1e-5 * mag + 1e-6 * want.abs() + 1e-30,
                "{what}: swish layer {m}x{n}, row {i}: got {g}, f64 reference {want}"
            );
        }

        // The same matrix's rows folded: one's own reduction and the other crate's, row-wise.
        let ab = rt.upload(&a).unwrap();
        let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
        RowSwishLogSumExp::submit(rt, &ab, beta, &mut out, n)
            .unwrap()
            .wait()
            .unwrap();
        for (i, &g) in out.to_vec().unwrap().iter().enumerate() {
            let row = a[i * n..(i + 1) * n].iter();
            let want = lse_f64(row.map(|&v| swish_f64(f64::from(v), f64::from(beta))));
            assert!(
                (f64::from(g) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{what}: row log-sum-exp of swish {m}x{n}, row {i}: got {g}, f64 reference {want}"
            );
        }
        let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
        RowNorms::submit(rt, &ab, &mut out, n)
            .unwrap()
            .wait()
            .unwrap();
        for (i, &g) in out.to_vec().unwrap().iter().enumerate() {
            let want = a[i * n..(i + 1) * n]
                .iter()
                .map(|&v| f64::from(v).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                (f64::from(g) - want).abs() <= 1e-6 * want,
                "{what}: row norm {m}x{n}, row {i}: got {g}, f64 reference {want}"
            );
        }

        // An op of another crate (pptm-downstream-ops) as the GEMV's epilogue, in f32.
        let mut out = rt.upload(&vec![f32::NAN; m]).unwrap();
        SoftplusLayer::submit(
            rt,
            &rt.upload(&x).unwrap(),
            &rt.upload(&a).unwrap(),
            &mut out,
        )
        .unwrap()
        .wait()
        .unwrap();
        for (i, &g) in out.to_vec().unwrap().iter().enumerate() {
            let (mut dot, mut mag) = (0.0f64, 0.0f64);
            for j in 0..n {
                let t = f64::from(a[i * n + j]) * f64::from(x[j]);
                dot += t;
                mag += t.abs();
            }
            let want = softplus_f64(dot);
            assert!(
                (f64::from(g) - want).abs() <= 1e-5 * mag + 1e-6 * want.abs() + 1e-30,
                "{what}: softplus layer {m}x{n}, row {i}: got {g}, f64 reference {want}"
            );
        }

        let got = LogPartition::submit(rt, &rt.upload(&x).unwrap(), &rt.upload(&a).unwrap(), m)
            .unwrap()
            .wait()
            .unwrap();
        let want = lse_f64((0..m).map(|i| {
            (0..n)
                .map(|j| f64::from(a[i * n + j]) * f64::from(x[j]))
                .sum::<f64>()
        }));
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * n as f64 + 1e-6 * want.abs(),
            "{what}: log-partition {m}x{n}: got {got}, f64 reference {want}"
        );
    }

    for n in SIZES {
        let (pred, target) = (uniform(n, -4.0, 4.0), uniform(n, -4.0, 4.0));
        let delta = 1.0f32;
        let (pb, tb) = (rt.upload(&pred).unwrap(), rt.upload(&target).unwrap());
        let want: f64 = pred
            .iter()
            .zip(&target)
            .map(|(&p, &t)| huber(f64::from(p) - f64::from(t), delta))
            .sum();
        let got = HuberLoss::submit(rt, &pb, &tb, 1.0, -1.0, delta)
            .unwrap()
            .wait()
            .unwrap();
        // f32 stages: each term within a few ulps; terms are non-negative, so relative to the sum.
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * want + 1e-30,
            "{what}: huber loss, n = {n}: got {got}, f64 reference {want}"
        );
        let got = HuberLossF64::submit(rt, &pb, &tb, 1.0, -1.0, delta)
            .unwrap()
            .wait()
            .unwrap();
        // f64 stages: only the result's rounding to f32 is left.
        assert!(
            (f64::from(got) - want).abs() <= 1.2e-7 * want + 1e-30,
            "{what}: huber loss in f64, n = {n}: got {got}, f64 reference {want}"
        );

        // The other crate's ops: its elementwise op in f64 stages, its reduction after a built-in.
        let x = uniform(n, -40.0, 40.0);
        let xb = rt.upload(&x).unwrap();
        let got = SoftplusSumF64::submit(rt, &xb).unwrap().wait().unwrap();
        let want: f64 = x.iter().map(|&v| softplus_f64(f64::from(v))).sum();
        assert!(
            (f64::from(got) - want).abs() <= 1.2e-7 * want + 1e-30,
            "{what}: softplus sum in f64, n = {n}: got {got}, f64 reference {want}"
        );
        let got = EuclideanNorm::submit(rt, &xb).unwrap().wait().unwrap();
        let want = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * want,
            "{what}: euclidean norm, n = {n}: got {got}, f64 reference {want}"
        );

        let x = uniform(n, -20.0, 20.0);
        let beta = 1.7f32;
        let got = SwishLogSumExp::submit(rt, &rt.upload(&x).unwrap(), beta)
            .unwrap()
            .wait()
            .unwrap();
        let want = lse_f64(x.iter().map(|&v| swish_f64(f64::from(v), f64::from(beta))));
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{what}: log-sum-exp of swish, n = {n}: got {got}, f64 reference {want}"
        );
    }
}

#[test]
fn on_the_cpu() {
    every_chain_matches_f64(&Runtime::cpu());
}

#[test]
fn on_every_gpu_variant() {
    let require = std::env::var("PPTM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    for variant in [
        Variant::Fused,
        Variant::FusedLaunched,
        Variant::Unfused,
        Variant::UnfusedGraph,
    ] {
        let rt = match Runtime::gpu_with(Config {
            variant,
            ..Default::default()
        }) {
            Ok(rt) => rt,
            Err(Error::NoGpu(why)) if !require => {
                eprintln!("SKIPPED (no GPU: {why}): the downstream fixture on the GPU");
                return;
            }
            Err(e) => panic!("cannot open the GPU runtime ({variant:?}): {e}"),
        };
        eprintln!("downstream fixture: {}", rt.describe());
        every_chain_matches_f64(&rt);
        rt.shutdown().unwrap();
    }
}

//! pptm-bench: dispatch latency, throughput and KlComplexity bandwidth on a GPU, beside the
//! alternatives measured in the same process (empty launch + sync, one-node CUDA graph + sync).
//!
//!     cargo run --release --bin pptm-bench [-- --quick]
//!
//! Host-visible latency: host clock around submit → result on the host, after warm-up; medians
//! and p99 over many repetitions. Every KlComplexity result is checked against an f64 reference.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Instant;

use pptm::baseline::LaunchBaseline;
use pptm::chains::KlComplexity;
use pptm::{Chain, Runtime};
use rand_free::positive;

/// Inputs without a rand dependency in the library's bin (a small xorshift generator).
mod rand_free {
    pub fn positive(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // (0, 1]
                ((s >> 40) as f32 + 1.0) / (1u64 << 24) as f32
            })
            .collect()
    }
}

use pptm::timing::{Stats, measure as time};

fn kl_reference(q: &[f32], p: &[f32]) -> f64 {
    q.iter()
        .zip(p)
        .map(|(&q, &p)| {
            if q == 0.0 {
                0.0
            } else {
                f64::from(q) * (f64::from(q).ln() - f64::from(p).ln())
            }
        })
        .sum()
}

/// Runs KlComplexity once and refuses (an error naming `what`) a result off the f64 reference by
/// more than 1e-5 relative: a figure for a wrong answer is not reported.
fn checked_kl(
    rt: &Runtime,
    q: &pptm::Buffer<f32>,
    p: &pptm::Buffer<f32>,
    want: f64,
    what: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let got = f64::from(KlComplexity::submit(rt, q, p)?.wait()?);
    let rel = (got - want).abs() / want.abs();
    if rel > 1e-5 {
        return Err(format!(
            "KlComplexity {what}: {got} vs f64 {want} (relative error {rel:e}); not reporting"
        )
        .into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pptm-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pptm-bench pairwise`: DistanceKth and TeReduction latency against size, dimension and blocks
/// per SM, to see where the pairwise pattern's time goes.
fn pairwise_sweep() -> Result<(), Box<dyn std::error::Error>> {
    use pptm::chains::{DistanceKth, TeReduction};
    let mut seed = 7u64;
    let mut take = |n: usize| {
        seed += 1;
        positive(n, seed)
    };
    for blocks_per_sm in [1u32, 2] {
        let rt = Runtime::gpu_with(pptm::Config {
            blocks_per_sm,
            ..Default::default()
        })?;
        rt.prepare::<DistanceKth>()?;
        println!("{} (blocks_per_sm = {blocks_per_sm})", rt.describe());
        for n in [1024usize, 2048, 4096] {
            for d in [1usize, 4] {
                let x = rt.upload(&take(n * d))?;
                let mut out = rt.alloc::<f32>(n)?;
                let s = time(50, 300, || {
                    DistanceKth::submit(&rt, &x, 4, &mut out, d)?.wait()
                })?;
                println!("  distance_kth n={n:5} d={d} k=4: {s}");
            }
            let (x, y, z) = (
                rt.upload(&take(n))?,
                rt.upload(&take(n))?,
                rt.upload(&take(n))?,
            );
            let eps = rt.upload(&vec![0.1f32; n])?;
            let s = time(50, 300, || {
                TeReduction::submit(&rt, &x, &y, &z, &eps, 4, 1, 1, 1)?
                    .wait()
                    .map(|_| ())
            })?;
            println!("  te_reduction n={n:5} d=1: {s}");
        }
    }
    Ok(())
}

/// `pptm-bench chains`: every chain at a small and a large size on the three GPU variants, in one
/// run, domain by domain (each domain's manifold gets the whole GPU while it is timed).
fn chain_variants() -> Result<(), Box<dyn std::error::Error>> {
    use pptm::chains::{
        AccuracyPipeline, BeliefUpdateStep, DistanceKth, GemvAxpbySum, MatmulBiasGelu, TeReduction,
    };
    type Case = (
        &'static str,
        usize,
        Box<dyn Fn(&Runtime) -> Result<Stats, pptm::Error>>,
    );
    let mut seed = 11u64;
    let mut v = move |n: usize| {
        seed += 1;
        positive(n, seed)
    };
    let reps = |big: bool| if big { 50 } else { 1000 };
    let mut domains: Vec<(&str, Vec<Case>)> = Vec::new();
    let mut inference: Vec<Case> = Vec::new();
    for n in [4096usize, 1 << 26] {
        let (q, p) = (v(n), v(n));
        inference.push((
            "kl_complexity",
            n,
            Box::new(move |rt| {
                let (qb, pb) = (rt.upload(&q)?, rt.upload(&p)?);
                time(reps(n > 4096) / 10, reps(n > 4096), || {
                    KlComplexity::submit(rt, &qb, &pb)?.wait().map(|_| ())
                })
            }),
        ));
        let (o, pr, w) = (v(n), v(n), v(n));
        inference.push((
            "accuracy_pipeline",
            n,
            Box::new(move |rt| {
                let (ob, pb, wb) = (rt.upload(&o)?, rt.upload(&pr)?, rt.upload(&w)?);
                time(reps(n > 4096) / 10, reps(n > 4096), || {
                    AccuracyPipeline::submit(rt, &ob, &pb, &wb)?
                        .wait()
                        .map(|_| ())
                })
            }),
        ));
    }
    for d in [256usize, 4096] {
        let (o, pr, w, j, mu) = (v(d), v(d), v(d), v(d * d), v(d));
        inference.push((
            "belief_update (m = n)",
            d,
            Box::new(move |rt| {
                let (ob, pb, wb, jb, mb) = (
                    rt.upload(&o)?,
                    rt.upload(&pr)?,
                    rt.upload(&w)?,
                    rt.upload(&j)?,
                    rt.upload(&mu)?,
                );
                let mut out = rt.alloc::<f32>(d)?;
                time(reps(d > 256) / 10, reps(d > 256), || {
                    BeliefUpdateStep::submit(rt, &ob, &pb, &wb, &jb, &mb, 0.1, &mut out)?.wait()
                })
            }),
        ));
    }
    domains.push(("inference", inference));
    let mut te: Vec<Case> = Vec::new();
    for n in [1024usize, 4096] {
        let x = v(n * 4);
        te.push((
            "distance_kth (d = 4, k = 4)",
            n,
            Box::new(move |rt| {
                let xb = rt.upload(&x)?;
                let mut out = rt.alloc::<f32>(n)?;
                time(20, 200, || {
                    DistanceKth::submit(rt, &xb, 4, &mut out, 4)?.wait()
                })
            }),
        ));
        let (x, y, z) = (v(n), v(n), v(n));
        te.push((
            "te_reduction (d = 1 each)",
            n,
            Box::new(move |rt| {
                let (xb, yb, zb, eb) = (
                    rt.upload(&x)?,
                    rt.upload(&y)?,
                    rt.upload(&z)?,
                    rt.upload(&vec![0.1f32; n])?,
                );
                time(20, 200, || {
                    TeReduction::submit(rt, &xb, &yb, &zb, &eb, 4, 1, 1, 1)?
                        .wait()
                        .map(|_| ())
                })
            }),
        ));
    }
    domains.push(("transfer_entropy", te));
    let mut la: Vec<Case> = Vec::new();
    for d in [256usize, 16384] {
        let (x, a, y) = (v(d), v(d * d), v(d));
        la.push((
            "gemv_axpby_sum (m = n)",
            d,
            Box::new(move |rt| {
                let (xb, ab, yb) = (rt.upload(&x)?, rt.upload(&a)?, rt.upload(&y)?);
                time(reps(d > 256) / 10, reps(d > 256), || {
                    GemvAxpbySum::submit(rt, &xb, &ab, &yb, 1.0, 0.5)?
                        .wait()
                        .map(|_| ())
                })
            }),
        ));
    }
    for (m, k, n) in [(64usize, 256usize, 256usize), (1024, 1024, 1024)] {
        let (a, w, b) = (v(m * k), v(k * n), v(n));
        la.push((
            "matmul_bias_gelu f32 (m; k, n below)",
            m,
            Box::new(move |rt| {
                let (ab, wb, bb) = (rt.upload(&a)?, rt.upload(&w)?, rt.upload(&b)?);
                let mut out = rt.alloc::<f32>(m * n)?;
                time(10, if m > 64 { 100 } else { 1000 }, || {
                    MatmulBiasGelu::submit(rt, &ab, &wb, &bb, &mut out, m, k)?.wait()
                })
            }),
        ));
    }
    domains.push(("linear_algebra", la));

    println!(
        "| domain | chain | size | fused persistent µs | fused launched µs | unfused µs | unfused / persistent |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (domain, cases) in &domains {
        let rt = Runtime::gpu()?;
        let variants = pptm::timing::variants(rt)?;
        for (name, size, case) in cases {
            let mut medians = Vec::new();
            for (_, rt) in &variants {
                medians.push(case(rt)?.median_us);
            }
            println!(
                "| {domain} | {name} | {size} | {:.1} | {:.1} | {:.1} | {:.2}x |",
                medians[0],
                medians[1],
                medians[2],
                medians[2] / medians[0]
            );
        }
        eprintln!("({})", variants[0].1.describe());
    }
    Ok(())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "pairwise") {
        return pairwise_sweep();
    }
    if std::env::args().any(|a| a == "chains") {
        return chain_variants();
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };
    let rt = Runtime::gpu().map_err(|e| format!("needs a GPU: {e}"))?;
    println!("pptm-bench on {}", rt.describe());
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |name: &str, value: String| {
        println!("  {name:<52} {value}");
        rows.push((name.to_string(), value));
    };

    // 1. What a user does today, measured before any manifold occupies the GPU.
    let base = LaunchBaseline::new(&rt, KlComplexity::DOMAIN)?;
    let s = time(1000, 20_000 / scale, || base.launch_and_sync())?;
    row(
        "empty cuLaunchKernel + cuStreamSynchronize",
        format!("median {:7.2} µs  p99 {:7.2} µs", s.median_us, s.p99_us),
    );
    let s = time(1000, 20_000 / scale, || base.graph_and_sync())?;
    row(
        "one-node CUDA graph launch + sync",
        format!("median {:7.2} µs  p99 {:7.2} µs", s.median_us, s.p99_us),
    );
    drop(base);

    // 2. The manifold.
    let t = Instant::now();
    rt.prepare::<KlComplexity>()?;
    row(
        "manifold load + launch (once)",
        format!("{:.1} ms", t.elapsed().as_secs_f64() * 1e3),
    );
    println!("  ({})", rt.describe());
    let s = time(2000, 50_000 / scale, || {
        rt.submit_noop::<KlComplexity>()?.wait()
    })?;
    row(
        "pptm no-op submit -> completion",
        format!("median {:7.2} µs  p99 {:7.2} µs", s.median_us, s.p99_us),
    );

    for window in [64usize, 192] {
        let items = 200_000 / scale;
        let mut pending = VecDeque::with_capacity(window);
        for _ in 0..window {
            rt.submit_noop::<KlComplexity>()?.wait()?;
        }
        let t = Instant::now();
        for _ in 0..items {
            if pending.len() == window {
                let tk: pptm::Ticket<'static, ()> = pending.pop_front().expect("window");
                tk.wait()?;
            }
            pending.push_back(rt.submit_noop::<KlComplexity>()?);
        }
        for tk in pending {
            tk.wait()?;
        }
        let rate = items as f64 / t.elapsed().as_secs_f64();
        row(
            &format!("pptm sustained no-ops, {window} in flight"),
            format!("{:9.0} items/s ({:.2} µs/item)", rate, 1e6 / rate),
        );
    }

    // 3. KlComplexity: latency and effective bandwidth (8 bytes read per element).
    for (n, reps, sets) in [
        (4096usize, 20_000 / scale, 1usize),
        (1 << 20, 2000 / scale, 8),
        (1 << 26, 200 / scale, 1),
    ] {
        // Several input sets where one would sit in L2, so that the figure is memory, not cache.
        let inputs: Vec<_> = (0..sets)
            .map(|i| {
                let (q, p) = (positive(n, 2 * i as u64 + 1), positive(n, 2 * i as u64 + 2));
                let want = kl_reference(&q, &p);
                Ok::<_, pptm::Error>((rt.upload(&q)?, rt.upload(&p)?, want))
            })
            .collect::<Result<_, _>>()?;
        for (q, p, want) in &inputs {
            checked_kl(&rt, q, p, *want, &format!("n = {n}"))?;
        }
        let mut i = 0;
        let s = time(reps / 10 + 10, reps.max(20), || {
            let (q, p, _) = &inputs[i % sets];
            i += 1;
            KlComplexity::submit(&rt, q, p)?.wait().map(|_| ())
        })?;
        let gbs = 8.0 * n as f64 / (s.median_us * 1e-6) / 1e9;
        row(
            &format!("pptm KlComplexity n = {n}"),
            format!(
                "median {:9.2} µs  p99 {:9.2} µs  {:7.1} GB/s",
                s.median_us, s.p99_us, gbs
            ),
        );
    }
    let described = rt.describe();
    drop(rt);

    // 4. Fetcher pollers, each twice, one runtime at a time (a manifold is a whole-GPU
    //    grid): no-op and KlComplexity n = 4096 round trips.
    if !quick {
        println!("\nconfiguration sweep (median / p99 µs):");
        let q4 = positive(4096, 7);
        let p4 = positive(4096, 8);
        let want = kl_reference(&q4, &p4);
        for pollers in [1u32, 2, 3] {
            for _repeat in 0..2 {
                let cfg = pptm::Config {
                    fetch_pollers: pollers,
                    ..Default::default()
                };
                let rt = Runtime::gpu_with(cfg)?;
                rt.prepare::<KlComplexity>()?;
                let noop = time(2000, 20_000, || rt.submit_noop::<KlComplexity>()?.wait())?;
                let (q, p) = (rt.upload(&q4)?, rt.upload(&p4)?);
                checked_kl(
                    &rt,
                    &q,
                    &p,
                    want,
                    &format!("with fetch_pollers = {pollers}"),
                )?;
                let kl = time(2000, 20_000, || {
                    KlComplexity::submit(&rt, &q, &p)?.wait().map(|_| ())
                })?;
                let name = format!("fetch_pollers = {pollers}");
                row(
                    &name,
                    format!(
                        "no-op {:5.2} / {:5.2}   KL 4096 {:5.2} / {:5.2}",
                        noop.median_us, noop.p99_us, kl.median_us, kl.p99_us
                    ),
                );
            }
        }
    }

    // 5. Bandwidth at 2^26 with one and two compute blocks per SM.
    if !quick {
        let n = 1 << 26;
        let (q, p) = (positive(n, 11), positive(n, 12));
        let want = kl_reference(&q, &p);
        for blocks_per_sm in [1u32, 2] {
            let rt = Runtime::gpu_with(pptm::Config {
                blocks_per_sm,
                ..Default::default()
            })?;
            let (qb, pb) = (rt.upload(&q)?, rt.upload(&p)?);
            checked_kl(
                &rt,
                &qb,
                &pb,
                want,
                &format!("with blocks_per_sm = {blocks_per_sm}"),
            )?;
            let s = time(20, 200, || {
                KlComplexity::submit(&rt, &qb, &pb)?.wait().map(|_| ())
            })?;
            let gbs = 8.0 * n as f64 / (s.median_us * 1e-6) / 1e9;
            let blocks = rt.manifold_blocks::<KlComplexity>().unwrap_or(0);
            row(
                &format!("KlComplexity 2^26, blocks_per_sm = {blocks_per_sm} ({blocks} blocks)"),
                format!(
                    "median {:9.2} µs  p99 {:9.2} µs  {:7.1} GB/s",
                    s.median_us, s.p99_us, gbs
                ),
            );
        }
    }

    println!("\nsummary ({described}):");
    for (name, value) in &rows {
        println!("| {name} | {value} |");
    }
    Ok(())
}

//! What a pipeline costs beyond its items: 8, 32 and 170 dependent small stages (4096-element
//! elementwise steps, and 256 x 256 GEMVs) pushed as one pipeline, each checked against f64, with
//!   * the end-to-end time on the host (push, dispatch, wait), median and p99, and its parts: the
//!     pushes (recording the items), and the dispatch until the results are on the host;
//!   * on the GPU, from the plan's own clock: its span (first stage's start to last stage's end),
//!     the stages' own time, the mean hand-off between two dependent stages, and the host's share
//!     (dispatch until results, minus the span: submission until the first stage starts, plus the
//!     last stage's end until the results are on the host);
//!   * the same pipelines kept (`wait_and_keep`) and run again: no pushes, their plans' steps
//!     resident on the device;
//!   * the 170 elementwise stages declared as one chain (`#[stage(1, repeat = 170)]`): one item,
//!     the stages fused into one pass; and declared as the steps of a build-time pipeline
//!     (`#[derive(Pipeline)]`, `#[step(1, repeat = 170)]`), which composes them into the same one
//!     pass, kept and run again (its host share from the plan's clock);
//!   * a 1000-iteration loop on the device (two dependent steps an iteration) with the host's
//!     round trips it took, checked against f64.
//!
//!     cargo run --release --example pipeline_handoff

use std::error::Error;
use std::time::{Duration, Instant};

use pptm::ops::{Axpby, Gemv};
use pptm::timing::Stats;
use pptm::{BackendKind, Buffer, FusionBuilder, PipeInput, Pipeline, Runtime};
use rand::Rng;

/// u ← α x + β c: one elementwise stage.
#[derive(FusionBuilder)]
#[fusion(domain = "pipeline_handoff")]
pub struct Step {
    #[stage(1)]
    blend: Axpby,
}

/// The 170 elementwise stages declared as one chain: the stage repeated at build time, fused
/// into one pass (no memory round trip between stages), as torch.compile fuses them.
#[derive(FusionBuilder)]
#[fusion(domain = "pipeline_handoff")]
pub struct Steps170 {
    #[stage(1, repeat = 170)]
    blend: Axpby,
}

/// The 170 elementwise stages as the steps of a build-time pipeline: `Step` applied 170 times,
/// each time to what the time before wrote; composed at build time into one part, one pass.
#[derive(Pipeline)]
pub struct StepsPipeline {
    #[step(1, repeat = 170)]
    u: Step,
}

/// y = A x: one GEMV stage.
#[derive(FusionBuilder)]
#[fusion(domain = "pipeline_handoff")]
pub struct Product {
    #[stage(1)]
    gemv: Gemv,
}

const N: usize = 4096;
const ALPHA: f32 = 0.5;
const BETA: f32 = 0.25;
const GEMV_N: usize = 256;

fn uniform(n: usize, scale: f32) -> Vec<f32> {
    let mut r = rand::rng();
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

/// Timings of one shape: end to end on the host, and (GPU) the plan's clock.
struct Timing {
    host: Stats,
    push_us: f64,
    dispatch_us: f64,
    span_us: f64,
    items_us: f64,
    handoff_us: f64,
    host_share_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `run` (one pipeline, returning its results) many times and gathers the figures.
fn time(reps: usize, mut run: impl FnMut() -> pptm::Result<Run>) -> pptm::Result<Timing> {
    for _ in 0..reps / 10 + 1 {
        run()?;
    }
    let (mut host, mut push, mut dispatch) = (vec![], vec![], vec![]);
    let (mut span, mut items, mut handoff, mut share) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        let r = run()?;
        host.push(r.pushed + r.dispatched);
        push.push(r.pushed.as_secs_f64() * 1e6);
        dispatch.push(r.dispatched.as_secs_f64() * 1e6);
        if let Some(d) = r.results.device_time() {
            span.push(d.span.as_secs_f64() * 1e6);
            items.push(d.items.as_secs_f64() * 1e6);
            handoff.push(d.mean_handoff().as_secs_f64() * 1e6);
            share.push(r.dispatched.saturating_sub(d.span).as_secs_f64() * 1e6);
        }
    }
    Ok(Timing {
        host: Stats::of(host),
        push_us: median(push),
        dispatch_us: median(dispatch),
        span_us: median(span),
        items_us: median(items),
        handoff_us: median(handoff),
        host_share_us: median(share),
    })
}

/// One pipeline's results, with the time its pushes took and the time from its dispatch until
/// its results were on the host.
struct Run {
    results: pptm::PipeResults,
    pushed: Duration,
    dispatched: Duration,
}

/// Dispatches a recorded pipeline and waits for it, timing both parts.
fn finish(mut p: pptm::Pipeline<'_>, started: Instant) -> pptm::Result<Run> {
    let recorded = Instant::now();
    p.flush()?;
    let results = p.wait()?;
    Ok(Run {
        results,
        pushed: recorded - started,
        dispatched: recorded.elapsed(),
    })
}

/// The two kinds of stage.
#[derive(Clone, Copy)]
enum Kind {
    /// u ← α u + β c over 4096 elements.
    Elementwise,
    /// u ← A u, A 256 x 256.
    Gemv,
}

/// Pushes `stages` dependent stages: u and v taking turns as output, the first reading `x`, each
/// later one what the one before wrote. `operand`: c (elementwise) or A (GEMV).
fn push_stages<'p>(
    p: &mut Pipeline<'p>,
    kind: Kind,
    stages: usize,
    x: &'p Buffer<f32>,
    operand: &'p Buffer<f32>,
    u: &'p mut Buffer<f32>,
    v: &'p mut Buffer<f32>,
) -> pptm::Result<()> {
    let (xi, oi) = (p.input(x), p.input(operand));
    let (uo, vo) = (p.output(u), p.output(v));
    for k in 0..stages {
        let (from, to): (PipeInput<'_>, _) = match k {
            0 => (xi, uo),
            k if k % 2 == 0 => (vo.into(), uo),
            _ => (uo.into(), vo),
        };
        match kind {
            Kind::Elementwise => Step::push(p, from, oi, ALPHA, BETA, to).map(|_| ())?,
            Kind::Gemv => Product::push(p, from, oi, to).map(|_| ())?,
        }
    }
    Ok(())
}

/// The stages built as a pipeline, dispatched and waited, `reps` times over (with warm-up).
fn time_built(
    rt: &Runtime,
    reps: usize,
    kind: Kind,
    stages: usize,
    bufs: (
        &Buffer<f32>,
        &Buffer<f32>,
        &mut Buffer<f32>,
        &mut Buffer<f32>,
    ),
) -> pptm::Result<Timing> {
    let (x, operand, u, v) = bufs;
    time(reps, || {
        let started = Instant::now();
        let mut p = rt.pipeline();
        push_stages(&mut p, kind, stages, x, operand, u, v)?;
        finish(p, started)
    })
}

/// The stages built once and kept (`wait_and_keep`), then run again `reps` times over: no pushes,
/// the plan's steps resident on the device.
fn time_kept(
    rt: &Runtime,
    reps: usize,
    kind: Kind,
    stages: usize,
    bufs: (
        &Buffer<f32>,
        &Buffer<f32>,
        &mut Buffer<f32>,
        &mut Buffer<f32>,
    ),
) -> pptm::Result<Timing> {
    let (x, operand, u, v) = bufs;
    let mut p = rt.pipeline();
    push_stages(&mut p, kind, stages, x, operand, u, v)?;
    let (_, mut kept) = p.wait_and_keep()?;
    time_runs(reps, &mut kept)
}

/// A kept pipeline run again `reps` times over (with warm-up): no pushes, only runs.
fn time_runs(reps: usize, kept: &mut pptm::KeptPipeline<'_>) -> pptm::Result<Timing> {
    time(reps, || {
        let started = Instant::now();
        let results = kept.run()?;
        Ok(Run {
            results,
            pushed: Duration::ZERO,
            dispatched: started.elapsed(),
        })
    })
}

/// The worst error of `got` against `want`, relative to max(|want|, floor).
fn worst(got: &[f32], want: &[f64], floor: f64) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(floor))
        .fold(0.0, f64::max)
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::new()?;
    let gpu = rt.backend() == BackendKind::Gpu;
    println!("pptm: pipeline hand-offs, on the {}", rt.describe());
    let reps = if gpu { 300 } else { 5 };
    let mut failures = 0;

    let (x, c) = (uniform(N, 1.0), uniform(N, 1.0));
    let (xb, cb) = (rt.upload(&x)?, rt.upload(&c)?);
    let (mut u, mut v) = (rt.alloc::<f32>(N)?, rt.alloc::<f32>(N)?);
    // A with a spectral radius near 1 (uniform entries of variance 1/3, over sqrt(n/3)).
    let scale = (3.0 / GEMV_N as f32).sqrt();
    let a = uniform(GEMV_N * GEMV_N, scale);
    let g0 = uniform(GEMV_N, 1.0);
    let (ab, g0b) = (rt.upload(&a)?, rt.upload(&g0)?);
    let (mut gu, mut gv) = (rt.alloc::<f32>(GEMV_N)?, rt.alloc::<f32>(GEMV_N)?);

    println!(
        "\n{:<28} {:>22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}",
        "stages",
        "end to end (host)",
        "pushes",
        "dispatch",
        "span",
        "stages",
        "hand-off",
        "host share"
    );
    for stages in [8usize, 32, 170] {
        // Elementwise, checked against f64: built each time, then kept and run again.
        let mut w: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        for _ in 0..stages {
            for (w, &c) in w.iter_mut().zip(&c) {
                *w = f64::from(ALPHA) * *w + f64::from(BETA) * f64::from(c);
            }
        }
        for kept in [false, true] {
            u.write(&vec![f32::NAN; N])?;
            v.write(&vec![f32::NAN; N])?;
            let timer = if kept { time_kept } else { time_built };
            let t = timer(
                &rt,
                reps,
                Kind::Elementwise,
                stages,
                (&xb, &cb, &mut u, &mut v),
            )?;
            let last = if stages % 2 == 1 { &u } else { &v };
            let err = worst(&last.to_vec()?, &w, 1e-3);
            failures += usize::from(err > 1e-5);
            let what = if kept {
                "  kept, run again"
            } else {
                "x 4096 elementwise"
            };
            report(&format!("{stages} {what}"), &t, gpu, err);
        }

        // GEMVs, checked against f64.
        let mut w: Vec<f64> = g0.iter().map(|&v| f64::from(v)).collect();
        for _ in 0..stages {
            w = (0..GEMV_N)
                .map(|i| {
                    (0..GEMV_N)
                        .map(|j| f64::from(a[i * GEMV_N + j]) * w[j])
                        .sum()
                })
                .collect();
        }
        let norm = w.iter().map(|v| v.abs()).fold(0.0, f64::max);
        for kept in [false, true] {
            gu.write(&vec![f32::NAN; GEMV_N])?;
            gv.write(&vec![f32::NAN; GEMV_N])?;
            let timer = if kept { time_kept } else { time_built };
            let t = timer(&rt, reps, Kind::Gemv, stages, (&g0b, &ab, &mut gu, &mut gv))?;
            let last = if stages % 2 == 1 { &gu } else { &gv };
            let err = worst(&last.to_vec()?, &w, norm);
            failures += usize::from(err > 1e-3);
            let what = if kept {
                "  kept, run again".to_string()
            } else {
                format!("x GEMV {GEMV_N} x {GEMV_N}")
            };
            report(&format!("{stages} {what}"), &t, gpu, err);
        }
    }

    // The 170 elementwise stages as one chain of one item (`repeat = 170`), checked against f64.
    u.write(&vec![f32::NAN; N])?;
    let mut host = Vec::with_capacity(reps);
    for rep in 0..reps + reps / 10 + 1 {
        let started = Instant::now();
        Steps170::submit(&rt, &xb, &cb, ALPHA, BETA, &mut u)?.wait()?;
        if rep > reps / 10 {
            host.push(started.elapsed());
        }
    }
    let mut w: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for _ in 0..170 {
        for (w, &c) in w.iter_mut().zip(&c) {
            *w = f64::from(ALPHA) * *w + f64::from(BETA) * f64::from(c);
        }
    }
    let err = worst(&u.to_vec()?, &w, 1e-3);
    failures += usize::from(err > 1e-5);
    let fused = Stats::of(host);
    println!(
        "{:<28} {:>22}   (one item; error {err:.1e})",
        "170 fused: repeat = 170",
        format!("{:.1} / p99 {:.1} µs", fused.median_us, fused.p99_us),
    );

    // The same 170 stages as a build-time pipeline, kept and run again, checked against f64.
    u.write(&vec![f32::NAN; N])?;
    let mut p = rt.pipeline();
    let (xi, ci) = (p.input(&xb), p.input(&cb));
    let uo = p.output(&mut u);
    StepsPipeline::push(&mut p, xi, ci, ALPHA, BETA, uo)?;
    let (_, mut kept) = p.wait_and_keep()?;
    let t = time_runs(reps, &mut kept)?;
    let err = worst(&kept.buffer(uo)?.to_vec()?, &w, 1e-3);
    failures += usize::from(err > 1e-5);
    report("170 build-time pipeline", &t, gpu, err);
    drop(kept);

    // A loop of 1000 iterations on the device: two dependent steps an iteration.
    const ITERATIONS: u32 = 1000;
    let mut v0 = rt.upload(&x)?;
    let t = Instant::now();
    let r = {
        let mut p = rt.pipeline();
        let ci = p.input(&cb);
        let (uo, vo) = (p.output(&mut u), p.output(&mut v0));
        let lp = p.repeat(ITERATIONS, |p| {
            Step::push(p, vo, ci, 1.0, 0.001, uo)?;
            Step::push(p, uo, ci, 1.0, 0.001, vo)?;
            Ok(())
        })?;
        let r = p.wait()?;
        (r.iterations(lp)?, r.round_trips())
    };
    let took = t.elapsed();
    let want: Vec<f64> = x
        .iter()
        .zip(&c)
        .map(|(&x, &c)| f64::from(x) + 2.0 * f64::from(c))
        .collect();
    let err = worst(&v0.to_vec()?, &want, 1.0);
    failures += usize::from(err > 5e-4 || r.0 != ITERATIONS);
    println!(
        "\nloop: {} iterations of 2 dependent steps in {:.1} µs end to end ({:.2} µs an iteration); \
         host round trips: {}; worst error against f64: {err:.1e}",
        r.0,
        took.as_secs_f64() * 1e6,
        took.as_secs_f64() * 1e6 / f64::from(ITERATIONS),
        r.1,
    );
    if failures > 0 {
        return Err(format!("{failures} result(s) disagree with the f64 reference").into());
    }
    println!("every result agrees with its f64 reference");
    Ok(())
}

fn report(what: &str, t: &Timing, gpu: bool, err: f64) {
    let us = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.2} µs")
        }
    };
    println!(
        "{:<28} {:>22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}   (error {err:.1e})",
        what,
        format!("{:.1} / p99 {:.1} µs", t.host.median_us, t.host.p99_us),
        us(t.push_us),
        us(t.dispatch_us),
        if gpu { us(t.span_us) } else { "-".into() },
        if gpu { us(t.items_us) } else { "-".into() },
        if gpu { us(t.handoff_us) } else { "-".into() },
        if gpu { us(t.host_share_us) } else { "-".into() },
    );
}

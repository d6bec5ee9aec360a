//! Pipelines (issue 33): items whose buffers flow from one to the next, pushed without waiting and
//! resolved together. Read after write, write after read and write after write, within one domain
//! and across two (`pipe_a`, `pipe_b`: two manifolds on the GPU, ordered by waits on the GPU), on
//! every backend, against f64 references, with outputs poisoned before each run. A failing item
//! fails its pipeline with an error naming it; a pipeline dropped in flight still runs every item.

#[macro_use]
mod common;

use common::uniform;
use pptm::ops::{Axpby, Gemv, Square, SumReduction};
use pptm::{BackendKind, Error, FusionBuilder, Pipeline, Runtime, Table, Variant, op};

/// α x + β y, in domain `pipe_a`.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct BlendA {
    #[stage(1)]
    blend: Axpby,
}

/// α x + β y, in domain `pipe_b`.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_b")]
pub struct BlendB {
    #[stage(1)]
    blend: Axpby,
}

/// x², in domain `pipe_a`, every value checked to be finite.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct SquareA {
    #[stage(1, finite = true)]
    square: Square,
}

/// Σ x², in domain `pipe_b`.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_b")]
pub struct SumSquaresB {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// α x + β y, 170 times over (each time on what the time before produced), in one fused pass:
/// `repeat`, the build-time form of 170 dependent elementwise steps.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct Blend170A {
    #[stage(1, repeat = 170)]
    blend: Axpby,
}

/// y = A x, in domain `pipe_a`: every element of y reads the whole of x.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct GemvA {
    #[stage(1)]
    gemv: Gemv,
}

/// A build-time pipeline of six steps: x1 = a1 x + b1 c, x2 = a2 x1 + b2 c, y = A x2,
/// z = a3 y + b3 d, w = B z, Σ w². Steps 1-4 hand on their flow and fuse into one pass (the
/// blends compute the GEMV's vector where it is read, the last blend runs on each element of y),
/// so x1, x2 and y are never stored; the second GEMV reads the whole of z (a part of its own, in
/// the same domain), and the sum runs in another domain.
#[derive(Pipeline)]
pub struct BlendGemvSteps {
    #[step(1, args(y = "c", alpha = "a1", beta = "b1"))]
    x1: BlendA,
    #[step(2, args(x = "x1", y = "c", alpha = "a2", beta = "b2"))]
    x2: BlendA,
    #[step(3, args(x = "x2", a = "a"))]
    y: GemvA,
    #[step(4, args(x = "y", y = "d", alpha = "a3", beta = "b3"))]
    z: BlendA,
    #[step(5, args(x = "z", a = "b"))]
    w: GemvA,
    #[step(6, args(x = "w"))]
    total: SumSquaresB,
}

/// 170 dependent blends and Σ of the last squared, declared as steps: one part, one pass.
#[derive(Pipeline)]
pub struct Blend170Steps {
    #[step(1, repeat = 170)]
    blended: BlendA,
    #[step(2, args(x = "blended"))]
    total: SumSquaresB2,
}

/// Σ x², in domain `pipe_a` (so that it fuses with blends of that domain).
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct SumSquaresB2 {
    #[stage(1)]
    square: Square,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// Element `rows − 1 − idx` of a one-column table: any element of it, from any block.
#[op]
pub fn mirror(idx: f32, t: Table) -> f32 {
    t.at(t.rows() - 1 - idx as u32, 0) as f32
}

/// A buffer reversed, read as a table, in domain `pipe_a`.
#[derive(FusionBuilder)]
#[fusion(domain = "pipe_a")]
pub struct Reverse {
    #[stage(1)]
    mirror: Mirror,
}

const SIZES: [usize; 4] = [1, 7, 1023, (1 << 20) + 3];

/// Whether items run in plans on the GPU (the persistent manifolds), where a pipeline is one
/// round trip per domain and dispatch.
fn plans(rt: &Runtime) -> bool {
    rt.backend() == BackendKind::Gpu && rt.config().variant == Variant::Fused
}

fn blend(a: f32, x: &[f64], b: f32, y: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(y)
        .map(|(&x, &y)| f64::from(a) * x + f64::from(b) * y)
        .collect()
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn assert_vec_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}, element {i}: got {g}, f64 reference {w}"
        );
    }
}

/// A chain of dependent steps that alternates domains: u and v take turns as input and output
/// (read after write at every step, write after read and write after write every other step),
/// then a reduction in the other domain reads the last.
fn dependent_steps_across_domains(rt: &Runtime) {
    let what = rt.describe();
    for n in SIZES {
        let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
        let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut v = rt.upload(&vec![f32::NAN; n]).unwrap();
        const STEPS: usize = 24;
        let (mut want, wc) = (wide(&x), wide(&c));
        let total;
        {
            let mut p = rt.pipeline();
            let (x, c) = (p.input(&xb), p.input(&cb));
            let (uo, vo) = (p.output(&mut u), p.output(&mut v));
            // Step 0 reads x; step k reads what step k - 1 wrote.
            let mut from: pptm::PipeInput<'_> = x;
            for k in 0..STEPS {
                let to = if k % 2 == 0 { uo } else { vo };
                let (a, b) = (0.5f32, 0.25f32 + k as f32 / 64.0);
                if k % 3 == 0 {
                    BlendA::push(&mut p, from, c, a, b, to).unwrap();
                } else {
                    BlendB::push(&mut p, from, c, a, b, to).unwrap();
                }
                want = blend(a, &want, b, &wc);
                from = to.into();
            }
            total = SumSquaresB::push(&mut p, from).unwrap();
            assert_eq!(p.len(), STEPS + 1);
            let results = p.wait().unwrap();
            let got = results.get(total).unwrap();
            let sum: f64 = want.iter().map(|w| w * w).sum();
            assert!(
                (f64::from(got) - sum).abs() <= 1e-5 * sum.max(1e-30),
                "{what}: Σ of the last step squared, n = {n}: got {got}, f64 reference {sum}"
            );
        }
        // The last step wrote v (STEPS is even: steps 1, 3, ... write v).
        assert_vec_close(
            &v.to_vec().unwrap(),
            &want,
            &format!("{what}: last step, n = {n}"),
        );
    }
}

/// Write after read and write after write across domains, each made to fail if the later item
/// did not wait: a long item (Σ over 2^24 elements, or their squares stored) keeps the earlier
/// item's manifold busy, so a later item of the other domain that did not wait for it would run
/// first. WAR: `pipe_b` reads y, then `pipe_a` overwrites it; the reader must see the old values.
/// WAW: `pipe_a` writes y, then `pipe_b` overwrites it; y must end with the second values.
fn writes_wait_for_earlier_readers_and_writers(rt: &Runtime) {
    let what = rt.describe();
    let big = rt.upload(&uniform(1 << 24, -1.0, 1.0)).unwrap();
    let mut big_out = rt.upload(&vec![f32::NAN; 1 << 24]).unwrap();
    for n in SIZES {
        let (x, y0) = (uniform(n, -2.0, 2.0), uniform(n, -2.0, 2.0));
        let xb = rt.upload(&x).unwrap();
        let mut y = rt.upload(&y0).unwrap();
        let mut z = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut p = rt.pipeline();
        let (xi, gi) = (p.input(&xb), p.input(&big));
        let (yo, zo, go) = (p.output(&mut y), p.output(&mut z), p.output(&mut big_out));
        // WAR: pipe_b busy, then reads y; pipe_a, awake (an idle manifold polls slowly), then
        // writes y = 2x.
        BlendA::push(&mut p, xi, xi, 1.0, 0.0, zo).unwrap();
        SumSquaresB::push(&mut p, gi).unwrap();
        let old = SumSquaresB::push(&mut p, yo).unwrap();
        BlendA::push(&mut p, xi, xi, 1.0, 1.0, yo).unwrap();
        let mid = SumSquaresB::push(&mut p, yo).unwrap();
        // WAW: pipe_a busy, then writes y = 2x again; pipe_b then writes y = 3x.
        SquareA::push(&mut p, gi, go).unwrap();
        BlendA::push(&mut p, xi, xi, 1.0, 1.0, yo).unwrap();
        BlendB::push(&mut p, xi, xi, 3.0, 0.0, yo).unwrap();
        // RAW in its own domain after the cross-domain write: z = y - x = 2x.
        BlendA::push(&mut p, yo, xi, 1.0, -1.0, zo).unwrap();
        let r = p.wait().unwrap();
        let sq = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
        let (x64, y64) = (wide(&x), wide(&y0));
        for (got, want, which) in [
            (r.get(old).unwrap(), sq(&y64), "the read before the write"),
            (
                r.get(mid).unwrap(),
                sq(&blend(1.0, &x64, 1.0, &x64)),
                "the read after the first write",
            ),
        ] {
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * want.max(1e-30),
                "{what}: {which}, n = {n}: got {got}, f64 reference {want}"
            );
        }
        assert_vec_close(
            &y.to_vec().unwrap(),
            &blend(3.0, &x64, 0.0, &x64),
            &format!("{what}: y after the last write, n = {n}"),
        );
        assert_vec_close(
            &z.to_vec().unwrap(),
            &blend(2.0, &x64, 0.0, &x64),
            &format!("{what}: z, n = {n}"),
        );
    }
}

/// An item that reads a buffer as a table reads any element of it from any block, so it waits
/// for the whole of the item that wrote it (RAW), and a later writer waits for the whole of it
/// (WAR), even where both items spread the same elements over the same blocks.
fn table_reads_wait_for_whole_items(rt: &Runtime) {
    let what = rt.describe();
    for n in SIZES {
        let idx: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (u0, c) = (uniform(n, -2.0, 2.0), uniform(n, -2.0, 2.0));
        let (ib, cb) = (rt.upload(&idx).unwrap(), rt.upload(&c).unwrap());
        let mut u = rt.upload(&u0).unwrap();
        let mut v = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut w = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut p = rt.pipeline();
        let (ii, ci) = (p.input(&ib), p.input(&cb));
        let (uo, vo, wo) = (p.output(&mut u), p.output(&mut v), p.output(&mut w));
        Reverse::push(&mut p, ii, uo, vo, n, 1).unwrap(); // v = reversed u
        Reverse::push(&mut p, ii, ci, uo, n, 1).unwrap(); // u = reversed c, after v read u
        Reverse::push(&mut p, ii, vo, wo, n, 1).unwrap(); // w = reversed v = the first u
        p.wait().unwrap();
        let reversed = |x: &[f32]| x.iter().rev().copied().collect::<Vec<f32>>();
        assert_eq!(v.to_vec().unwrap(), reversed(&u0), "{what}: v, n = {n}");
        assert_eq!(u.to_vec().unwrap(), reversed(&c), "{what}: u, n = {n}");
        assert_eq!(w.to_vec().unwrap(), u0, "{what}: w, n = {n}");
    }
}

/// The first failing item fails the pipeline, named; every item still ran (what it wrote is
/// there), and the buffers are free again afterwards.
fn a_failing_item_fails_its_pipeline(rt: &Runtime) {
    let what = rt.describe();
    let n = 1023;
    let mut x = uniform(n, -1.0, 1.0);
    x[17] = f32::INFINITY;
    let xb = rt.upload(&x).unwrap();
    let mut y = rt.upload(&vec![f32::NAN; n]).unwrap();
    let mut z = rt.upload(&vec![f32::NAN; n]).unwrap();
    let mut p = rt.pipeline();
    let xi = p.input(&xb);
    let (yo, zo) = (p.output(&mut y), p.output(&mut z));
    BlendB::push(&mut p, xi, xi, 0.5, 0.25, yo).unwrap(); // 0.75 x: inf stays inf
    SquareA::push(&mut p, yo, zo).unwrap(); // inf² is not finite
    SumSquaresB::push(&mut p, zo).unwrap();
    match p.wait() {
        Err(Error::PipelineItem {
            item,
            chain,
            source,
        }) => {
            assert_eq!((item, chain), (1, "SquareA"), "{what}");
            assert!(
                matches!(*source, Error::NonFinite { .. }),
                "{what}: {source}"
            );
        }
        other => panic!("{what}: expected the second item to fail the pipeline, got {other:?}"),
    }
    // The failed item's outputs are written all the same.
    let z = z.to_vec().unwrap();
    let want = (0.75 * f64::from(x[0])).powi(2);
    assert!(z[17].is_infinite(), "{what}: z[17] = {}", z[17]);
    assert!(
        (f64::from(z[0]) - want).abs() <= 1e-6,
        "{what}: z[0] = {}, want {want}",
        z[0]
    );
}

/// Elementwise steps over many blocks that nothing waits for run without their blocks meeting
/// (light steps, on the GPU): a non-finite value in the last block's share still fails the item
/// that checks it, by name, the steps after it still run, and a kept run with finite inputs
/// afterwards reports no failure (a step's result starts afresh every run).
fn a_failing_light_step_on_many_blocks(rt: &Runtime) {
    let what = rt.describe();
    for n in [4099, 20_003] {
        let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let mut xb = rt.upload(&x).unwrap();
        let cb = rt.upload(&c).unwrap();
        let poisoned = || vec![f32::NAN; n];
        let (mut u, mut v) = (
            rt.upload(&poisoned()).unwrap(),
            rt.upload(&poisoned()).unwrap(),
        );
        let (mut w, mut z) = (
            rt.upload(&poisoned()).unwrap(),
            rt.upload(&poisoned()).unwrap(),
        );
        let mut p = rt.pipeline();
        let ci = p.input(&cb);
        let (xo, uo, vo) = (p.output(&mut xb), p.output(&mut u), p.output(&mut v));
        let (wo, zo) = (p.output(&mut w), p.output(&mut z));
        BlendA::push(&mut p, xo, ci, 0.5, 0.25, uo).unwrap();
        for _ in 0..3 {
            BlendA::push(&mut p, uo, ci, 0.5, 0.25, vo).unwrap();
            BlendA::push(&mut p, vo, ci, 0.5, 0.25, uo).unwrap();
        }
        SquareA::push(&mut p, uo, wo).unwrap(); // item 7: checks its values are finite
        BlendA::push(&mut p, wo, ci, 1.0, 1.0, zo).unwrap();
        let want = |x: &[f32]| {
            let wc = wide(&c);
            let mut wu = blend(0.5, &wide(x), 0.25, &wc);
            for _ in 0..3 {
                wu = blend(0.5, &blend(0.5, &wu, 0.25, &wc), 0.25, &wc);
            }
            let ww: Vec<f64> = wu.iter().map(|u| u * u).collect();
            let wz = blend(1.0, &ww, 1.0, &wc);
            (wu, ww, wz)
        };
        // Kept from a clean first run, then run with an infinity in the last element's share.
        let (_, mut kept) = p.wait_and_keep().unwrap();
        let mut bad = x.clone();
        bad[n - 2] = f32::INFINITY;
        for (run, input) in [(1, &bad), (2, &x)] {
            kept.buffer_mut(xo).unwrap().write(input).unwrap();
            for o in [uo, vo, wo, zo] {
                kept.buffer_mut(o).unwrap().write(&poisoned()).unwrap();
            }
            let got = kept.run();
            let read = |o| kept.buffer(o).unwrap().to_vec().unwrap();
            let (wu, ww, wz) = want(input);
            if run == 1 {
                match got {
                    Err(Error::PipelineItem {
                        item,
                        chain,
                        source,
                    }) => {
                        assert_eq!((item, chain), (7, "SquareA"), "{what}: n = {n}");
                        assert!(
                            matches!(*source, Error::NonFinite { .. }),
                            "{what}: n = {n}: {source}"
                        );
                    }
                    other => panic!(
                        "{what}: n = {n}: expected item 7 to fail the pipeline, got {other:?}"
                    ),
                }
                // Every item ran: the finite elements are right, the infinite one stays so.
                let (gu, gz) = (read(uo), read(zo));
                assert!(
                    gu[n - 2].is_infinite() && gz[n - 2].is_infinite(),
                    "{what}: n = {n}"
                );
                let finite = |v: &[f32], w: &[f64]| -> (Vec<f32>, Vec<f64>) {
                    v.iter()
                        .zip(w)
                        .enumerate()
                        .filter(|&(i, _)| i != n - 2)
                        .map(|(_, (a, b))| (*a, *b))
                        .unzip()
                };
                let (fu, wfu) = finite(&gu, &wu);
                assert_vec_close(&fu, &wfu, &format!("{what}: run {run}, u, n = {n}"));
                let (fz, wfz) = finite(&gz, &wz);
                assert_vec_close(&fz, &wfz, &format!("{what}: run {run}, z, n = {n}"));
            } else {
                got.unwrap_or_else(|e| {
                    panic!("{what}: n = {n}: a clean run after a failed one: {e}")
                });
                assert_vec_close(&read(uo), &wu, &format!("{what}: run {run}, u, n = {n}"));
                assert_vec_close(&read(wo), &ww, &format!("{what}: run {run}, w, n = {n}"));
                assert_vec_close(&read(zo), &wz, &format!("{what}: run {run}, z, n = {n}"));
            }
        }
    }
}

/// A pipeline dropped with items in flight runs them all before its buffers are free again.
fn a_dropped_pipeline_loses_nothing(rt: &Runtime) {
    let what = rt.describe();
    let n = (1 << 20) + 3;
    let x = uniform(n, -1.0, 1.0);
    let xb = rt.upload(&x).unwrap();
    let mut y = rt.upload(&vec![f32::NAN; n]).unwrap();
    let mut z = rt.upload(&vec![f32::NAN; n]).unwrap();
    {
        let mut p = rt.pipeline();
        let xi = p.input(&xb);
        let (yo, zo) = (p.output(&mut y), p.output(&mut z));
        for k in 0..8 {
            let (from, to) = if k % 2 == 0 { (yo, zo) } else { (zo, yo) };
            let src: pptm::PipeInput<'_> = if k == 0 { xi } else { from.into() };
            BlendA::push(&mut p, src, xi, 1.0, 1.0, to).unwrap();
        }
        // Dropped unwaited.
    }
    // Eight steps of y ← y + x from x: 9x, in y (the last step, k = 7, writes y).
    assert_vec_close(
        &y.to_vec().unwrap(),
        &x.iter().map(|&v| 9.0 * f64::from(v)).collect::<Vec<_>>(),
        &format!("{what}: after the drop"),
    );
}

/// Handles are checked: one of another pipeline, and an item that reads what it writes.
fn bad_handles_are_refused(rt: &Runtime) {
    let n = 7;
    let xb = rt.upload(&uniform(n, -1.0, 1.0)).unwrap();
    let mut y = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut y2 = rt.upload(&vec![0.0f32; n]).unwrap();
    let short = rt.upload(&[1.0f32; 3]).unwrap();
    let mut other = rt.pipeline();
    let foreign = other.output(&mut y2);
    let mut p = rt.pipeline();
    let xi = p.input(&xb);
    let yo = p.output(&mut y);
    let e = BlendA::push(&mut p, xi, xi, 1.0, 1.0, foreign).unwrap_err();
    assert!(e.to_string().contains("handle of another pipeline"), "{e}");
    let e = BlendA::push(&mut p, yo, xi, 1.0, 1.0, yo).unwrap_err();
    assert!(e.to_string().contains("reads the buffer it writes"), "{e}");
    assert!(p.is_empty());
    // Argument checks are submit's: a length that does not fit.
    let si = p.input(&short);
    let e = BlendA::push(&mut p, xi, si, 1.0, 1.0, yo).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    p.wait().unwrap();
    other.wait().unwrap();
}

/// Steps of many blocks that read all of what the step before wrote (a GEMV after an elementwise
/// pass over many blocks, an elementwise pass after a GEMV over many blocks) wait for the whole
/// step, not only their own tile; steps over the same elements on the same tiles do not.
fn whole_step_dependencies_between_blocks(rt: &Runtime) {
    let what = rt.describe();
    let k = 20_003; // three blocks' worth of elements
    for m in [1, 7, 1023] {
        let (x, c) = (uniform(k, -1.0, 1.0), uniform(k, -1.0, 1.0));
        let a = uniform(m * k, -1.0, 1.0);
        let d = uniform(m, -1.0, 1.0);
        let (xb, cb, ab, db) = (
            rt.upload(&x).unwrap(),
            rt.upload(&c).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&d).unwrap(),
        );
        let mut x1 = rt.upload(&vec![f32::NAN; k]).unwrap();
        let mut x2 = rt.upload(&vec![f32::NAN; k]).unwrap();
        let mut y = rt.upload(&vec![f32::NAN; m]).unwrap();
        let mut z = rt.upload(&vec![f32::NAN; m]).unwrap();
        let total = {
            let mut p = rt.pipeline();
            let (xi, ci, ai, di) = (p.input(&xb), p.input(&cb), p.input(&ab), p.input(&db));
            let (x1o, x2o, yo, zo) = (
                p.output(&mut x1),
                p.output(&mut x2),
                p.output(&mut y),
                p.output(&mut z),
            );
            BlendA::push(&mut p, xi, ci, 0.5, 0.25, x1o).unwrap();
            BlendA::push(&mut p, x1o, ci, 2.0, -0.5, x2o).unwrap(); // same tiles: no wait
            GemvA::push(&mut p, x2o, ai, yo).unwrap(); // all of x2
            BlendA::push(&mut p, yo, di, 1.0, 1.0, zo).unwrap(); // all of y's blocks
            let total = SumSquaresB::push(&mut p, zo).unwrap(); // another domain
            p.wait().unwrap().get(total).unwrap()
        };
        let x1w = blend(0.5, &wide(&x), 0.25, &wide(&c));
        let x2w = blend(2.0, &x1w, -0.5, &wide(&c));
        assert_vec_close(&x2.to_vec().unwrap(), &x2w, &format!("{what}: x2, m = {m}"));
        let yw: Vec<f64> = (0..m)
            .map(|i| (0..k).map(|j| f64::from(a[i * k + j]) * x2w[j]).sum())
            .collect();
        let scale: Vec<f64> = (0..m)
            .map(|i| {
                (0..k)
                    .map(|j| (f64::from(a[i * k + j]) * x2w[j]).abs())
                    .sum()
            })
            .collect();
        let yg = y.to_vec().unwrap();
        for i in 0..m {
            assert!(
                (f64::from(yg[i]) - yw[i]).abs() <= 1e-5 * scale[i] + 1e-6,
                "{what}: y[{i}] of {m}: got {}, f64 reference {}",
                yg[i],
                yw[i]
            );
        }
        let zg = z.to_vec().unwrap();
        let zw: Vec<f64> = (0..m).map(|i| f64::from(yg[i]) + f64::from(d[i])).collect();
        assert_vec_close(&zg, &zw, &format!("{what}: z, m = {m}"));
        let sum: f64 = zw.iter().map(|v| v * v).sum();
        assert!(
            (f64::from(total) - sum).abs() <= 1e-5 * sum.max(1e-30),
            "{what}: Σ z², m = {m}: got {total}, f64 reference {sum}"
        );
    }
}

/// A loop of 1000 iterations (2000 dependent items) runs as one round trip on the GPU and gives
/// what the CPU's 2000 items give.
fn a_thousand_iterations_on_the_device(rt: &Runtime) {
    let what = rt.describe();
    const ITERATIONS: u32 = 1000;
    for n in [1, 1023, (1 << 16) + 3] {
        let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
        let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut v = rt.upload(&x).unwrap();
        let results = {
            let mut p = rt.pipeline();
            let ci = p.input(&cb);
            let (uo, vo) = (p.output(&mut u), p.output(&mut v));
            let lp = p
                .repeat(ITERATIONS, |p| {
                    BlendA::push(p, vo, ci, 1.0, 0.001, uo)?;
                    BlendA::push(p, uo, ci, 1.0, 0.001, vo)?;
                    Ok(())
                })
                .unwrap();
            let r = p.wait().unwrap();
            assert_eq!(r.iterations(lp).unwrap(), ITERATIONS, "{what}");
            r
        };
        let expected_trips = if plans(rt) {
            1
        } else {
            2 * u64::from(ITERATIONS)
        };
        assert_eq!(
            results.round_trips(),
            expected_trips,
            "{what}: host round trips"
        );
        let _ = xb;
        // Each item adds 0.001 c: 2000 of them add 2 c. One iteration more or fewer is 0.002 c
        // away, which the tolerance (f32 rounding of 2000 additions) tells apart for most c.
        let want: Vec<f64> = x
            .iter()
            .zip(&c)
            .map(|(&x, &c)| f64::from(x) + 2.0 * f64::from(c))
            .collect();
        let got = v.to_vec().unwrap();
        let mut off = 0usize;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 2e-4 * (1.0 + w.abs());
            assert!(
                (f64::from(*g) - w).abs() <= tol,
                "{what}: n = {n}, v[{i}] = {g}, f64 reference {w}"
            );
            off += usize::from((f64::from(*g) - w).abs() > 1e-3);
        }
        assert_eq!(off, 0, "{what}");
    }
}

/// A loop that stops when a residual the device computes falls below a tolerance: halving x twice
/// an iteration, until Σ x² < tol; the iterations match the f64 count, and a cap is obeyed.
fn loops_stop_on_a_device_residual(rt: &Runtime) {
    let what = rt.describe();
    let n = 4099;
    let x = uniform(n, -1.0, 1.0);
    let s0: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum();
    // Σ x² falls 16× an iteration: below tol after 5, and not after 4.
    let tol = s0 / 16f64.powi(5) * 4.0;
    for (cap, want_iterations) in [(100u32, 5u32), (3, 3)] {
        let xb = rt.upload(&x).unwrap();
        let zero = rt.upload(&vec![0.0f32; n]).unwrap();
        let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut v = rt.upload(&x).unwrap();
        let r = {
            let mut p = rt.pipeline();
            let zi = p.input(&zero);
            let (uo, vo) = (p.output(&mut u), p.output(&mut v));
            let lp = p
                .repeat_until(cap, tol, |p| {
                    BlendB::push(p, vo, zi, 0.5, 0.0, uo)?;
                    BlendB::push(p, uo, zi, 0.5, 0.0, vo)?;
                    SumSquaresB::push(p, vo)
                })
                .unwrap();
            let r = p.wait().unwrap();
            r.iterations(lp).unwrap()
        };
        assert_eq!(r, want_iterations, "{what}: cap {cap}");
        let scale = 0.25f64.powi(want_iterations as i32);
        let want: Vec<f64> = x.iter().map(|&v| f64::from(v) * scale).collect();
        assert_vec_close(&v.to_vec().unwrap(), &want, &format!("{what}: cap {cap}"));
        let _ = xb;
    }
}

/// Loops are refused where they cannot run as asked: no iteration, an empty body, a loop inside
/// a loop, and (in plans) items of two domains in one loop.
fn bad_loops_are_refused(rt: &Runtime) {
    let n = 7;
    let xb = rt.upload(&uniform(n, -1.0, 1.0)).unwrap();
    let mut y = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut y2 = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut p = rt.pipeline();
    let xi = p.input(&xb);
    let (yo, y2o) = (p.output(&mut y), p.output(&mut y2));
    let e = p.repeat(0, |_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::PipelineLoop { .. }), "{e}");
    let e = p.repeat(3, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("no item"), "{e}");
    let e = p
        .repeat(3, |p| {
            p.repeat(2, |p| BlendA::push(p, xi, xi, 1.0, 1.0, yo).map(|_| ()))?;
            Ok(())
        })
        .unwrap_err();
    assert!(e.to_string().contains("inside a loop"), "{e}");
    let mixed = p.repeat(2, |p| {
        BlendA::push(p, xi, xi, 1.0, 1.0, yo)?;
        BlendB::push(p, yo, xi, 1.0, 1.0, y2o)?;
        Ok(())
    });
    if plans(rt) {
        let e = mixed.unwrap_err();
        assert!(e.to_string().contains("one domain"), "{e}");
    } else {
        mixed.unwrap();
    }
    drop(p);
}

/// A `when` runs its body only when the condition is met: u = v + c after Σ v² reaches the
/// threshold, u untouched (its sentinel stays) when it does not; the item after the body reads u
/// either way, and so does an item of another domain (on the GPU its plan waits for the body's
/// step, which a skip publishes). Kept, the pipeline decides anew at each run (v rewritten
/// between runs).
fn when_runs_its_body_only_when_met(rt: &Runtime) {
    let what = rt.describe();
    for n in SIZES {
        let (x, c) = (uniform(n, 0.5, 1.0), uniform(n, -1.0, 1.0));
        let s: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum();
        for (threshold, met) in [(0.5 * s, true), (2.0 * s, false)] {
            let cb = rt.upload(&c).unwrap();
            let mut v = rt.upload(&x).unwrap();
            let mut u = rt.upload(&vec![-7.0f32; n]).unwrap();
            let mut w = rt.upload(&vec![f32::NAN; n]).unwrap();
            let mut p = rt.pipeline();
            let ci = p.input(&cb);
            let (vo, uo, wo) = (p.output(&mut v), p.output(&mut u), p.output(&mut w));
            let total = SumSquaresB2::push(&mut p, vo).unwrap();
            let mut inner = None;
            let branch = p
                .when(total, threshold, |p| {
                    inner = Some(BlendA::push(p, vo, ci, 1.0, 1.0, uo)?);
                    Ok(())
                })
                .unwrap();
            let after = BlendA::push(&mut p, uo, ci, 1.0, 1.0, wo).unwrap();
            let across = SumSquaresB::push(&mut p, uo).unwrap();
            let (r, mut kept) = p.wait_and_keep().unwrap();
            let ctx = format!("{what}: n = {n}, met {met}");
            assert_eq!(r.runs(branch).unwrap(), u32::from(met), "{ctx}");
            match r.get(inner.unwrap()) {
                Ok(()) => assert!(met, "{ctx}: the body's item reports a result"),
                Err(Error::NotRun { item, .. }) => {
                    assert!(!met, "{ctx}");
                    assert_eq!(item, inner.unwrap().index(), "{ctx}");
                }
                Err(e) => panic!("{ctx}: {e}"),
            }
            r.get(after).unwrap();
            let u_total = |x: &[f32], met: bool| -> f64 {
                x.iter()
                    .zip(&c)
                    .map(|(&x, &c)| {
                        if met {
                            f64::from(x) + f64::from(c)
                        } else {
                            -7.0
                        }
                    })
                    .map(|u| u * u)
                    .sum()
            };
            let close = |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-4 * want.abs();
            let got = r.get(across).unwrap();
            assert!(close(got, u_total(&x, met)), "{ctx}: Σ u² in pipe_b: {got}");
            let check = |kept: &pptm::KeptPipeline<'_>, x: &[f32], met: bool, ctx: &str| {
                let u_want: Vec<f64> = x
                    .iter()
                    .zip(&c)
                    .map(|(&x, &c)| {
                        if met {
                            f64::from(x) + f64::from(c)
                        } else {
                            -7.0
                        }
                    })
                    .collect();
                let w_want: Vec<f64> = u_want
                    .iter()
                    .zip(&c)
                    .map(|(u, &c)| u + f64::from(c))
                    .collect();
                assert_vec_close(
                    &kept.buffer(uo).unwrap().to_vec().unwrap(),
                    &u_want,
                    &format!("{ctx}: u"),
                );
                assert_vec_close(
                    &kept.buffer(wo).unwrap().to_vec().unwrap(),
                    &w_want,
                    &format!("{ctx}: w"),
                );
            };
            check(&kept, &x, met, &ctx);
            // Again, with v scaled so that the condition flips; u and w poisoned first.
            let scale = if met { 0.25f32 } else { 4.0 };
            let x2: Vec<f32> = x.iter().map(|&v| v * scale).collect();
            kept.buffer_mut(vo).unwrap().write(&x2).unwrap();
            kept.buffer_mut(uo)
                .unwrap()
                .write(&vec![-7.0f32; n])
                .unwrap();
            kept.buffer_mut(wo)
                .unwrap()
                .write(&vec![f32::NAN; n])
                .unwrap();
            let r2 = kept.run().unwrap();
            let ctx = format!("{ctx}, run again with the condition flipped");
            assert_eq!(r2.runs(branch).unwrap(), u32::from(!met), "{ctx}");
            assert_eq!(r2.get(inner.unwrap()).is_ok(), !met, "{ctx}");
            let got = r2.get(across).unwrap();
            assert!(
                close(got, u_total(&x2, !met)),
                "{ctx}: Σ u² in pipe_b: {got}"
            );
            check(&kept, &x2, !met, &ctx);
        }
    }
}

/// A `when` inside a device-side loop decides at every iteration: a grows by c each iteration
/// and is reset to zero once Σ a² reaches 6.25 Σ c² (after every third growth), as a neighbour
/// list is rebuilt once atoms have moved far enough. The next iteration reads what the reset
/// left, or what the growth left when it was skipped.
fn when_inside_a_loop_decides_each_iteration(rt: &Runtime) {
    let what = rt.describe();
    const ITERATIONS: u32 = 10;
    for n in [7, 1023, (1 << 20) + 3] {
        let c = uniform(n, 0.5, 1.0);
        let sc: f64 = c.iter().map(|&v| f64::from(v).powi(2)).sum();
        let cb = rt.upload(&c).unwrap();
        let zeros = rt.upload(&vec![0.0f32; n]).unwrap();
        let mut a = rt.upload(&vec![0.0f32; n]).unwrap();
        let mut b = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut p = rt.pipeline();
        let (ci, zi) = (p.input(&cb), p.input(&zeros));
        let (ao, bo) = (p.output(&mut a), p.output(&mut b));
        let mut branch = None;
        let lp = p
            .repeat(ITERATIONS, |p| {
                BlendA::push(p, ao, ci, 1.0, 1.0, bo)?; // b = a + c
                BlendA::push(p, bo, zi, 1.0, 0.0, ao)?; // a = b
                let moved = SumSquaresB2::push(p, ao)?;
                branch = Some(p.when(moved, 6.25 * sc, |p| {
                    BlendA::push(p, zi, zi, 0.0, 0.0, ao).map(|_| ()) // a = 0
                })?);
                Ok(())
            })
            .unwrap();
        let r = p.wait().unwrap();
        let ctx = format!("{what}: n = {n}");
        assert_eq!(r.iterations(lp).unwrap(), ITERATIONS, "{ctx}");
        // The host's count: growth k since the last reset gives Σ a² = k² Σ c².
        let (mut k, mut resets) = (0u32, 0u32);
        for _ in 0..ITERATIONS {
            k += 1;
            if f64::from(k * k) >= 6.25 {
                k = 0;
                resets += 1;
            }
        }
        assert_eq!(r.runs(branch.unwrap()).unwrap(), resets, "{ctx}: resets");
        let want: Vec<f64> = c.iter().map(|&c| f64::from(k) * f64::from(c)).collect();
        assert_vec_close(&a.to_vec().unwrap(), &want, &format!("{ctx}: a"));
    }
}

/// A `when` is refused where it cannot run as asked, with a typed error, and the pipeline still
/// runs what it holds.
fn bad_whens_are_refused(rt: &Runtime) {
    let n = 7;
    let xb = rt.upload(&uniform(n, -1.0, 1.0)).unwrap();
    let mut y = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut y2 = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut other_out = rt.upload(&vec![0.0f32; n]).unwrap();
    let mut other = rt.pipeline();
    let oo = other.output(&mut other_out);
    let foreign = SumSquaresB2::push(&mut other, oo).unwrap();
    let mut p = rt.pipeline();
    let xi = p.input(&xb);
    let (yo, y2o) = (p.output(&mut y), p.output(&mut y2));
    let total = SumSquaresB2::push(&mut p, yo).unwrap();
    macro_rules! blend {
        () => {
            |p: &mut Pipeline<'_>| BlendA::push(p, xi, xi, 1.0, 1.0, y2o).map(|_| ())
        };
    }
    let refused = |e: Error, what: &str| {
        assert!(matches!(e, Error::PipelineWhen { .. }), "{what}: {e}");
        assert!(e.to_string().contains(what), "{what}: {e}");
    };
    refused(
        p.when(foreign, 0.0, blend!()).unwrap_err(),
        "another pipeline",
    );
    refused(p.when(total, f64::NAN, blend!()).unwrap_err(), "NaN");
    refused(p.when(total, 0.0, |_| Ok(())).unwrap_err(), "no item");
    refused(
        p.when(total, 0.0, |p| p.when(total, 0.0, blend!()).map(|_| ()))
            .unwrap_err(),
        "inside a `when`",
    );
    let e = p
        .when(total, 0.0, |p| p.repeat(2, blend!()).map(|_| ()))
        .unwrap_err();
    assert!(matches!(e, Error::PipelineLoop { .. }), "{e}");
    let mixed = p.when(total, 0.0, |p| {
        BlendB::push(p, xi, xi, 1.0, 1.0, y2o).map(|_| ())
    });
    if plans(rt) {
        refused(mixed.unwrap_err(), "condition's domain");
    } else {
        mixed.unwrap();
    }
    // What was refused left the pipeline whole: it runs what it holds.
    p.wait().unwrap();
    drop(other);
}

/// A kept pipeline runs again and again (resident plans on the GPU, its pushes again elsewhere):
/// a step in `pipe_b`, a dependent one in `pipe_a`, a loop in `pipe_a`, and a reduction in
/// `pipe_b` of what the loop left. Between runs the input is rewritten and the outputs poisoned
/// through the kept pipeline; each run matches f64 for its own input.
fn kept_pipelines_run_again(rt: &Runtime) {
    let what = rt.describe();
    const LOOPS: u32 = 3;
    for n in SIZES {
        let c = uniform(n, -1.0, 1.0);
        let cb = rt.upload(&c).unwrap();
        let mut xb = rt.upload(&uniform(n, -1.0, 1.0)).unwrap();
        let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut v = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut p = rt.pipeline();
        let ci = p.input(&cb);
        let (xo, uo, vo) = (p.output(&mut xb), p.output(&mut u), p.output(&mut v));
        BlendB::push(&mut p, xo, ci, 0.5, 0.25, vo).unwrap();
        BlendA::push(&mut p, vo, ci, 0.5, 0.25, uo).unwrap();
        let lp = p
            .repeat(LOOPS, |p| {
                BlendA::push(p, uo, ci, 0.5, 0.25, vo)?;
                BlendA::push(p, vo, ci, 0.5, 0.25, uo)?;
                Ok(())
            })
            .unwrap();
        let total = SumSquaresB::push(&mut p, uo).unwrap();
        let check = |r: &pptm::PipeResults, x: &[f32], u: &[f32], v: &[f32], run: usize| {
            let wc = wide(&c);
            let mut wv = blend(0.5, &wide(x), 0.25, &wc);
            let mut wu = blend(0.5, &wv, 0.25, &wc);
            for _ in 0..LOOPS {
                wv = blend(0.5, &wu, 0.25, &wc);
                wu = blend(0.5, &wv, 0.25, &wc);
            }
            let sum: f64 = wu.iter().map(|w| w * w).sum();
            let got = r.get(total).unwrap();
            assert!(
                (f64::from(got) - sum).abs() <= 1e-5 * sum.max(1e-30),
                "{what}: run {run}, n = {n}: Σ u² {got}, f64 reference {sum}"
            );
            assert_eq!(r.iterations(lp).unwrap(), LOOPS, "{what}: run {run}");
            assert_vec_close(u, &wu, &format!("{what}: run {run}, u, n = {n}"));
            assert_vec_close(v, &wv, &format!("{what}: run {run}, v, n = {n}"));
            // Two plans (one a domain) on the manifolds; every item, every iteration, elsewhere.
            let trips = if plans(rt) {
                2
            } else {
                3 + 2 * u64::from(LOOPS)
            };
            assert_eq!(
                r.round_trips(),
                trips,
                "{what}: run {run}: host round trips"
            );
        };
        let (first, mut kept) = p.wait_and_keep().unwrap();
        let read = |k: &pptm::KeptPipeline<'_>, o| k.buffer(o).unwrap().to_vec().unwrap();
        check(
            &first,
            &read(&kept, xo),
            &read(&kept, uo),
            &read(&kept, vo),
            0,
        );
        for run in 1..4 {
            let x = uniform(n, -1.0, 1.0);
            kept.buffer_mut(xo).unwrap().write(&x).unwrap();
            kept.buffer_mut(uo)
                .unwrap()
                .write(&vec![f32::NAN; n])
                .unwrap();
            kept.buffer_mut(vo)
                .unwrap()
                .write(&vec![f32::NAN; n])
                .unwrap();
            let r = kept.run().unwrap();
            check(&r, &x, &read(&kept, uo), &read(&kept, vo), run);
        }
        // A handle of another pipeline is refused.
        let mut w = rt.upload(&vec![0.0f32; n]).unwrap();
        let mut other = rt.pipeline();
        let wo = other.output(&mut w);
        assert!(matches!(kept.buffer(wo), Err(Error::BadArguments { .. })));
        drop(other);
    }
}

/// A pipeline flushed before cannot be kept where flushing dispatched plans (its later plans
/// would wait for a dispatch a run does not repeat): a typed error, and what it dispatched still
/// runs. Where items run at their push, a flush dispatches nothing and the pipeline is kept.
fn flushed_pipelines_are_not_kept(rt: &Runtime) {
    let n = 1023;
    let x = uniform(n, -1.0, 1.0);
    let xb = rt.upload(&x).unwrap();
    let mut y = rt.upload(&vec![f32::NAN; n]).unwrap();
    {
        let mut p = rt.pipeline();
        let (xi, yo) = (p.input(&xb), p.output(&mut y));
        BlendA::push(&mut p, xi, xi, 1.0, 1.0, yo).unwrap();
        p.flush().unwrap();
        match p.wait_and_keep() {
            Err(e) => {
                assert!(plans(rt), "{}: {e}", rt.describe());
                assert!(matches!(e, Error::BadArguments { .. }), "{e}");
                assert!(e.to_string().contains("flushed"), "{e}");
            }
            Ok((_, mut kept)) => {
                assert!(!plans(rt), "{}: a flushed pipeline was kept", rt.describe());
                kept.buffer_mut(yo)
                    .unwrap()
                    .write(&vec![f32::NAN; n])
                    .unwrap();
                kept.run().unwrap();
            }
        }
    }
    let want: Vec<f64> = wide(&x).iter().map(|x| 2.0 * x).collect();
    assert_vec_close(&y.to_vec().unwrap(), &want, &rt.describe());
}

/// A stage repeated at build time (`repeat = 170`) gives what 170 dependent items give: alone,
/// and as an item of a pipeline between two others, against f64, outputs poisoned.
fn repeated_stages_match_dependent_items(rt: &Runtime) {
    let what = rt.describe();
    for n in SIZES {
        let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
        let wc = wide(&c);
        let mut want = wide(&x);
        for _ in 0..170 {
            want = blend(0.5, &want, 0.25, &wc);
        }
        let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
        let submitted = Blend170A::submit(rt, &xb, &cb, 0.5, 0.25, &mut out);
        // The unfused-graph variant makes graphs of more than a few nodes only while no manifold
        // is resident (runtime/src/gpu/graphs.rs); beside this binary's manifolds a chain of 170
        // stages gets the typed error that says so.
        if rt.config().variant == Variant::UnfusedGraph
            && let Err(e @ Error::GraphUnavailable { stages: 170, .. }) = &submitted
        {
            eprintln!("{what}: {e}");
            return;
        }
        submitted.unwrap().wait().unwrap();
        assert_vec_close(
            &out.to_vec().unwrap(),
            &want,
            &format!("{what}: alone, n = {n}"),
        );

        // x → u (one step), u → v (170 fused), v → u (one step): 172 steps.
        let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut v = rt.upload(&vec![f32::NAN; n]).unwrap();
        {
            let mut p = rt.pipeline();
            let (xi, ci) = (p.input(&xb), p.input(&cb));
            let (uo, vo) = (p.output(&mut u), p.output(&mut v));
            BlendA::push(&mut p, xi, ci, 0.5, 0.25, uo).unwrap();
            Blend170A::push(&mut p, uo, ci, 0.5, 0.25, vo).unwrap();
            BlendA::push(&mut p, vo, ci, 0.5, 0.25, uo).unwrap();
            p.wait().unwrap();
        }
        let mut want = blend(0.5, &wide(&x), 0.25, &wc);
        for _ in 0..171 {
            want = blend(0.5, &want, 0.25, &wc);
        }
        assert_vec_close(
            &u.to_vec().unwrap(),
            &want,
            &format!("{what}: pipeline, n = {n}"),
        );
    }
}

/// The build-time pipelines above against f64, on fresh inputs with every output poisoned: the
/// parts they composed into, their results, and a kept run of them again with a fresh input.
fn build_time_pipelines(rt: &Runtime) {
    let what = rt.describe();
    assert_eq!(
        BlendGemvSteps::PARTS,
        "BlendGemvStepsPart1: x1 + x2 + y + z (Gemv: Axpby -> Axpby -> Gemv -> Axpby)\n\
         BlendGemvStepsPart2: w (Gemv: Gemv)\n\
         BlendGemvStepsPart3: total (Map: Square -> SumReduction)"
    );
    assert_eq!(
        Blend170Steps::PARTS,
        "Blend170StepsPart1: blended + total (Map: Axpby x 170 -> Square -> SumReduction)"
    );
    for (k, m) in [
        (1, 1),
        (7, 7),
        (1023, 1023),
        (20_003, 7),
        ((1 << 20) + 3, 1),
    ] {
        let (c, d) = (uniform(k, -1.0, 1.0), uniform(m, -1.0, 1.0));
        let (a, b) = (uniform(m * k, -1.0, 1.0), uniform(m * m, -1.0, 1.0));
        let (cb, db, ab, bb) = (
            rt.upload(&c).unwrap(),
            rt.upload(&d).unwrap(),
            rt.upload(&a).unwrap(),
            rt.upload(&b).unwrap(),
        );
        let mut xb = rt.upload(&uniform(k, -1.0, 1.0)).unwrap();
        let mut z = rt.upload(&vec![f32::NAN; m]).unwrap();
        let mut w = rt.upload(&vec![f32::NAN; m]).unwrap();
        let (a1, b1, a2, b2, a3, b3) = (0.5, 0.25, 2.0, -0.5, 1.0, 1.0);
        let mut p = rt.pipeline();
        let (ci, di, ai, bi) = (p.input(&cb), p.input(&db), p.input(&ab), p.input(&bb));
        let (xo, zo, wo) = (p.output(&mut xb), p.output(&mut z), p.output(&mut w));
        let items =
            BlendGemvSteps::push(&mut p, xo, ci, a1, b1, a2, b2, ai, di, a3, b3, zo, bi, wo)
                .unwrap();
        assert_eq!(p.len(), 3, "{what}: one item a part");
        let check = |r: &pptm::PipeResults, x: &[f32], zg: &[f32], wg: &[f32], run: u32| {
            let wc = wide(&c);
            let x2 = blend(a2, &blend(a1, &wide(x), b1, &wc), b2, &wc);
            let (y, ys) = gemv(&a, &x2, m, k);
            let zw = blend(a3, &y, b3, &wide(&d));
            // z's error: y's, which is bounded by the sum of its terms' magnitudes.
            for i in 0..m {
                assert!(
                    (f64::from(zg[i]) - zw[i]).abs() <= 1e-5 * ys[i] + 1e-5 * zw[i].abs() + 1e-6,
                    "{what}: run {run}, z[{i}] of {m} (k = {k}): got {}, f64 reference {}",
                    zg[i],
                    zw[i]
                );
            }
            // w and Σ w² from the z the device stored: the steps after a stored buffer.
            let (ww, wscale) = gemv(&b, &wide(zg), m, m);
            for i in 0..m {
                assert!(
                    (f64::from(wg[i]) - ww[i]).abs() <= 1e-5 * wscale[i] + 1e-6,
                    "{what}: run {run}, w[{i}] of {m}: got {}, f64 reference {}",
                    wg[i],
                    ww[i]
                );
            }
            let sum: f64 = ww.iter().map(|v| v * v).sum();
            let got = r.get(items.total).unwrap();
            assert!(
                (f64::from(got) - sum).abs() <= 1e-4 * sum.max(1e-30),
                "{what}: run {run}, Σ w², m = {m}: got {got}, f64 reference {sum}"
            );
        };
        let (first, mut kept) = p.wait_and_keep().unwrap();
        let read = |kp: &pptm::KeptPipeline<'_>, o| kp.buffer(o).unwrap().to_vec().unwrap();
        check(
            &first,
            &read(&kept, xo),
            &read(&kept, zo),
            &read(&kept, wo),
            0,
        );
        let x = uniform(k, -1.0, 1.0);
        kept.buffer_mut(xo).unwrap().write(&x).unwrap();
        kept.buffer_mut(zo)
            .unwrap()
            .write(&vec![f32::NAN; m])
            .unwrap();
        kept.buffer_mut(wo)
            .unwrap()
            .write(&vec![f32::NAN; m])
            .unwrap();
        let r = kept.run().unwrap();
        check(&r, &x, &read(&kept, zo), &read(&kept, wo), 1);
    }

    for n in SIZES {
        let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
        let mut p = rt.pipeline();
        let (xi, ci) = (p.input(&xb), p.input(&cb));
        // Launched variants run an item at its push, so an error may come there or at the wait.
        let got = match Blend170Steps::push(&mut p, xi, ci, 0.5, 0.25)
            .and_then(|items| p.wait()?.get(items.total))
        {
            Ok(v) => v,
            // The unfused-graph variant's documented refusal of long graphs beside a resident
            // manifold (see repeated_stages_match_dependent_items).
            Err(e @ Error::GraphUnavailable { .. })
                if rt.config().variant == Variant::UnfusedGraph =>
            {
                eprintln!("{what}: {e}");
                return;
            }
            Err(e) => panic!("{what}: n = {n}: {e}"),
        };
        let wc = wide(&c);
        let mut want = wide(&x);
        for _ in 0..170 {
            want = blend(0.5, &want, 0.25, &wc);
        }
        let sum: f64 = want.iter().map(|w| w * w).sum();
        assert!(
            (f64::from(got) - sum).abs() <= 1e-5 * sum.max(1e-30),
            "{what}: Σ after 170 steps, n = {n}: got {got}, f64 reference {sum}"
        );
    }
}

/// A x for row-major m × k A, in f64, and each row's Σ |terms| (the scale of its rounding).
fn gemv(a: &[f32], x: &[f64], m: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    (0..m)
        .map(|i| {
            let row = &a[i * k..(i + 1) * k];
            let terms = row.iter().zip(x).map(|(&a, &x)| f64::from(a) * x);
            (terms.clone().sum::<f64>(), terms.map(f64::abs).sum::<f64>())
        })
        .unzip()
}

/// Pipelines over two domains dispatched from many threads at once, half of them a then b and
/// half b then a: each batch's plans enter the queues whole, so no two wait for each other on the
/// device (interleaved, a's queue could hold one thread's plan before another's while b's held
/// them the other way round: each head waiting on a plan queued behind the other).
fn concurrent_pipelines_over_two_domains(rt: &Runtime) {
    let what = rt.describe();
    let n = 1023;
    let (x, c) = (uniform(n, -1.0, 1.0), uniform(n, -1.0, 1.0));
    let (xb, cb) = (rt.upload(&x).unwrap(), rt.upload(&c).unwrap());
    let want = blend(
        0.25,
        &blend(0.5, &wide(&x), 0.5, &wide(&c)),
        0.75,
        &wide(&c),
    );
    std::thread::scope(|s| {
        for t in 0..8 {
            let (xb, cb, want, what) = (&xb, &cb, &want, &what);
            s.spawn(move || {
                let mut u = rt.upload(&vec![f32::NAN; n]).unwrap();
                let mut v = rt.upload(&vec![f32::NAN; n]).unwrap();
                for round in 0..40 {
                    u.fill(f32::NAN).unwrap();
                    v.fill(f32::NAN).unwrap();
                    let mut p = rt.pipeline();
                    let (x, c) = (p.input(xb), p.input(cb));
                    let (uo, vo) = (p.output(&mut u), p.output(&mut v));
                    if t % 2 == 0 {
                        BlendA::push(&mut p, x, c, 0.5, 0.5, uo).unwrap();
                        BlendB::push(&mut p, uo, c, 0.25, 0.75, vo).unwrap();
                    } else {
                        BlendB::push(&mut p, x, c, 0.5, 0.5, uo).unwrap();
                        BlendA::push(&mut p, uo, c, 0.25, 0.75, vo).unwrap();
                    }
                    p.wait().unwrap();
                    assert_vec_close(
                        &v.to_vec().unwrap(),
                        want,
                        &format!("{what}: thread {t}, round {round}"),
                    );
                }
            });
        }
    });
}

on_every_backend!(
    when_runs_its_body_only_when_met,
    when_inside_a_loop_decides_each_iteration,
    bad_whens_are_refused,
    concurrent_pipelines_over_two_domains,
    build_time_pipelines,
    repeated_stages_match_dependent_items,
    kept_pipelines_run_again,
    flushed_pipelines_are_not_kept,
    whole_step_dependencies_between_blocks,
    a_thousand_iterations_on_the_device,
    loops_stop_on_a_device_residual,
    bad_loops_are_refused,
    dependent_steps_across_domains,
    writes_wait_for_earlier_readers_and_writers,
    table_reads_wait_for_whole_items,
    a_failing_item_fails_its_pipeline,
    a_failing_light_step_on_many_blocks,
    a_dropped_pipeline_loses_nothing,
    bad_handles_are_refused
);

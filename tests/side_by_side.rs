//! Independent items side by side (`Config::side_by_side`): eight threads submit items of one
//! block and of many (KL terms into poisoned outputs, KL sums) with several tickets in flight each,
//! while one thread also runs pipelines whose steps read what the previous step wrote (a plan runs
//! after every earlier item and before every later one). Every result is checked against f64.
//! One body on every backend: the CPU backend, and the GPU with side by side on and off.

mod common;

use common::{count_from_env, kl_term, open_gpu, positive, uniform};
use pptm::chains::{BeliefUpdateStep, KlComplexity, KlTerms};
use pptm::{Buffer, Config, Runtime};

/// One block (1, 7, 1023, 4096 elements) and many (2^20 + 3: 129 blocks, whose partials the last
/// block combines while other items use other blocks).
const SIZES: [usize; 5] = [1, 7, 1023, 4096, (1 << 20) + 3];
const THREADS: usize = 8;

fn check_terms(what: &str, got: &[f32], q: &[f32], p: &[f32]) {
    for (i, ((&g, &q), &p)) in got.iter().zip(q).zip(p).enumerate() {
        let want = kl_term(q, p);
        let err = (f64::from(g) - want).abs();
        assert!(
            err <= 1e-6 * want.abs().max(1e-6) + 1e-7,
            "{what}: element {i} of {} is {g}, f64 reference {want}",
            got.len()
        );
    }
}

fn check_sum(what: &str, got: f32, q: &[f32], p: &[f32]) {
    let (mut want, mut scale) = (0.0, 0.0);
    for (&q, &p) in q.iter().zip(p) {
        let t = kl_term(q, p);
        want += t;
        scale += t.abs();
    }
    let err = (f64::from(got) - want).abs() / scale.max(1e-30);
    assert!(
        err <= 1e-5,
        "{what}: Σ is {got}, f64 reference {want} ({err:.1e} of the terms' magnitude)"
    );
}

/// Items of every size at once from one thread, in a shuffled order, outputs poisoned.
fn independent_round(rt: &Runtime, what: &str) {
    let inputs: Vec<(Vec<f32>, Vec<f32>)> =
        SIZES.iter().map(|&n| (positive(n), positive(n))).collect();
    let bufs: Vec<(Buffer<f32>, Buffer<f32>)> = inputs
        .iter()
        .map(|(q, p)| (rt.upload(q).unwrap(), rt.upload(p).unwrap()))
        .collect();
    let mut outs: Vec<Buffer<f32>> = SIZES
        .iter()
        .map(|&n| rt.upload(&vec![f32::NAN; n]).unwrap())
        .collect();
    // A different order each round: sizes interleave differently on the blocks.
    let rotate = (uniform(1, 0.0, SIZES.len() as f32)[0] as usize).min(SIZES.len() - 1);
    let mut order: Vec<(usize, &mut Buffer<f32>)> = outs.iter_mut().enumerate().collect();
    order.rotate_left(rotate);
    let mut sums = Vec::new();
    let mut terms = Vec::new();
    for (i, out) in order {
        let (q, p) = &bufs[i];
        sums.push((i, KlComplexity::submit(rt, q, p).unwrap()));
        terms.push(KlTerms::submit(rt, q, p, out).unwrap());
        sums.push((i, KlComplexity::submit(rt, p, q).unwrap()));
    }
    for (k, (i, t)) in sums.into_iter().enumerate() {
        let (q, p) = &inputs[i];
        let got = t.wait().unwrap();
        let what = format!("{what}: KL sum, n = {}", SIZES[i]);
        if k % 2 == 0 {
            check_sum(&what, got, q, p);
        } else {
            check_sum(&what, got, p, q);
        }
    }
    for t in terms {
        t.wait().unwrap();
    }
    for (i, out) in outs.iter().enumerate() {
        let (q, p) = &inputs[i];
        check_terms(
            &format!("{what}: KL terms, n = {}", SIZES[i]),
            &out.to_vec().unwrap(),
            q,
            p,
        );
    }
}

/// Two belief updates, the second reading what the first wrote, as one pipeline.
fn pipelined_round(rt: &Runtime, what: &str) {
    for (m, n) in [(33, 1023), (7, 4099)] {
        let (obs, pred, prec) = (uniform(m, -1.0, 1.0), uniform(m, -1.0, 1.0), positive(m));
        let (jac, mu) = (uniform(m * n, -1.0, 1.0), uniform(n, -1.0, 1.0));
        let lr = 0.125f32;
        let up = |v: &Vec<f32>| rt.upload(v).unwrap();
        let (ob, pb, wb, jb, mb) = (up(&obs), up(&pred), up(&prec), up(&jac), up(&mu));
        let mut once = rt.upload(&vec![f32::NAN; n]).unwrap();
        let mut twice = rt.upload(&vec![f32::NAN; n]).unwrap();
        {
            let mut p = rt.pipeline();
            let (o, pr, w, j, mu0) = (
                p.input(&ob),
                p.input(&pb),
                p.input(&wb),
                p.input(&jb),
                p.input(&mb),
            );
            let (a, b) = (p.output(&mut once), p.output(&mut twice));
            BeliefUpdateStep::push(&mut p, o, pr, w, j, mu0, lr, a).unwrap();
            BeliefUpdateStep::push(&mut p, o, pr, w, j, a, lr, b).unwrap();
            p.wait().unwrap();
        }
        let got = twice.to_vec().unwrap();
        for c in 0..n {
            let (mut g, mut scale) = (0.0f64, 0.0f64);
            for i in 0..m {
                let e = f64::from(prec[i]) * (f64::from(obs[i]) - f64::from(pred[i]));
                g += f64::from(jac[i * n + c]) * e;
                scale += (f64::from(jac[i * n + c]) * e).abs();
            }
            let want = f64::from(mu[c]) + 2.0 * f64::from(lr) * g;
            let tol = 1e-5 * (f64::from(mu[c]).abs() + 2.0 * f64::from(lr) * scale);
            assert!(
                (f64::from(got[c]) - want).abs() <= tol,
                "{what}: pipelined belief update, m = {m}, n = {n}: output {c} is {}, f64 \
                 reference {want}",
                got[c]
            );
        }
    }
}

fn body(rt: &Runtime) {
    let what = rt.describe();
    let rounds = count_from_env("PPTM_SIDE_BY_SIDE_ROUNDS", 4);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let what = format!("{what}, thread {t}");
            s.spawn(move || {
                for _ in 0..rounds {
                    independent_round(rt, &what);
                    if t == 0 {
                        pipelined_round(rt, &what);
                    }
                }
            });
        }
    });
}

#[test]
fn cpu_items_from_many_threads_each_match_f64() {
    body(&Runtime::cpu());
}

/// Side by side, then in order (one runtime at a time: each takes the whole GPU).
#[test]
fn gpu_items_side_by_side_and_in_order_each_match_f64() {
    for side_by_side in [true, false] {
        let Some(rt) = open_gpu(
            "side_by_side::gpu_items_side_by_side_and_in_order_each_match_f64",
            Config {
                side_by_side,
                ..Config::default()
            },
        ) else {
            return;
        };
        eprintln!("side_by_side = {side_by_side}: {}", rt.describe());
        body(&rt);
    }
}

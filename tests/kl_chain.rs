//! KlComplexity and KlTerms on every backend, against an f64 reference.

#[macro_use]
mod common;

use common::{
    REL_TOL, assert_close, assert_kl_sum_close, kl_reference, kl_term, positive, rel_err,
    sprinkle_zeros,
};
use pptm::Runtime;
use pptm::chains::{KlComplexity, KlTerms};

const SIZES: &[usize] = &[1, 7, 4096, (1 << 20) + 3, 1 << 26];

fn kl_complexity_matches_f64_reference(rt: &Runtime) {
    for &n in SIZES {
        let mut q = positive(n);
        let p = positive(n);
        sprinkle_zeros(&mut q, 16);
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let got = KlComplexity::submit(rt, &qb, &pb).unwrap().wait().unwrap();
        assert_kl_sum_close(got, &q, &p, format_args!("n = {n}"));
    }
}

fn kl_complexity_of_normalised_distributions(rt: &Runtime) {
    // Nonnegative, sums to about 0.2: a real KL divergence, with cancellation between terms.
    for &n in &[5usize, 1000, 4097, 1 << 20] {
        let norm = |v: Vec<f32>| {
            let s: f32 = v.iter().sum();
            v.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let q = norm(positive(n));
        let p = norm(positive(n));
        let want = kl_reference(&q, &p);
        let got = KlComplexity::submit(rt, &rt.upload(&q).unwrap(), &rt.upload(&p).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        assert_close(got, want, format_args!("n = {n}"));
    }
}

fn zero_q_contributes_zero(rt: &Runtime) {
    // 0 ln 0 = 0, also where p = 0 (0 ln(0/0) = 0).
    let q = vec![0.0f32; 1000];
    let p: Vec<f32> = (0..1000)
        .map(|i| if i % 2 == 0 { 0.0 } else { 0.5 })
        .collect();
    let got = KlComplexity::submit(rt, &rt.upload(&q).unwrap(), &rt.upload(&p).unwrap())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got, 0.0);
    // An empty chain sums to 0.
    let e = rt.upload::<f32>(&[]).unwrap();
    assert_eq!(
        KlComplexity::submit(rt, &e, &e).unwrap().wait().unwrap(),
        0.0
    );
    // q > 0 = p: +inf, as the definition says.
    let got = KlComplexity::submit(
        rt,
        &rt.upload(&[0.5f32, 0.5]).unwrap(),
        &rt.upload(&[0.0f32, 0.5]).unwrap(),
    )
    .unwrap()
    .wait()
    .unwrap();
    assert_eq!(got, f32::INFINITY);
}

fn kl_terms_writes_every_element(rt: &Runtime) {
    for &n in &[1usize, 7, 1023, 4096, (1 << 20) + 3] {
        let mut q = positive(n);
        let p = positive(n);
        sprinkle_zeros(&mut q, 8);
        let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
        let mut out = rt.alloc::<f32>(n).unwrap();
        out.fill(f32::NAN).unwrap(); // poison: an unwritten element shows as NaN
        KlTerms::submit(rt, &qb, &pb, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            let want = kl_term(q[i], p[i]);
            let g = f64::from(got[i]);
            let tol = REL_TOL * want.abs().max(f64::from(q[i])).max(1e-30);
            assert!(
                (g - want).abs() <= tol,
                "n = {n}, element {i}: got {g}, want {want} (q {}, p {})",
                q[i],
                p[i]
            );
        }
    }
}

/// KL of nearly equal distributions, where terms of both signs cancel: single terms with q a few
/// percent or less from p, each within REL_TOL of its own value (the device computes ln(q / p)
/// whole, with the division's remainder added back), and two distributions 1 % apart whose KL
/// (about 2e-5) is a sum of terms about 300 times larger. A sum is held to REL_TOL plus 2^-21 (four
/// f32 ulps) of each term's magnitude: at n = 7 the terms' rounding alone is about 1e-5 of the sum
/// (seen: 1.09e-5 on an H200, 0.4 ulp of the terms), while a device that took ln q - ln p apart
/// (an error of about q 2^-23 |ln q| a term) would be some fifty times over. (Removed in 3b6b262;
/// restored.)
fn kl_of_nearly_equal_distributions(rt: &Runtime) {
    for &delta in &[0.1f32, 0.03, 0.01, 1e-3, 1e-4, -1e-3, -0.03, -0.2] {
        for &p in &[0.5f32, 0.03, 0.9] {
            let q = p * (1.0 + delta);
            let got =
                KlComplexity::submit(rt, &rt.upload(&[q]).unwrap(), &rt.upload(&[p]).unwrap())
                    .unwrap()
                    .wait()
                    .unwrap();
            assert_close(got, kl_term(q, p), format_args!("q = {q}, p = {p}"));
        }
    }
    let norm = |v: Vec<f32>| {
        let s: f64 = v.iter().map(|&x| f64::from(x)).sum();
        v.into_iter()
            .map(|x| (f64::from(x) / s) as f32)
            .collect::<Vec<_>>()
    };
    for &n in &[7usize, 4097, (1 << 20) + 3] {
        let p = norm(positive(n));
        let wobble = positive(n);
        let q = norm(
            p.iter()
                .zip(&wobble)
                .map(|(&p, &w)| p * (1.0 + 0.02 * (w - 0.5)))
                .collect(),
        );
        let want = kl_reference(&q, &p);
        let got = KlComplexity::submit(rt, &rt.upload(&q).unwrap(), &rt.upload(&p).unwrap())
            .unwrap()
            .wait()
            .unwrap();
        let magnitude: f64 = q.iter().zip(&p).map(|(&q, &p)| kl_term(q, p).abs()).sum();
        let err = (f64::from(got) - want).abs();
        let bar = REL_TOL * want.abs() + 2f64.powi(-21) * magnitude;
        assert!(
            err <= bar,
            "n = {n}, q within 1% of p: got {got}, f64 reference {want}, error {err:e} (allowed \
             {bar:e}: REL_TOL of it plus 2^-21 of the terms' magnitude {magnitude:e})"
        );
    }
}

/// q within a factor (1 ± ε) of p, ε from 1e-7 to 0.5 and a few ulps: each term, and a one-term
/// KlComplexity, within REL_TOL of itself. ln q − ln p cancels there; the device takes ln(q / p)
/// whole (kernels/pptm/ops/divergence.cuh). A term with q / p = 1.0005 was 2e-5 off before.
fn kl_terms_of_nearly_equal_q_and_p(rt: &Runtime) {
    use rand::Rng;
    let mut rng = common::rng();
    let n = 4099;
    let p: Vec<f32> = (0..n).map(|_| rng.random_range(1e-6f32..2.0)).collect();
    let q: Vec<f32> = p
        .iter()
        .enumerate()
        .map(|(i, &p)| match i % 4 {
            // A few ulps away (or equal).
            0 => f32::from_bits(p.to_bits().wrapping_add_signed(rng.random_range(-3..=3))),
            // Relative gaps spread over seven decades, both signs.
            _ => {
                let eps = 10f32.powf(rng.random_range(-7.0f32..-0.3));
                let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                p * (1.0 + sign * eps)
            }
        })
        .collect();
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    let mut out = rt.alloc::<f32>(n).unwrap();
    out.fill(f32::NAN).unwrap(); // poison: an unwritten element shows as NaN
    KlTerms::submit(rt, &qb, &pb, &mut out)
        .unwrap()
        .wait()
        .unwrap();
    let got = out.to_vec().unwrap();
    for i in 0..n {
        let want = kl_term(q[i], p[i]);
        let err = rel_err(f64::from(got[i]), want);
        assert!(
            err < REL_TOL,
            "element {i}: got {}, want {want} (q {:e}, p {:e}, q / p - 1 = {:e}): relative error {err:e}",
            got[i],
            q[i],
            p[i],
            f64::from(q[i]) / f64::from(p[i]) - 1.0
        );
    }
    // One-term items: the reduction path with the same terms.
    for i in (0..n).step_by(97) {
        let (q1, p1) = (rt.upload(&q[i..=i]).unwrap(), rt.upload(&p[i..=i]).unwrap());
        let got = KlComplexity::submit(rt, &q1, &p1).unwrap().wait().unwrap();
        assert_close(
            got,
            kl_term(q[i], p[i]),
            format_args!("n = 1, q {:e}, p {:e}", q[i], p[i]),
        );
    }
}

fn kl_terms_on_unaligned_lengths_and_reused_buffers(rt: &Runtime) {
    // The same buffers, rewritten between items: every item must see its own inputs.
    let n = 4099;
    let mut qb = rt.alloc::<f32>(n).unwrap();
    let mut pb = rt.alloc::<f32>(n).unwrap();
    let mut out = rt.alloc::<f32>(n).unwrap();
    for _ in 0..5 {
        let (q, p) = (positive(n), positive(n));
        qb.write(&q).unwrap();
        pb.write(&p).unwrap();
        out.fill(f32::NAN).unwrap();
        KlTerms::submit(rt, &qb, &pb, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        let sum: f64 = out.to_vec().unwrap().iter().map(|&x| f64::from(x)).sum();
        let want = kl_reference(&q, &p);
        assert!(
            rel_err(sum, want) < REL_TOL,
            "sum of terms {sum}, want {want}"
        );
        let total = KlComplexity::submit(rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(total, want, "KlComplexity on reused buffers");
    }
}

/// Items of very different widths in flight together (one block, a few, every block): blocks an
/// item does not need skip it, and every result is still its own.
fn narrow_and_wide_items_interleave(rt: &Runtime) {
    let sizes = [5usize, 100_000, 1, (1 << 20) + 3, 8192, 8193, 3, 1 << 18];
    let inputs: Vec<_> = sizes
        .iter()
        .map(|&n| {
            let (q, p) = (positive(n), positive(n));
            let want = kl_reference(&q, &p);
            (rt.upload(&q).unwrap(), rt.upload(&p).unwrap(), want, q, p)
        })
        .collect();
    let mut out = rt.alloc::<f32>(sizes[3]).unwrap();
    for round in 0..50 {
        out.fill(f32::NAN).unwrap();
        let tickets: Vec<_> = inputs
            .iter()
            .map(|(q, p, ..)| KlComplexity::submit(rt, q, p).unwrap())
            .collect();
        // A vector item in the middle of the stream, too.
        let (q3, p3, want3, ..) = &inputs[3];
        KlTerms::submit(rt, q3, p3, &mut out)
            .unwrap()
            .wait()
            .unwrap();
        for (i, (t, (.., q, p))) in tickets.into_iter().zip(&inputs).enumerate() {
            assert_kl_sum_close(
                t.wait().unwrap(),
                q,
                p,
                format_args!("round {round}, item {i} (n = {})", sizes[i]),
            );
        }
        let sum: f64 = out.to_vec().unwrap().iter().map(|&x| f64::from(x)).sum();
        assert!(
            rel_err(sum, *want3) < REL_TOL,
            "round {round}: KlTerms sum {sum}, want {want3}"
        );
    }
}

on_every_backend!(
    narrow_and_wide_items_interleave,
    kl_complexity_matches_f64_reference,
    kl_complexity_of_normalised_distributions,
    kl_of_nearly_equal_distributions,
    zero_q_contributes_zero,
    kl_terms_writes_every_element,
    kl_terms_of_nearly_equal_q_and_p,
    kl_terms_on_unaligned_lengths_and_reused_buffers,
);

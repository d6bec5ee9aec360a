//! Three domains resident at once on one GPU, sharing its SMs, with submissions routed to each
//! domain's manifold and interleaved; results checked against f64 references written
//! in tests/common, independent of the op catalog (so the `cpu::` copy checks the CPU backend too).

#[macro_use]
mod common;

use pptm::chains::{DistanceKth, GemvAxpbySum, KlComplexity};
use pptm::{BackendKind, Chain, Config, Error, Runtime, Variant};

fn three_domains_share_the_gpu(rt: &Runtime) {
    rt.prepare_domains(&[
        KlComplexity::DOMAIN,
        DistanceKth::DOMAIN,
        GemvAxpbySum::DOMAIN,
    ])
    .unwrap();
    let persistent = rt.backend() == BackendKind::Gpu && rt.config().variant == Variant::Fused;
    if persistent {
        let d = rt.describe();
        for domain in ["inference", "transfer_entropy", "linear_algebra"] {
            assert!(d.contains(domain), "{d}");
        }
        // An equal split: each manifold has a third of the SMs' worth of compute blocks.
        let blocks = [
            rt.manifold_blocks::<KlComplexity>().unwrap(),
            rt.manifold_blocks::<DistanceKth>().unwrap(),
            rt.manifold_blocks::<GemvAxpbySum>().unwrap(),
        ];
        assert!(blocks.iter().all(|&b| b == blocks[0]), "{blocks:?}");
    }
    for round in 0..20usize {
        let n = 1000 + 37 * round;
        let (q, p) = (common::positive(n), common::positive(n));
        let x: Vec<f32> = common::positive(n * 3);
        let (m, k) = (64 + round, 96);
        let a = common::positive(m * k);
        let (v, y) = (common::positive(k), common::positive(m));
        let want_kth = &common::kth_reference(&x, n, 3, &[3])[0];

        // All three in flight at once, one per domain.
        let (qb, pb, xb) = (
            rt.upload(&q).unwrap(),
            rt.upload(&p).unwrap(),
            rt.upload(&x).unwrap(),
        );
        let (ab, vb, yb) = (
            rt.upload(&a).unwrap(),
            rt.upload(&v).unwrap(),
            rt.upload(&y).unwrap(),
        );
        let mut kth = rt.upload(&vec![f32::NAN; n]).unwrap();
        let t_kl = KlComplexity::submit(rt, &qb, &pb).unwrap();
        let t_kth = DistanceKth::submit(rt, &xb, 3, &mut kth, 3).unwrap();
        let t_sum = GemvAxpbySum::submit(rt, &vb, &ab, &yb, 0.5, -2.0).unwrap();
        let got_sum = t_sum.wait().unwrap();
        t_kth.wait().unwrap();
        let got_kl = t_kl.wait().unwrap();
        common::assert_kl_sum_close(got_kl, &q, &p, format_args!("KL round {round}"));
        common::assert_gemv_axpby_sum_close(
            got_sum,
            (&v, &a, &y),
            (0.5, -2.0),
            1e-4,
            format_args!("gemv_axpby_sum round {round}"),
        );
        // Distances are exact f32 values on both sides: equal, not just close.
        let got_kth: Vec<f64> = kth.to_vec().unwrap().into_iter().map(f64::from).collect();
        assert_eq!(&got_kth, want_kth, "DistanceKth round {round}");
    }

    if persistent {
        // Shares that cannot all be resident are a typed error, and nothing is launched.
        let greedy = Runtime::gpu_with(Config {
            domain_sms: vec![("inference".into(), 132), ("transfer_entropy".into(), 132)],
            ..Config::default()
        })
        .unwrap();
        assert!(matches!(
            greedy.prepare_domains(&[KlComplexity::DOMAIN, DistanceKth::DOMAIN]),
            Err(Error::Config(_))
        ));
        assert_eq!(greedy.manifold_blocks::<KlComplexity>(), None);
    }
}

on_every_backend!(three_domains_share_the_gpu);

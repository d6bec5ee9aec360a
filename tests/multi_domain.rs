//! Three domains resident at once on one GPU, sharing its SMs, with submissions routed to each
//! domain's manifold and interleaved; results checked against the CPU backend.

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
    let cpu = Runtime::cpu();
    for round in 0..20usize {
        let n = 1000 + 37 * round;
        let (q, p) = (common::positive(n), common::positive(n));
        let x: Vec<f32> = common::positive(n * 3);
        let (m, k) = (64 + round, 96);
        let a = common::positive(m * k);
        let (v, y) = (common::positive(k), common::positive(m));
        let want_kl =
            KlComplexity::submit(&cpu, &cpu.upload(&q).unwrap(), &cpu.upload(&p).unwrap())
                .unwrap()
                .wait()
                .unwrap();
        let mut want_kth = cpu.alloc::<f32>(n).unwrap();
        DistanceKth::submit(&cpu, &cpu.upload(&x).unwrap(), 3, &mut want_kth, 3)
            .unwrap()
            .wait()
            .unwrap();
        let want_sum = GemvAxpbySum::submit(
            &cpu,
            &cpu.upload(&v).unwrap(),
            &cpu.upload(&a).unwrap(),
            &cpu.upload(&y).unwrap(),
            0.5,
            -2.0,
        )
        .unwrap()
        .wait()
        .unwrap();

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
        common::assert_close(got_kl, f64::from(want_kl), format!("KL round {round}"));
        let err = common::rel_err(f64::from(got_sum), f64::from(want_sum));
        assert!(
            err < 1e-4,
            "round {round}: gemv_axpby_sum {got_sum} vs {want_sum}"
        );
        assert_eq!(
            kth.to_vec().unwrap(),
            want_kth.to_vec().unwrap(),
            "round {round}"
        );
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

//! The runtime's API on every backend: tickets, bad input, no-ops, sustained submission.

#[macro_use]
mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::{assert_close, kl_reference, positive};
use pptm::chains::{KlComplexity, KlTerms};
use pptm::{Arg, BackendKind, Error, Runtime};

fn tickets_resolve_once(rt: &Runtime) {
    let (q, p) = (positive(100), positive(100));
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    let mut t = KlComplexity::submit(rt, &qb, &pb).unwrap();
    let v = t.wait_timeout(Duration::from_secs(10)).unwrap();
    assert_close(v, kl_reference(&q, &p), "wait_timeout");
    assert!(t.is_ready());
    assert!(matches!(
        t.wait_timeout(Duration::from_secs(1)),
        Err(Error::TicketConsumed)
    ));
    assert!(matches!(t.wait(), Err(Error::TicketConsumed)));
    // Only the persistent manifold queues items (a sequence number); the CPU backend and the
    // fused-launched variant finish them at submission.
    assert_eq!(
        rt.backend() == BackendKind::Gpu && rt.config().variant == pptm::Variant::Fused,
        KlComplexity::submit(rt, &qb, &pb).unwrap().seq().is_some()
    );
}

fn noop_round_trips(rt: &Runtime) {
    for _ in 0..1000 {
        rt.submit_noop::<KlComplexity>().unwrap().wait().unwrap();
    }
}

fn bad_input_is_a_typed_error(rt: &Runtime) {
    let q = rt.upload(&positive(10)).unwrap();
    let p = rt.upload(&positive(11)).unwrap();
    match KlComplexity::submit(rt, &q, &p) {
        Err(Error::LengthMismatch {
            arg: "p",
            expected: 10,
            got: 11,
            rule,
            ..
        }) if rule.contains("`q`") => {}
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
    let mut out = rt.alloc::<f32>(9).unwrap();
    assert!(matches!(
        KlTerms::submit(rt, &q, &q, &mut out),
        Err(Error::LengthMismatch { arg: "out", .. })
    ));

    // A buffer of another runtime.
    let other = Runtime::cpu();
    let foreign = other.upload(&positive(10)).unwrap();
    assert!(matches!(
        KlComplexity::submit(rt, &q, &foreign),
        Err(Error::ForeignBuffer { arg: "p", .. })
    ));

    // Host slices of the wrong length.
    let mut short = vec![0.0f32; 9];
    assert!(matches!(
        q.read_into(&mut short),
        Err(Error::SliceLength {
            buffer: 10,
            slice: 9
        })
    ));
    let mut qm = rt.upload(&positive(10)).unwrap();
    assert!(matches!(
        qm.write(&[1.0; 3]),
        Err(Error::SliceLength {
            buffer: 10,
            slice: 3
        })
    ));
    // Writes into part of a buffer: in range they change only their elements; past the end
    // (or at an offset whose sum overflows) they are typed errors that change nothing.
    let before = qm.to_vec().unwrap();
    assert!(matches!(
        qm.write_at(8, &[1.0; 3]),
        Err(Error::WriteOutOfRange {
            buffer: 10,
            offset: 8,
            len: 3
        })
    ));
    assert!(matches!(
        qm.write_at(usize::MAX, &[1.0; 2]),
        Err(Error::WriteOutOfRange { .. })
    ));
    assert_eq!(qm.to_vec().unwrap(), before);
    let part = positive(3);
    qm.write_at(7, &part).unwrap();
    qm.write_at(10, &[]).unwrap();
    qm.write_at(0, &part[..1]).unwrap();
    let mut want = before.clone();
    want[7..].copy_from_slice(&part);
    want[0] = part[0];
    assert_eq!(qm.to_vec().unwrap(), want);

    // Hand-made argument lists (what the generated submit never gets wrong).
    assert!(matches!(
        rt.submit_chain::<KlComplexity>(vec![Arg::Input("q", (&q).into())]),
        Err(Error::BadArguments { .. })
    ));
    assert!(matches!(
        rt.submit_chain::<KlComplexity>(vec![
            Arg::Input("p", (&q).into()),
            Arg::Input("q", (&q).into())
        ]),
        Err(Error::BadArguments { .. })
    ));
    assert!(matches!(
        rt.submit_chain::<KlComplexity>(vec![
            Arg::Input("q", (&q).into()),
            Arg::Output("p", &mut out)
        ]),
        Err(Error::BadArguments { .. })
    ));
    // Oversized allocations are errors too.
    assert!(matches!(
        rt.alloc::<f64>(usize::MAX / 4),
        Err(Error::TooLarge { .. })
    ));
}

/// 100 000 back-to-back submissions, up to 192 in flight, each checked against its own reference.
fn many_submissions_complete_exactly_once(rt: &Runtime) {
    let items = common::count_from_env("PPTM_RUNTIME_API_ITEMS", 100_000);
    const INPUTS: usize = 16;
    let inputs: Vec<_> = (0..INPUTS)
        .map(|i| {
            let n = 64 + 37 * i;
            let (q, p) = (positive(n), positive(n));
            let want = kl_reference(&q, &p);
            (rt.upload(&q).unwrap(), rt.upload(&p).unwrap(), want)
        })
        .collect();
    let mut pending = VecDeque::new();
    let mut completed = 0usize;
    let mut check = |(i, t): (usize, pptm::Ticket<'_, f32>)| {
        let got = t.wait().unwrap();
        let want = inputs[i % INPUTS].2;
        assert_close(got, want, format_args!("item {i}"));
        completed += 1;
    };
    for i in 0..items {
        let (q, p, _) = &inputs[i % INPUTS];
        pending.push_back((i, KlComplexity::submit(rt, q, p).unwrap()));
        if pending.len() >= 192 {
            check(pending.pop_front().unwrap());
        }
    }
    while let Some(x) = pending.pop_front() {
        check(x);
    }
    assert_eq!(completed, items);
}

fn try_submit_never_blocks(rt: &Runtime) {
    let (qh, ph) = (positive(1000), positive(1000));
    let want = kl_reference(&qh, &ph);
    let (q, p) = (rt.upload(&qh).unwrap(), rt.upload(&ph).unwrap());
    let mut accepted = 0;
    let mut full = 0;
    let mut tickets = Vec::new();
    for _ in 0..2000 {
        match rt.try_submit_chain::<KlComplexity>(vec![
            Arg::Input("q", (&q).into()),
            Arg::Input("p", (&p).into()),
        ]) {
            Ok(t) => {
                accepted += 1;
                tickets.push(t);
            }
            Err(Error::QueueFull { capacity }) => {
                assert_eq!(capacity, rt.config().queue_slots as usize);
                full += 1;
                // Make room, as a caller would.
                tickets
                    .drain(..)
                    .for_each(|t| assert_close(t.wait().unwrap(), want, "after a full queue"));
            }
            Err(e) => panic!("{e}"),
        }
    }
    for t in tickets {
        assert_close(t.wait().unwrap(), want, "the last accepted items");
    }
    assert_eq!(accepted + full, 2000);
    assert!(accepted >= 1000, "most submissions should find room");
}

/// After an idle spell (the fetcher backs off its polling) items still complete, with results.
fn items_after_idling_complete(rt: &Runtime) {
    let (q, p) = (positive(1000), positive(1000));
    let want = kl_reference(&q, &p);
    let (qb, pb) = (rt.upload(&q).unwrap(), rt.upload(&p).unwrap());
    for pause_ms in [0u64, 20, 60] {
        std::thread::sleep(Duration::from_millis(pause_ms));
        let got = KlComplexity::submit(rt, &qb, &pb).unwrap().wait().unwrap();
        assert_close(got, want, format_args!("after {pause_ms} ms idle"));
    }
}

/// Host buffers from the runtime's pool (pinned on a GPU) copy both ways, exactly, at odd sizes,
/// into outputs poisoned first; a wrong length is a typed error; dropped buffers are reused.
fn host_buffers_copy_both_ways_and_are_reused(rt: &Runtime) {
    for len in [1usize, 7, 1023, (1 << 20) + 3] {
        let data = common::uniform(len, -1.0, 1.0);
        let mut host = rt.host_buffer::<f32>(len).unwrap();
        assert_eq!(host.len(), len);
        assert_eq!(host.is_pinned(), rt.backend() == BackendKind::Gpu);
        host.copy_from_slice(&data);
        let mut dev = rt.alloc::<f32>(len).unwrap();
        dev.fill(f32::NAN).unwrap();
        dev.write_from_host(&host).unwrap();
        assert_eq!(dev.to_vec().unwrap(), data, "{len}: host buffer to device");
        let mut back = rt.host_buffer::<f32>(len).unwrap();
        back.fill(f32::NAN);
        dev.read_to_host(&mut back).unwrap();
        assert_eq!(&back[..], &data[..], "{len}: device to host buffer");
        let mut other = rt.host_buffer::<f32>(len + 1).unwrap();
        assert!(matches!(
            dev.read_to_host(&mut other),
            Err(Error::SliceLength { .. })
        ));
        assert!(matches!(
            dev.write_from_host(&other),
            Err(Error::SliceLength { .. })
        ));
    }
    // Another element type through the same pool.
    let halves: Vec<pptm::bf16> = (0..77)
        .map(|i| pptm::bf16::from_f32(i as f32 * 0.5))
        .collect();
    let mut host = rt.host_buffer::<pptm::bf16>(halves.len()).unwrap();
    host.copy_from_slice(&halves);
    let mut dev = rt.alloc::<pptm::bf16>(halves.len()).unwrap();
    dev.write_from_host(&host).unwrap();
    host.fill(pptm::bf16::from_f32(-1.0));
    dev.read_to_host(&mut host).unwrap();
    assert_eq!(&host[..], &halves[..]);
    drop(host);
    // The largest buffer above went back to the pool: buffers of about its size reuse it.
    let before = rt.host_pool_stats();
    for _ in 0..5 {
        let b = rt.host_buffer::<f32>(1 << 20).unwrap();
        assert!(b.capacity_bytes() >= 4 << 20);
    }
    let after = rt.host_pool_stats();
    assert_eq!(after.reuses - before.reuses, 5, "{before:?} -> {after:?}");
    assert_eq!(after.allocations, before.allocations);
    rt.trim_host_pool();
    assert_eq!(rt.host_pool_stats().idle_bytes, 0);
}

/// The memory a runtime's buffers live in has a size, and what is free fits in it.
fn memory_info_is_sane(rt: &Runtime) {
    let m = rt.memory_info().unwrap();
    assert!(m.total_bytes > 0 && m.free_bytes <= m.total_bytes, "{m:?}");
}

on_every_backend!(
    host_buffers_copy_both_ways_and_are_reused,
    memory_info_is_sane,
    items_after_idling_complete,
    tickets_resolve_once,
    noop_round_trips,
    bad_input_is_a_typed_error,
    many_submissions_complete_exactly_once,
    try_submit_never_blocks,
);

#[test]
fn runtime_cpu_describes_itself_as_the_cpu_backend() {
    // Runtime::new's own choice (GPU when present, PPTM_BACKEND) is tested in
    // tests/backend_choice.rs, in child processes with their own environments.
    let rt = Runtime::cpu();
    assert_eq!(rt.backend(), BackendKind::Cpu);
    assert!(
        rt.describe().starts_with("CPU backend"),
        "{}",
        rt.describe()
    );
}

#[test]
fn bad_configuration_is_rejected() {
    let cfg = pptm::Config {
        queue_slots: 100,
        ..Default::default()
    };
    assert!(matches!(Runtime::with_config(cfg), Err(Error::Config(_))));
    let cfg = pptm::Config {
        blocks_per_sm: 0,
        ..Default::default()
    };
    assert!(matches!(Runtime::with_config(cfg), Err(Error::Config(_))));
    let cfg = pptm::Config {
        park_when_idle: Some(std::time::Duration::from_micros(10)),
        ..Default::default()
    };
    match Runtime::with_config(cfg) {
        Err(Error::Config(why)) => assert!(why.contains("park_when_idle"), "{why}"),
        other => panic!("a 10 us idle time to park after was accepted: {other:?}"),
    }
}

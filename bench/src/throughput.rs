//! Many small independent items from several threads (`Config::side_by_side`): items per second
//! of no-ops and of a 4096-element chain (KL complexity, one block), each thread keeping a window
//! of tickets in flight, with side by side on and off in the same run. Every chain result is
//! checked against the f64 reference.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pptm::chains::KlComplexity;
use pptm::{Buffer, Config, Runtime};

use crate::record::{Measurement, Stat};
use crate::{BoxError, Collector};

/// The report's name for these measurements.
pub const CHAIN: &str = "throughput";
const THREADS: usize = 8;
/// Tickets each thread keeps in flight (8 × 16 = 128, half the default queue).
const WINDOW: usize = 16;
const KL_N: usize = 4096;

#[derive(Clone, Copy, PartialEq)]
enum Work {
    Noop,
    Kl,
}

/// How many measurements [`run`] reports.
pub fn count() -> usize {
    4
}

/// Times bursts of `per_thread` items on each of THREADS threads; returns µs an item (wall time
/// of the burst over the items), one per burst after a warm-up burst.
fn bursts(
    rt: &Runtime,
    work: Work,
    inputs: &(Buffer<f32>, Buffer<f32>),
    want: (f64, f64),
    bursts: usize,
    per_thread: usize,
) -> Result<Vec<Duration>, BoxError> {
    let mut per_item = Vec::with_capacity(bursts);
    for b in 0..=bursts {
        let start = Instant::now();
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| s.spawn(move || one_thread(rt, work, inputs, want, per_thread)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect()
        });
        let wall = start.elapsed();
        for r in results {
            r?;
        }
        if b > 0 {
            per_item.push(wall / (THREADS * per_thread) as u32);
        }
    }
    Ok(per_item)
}

fn one_thread(
    rt: &Runtime,
    work: Work,
    (q, p): &(Buffer<f32>, Buffer<f32>),
    (value, scale): (f64, f64),
    items: usize,
) -> Result<(), String> {
    let check = |got: f32| {
        let err = (f64::from(got) - value).abs() / scale;
        if err.is_finite() && err < 1e-4 {
            Ok(())
        } else {
            Err(format!(
                "KL complexity: {got} against the f64 reference {value} (error {err:.1e} of the terms)"
            ))
        }
    };
    match work {
        Work::Noop => {
            let mut window = VecDeque::with_capacity(WINDOW);
            for _ in 0..items {
                if window.len() == WINDOW {
                    let t: pptm::Ticket<'_, ()> = window.pop_front().expect("full");
                    t.wait().map_err(|e| e.to_string())?;
                }
                window.push_back(
                    rt.submit_noop::<KlComplexity>()
                        .map_err(|e| e.to_string())?,
                );
            }
            for t in window {
                t.wait().map_err(|e| e.to_string())?;
            }
        }
        Work::Kl => {
            let mut window = VecDeque::with_capacity(WINDOW);
            for _ in 0..items {
                if window.len() == WINDOW {
                    let t: pptm::Ticket<'_, f32> = window.pop_front().expect("full");
                    check(t.wait().map_err(|e| e.to_string())?)?;
                }
                window.push_back(KlComplexity::submit(rt, q, p).map_err(|e| e.to_string())?);
            }
            for t in window {
                check(t.wait().map_err(|e| e.to_string())?)?;
            }
        }
    }
    Ok(())
}

/// Items per second with side by side on and off: no-ops and 4096-element KL complexity items.
pub fn run(quick: bool, out: &mut Collector) -> Result<(), BoxError> {
    let (n_bursts, per_thread) = if quick { (5, 4000) } else { (15, 20_000) };
    let (qh, ph) = (
        crate::cases::uniform(crate::cases::seed::KL_Q, KL_N),
        crate::cases::uniform(crate::cases::seed::KL_P, KL_N),
    );
    let (value, scale) = crate::cases::kl_reference(&qh, &ph);
    for side_by_side in [true, false] {
        let rt = Runtime::gpu_with(Config {
            side_by_side,
            ..Default::default()
        })?;
        rt.prepare::<KlComplexity>()?;
        let inputs = (rt.upload(&qh)?, rt.upload(&ph)?);
        let variant = if side_by_side {
            "side by side"
        } else {
            "in order"
        };
        for (work, shape) in [
            (Work::Noop, "no-op items"),
            (Work::Kl, "KL complexity, n = 4096 (one block)"),
        ] {
            out.progress
                .set_message(format!("throughput: {shape}, {variant}"));
            let t = bursts(&rt, work, &inputs, (value, scale), n_bursts, per_thread)?;
            let s = pptm::timing::Stats::of(t);
            out.report(Measurement {
                chain: CHAIN.into(),
                size: "-".into(),
                shape: format!("{shape}, {THREADS} threads x {WINDOW} in flight"),
                x: 1.0,
                variant: variant.into(),
                host_us: Stat {
                    median: s.median_us,
                    p99: s.p99_us,
                    reps: s.reps,
                },
                device_us: None,
                gbps: None,
                tflops: None,
                max_rel_err: None,
                value: None,
            });
        }
    }
    Ok(())
}

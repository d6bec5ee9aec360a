//! Host-clock timing of synchronised work, as the examples and `pptm-bench` report it: warm-up,
//! many repetitions, median and p99 (each repetition submits and waits, so it is the
//! host-visible latency).

use std::time::{Duration, Instant};

/// Median and 99th percentile of a set of timings, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// The median timing, in microseconds.
    pub median_us: f64,
    /// The 99th percentile, in microseconds (the largest timing, with 100 repetitions or fewer).
    pub p99_us: f64,
    /// How many timings the figures come from.
    pub reps: usize,
}

impl Stats {
    /// Median and p99 of `t` (which must not be empty).
    pub fn of(mut t: Vec<Duration>) -> Stats {
        assert!(!t.is_empty(), "no timings");
        t.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Stats {
            median_us: us(t[t.len() / 2]),
            p99_us: us(t[(t.len() * 99 / 100).min(t.len() - 1)]),
            reps: t.len(),
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:.2} µs, p99 {:.2} µs",
            self.median_us, self.p99_us
        )
    }
}

/// Runs `f` `warmup` times untimed, then `reps` times timed (at least once).
pub fn measure<E>(
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<Stats, E> {
    for _ in 0..warmup {
        f()?;
    }
    let mut t = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed());
    }
    Ok(Stats::of(t))
}

/// The runtimes a comparison times, labelled: on a GPU, `rt` (the persistent manifold), a runtime
/// that runs the same fused code as one kernel launch per item
/// ([`crate::Variant::FusedLaunched`]), one that runs each stage as its own launch
/// ([`crate::Variant::Unfused`]) and one that replays those launches from a CUDA graph
/// ([`crate::Variant::UnfusedGraph`]); on the CPU, `rt` alone.
pub fn variants(rt: crate::Runtime) -> crate::Result<Vec<(&'static str, crate::Runtime)>> {
    if rt.backend() != crate::BackendKind::Gpu {
        return Ok(vec![("CPU backend (f64 reference code)", rt)]);
    }
    let with = |variant| {
        crate::Runtime::gpu_with(crate::Config {
            variant,
            ..rt.config().clone()
        })
    };
    let (launched, unfused, graph) = (
        with(crate::Variant::FusedLaunched)?,
        with(crate::Variant::Unfused)?,
        with(crate::Variant::UnfusedGraph)?,
    );
    Ok(vec![
        ("GPU, fused, persistent manifold", rt),
        ("GPU, fused, one kernel launch per item", launched),
        ("GPU, unfused, one kernel launch per stage", unfused),
        ("GPU, unfused, replayed as a CUDA graph", graph),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p99() {
        let t: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Stats::of(t);
        assert_eq!(s.median_us, 51.0);
        assert_eq!(s.p99_us, 100.0);
        assert_eq!(s.reps, 100);
        let mut calls = 0;
        let s = measure(2, 0, || {
            calls += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!((calls, s.reps), (3, 1));
    }
}

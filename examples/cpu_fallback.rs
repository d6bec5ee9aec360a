//! The CPU backend as a fallback: KL(q ‖ p) over 2^24 elements with pptm's CPU backend (its fast
//! path: elementwise stages fused per element, in parallel chunks), against the whole-tensor f64
//! reference it replaced (`Runtime::cpu_reference`) and a plain single-pass f64 loop on one
//! thread; and the process's peak resident memory while the fast path runs, against the inputs'
//! size; and how soon `submit` returns (items run on pptm's worker pool). Every result is checked
//! against the loop's.
//!
//!     cargo run --release --example cpu_fallback

use std::error::Error;
use std::time::Instant;

use pptm::Runtime;
use pptm::chains::KlComplexity;
use pptm::timing::Stats;

const N: usize = 1 << 24;

/// The process's resident memory now and at its peak (VmRSS, VmHWM), in MiB; Linux only.
fn resident_mib() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn main() -> Result<(), Box<dyn Error>> {
    let rt = Runtime::cpu();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("pptm CPU backend, {threads} hardware threads; KL over n = {N}");
    // Inputs made in place (a cheap deterministic pattern) so that only the buffers hold them.
    let value = |i: usize, k: u64| {
        let h = (i as u64 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        0.1 + 0.9 * (h as f32 / (1u64 << 24) as f32)
    };
    let q = rt.upload(&(0..N).map(|i| value(i, 1)).collect::<Vec<f32>>())?;
    let p = rt.upload(&(0..N).map(|i| value(i, 2)).collect::<Vec<f32>>())?;
    let input_mib = (2 * N * 4) as f64 / (1024.0 * 1024.0);
    // The peak from here on (Linux: "5" resets VmHWM to the current VmRSS), so that the uploads'
    // temporary host vectors do not count.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = resident_mib();

    // The fast path first, so that the peak so far is its own.
    let mut times = Vec::new();
    let mut got = 0.0f32;
    for _ in 0..11 {
        let t = Instant::now();
        got = KlComplexity::submit(&rt, &q, &p)?.wait()?;
        times.push(t.elapsed());
    }
    let peak = resident_mib();

    // Submission is asynchronous: `submit` hands the item to pptm's worker pool and returns;
    // the time until the result is the item's.
    let (mut submit_times, mut result_times) = (Vec::new(), Vec::new());
    for _ in 0..11 {
        let t = Instant::now();
        let ticket = KlComplexity::submit(&rt, &q, &p)?;
        submit_times.push(t.elapsed());
        let again = ticket.wait()?;
        result_times.push(t.elapsed());
        if again != got {
            return Err(format!("a second run gave {again}, the first {got}").into());
        }
    }

    // The reference, on the same inputs (a runtime of its own: buffers belong to one runtime).
    let reference = Runtime::cpu_reference();
    let (qr, pr) = (
        reference.upload(&q.to_vec()?)?,
        reference.upload(&p.to_vec()?)?,
    );
    let mut reference_times = Vec::new();
    let mut reference_got = 0.0f32;
    for _ in 0..3 {
        let t = Instant::now();
        reference_got = KlComplexity::submit(&reference, &qr, &pr)?.wait()?;
        reference_times.push(t.elapsed());
    }
    drop((qr, pr));

    let (qh, ph) = (q.to_vec()?, p.to_vec()?);
    let plain = |qh: &[f32], ph: &[f32]| -> f64 {
        qh.iter()
            .zip(ph)
            .map(|(&q, &p)| {
                let (q, p) = (f64::from(q), f64::from(p));
                q * (q.ln() - p.ln())
            })
            .sum()
    };
    let mut loop_times = Vec::new();
    let mut want = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        want = plain(&qh, &ph);
        loop_times.push(t.elapsed());
    }

    let (fast, old, plain_loop) = (
        Stats::of(times),
        Stats::of(reference_times),
        Stats::of(loop_times),
    );
    let per_core = plain_loop.median_us / threads as f64;
    let ms = |us: f64| us / 1e3;
    println!(
        "fast path:          median {:7.1} ms (p99 {:.1} ms), {:.2} GB/s",
        ms(fast.median_us),
        ms(fast.p99_us),
        (2 * N * 4) as f64 / (fast.median_us * 1e3)
    );
    println!(
        "whole-tensor f64 reference: median {:7.1} ms; the fast path is {:.1}x faster",
        ms(old.median_us),
        old.median_us / fast.median_us
    );
    println!(
        "plain f64 loop, one thread: median {:7.1} ms; per core ({threads}): {:.1} ms; \
         fast path / (loop per core) = {:.2}",
        ms(plain_loop.median_us),
        ms(per_core),
        fast.median_us / per_core
    );
    let (submitted, resolved) = (Stats::of(submit_times), Stats::of(result_times));
    println!(
        "submit returns after {:.1} µs (median); the result comes {:.1} ms after it",
        submitted.median_us,
        ms(resolved.median_us)
    );
    if let (Some((rss, _)), Some((_, peak))) = (before, peak) {
        println!(
            "resident memory: {rss:.0} MiB after upload (inputs {input_mib:.0} MiB); peak while \
             the fast path ran {peak:.0} MiB ({:.2}x the inputs)",
            peak / input_mib
        );
    }
    let rel_ref = (f64::from(reference_got) - want).abs() / want.abs();
    println!("reference: {reference_got} (relative difference from the loop {rel_ref:.1e})");
    let rel = (f64::from(got) - want).abs() / want.abs();
    println!("KL: pptm {got}, plain loop {want:.7} (relative difference {rel:.1e})");
    if rel > 1e-5 {
        return Err(format!("pptm's KL {got} is not the loop's {want}").into());
    }
    Ok(())
}

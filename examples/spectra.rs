//! Spectral fitting at scale (the system and its ops: spectra/system.rs): for every spectrum, the
//! χ² over a grid of template rows (raw templates x rotations) and trial radial velocities, with
//! a polynomial continuum marginalised, and each spectrum's best fit.
//!
//! It prepares the templates (rotational broadening, natural-spline coefficients) as one
//! pipeline, then fits batches of synthetic spectra, each batch one pipeline (the χ² grid, then
//! the best fits). It checks:
//! * the splines against a whole Thomas solve in f64;
//! * on a GPU, the χ² grid against the CPU backend (f64), bar 1e-4 relative;
//! * the χ² grid against a direct f64 fit (Householder QR, residuals summed), bar 1e-5 relative;
//! * the best fits against the spectra's true template row and velocity.
//!
//! It prints the rate in spectra a second: the batches' device work (spectra resident), and end
//! to end (upload, fit, results on the host).
//!
//! bench/peers_spectra.py checks the same grid against NumPy/SciPy and times PyTorch on it:
//! `--write-case DIR` writes the inputs and the results for it.
//!
//! `--gpus N` (or `all`) then fits the spectra again on N GPUs at once (one runtime each,
//! [`Runtime::every_gpu`]), the batches shared out as each GPU finishes one, and prints the rate
//! against one GPU's.
//!
//!     cargo run --release --example spectra [-- --spectra 65536 --batch 8192 --pixels 4000
//!         --degree 10 --grid log|linear --write-case DIR --gpus all]

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use pptm::{BackendKind, Runtime};

#[path = "../bench/src/inputs.rs"]
mod inputs;
#[path = "spectra/reference.rs"]
mod reference;
#[path = "spectra/system.rs"]
mod system;
use system::*;

/// The example's setting: a linear pixel grid from 5000 Å (0.2 Å a pixel), templates on a grid
/// that covers it and ±315 km/s, two raw templates at two rotations, 64 velocities.
struct Setting {
    templates: Templates,
    pixels: Grid,
    velocities: Velocities,
    degree: u32,
}

fn setting(pixels: usize, log: bool, degree: u32) -> Setting {
    let pixel_grid = Grid {
        log: false,
        start: 5000.0,
        step: 0.2,
        len: pixels,
    };
    let velocities = Velocities {
        start: -315.0,
        step: 10.0,
        count: 64,
    };
    // 0.4 % margin each side: the shift (0.11 %) and the broadening kernel (at most 0.05 %).
    let (lo, hi) = (
        pixel_grid.wavelength(0) * 0.996,
        pixel_grid.wavelength(pixels - 1) * 1.004,
    );
    let grid = if log {
        let step = 1e-5; // 3 km/s a knot
        Grid {
            log: true,
            start: lo.ln(),
            step,
            len: ((hi / lo).ln() / step).ceil() as usize + 1,
        }
    } else {
        let step = 0.05;
        Grid {
            log: false,
            start: lo,
            step,
            len: ((hi - lo) / step).ceil() as usize + 1,
        }
    };
    let count = 2;
    let lines = (grid.wavelength(grid.len - 1) - grid.wavelength(0)) as usize;
    let templates = Templates {
        grid,
        count,
        fluxes: reference::synthetic_templates(count, grid, lines, 7001),
        rows: vec![(0, 2.0), (0, 40.0), (1, 2.0), (1, 40.0)],
        limb: 0.6,
    };
    Setting {
        templates,
        pixels: pixel_grid,
        velocities,
        degree,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let number = |name: &str, default: usize| -> Result<usize, Box<dyn Error>> {
        match flag(name) {
            Some(v) => Ok(v.parse().map_err(|_| format!("{name} {v}: a number"))?),
            None => Ok(default),
        }
    };
    let rt = Runtime::new()?;
    let gpu = rt.backend() == BackendKind::Gpu;
    match rt.gpu_info() {
        Some(g) => println!("backend: GPU ({}, {} SMs)", g.name, g.sm_count),
        None => println!("backend: CPU (no usable GPU); the figures below are the CPU backend's"),
    }
    // The CPU backend is the f64 reference, not a fast path: it fits a few spectra.
    let spectra = number("--spectra", if gpu { 65536 } else { 8 })?;
    let batch = number("--batch", if gpu { 8192 } else { 8 })?.min(spectra.max(1));
    let pixels = number("--pixels", 4000)?;
    let degree = number("--degree", 10)? as u32;
    let log = match flag("--grid").as_deref() {
        None | Some("log") => true,
        Some("linear") => false,
        Some(g) => return Err(format!("--grid {g}: log or linear").into()),
    };
    if spectra == 0 || pixels < 2 {
        return Err("--spectra at least 1, --pixels at least 2".into());
    }
    let set = setting(pixels, log, degree);
    let t = &set.templates;
    println!(
        "{spectra} spectra of {pixels} pixels (linear, {:.0}-{:.0} Å); {} template rows on a {} grid of {} knots; {} velocities from {} km/s by {}; continuum degree {degree}",
        set.pixels.wavelength(0),
        set.pixels.wavelength(pixels - 1),
        t.rows.len(),
        if log { "log" } else { "linear" },
        t.grid.len,
        set.velocities.count,
        set.velocities.start,
        set.velocities.step,
    );

    // The templates, once: broadening and spline coefficients as one pipeline.
    let started = Instant::now();
    let knots = prepare(&rt, t)?;
    println!(
        "  templates prepared in {:.2} ms (one pipeline of 3 items)",
        started.elapsed().as_secs_f64() * 1e3
    );
    let splines = reference::splines(t);
    let err = spline_error(&knots.to_vec()?, &splines);
    println!(
        "  splines (values, second derivatives; Thomas sweeps over {SWEEP_WINDOW} knots an element) against a whole Thomas solve in f64: {err:.1e} of the largest value"
    );
    check(err, 1e-6, "splines against the whole solve")?;

    // The spectra, synthesised on the host from the f64 splines.
    let started = Instant::now();
    let data = reference::synthetic_spectra(
        t,
        &splines,
        &set.pixels,
        &set.velocities,
        spectra,
        50.0,
        9001,
    );
    println!(
        "  {spectra} spectra synthesised in {:.1} s (S/N 50, 1 % masked)",
        started.elapsed().as_secs_f64()
    );

    // Fit every batch, and time the device work of one (its spectra resident) and the whole.
    // Two fitters: the host loads one batch while the device fits the other.
    let fitter = Fitter::new(&rt, t, knots, &set.pixels, set.velocities, degree, batch)?;
    let mut fitters = [fitter.twin(&rt)?, fitter];
    let per = t.rows.len() * set.velocities.count;
    let (mut chi2, mut fits) = (Vec::with_capacity(spectra * per), Vec::new());
    let started = Instant::now();
    fit_overlapped(
        &rt,
        &mut fitters,
        &data,
        batch,
        0..spectra.div_ceil(batch),
        |_, out| {
            chi2.extend(out.chi2);
            fits.extend(out.fits);
        },
    )?;
    let whole = started.elapsed().as_secs_f64();
    println!(
        "  end to end (upload, fit, results on the host; the next batch loaded while one runs): {:.3} s, {:.0} spectra/s",
        whole,
        spectra as f64 / whole
    );
    let [_, mut fitter] = fitters;
    let reps = if gpu { 20 } else { 2 };
    let stats = pptm::timing::measure(1, reps, || fitter.run(&rt))?;
    let rate = batch as f64 / (stats.median_us * 1e-6);
    println!(
        "  a batch of {batch} spectra ({} χ² values, one submission): {stats}: {rate:.0} spectra/s, {:.3e} pixel-fits/s",
        batch * per,
        rate * (per * pixels) as f64
    );

    // Checks.
    let found = fits
        .iter()
        .zip(&data.truth)
        .filter(|(f, (b, v))| {
            f.row as usize == *b && (f.velocity - v).abs() < 0.5 * set.velocities.step
        })
        .count();
    println!(
        "  best fits: {found} of {spectra} at the true row and within half a velocity step of the true velocity"
    );
    check(
        1.0 - found as f64 / spectra as f64,
        0.01,
        "best fits away from the truth",
    )?;
    let shown = spectra.min(if gpu { 64 } else { 8 });
    if gpu {
        let cpu = Runtime::cpu();
        let mut reference_fitter = Fitter::new(
            &cpu,
            t,
            prepare(&cpu, t)?,
            &set.pixels,
            set.velocities,
            degree,
            shown,
        )?;
        reference_fitter.load(&data.flux[..shown * pixels], &data.ivar[..shown * pixels])?;
        reference_fitter.run(&cpu)?;
        let want = reference_fitter.results(shown)?.chi2;
        let err = relative(&chi2[..want.len()], want.iter().map(|&x| f64::from(x)));
        println!("  χ² of {shown} spectra against the f64 CPU backend: {err:.1e}");
        check(err, 1e-4, "χ² against the CPU backend")?;
    }
    let direct = spectra.min(2);
    let mut want = Vec::new();
    for s in 0..direct {
        let range = s * pixels..(s + 1) * pixels;
        want.extend(reference::chi2_row(
            &splines,
            t,
            &set.pixels,
            &set.velocities,
            &data.flux[range.clone()],
            &data.ivar[range],
            degree as usize,
        ));
    }
    let err = relative(&chi2[..want.len()], want.iter().copied());
    let bar = if gpu { 1e-4 } else { 1e-5 };
    println!("  χ² of {direct} spectra against a direct f64 fit (QR): {err:.1e}");
    check(err, bar, "χ² against the direct fit")?;

    if let Some(dir) = flag("--write-case") {
        write_case(Path::new(&dir), &set, &data, &chi2, &fits, &fitter)?;
        println!("  case written to {dir} (bench/peers_spectra.py --check / --torch)");
    }
    drop(fitter);

    // Several GPUs: one runtime each, the batches shared out as each GPU finishes one.
    if let Some(g) = flag("--gpus").filter(|_| gpu) {
        let all = Runtime::every_gpu(rt.config())?;
        let n = match g.as_str() {
            "all" => all.len(),
            v => v
                .parse::<usize>()
                .map_err(|_| format!("--gpus {v}: a number or all"))?
                .min(all.len()),
        };
        println!("  {n} of {} GPUs, batches of {batch}:", all.len());
        let mut rates = Vec::new();
        for group in [&all[..1], &all[..n]] {
            let out = sharded(group, &set, &data, batch)?;
            let err = relative(&out.chi2, chi2.iter().map(|&x| f64::from(x)));
            println!(
                "    {} GPU(s): end to end {:.0} spectra/s ({:.3} s); device work {:.0} spectra/s; χ² against the first run's: {err:.1e}",
                group.len(),
                spectra as f64 / out.wall_s,
                out.wall_s,
                out.device_rate
            );
            check(err, 1e-6, "χ² on several GPUs against one")?;
            rates.push((spectra as f64 / out.wall_s, out.device_rate));
            if n == 1 {
                break;
            }
        }
        if let [one, many] = rates[..] {
            println!(
                "    {n} GPUs against 1: {:.2}x end to end, {:.2}x device work",
                many.0 / one.0,
                many.1 / one.1
            );
        }
    }
    Ok(())
}

/// What [`sharded`] gives: the χ² grid in spectrum order, the time from the first batch to the
/// last result, and the rate of the GPUs' resident batches run at once.
struct Sharded {
    chi2: Vec<f32>,
    wall_s: f64,
    device_rate: f64,
}

/// Fits every spectrum of `data` on the runtimes `rts` at once, a thread each: each prepares
/// the templates and two fitters, then takes the next batch not taken (so a faster GPU takes
/// more) and loads it while its previous batch runs ([`fit_overlapped`]). Then each runs its last batch 10 times over, all at
/// once, for the device-work rate.
fn sharded(
    rts: &[Runtime],
    set: &Setting,
    data: &reference::Spectra,
    batch: usize,
) -> Result<Sharded, Box<dyn Error>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Barrier, Mutex};
    let spectra = data.truth.len();
    let batches = spectra.div_ceil(batch);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Vec<f32>>>> = Mutex::new(vec![None; batches]);
    let ready = Barrier::new(rts.len() + 1);
    let done = Barrier::new(rts.len() + 1);
    let reps = 10;
    let (wall_s, device_s) = std::thread::scope(|scope| -> Result<(f64, f64), Box<dyn Error>> {
        let workers: Vec<_> = rts
            .iter()
            .map(|rt| {
                let (next, results, ready, done) = (&next, &results, &ready, &done);
                scope.spawn(move || -> pptm::Result<()> {
                    let t = &set.templates;
                    let knots = prepare(rt, t);
                    let fitters = knots.and_then(|k| {
                        let f =
                            Fitter::new(rt, t, k, &set.pixels, set.velocities, set.degree, batch)?;
                        Ok([f.twin(rt)?, f])
                    });
                    ready.wait();
                    // Every thread meets the others at `done`, an error or not (the caller
                    // waits there too).
                    let fitted = fitters.and_then(|mut fitters| {
                        let take = std::iter::from_fn(|| {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            (i < batches).then_some(i)
                        });
                        fit_overlapped(rt, &mut fitters, data, batch, take, |i, out| {
                            results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(out.chi2);
                        })?;
                        let [_, fitter] = fitters;
                        Ok(fitter)
                    });
                    done.wait();
                    let mut fitter = fitted?;
                    for _ in 0..reps {
                        fitter.run(rt)?;
                    }
                    Ok(())
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        done.wait();
        let wall = start.elapsed().as_secs_f64();
        let start = Instant::now();
        for w in workers {
            w.join().map_err(|_| "a GPU's thread panicked")??;
        }
        Ok((wall, start.elapsed().as_secs_f64()))
    })?;
    let mut chi2 = Vec::new();
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        chi2.extend(r.ok_or("a batch was not fitted")?);
    }
    Ok(Sharded {
        chi2,
        wall_s,
        device_rate: (rts.len() * batch * reps) as f64 / device_s,
    })
}

/// Fits the batches `order` yields (batch indices into `data`, `batch` spectra each) on `rt` with
/// two fitters: while the device fits one batch, the host loads the next into the other fitter.
/// `sink` gets each batch's index and results as they arrive.
fn fit_overlapped(
    rt: &Runtime,
    fitters: &mut [Fitter; 2],
    data: &reference::Spectra,
    batch: usize,
    mut order: impl Iterator<Item = usize>,
    mut sink: impl FnMut(usize, BatchFit),
) -> pptm::Result<()> {
    let spectra = data.truth.len();
    let pixels = data.flux.len() / spectra.max(1);
    let load = |f: &mut Fitter, i: usize| {
        let range = i * batch * pixels..((i + 1) * batch).min(spectra) * pixels;
        f.load(&data.flux[range.clone()], &data.ivar[range])
    };
    let [mut cur, mut other] = fitters.each_mut();
    let Some(mut i) = order.next() else {
        return Ok(());
    };
    let mut n = load(cur, i)?;
    loop {
        let running = cur.start(rt)?;
        let next = match order.next() {
            Some(j) => Some((j, load(other, j)?)),
            None => None,
        };
        running.wait()?;
        sink(i, cur.results(n)?);
        let Some((j, m)) = next else {
            return Ok(());
        };
        std::mem::swap(&mut cur, &mut other);
        (i, n) = (j, m);
    }
}

/// The largest relative difference of a χ² grid from a reference, NaN where the reference is NaN
/// (anything else there counts as infinitely wrong).
fn relative(got: &[f32], want: impl Iterator<Item = f64>) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, w)| {
            let g = f64::from(g);
            match (g.is_nan(), w.is_nan()) {
                (true, true) => 0.0,
                (false, false) => (g - w).abs() / w.abs().max(1e-30),
                _ => f64::INFINITY,
            }
        })
        .fold(0.0, f64::max)
}

/// The prepared knots against the f64 splines: the largest difference of a value or a second
/// derivative, over the row's largest value. (The second derivatives are in the values' units a
/// knot squared. The rows pass between items in f32, so a second difference of a smooth row
/// carries the values' f32 rounding: over the largest second derivative, a smooth row's error
/// would look large although the interpolant it gives is as exact as its values.)
fn spline_error(knots: &[f32], splines: &[(Vec<f64>, Vec<f64>)]) -> f64 {
    let mut worst = 0.0f64;
    for (b, (y, m)) in splines.iter().enumerate() {
        let n = y.len();
        let row = &knots[2 * b * n..2 * (b + 1) * n];
        let scale = y.iter().fold(0.0f64, |a, v| a.max(v.abs())).max(1e-30);
        for i in 0..n {
            let dy = (f64::from(row[2 * i]) - y[i]).abs();
            let dm = (f64::from(row[2 * i + 1]) - m[i]).abs();
            worst = worst.max(if dy.is_nan() || dm.is_nan() {
                f64::INFINITY
            } else {
                dy.max(dm) / scale
            });
        }
    }
    worst
}

fn check(err: f64, bar: f64, what: &str) -> Result<(), Box<dyn Error>> {
    if err <= bar {
        Ok(())
    } else {
        Err(format!("{what}: {err:.2e} exceeds {bar:.0e}").into())
    }
}

/// The case bench/peers_spectra.py reads: case.json and little-endian f32 files.
fn write_case(
    dir: &Path,
    set: &Setting,
    data: &reference::Spectra,
    chi2: &[f32],
    fits: &[Fit],
    fitter: &Fitter,
) -> Result<(), Box<dyn Error>> {
    std::fs::create_dir_all(dir)?;
    let t = &set.templates;
    let write = |name: &str, v: &[f32]| -> std::io::Result<()> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.join(name), bytes)
    };
    let rows: Vec<String> = t
        .rows
        .iter()
        .map(|(raw, vsini)| format!("[{raw}, {vsini}]"))
        .collect();
    let json = format!(
        "{{\"templates\": {}, \"knots\": {}, \"template_grid\": \"{}\", \"template_start\": {:?}, \"template_step\": {:?}, \"rows\": [{}], \"limb\": {:?}, \"pixels\": {}, \"obs_start\": {:?}, \"obs_step\": {:?}, \"spectra\": {}, \"velocity_start\": {:?}, \"velocity_step\": {:?}, \"velocities\": {}, \"degree\": {}, \"light_speed\": {:?}}}\n",
        t.count,
        t.grid.len,
        if t.grid.log { "log" } else { "linear" },
        t.grid.start,
        t.grid.step,
        rows.join(", "),
        t.limb,
        set.pixels.len,
        set.pixels.start,
        set.pixels.step,
        data.truth.len(),
        set.velocities.start,
        set.velocities.step,
        set.velocities.count,
        set.degree,
        LIGHT_SPEED,
    );
    std::fs::write(dir.join("case.json"), json)?;
    write("templates.f32", &t.fluxes)?;
    write("flux.f32", &data.flux)?;
    write("ivar.f32", &data.ivar)?;
    write("chi2.f32", chi2)?;
    let best: Vec<f32> = fits
        .iter()
        .flat_map(|f| [f.chi2 as f32, f.row as f32, f.velocity as f32])
        .collect();
    write("best.f32", &best)?;
    write("knots.f32", &fitter.knots()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(log: bool, knots: usize) -> Templates {
        let grid = if log {
            Grid {
                log: true,
                start: 4990f64.ln(),
                step: 2e-5,
                len: knots,
            }
        } else {
            Grid {
                log: false,
                start: 4990.0,
                step: 0.1,
                len: knots,
            }
        };
        Templates {
            grid,
            count: 2,
            fluxes: reference::synthetic_templates(2, grid, knots / 8 + 1, 11),
            rows: vec![(0, 0.0), (1, 30.0), (0, 12.0)],
            limb: 0.6,
        }
    }

    #[test]
    fn windowed_thomas_sweeps_match_a_whole_solve() {
        let cpu = Runtime::cpu();
        for (log, knots) in [
            (true, 2),
            (true, 3),
            (false, 4),
            (true, 40),
            (false, 70),
            (true, 301),
            (false, 3 * SWEEP_WINDOW + 5),
        ] {
            let t = small(log, knots);
            let got = prepare(&cpu, &t).unwrap().to_vec().unwrap();
            let err = spline_error(&got, &reference::splines(&t));
            assert!(err <= 1e-6, "{knots} knots (log {log}): {err:.2e}");
        }
    }

    /// A few spectra on a short grid: the χ² grid against the direct QR fit, for degrees 0, 3
    /// and 10, with masked pixels and a spectrum of no weight (NaN).
    #[test]
    fn the_chi2_grid_matches_a_direct_fit() {
        let cpu = Runtime::cpu();
        for (log, degree) in [(true, 0), (false, 3), (true, 10)] {
            let pixels = Grid {
                log: false,
                start: 5000.0,
                step: 0.25,
                len: 101,
            };
            let t = small(log, if log { 301 } else { 260 });
            let velocities = Velocities {
                start: -40.0,
                step: 13.0,
                count: 7,
            };
            let splines = reference::splines(&t);
            let mut data =
                reference::synthetic_spectra(&t, &splines, &pixels, &velocities, 3, 30.0, 5);
            for w in &mut data.ivar[2 * 101..] {
                *w = 0.0;
            }
            let knots = prepare(&cpu, &t).unwrap();
            let mut fitter = Fitter::new(&cpu, &t, knots, &pixels, velocities, degree, 4).unwrap();
            assert_eq!(fitter.load(&data.flux, &data.ivar).unwrap(), 3);
            fitter.run(&cpu).unwrap();
            let got = fitter.results(3).unwrap();
            let mut want = Vec::new();
            for s in 0..3 {
                let r = s * 101..(s + 1) * 101;
                want.extend(reference::chi2_row(
                    &splines,
                    &t,
                    &pixels,
                    &velocities,
                    &data.flux[r.clone()],
                    &data.ivar[r],
                    degree as usize,
                ));
            }
            assert!(want[2 * 21..].iter().all(|x| x.is_nan()));
            let err = relative(&got.chi2, want.iter().copied());
            assert!(err <= 1e-5, "log {log}, degree {degree}: {err:.2e}");
            assert!(got.fits[2].chi2.is_nan());

            // A shorter batch after it, on a twin started while the first fitter's batch runs:
            // the rows it does not fill are spectra of zero weight again (NaN), not the last
            // batch's, and both fitters give the first spectrum alike.
            let mut twin = fitter.twin(&cpu).unwrap();
            assert_eq!(twin.load(&data.flux, &data.ivar).unwrap(), 3);
            assert_eq!(twin.load(&data.flux[..101], &data.ivar[..101]).unwrap(), 1);
            let running = twin.start(&cpu).unwrap();
            assert_eq!(
                fitter.load(&data.flux[..101], &data.ivar[..101]).unwrap(),
                1
            );
            running.wait().unwrap();
            let again = twin.results(4).unwrap();
            assert_eq!(again.chi2[..21], got.chi2[..21]);
            assert!(again.chi2[21..].iter().all(|x| x.is_nan()));
            fitter.run(&cpu).unwrap();
            assert_eq!(fitter.results(1).unwrap().chi2, again.chi2[..21]);
        }
    }

    #[test]
    fn best_fits_find_the_true_row_and_velocity() {
        let cpu = Runtime::cpu();
        let set = setting(600, true, 4);
        let t = &set.templates;
        let splines = reference::splines(t);
        let data =
            reference::synthetic_spectra(t, &splines, &set.pixels, &set.velocities, 4, 100.0, 3);
        let knots = prepare(&cpu, t).unwrap();
        let mut fitter = Fitter::new(&cpu, t, knots, &set.pixels, set.velocities, 4, 4).unwrap();
        fitter.load(&data.flux, &data.ivar).unwrap();
        fitter.run(&cpu).unwrap();
        let fits = fitter.results(4).unwrap().fits;
        for (f, (b, v)) in fits.iter().zip(&data.truth) {
            assert_eq!(f.row as usize, *b, "{f:?} against row {b}, {v} km/s");
            assert!((f.velocity - v).abs() < 2.0, "{f:?} against {v} km/s");
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let cpu = Runtime::cpu();
        let t = small(true, 40);
        let pixels = Grid {
            log: false,
            start: 4995.0,
            step: 0.1,
            len: 10,
        };
        let v = Velocities {
            start: 0.0,
            step: 1.0,
            count: 3,
        };
        let bad = |r: pptm::Result<()>| {
            assert!(matches!(r, Err(pptm::Error::BadArguments { .. })), "{r:?}")
        };
        let knots = || prepare(&cpu, &t).unwrap();
        let fitter = |knots, v, degree, batch| {
            Fitter::new(&cpu, &t, knots, &pixels, v, degree, batch).map(|_| ())
        };
        bad(fitter(knots(), v, 11, 2));
        bad(fitter(
            knots(),
            Velocities {
                start: 0.6 * LIGHT_SPEED,
                ..v
            },
            2,
            2,
        ));
        bad(fitter(knots(), Velocities { count: 0, ..v }, 2, 2));
        bad(fitter(knots(), v, 2, MAX_ELEMENTS));
        bad(fitter(cpu.upload(&[0.0f32; 6]).unwrap(), v, 2, 2));
        let mut f = Fitter::new(&cpu, &t, knots(), &pixels, v, 2, 2).unwrap();
        bad(f.load(&[1.0; 30], &[1.0; 30]).map(|_| ()));
        bad(f.load(&[1.0; 10], &[1.0; 9]).map(|_| ()));
        bad(f.load(&[1.0; 15], &[1.0; 15]).map(|_| ()));
        for rows in [vec![(2, 1.0)], vec![(0, -1.0)], vec![(0, 5000.0)], vec![]] {
            bad(prepare(&cpu, &Templates { rows, ..t.clone() }).map(|_| ()));
        }
        bad(prepare(
            &cpu,
            &Templates {
                fluxes: vec![1.0; 7],
                ..t.clone()
            },
        )
        .map(|_| ()));
    }
}

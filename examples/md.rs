//! Molecular dynamics with a learned-style force field (the model, its ops and the pipeline of
//! a step: md/system.rs): a whole trajectory of velocity Verlet steps as one submission, with
//! the forces from a backward pass written as ops.
//!
//! For each system size it:
//! * checks the forces against central differences of the model's energy evaluated directly in
//!   f64 (the filter network at every distance, no table; up to 50 atoms), and on a GPU against
//!   the CPU backend, which computes in f64 (bar 1e-4 of the largest force);
//! * checks the potential energy against the direct evaluation;
//! * integrates 1000 NVE steps in runs of 50, and reports the drift of the total energy over the
//!   initial kinetic energy (bar 1e-3), the list's capacity and how often the device rebuilt
//!   the list (when an atom had moved skin / 2);
//! * times runs of 1000 steps from the start state, each one submission, and prints the time a
//!   step (median, p99) and the host round trips.
//!
//! bench/peers_md.py runs the same model in PyTorch; `--write-forces FILE` writes the forces at
//! the start of each size for its `--check-forces FILE`.
//!
//! On a GPU, `--diagnose` also compares every buffer of a force evaluation with the CPU
//! backend's and prints each item's time on the device.
//!
//!     cargo run --release --example md [-- --atoms 10,100 --width 128 --write-forces FILE --diagnose]

use std::error::Error;

use pptm::timing::Stats;
use pptm::{BackendKind, Runtime, State};

#[path = "../bench/src/inputs.rs"]
mod inputs;
#[path = "md/system.rs"]
mod system;
use system::*;

/// Width of the model's features (`--width` takes 64 or 128, as bench/peers_md.py does).
const WIDTH: usize = 64;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let rt = Runtime::new()?;
    let gpu = rt.backend() == BackendKind::Gpu;
    match rt.gpu_info() {
        Some(g) => println!("backend: GPU ({}, {} SMs)", g.name, g.sm_count),
        None => println!("backend: CPU (no usable GPU); the figures below are the CPU backend's"),
    }
    let sizes: Vec<usize> = match flag("--atoms") {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().parse())
            .collect::<Result<_, _>>()?,
        None if gpu => vec![10, 50, 100, 1000],
        None => vec![10],
    };
    // The CPU backend is the f64 reference, not a fast path: it runs fewer steps.
    let (steps, segment) = if gpu { (1000, 50) } else { (100, 50) };
    let width = match flag("--width") {
        Some(w) => match w.parse::<usize>() {
            Ok(w @ (64 | 128)) => w,
            _ => return Err(format!("--width {w}: the model's width is 64 or 128").into()),
        },
        None => WIDTH,
    };
    let model = Model::new(width);
    println!(
        "width {width}, {BLOCKS} interaction blocks, r_c {R_CUT}, skin {SKIN}, dt {DT}, filters tabulated at {FILTER_POINTS} distances"
    );
    let cpu = Runtime::cpu();
    let mut written = Vec::new();
    for n in sizes {
        let atoms = start(n);
        let slots = list_columns(&atoms);
        let mut md = Md::new(&rt, &model, &atoms, slots, FILTER_POINTS)?;
        let (forces, at_start, profile) = md.evaluate(&rt)?;
        let scale = largest(&forces);
        println!(
            "{n} atoms: a list of {slots} columns, built {}; largest force {scale:.3e}",
            if md.cells {
                "by the cell list"
            } else {
                "from all pairs"
            }
        );
        if gpu {
            let mut reference = Md::new(&cpu, &model, &atoms, slots, FILTER_POINTS)?;
            let (want, _, _) = reference.evaluate(&cpu)?;
            if args.iter().any(|a| a == "--diagnose") {
                diagnose(&md, &reference)?;
                print_profile(&profile);
            }
            let err = relative(&forces, &want);
            println!("  forces against the f64 CPU backend: {err:.1e}");
            check(err, 1e-4, "forces against the CPU backend")?;
        }
        // The potential energy against the model evaluated directly.
        let e = reference_energy(&model, &atoms);
        let err = (at_start.potential - e).abs() / e.abs().max(1.0);
        println!(
            "  potential energy {:.6} (direct f64: {e:.6}, {err:.1e})",
            at_start.potential
        );
        check(err, 1e-4, "potential energy against the direct model")?;
        if n <= 50 {
            let fd = finite_difference_error(&model, &atoms, &forces, 6);
            println!("  forces against central differences of the direct energy: {fd:.1e}");
            check(fd, 1e-3, "forces against finite differences")?;
        }
        written.push((n, forces));

        // NVE: `steps` steps in runs of `segment`, the total energy after each.
        let e0 = at_start.potential + at_start.kinetic;
        let (mut drift, mut round_trips, mut most, mut rebuilds) = (0.0f64, 0u64, 0, 0);
        for _ in 0..steps / segment {
            let end = md.run(&rt, segment)?;
            drift = drift.max((end.potential + end.kinetic - e0).abs() / at_start.kinetic);
            round_trips = round_trips.max(end.round_trips);
            rebuilds += end.rebuilds;
            let state = Atom::unflatten(&md.end.to_vec()?)?;
            most = most.max(most_neighbours(&state));
            md.start.write(&Atom::flatten(&state))?;
        }
        println!(
            "  NVE over {steps} steps: drift {drift:.2e} of the kinetic energy (bar 1e-3); \
             {round_trips} round trip(s) a run of {segment}; at most {most} neighbours in the \
             list's {slots} columns; the list built at each run's start and rebuilt {rebuilds} \
             time(s) within runs (by the device, when an atom had moved skin / 2 = {})",
            SKIN / 2.0
        );
        check(drift, 1e-3, "energy drift")?;
        if most > slots {
            return Err(format!("{most} neighbours overflow the list's {slots} columns").into());
        }

        // Timing: runs of `steps` steps from the start state, each one submission.
        md.start.write(&Atom::flatten(&atoms))?;
        let reps = if gpu { 10 } else { 1 };
        let mut times = Vec::with_capacity(reps);
        let mut trips = 0;
        for rep in 0..=reps {
            let t = std::time::Instant::now();
            let end = md.run(&rt, steps)?;
            let took = t.elapsed();
            trips = end.round_trips;
            if rep > 0 {
                times.push(took / steps as u32);
            }
        }
        println!(
            "  {steps} steps as one pipeline: {} a step ({trips} host round trip(s) a run)",
            Stats::of(times)
        );
    }
    if let Some(path) = flag("--write-forces") {
        let lines: Vec<String> = written
            .iter()
            .map(|(n, f)| {
                let flat: Vec<String> = f.iter().flatten().map(|v| format!("{v:e}")).collect();
                format!(
                    "{{\"atoms\": {n}, \"width\": {width}, \"forces\": [{}]}}",
                    flat.join(", ")
                )
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n")?;
        println!("wrote the start forces to {path}");
    }
    Ok(())
}

/// Each buffer of the last evaluation on both backends: its NaNs and the largest difference.
fn diagnose(got: &Md, want: &Md) -> Result<(), Box<dyn Error>> {
    for ((name, g), (_, w)) in got.buffers()?.iter().zip(want.buffers()?) {
        let nans = g.iter().filter(|v| v.is_nan()).count();
        let diff = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!(
            "  {name:>10}: {} values, {nans} NaN, largest difference {diff:.2e} (largest value {scale:.2e}); first {:?}",
            g.len(),
            &g[..g.len().min(6)]
        );
    }
    Ok(())
}

/// The forces' items on the device: each one's time and the gap before it.
fn print_profile(profile: &[(String, Option<(u64, u64)>)]) {
    let mut last_end = None;
    let (mut busy, mut gaps) = (0u64, 0u64);
    for (name, span) in profile {
        if let Some((a, b)) = span {
            let gap = last_end.map_or(0, |e: u64| a.saturating_sub(e));
            println!(
                "  {name:>16}: {:8.2} µs (after {:6.2} µs)",
                (b - a) as f64 / 1e3,
                gap as f64 / 1e3
            );
            busy += b - a;
            gaps += gap;
            last_end = Some(*b);
        }
    }
    println!(
        "  items {:.1} µs, hand-offs {:.1} µs",
        busy as f64 / 1e3,
        gaps as f64 / 1e3
    );
}

fn check(err: f64, bar: f64, what: &str) -> Result<(), Box<dyn Error>> {
    if err.is_nan() || err > bar {
        return Err(format!("{what}: {err:e} exceeds {bar:e}").into());
    }
    Ok(())
}

fn largest(forces: &[[f64; 3]]) -> f64 {
    forces.iter().flatten().fold(0.0, |m, x| m.max(x.abs()))
}

/// The largest difference of two force sets over the larger force of `want`.
fn relative(got: &[[f64; 3]], want: &[[f64; 3]]) -> f64 {
    let diff = got
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .map(|(a, b)| {
            if a.is_nan() {
                f64::INFINITY
            } else {
                (a - b).abs()
            }
        })
        .fold(0.0, f64::max);
    diff / largest(want).max(1e-30)
}

/// The largest difference of `forces` from central differences of [`reference_energy`] over
/// `coords` coordinates spread over the atoms, relative to the largest force.
fn finite_difference_error(
    model: &Model,
    atoms: &[Atom],
    forces: &[[f64; 3]],
    coords: usize,
) -> f64 {
    let h = 1e-5;
    let n = atoms.len();
    let mut worst = 0.0f64;
    for k in 0..coords.min(3 * n) {
        let (i, c) = ((k * 7919) % n, k % 3);
        let moved = |d: f64| {
            let mut a = atoms.to_vec();
            match c {
                0 => a[i].x += d,
                1 => a[i].y += d,
                _ => a[i].z += d,
            }
            reference_energy(model, &a)
        };
        let fd = -(moved(h) - moved(-h)) / (2.0 * h);
        worst = worst.max((fd - forces[i][c]).abs());
    }
    worst / largest(forces).max(1e-30)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Few distances: the tables build fast in a debug test, and Hermite interpolation is still
    /// within 1e-6 of the network.
    const POINTS: usize = 256;

    /// The cell list finds the same neighbours as all pairs: every atom's set of slots, at a
    /// size where a run uses it, for a few atoms, and for two clusters 32 cells apart (their
    /// cells share keys, and the distance test keeps them apart).
    #[test]
    fn the_cell_list_finds_the_all_pairs_neighbours() {
        let rt = Runtime::cpu();
        let model = Model::new(WIDTH);
        let lattice = start(CELL_LIST_FROM);
        let mut far = start(40);
        let offset = 32.0 * CELL_SIDE;
        far.extend(start(40).into_iter().map(|a| Atom {
            x: a.x + offset,
            ..a
        }));
        for atoms in [lattice, start(7), far] {
            let slots = list_columns(&atoms);
            let mut md = Md::new(&rt, &model, &atoms, slots, POINTS).unwrap();
            md.cells = true;
            let cells = md.neighbour_list(&rt).unwrap();
            md.cells = false;
            let pairs = md.neighbour_list(&rt).unwrap();
            let n = atoms.len();
            for i in 0..n {
                let set = |list: &[f32]| {
                    let mut v: Vec<u32> = list[i * slots..(i + 1) * slots]
                        .iter()
                        .map(|&j| j as u32)
                        .filter(|&j| j != i as u32)
                        .collect();
                    v.sort_unstable();
                    v
                };
                let (a, b) = (set(&cells), set(&pairs));
                assert_eq!(a, b, "{n} atoms: atom {i}'s neighbours");
                // Each neighbour once.
                assert!(
                    a.windows(2).all(|w| w[0] < w[1]),
                    "{n} atoms: atom {i}: {a:?}"
                );
            }
        }
        // A run whose list comes from the cells ends where one from all pairs does (the slots'
        // order differs, so the sums' order does: equal to rounding).
        let atoms = start(7);
        let mut ends = Vec::new();
        for cells in [true, false] {
            let mut md = Md::new(&rt, &model, &atoms, list_columns(&atoms), POINTS).unwrap();
            md.cells = cells;
            let end = md.run(&rt, 10).unwrap();
            ends.push(end.potential + end.kinetic);
        }
        assert!((ends[0] - ends[1]).abs() < 1e-6 * ends[1].abs(), "{ends:?}");
    }

    /// The forces of the CPU backend are the gradient of the model's energy evaluated directly
    /// (every coordinate, central differences), and its potential energy is that energy, for
    /// one atom (no edges) and for 7.
    #[test]
    fn forces_are_the_gradient_of_the_direct_energy() {
        let rt = Runtime::cpu();
        for (n, width) in [(1usize, WIDTH), (7, WIDTH), (4, 128)] {
            let model = Model::new(width);
            let atoms = start(n);
            let mut md = Md::new(&rt, &model, &atoms, list_columns(&atoms), POINTS).unwrap();
            let (forces, at, _) = md.evaluate(&rt).unwrap();
            let e = reference_energy(&model, &atoms);
            assert!(
                (at.potential - e).abs() < 1e-5 * e.abs().max(1.0),
                "{n} atoms: {} against {e}",
                at.potential
            );
            let kinetic: f64 = atoms
                .iter()
                .map(|a| 0.5 * f64::from((a.vx * a.vx + a.vy * a.vy + a.vz * a.vz) as f32))
                .sum();
            assert!((at.kinetic - kinetic).abs() < 1e-5 * kinetic.max(1.0));
            if n == 1 {
                assert_eq!(forces, vec![[0.0; 3]], "one atom feels no force");
                continue;
            }
            let err = finite_difference_error(&model, &atoms, &forces, 3 * n);
            assert!(
                err < 1e-4,
                "{n} atoms: forces {err:e} from finite differences"
            );
        }
    }

    /// A short NVE run conserves the total energy, and its state is written in full.
    #[test]
    fn a_run_conserves_energy() {
        let rt = Runtime::cpu();
        let model = Model::new(WIDTH);
        let atoms = start(7);
        let mut md = Md::new(&rt, &model, &atoms, list_columns(&atoms), POINTS).unwrap();
        let (_, at, _) = md.evaluate(&rt).unwrap();
        let end = md.run(&rt, 20).unwrap();
        let drift = (end.potential + end.kinetic - at.potential - at.kinetic).abs() / at.kinetic;
        assert!(drift < 1e-4, "drift {drift:e}");
        let state = md.end.to_vec().unwrap();
        assert!(state.iter().all(|v| v.is_finite()), "{state:?}");
        let moved = Atom::unflatten(&state).unwrap();
        assert!(moved.iter().zip(&atoms).all(|(a, b)| a != b));
    }

    /// The device rebuilds the list when an atom has moved skin / 2, and only then: after 20
    /// steps of fast atoms (each moves about 2), the list the last forces used holds every pair
    /// within r_c, among them pairs that were beyond r_c + skin at the start (which a list never
    /// rebuilt would miss); slow atoms are not rebuilt for. Both list builders.
    #[test]
    fn the_list_is_rebuilt_when_atoms_move_half_the_skin() {
        let rt = Runtime::cpu();
        let model = Model::new(WIDTH);
        let fast: Vec<Atom> = start(64)
            .into_iter()
            .map(|a| Atom {
                vx: 100.0 * a.vx,
                vy: 100.0 * a.vy,
                vz: 100.0 * a.vz,
                ..a
            })
            .collect();
        let apart = |a: &Atom, b: &Atom| {
            ((a.x - b.x).powi(2) + (a.y - b.y).powi(2) + (a.z - b.z).powi(2)).sqrt()
        };
        let slots = fast.len();
        for cells in [false, true] {
            let mut md = Md::new(&rt, &model, &fast, slots, POINTS).unwrap();
            md.cells = cells;
            let end = md.run(&rt, 20).unwrap();
            assert!(
                end.rebuilds >= 2,
                "cells {cells}: {} rebuilds",
                end.rebuilds
            );
            let state = Atom::unflatten(&md.end.to_vec().unwrap()).unwrap();
            let (_, list) = md
                .buffers()
                .unwrap()
                .into_iter()
                .find(|(name, _)| name == "list")
                .unwrap();
            let mut new_pairs = 0;
            for i in 0..state.len() {
                let row = &list[i * slots..(i + 1) * slots];
                for j in (0..state.len()).filter(|&j| j != i) {
                    if apart(&state[i], &state[j]) < R_CUT {
                        assert!(
                            row.contains(&(j as f32)),
                            "cells {cells}: atoms {i} and {j} are within r_c, not in the list"
                        );
                        new_pairs += usize::from(apart(&fast[i], &fast[j]) > R_CUT + SKIN);
                    }
                }
            }
            assert!(
                new_pairs > 0,
                "cells {cells}: no pair came from beyond the start's list"
            );
        }
        let slow = start(7);
        let mut md = Md::new(&rt, &model, &slow, list_columns(&slow), POINTS).unwrap();
        assert_eq!(md.run(&rt, 10).unwrap().rebuilds, 0, "slow atoms");
    }

    /// A run of an odd number of steps (the loop's iterations are two steps) is a typed error.
    #[test]
    fn runs_are_whole_iterations() {
        let rt = Runtime::cpu();
        let model = Model::new(WIDTH);
        let atoms = start(3);
        let mut md = Md::new(&rt, &model, &atoms, 2, POINTS).unwrap();
        for steps in [0, 7] {
            assert!(matches!(
                md.run(&rt, steps),
                Err(pptm::Error::BadArguments { .. })
            ));
        }
    }
}

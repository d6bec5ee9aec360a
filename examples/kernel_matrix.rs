//! Fidelity kernel matrices K_ij = |⟨ψ_i|ψ_j⟩|² for N states of 2^q complex amplitudes, in
//! tiles (the products and the op: kernel_matrix/system.rs).
//!
//! * **Tiles sized to memory.** A [`TilePlanner`] takes a fraction of the free memory
//!   ([`Runtime::memory_info`]) and lists the tile edges whose buffers fit; the operands stay
//!   resident when they fit too, else each tile uploads its own.
//! * **Tuned, and remembered.** The edge is chosen by timing a tile of each candidate
//!   ([`TuneCache`]), and the choice is kept on disk keyed by device, precision and shape: a
//!   second run with the same key times nothing and says how long that saved.
//! * **Pinned host buffers from a pool.** Each tile's result comes back into a
//!   [`Runtime::host_buffer`] (pinned on a GPU: one DMA copy, no staging) that the next tile
//!   reuses, placed in K by a second thread while the next tile computes.
//! * **Symmetric or not.** K of one set of states is symmetric: only the tiles on and above the
//!   diagonal are computed, the rest are their transposes (`--full` computes every tile).
//!   `--other M` computes K between the N states and M others.
//! * **Several GPUs.** `--gpus N|all` then computes the tiles again on N GPUs at once (one
//!   runtime each, [`Runtime::every_gpu`]), each GPU taking the next tile, and gathers every
//!   tile's result on GPU 0 with [`pptm::Buffer::copy_from`]: peer to peer where the GPUs allow
//!   it, never through the host. It prints the rate against one GPU's and checks the gathered
//!   tiles against K.
//!
//! Every tile is one pipeline of two items: the real parts' product, then the imaginary parts'
//! with K = Im² + Re² in its epilogue. It checks sampled rows of K against f64 (bar 1e-4 of
//! K + 1/d, 1/d being the typical size of an entry off the diagonal), and prints the rate in
//! kernel entries a second: the tiles' device work, and end to end (the whole K on the host).
//!
//!     cargo run --release --example kernel_matrix [-- --states 4096 --qubits 8 --other M
//!         --precision bf16x3|f32 --tile auto|EDGE --fraction 0.5 --budget-mb MB --full
//!         --poison --cache DIR --gpus N|all]

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::error::Error;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pptm::tiles::{Tile, TileCost, TileGrid, TilePlanner};
use pptm::tune::{TuneCache, TuneKey};
use pptm::{BackendKind, Runtime};

#[path = "../bench/src/inputs.rs"]
mod inputs;
#[path = "kernel_matrix/system.rs"]
mod system;
use system::*;

/// Tile edges are multiples of this (the tensor-core tiles' 128).
const TILE_UNIT: u64 = 128;
/// The largest edge tried: a tile's elementwise item counts its elements in 32 bits, and bigger
/// tiles gain nothing once a tile fills the GPU.
const TILE_MAX: u64 = 8192;

/// What to compute.
#[derive(Debug, Clone)]
pub struct Job {
    /// States of the rows.
    pub n: usize,
    /// States of the columns when they are another set (`None`: K of the rows' states with
    /// themselves, symmetric).
    pub other: Option<usize>,
    /// Amplitudes a state (2^q).
    pub d: usize,
    pub precision: Precision,
    /// Every tile even when K is symmetric.
    pub full: bool,
    /// A fixed tile edge instead of the tuned one.
    pub tile: Option<u64>,
    /// The fraction of free memory the tiles may use.
    pub fraction: f64,
    /// Bytes the tiles may use, instead of the fraction (`--budget-mb`).
    pub budget: Option<u64>,
    /// Fill each tile's result with NaN before it is computed (an unwritten entry shows, at the
    /// cost of a copy of the tile's size).
    pub poison: bool,
}

/// How the tile edge was chosen.
#[derive(Debug)]
pub struct EdgeChoice {
    pub edge: u64,
    /// The candidates that fit the memory budget.
    pub candidates: Vec<u64>,
    /// From the tune cache (timing nothing), and how long the tuning it skipped had taken.
    pub from_cache: bool,
    pub saved: Duration,
    /// How long choosing took in this run.
    pub took: Duration,
    /// Each timed candidate: (edge, host ns an entry, device ns an entry) of its tile.
    pub timings: Vec<(u64, f64, Option<f64>)>,
}

/// K, or what of it is kept: the rows checked, when the whole matrix is too large for the host.
pub struct Kernel {
    pub rows: usize,
    pub cols: usize,
    /// Row-major rows x cols, when kept whole.
    pub full: Option<Vec<f32>>,
    /// The checked rows' indices and values (cols each).
    pub sampled: Vec<(usize, Vec<f32>)>,
    /// Σ K over every entry, in f64 (mirrored entries counted too).
    pub checksum: f64,
}

/// A run's figures.
pub struct Outcome {
    pub kernel: Kernel,
    pub edge: EdgeChoice,
    /// Whether the operands stayed on the device for every tile.
    pub resident: bool,
    pub tiles: usize,
    /// Wall time of the tiles' device work alone (the median of three passes after a warm-up,
    /// results left on the device), and of the run end to end (operands made and uploaded,
    /// tiles computed, K on the host).
    pub device_s: f64,
    pub end_to_end_s: f64,
    /// Entries of K computed (the mirrored ones not counted).
    pub computed: u64,
}

/// Bytes a tile needs on the device: its result and one intermediate per entry, twice (the
/// end-to-end pass computes a tile while the one before is read back), plus its operands (k
/// values a row of the row operand, 2k a column of the column operands) when they are not
/// resident. (With `--gpus`, K gathered on the first GPU comes on top.)
fn tile_cost(job: &Job, resident: bool) -> TileCost {
    let k = job.precision.k(job.d) as u64;
    let b = job.precision.operand_bytes() as u64;
    TileCost {
        fixed: 0,
        per_row: if resident { 0 } else { k * b },
        per_col: if resident { 0 } else { 2 * k * b },
        per_cell: 2 * 2 * 4,
    }
}

/// The operands of every row tile and column tile, or `None` (streamed).
struct Operands {
    rows: Vec<RowOperand>,
    cols: Vec<ColOperands>,
}

fn make_operands(
    rt: &Runtime,
    rows: &States,
    cols: &States,
    edge: u64,
    precision: Precision,
) -> pptm::Result<Operands> {
    let e = edge as usize;
    let row_tiles = (0..rows.n.div_ceil(e))
        .map(|t| row_operand(rt, rows, t * e, e.min(rows.n - t * e), precision))
        .collect::<pptm::Result<Vec<_>>>()?;
    let col_tiles = (0..cols.n.div_ceil(e))
        .map(|t| col_operands(rt, cols, t * e, e.min(cols.n - t * e), precision))
        .collect::<pptm::Result<Vec<_>>>()?;
    Ok(Operands {
        rows: row_tiles,
        cols: col_tiles,
    })
}

/// Runs one tile (a pipeline of two items) and waits for it.
fn run_tile(
    rt: &Runtime,
    x: &RowOperand,
    w: &ColOperands,
    out: &mut TileBuffers,
    t: &Tile,
    k: usize,
) -> pptm::Result<Option<Duration>> {
    let mut p = rt.pipeline();
    push_tile(&mut p, x, w, out, t.rows as usize, k, t.cols as usize)?;
    Ok(p.wait()?.device_time().map(|d| d.span))
}

/// The tile edge: fixed, remembered, or tuned by timing one tile of each candidate (the
/// fastest per entry wins) and remembered.
fn choose_edge(
    rt: &Runtime,
    job: &Job,
    rows: &States,
    cols: &States,
    cache: &mut TuneCache,
) -> Result<(EdgeChoice, bool), Box<dyn Error>> {
    let start = Instant::now();
    let (n, m) = (rows.n as u64, cols.n as u64);
    let planner = match job.budget {
        Some(bytes) => TilePlanner::with_budget(bytes),
        None => TilePlanner::for_runtime(rt, job.fraction)?,
    };
    // Resident operands: the row operand of every state and the column operands of every other.
    let b = job.precision.operand_bytes() as u64;
    let k = job.precision.k(job.d) as u64;
    let operands = k * b * (n + 2 * m);
    let resident = operands <= planner.budget() / 2;
    let budget = if resident {
        planner.budget() - operands
    } else {
        planner.budget()
    };
    let candidates: Vec<u64> = TilePlanner::with_budget(budget)
        .edges(&tile_cost(job, resident), n, m, TILE_UNIT)?
        .into_iter()
        .filter(|&e| e <= TILE_MAX)
        .collect();
    if candidates.is_empty() {
        return Err(format!("no tile edge of at most {TILE_MAX} fits").into());
    }
    if let Some(e) = job.tile {
        let edge = e.clamp(1, n.max(m));
        return Ok((
            EdgeChoice {
                edge,
                candidates,
                from_cache: false,
                saved: Duration::ZERO,
                took: start.elapsed(),
                timings: Vec::new(),
            },
            resident,
        ));
    }
    let device = rt.gpu_info().map_or_else(|| "cpu".to_string(), |g| g.name);
    let key = TuneKey::new(
        "kernel_matrix.tile",
        &device,
        &format!("c64-{}", job.precision.name()),
        &[n, m, job.d as u64],
    );
    let kk = job.precision.k(job.d);
    let largest = candidates.iter().copied().max().unwrap_or(1);
    let mut timings = Vec::new();
    let tuned = cache.tune(
        &key,
        &candidates,
        |e| e.to_string(),
        |&edge| {
            // One full tile of this edge (or the whole output, if smaller), once to warm up and
            // then timed; the time per entry compares edges.
            let t = Tile {
                row0: 0,
                rows: edge.min(n),
                col0: 0,
                cols: edge.min(m),
            };
            let x = row_operand(rt, rows, 0, t.rows as usize, job.precision)?;
            let w = col_operands(rt, cols, 0, t.cols as usize, job.precision)?;
            let mut out = TileBuffers::new(rt, t.rows as usize, t.cols as usize)?;
            run_tile(rt, &x, &w, &mut out, &t, kk)?;
            let reps = 3;
            let s = Instant::now();
            let mut device = Some(Duration::ZERO);
            for _ in 0..reps {
                let span = run_tile(rt, &x, &w, &mut out, &t, kk)?;
                device = device.zip(span).map(|(a, b)| a + b);
            }
            let entries = (reps as u64 * t.rows * t.cols) as f64;
            let per_entry = s.elapsed().as_secs_f64() / entries;
            timings.push((
                edge,
                per_entry * 1e9,
                device.map(|d| d.as_secs_f64() * 1e9 / entries),
            ));
            // The time an entry, scaled to what a tile of the largest candidate would take at
            // this rate: the tuner compares rates, and the cache's times read as tiles.
            Ok(Duration::from_secs_f64(
                per_entry * (largest * largest) as f64,
            ))
        },
    )?;
    let edge = *tuned.choice;
    Ok((
        EdgeChoice {
            edge,
            candidates: candidates.clone(),
            from_cache: tuned.from_cache,
            saved: tuned.saved,
            took: start.elapsed(),
            timings,
        },
        resident,
    ))
}

/// The tiles a job computes: the upper triangle of a symmetric K (unless `job.full`), else all.
pub fn grid_for(job: &Job, symmetric: bool, n: usize, m: usize, edge: u64) -> TileGrid {
    if symmetric && !job.full {
        TileGrid::upper_triangle(n as u64, edge)
    } else {
        TileGrid::new(n as u64, m as u64, edge)
    }
}

/// Where tiles' results go on the host: K whole (when it fits the host limit), the checked rows,
/// and the sum of every entry.
struct Placer {
    m: usize,
    full: Option<Vec<f32>>,
    sampled: Vec<(usize, Vec<f32>)>,
    checksum: f64,
}

impl Placer {
    /// Places tile `t`'s values (`host`, row-major), and their transpose when `mirrored`.
    fn place(&mut self, t: &Tile, host: &[f32], mirrored: bool) {
        let m = self.m;
        let (r0, c0, tc) = (t.row0 as usize, t.col0 as usize, t.cols as usize);
        for r in 0..t.rows as usize {
            let i = r0 + r;
            let line = &host[r * tc..(r + 1) * tc];
            let sum: f64 = line.iter().map(|&v| f64::from(v)).sum();
            self.checksum += if mirrored { 2.0 * sum } else { sum };
            if let Some(kf) = self.full.as_mut() {
                kf[i * m + c0..i * m + c0 + tc].copy_from_slice(line);
                if mirrored {
                    for (c, &v) in line.iter().enumerate() {
                        kf[(c0 + c) * m + i] = v;
                    }
                }
            }
            for (si, values) in self.sampled.iter_mut() {
                if *si == i {
                    values[c0..c0 + tc].copy_from_slice(line);
                }
            }
        }
        if mirrored {
            // A checked row's entries in the tile's transpose: a column of the tile.
            for (si, values) in self.sampled.iter_mut() {
                if (c0..c0 + tc).contains(si) {
                    for r in 0..t.rows as usize {
                        values[r0 + r] = host[r * tc + (*si - c0)];
                    }
                }
            }
        }
    }
}

/// Computes K for `job` on `rt` from the given states (`cols`: `None` for K of `rows` with
/// itself), keeping the whole matrix on the host up to `host_limit` bytes, and always the rows
/// in `check_rows`.
pub fn compute(
    rt: &Runtime,
    job: &Job,
    rows: &States,
    cols: Option<&States>,
    check_rows: &[usize],
    host_limit: usize,
    cache: &mut TuneCache,
) -> Result<Outcome, Box<dyn Error>> {
    let start = Instant::now();
    let symmetric = cols.is_none();
    let cols = cols.unwrap_or(rows);
    let (n, m) = (rows.n, cols.n);
    let (edge, resident) = choose_edge(rt, job, rows, cols, cache)?;
    let e = edge.edge as usize;
    let grid = grid_for(job, symmetric, n, m, edge.edge);
    let k = job.precision.k(job.d);
    let operands = if resident {
        Some(make_operands(rt, rows, cols, edge.edge, job.precision)?)
    } else {
        None
    };

    // The device work alone: every tile, results left on the device; once to warm up (the
    // domain's manifold starts at its first item), then the median of three passes.
    let device_s = match &operands {
        Some(ops) => {
            device_pass(rt, ops, &grid, e, k)?;
            let mut passes = [0.0f64; 3];
            for t in &mut passes {
                *t = device_pass(rt, ops, &grid, e, k)?;
            }
            passes.sort_by(f64::total_cmp);
            passes[1]
        }
        None => f64::NAN,
    };

    // End to end: each tile computed, then its result read into a pinned host buffer and placed
    // in K (and its transpose) by a second thread while the next tile computes. Two sets of tile
    // buffers a tile shape take turns.
    let mut placer = Placer {
        m,
        full: (n * m * 4 <= host_limit).then(|| vec![f32::NAN; n * m]),
        sampled: check_rows.iter().map(|&i| (i, vec![f32::NAN; m])).collect(),
        checksum: 0.0,
    };
    let mirror = symmetric && !job.full;
    let (to_place, placing) = mpsc::sync_channel::<(Tile, TileBuffers)>(1);
    let (to_free, freed) = mpsc::channel::<pptm::Result<TileBuffers>>();
    let (tiles, computed) = std::thread::scope(|scope| -> Result<(usize, u64), Box<dyn Error>> {
        // Moved in, so that an error returned below drops it and the placing thread's loop
        // ends (the scope joins that thread before it returns).
        let to_place = to_place;
        let placer = &mut placer;
        scope.spawn(move || {
            for (t, bufs) in placing {
                let placed =
                    rt.host_buffer::<f32>((t.rows * t.cols) as usize)
                        .and_then(|mut host| {
                            bufs.k.read_to_host(&mut host)?;
                            placer.place(&t, &host, mirror && !t.on_diagonal());
                            Ok(())
                        });
                let failed = placed.is_err();
                let _ = to_free.send(placed.map(|()| bufs));
                if failed {
                    break;
                }
            }
        });
        let mut free: HashMap<(u64, u64), Vec<TileBuffers>> = HashMap::new();
        let mut made: HashMap<(u64, u64), usize> = HashMap::new();
        let (mut tiles, mut computed) = (0usize, 0u64);
        for t in grid.tiles() {
            let shape = (t.rows, t.cols);
            while let Ok(b) = freed.try_recv() {
                let b = b?;
                free.entry(b.shape()).or_default().push(b);
            }
            let mut out = loop {
                if let Some(b) = free.get_mut(&shape).and_then(Vec::pop) {
                    break b;
                }
                let count = made.entry(shape).or_default();
                if *count < 2 {
                    *count += 1;
                    break TileBuffers::new(rt, t.rows as usize, t.cols as usize)?;
                }
                let b = freed
                    .recv()
                    .map_err(|_| "the thread placing tiles stopped")??;
                free.entry(b.shape()).or_default().push(b);
            };
            if job.poison {
                out.k.fill(f32::NAN)?;
            }
            let (ti, tj) = ((t.row0 / edge.edge) as usize, (t.col0 / edge.edge) as usize);
            match &operands {
                Some(ops) => {
                    run_tile(rt, &ops.rows[ti], &ops.cols[tj], &mut out, &t, k)?;
                }
                None => {
                    let x = row_operand(rt, rows, t.row0 as usize, t.rows as usize, job.precision)?;
                    let w =
                        col_operands(rt, cols, t.col0 as usize, t.cols as usize, job.precision)?;
                    run_tile(rt, &x, &w, &mut out, &t, k)?;
                }
            }
            tiles += 1;
            computed += t.rows * t.cols;
            if to_place.send((t, out)).is_err() {
                break; // the placing thread failed: its error is in `freed`
            }
        }
        drop(to_place);
        for b in freed.iter() {
            b?;
        }
        Ok((tiles, computed))
    })?;
    Ok(Outcome {
        kernel: Kernel {
            rows: n,
            cols: m,
            full: placer.full,
            sampled: placer.sampled,
            checksum: placer.checksum,
        },
        edge,
        resident,
        tiles,
        device_s,
        end_to_end_s: start.elapsed().as_secs_f64(),
        computed,
    })
}

/// One set of tile buffers for each shape among `tiles`.
fn buffers_by_shape(
    rt: &Runtime,
    tiles: impl Iterator<Item = Tile>,
) -> pptm::Result<HashMap<(u64, u64), TileBuffers>> {
    let mut bufs = HashMap::new();
    for t in tiles {
        if let Entry::Vacant(v) = bufs.entry((t.rows, t.cols)) {
            v.insert(TileBuffers::new(rt, t.rows as usize, t.cols as usize)?);
        }
    }
    Ok(bufs)
}

/// Tiles a pipeline of [`device_pass`] holds: two steps a tile, some 400 bytes of plan arena, so
/// 2048 tiles stay well inside the default 4 MiB (`Config::plan_arena_bytes`).
const TILES_A_PIPELINE: usize = 2048;

/// Every tile in pipelines of [`TILES_A_PIPELINE`] tiles (one submission per domain each), the
/// tiles of a shape sharing that shape's buffers: the pipeline orders their reuse on the device.
/// Returns the wall time.
fn device_pass(
    rt: &Runtime,
    ops: &Operands,
    grid: &TileGrid,
    e: usize,
    k: usize,
) -> pptm::Result<f64> {
    let mut bufs = buffers_by_shape(rt, grid.tiles())?;
    let tiles: Vec<Tile> = grid.tiles().collect();
    let split = matches!(ops.rows.first(), Some(RowOperand::Split(_)));
    let start = Instant::now();
    for chunk in tiles.chunks(TILES_A_PIPELINE) {
        let mut p = rt.pipeline();
        let mut outs = HashMap::new();
        for (shape, b) in bufs.iter_mut() {
            outs.insert(*shape, (p.output(&mut b.re), p.output(&mut b.k)));
        }
        let xs: Vec<_> = ops
            .rows
            .iter()
            .map(|x| match x {
                RowOperand::F32(b) => p.input(b),
                RowOperand::Split(b) => p.input(b),
            })
            .collect();
        let ws: Vec<_> = ops
            .cols
            .iter()
            .map(|w| match w {
                ColOperands::F32 { re, im } => (p.input(re), p.input(im)),
                ColOperands::Split { re, im } => (p.input(re), p.input(im)),
            })
            .collect();
        for t in chunk {
            let (ti, tj) = (t.row0 as usize / e, t.col0 as usize / e);
            let (re, kk) = outs[&(t.rows, t.cols)];
            let (x, (wr, wi)) = (xs[ti], ws[tj]);
            let (rows, cols) = (t.rows as usize, t.cols as usize);
            if split {
                ProductSplit::push(&mut p, x, wr, re, rows, k, cols)?;
                ProductModulusSplit::push(&mut p, x, wi, re, kk, rows, k, cols)?;
            } else {
                ProductF32::push(&mut p, x, wr, re, rows, k, cols)?;
                ProductModulusF32::push(&mut p, x, wi, re, kk, rows, k, cols)?;
            }
        }
        p.wait()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// What [`sharded`] returns: every tile's K gathered on the first runtime, and how the work went.
pub struct Sharded {
    /// Each tile and its K (rows x cols, row-major) in a buffer of the first runtime.
    pub tiles: Vec<(Tile, pptm::Buffer<f32>)>,
    /// Wall time of the tiles' computation and gathering, operands already resident and every
    /// runtime warmed up by one tile.
    pub seconds: f64,
    /// Tiles each runtime computed.
    pub per_runtime: Vec<usize>,
    /// Whether each runtime's results reached the first one's buffers straight (the first: its
    /// own device; another GPU: peer access; the CPU backend: never).
    pub peer: Vec<bool>,
}

/// The tiles of `grid` (edge `edge`) on every runtime of `rts` at once: a thread a runtime, each
/// with the operands resident on its device, each taking the next tile no one has taken (a
/// faster device takes more), and each tile's K copied into a buffer of `rts[0]` with
/// [`pptm::Buffer::copy_from`], peer to peer between GPUs where they allow it: the matrix is
/// gathered on the first device without passing through the host.
pub fn sharded(
    rts: &[Runtime],
    job: &Job,
    rows: &States,
    cols: &States,
    grid: &TileGrid,
) -> Result<Sharded, Box<dyn Error>> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let first = rts.first().ok_or("sharded: no runtime")?;
    let tiles: Vec<Tile> = grid.tiles().collect();
    let e = grid.edge();
    let k = job.precision.k(job.d);
    // Per runtime: its operands and a set of tile buffers a shape, made before the clock starts;
    // the gathered tiles' buffers on the first runtime too (they are K's storage).
    let mut setups = Vec::new();
    for rt in rts {
        let ops = make_operands(rt, rows, cols, e, job.precision)?;
        let bufs = buffers_by_shape(rt, tiles.iter().copied())?;
        setups.push((ops, bufs));
    }
    let gathered: Vec<Mutex<pptm::Buffer<f32>>> = tiles
        .iter()
        .map(|t| {
            let mut b = first.alloc::<f32>((t.rows * t.cols) as usize)?;
            b.fill(f32::NAN)?;
            Ok(Mutex::new(b))
        })
        .collect::<pptm::Result<_>>()?;
    // Each runtime runs one tile before the clock starts: a runtime's first submission starts its
    // manifold on that GPU (module load, launch), which would otherwise fall into the sharing and
    // send most tiles to the runtimes that were warm already.
    if let Some(t) = tiles.first() {
        for (rt, (ops, bufs)) in rts.iter().zip(setups.iter_mut()) {
            let out = bufs.get_mut(&(t.rows, t.cols)).expect("a set a shape");
            let (ti, tj) = ((t.row0 / e) as usize, (t.col0 / e) as usize);
            run_tile(rt, &ops.rows[ti], &ops.cols[tj], out, t, k)?;
        }
    }
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let per_runtime = std::thread::scope(
        |scope| -> Result<Vec<usize>, Box<dyn Error + Send + Sync>> {
            let handles: Vec<_> = rts
                .iter()
                .zip(setups.iter_mut())
                .map(|(rt, (ops, bufs))| {
                    let (tiles, gathered, next) = (&tiles, &gathered, &next);
                    scope.spawn(move || -> pptm::Result<usize> {
                        let mut done = 0;
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(t) = tiles.get(i) else {
                                return Ok(done);
                            };
                            let out = bufs.get_mut(&(t.rows, t.cols)).expect("a set a shape");
                            let (ti, tj) = ((t.row0 / e) as usize, (t.col0 / e) as usize);
                            run_tile(rt, &ops.rows[ti], &ops.cols[tj], out, t, k)?;
                            gathered[i]
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .copy_from(&out.k)?;
                            done += 1;
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a tile thread").map_err(Into::into))
                .collect()
        },
    )
    .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Sharded {
        tiles: tiles
            .into_iter()
            .zip(gathered)
            .map(|(t, b)| (t, b.into_inner().unwrap_or_else(|p| p.into_inner())))
            .collect(),
        seconds,
        per_runtime,
        peer: rts.iter().map(|rt| first.peer_access(rt)).collect(),
    })
}

/// Whether every gathered tile equals K's entries there (bit for bit: every device runs the same
/// code on the same operands), with `full` K row-major of `m` columns.
pub fn gathered_matches(gathered: &Sharded, full: &[f32], m: usize) -> pptm::Result<bool> {
    for (t, b) in &gathered.tiles {
        let v = b.to_vec()?;
        for r in 0..t.rows as usize {
            let at = (t.row0 as usize + r) * m + t.col0 as usize;
            let want = &full[at..at + t.cols as usize];
            let got = &v[r * t.cols as usize..(r + 1) * t.cols as usize];
            if got
                .iter()
                .zip(want)
                .any(|(g, w)| g.to_bits() != w.to_bits())
            {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Whole matrices up to this size are kept on the host; larger ones keep the checked rows.
const HOST_LIMIT: usize = 4 << 30;

/// The worst error of the checked rows against f64: |K − K_f64| over K_f64 + 1/d (the typical
/// size of an entry between random states is 1/d; the diagonal is 1), and the largest absolute
/// error. A NaN (an entry never written) is an infinite error.
pub fn check(kernel: &Kernel, rows: &States, cols: &States) -> (f64, f64) {
    let floor = 1.0 / rows.d as f64;
    let rows_to_check: Vec<(usize, &[f32])> = match &kernel.full {
        Some(k) => (0..kernel.rows)
            .filter(|i| kernel.rows <= 64 || kernel.sampled.iter().any(|(s, _)| s == i))
            .map(|i| (i, &k[i * kernel.cols..(i + 1) * kernel.cols]))
            .collect(),
        None => kernel.sampled.iter().map(|(i, v)| (*i, &v[..])).collect(),
    };
    let worst: Vec<(f64, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = rows_to_check
            .iter()
            .map(|&(i, values)| {
                scope.spawn(move || {
                    let (mut rel, mut abs) = (0.0f64, 0.0f64);
                    for (j, &v) in values.iter().enumerate() {
                        let want = rows.kernel_f64(i, cols, j);
                        let err = (f64::from(v) - want).abs();
                        let err = if err.is_nan() { f64::INFINITY } else { err };
                        rel = rel.max(err / (want + floor));
                        abs = abs.max(err);
                    }
                    (rel, abs)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a check thread"))
            .collect()
    });
    worst
        .into_iter()
        .fold((0.0, 0.0), |(r, a), (r2, a2)| (r.max(r2), a.max(a2)))
}

fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, Box<dyn Error>> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => {
            let v = args
                .get(i + 1)
                .ok_or_else(|| format!("{name} needs a value"))?;
            Ok(Some(
                v.parse()
                    .map_err(|_| format!("{name}: cannot read `{v}`"))?,
            ))
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    const VALUED: [&str; 9] = [
        "--states",
        "--qubits",
        "--other",
        "--precision",
        "--tile",
        "--fraction",
        "--budget-mb",
        "--cache",
        "--gpus",
    ];
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            a if VALUED.contains(&a) => i += 2,
            "--full" | "--poison" => i += 1,
            a => return Err(format!("unknown argument `{a}` (see the example's docs)").into()),
        }
    }
    // With --gpus, every GPU's runtime is opened first, before any manifold runs, so that
    // peer access between them can be enabled; the first is the main runtime.
    let gpus_wanted = flag::<String>(&args, "--gpus")?;
    let mut group = match &gpus_wanted {
        None => Vec::new(),
        Some(w) => {
            let all = Runtime::every_gpu(&pptm::Config::default())
                .map_err(|e| format!("--gpus: cannot open the GPUs: {e}"))?;
            let count = match w.as_str() {
                "all" => all.len(),
                c => c
                    .parse::<usize>()
                    .ok()
                    .filter(|&c| c >= 1)
                    .ok_or_else(|| format!("--gpus {c}: a count of at least 1, or all"))?,
            };
            if count > all.len() {
                return Err(format!("--gpus {count}: this host has {}", all.len()).into());
            }
            all.into_iter().take(count).collect()
        }
    };
    let rt = if group.is_empty() {
        Runtime::new()?
    } else {
        group.remove(0)
    };
    let gpu = rt.backend() == BackendKind::Gpu;
    println!("kernel_matrix: {}", rt.describe());
    let n: usize = flag(&args, "--states")?.unwrap_or(if gpu { 4096 } else { 256 });
    let q: u32 = flag(&args, "--qubits")?.unwrap_or(if gpu { 8 } else { 5 });
    if n == 0 || q > 14 {
        return Err("--states must be at least 1 and --qubits at most 14".into());
    }
    let other: Option<usize> = flag(&args, "--other")?;
    if other == Some(0) {
        return Err("--other must be at least 1".into());
    }
    let precision = match flag::<String>(&args, "--precision")?.as_deref() {
        None | Some("bf16x3") => Precision::Bf16x3,
        Some("f32") => Precision::F32,
        Some(p) => return Err(format!("--precision {p}: bf16x3 or f32").into()),
    };
    let tile = match flag::<String>(&args, "--tile")?.as_deref() {
        None | Some("auto") => None,
        Some(t) => Some(
            t.parse::<u64>()
                .ok()
                .filter(|&e| e > 0)
                .ok_or_else(|| format!("--tile {t}: auto or a positive edge"))?,
        ),
    };
    let job = Job {
        n,
        other,
        d: 1 << q,
        precision,
        full: args.iter().any(|a| a == "--full"),
        tile,
        fraction: flag(&args, "--fraction")?.unwrap_or(0.5),
        budget: flag::<u64>(&args, "--budget-mb")?.map(|mb| mb << 20),
        poison: args.iter().any(|a| a == "--poison"),
    };
    let mut cache = match flag::<String>(&args, "--cache")? {
        Some(dir) => TuneCache::open(std::path::Path::new(&dir).join(pptm::tune::FILE_NAME)),
        None => TuneCache::open_default(),
    };
    let rows = States::random(n, job.d, 11, inputs::uniform);
    let cols = other.map(|m| States::random(m, job.d, 13, inputs::uniform));
    let m = cols.as_ref().map_or(n, |c| c.n);
    println!(
        "  {n} x {m} kernel entries, states of {} amplitudes (q = {q}), {}; products {}",
        job.d,
        if cols.is_some() {
            "two sets"
        } else {
            "one set (symmetric)"
        },
        match precision {
            Precision::Bf16x3 => {
                "bf16x3 (three bf16 products on tensor cores: each term to about 2^-16)"
            }
            Precision::F32 => "f32 on CUDA cores",
        }
    );
    let mut check_rows: Vec<usize> = vec![0, 1, n / 3, n / 2, 2 * n / 3, n - 2, n - 1];
    check_rows.retain(|&r| r < n);
    check_rows.sort_unstable();
    check_rows.dedup();

    let out = compute(
        &rt,
        &job,
        &rows,
        cols.as_ref(),
        &check_rows,
        HOST_LIMIT,
        &mut cache,
    )?;
    if let Err(e) = cache.save() {
        // The choice still served this run; only the next one will tune again.
        eprintln!("kernel_matrix: warning: the tune cache was not saved: {e}");
    }
    let e = &out.edge;
    if e.from_cache {
        println!(
            "  tile edge {} from the tune cache ({}): {:.1} ms here, {:.2} s of tuning saved",
            e.edge,
            cache
                .path()
                .map_or("in memory".into(), |p| p.display().to_string()),
            e.took.as_secs_f64() * 1e3,
            e.saved.as_secs_f64()
        );
    } else if job.tile.is_some() {
        println!(
            "  tile edge {} (fixed; {:?} fit the memory)",
            e.edge, e.candidates
        );
    } else {
        println!(
            "  tile edge {} tuned over {:?} in {:.2} s, kept in {}",
            e.edge,
            e.candidates,
            e.took.as_secs_f64(),
            cache
                .path()
                .map_or("memory only".into(), |p| p.display().to_string())
        );
        for (edge, host, device) in &e.timings {
            let device = device.map_or("-".to_string(), |d| format!("{d:.3}"));
            println!("    edge {edge}: {host:.3} ns an entry end to end, {device} on the device");
        }
    }
    println!(
        "  {} tiles, operands {}",
        out.tiles,
        if out.resident {
            "resident"
        } else {
            "uploaded per tile"
        }
    );
    let (rel, abs) = check(&out.kernel, &rows, cols.as_ref().unwrap_or(&rows));
    println!(
        "  against f64 over {} rows: worst error {rel:.2e} of (K + 1/d), {abs:.2e} absolute; Σ K = {:.6e}",
        if out.kernel.full.is_some() && n <= 64 {
            n
        } else {
            check_rows.len()
        },
        out.kernel.checksum
    );
    // A complex multiply-add is 8 real flops, as a complex64 product counts them.
    let flops = 8.0 * out.computed as f64 * job.d as f64;
    if out.device_s.is_finite() {
        println!(
            "  device work: {:.3} ms for {} computed entries of {} ({:.3e} computed entries/s, \
             {:.1} TFLOP/s as complex64 flops)",
            out.device_s * 1e3,
            out.computed,
            n * m,
            out.computed as f64 / out.device_s,
            flops / out.device_s / 1e12
        );
    }
    println!(
        "  end to end (operands made and uploaded, tuning, K on the host): {:.3} s, {:.3e} entries/s",
        out.end_to_end_s,
        out.computed as f64 / out.end_to_end_s
    );
    let pool = rt.host_pool_stats();
    println!(
        "  host buffers: {} allocated, {} reused ({})",
        pool.allocations,
        pool.reuses,
        if gpu { "pinned" } else { "host memory" }
    );
    if rel > 1e-4 {
        return Err(
            format!("kernel entries off by {rel:.2e} of (K + 1/d): the bar is 1e-4").into(),
        );
    }
    if gpus_wanted.is_some() {
        group.insert(0, rt);
        let grid = grid_for(&job, cols.is_none(), n, m, out.edge.edge);
        let cols = cols.as_ref().unwrap_or(&rows);
        let one = sharded(&group[..1], &job, &rows, cols, &grid)?;
        let all = sharded(&group, &job, &rows, cols, &grid)?;
        let rate = |s: &Sharded| out.computed as f64 / s.seconds;
        println!(
            "  {} GPU(s), tiles gathered on GPU 0: {:.3e} entries/s, {:.2}x one GPU's {:.3e} \
             (tiles each {:?}, peer access {:?})",
            group.len(),
            rate(&all),
            rate(&all) / rate(&one),
            rate(&one),
            all.per_runtime,
            all.peer
        );
        match &out.kernel.full {
            Some(full) => {
                for (what, s) in [("one GPU", &one), ("all GPUs", &all)] {
                    if !gathered_matches(s, full, m)? {
                        return Err(format!("the tiles gathered from {what} differ from K").into());
                    }
                }
                println!("  gathered tiles identical to K computed on one GPU");
            }
            None => println!("  (K too large to keep on the host: gathered tiles not compared)"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(
        n: usize,
        other: Option<usize>,
        d: usize,
        precision: Precision,
        full: bool,
        tile: Option<u64>,
    ) -> Job {
        Job {
            n,
            other,
            d,
            precision,
            full,
            tile,
            fraction: 0.5,
            budget: None,
            poison: true,
        }
    }

    /// Every entry against f64, for both precisions, symmetric (triangle and full) and two sets,
    /// several tiles with edge tiles, and sizes of 1: the CPU backend (the GPU suite runs the
    /// example's main on a GPU).
    #[test]
    fn kernel_matches_f64() {
        let rt = Runtime::cpu();
        let mut cache = TuneCache::in_memory();
        for precision in [Precision::Bf16x3, Precision::F32] {
            for (n, other, full, tile) in [
                (37, None, false, Some(8)),
                (37, None, true, Some(16)),
                (23, Some(41), false, Some(8)),
                (1, None, false, None),
                (7, Some(1), false, None),
            ] {
                let d = 16;
                let rows = States::random(n, d, 3, inputs::uniform);
                let cols = other.map(|m| States::random(m, d, 5, inputs::uniform));
                let j = job(n, other, d, precision, full, tile);
                let out =
                    compute(&rt, &j, &rows, cols.as_ref(), &[0], usize::MAX, &mut cache).unwrap();
                let k = out.kernel.full.as_ref().expect("kept whole");
                assert!(
                    k.iter().all(|v| v.is_finite()),
                    "an entry was never written"
                );
                let (rel, abs) = check(&out.kernel, &rows, cols.as_ref().unwrap_or(&rows));
                let bar = if precision == Precision::F32 {
                    1e-6
                } else {
                    1e-4
                };
                assert!(
                    rel < bar,
                    "{precision:?} {n} x {other:?}: {rel:e} ({abs:e} absolute)"
                );
                let sum: f64 = k.iter().map(|&v| f64::from(v)).sum();
                assert!((sum - out.kernel.checksum).abs() < 1e-6 * sum.max(1.0));
                if other.is_none() {
                    for i in 0..n {
                        assert!(
                            (k[i * n + i] - 1.0).abs() < 1e-4,
                            "normalised states: K_ii = 1"
                        );
                    }
                }
            }
        }
    }

    /// The second run with the same key takes the tuned edge from the file and times nothing.
    #[test]
    fn tuned_edge_is_kept_on_disk() {
        let dir = std::env::temp_dir().join(format!("pptm-kernel-matrix-{}", std::process::id()));
        let path = dir.join(pptm::tune::FILE_NAME);
        let _ = std::fs::remove_file(&path);
        let rt = Runtime::cpu();
        let n = 300; // candidates 128, 256 and 384
        let rows = States::random(n, 8, 7, inputs::uniform);
        let j = job(n, None, 8, Precision::Bf16x3, false, None);
        let mut cache = TuneCache::open(&path);
        let first = compute(&rt, &j, &rows, None, &[5], usize::MAX, &mut cache).unwrap();
        cache.save().unwrap();
        assert!(!first.edge.from_cache);
        assert_eq!(first.edge.candidates, vec![128, 256, 384]);
        // The choice is the candidate with the lowest time an entry (not the shortest tile).
        let timed: Vec<u64> = first.edge.timings.iter().map(|t| t.0).collect();
        assert_eq!(timed, first.edge.candidates);
        let fastest = first
            .edge
            .timings
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(first.edge.edge, fastest.0, "{:?}", first.edge.timings);
        let mut again = TuneCache::open(&path);
        let second = compute(&rt, &j, &rows, None, &[5], usize::MAX, &mut again).unwrap();
        assert!(second.edge.from_cache);
        assert_eq!(second.edge.edge, first.edge.edge);
        assert!(second.edge.saved > Duration::ZERO);
        assert_eq!(second.kernel.full, first.kernel.full);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Tiles shared over two runtimes (two CPU backends here; GPUs on a GPU host) and gathered
    /// on the first equal K computed on one, bit for bit, and every tile is computed once.
    #[test]
    fn sharded_tiles_gather_to_the_same_kernel() {
        let rts = [Runtime::cpu(), Runtime::cpu()];
        let (n, d) = (45, 8);
        let rows = States::random(n, d, 9, inputs::uniform);
        let j = job(n, None, d, Precision::Bf16x3, false, Some(16));
        let mut cache = TuneCache::in_memory();
        let out = compute(&rts[0], &j, &rows, None, &[], usize::MAX, &mut cache).unwrap();
        let grid = grid_for(&j, true, n, n, 16);
        let s = sharded(&rts, &j, &rows, &rows, &grid).unwrap();
        assert_eq!(s.tiles.len(), grid.len());
        assert_eq!(s.per_runtime.iter().sum::<usize>(), grid.len());
        assert_eq!(
            s.peer,
            [false, false],
            "the CPU backend copies through the host"
        );
        assert!(gathered_matches(&s, out.kernel.full.as_ref().unwrap(), n).unwrap());
        // A wrong entry is seen.
        let mut wrong = out.kernel.full.clone().unwrap();
        wrong[n + 40] += 1e-3;
        assert!(!gathered_matches(&s, &wrong, n).unwrap());
    }

    /// A budget too small for the operands to stay resident streams them, a tile's at a time,
    /// with the same result; one too small for the smallest tile is a typed error.
    #[test]
    fn operands_stream_when_they_do_not_fit() {
        let rt = Runtime::cpu();
        let mut cache = TuneCache::in_memory();
        let (n, d) = (200, 64);
        let rows = States::random(n, d, 21, inputs::uniform);
        // One tile edge for both, so that each entry is computed by the same tile (a mirrored
        // entry sums the split's three products in another order).
        let resident = job(n, None, d, Precision::Bf16x3, false, Some(128));
        let a = compute(&rt, &resident, &rows, None, &[], usize::MAX, &mut cache).unwrap();
        assert!(a.resident);
        // Operands: 3 n k 2 bytes = 460,800 (k = 384), more than half the budget; a tile of edge
        // 128 streamed: 128 x 128 x 16 + 3 x 128 x 384 x 2 = 557,056; of 256 (200 x 200 here):
        // 1,100,800.
        let streamed = Job {
            budget: Some(600_000),
            ..job(n, None, d, Precision::Bf16x3, false, Some(128))
        };
        let b = compute(&rt, &streamed, &rows, None, &[], usize::MAX, &mut cache).unwrap();
        assert!(!b.resident);
        assert_eq!(b.edge.candidates, vec![128]);
        assert!(
            b.device_s.is_nan(),
            "no device pass without resident operands"
        );
        assert_eq!(a.kernel.full, b.kernel.full);
        let tiny = Job {
            budget: Some(1000),
            ..resident
        };
        let err = compute(&rt, &tiny, &rows, None, &[], usize::MAX, &mut cache)
            .err()
            .unwrap();
        assert!(err.to_string().contains("no tile fits"), "{err}");
    }

    /// Bad inputs are errors, not panics.
    #[test]
    fn bad_jobs_are_errors() {
        let rt = Runtime::cpu();
        let rows = States::random(4, 4, 1, inputs::uniform);
        let mut cache = TuneCache::in_memory();
        let mut j = job(4, None, 4, Precision::F32, false, None);
        j.fraction = 0.0;
        assert!(compute(&rt, &j, &rows, None, &[], usize::MAX, &mut cache).is_err());
        // Operands of two precisions in one tile.
        let x = row_operand(&rt, &rows, 0, 4, Precision::F32).unwrap();
        let w = col_operands(&rt, &rows, 0, 4, Precision::Bf16x3).unwrap();
        let mut out = TileBuffers::new(&rt, 4, 4).unwrap();
        let mut p = rt.pipeline();
        assert!(matches!(
            push_tile(&mut p, &x, &w, &mut out, 4, 8, 4),
            Err(pptm::Error::BadArguments { .. })
        ));
    }
}

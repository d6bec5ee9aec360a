//! Molecular dynamics with a learned-style force field, written with pptm's general mechanisms:
//! ops of this file's own (`#[pptm::op]` with loops over tables), states, and a pipeline whose
//! device-side loop runs a whole trajectory as one submission. examples/md.rs runs it and
//! pptm-bench times it (case `md`); both declare this file as a module.
//!
//! The model is bench/peers_md.py's, fixed there in PyTorch (its weights come from the same
//! splitmix64 streams, so the two compute the same function):
//!
//! * n atoms of unit mass, free boundaries; a Verlet list of the pairs within r_c + skin, held as
//!   an n x M table of indices (padding: the atom itself), rebuilt on the device (from all pairs,
//!   or by a cell list from [`CELL_LIST_FROM`] atoms) before a step at which some atom has moved
//!   skin / 2 or more since the list was built: the device measures that before every step and
//!   decides ([`pptm::Pipeline::when`]);
//! * each step, an n x M table of edges (neighbour, distance, unit vector) from the list;
//! * 16 Gaussian radial basis functions of the distance, times a cosine cutoff at r_c;
//! * 3 interaction blocks of width F (64 or 128): x = h W_in; a continuous filter
//!   W(r) = (ssp(rbf(r) W₁ + b₁) W₂ + b₂) f_c(r); m_i = Σ_j x_j ⊙ W(r_ij);
//!   h ← h + ssp(m W_o1 + b_o1) W_o2 + b_o2;
//! * a readout E_i = ssp(h W_r1 + b_r1) W_r2 + b_r2, E = Σ_i E_i;
//! * forces −∂E/∂x by a backward pass written as ops of their own (below), and velocity Verlet.
//!
//! The filter network depends on one number, the distance, so each block's filter and its
//! derivative are tabulated once per model on a grid of [`FILTER_POINTS`] distances (an op, on
//! the device) and read by cubic Hermite interpolation. The energy the steps integrate is that
//! interpolant's, and the forces are its exact gradient; it differs from the network's own
//! values by O(h⁴) (about 1e-9 relative here), which the example checks against the
//! network evaluated directly ([`reference_energy`]).
//!
//! Work is spread as one element a thread: (atom, feature) for the dense layers and the
//! convolutions, (atom, slot) for the list and the edges, one atom for the Verlet step. Each op
//! finds its element's coordinates from an index tensor (0, 1, 2, ...). The dense layers, the
//! convolutions and the Verlet step give each element 8 threads (`#[op(lanes = 8)]`), which
//! share its loop (over inputs, edges or features: `for s in lanes(a..b)`) where the elements
//! are too few to fill the GPU one a thread (docs/ops.md, "Lanes").

use pptm::ops::{MaxReduction, SumReduction};
use pptm::{
    Buffer, FusionBuilder, PipeInput, PipeItem, PipeOutput, Pipeline, Runtime, State, Table, op,
};

/// The cutoff radius of the model.
pub const R_CUT: f64 = 5.0;
/// The list holds pairs within R_CUT + SKIN.
pub const SKIN: f64 = 1.0;
/// Gaussian radial basis functions.
pub const K_RBF: usize = 16;
/// The time step.
pub const DT: f64 = 1e-3;
/// Interaction blocks.
pub const BLOCKS: usize = 3;
/// Lattice spacing, jitter and initial speed of the start configuration.
pub const SPACING: f64 = 1.5;
pub const JITTER: f64 = 0.1;
pub const V0: f64 = 1.0;
/// Distances at which each block's filter is tabulated, over [0, R_CUT].
pub const FILTER_POINTS: usize = 512;
/// The list is rebuilt before a step at which an atom has moved this far (squared) since it was
/// built: (skin / 2)². Until then every pair within r_c is in the list (each atom of a pair has
/// moved less than skin / 2, so the pair was within r_c + skin at the build).
pub const REBUILD_AT: f64 = (SKIN / 2.0) * (SKIN / 2.0);
/// Verlet steps of one iteration of a run's device-side loop: the two halves of the state's
/// ping-pong buffers. A run is a whole number of iterations.
pub const STEPS_PER_ITERATION: usize = 2;
/// The cell list's cells: a little more than the list's reach R_CUT + SKIN, so that f32 rounding
/// of a coordinate over the side cannot put two atoms within reach two cells apart.
pub const CELL_SIDE: f64 = 1.01 * (R_CUT + SKIN);
/// Atoms from which the list is built by the cell list (five passes, each about 27 x (log n + an
/// occupied cell) an element, the sort n an atom) rather than from all pairs (one pass, n an
/// element): below it the all-pairs pass is the quicker.
pub const CELL_LIST_FROM: usize = 512;

/// One atom: position and velocity (at the half step, between the pipeline's Verlet steps).
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Atom {
    pub x: f64,
    pub y: f64,
    pub z: f64,
    pub vx: f64,
    pub vy: f64,
    pub vz: f64,
}

/// A row of the sorted cell list: an atom and its cell key.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct SortedAtom {
    pub atom: f64,
    pub key: f64,
}

/// A tabulated filter value and its derivative in the grid coordinate (distance over the grid's
/// spacing).
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct FilterPoint {
    pub w: f64,
    pub dw: f64,
}

/// One slot of an atom's edges: the neighbour's index, the distance (R_CUT or more: no edge),
/// and the unit vector from the atom to the neighbour.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Edge {
    pub j: f64,
    pub r: f64,
    pub ux: f64,
    pub uy: f64,
    pub uz: f64,
}

/// What the backward convolution gives for (atom, feature): `g`, the gradient of the energy with
/// respect to the block's input x at that feature, and (px, py, pz), that feature's share of
/// ∂E/∂position of the atom, summed over the blocks done so far.
#[derive(Debug, Clone, Copy, PartialEq, pptm::State)]
#[repr(C)]
pub struct Partial {
    pub g: f64,
    pub px: f64,
    pub py: f64,
    pub pz: f64,
}

/// Filter value and derivative of one block at grid point `idx / F` (distance
/// (idx / F) R_CUT / (points − 1)), feature `idx % F`: the filter network evaluated directly, in
/// f64 on the CPU backend. `l1`: W₁ (K x F) with b₁ as its last row; `l2`: W₂ (F x F) with b₂.
#[op(f32_form)]
pub fn filter_sample(idx: f64, l1: Table, l2: Table, cutoff: f32, points: u32) -> FilterPoint {
    let width = l2.cols();
    let basis_n = l1.rows() - 1;
    let hidden = l2.rows() - 1;
    let e = idx as u32;
    let f = e % width;
    let rc = cutoff as f64;
    let r = (e / width) as f64 * rc / (points as f64 - 1.0);
    let spacing = rc / (basis_n as f64 - 1.0);
    let gamma = 0.5 / (spacing * spacing);
    let mut acc = l2.at(hidden, f);
    let mut dacc = 0.0_f64;
    for g in 0..hidden {
        let mut pre = l1.at(basis_n, g);
        let mut dpre = 0.0_f64;
        for k in 0..basis_n {
            let d = r - k as f64 * spacing;
            let basis = (-gamma * d * d).exp();
            pre += basis * l1.at(k, g);
            dpre += -2.0 * gamma * d * basis * l1.at(k, g);
        }
        // ssp(pre) = ln(1 + e^pre) − ln 2, and its derivative σ(pre), computed stably.
        let ssp = pre.max(0.0) + (-pre.abs()).exp().ln_1p() - std::f64::consts::LN_2;
        let sigmoid = 1.0 / (1.0 + (-pre).exp());
        acc += ssp * l2.at(g, f);
        dacc += sigmoid * dpre * l2.at(g, f);
    }
    let phase = std::f64::consts::PI * r / rc;
    let mut fc = 0.0_f64;
    let mut dfc = 0.0_f64;
    if r < rc {
        fc = 0.5 * (phase.cos() + 1.0);
        dfc = -0.5 * std::f64::consts::PI / rc * phase.sin();
    }
    // The derivative per grid spacing h, as the interpolation reads it.
    FilterPoint {
        w: acc * fc,
        dw: (dacc * fc + acc * dfc) * rc / (points as f64 - 1.0),
    }
}

/// Atom `idx / M`'s neighbour in slot `idx % M` (M = `slots`): the slot-th atom, in index
/// order, within `reach` of it, or the atom itself where it has fewer. `pos` holds the atoms'
/// states (n x 6, position first).
#[op(f32_form)]
pub fn neighbour(idx: f64, pos: Table, reach: f32, slots: u32) -> f64 {
    let e = idx as u32;
    let i = e / slots;
    let want = e % slots;
    let xi = pos.at(i, 0);
    let yi = pos.at(i, 1);
    let zi = pos.at(i, 2);
    let reach2 = reach as f64 * reach as f64;
    let mut found = i as f64;
    let mut count = 0_u32;
    for j in 0..pos.rows() {
        let dx = pos.at(j, 0) - xi;
        let dy = pos.at(j, 1) - yi;
        let dz = pos.at(j, 2) - zi;
        if j != i && dx * dx + dy * dy + dz * dz < reach2 {
            if count == want {
                found = j as f64;
            }
            count += 1;
        }
    }
    found
}

/// The cell list: atoms binned into cubic cells of side [`CELL_SIDE`] (more than the list's
/// reach, so an atom's neighbours lie in the 27 cells around its own), the cells' integer
/// coordinates wrapped modulo 32 into one key (two cells that far apart share a key;
/// the distance test below tells their atoms apart). The atoms are sorted by key (a rank each,
/// then the atom of each rank); an atom's neighbours are then found by binary search of the 27
/// keys in the sorted keys and a walk over those cells' atoms: about 27 x (log n + an occupied
/// cell) work an element, where the all-pairs [`neighbour`] takes n.
///
/// Atom `idx`'s cell key. `pos` holds the atoms' states (n x 6, position first).
#[op(f32_form)]
pub fn cell_key(idx: f64, pos: Table, side: f32) -> f64 {
    let i = idx as u32;
    let g = 32.0_f64;
    let cx = (pos.at(i, 0) / side as f64).floor();
    let cy = (pos.at(i, 1) / side as f64).floor();
    let cz = (pos.at(i, 2) / side as f64).floor();
    (cx - g * (cx / g).floor())
        + g * ((cy - g * (cy / g).floor()) + g * (cz - g * (cz / g).floor()))
}

/// Atom `idx`'s place in the order of (key, index): how many atoms come before it.
#[op(f32_form)]
pub fn cell_rank(idx: f64, keys: Table) -> f64 {
    let i = idx as u32;
    let ki = keys.at(i, 0);
    let mut rank = 0.0_f64;
    for j in 0..keys.rows() {
        let kj = keys.at(j, 0);
        if kj < ki || (kj == ki && j < i) {
            rank += 1.0;
        }
    }
    rank
}

/// The atom of rank `idx` and its key: row `idx` of the sorted cell list.
#[op(f32_form)]
pub fn cell_entry(idx: f64, ranks: Table, keys: Table) -> SortedAtom {
    let mut out = SortedAtom {
        atom: 0.0,
        key: -1.0,
    };
    for i in 0..ranks.rows() {
        if ranks.at(i, 0) == idx {
            out.atom = i as f64;
            out.key = keys.at(i, 0);
        }
    }
    out
}

/// Neighbours within `reach` of atom `idx / 27` in the `idx % 27`-th cell around its own (cells
/// (dx, dy, dz) in {-1, 0, 1}^3, x fastest). `cells` is the sorted cell list (n x 2: atom, key).
#[op(f32_form)]
pub fn cell_count(idx: f64, pos: Table, cells: Table, side: f32, reach: f32) -> f64 {
    let e = idx as u32;
    let i = e / 27;
    let c = e % 27;
    let g = 32.0_f64;
    let size = side as f64;
    let xi = pos.at(i, 0);
    let yi = pos.at(i, 1);
    let zi = pos.at(i, 2);
    let nx = (xi / size).floor() + (c % 3) as f64 - 1.0;
    let ny = (yi / size).floor() + ((c / 3) % 3) as f64 - 1.0;
    let nz = (zi / size).floor() + (c / 9) as f64 - 1.0;
    let key = (nx - g * (nx / g).floor())
        + g * ((ny - g * (ny / g).floor()) + g * (nz - g * (nz / g).floor()));
    // The cell's rows of the sorted list: [first row of key, first row past it).
    let n = cells.rows();
    let mut lo = 0_u32;
    let mut hi = n;
    for _b in 0..32_u32 {
        if lo < hi {
            let mid = (lo + hi) / 2;
            if cells.at(mid, 1) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
    }
    let first = lo;
    hi = n;
    for _b in 0..32_u32 {
        if lo < hi {
            let mid = (lo + hi) / 2;
            if cells.at(mid, 1) < key + 0.5 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
    }
    let reach2 = reach as f64 * reach as f64;
    let mut count = 0.0_f64;
    for s in first..lo {
        let j = cells.at(s, 0) as u32;
        let dx = pos.at(j, 0) - xi;
        let dy = pos.at(j, 1) - yi;
        let dz = pos.at(j, 2) - zi;
        if j != i && dx * dx + dy * dy + dz * dz < reach2 {
            count += 1.0;
        }
    }
    count
}

/// Atom `idx / M`'s neighbour in slot `idx % M` (M = `slots`) by the cell list: the cells around
/// it in order, each cell's neighbours in the sorted list's order, counted off by `counts` (n x
/// 27, from [`cell_count`]); the atom itself where it has fewer.
#[op(f32_form)]
pub fn cell_neighbour(
    idx: f64,
    pos: Table,
    cells: Table,
    counts: Table,
    side: f32,
    reach: f32,
    slots: u32,
) -> f64 {
    let e = idx as u32;
    let i = e / slots;
    let want = e % slots;
    let mut acc = 0_u32;
    let mut which = 27_u32;
    let mut local = 0_u32;
    for c in 0..27_u32 {
        let k = counts.at(i, c) as u32;
        if which == 27 && want < acc + k {
            which = c;
            local = want - acc;
        }
        acc += k;
    }
    let mut found = i as f64;
    if which < 27 {
        let g = 32.0_f64;
        let size = side as f64;
        let xi = pos.at(i, 0);
        let yi = pos.at(i, 1);
        let zi = pos.at(i, 2);
        let nx = (xi / size).floor() + (which % 3) as f64 - 1.0;
        let ny = (yi / size).floor() + ((which / 3) % 3) as f64 - 1.0;
        let nz = (zi / size).floor() + (which / 9) as f64 - 1.0;
        let key = (nx - g * (nx / g).floor())
            + g * ((ny - g * (ny / g).floor()) + g * (nz - g * (nz / g).floor()));
        let n = cells.rows();
        let mut lo = 0_u32;
        let mut hi = n;
        for _b in 0..32_u32 {
            if lo < hi {
                let mid = (lo + hi) / 2;
                if cells.at(mid, 1) < key {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
        }
        let first = lo;
        hi = n;
        for _b in 0..32_u32 {
            if lo < hi {
                let mid = (lo + hi) / 2;
                if cells.at(mid, 1) < key + 0.5 {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
        }
        let reach2 = reach as f64 * reach as f64;
        let mut seen = 0_u32;
        for s in first..lo {
            let j = cells.at(s, 0) as u32;
            let dx = pos.at(j, 0) - xi;
            let dy = pos.at(j, 1) - yi;
            let dz = pos.at(j, 2) - zi;
            if j != i && dx * dx + dy * dy + dz * dz < reach2 {
                if seen == local {
                    found = j as f64;
                }
                seen += 1;
            }
        }
    }
    found
}

/// Slot `idx % M` of atom `idx / M`'s edges (M = the list's columns): the neighbour the list
/// names, their distance in units of the filter grid's spacing h = cutoff / (points − 1), and
/// the unit vector towards the neighbour over h. A slot that names the atom itself (padding) or
/// a neighbour at `cutoff` or beyond gets the coordinate points − 1: no edge.
#[op(f32_form)]
pub fn find_edge(idx: f64, pos: Table, list: Table, cutoff: f32, points: u32) -> Edge {
    let e = idx as u32;
    let slots = list.cols();
    let i = e / slots;
    let j = list.at(i, e % slots) as u32;
    let dx = pos.at(j, 0) - pos.at(i, 0);
    let dy = pos.at(j, 1) - pos.at(i, 1);
    let dz = pos.at(j, 2) - pos.at(i, 2);
    let r = (dx * dx + dy * dy + dz * dz).sqrt();
    let last = points as f64 - 1.0;
    let h = cutoff as f64 / last;
    let mut out = Edge {
        j: j as f64,
        r: last,
        ux: 0.0,
        uy: 0.0,
        uz: 0.0,
    };
    if j != i && r < cutoff as f64 {
        out.r = r / h;
        out.ux = dx / (r * h);
        out.uy = dy / (r * h);
        out.uz = dz / (r * h);
    }
    out
}

/// A dense layer's output `idx % F` of atom `idx / F`: Σ_k a[i, k] w[k, f] + w[K, f], where `w`
/// holds the weights (K x F) and the bias as its last row.
#[op(f32_form, lanes = 8)]
pub fn dense(idx: f64, a: Table, w: Table) -> f64 {
    let e = idx as u32;
    let inputs = w.rows() - 1;
    let i = e / w.cols();
    let f = e % w.cols();
    let mut acc = w.at(inputs, f);
    for k in lanes(0..inputs) {
        acc += a.at(i, k) * w.at(k, f);
    }
    acc
}

/// base + Σ_k ssp(a[i, k]) w[k, f] + w[K, f] (i = idx / F, f = idx % F; the bias is `w`'s last
/// row): an interaction block's residual update h + ssp(m W_o1 + b_o1) W_o2 + b_o2, or with base
/// 0 the readout's per-atom energy. ssp(x) = ln(1 + eˣ) − ln 2.
#[op(f32_form, tensors(idx), lanes = 8)]
pub fn ssp_dense(base: f64, idx: f64, a: Table, w: Table) -> f64 {
    let e = idx as u32;
    let inputs = w.rows() - 1;
    let i = e / w.cols();
    let f = e % w.cols();
    let mut acc = base + w.at(inputs, f);
    for k in lanes(0..inputs) {
        let x = a.at(i, k);
        acc += (x.max(0.0) + (-x.abs()).exp().ln_1p() - std::f64::consts::LN_2) * w.at(k, f);
    }
    acc
}

/// Backward through a dense layer: base + Σ_f g[i, stride f] w[k, f], for input `idx % K` of atom
/// `idx / K` (`w`: K weight rows and the bias row). `stride` reads one field of a state table
/// (the `g` of [`Partial`]s: 4), or 1.
#[op(f32_form, tensors(idx), lanes = 8)]
pub fn dense_t(base: f64, idx: f64, g: Table, w: Table, stride: u32) -> f64 {
    let e = idx as u32;
    let inputs = w.rows() - 1;
    let i = e / inputs;
    let k = e % inputs;
    let mut acc = base;
    for f in lanes(0..w.cols()) {
        acc += g.at(i, stride * f) * w.at(k, f);
    }
    acc
}

/// Backward through ssp and a dense layer: σ(pre[i, k]) Σ_f g[i, f] w[k, f] (k = idx % K), with
/// σ the logistic function, ssp's derivative.
#[op(f32_form, lanes = 8)]
pub fn ssp_dense_t(idx: f64, pre: Table, g: Table, w: Table) -> f64 {
    let e = idx as u32;
    let inputs = w.rows() - 1;
    let i = e / inputs;
    let k = e % inputs;
    let mut acc = 0.0_f64;
    for f in lanes(0..w.cols()) {
        acc += g.at(i, f) * w.at(k, f);
    }
    acc / (1.0 + (-pre.at(i, k)).exp())
}

/// The continuous-filter convolution m[i, f] = Σ_j x[j, f] W(r_ij)[f] over atom i's edges (i =
/// idx / F, f = idx % F). `filter` is the block's table of [`FilterPoint`]s (points x 2F), read by
/// cubic Hermite interpolation at the edge's grid coordinate.
#[op(f32_form, lanes = 8)]
pub fn cfconv(idx: f64, edges: Table, x: Table, filter: Table) -> f64 {
    let e = idx as u32;
    let i = e / x.cols();
    let f = e % x.cols();
    let last = filter.rows() as f64 - 1.0;
    let mut acc = 0.0_f64;
    for s in lanes(0..edges.cols() / 5) {
        let u = edges.at(i, 5 * s + 1);
        if u < last {
            let cell = u.floor();
            let t = u - cell;
            let k = cell as u32;
            let t2 = t * t;
            let t3 = t2 * t;
            let w = (2.0 * t3 - 3.0 * t2 + 1.0) * filter.at(k, 2 * f)
                + (t3 - 2.0 * t2 + t) * filter.at(k, 2 * f + 1)
                + (3.0 * t2 - 2.0 * t3) * filter.at(k + 1, 2 * f)
                + (t3 - t2) * filter.at(k + 1, 2 * f + 1);
            acc += x.at(edges.at(i, 5 * s) as u32, f) * w;
        }
    }
    acc
}
/// The backward of [`cfconv`] for (atom a, feature f), a = idx / F, with gm = ∂E/∂m:
/// `g` = Σ_b gm[b, f] W(r_ab)[f], which is ∂E/∂x[a, f] (the lists are symmetric, so a's edges
/// are the pairs whose messages x[a, f] fed), and feature f's share of ∂E/∂position of a,
/// Σ_b (gm[a, f] x[b, f] + gm[b, f] x[a, f]) W'(r_ab)[f] ∂r_ab/∂pos_a.
#[op(f32_form, lanes = 8)]
pub fn cfconv_back(idx: f64, edges: Table, x: Table, gm: Table, filter: Table) -> Partial {
    let e = idx as u32;
    let a = e / x.cols();
    let f = e % x.cols();
    let last = filter.rows() as f64 - 1.0;
    let xa = x.at(a, f);
    let ga = gm.at(a, f);
    let mut out = Partial {
        g: 0.0,
        px: 0.0,
        py: 0.0,
        pz: 0.0,
    };
    for s in lanes(0..edges.cols() / 5) {
        let u = edges.at(a, 5 * s + 1);
        if u < last {
            let b = edges.at(a, 5 * s) as u32;
            let cell = u.floor();
            let t = u - cell;
            let k = cell as u32;
            let t2 = t * t;
            let t3 = t2 * t;
            let w0 = filter.at(k, 2 * f);
            let d0 = filter.at(k, 2 * f + 1);
            let w1 = filter.at(k + 1, 2 * f);
            let d1 = filter.at(k + 1, 2 * f + 1);
            let w = (2.0 * t3 - 3.0 * t2 + 1.0) * w0
                + (t3 - 2.0 * t2 + t) * d0
                + (3.0 * t2 - 2.0 * t3) * w1
                + (t3 - t2) * d1;
            let dw = (6.0 * t2 - 6.0 * t) * w0
                + (3.0 * t2 - 4.0 * t + 1.0) * d0
                + (6.0 * t - 6.0 * t2) * w1
                + (3.0 * t2 - 2.0 * t) * d1;
            let gb = gm.at(b, f);
            out.g += gb * w;
            // ∂u/∂pos_a is minus the edge's vector (the unit vector from a to b, over h).
            let coef = (ga * x.at(b, f) + gb * xa) * dw;
            out.px -= coef * edges.at(a, 5 * s + 2);
            out.py -= coef * edges.at(a, 5 * s + 3);
            out.pz -= coef * edges.at(a, 5 * s + 4);
        }
    }
    out
}

/// A velocity Verlet update of atom `idx` with the force F = −Σ_f (p1 + p2 + p3)[f], the three
/// blocks' [`Partial`]s of its row: v ← v + kick F, then x ← x + drift v. Between steps the state
/// holds v at the half step, so one update with kick = drift = dt ends one step and starts the
/// next; kick = dt/2, drift = 0 gives the velocity at the full step.
#[op(f32_form, tensors(idx), lanes = 8)]
pub fn verlet(s: Atom, idx: f64, p1: Table, p2: Table, p3: Table, kick: f32, drift: f32) -> Atom {
    let i = idx as u32;
    let mut fx = 0.0_f64;
    let mut fy = 0.0_f64;
    let mut fz = 0.0_f64;
    for f in lanes(0..p1.cols() / 4) {
        fx -= p1.at(i, 4 * f + 1) + p2.at(i, 4 * f + 1) + p3.at(i, 4 * f + 1);
        fy -= p1.at(i, 4 * f + 2) + p2.at(i, 4 * f + 2) + p3.at(i, 4 * f + 2);
        fz -= p1.at(i, 4 * f + 3) + p2.at(i, 4 * f + 3) + p3.at(i, 4 * f + 3);
    }
    let mut out = s;
    out.vx += kick as f64 * fx;
    out.vy += kick as f64 * fy;
    out.vz += kick as f64 * fz;
    out.x += drift as f64 * out.vx;
    out.y += drift as f64 * out.vy;
    out.z += drift as f64 * out.vz;
    out
}

/// How far atom `idx` has moved since `anchor` (the atoms when the list was built), squared.
#[op(f32_form, tensors(idx))]
pub fn moved(s: Atom, idx: f64, anchor: Table) -> f64 {
    let i = idx as u32;
    let dx = s.x - anchor.at(i, 0);
    let dy = s.y - anchor.at(i, 1);
    let dz = s.z - anchor.at(i, 2);
    dx * dx + dy * dy + dz * dz
}

/// The atom as it is: the list's anchor, kept when the list is built.
#[op(f32_form)]
pub fn keep(s: Atom) -> Atom {
    s
}

/// An atom's kinetic energy (unit mass).
#[op(f32_form)]
pub fn kinetic(s: Atom) -> f64 {
    0.5 * (s.vx * s.vx + s.vy * s.vy + s.vz * s.vz)
}

/// A block's filter table: [`FilterPoint`]s at FILTER_POINTS distances x F features.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct FilterTable {
    #[stage(1)]
    sample: FilterSample,
}

/// The Verlet list: n x M neighbour indices.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct NeighbourList {
    #[stage(1)]
    slot: Neighbour,
}

/// Each atom's cell key (the cell list, [`cell_key`]).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct CellKeys {
    #[stage(1)]
    key: CellKey,
}

/// Each atom's rank in the order of (key, index).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct CellRanks {
    #[stage(1)]
    rank: CellRank,
}

/// The sorted cell list: n [`SortedAtom`]s.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct CellEntries {
    #[stage(1)]
    entry: CellEntry,
}

/// n x 27 neighbour counts, by cell around each atom.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct CellCounts {
    #[stage(1)]
    count: CellCount,
}

/// The Verlet list by the cell list: n x M neighbour indices.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct CellNeighbourList {
    #[stage(1)]
    slot: CellNeighbour,
}

/// The step's edges: n x M [`Edge`]s.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct Edges {
    #[stage(1)]
    slot: FindEdge,
}

/// a W + b, over (atom, feature).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct DenseLayer {
    #[stage(1)]
    layer: Dense,
}

/// base + ssp(a) W + b, over (atom, feature).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct SspDenseLayer {
    #[stage(1)]
    layer: SspDense,
}

/// base + g Wᵀ, over (atom, input).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct DenseBack {
    #[stage(1)]
    layer: DenseT,
}

/// σ(pre) ⊙ (g Wᵀ), over (atom, input).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct SspDenseBack {
    #[stage(1)]
    layer: SspDenseT,
}

/// An interaction block's convolution, over (atom, feature).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct Convolution {
    #[stage(1)]
    conv: Cfconv,
}

/// Its backward, with the force partials, over (atom, feature).
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct ConvolutionBack {
    #[stage(1)]
    conv: CfconvBack,
}

/// Velocity Verlet, over atoms.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct VerletStep {
    #[stage(1)]
    update: Verlet,
}

/// Σ_i E_i: the readout's per-atom energies, summed.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct PotentialEnergy {
    #[stage(1)]
    atom: SspDense,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// The largest squared displacement of an atom since the list was built: the condition of a
/// rebuild.
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct Displacement {
    #[stage(1)]
    atom: Moved,
    #[stage(2, reduction = true)]
    farthest: MaxReduction,
}

/// The atoms where the list is built, for [`Displacement`].
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct KeepAnchor {
    #[stage(1)]
    atom: Keep,
}

/// Σ_i ½ |v_i|².
#[derive(FusionBuilder)]
#[fusion(domain = "md")]
pub struct KineticEnergy {
    #[stage(1)]
    atom: Kinetic,
    #[stage(2, reduction = true)]
    total: SumReduction,
}

/// A dense layer's weights (fan_in x fan_out) with its bias as one more row, row-major: the
/// layout [`dense`] and its kin read.
#[derive(Debug, Clone)]
pub struct Layer {
    pub fan_in: usize,
    pub fan_out: usize,
    pub rows: Vec<f32>,
}

impl Layer {
    pub fn weight(&self, k: usize, f: usize) -> f64 {
        f64::from(self.rows[k * self.fan_out + f])
    }
    pub fn bias(&self, f: usize) -> f64 {
        self.weight(self.fan_in, f)
    }
}

/// One interaction block's layers.
#[derive(Debug, Clone)]
pub struct Block {
    pub w_in: Layer,
    pub filter1: Layer,
    pub filter2: Layer,
    pub out1: Layer,
    pub out2: Layer,
}

/// The model's weights, as bench/peers_md.py draws them: splitmix64 streams from seed 101 in
/// its order; W = (2u − 1) √(3 / fan_in), b = 0.1 (2u − 1), the embedding (2u − 1).
#[derive(Debug, Clone)]
pub struct Model {
    pub width: usize,
    pub embed: Vec<f32>,
    pub blocks: Vec<Block>,
    pub read1: Layer,
    pub read2: Layer,
}

impl Model {
    pub fn new(width: usize) -> Model {
        let mut s = Streams { seed: 101 };
        let embed: Vec<f32> = s
            .take(width)
            .iter()
            .map(|&u| (10.0 * (0.1 * (2.0 * f64::from(u) - 1.0))) as f32)
            .collect();
        let mut blocks = Vec::with_capacity(BLOCKS);
        for _ in 0..BLOCKS {
            let w_in = s.layer(width, width, false);
            let filter1 = s.layer(K_RBF, width, true);
            let filter2 = s.layer(width, width, true);
            let out1 = s.layer(width, width, true);
            let out2 = s.layer(width, width, true);
            blocks.push(Block {
                w_in,
                filter1,
                filter2,
                out1,
                out2,
            });
        }
        let read1 = s.layer(width, width / 2, true);
        let read2 = s.layer(width / 2, 1, true);
        Model {
            width,
            embed,
            blocks,
            read1,
            read2,
        }
    }
}

/// Consecutive splitmix64 streams, one per weight or bias.
struct Streams {
    seed: u64,
}

impl Streams {
    fn take(&mut self, n: usize) -> Vec<f32> {
        self.seed += 1;
        crate::inputs::uniform(self.seed - 1, n)
    }

    /// Weights (2u − 1) √(3 / fan_in), then (with `bias`) a bias 0.1 (2u − 1) from the next
    /// stream, else zeros, as the last row.
    fn layer(&mut self, fan_in: usize, fan_out: usize, bias: bool) -> Layer {
        let scale = (3.0 / fan_in as f64).sqrt();
        let mut rows: Vec<f32> = self
            .take(fan_in * fan_out)
            .iter()
            .map(|&u| ((2.0 * f64::from(u) - 1.0) * scale) as f32)
            .collect();
        if bias {
            rows.extend(
                self.take(fan_out)
                    .iter()
                    .map(|&u| (0.1 * (2.0 * f64::from(u) - 1.0)) as f32),
            );
        } else {
            rows.extend(std::iter::repeat_n(0.0, fan_out));
        }
        Layer {
            fan_in,
            fan_out,
            rows,
        }
    }
}

/// The start configuration of n atoms, as bench/peers_md.py builds it: the first n sites of the
/// smallest cube of spacing [`SPACING`] that holds them, each coordinate jittered by ±JITTER,
/// velocities uniform in ±V0 with the mean removed.
pub fn start(n: usize) -> Vec<Atom> {
    let mut side = 1usize;
    while side * side * side < n {
        side += 1;
    }
    let jitter = crate::inputs::uniform(11, 3 * n);
    let speed = crate::inputs::uniform(12, 3 * n);
    let u = |v: &[f32], k: usize| 2.0 * f64::from(v[k]) - 1.0;
    let mut mean = [0.0f64; 3];
    for i in 0..n {
        for (c, m) in mean.iter_mut().enumerate() {
            *m += u(&speed, 3 * i + c) * V0 / n as f64;
        }
    }
    (0..n)
        .map(|i| {
            let site = [i % side, (i / side) % side, i / (side * side)];
            let p = |c: usize| site[c] as f64 * SPACING + u(&jitter, 3 * i + c) * JITTER;
            let v = |c: usize| u(&speed, 3 * i + c) * V0 - mean[c];
            Atom {
                x: p(0),
                y: p(1),
                z: p(2),
                vx: v(0),
                vy: v(1),
                vz: v(2),
            }
        })
        .collect()
}

fn distance(a: &Atom, b: &Atom) -> f64 {
    ((a.x - b.x).powi(2) + (a.y - b.y).powi(2) + (a.z - b.z).powi(2)).sqrt()
}

/// The most neighbours any atom has within r_c + skin.
pub fn most_neighbours(atoms: &[Atom]) -> usize {
    let reach = R_CUT + SKIN;
    (0..atoms.len())
        .map(|i| {
            (0..atoms.len())
                .filter(|&j| j != i && distance(&atoms[i], &atoms[j]) < reach)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The list's columns for a start configuration, as peers_md.py sizes it: twice the most
/// neighbours (the cluster contracts as it runs), at most n − 1, at least 1.
pub fn list_columns(atoms: &[Atom]) -> usize {
    (2 * most_neighbours(atoms))
        .min(atoms.len().saturating_sub(1))
        .max(1)
}

fn ssp(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p() - std::f64::consts::LN_2
}

/// The model's energy in f64, evaluated directly (the filter network at every pair's distance,
/// no table, every pair within r_c): the reference the interpolated model and its forces are
/// held to.
pub fn reference_energy(model: &Model, atoms: &[Atom]) -> f64 {
    let (n, f) = (atoms.len(), model.width);
    let dense = |x: &[f64], l: &Layer, act: bool| -> Vec<f64> {
        let rows = x.len() / l.fan_in;
        let mut y = vec![0.0; rows * l.fan_out];
        for i in 0..rows {
            for o in 0..l.fan_out {
                let mut acc = l.bias(o);
                for k in 0..l.fan_in {
                    let v = x[i * l.fan_in + k];
                    acc += if act { ssp(v) } else { v } * l.weight(k, o);
                }
                y[i * l.fan_out + o] = acc;
            }
        }
        y
    };
    let spacing = R_CUT / (K_RBF as f64 - 1.0);
    let gamma = 0.5 / (spacing * spacing);
    let mut h: Vec<f64> = (0..n)
        .flat_map(|_| model.embed.iter().map(|&e| f64::from(e)))
        .collect();
    for b in &model.blocks {
        let x = dense(&h, &b.w_in, false);
        let mut m = vec![0.0; n * f];
        for i in 0..n {
            for j in 0..n {
                let r = distance(&atoms[i], &atoms[j]);
                if i == j || r >= R_CUT {
                    continue;
                }
                let rbf: Vec<f64> = (0..K_RBF)
                    .map(|k| (-gamma * (r - k as f64 * spacing).powi(2)).exp())
                    .collect();
                let hidden = dense(&rbf, &b.filter1, false);
                let filter = dense(&hidden, &b.filter2, true);
                let fc = 0.5 * ((std::f64::consts::PI * r / R_CUT).cos() + 1.0);
                for c in 0..f {
                    m[i * f + c] += x[j * f + c] * filter[c] * fc;
                }
            }
        }
        let a = dense(&m, &b.out1, false);
        let update = dense(&a, &b.out2, true);
        for (h, u) in h.iter_mut().zip(update) {
            *h += u;
        }
    }
    let e1 = dense(&h, &model.read1, false);
    dense(&e1, &model.read2, true).iter().sum()
}

/// The model and one system on a runtime: its tables, and every buffer a step writes. Built by
/// [`Md::new`]; [`Md::run`] integrates.
pub struct Md {
    pub n: usize,
    pub width: usize,
    /// The Verlet list's columns.
    pub slots: usize,
    /// Distances of the filter tables.
    pub points: usize,
    /// Whether the list is built by the cell list (else from all pairs).
    pub cells: bool,
    /// The state a run starts from (positions, velocities at the full step); a run leaves its end
    /// state in `end`.
    pub start: Buffer<f32>,
    pub end: Buffer<f32>,
    fixed: Fixed,
    work: Work,
}

/// What the steps read and none writes.
struct Fixed {
    idx_atoms: Buffer<f32>,
    idx_features: Buffer<f32>,
    idx_half: Buffer<f32>,
    idx_slots: Buffer<f32>,
    idx_cells: Buffer<f32>,
    embed: Buffer<f32>,
    zeros_features: Buffer<f32>,
    zeros_atoms: Buffer<f32>,
    ones_atoms: Buffer<f32>,
    w_in: [Buffer<f32>; BLOCKS],
    out1: [Buffer<f32>; BLOCKS],
    out2: [Buffer<f32>; BLOCKS],
    filters: [Buffer<f32>; BLOCKS],
    read1: Buffer<f32>,
    read2: Buffer<f32>,
}

/// What the steps write.
struct Work {
    half_a: Buffer<f32>,
    half_b: Buffer<f32>,
    anchor: Buffer<f32>,
    list: Buffer<f32>,
    keys: Buffer<f32>,
    ranks: Buffer<f32>,
    entries: Buffer<f32>,
    counts: Buffer<f32>,
    edges: Buffer<f32>,
    x: [Buffer<f32>; BLOCKS],
    m: [Buffer<f32>; BLOCKS],
    a: [Buffer<f32>; BLOCKS],
    h: [Buffer<f32>; BLOCKS],
    e1: Buffer<f32>,
    ge1: Buffer<f32>,
    gh: [Buffer<f32>; BLOCKS],
    ga: [Buffer<f32>; BLOCKS],
    gm: [Buffer<f32>; BLOCKS],
    partials: [Buffer<f32>; BLOCKS],
}

/// The handles of one pipeline over an [`Md`]'s buffers.
struct Handles<'p> {
    n: usize,
    width: usize,
    slots: usize,
    points: usize,
    cells: bool,
    idx_atoms: PipeInput<'p>,
    idx_features: PipeInput<'p>,
    idx_half: PipeInput<'p>,
    idx_slots: PipeInput<'p>,
    idx_cells: PipeInput<'p>,
    embed: PipeInput<'p>,
    zeros_features: PipeInput<'p>,
    zeros_atoms: PipeInput<'p>,
    ones_atoms: PipeInput<'p>,
    w_in: [PipeInput<'p>; BLOCKS],
    out1: [PipeInput<'p>; BLOCKS],
    out2: [PipeInput<'p>; BLOCKS],
    filters: [PipeInput<'p>; BLOCKS],
    read1: PipeInput<'p>,
    read2: PipeInput<'p>,
    start: PipeInput<'p>,
    end: PipeOutput,
    half_a: PipeOutput,
    half_b: PipeOutput,
    anchor: PipeOutput,
    list: PipeOutput,
    keys: PipeOutput,
    ranks: PipeOutput,
    entries: PipeOutput,
    counts: PipeOutput,
    edges: PipeOutput,
    x: [PipeOutput; BLOCKS],
    m: [PipeOutput; BLOCKS],
    a: [PipeOutput; BLOCKS],
    h: [PipeOutput; BLOCKS],
    e1: PipeOutput,
    ge1: PipeOutput,
    gh: [PipeOutput; BLOCKS],
    ga: [PipeOutput; BLOCKS],
    gm: [PipeOutput; BLOCKS],
    partials: [PipeOutput; BLOCKS],
}

/// Items of a pipeline, named, each with its span on the device's clock (ns) where the backend
/// measures one.
pub type ItemSpans = Vec<(String, Option<(u64, u64)>)>;

/// What one run gives: the energies at its end.
#[derive(Debug, Clone, Copy)]
pub struct RunEnd {
    pub potential: f64,
    pub kinetic: f64,
    /// Host round trips of the run (1 on the GPU: one submission).
    pub round_trips: u64,
    /// Times the list was rebuilt after the start (the device decided each).
    pub rebuilds: u32,
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

impl Md {
    /// Uploads `model`, tabulates its filters on `rt` (at `points` distances) and takes `atoms`
    /// as the start state, with a Verlet list of `slots` columns.
    pub fn new(
        rt: &Runtime,
        model: &Model,
        atoms: &[Atom],
        slots: usize,
        points: usize,
    ) -> pptm::Result<Md> {
        let (n, f) = (atoms.len(), model.width);
        let up = |v: &[f32]| rt.upload(v);
        let poisoned = |len: usize| rt.upload(&vec![f32::NAN; len]);
        let layers = |pick: fn(&Block) -> &Layer| -> pptm::Result<[Buffer<f32>; BLOCKS]> {
            let b = &model.blocks;
            Ok([
                up(&pick(&b[0]).rows)?,
                up(&pick(&b[1]).rows)?,
                up(&pick(&b[2]).rows)?,
            ])
        };
        let idx_filter = up(&iota(points * f))?;
        let mut filters = Vec::with_capacity(BLOCKS);
        for b in &model.blocks {
            let (l1, l2) = (up(&b.filter1.rows)?, up(&b.filter2.rows)?);
            let mut table = poisoned(2 * points * f)?;
            FilterTable::submit(
                rt,
                &idx_filter,
                &l1,
                &l2,
                R_CUT as f32,
                points as u32,
                &mut table,
                K_RBF + 1,
                f,
                f + 1,
                f,
            )?
            .wait()?;
            filters.push(table);
        }
        let filters: [Buffer<f32>; BLOCKS] =
            filters.try_into().map_err(|_| pptm::Error::BadArguments {
                chain: "md",
                reason: "three filter tables".into(),
            })?;
        let fixed = Fixed {
            idx_atoms: up(&iota(n))?,
            idx_features: up(&iota(n * f))?,
            idx_half: up(&iota(n * f / 2))?,
            idx_slots: up(&iota(n * slots))?,
            idx_cells: up(&iota(n * 27))?,
            embed: up(&model.embed.repeat(n))?,
            zeros_features: up(&vec![0.0; n * f])?,
            zeros_atoms: up(&vec![0.0; n])?,
            ones_atoms: up(&vec![1.0; n])?,
            w_in: layers(|b| &b.w_in)?,
            out1: layers(|b| &b.out1)?,
            out2: layers(|b| &b.out2)?,
            filters,
            read1: up(&model.read1.rows)?,
            read2: up(&model.read2.rows)?,
        };
        let three = |len: usize| -> pptm::Result<[Buffer<f32>; BLOCKS]> {
            Ok([poisoned(len)?, poisoned(len)?, poisoned(len)?])
        };
        let work = Work {
            half_a: poisoned(6 * n)?,
            half_b: poisoned(6 * n)?,
            anchor: poisoned(6 * n)?,
            list: poisoned(n * slots)?,
            keys: poisoned(n)?,
            ranks: poisoned(n)?,
            entries: poisoned(2 * n)?,
            counts: poisoned(n * 27)?,
            edges: poisoned(5 * n * slots)?,
            x: three(n * f)?,
            m: three(n * f)?,
            a: three(n * f)?,
            h: three(n * f)?,
            e1: poisoned(n * f / 2)?,
            ge1: poisoned(n * f / 2)?,
            gh: three(n * f)?,
            ga: three(n * f)?,
            gm: three(n * f)?,
            partials: three(4 * n * f)?,
        };
        Ok(Md {
            n,
            width: f,
            slots,
            points,
            cells: n >= CELL_LIST_FROM,
            start: up(&Atom::flatten(atoms))?,
            end: poisoned(6 * n)?,
            fixed,
            work,
        })
    }

    fn handles<'p>(
        p: &mut Pipeline<'p>,
        shape: (usize, usize, usize, usize, bool),
        start: &'p Buffer<f32>,
        end: &'p mut Buffer<f32>,
        fx: &'p Fixed,
        w: &'p mut Work,
    ) -> Handles<'p> {
        let (n, width, slots, points, cells) = shape;
        let [x0, x1, x2] = &mut w.x;
        let [m0, m1, m2] = &mut w.m;
        let [a0, a1, a2] = &mut w.a;
        let [h0, h1, h2] = &mut w.h;
        let [gh0, gh1, gh2] = &mut w.gh;
        let [ga0, ga1, ga2] = &mut w.ga;
        let [gm0, gm1, gm2] = &mut w.gm;
        let [p0, p1, p2] = &mut w.partials;
        Handles {
            n,
            width,
            slots,
            points,
            cells,
            idx_atoms: p.input(&fx.idx_atoms),
            idx_features: p.input(&fx.idx_features),
            idx_half: p.input(&fx.idx_half),
            idx_slots: p.input(&fx.idx_slots),
            idx_cells: p.input(&fx.idx_cells),
            embed: p.input(&fx.embed),
            zeros_features: p.input(&fx.zeros_features),
            zeros_atoms: p.input(&fx.zeros_atoms),
            ones_atoms: p.input(&fx.ones_atoms),
            w_in: fx.w_in.each_ref().map(|b| p.input(b)),
            out1: fx.out1.each_ref().map(|b| p.input(b)),
            out2: fx.out2.each_ref().map(|b| p.input(b)),
            filters: fx.filters.each_ref().map(|b| p.input(b)),
            read1: p.input(&fx.read1),
            read2: p.input(&fx.read2),
            start: p.input(start),
            end: p.output(end),
            half_a: p.output(&mut w.half_a),
            half_b: p.output(&mut w.half_b),
            anchor: p.output(&mut w.anchor),
            list: p.output(&mut w.list),
            keys: p.output(&mut w.keys),
            ranks: p.output(&mut w.ranks),
            entries: p.output(&mut w.entries),
            counts: p.output(&mut w.counts),
            edges: p.output(&mut w.edges),
            x: [p.output(x0), p.output(x1), p.output(x2)],
            m: [p.output(m0), p.output(m1), p.output(m2)],
            a: [p.output(a0), p.output(a1), p.output(a2)],
            h: [p.output(h0), p.output(h1), p.output(h2)],
            e1: p.output(&mut w.e1),
            ge1: p.output(&mut w.ge1),
            gh: [p.output(gh0), p.output(gh1), p.output(gh2)],
            ga: [p.output(ga0), p.output(ga1), p.output(ga2)],
            gm: [p.output(gm0), p.output(gm1), p.output(gm2)],
            partials: [p.output(p0), p.output(p1), p.output(p2)],
        }
    }

    /// The Verlet list at the start state (n x M atom indices, row-major; padding: the atom
    /// itself), built as a run builds it.
    #[allow(
        dead_code,
        reason = "examples/md.rs's tests call it; pptm-bench includes this file"
    )]
    pub fn neighbour_list(&mut self, rt: &Runtime) -> pptm::Result<Vec<f32>> {
        let shape = (self.n, self.width, self.slots, self.points, self.cells);
        let mut p = rt.pipeline();
        let h = Md::handles(
            &mut p,
            shape,
            &self.start,
            &mut self.end,
            &self.fixed,
            &mut self.work,
        );
        push_list(&mut p, &h, h.start)?;
        p.wait()?;
        self.work.list.to_vec()
    }

    /// Integrates `steps` velocity Verlet steps (a multiple of [`STEPS_PER_ITERATION`]) from
    /// `start` into `end`, as one pipeline: the list and the forces at the start, then a
    /// device-side loop of `steps / 2` iterations of two steps, each step preceded by the
    /// farthest displacement since the list's build and, when it reaches skin / 2, a rebuild
    /// (decided on the device), then the forces at the end and the energies. On the GPU that is
    /// one submission.
    pub fn run(&mut self, rt: &Runtime, steps: usize) -> pptm::Result<RunEnd> {
        if steps == 0 || !steps.is_multiple_of(STEPS_PER_ITERATION) {
            return Err(pptm::Error::BadArguments {
                chain: "md",
                reason: format!(
                    "{steps} steps: a run is a positive multiple of {STEPS_PER_ITERATION}"
                ),
            });
        }
        let shape = (self.n, self.width, self.slots, self.points, self.cells);
        let mut p = rt.pipeline();
        let h = Md::handles(
            &mut p,
            shape,
            &self.start,
            &mut self.end,
            &self.fixed,
            &mut self.work,
        );
        let dt = DT as f32;
        // The start: (x0, v0) → (x0, v0 − dt/2 F0), the half-step velocity the updates carry.
        push_list(&mut p, &h, h.start)?;
        KeepAnchor::push(&mut p, h.start, h.anchor)?;
        push_forces(&mut p, &h, h.start)?;
        push_update(&mut p, &h, h.start, h.half_a, -0.5 * dt, 0.0)?;
        let mut rebuilds = Vec::new();
        p.repeat((steps / STEPS_PER_ITERATION) as u32, |p| {
            rebuilds.clear();
            for (from, to) in [(h.half_a, h.half_b), (h.half_b, h.half_a)] {
                let moved: PipeItem<f32> =
                    Displacement::push(p, PipeInput::from(from), h.idx_atoms, h.anchor, h.n, 6)?;
                rebuilds.push(p.when(moved, REBUILD_AT, |p| {
                    push_list(p, &h, from.into())?;
                    KeepAnchor::push(p, PipeInput::from(from), h.anchor)?;
                    Ok(())
                })?);
                push_forces(p, &h, from.into())?;
                push_update(p, &h, from.into(), to, dt, dt)?;
            }
            Ok(())
        })?;
        // The end: the forces at x_N give v_N = v_(N−1/2) + dt/2 F_N.
        push_forces(&mut p, &h, h.half_a.into())?;
        push_update(&mut p, &h, h.half_a.into(), h.end, 0.5 * dt, 0.0)?;
        let (potential, kinetic) = push_energies(&mut p, &h, h.end.into())?;
        let r = p.wait()?;
        let mut rebuilt = 0;
        for w in rebuilds {
            rebuilt += r.runs(w)?;
        }
        Ok(RunEnd {
            potential: f64::from(r.get(potential)?),
            kinetic: f64::from(r.get(kinetic)?),
            round_trips: r.round_trips(),
            rebuilds: rebuilt,
        })
    }

    /// Every buffer the last pipeline wrote, and the filter tables, by name: what
    /// `examples/md.rs --diagnose` compares between backends.
    pub fn buffers(&self) -> pptm::Result<Vec<(String, Vec<f32>)>> {
        let w = &self.work;
        let mut out = vec![
            ("list".to_string(), w.list.to_vec()?),
            ("edges".to_string(), w.edges.to_vec()?),
        ];
        for b in 0..BLOCKS {
            out.push((format!("filter{b}"), self.fixed.filters[b].to_vec()?));
            out.push((format!("x{b}"), w.x[b].to_vec()?));
            out.push((format!("m{b}"), w.m[b].to_vec()?));
            out.push((format!("a{b}"), w.a[b].to_vec()?));
            out.push((format!("h{b}"), w.h[b].to_vec()?));
        }
        out.push(("e1".to_string(), w.e1.to_vec()?));
        out.push(("ge1".to_string(), w.ge1.to_vec()?));
        for b in (0..BLOCKS).rev() {
            out.push((format!("gh{b}"), w.gh[b].to_vec()?));
            out.push((format!("ga{b}"), w.ga[b].to_vec()?));
            out.push((format!("gm{b}"), w.gm[b].to_vec()?));
            out.push((format!("partials{b}"), w.partials[b].to_vec()?));
        }
        Ok(out)
    }

    /// The forces F_i = −∂E/∂x_i at the start state, by the backward pass, and the potential
    /// and kinetic energies there: one pipeline. Also each item of the forces, named, with its
    /// span on the device's clock (ns) where the backend measures one.
    pub fn evaluate(&mut self, rt: &Runtime) -> pptm::Result<(Vec<[f64; 3]>, RunEnd, ItemSpans)> {
        let shape = (self.n, self.width, self.slots, self.points, self.cells);
        let mut p = rt.pipeline();
        let h = Md::handles(
            &mut p,
            shape,
            &self.start,
            &mut self.end,
            &self.fixed,
            &mut self.work,
        );
        push_list(&mut p, &h, h.start)?;
        let items = push_forces(&mut p, &h, h.start)?;
        let (potential, kinetic) = push_energies(&mut p, &h, h.start)?;
        let r = p.wait()?;
        let profile = items
            .into_iter()
            .map(|(name, item)| (name, r.device_span(item)))
            .collect();
        let end = RunEnd {
            potential: f64::from(r.get(potential)?),
            kinetic: f64::from(r.get(kinetic)?),
            round_trips: r.round_trips(),
            rebuilds: 0,
        };
        // The partials are summed here, on the host, so that the backward pass alone is checked.
        let f4 = 4 * self.width;
        let parts: Vec<Vec<f32>> = self
            .work
            .partials
            .iter()
            .map(|b| b.to_vec())
            .collect::<pptm::Result<_>>()?;
        let forces = (0..self.n)
            .map(|i| {
                let mut force = [0.0f64; 3];
                for part in &parts {
                    for f in 0..self.width {
                        for (c, out) in force.iter_mut().enumerate() {
                            *out -= f64::from(part[i * f4 + 4 * f + 1 + c]);
                        }
                    }
                }
                force
            })
            .collect();
        Ok((forces, end, profile))
    }
}

/// The potential energy of the last [`push_forces`]'s positions (its readout) and the kinetic
/// energy of `state`.
fn push_energies<'p>(
    p: &mut Pipeline<'p>,
    h: &Handles<'p>,
    state: PipeInput<'p>,
) -> pptm::Result<(pptm::PipeItem<f32>, pptm::PipeItem<f32>)> {
    let half = h.width / 2;
    let potential = PotentialEnergy::push(
        p,
        h.zeros_atoms,
        h.idx_atoms,
        h.e1,
        h.read2,
        h.n,
        half,
        half + 1,
        1,
    )?;
    let kinetic = KineticEnergy::push(p, state)?;
    Ok((potential, kinetic))
}

/// The Verlet list at `pos`: from all pairs (one item), or by the cell list (five: keys, ranks,
/// the sorted list, counts by cell, the list).
fn push_list<'p>(p: &mut Pipeline<'p>, h: &Handles<'p>, pos: PipeInput<'p>) -> pptm::Result<()> {
    let reach = (R_CUT + SKIN) as f32;
    let n = h.n;
    if !h.cells {
        NeighbourList::push(p, h.idx_slots, pos, reach, h.slots as u32, h.list, n, 6)?;
        return Ok(());
    }
    let side = CELL_SIDE as f32;
    CellKeys::push(p, h.idx_atoms, pos, side, h.keys, n, 6)?;
    CellRanks::push(p, h.idx_atoms, h.keys, h.ranks, n, 1)?;
    CellEntries::push(p, h.idx_atoms, h.ranks, h.keys, h.entries, n, 1, n, 1)?;
    CellCounts::push(
        p,
        h.idx_cells,
        pos,
        h.entries,
        side,
        reach,
        h.counts,
        n,
        6,
        n,
        2,
    )?;
    CellNeighbourList::push(
        p,
        h.idx_slots,
        pos,
        h.entries,
        h.counts,
        side,
        reach,
        h.slots as u32,
        h.list,
        n,
        6,
        n,
        2,
        n,
        27,
    )?;
    Ok(())
}

/// The edges at `pos`, the forward pass and the backward pass: the partials of the forces. Returns
/// the items, named, for a profile.
fn push_forces<'p>(
    p: &mut Pipeline<'p>,
    h: &Handles<'p>,
    pos: PipeInput<'p>,
) -> pptm::Result<Vec<(String, PipeItem<()>)>> {
    let (n, f, s) = (h.n, h.width, h.slots);
    let mut items = Vec::new();
    let item = Edges::push(
        p,
        h.idx_slots,
        pos,
        h.list,
        R_CUT as f32,
        h.points as u32,
        h.edges,
        n,
        6,
        n,
        s,
    )?;
    items.push(("edges".to_string(), item));
    for b in 0..BLOCKS {
        let input: PipeInput<'p> = if b == 0 { h.embed } else { h.h[b - 1].into() };
        let item = DenseLayer::push(p, h.idx_features, input, h.w_in[b], h.x[b], n, f, f + 1, f)?;
        items.push(("denselayer".to_string(), item));
        let item = Convolution::push(
            p,
            h.idx_features,
            h.edges,
            h.x[b],
            h.filters[b],
            h.m[b],
            n,
            5 * s,
            n,
            f,
            h.points,
            2 * f,
        )?;
        items.push(("convolution".to_string(), item));
        let item = DenseLayer::push(p, h.idx_features, h.m[b], h.out1[b], h.a[b], n, f, f + 1, f)?;
        items.push(("denselayer".to_string(), item));
        let item = SspDenseLayer::push(
            p,
            input,
            h.idx_features,
            h.a[b],
            h.out2[b],
            h.h[b],
            n,
            f,
            f + 1,
            f,
        )?;
        items.push(("sspdenselayer".to_string(), item));
    }
    let half = f / 2;
    let item = DenseLayer::push(
        p,
        h.idx_half,
        h.h[BLOCKS - 1],
        h.read1,
        h.e1,
        n,
        f,
        f + 1,
        half,
    )?;
    items.push(("denselayer".to_string(), item));
    let item = SspDenseBack::push(
        p,
        h.idx_half,
        h.e1,
        h.ones_atoms,
        h.read2,
        h.ge1,
        n,
        half,
        n,
        1,
        half + 1,
        1,
    )?;
    items.push(("sspdenseback".to_string(), item));
    let item = DenseBack::push(
        p,
        h.zeros_features,
        h.idx_features,
        h.ge1,
        h.read1,
        1,
        h.gh[BLOCKS - 1],
        n,
        half,
        f + 1,
        half,
    )?;
    items.push(("denseback".to_string(), item));
    for b in (0..BLOCKS).rev() {
        let item = SspDenseBack::push(
            p,
            h.idx_features,
            h.a[b],
            h.gh[b],
            h.out2[b],
            h.ga[b],
            n,
            f,
            n,
            f,
            f + 1,
            f,
        )?;
        items.push(("sspdenseback".to_string(), item));
        let item = DenseBack::push(
            p,
            h.zeros_features,
            h.idx_features,
            h.ga[b],
            h.out1[b],
            1,
            h.gm[b],
            n,
            f,
            f + 1,
            f,
        )?;
        items.push(("denseback".to_string(), item));
        let item = ConvolutionBack::push(
            p,
            h.idx_features,
            h.edges,
            h.x[b],
            h.gm[b],
            h.filters[b],
            h.partials[b],
            n,
            5 * s,
            n,
            f,
            n,
            f,
            h.points,
            2 * f,
        )?;
        items.push(("convolutionback".to_string(), item));
        if b > 0 {
            let item = DenseBack::push(
                p,
                h.gh[b],
                h.idx_features,
                h.partials[b],
                h.w_in[b],
                4,
                h.gh[b - 1],
                n,
                4 * f,
                f + 1,
                f,
            )?;
            items.push(("denseback".to_string(), item));
        }
    }
    Ok(items)
}

/// A Verlet update of `from` into `to` with the forces of the last [`push_forces`].
fn push_update<'p>(
    p: &mut Pipeline<'p>,
    h: &Handles<'p>,
    from: PipeInput<'p>,
    to: PipeOutput,
    kick: f32,
    drift: f32,
) -> pptm::Result<()> {
    let (n, f4) = (h.n, 4 * h.width);
    VerletStep::push(
        p,
        from,
        h.idx_atoms,
        h.partials[0],
        h.partials[1],
        h.partials[2],
        kick,
        drift,
        to,
        n,
        f4,
        n,
        f4,
        n,
        f4,
    )?;
    Ok(())
}

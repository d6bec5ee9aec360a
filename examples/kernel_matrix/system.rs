//! Fidelity kernel matrices K_ij = |⟨ψ_i|ψ_j⟩|² of complex states, in tiles, on pptm's matrix
//! product and an op of the example's own (examples/kernel_matrix.rs runs it).
//!
//! With a = ψ_i and b = ψ_j split into real and imaginary parts, ⟨ψ_i|ψ_j⟩ conjugated (which
//! |·|² does not see) is Σ_p a_p b̄_p:
//!
//!   Re = Σ a_re b_re + a_im b_im = [a_re, a_im] · [b_re; b_im]
//!   Im = Σ a_im b_re − a_re b_im = [a_re, a_im] · [−b_im; b_re]
//!
//! So a tile of K is two real products of one row operand X (rows: the tile's states as
//! [re, im], 2d values) with two column operands (columns: the tile's other states): the first
//! stores Re, the second computes Im and stores K = Im² + Re² from its accumulators (the op
//! `abs2` in its epilogue, reading Re): two items of one pipeline.
//!
//! Two precisions:
//! * `F32`: f32 operands, the product on CUDA cores;
//! * `Bf16x3`: each f32 value v split as hi = bf16(v), lo = bf16(v − hi) (v = hi + lo to 16
//!   bits of mantissa), and the three products hi·hi + hi·lo + lo·hi summed by one bf16 product
//!   on tensor cores with k tripled: X' = [hi(X), hi(X), lo(X)], W' = [hi(W); lo(W); hi(W)]. The
//!   dropped lo·lo and the splits' residues are below 2^-16 of each term, so a sum keeps about
//!   1e-5 of its terms' magnitude (checked against f64 by the example and its tests), on f32
//!   accumulators. The products are `accumulate = "promoted"`: Hopper's tensor cores truncate
//!   as they add, which over k = 6d = 24,576 (q = 12) cost 1e-4 of K (docs/dsl.md,
//!   "Accumulation").

use pptm::ops::Matmul;
use pptm::{Buffer, FusionBuilder, Pipeline, Runtime, bf16, op};

/// |z|² of z = re + i·im.
#[op(tensors(im))]
pub fn abs2(re: f64, im: f64) -> f64 {
    re * re + im * im
}

/// One real product of a tile, f32 on CUDA cores.
#[derive(FusionBuilder)]
#[fusion(domain = "kernel_matrix")]
pub struct ProductF32 {
    #[stage(1)]
    product: Matmul,
}

/// One real product of a tile from bf16 hi/lo operands on tensor cores (wgmma on Hopper).
#[derive(FusionBuilder)]
#[fusion(domain = "kernel_matrix_tc")]
pub struct ProductSplit {
    #[stage(1, tensor_eligible = true, precision = "bf16", accumulate = "promoted")]
    product: Matmul,
}

/// The imaginary parts' product with K = Im² + Re² in its epilogue (Re, the first product's
/// output, read at each output as the accumulator is stored): Im is never stored. Each precision
/// keeps its items in one domain: a second domain's manifold would take a share of the SMs from
/// the products.
#[derive(FusionBuilder)]
#[fusion(domain = "kernel_matrix")]
pub struct ProductModulusF32 {
    #[stage(1)]
    product: Matmul,
    #[stage(2)]
    abs2: Abs2,
}

/// [`ProductModulusF32`] from bf16 hi/lo operands on tensor cores.
#[derive(FusionBuilder)]
#[fusion(domain = "kernel_matrix_tc")]
pub struct ProductModulusSplit {
    #[stage(1, tensor_eligible = true, precision = "bf16", accumulate = "promoted")]
    product: Matmul,
    #[stage(2)]
    abs2: Abs2,
}

/// How a tile's products are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 operands on CUDA cores.
    F32,
    /// bf16 hi/lo splits of the f32 operands on tensor cores, three products summed.
    Bf16x3,
}

impl Precision {
    /// The name the tune cache and the output use.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16x3 => "bf16x3",
        }
    }

    /// The k of a product over states of `d` amplitudes.
    pub fn k(self, d: usize) -> usize {
        match self {
            Precision::F32 => 2 * d,
            Precision::Bf16x3 => 6 * d,
        }
    }

    /// Bytes of one operand value.
    pub fn operand_bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16x3 => 2,
        }
    }
}

/// N states of d complex amplitudes, row-major: state i's amplitude p is `re[i d + p]` +
/// i `im[i d + p]`.
pub struct States {
    pub n: usize,
    pub d: usize,
    pub re: Vec<f32>,
    pub im: Vec<f32>,
}

impl States {
    /// `n` random normalised states of `d` amplitudes from input streams `seed` (real parts)
    /// and `seed + 1` (imaginary parts), uniform in (−1, 1] before the normalisation (in f64).
    /// bench/peers_kernel_matrix.py draws the same.
    pub fn random(
        n: usize,
        d: usize,
        seed: u64,
        uniform: impl Fn(u64, usize) -> Vec<f32>,
    ) -> States {
        let mut re: Vec<f32> = uniform(seed, n * d).iter().map(|u| 2.0 * u - 1.0).collect();
        let mut im: Vec<f32> = uniform(seed + 1, n * d)
            .iter()
            .map(|u| 2.0 * u - 1.0)
            .collect();
        for i in 0..n {
            let row = i * d..(i + 1) * d;
            let norm: f64 = re[row.clone()]
                .iter()
                .zip(&im[row.clone()])
                .map(|(&a, &b)| f64::from(a) * f64::from(a) + f64::from(b) * f64::from(b))
                .sum::<f64>()
                .sqrt();
            for p in row {
                re[p] = (f64::from(re[p]) / norm) as f32;
                im[p] = (f64::from(im[p]) / norm) as f32;
            }
        }
        States { n, d, re, im }
    }

    /// K_ij = |⟨ψ_i|ψ_j⟩|² in f64 from the f32 amplitudes, `self` the rows and `other` the
    /// columns.
    pub fn kernel_f64(&self, i: usize, other: &States, j: usize) -> f64 {
        let d = self.d;
        let (mut re, mut im) = (0.0f64, 0.0f64);
        for p in 0..d {
            let (ar, ai) = (f64::from(self.re[i * d + p]), f64::from(self.im[i * d + p]));
            let (br, bi) = (
                f64::from(other.re[j * d + p]),
                f64::from(other.im[j * d + p]),
            );
            re += ar * br + ai * bi;
            im += ai * br - ar * bi;
        }
        re * re + im * im
    }

    /// Row i as the row operand's [re, im] (2d values).
    fn row(&self, i: usize) -> impl Iterator<Item = f32> + '_ {
        let d = self.d;
        self.re[i * d..(i + 1) * d]
            .iter()
            .chain(&self.im[i * d..(i + 1) * d])
            .copied()
    }
}

fn hi_lo(v: f32) -> (bf16, bf16) {
    let hi = bf16::from_f32(v);
    (hi, bf16::from_f32(v - hi.to_f32()))
}

/// A tile's row operand on the device: rows `r0 .. r0 + rows` of the states.
pub enum RowOperand {
    F32(Buffer<f32>),
    Split(Buffer<bf16>),
}

/// A tile's two column operands on the device: columns `c0 .. c0 + cols`.
pub enum ColOperands {
    F32 { re: Buffer<f32>, im: Buffer<f32> },
    Split { re: Buffer<bf16>, im: Buffer<bf16> },
}

/// The row operand (rows x k, row-major) of states `r0 .. r0 + rows`.
pub fn row_operand(
    rt: &Runtime,
    s: &States,
    r0: usize,
    rows: usize,
    precision: Precision,
) -> pptm::Result<RowOperand> {
    let k2 = 2 * s.d;
    match precision {
        Precision::F32 => {
            let v: Vec<f32> = (r0..r0 + rows).flat_map(|i| s.row(i)).collect();
            Ok(RowOperand::F32(rt.upload(&v)?))
        }
        Precision::Bf16x3 => {
            let mut v = Vec::with_capacity(rows * 3 * k2);
            for i in r0..r0 + rows {
                let (hi, lo): (Vec<bf16>, Vec<bf16>) = s.row(i).map(hi_lo).unzip();
                v.extend_from_slice(&hi);
                v.extend_from_slice(&hi);
                v.extend_from_slice(&lo);
            }
            Ok(RowOperand::Split(rt.upload(&v)?))
        }
    }
}

/// The two column operands (k x cols, row-major) of states `c0 .. c0 + cols`: column j of the
/// first is [b_re; b_im], of the second [−b_im; b_re].
pub fn col_operands(
    rt: &Runtime,
    s: &States,
    c0: usize,
    cols: usize,
    precision: Precision,
) -> pptm::Result<ColOperands> {
    let d = s.d;
    // Row p of the f32 operands (p < 2d).
    let value = |p: usize, j: usize, imaginary_part: bool| -> f32 {
        let (re, im) = (s.re[j * d + p % d], s.im[j * d + p % d]);
        match (imaginary_part, p < d) {
            (false, true) => re,
            (false, false) => im,
            (true, true) => -im,
            (true, false) => re,
        }
    };
    let f32_rows = |imaginary_part: bool| -> Vec<f32> {
        (0..2 * d)
            .flat_map(|p| (c0..c0 + cols).map(move |j| (p, j)))
            .map(|(p, j)| value(p, j, imaginary_part))
            .collect()
    };
    match precision {
        Precision::F32 => Ok(ColOperands::F32 {
            re: rt.upload(&f32_rows(false))?,
            im: rt.upload(&f32_rows(true))?,
        }),
        Precision::Bf16x3 => {
            let split = |rows: Vec<f32>| -> Vec<bf16> {
                let (hi, lo): (Vec<bf16>, Vec<bf16>) = rows.into_iter().map(hi_lo).unzip();
                [&hi[..], &lo[..], &hi[..]].concat()
            };
            Ok(ColOperands::Split {
                re: rt.upload(&split(f32_rows(false)))?,
                im: rt.upload(&split(f32_rows(true)))?,
            })
        }
    }
}

/// A tile's intermediate (the real parts) and result on the device (rows x cols each).
pub struct TileBuffers {
    pub rows: usize,
    pub cols: usize,
    pub re: Buffer<f32>,
    pub k: Buffer<f32>,
}

impl TileBuffers {
    /// Buffers for a rows x cols tile, the result poisoned with NaN (an unwritten element shows).
    pub fn new(rt: &Runtime, rows: usize, cols: usize) -> pptm::Result<TileBuffers> {
        let mut k = rt.alloc(rows * cols)?;
        k.fill(f32::NAN)?;
        Ok(TileBuffers {
            rows,
            cols,
            re: rt.alloc(rows * cols)?,
            k,
        })
    }
}

impl TileBuffers {
    /// (rows, cols), as tiles name their shape.
    pub fn shape(&self) -> (u64, u64) {
        (self.rows as u64, self.cols as u64)
    }
}

/// Pushes the two items of one tile (rows x cols outputs from row operand `x` and column
/// operands `w`, k = `k`) into `p`.
#[allow(clippy::too_many_arguments)]
pub fn push_tile<'a>(
    p: &mut Pipeline<'a>,
    x: &'a RowOperand,
    w: &'a ColOperands,
    out: &'a mut TileBuffers,
    rows: usize,
    k: usize,
    cols: usize,
) -> pptm::Result<()> {
    let (re, kk) = (p.output(&mut out.re), p.output(&mut out.k));
    match (x, w) {
        (RowOperand::F32(x), ColOperands::F32 { re: wr, im: wi }) => {
            let (x, wr, wi) = (p.input(x), p.input(wr), p.input(wi));
            ProductF32::push(p, x, wr, re, rows, k, cols)?;
            ProductModulusF32::push(p, x, wi, re, kk, rows, k, cols)?;
        }
        (RowOperand::Split(x), ColOperands::Split { re: wr, im: wi }) => {
            let (x, wr, wi) = (p.input(x), p.input(wr), p.input(wi));
            ProductSplit::push(p, x, wr, re, rows, k, cols)?;
            ProductModulusSplit::push(p, x, wi, re, kk, rows, k, cols)?;
        }
        _ => {
            return Err(pptm::Error::BadArguments {
                chain: "kernel_matrix tile",
                reason: "the row and column operands have different precisions".into(),
            });
        }
    }
    Ok(())
}

//! Binding a submission's arguments to a lowered chain ([`ChainIr::bind`]) and the sizes that
//! follow from them (blocks asked for, stage output lengths): what the runtime needs per item,
//! apart from the lowering that runs once per chain.

use super::{ArgKind, ArgSlot, ChainIr, Pattern, Shape, Source, StageIr};
use crate::ops::{Anchor, FusionClass};

/// One argument at submission, by descriptor slot (see [`ChainIr::bind`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    /// A buffer (input or output) of this many elements.
    Buffer(usize),
    /// An f32 passed by value ([`ArgKind::F32`]).
    F32(f32),
    /// A u32 passed by value ([`ArgKind::U32`]).
    U32(u32),
    /// The size of a dimension that is not inferred from a buffer.
    Dim(usize),
    /// A dimension inferred from a buffer's length: nothing to pass. Also what the guard level's
    /// slot takes, which the runtime fills in.
    Inferred,
}

/// The largest size (exclusive) a descriptor carries for a dimension: the device's argument checks
/// refuse anything from 2^48 on (codegen/src/cuda/mod.rs), and `ChainIr::bind` refuses it first.
pub const MAX_DIM: u64 = 1 << 48;

/// Why a submission's arguments do not fit the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// A value of the wrong kind for its slot (a size where a buffer goes, a size passed for a
    /// dimension a buffer gives...).
    #[error("expected {expected} for argument `{arg}`, got {got}")]
    Kind {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// What the slot takes, in words ("a buffer", "nothing (the size comes from a buffer)").
        expected: &'static str,
        /// The value passed, as `Debug` shows it.
        got: String,
    },
    /// A buffer's length is not the product of its dimensions' sizes.
    #[error("argument `{arg}` has {got} elements, but {rule} makes {expected}")]
    Length {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// The elements the dimensions make.
        expected: usize,
        /// The buffer's length.
        got: usize,
        /// How the dimensions make the count, for the message: `m x n = 3 x 2`, or the buffer
        /// that gave a one-dimensional size.
        rule: String,
    },
    /// A buffer's element count, or its size in f32 bytes, overflows `usize`.
    #[error("argument `{arg}` would have more elements than fit in memory ({rule})")]
    Overflow {
        /// The argument's name ([`ArgSlot::name`]).
        arg: String,
        /// How the dimensions make the count, for the message: `m x n = 3 x 2`, or the buffer
        /// that gave a one-dimensional size.
        rule: String,
    },
    /// Descriptors carry sizes below 2^48 (`MAX_DIM`), and the device refuses larger ones.
    #[error("{dim} = {size} is not below 2^48, the largest size a descriptor carries")]
    DimTooLarge {
        /// The dimension's name ([`DimIr::name`](super::DimIr::name)).
        dim: String,
        /// The size it was given or inferred to have.
        size: usize,
    },
    /// A side of a table (`pptm::Table`) is 2^32 or more: the device indexes a table's rows and
    /// columns with 32-bit integers.
    #[error("table `{arg}` is {rows} x {cols}; each side of a table is below 2^32")]
    TableTooLarge {
        /// The table argument's name.
        arg: String,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
    },
    /// A stage's output, which no buffer holds (a GEMV-T reduced to a scalar), would not fit in
    /// memory: the CPU backend computes it in f64 (and the unfused variant stores it).
    #[error("the output of `{op}` would have more elements than fit in memory ({rule})")]
    StageTooLarge {
        /// The stage's op.
        op: &'static str,
        /// How the output's dimensions make its count (`m x n = 3 x 2`).
        rule: String,
    },
    /// The op's own check ([`OpDef::check`](crate::OpDef::check)) refused its by-value arguments
    /// or sizes.
    #[error("`{op}`: {reason}")]
    Op {
        /// The stage's op.
        op: &'static str,
        /// What the check said.
        reason: String,
    },
}

impl ChainIr {
    /// Descriptor slots of the input buffers, in order.
    pub fn input_slots(&self) -> impl Iterator<Item = (usize, &ArgSlot)> {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| a.kind == ArgKind::Input)
    }

    /// The slot of the output buffer, if the chain writes one.
    pub fn output_slot(&self) -> Option<usize> {
        self.args.iter().position(|a| a.kind == ArgKind::Output)
    }

    /// The guarded stage, if any: its index and tolerance, and the descriptor slot of the guard
    /// level ([`ArgKind::Guard`]).
    pub fn guard(&self) -> Option<(usize, f64, usize)> {
        let (s, st) = self
            .stages
            .iter()
            .enumerate()
            .find(|(_, st)| st.tolerance.is_some())?;
        let slot = self.args.iter().position(|a| a.kind == ArgKind::Guard)?;
        Some((s, st.tolerance?, slot))
    }

    /// The descriptor slot of the runtime's working memory ([`ArgKind::Scratch`]), and the
    /// bytes an item of these dimension sizes needs there: a `precision = "bf16x3"` product's
    /// split operands. None for a chain without such a stage.
    ///
    /// The layout (kernels/pptm/pattern/wgmma.cuh, `pptm_matmul_bf16x3`): with k rounded up to a
    /// multiple of 64 (kp) and n to a multiple of 8 (np), A's halves as one bf16 matrix of m rows
    /// of 2 kp values (hi, then lo, zero past k), then, 128-byte aligned, W's as one of 2 kp rows
    /// (hi rows, then lo rows, zero past k) of np values (zero past n).
    pub fn scratch(&self, sizes: &[usize]) -> Option<(usize, u64)> {
        let slot = self.args.iter().position(|a| a.kind == ArgKind::Scratch)?;
        let st = self
            .stages
            .iter()
            .find(|st| st.precision == crate::Precision::Bf16x3)?;
        let dim = |l: &str| st.dim(l).map_or(0, |d| sizes.get(d).copied().unwrap_or(0)) as u64;
        let (m, k, n) = (dim("m"), dim("k"), dim("n"));
        let (kp, np) = (k.div_ceil(64) * 64, n.div_ceil(8) * 8);
        // Saturating: sizes near MAX_DIM overflow 64 bits, and no allocation of that size exists.
        let a = m.saturating_mul(4 * kp).div_ceil(128).saturating_mul(128);
        Some((
            slot,
            a.saturating_add(kp.saturating_mul(np).saturating_mul(4)),
        ))
    }

    /// The reduction that ends the chain's pass, if any.
    pub fn reduction(&self) -> Option<&StageIr> {
        self.plan.reduction.map(|r| &self.stages[r])
    }

    /// Whether stage `s` is a reduction that folds rows, one value per row, rather than the
    /// chain's reduction to one value: the rows of a pairwise stage's values (one a point) or of
    /// a matrix (`per_row = true`).
    pub fn folds_rows(&self, s: usize) -> bool {
        self.folds_pair_rows(s) || self.stages[s].per_row
    }

    /// Whether stage `s` is a reduction that folds the rows of a pairwise stage's values.
    pub fn folds_pair_rows(&self, s: usize) -> bool {
        self.stages[s].op.class == FusionClass::Reduction
            && matches!(
                self.stages[s].inputs[0],
                Source::Stage(p) if matches!(self.stages[p].shape, Shape::Pairs { .. })
            )
    }

    /// "m x n = 3 x 2": how dimensions and their sizes make a count, for error messages.
    fn dims_rule(&self, dims: &[usize], sizes: &[usize]) -> String {
        let names: Vec<&str> = dims.iter().map(|&d| self.dims[d].name.as_str()).collect();
        let values: Vec<String> = dims.iter().map(|&d| sizes[d].to_string()).collect();
        format!("{} = {}", names.join(" x "), values.join(" x "))
    }

    /// Checks a submission's arguments (one per descriptor slot) and works out every
    /// dimension's size, in [`ChainIr::dims`] order.
    pub fn bind(&self, args: &[ArgValue]) -> Result<Vec<usize>, BindError> {
        assert_eq!(args.len(), self.args.len(), "one value per descriptor slot");
        let kind_err = |slot: usize, expected: &'static str| BindError::Kind {
            arg: self.args[slot].name.clone(),
            expected,
            got: format!("{:?}", args[slot]),
        };
        for (slot, (a, v)) in self.args.iter().zip(args).enumerate() {
            let ok = match a.kind {
                ArgKind::Input | ArgKind::Output => matches!(v, ArgValue::Buffer(_)),
                ArgKind::F32 => matches!(v, ArgValue::F32(_)),
                ArgKind::U32 => matches!(v, ArgValue::U32(_)),
                ArgKind::Guard | ArgKind::Scratch => matches!(v, ArgValue::Inferred),
                ArgKind::Len => {
                    let inferred = self.dims[a.dim.expect("len slot")].inferred_from.is_some();
                    matches!(
                        (inferred, v),
                        (true, ArgValue::Inferred) | (false, ArgValue::Dim(_))
                    )
                }
            };
            if !ok {
                let expected = match a.kind {
                    ArgKind::Input | ArgKind::Output => "a buffer",
                    ArgKind::F32 => "an f32",
                    ArgKind::U32 => "a u32",
                    ArgKind::Guard => "nothing (the runtime fills in the guard level)",
                    ArgKind::Scratch => "nothing (the runtime lends the working memory)",
                    ArgKind::Len if self.dims[a.dim.unwrap()].inferred_from.is_some() => {
                        "nothing (the size comes from a buffer)"
                    }
                    ArgKind::Len => "a size",
                };
                return Err(kind_err(slot, expected));
            }
        }
        let len_of = |slot: usize| match args[slot] {
            ArgValue::Buffer(n) => n,
            _ => unreachable!("checked"),
        };
        // A buffer of a state's fields holds `channels` values per element (its length is checked
        // against the product below, which catches one that is not a whole number of states).
        let sizes: Vec<usize> = self
            .dims
            .iter()
            .map(|d| match (d.inferred_from, args[d.slot]) {
                (Some(src), _) => len_of(src) / usize::from(self.args[src].channels.max(1)),
                (None, ArgValue::Dim(v)) => v,
                _ => unreachable!("checked"),
            })
            .collect();
        // The rule a buffer's length follows, for errors only: formatted on every submission,
        // it was most of a small item's host-side cost.
        let rule = |slot: usize, a: &ArgSlot| {
            let base = match a.shape.as_slice() {
                [d] => match self.dims[*d].inferred_from {
                    Some(src) if src != slot => {
                        format!("`{}` (with {} elements)", self.args[src].name, len_of(src))
                    }
                    Some(src) if self.args[src].channels > 1 => format!(
                        "{} = {} states (whole states of {} values)",
                        self.dims[*d].name, sizes[*d], self.args[src].channels
                    ),
                    _ => format!("{} = {}", self.dims[*d].name, sizes[*d]),
                },
                dims => self.dims_rule(dims, &sizes),
            };
            if a.channels > 1 {
                format!("{base}, {} values each", a.channels)
            } else {
                base
            }
        };
        // The device checks every size against the same limit (codegen's argument checks); one
        // it would refuse is a typed error here, on every backend alike.
        if let Some((d, &size)) = sizes
            .iter()
            .enumerate()
            .find(|&(_, &s)| s as u64 >= MAX_DIM)
        {
            return Err(BindError::DimTooLarge {
                dim: self.dims[d].name.clone(),
                size,
            });
        }
        for (slot, a) in self.args.iter().enumerate() {
            if !matches!(a.kind, ArgKind::Input | ArgKind::Output) {
                continue;
            }
            let expected = a
                .shape
                .iter()
                .try_fold(usize::from(a.channels.max(1)), |acc, &d| {
                    acc.checked_mul(sizes[d])
                })
                .filter(|&e| e.checked_mul(4).is_some())
                .ok_or_else(|| BindError::Overflow {
                    arg: a.name.clone(),
                    rule: rule(slot, a),
                })?;
            let got = len_of(slot);
            if got != expected {
                return Err(BindError::Length {
                    arg: a.name.clone(),
                    expected,
                    got,
                    rule: rule(slot, a),
                });
            }
        }
        // Tables are indexed by 32-bit rows and columns on the device (op_fn's pptm_table).
        for st in &self.stages {
            for (p, src) in st.op.inputs.iter().zip(&st.inputs) {
                let (crate::ops::Ty::Table(..), Source::Arg(slot)) = (p.ty, src) else {
                    continue;
                };
                let a = &self.args[*slot];
                if let [r, c] = a.shape[..]
                    && (sizes[r] > u32::MAX as usize || sizes[c] > u32::MAX as usize)
                {
                    return Err(BindError::TableTooLarge {
                        arg: a.name.clone(),
                        rows: sizes[r],
                        cols: sizes[c],
                    });
                }
            }
        }
        // Every stage's output must fit in memory too, as f64 values, even where no buffer holds
        // it: a size no buffer bounds (`n` of a GEMV-T whose m is 0) could be anything.
        for st in &self.stages {
            let Shape::Tensor { dims, channels } = &st.shape else {
                continue;
            };
            let fits = dims
                .iter()
                .try_fold(usize::from(*channels), |acc, &d| acc.checked_mul(sizes[d]))
                .is_some_and(|e| e <= isize::MAX as usize / 8);
            if !fits {
                return Err(BindError::StageTooLarge {
                    op: st.op.name,
                    rule: self.dims_rule(dims, &sizes),
                });
            }
        }
        for st in &self.stages {
            if let Some(check) = st.op.check {
                let (scalars, dims) = self.op_values(st, args, &sizes);
                check(&scalars, &dims).map_err(|reason| BindError::Op {
                    op: st.op.name,
                    reason,
                })?;
            }
        }
        Ok(sizes)
    }

    /// A stage's by-value arguments and dimension sizes, as its op sees them.
    fn op_values(
        &self,
        st: &StageIr,
        args: &[ArgValue],
        sizes: &[usize],
    ) -> (Vec<f64>, Vec<(&'static str, usize)>) {
        let scalars = st
            .op
            .inputs
            .iter()
            .zip(&st.inputs)
            .filter(|(p, _)| p.ty.is_by_value())
            .map(|(_, src)| match src {
                Source::Arg(slot) => match args[*slot] {
                    ArgValue::F32(v) => f64::from(v),
                    ArgValue::U32(v) => f64::from(v),
                    _ => f64::NAN,
                },
                Source::Stage(_) => f64::NAN,
            })
            .collect();
        let dims = st.dims.iter().map(|&(l, d)| (l, sizes[d])).collect();
        (scalars, dims)
    }

    /// How many compute blocks an item asks for, given its dimension sizes (the device caps it
    /// at its grid). A small input stays on one block, so it costs no grid-wide arrival.
    pub fn blocks_for(&self, sizes: &[usize]) -> u32 {
        // The fused pass spreads the work of the stage that sets its shape: the anchor, the row
        // reduction of a pairwise pair (points, not pairs), or the first stage of a map.
        let s = match (self.plan.pattern, self.plan.anchor) {
            (Pattern::Map, _) | (_, None) => 0,
            // (The anchor of `Rows`: the row-wise reduction.)
            (Pattern::Pairwise, Some(a)) => a + 1,
            (_, Some(a)) => a,
        };
        self.stage_blocks(s, sizes)
    }

    /// Values (channels included) stage `s` produces when the chain runs unfused, one kernel per
    /// stage with its output stored: a pairwise stage stores its n×n values, a reduction one.
    /// Saturates at `usize::MAX` (which no allocation satisfies) rather than wrapping: `bind` bounds
    /// the buffers' lengths, not n×n.
    pub fn stage_output_len(&self, s: usize, sizes: &[usize]) -> usize {
        let channels = |c: u8| usize::from(c);
        match &self.stages[s].shape {
            Shape::Tensor { dims, channels: c } => dims
                .iter()
                .fold(channels(*c), |acc, &d| acc.saturating_mul(sizes[d])),
            Shape::Pairs { dim, channels: c } => sizes[*dim]
                .saturating_mul(sizes[*dim])
                .saturating_mul(channels(*c)),
            Shape::Scalar => 1,
        }
    }

    /// Blocks stage `s` asks for when the chain runs unfused.
    pub fn stage_blocks(&self, s: usize, sizes: &[usize]) -> u32 {
        use crate::work;
        let st = &self.stages[s];
        let dim = |l: &str| sizes[st.dim(l).expect("op letter")];
        // Products a batched matmul computes (1 for every other op).
        let batch = st.dim("batch").map_or(1, |d| sizes[d]);
        let blocks = match st.op.class {
            // Rows (of a matrix, or a pairwise stage's points), one a warp. A small matrix too:
            // on one block, each warp's rows are folded one after the other, a memory round trip
            // each, and 64 x 64 took 4.7 µs on the device against 3.8 on four blocks (H100).
            FusionClass::Reduction if self.folds_rows(s) => self
                .stage_output_len(s, sizes)
                .div_ceil(work::ROWS_PER_BLOCK),
            FusionClass::Elementwise | FusionClass::Broadcast | FusionClass::Reduction => self
                .flow_elements(s, sizes)
                .div_ceil(self.map_elems_per_block()),
            FusionClass::OutputFusable(Anchor::Gemv) if st.tensor => {
                dim("m").div_ceil(work::GEMV_MMA_ROWS)
            }
            FusionClass::OutputFusable(Anchor::Gemv) => {
                let m = dim("m");
                m.div_ceil(if m < work::GEMV_SHORT_BELOW {
                    work::GEMV_SHORT_ROWS_PER_BLOCK
                } else {
                    work::GEMV_ROWS_PER_BLOCK
                })
            }
            FusionClass::OutputFusable(Anchor::GemvT) => {
                let n = dim("n");
                n.div_ceil(if n < work::GEMV_T_NARROW_BELOW {
                    work::GEMV_T_NARROW_COLS_PER_BLOCK
                } else {
                    work::GEMV_T_COLS_PER_BLOCK
                })
            }
            FusionClass::OutputFusable(_) if st.tensor => {
                // Tiles are numbered across a batched product's whole batch, and the tile size
                // is chosen from their total (pptm_matmul_mma_batched does the same).
                let tiles = |rows, cols| {
                    dim("m")
                        .div_ceil(rows)
                        .saturating_mul(dim("n").div_ceil(cols))
                        .saturating_mul(batch)
                };
                // A batch of products no taller than a small tile keeps small tiles: a large
                // one would be half empty.
                let short = batch > 1 && dim("m") <= work::MMA_SMALL_TILE;
                match tiles(work::MMA_LARGE_ROWS, work::MMA_LARGE_COLS) {
                    t if t >= work::MMA_LARGE_FROM && !short => t,
                    _ => tiles(work::MMA_SMALL_TILE, work::MMA_SMALL_TILE),
                }
            }
            FusionClass::OutputFusable(_) => {
                let tiles = |edge| {
                    dim("m")
                        .div_ceil(edge)
                        .saturating_mul(dim("n").div_ceil(edge))
                };
                let direct = dim("m")
                    .div_ceil(work::MATMUL_DIRECT_ROWS)
                    .saturating_mul(dim("n").div_ceil(work::MATMUL_DIRECT_COLS));
                // The f32 patterns choose a tile size per product; a batched product's tiles are
                // numbered across the batch (pptm_matmul_batched).
                // A product (not a batch) of vector rows takes 128 x 128 tiles when there are
                // enough of them (the device also needs 16-byte-aligned operands, which a buffer
                // is).
                let large = st.dim("batch").is_none()
                    && dim("k") % 4 == 0
                    && dim("n") % 4 == 0
                    && tiles(work::MATMUL_LARGE_TILE) >= work::MATMUL_LARGE_FROM;
                let per_product = match tiles(work::MATMUL_TILE) {
                    _ if direct <= work::MATMUL_DIRECT_MAX_TILES => direct,
                    _ if large => tiles(work::MATMUL_LARGE_TILE),
                    t if t < work::MATMUL_SMALL_BELOW => tiles(work::MATMUL_SMALL_TILE),
                    t => t,
                };
                per_product.saturating_mul(batch)
            }
            FusionClass::Pairwise => dim("n")
                .saturating_mul(dim("n"))
                .div_ceil(work::MAP_ELEMS_PER_BLOCK),
            FusionClass::RowReduction => dim("n").div_ceil(work::PAIRWISE_POINTS_PER_BLOCK),
        };
        blocks.clamp(1, u32::MAX as usize) as u32
    }

    /// Elements per block of an elementwise pass: [`work::MAP_ELEMS_PER_BLOCK`](crate::work),
    /// or [`work::HEAVY_ELEMS_PER_BLOCK`](crate::work) where each element is much work (a state,
    /// a table, or a run of [`work::HEAVY_MAP_STEPS`](crate::work) elementwise steps or more, as
    /// `repeat` makes), so that the elements spread over the SMs instead of queueing on the
    /// threads of a few.
    pub fn map_elems_per_block(&self) -> usize {
        use crate::work;
        if self.lanes() > 1 {
            // One element a group of lanes: a block's threads over its lanes.
            return crate::BLOCK_THREADS as usize / self.lanes();
        }
        let steps = self
            .stages
            .iter()
            .filter(|st| st.op.class == FusionClass::Elementwise)
            .count();
        // (A table is read whole, never element by element: the vector loads of the light
        // pass cannot take one.)
        let states = self.reads_tables()
            || self
                .stages
                .iter()
                .any(|st| st.op.states != crate::ops::StateTypes::NONE);
        if states || steps >= work::HEAVY_MAP_STEPS {
            work::HEAVY_ELEMS_PER_BLOCK
        } else {
            work::MAP_ELEMS_PER_BLOCK
        }
    }

    /// Whether the chain's elementwise pass takes its elements one a thread (or a group of
    /// lanes), `pptm_map_each`, rather than streaming them with vector loads: a heavy pass (a
    /// state, a table, a long `repeat`) or one with lanes.
    pub fn maps_each(&self) -> bool {
        self.lanes() > 1 || self.map_elems_per_block() == crate::work::HEAVY_ELEMS_PER_BLOCK
    }

    /// The threads that share each element of the chain's elementwise pass: its elementwise
    /// stages' largest [`OpDef::lanes`](crate::OpDef) where the chain is an elementwise pass
    /// (`Pattern::Map`), else 1 (a stage fused into a product's epilogue or a row's fold runs
    /// its `lanes(a..b)` loops on one thread).
    pub fn lanes(&self) -> usize {
        if self.plan.pattern != Pattern::Map {
            return 1;
        }
        self.stages
            .iter()
            .filter(|st| st.op.class == FusionClass::Elementwise)
            .map(|st| usize::from(st.op.lanes.max(1)))
            .max()
            .unwrap_or(1)
    }

    /// Whether a stage reads a table: a buffer read at computed coordinates, any element of it
    /// from any thread (so an item that reads a buffer this way waits for the whole of the item
    /// that wrote it, never tile by tile).
    pub fn reads_tables(&self) -> bool {
        self.stages.iter().any(|st| {
            st.op
                .inputs
                .iter()
                .any(|p| matches!(p.ty, crate::ops::Ty::Table(..)))
        })
    }

    /// Elements (not channels) of the value stage `s` reads as its flow input.
    pub fn flow_elements(&self, s: usize, sizes: &[usize]) -> usize {
        let dims = if s == 0 {
            match self.stages[0].inputs[0] {
                Source::Arg(slot) => self.args[slot].shape.clone(),
                Source::Stage(_) => unreachable!(),
            }
        } else {
            match &self.stages[s - 1].shape {
                Shape::Tensor { dims, .. } => dims.clone(),
                Shape::Pairs { dim, .. } => vec![*dim],
                Shape::Scalar => vec![],
            }
        };
        dims.iter()
            .fold(1, |acc: usize, &d| acc.saturating_mul(sizes[d]))
    }

    /// Short human-readable form: `KlDivergence -> SumReduction`.
    pub fn describe(&self) -> String {
        // A stage repeated k times (consecutive stages of one op and one declared number) shows
        // once, as `Op x k`.
        let mut parts: Vec<String> = Vec::new();
        let mut k = 0;
        while k < self.stages.len() {
            let s = &self.stages[k];
            let run = self.stages[k..]
                .iter()
                .take_while(|t| t.number == s.number && t.op.name == s.op.name)
                .count();
            parts.push(if run > 1 {
                format!("{} x {run}", s.op.name)
            } else {
                s.op.name.to_string()
            });
            k += run;
        }
        parts.join(" -> ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Precision;
    use crate::lower::test_support::{chain, ops, stage};
    use crate::lower::{EvalArg, Evaluated, lower};

    #[test]
    fn slots_guard_and_reduction_are_found() {
        let kl = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let inputs: Vec<(usize, &str)> = kl
            .input_slots()
            .map(|(s, a)| (s, a.name.as_str()))
            .collect();
        assert_eq!(inputs, [(0, "q"), (1, "p")]);
        assert_eq!(kl.output_slot(), None);
        assert_eq!(kl.reduction().map(|st| st.op.name), Some("SumReduction"));
        assert_eq!(kl.guard(), None);
        let terms = ops(&["KlDivergence"]).unwrap();
        assert_eq!(terms.output_slot(), Some(2));
        assert!(terms.reduction().is_none());
        // A guarded matmul: the stage, its tolerance and the guard level's slot (after the sizes).
        let mut s = stage(1, "Matmul");
        s.tensor_eligible = Some(true);
        s.precision = Some(Precision::Bf16);
        s.tolerance = Some(crate::Tolerance(0.25));
        let guarded = lower(&chain(vec![stage(2, "Relu"), s])).unwrap();
        let slot = guarded
            .args
            .iter()
            .position(|a| a.kind == ArgKind::Guard)
            .unwrap();
        assert_eq!(slot, guarded.args.len() - 1);
        assert_eq!(guarded.guard(), Some((0, 0.25, slot)));
        let inputs: Vec<&str> = guarded
            .input_slots()
            .map(|(_, a)| a.name.as_str())
            .collect();
        assert_eq!(inputs, ["a", "w"]);
    }

    /// A size passed where a buffer gives it, or missing where none does, is named in the error;
    /// a buffer's length rule names the buffer its size comes from.
    #[test]
    fn bind_errors_say_what_was_expected() {
        let ir = ops(&["Gemv"]).unwrap(); // x[n], a[m x n] -> out[m]
        let slot = |name: &str| ir.args.iter().position(|a| a.name == name).unwrap();
        let base = || -> Vec<ArgValue> {
            ir.args
                .iter()
                .map(|a| match (a.kind, a.name.as_str()) {
                    (ArgKind::Input, "x") => ArgValue::Buffer(3),
                    (ArgKind::Input, _) => ArgValue::Buffer(6),
                    (ArgKind::Output, _) => ArgValue::Buffer(2),
                    _ => ArgValue::Inferred,
                })
                .collect()
        };
        assert_eq!(ir.bind(&base()).unwrap().len(), ir.dims.len());
        let mut a = base();
        a[slot("n")] = ArgValue::Dim(3);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(e.contains("nothing (the size comes from a buffer)"), "{e}");
        // `a` has m x n = 2 x 3 elements, n from `x`'s length.
        let mut a = base();
        a[slot("a")] = ArgValue::Buffer(7);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(e.contains("argument `a` has 7 elements"), "{e}");
        // m comes from `out`'s length: a longer `out` makes `a` the wrong length.
        let mut a = base();
        a[slot("out")] = ArgValue::Buffer(5);
        let e = ir.bind(&a).unwrap_err().to_string();
        assert!(
            e.contains("argument `a` has 6 elements, but m x n = 5 x 3 makes 15"),
            "{e}"
        );
        // Two vectors of one length: the second's rule names the first.
        let kl = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let vals = [ArgValue::Buffer(4), ArgValue::Buffer(5), ArgValue::Inferred];
        let e = kl.bind(&vals).unwrap_err().to_string();
        assert!(
            e.contains("argument `p` has 5 elements, but `q` (with 4 elements) makes 4"),
            "{e}"
        );
        // A chain whose size no buffer gives wants it passed.
        let mm = ops(&["Matmul"]).unwrap();
        let vals: Vec<ArgValue> = mm
            .args
            .iter()
            .map(|a| match a.kind {
                ArgKind::Input | ArgKind::Output => ArgValue::Buffer(4),
                _ => ArgValue::Inferred,
            })
            .collect();
        let e = mm.bind(&vals).unwrap_err().to_string();
        assert!(e.contains("expected a size"), "{e}");
    }

    /// The blocks each stage asks for when the chain runs unfused, at every boundary of the
    /// rules the device shares (crate::work).
    #[test]
    fn unfused_stages_ask_for_blocks_by_the_shared_rules() {
        use crate::work::*;
        let blocks = |ir: &ChainIr, s: usize, dims: &[(&str, usize)]| {
            let mut sizes = vec![0; ir.dims.len()];
            for &(l, v) in dims {
                sizes[ir.stages[s].dim(l).unwrap()] = v;
            }
            ir.stage_blocks(s, &sizes)
        };
        let gemv = ops(&["Gemv"]).unwrap();
        let short = GEMV_SHORT_BELOW - 1;
        let b = |m| blocks(&gemv, 0, &[("m", m), ("n", 8)]);
        assert_eq!(b(short) as usize, short.div_ceil(GEMV_SHORT_ROWS_PER_BLOCK));
        assert_eq!(
            b(GEMV_SHORT_BELOW) as usize,
            GEMV_SHORT_BELOW.div_ceil(GEMV_ROWS_PER_BLOCK)
        );
        let mut spec = chain(vec![stage(1, "Gemv")]);
        spec.stages[0].tensor_eligible = Some(true);
        spec.stages[0].precision = Some(Precision::Bf16);
        let tensor = lower(&spec).unwrap();
        // Tall enough that CUDA cores would take GEMV_ROWS_PER_BLOCK rows a block.
        let tall = GEMV_SHORT_BELOW + 1000;
        assert_eq!(
            blocks(&tensor, 0, &[("m", tall), ("n", 8)]) as usize,
            tall.div_ceil(GEMV_MMA_ROWS)
        );
        let gemv_t = ops(&["GemvT"]).unwrap();
        let narrow = GEMV_T_NARROW_BELOW - 1;
        let b = |n| blocks(&gemv_t, 0, &[("m", 8), ("n", n)]);
        assert_eq!(
            b(narrow) as usize,
            narrow.div_ceil(GEMV_T_NARROW_COLS_PER_BLOCK)
        );
        assert_eq!(
            b(GEMV_T_NARROW_BELOW) as usize,
            GEMV_T_NARROW_BELOW.div_ceil(GEMV_T_COLS_PER_BLOCK)
        );
        // f32 matmul: direct tiles while few, else MATMUL_TILE tiles, or small ones when those
        // would be fewer than MATMUL_SMALL_BELOW.
        let mm = ops(&["Matmul"]).unwrap();
        let b = |m: usize, n: usize| blocks(&mm, 0, &[("m", m), ("k", 4), ("n", n)]) as usize;
        let direct =
            |m: usize, n: usize| m.div_ceil(MATMUL_DIRECT_ROWS) * n.div_ceil(MATMUL_DIRECT_COLS);
        let tiles = |m: usize, n: usize, e: usize| m.div_ceil(e) * n.div_ceil(e);
        let (m, n) = (MATMUL_DIRECT_ROWS * 16, MATMUL_DIRECT_COLS * 16); // exactly the most direct tiles
        assert_eq!(direct(m, n), MATMUL_DIRECT_MAX_TILES);
        assert_eq!(b(m, n), MATMUL_DIRECT_MAX_TILES);
        let (m, n) = (m + 1, n); // one more row of direct tiles: MATMUL_TILE tiles, few: small ones
        assert!(tiles(m, n, MATMUL_TILE) < MATMUL_SMALL_BELOW);
        assert_eq!(b(m, n), tiles(m, n, MATMUL_SMALL_TILE));
        let (m, n) = (MATMUL_TILE * 8, MATMUL_TILE * 8); // exactly MATMUL_SMALL_BELOW big tiles
        assert_eq!(tiles(m, n, MATMUL_TILE), MATMUL_SMALL_BELOW);
        assert_eq!(b(m, n), MATMUL_SMALL_BELOW);
        // Enough tiles of MATMUL_LARGE_TILE: those, where k and n are multiples of 4.
        let (m, n) = (MATMUL_LARGE_TILE * 8, MATMUL_LARGE_TILE * 16);
        assert_eq!(tiles(m, n, MATMUL_LARGE_TILE), MATMUL_LARGE_FROM);
        assert_eq!(b(m, n), MATMUL_LARGE_FROM);
        assert_eq!(b(m - 1, n), MATMUL_LARGE_FROM); // any m
        assert_eq!(b(m, n - 1), tiles(m, n - 1, MATMUL_TILE)); // rows of n % 4 != 0
        let odd_k = blocks(&mm, 0, &[("m", m), ("k", 5), ("n", n)]) as usize;
        assert_eq!(odd_k, tiles(m, n, MATMUL_TILE));
        let (m, n) = (MATMUL_LARGE_TILE * 8, MATMUL_LARGE_TILE * 15); // one short of the large tiles
        assert_eq!(b(m, n), tiles(m, n, MATMUL_TILE));
        // Elementwise passes: MAP_ELEMS_PER_BLOCK each; pairwise rows: points per block.
        let map = ops(&["Relu"]).unwrap();
        let mut sizes = vec![0; map.dims.len()];
        sizes[map.args[0].shape[0]] = MAP_ELEMS_PER_BLOCK + 1;
        assert_eq!(map.stage_blocks(0, &sizes), 2);
        // A later stage's flow is the stage before's output (a reduction's own shape is a scalar).
        let sum = ops(&["Square", "SumReduction"]).unwrap();
        let mut sizes = vec![0; sum.dims.len()];
        sizes[sum.args[0].shape[0]] = MAP_ELEMS_PER_BLOCK + 1;
        assert_eq!(sum.flow_elements(1, &sizes), MAP_ELEMS_PER_BLOCK + 1);
        assert_eq!(sum.stage_blocks(1, &sizes), 2);
        let pairs = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        assert_eq!(
            blocks(&pairs, 1, &[("n", 33)]) as usize,
            33usize.div_ceil(PAIRWISE_POINTS_PER_BLOCK)
        );
    }

    #[test]
    fn a_stage_output_too_large_for_memory_is_a_bind_error() {
        // Found by tests/dsl_fuzz.rs: with m = 0, x and A are empty whatever n is, and n (a size
        // parameter: the GEMV-T's output is reduced, not stored) sized the f64 reference's output
        // vector ("capacity overflow" for n = 2^64 - 1).
        let ir = ops(&["GemvT", "SumReduction"]).unwrap();
        let args = |n: usize| -> Vec<ArgValue> {
            ir.args
                .iter()
                .map(|a| match (a.kind, a.name.as_str()) {
                    (ArgKind::Len, "n") => ArgValue::Dim(n),
                    (ArgKind::Len, _) => ArgValue::Inferred,
                    _ => ArgValue::Buffer(0),
                })
                .collect()
        };
        // Such sizes are refused before any stage is sized: descriptors carry sizes below
        // MAX_DIM, so an n that no buffer bounds is refused as too large.
        for n in [
            usize::MAX,
            usize::MAX / 4,
            isize::MAX as usize / 8 + 1,
            MAX_DIM as usize,
        ] {
            match ir.bind(&args(n)) {
                Err(BindError::DimTooLarge { dim, size }) => {
                    assert_eq!((dim.as_str(), size), ("n", n))
                }
                other => panic!("n = {n}: {other:?}"),
            }
        }
        assert!(ir.bind(&args(MAX_DIM as usize - 1)).is_ok());
        let sizes = ir.bind(&args(5)).unwrap();
        let eval = vec![EvalArg::Input(&[]); ir.args.len()];
        assert_eq!(ir.eval_f64(&eval, &sizes), Evaluated::Scalar(0.0));
    }

    #[test]
    fn unfused_sizes_saturate_instead_of_wrapping() {
        // Found by tests/dsl_fuzz.rs: 2^32 points (a 16 GiB `out`, and `x` empty with d = 0) bind,
        // and their n x n pair values overflowed: a panic in a debug build, and in a release build
        // a scratch buffer of 0 bytes for the unfused variant to write 2^64 values into.
        let ir = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
        let n = 1usize << 32;
        let args = [
            ArgValue::Buffer(0),
            ArgValue::U32(1),
            ArgValue::Buffer(n),
            ArgValue::Inferred,
            ArgValue::Dim(0),
        ];
        let sizes = ir.bind(&args).unwrap();
        assert_eq!(ir.stage_output_len(0, &sizes), usize::MAX);
        assert_eq!(ir.stage_blocks(0, &sizes), u32::MAX);
        assert_eq!(ir.stage_output_len(1, &sizes), n);
        assert_eq!(
            ir.blocks_for(&sizes),
            (n / crate::work::PAIRWISE_POINTS_PER_BLOCK) as u32
        );
    }
}

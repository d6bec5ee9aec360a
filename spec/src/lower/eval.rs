//! The f64 interpreter: runs a lowered chain stage by stage with each op's CPU reference, the
//! ground truth the CPU backend and the tests compare against.

use super::{ChainIr, ChainOutput, Shape, Source, StageIr};
use crate::ops::{CpuImpl, FusionClass, OpInputs, Table, Ty};

/// Result of running a chain on the CPU reference.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluated {
    /// The value of a chain that ends in a reduction ([`ChainOutput::Scalar`]).
    Scalar(f64),
    /// What a chain that writes `out` would write there, in f64.
    Vector(Vec<f64>),
}

/// An argument's contents for [`ChainIr::eval_f64`], by descriptor slot.
#[derive(Debug, Clone, Copy)]
pub enum EvalArg<'a> {
    /// An f32 input buffer's contents.
    Input(&'a [f32]),
    /// An input already widened to f64 (a bf16 or fp16 buffer's exact values).
    InputF64(&'a [f64]),
    /// A by-value argument (f32 or u32), widened to f64.
    Value(f64),
    /// Output buffers and dimension words: nothing to read.
    None,
}

impl ChainIr {
    /// Runs the chain with each op's f64 reference, stage by stage on whole tensors. `args` has
    /// one entry per descriptor slot; `sizes` comes from [`ChainIr::bind`], which must have
    /// accepted the same arguments.
    pub fn eval_f64(&self, args: &[EvalArg<'_>], sizes: &[usize]) -> Evaluated {
        self.eval_checked(args, sizes).0
    }

    /// As [`ChainIr::eval_f64`], and the first stage declared `finite = true` that produced a NaN
    /// or an infinity: judged as the device stores the value (f32 for an elementwise stage, the
    /// f64 result of a reduction), so every backend fails the same items.
    pub fn eval_checked(
        &self,
        args: &[EvalArg<'_>],
        sizes: &[usize],
    ) -> (Evaluated, Option<usize>) {
        let as_f64: Vec<Vec<f64>> = args
            .iter()
            .map(|a| match a {
                EvalArg::Input(v) => v.iter().map(|&x| f64::from(x)).collect(),
                EvalArg::InputF64(v) => v.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let value_of = |slot: usize| match args[slot] {
            EvalArg::Value(v) => v,
            _ => f64::NAN,
        };
        // The output of each stage (empty for a pairwise stage, whose values are computed by the
        // row reduction that consumes them) and its channels.
        let mut outs: Vec<Vec<f64>> = Vec::with_capacity(self.stages.len());
        for (s, st) in self.stages.iter().enumerate() {
            let flow: &[f64] = match st.inputs[0] {
                Source::Arg(slot) => &as_f64[slot],
                Source::Stage(j) => &outs[j],
            };
            let inputs = self.op_inputs(st, flow, &as_f64, &value_of, sizes);
            let ch = match (s, st.inputs[0]) {
                (0, Source::Arg(slot)) => usize::from(self.args[slot].channels.max(1)),
                _ => self.stages[s - 1].shape.channels() as usize,
            };
            let out = match st.op.cpu {
                CpuImpl::Elementwise(_) | CpuImpl::PerElement(_) => {
                    let row_len = match &st.shape {
                        Shape::Tensor { dims, .. } => dims.last().map_or(1, |&d| sizes[d]),
                        _ => 1,
                    };
                    let elements = flow.len() / ch.max(1);
                    // Values per element of the output: 1, or a state's fields.
                    let och = st.shape.channels() as usize;
                    let mut out = Vec::with_capacity(elements * och);
                    let mut x =
                        Vec::with_capacity(ch + inputs.tensors.len() + inputs.scalars.len());
                    // The op's tables, whole; its other buffers are read per element.
                    let buffers = || {
                        st.op.inputs[1..]
                            .iter()
                            .filter(|p| !p.ty.is_by_value())
                            .zip(&inputs.tensors)
                    };
                    let tables: Vec<Table<'_>> = buffers()
                        .filter_map(|(p, t)| match p.ty {
                            Ty::Table(r, c) => Table::new(t, inputs.dim(r), inputs.dim(c)),
                            _ => None,
                        })
                        .collect();
                    for e in 0..elements {
                        x.clear();
                        x.extend_from_slice(&flow[e * ch..(e + 1) * ch]);
                        for (p, t) in buffers() {
                            match p.ty {
                                Ty::Table(..) => {}
                                Ty::Row => x.push(t[e % row_len]),
                                _ => x.push(t[e]),
                            }
                        }
                        x.extend_from_slice(&inputs.scalars);
                        match st.op.cpu {
                            CpuImpl::Elementwise(f) => out.push((f.one)(&x)),
                            CpuImpl::PerElement(f) => {
                                out.resize(out.len() + och, 0.0);
                                let at = out.len() - och;
                                f(&x, &tables, &mut out[at..]);
                            }
                            _ => unreachable!("matched above"),
                        }
                    }
                    out
                }
                // A row-wise reduction of a matrix: each row folded in column order.
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } if st.per_row => {
                    let rows = self.stage_output_len(s, sizes);
                    let cols = flow.len().checked_div(rows).unwrap_or(0);
                    (0..rows)
                        .map(|r| {
                            let row = &flow[r * cols..(r + 1) * cols];
                            finish(row.iter().copied().fold(identity, combine), cols)
                        })
                        .collect()
                }
                // A row-wise reduction: each point's row of pair values, folded.
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } if self.folds_rows(s) => {
                    let mut out = Vec::new();
                    self.pair_rows(s, &outs, &as_f64, &value_of, sizes, |_, row, _| {
                        out.push(finish(
                            row.iter().copied().fold(identity, combine),
                            row.len(),
                        ));
                    });
                    out
                }
                CpuImpl::Reduction {
                    identity,
                    combine,
                    finish,
                    ..
                } => {
                    vec![finish(
                        flow.iter().copied().fold(identity, combine),
                        flow.len(),
                    )]
                }
                CpuImpl::Tensor(f) => f(&inputs),
                CpuImpl::Pair(_) => Vec::new(),
                CpuImpl::Row(row_fn) => {
                    let och = st.shape.channels() as usize;
                    let mut out = Vec::new();
                    self.pair_rows(s, &outs, &as_f64, &value_of, sizes, |i, row, pch| {
                        out.resize((i + 1) * och, 0.0);
                        row_fn(&inputs, i, row, pch, &mut out[i * och..(i + 1) * och]);
                    });
                    out
                }
            };
            outs.push(out);
        }
        // (A row-wise reduction's values are stored as f32, like an elementwise stage's.)
        let non_finite = (0..self.stages.len()).position(|s| {
            let st = &self.stages[s];
            st.finite
                && outs[s].iter().any(|&x| match st.op.class {
                    FusionClass::Reduction if !self.folds_rows(s) => !x.is_finite(),
                    _ => !(x as f32).is_finite(),
                })
        });
        let value = match self.output {
            ChainOutput::Scalar => Evaluated::Scalar(
                outs.last()
                    .and_then(|v| v.first())
                    .copied()
                    .unwrap_or(f64::NAN),
            ),
            ChainOutput::Vector => Evaluated::Vector(outs.pop().unwrap_or_default()),
        };
        (value, non_finite)
    }

    /// Calls `f(i, row, channels)` for each point i of the pairwise stage that stage `s` reads:
    /// `row` holds the values of pairs (i, j), j != i, `channels` each, in order of j.
    fn pair_rows(
        &self,
        s: usize,
        outs: &[Vec<f64>],
        as_f64: &[Vec<f64>],
        value_of: &dyn Fn(usize) -> f64,
        sizes: &[usize],
        mut f: impl FnMut(usize, &[f64], usize),
    ) {
        let Source::Stage(p) = self.stages[s].inputs[0] else {
            unreachable!("rows follow pairs")
        };
        let pst = &self.stages[p];
        let CpuImpl::Pair(pair_fn) = pst.op.cpu else {
            unreachable!("rows follow pairs")
        };
        let pflow: &[f64] = match pst.inputs[0] {
            Source::Arg(slot) => &as_f64[slot],
            Source::Stage(j) => &outs[j],
        };
        let pin = self.op_inputs(pst, pflow, as_f64, value_of, sizes);
        let n = sizes[pst.dim("n").expect("pairwise ops count points in `n`")];
        let pch = pst.shape.channels() as usize;
        let mut row = Vec::with_capacity(n.saturating_sub(1) * pch);
        let mut pair = vec![0.0; pch];
        for i in 0..n {
            row.clear();
            for j in (0..n).filter(|&j| j != i) {
                pair_fn(&pin, i, j, &mut pair);
                row.extend_from_slice(&pair);
            }
            f(i, &row, pch);
        }
    }

    fn op_inputs<'a>(
        &self,
        st: &StageIr,
        flow: &'a [f64],
        as_f64: &'a [Vec<f64>],
        value_of: &dyn Fn(usize) -> f64,
        sizes: &[usize],
    ) -> OpInputs<'a> {
        let mut tensors = Vec::new();
        let mut scalars = Vec::new();
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            let Source::Arg(slot) = *src else {
                unreachable!("only input 0 comes from a stage")
            };
            if p.ty.is_by_value() {
                scalars.push(value_of(slot));
            } else {
                tensors.push(as_f64[slot].as_slice());
            }
        }
        OpInputs {
            flow,
            tensors,
            scalars,
            dims: st.dims.iter().map(|&(l, d)| (l, sizes[d])).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::test_support::{chain, ops, stage};
    use crate::lower::{ArgKind, ArgValue, MAX_DIM, lower};

    /// Inputs already widened to f64 (what the CPU backend passes) evaluate as f32 ones do; a
    /// checked elementwise stage is judged as the f32 it stores, a checked reduction as its f64
    /// result.
    #[test]
    fn the_evaluator_takes_f64_inputs_and_judges_checked_values_as_stored() {
        let ir = ops(&["KlDivergence"]).unwrap();
        let (q, p) = ([0.5f32, 0.25], [0.25f32, 0.5]);
        let (qw, pw): (Vec<f64>, Vec<f64>) = (
            q.iter().map(|&v| f64::from(v)).collect(),
            p.iter().map(|&v| f64::from(v)).collect(),
        );
        let narrow = ir.eval_f64(
            &[EvalArg::Input(&q), EvalArg::Input(&p), EvalArg::None],
            &[2],
        );
        let wide = ir.eval_f64(
            &[
                EvalArg::InputF64(&qw),
                EvalArg::InputF64(&pw),
                EvalArg::None,
            ],
            &[2],
        );
        assert_eq!(narrow, wide);
        // Elementwise: a term that is finite in f64 but not as the f32 it is stored as fails.
        let mut spec = chain(vec![stage(1, "Square")]);
        spec.stages[0].finite = Some(true);
        let sq = lower(&spec).unwrap();
        let big = [1e20f32, 1.0];
        assert_eq!(
            sq.eval_checked(&[EvalArg::Input(&big), EvalArg::None], &[2])
                .1,
            Some(0)
        );
        let fine = [1e10f32, 1.0];
        assert_eq!(
            sq.eval_checked(&[EvalArg::Input(&fine), EvalArg::None], &[2])
                .1,
            None
        );
        // A reduction: its f64 result is what is checked (1e40 is finite there).
        let mut spec = chain(vec![stage(1, "Square"), stage(2, "SumReduction")]);
        spec.stages[1].finite = Some(true);
        let sum = lower(&spec).unwrap();
        let args = [EvalArg::InputF64(&[1e20, 0.5]), EvalArg::None];
        assert_eq!(sum.eval_checked(&args, &[2]).1, None);
        let args = [EvalArg::InputF64(&[1e200, 0.5]), EvalArg::None];
        assert_eq!(sum.eval_checked(&args, &[2]).1, Some(1));
    }

    #[test]
    fn a_matmul_with_no_outputs_returns_at_once() {
        // Found by tests/api_properties.rs: with k = 0 and n = 0 every buffer is empty whatever
        // m is, and the f64 reference looped over m rows doing nothing (17 s for m = 2^34 on the
        // CPU backend; m = usize::MAX never returned; sizes from MAX_DIM on are refused now).
        let ir = ops(&["Matmul", "AddBias", "Relu"]).unwrap();
        let values: Vec<ArgValue> = ir
            .args
            .iter()
            .map(|a| match (a.kind, a.name.as_str()) {
                (ArgKind::Len, "m") => ArgValue::Dim(MAX_DIM as usize - 1),
                (ArgKind::Len, "k") => ArgValue::Dim(0),
                (ArgKind::Len, _) => ArgValue::Inferred,
                _ => ArgValue::Buffer(0),
            })
            .collect();
        let sizes = ir.bind(&values).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let eval = vec![EvalArg::Input(&[]); ir.args.len()];
            let _ = tx.send(ir.eval_f64(&eval, &sizes));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reference returns at once");
        assert_eq!(got, Evaluated::Vector(Vec::new()));
    }

    #[test]
    fn eval_checked_names_the_first_non_finite_checked_stage() {
        let mut stages = vec![stage(1, "KlDivergence"), stage(2, "SumReduction")];
        stages[1].finite = Some(true);
        let ir = lower(&chain(stages)).unwrap();
        let q = [0.5f32, 0.25];
        let args = |p: &'static [f32]| [EvalArg::Input(&q), EvalArg::Input(p), EvalArg::None];
        assert_eq!(ir.eval_checked(&args(&[0.5, 0.25]), &[2]).1, None);
        // q > 0 = p: an infinite term, so an infinite total.
        assert_eq!(ir.eval_checked(&args(&[0.5, 0.0]), &[2]).1, Some(1));
        // Unchecked, the same input is no error.
        let plain = ops(&["KlDivergence", "SumReduction"]).unwrap();
        assert_eq!(plain.eval_checked(&args(&[0.5, 0.0]), &[2]).1, None);
    }

    #[test]
    fn eval_matches_hand_computed_values() {
        let ir = ops(&["KlDivergence", "SumReduction"]).unwrap();
        let q = [0.5f32, 0.0, 0.25];
        let p = [0.25f32, 0.3, 0.25];
        let args = [EvalArg::Input(&q), EvalArg::Input(&p), EvalArg::None];
        let Evaluated::Scalar(s) = ir.eval_f64(&args, &[3]) else {
            panic!()
        };
        assert!((s - 0.5 * 2f64.ln()).abs() < 1e-12);
        let ir = ops(&["KlDivergence"]).unwrap();
        let args = [
            EvalArg::Input(&q),
            EvalArg::Input(&p),
            EvalArg::None,
            EvalArg::None,
        ];
        let Evaluated::Vector(v) = ir.eval_f64(&args, &[3]) else {
            panic!()
        };
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], 0.0);
        let ir = ops(&["SumReduction"]).unwrap();
        assert_eq!(
            ir.eval_f64(&[EvalArg::Input(&q), EvalArg::None], &[3]),
            Evaluated::Scalar(0.75)
        );
        assert_eq!(
            ir.eval_f64(&[EvalArg::Input(&[]), EvalArg::None], &[0]),
            Evaluated::Scalar(0.0)
        );
    }
}

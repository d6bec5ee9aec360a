//! The CPU backend: runs a chain's IR with each op's f64 reference (pptm-spec).
//!
//! Elementwise chains (with or without a reduction) take a fast path: every stage over a block of
//! elements at a time, in f64, over the f32 inputs where they lie, in parallel chunks ([`run_map`]).
//! Every other chain runs the whole-tensor reference (`ChainIr::eval_checked`), which widens its
//! inputs to f64 first.
//!
//! An item runs on pptm's worker pool after `submit` returns ([`HostItem::submit`]), so tickets
//! overlap; it holds its buffers' memory and access locks until it ends (crate::host says why).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Instant;

use pptm_spec::{ArgKind, ChainIr, CpuImpl, EvalArg, Evaluated, Pattern, Source, StageIr, Ty};
use rayon::prelude::*;

use crate::chain::{Arg, Completion, InputBuffer};
use crate::element::{Element, F8E4M3, bf16, f16};
use crate::error::{Error, Result};
use crate::host::{HostRead, HostWrite};

/// An input buffer's elements, read-locked for the item.
enum HostInput {
    F32(HostRead<f32>),
    Bf16(HostRead<bf16>),
    F16(HostRead<f16>),
    F8E4M3(HostRead<F8E4M3>),
}

impl HostInput {
    /// The elements widened to f64 (every element type converts exactly).
    fn widened(&self) -> Vec<f64> {
        fn widen<T: Element>(r: &HostRead<T>) -> Vec<f64> {
            r.slice().iter().map(|x| x.to_f64()).collect()
        }
        match self {
            HostInput::F32(r) => widen(r),
            HostInput::Bf16(r) => widen(r),
            HostInput::F16(r) => widen(r),
            HostInput::F8E4M3(r) => widen(r),
        }
    }
}

/// One argument of an item on the CPU backend, by descriptor slot, its buffer's access held.
enum HostArg {
    Input(HostInput),
    Output(HostWrite<f32>),
    Value(f64),
    /// A dimension inferred from the buffers, the guard word, or a `Dim` (sizes carry those).
    None,
}

/// An item of the CPU backend: its chain, lowered, and its arguments with their buffers' access
/// held; built at submission, run now or on the pool.
pub(crate) struct HostItem {
    chain: &'static str,
    ir: &'static ChainIr,
    args: Vec<HostArg>,
    sizes: Vec<usize>,
    guard_level: u32,
    reference: bool,
    /// Elements of its buffers in all: small items run at submission.
    elements: usize,
}

/// Items whose buffers hold fewer elements than this run at submission: handing one to the pool
/// and back costs more than running it.
const INLINE_ELEMENTS: usize = 1 << 16;

impl HostItem {
    /// Takes the access of each buffer in `args` (by descriptor slot; `None` for dimensions
    /// inferred from buffers and the guard word): shared for inputs, exclusive for the output,
    /// in the order of the buffers' addresses, so that two submissions never wait on each other
    /// in a cycle. Waits while an item of a leaked ticket still uses one of them.
    /// [`Error::ForeignBuffer`] for a buffer in device memory. `sizes` come from a successful
    /// bind; `reference`: skip the fast path.
    pub(crate) fn new(
        chain: &'static str,
        ir: &'static ChainIr,
        args: Vec<Option<Arg<'_>>>,
        sizes: Vec<usize>,
        guard_level: u32,
        reference: bool,
    ) -> Result<HostItem> {
        let address = |a: &Option<Arg<'_>>| match a {
            Some(Arg::Input(_, b)) => b.address(),
            Some(Arg::Output(_, b)) => std::ptr::from_ref::<crate::Buffer<f32>>(b) as usize,
            _ => 0,
        };
        let mut order: Vec<usize> = (0..args.len()).collect();
        order.sort_by_key(|&k| address(&args[k]));
        let mut args: Vec<Option<Arg<'_>>> = args;
        let mut host: Vec<Option<HostArg>> = (0..args.len()).map(|_| None).collect();
        let mut elements = 0usize;
        for k in order {
            let not_host = |name| Error::ForeignBuffer { chain, arg: name };
            host[k] = Some(match args[k].take() {
                Some(Arg::Input(name, b)) => {
                    elements = elements.saturating_add(b.len());
                    HostArg::Input(match b {
                        InputBuffer::F32(b) => HostInput::F32(b.host_read().ok_or(not_host(name))?),
                        InputBuffer::Bf16(b) => {
                            HostInput::Bf16(b.host_read().ok_or(not_host(name))?)
                        }
                        InputBuffer::F16(b) => HostInput::F16(b.host_read().ok_or(not_host(name))?),
                        InputBuffer::F8E4M3(b) => {
                            HostInput::F8E4M3(b.host_read().ok_or(not_host(name))?)
                        }
                    })
                }
                Some(Arg::Output(name, b)) => {
                    elements = elements.saturating_add(b.len());
                    HostArg::Output(b.host_write().ok_or(not_host(name))?)
                }
                Some(Arg::F32(_, v)) => HostArg::Value(f64::from(v)),
                Some(Arg::U32(_, v)) => HostArg::Value(f64::from(v)),
                Some(Arg::Dim(..)) | None => HostArg::None,
            });
        }
        Ok(HostItem {
            chain,
            ir,
            args: host
                .into_iter()
                .map(|a| a.unwrap_or(HostArg::None))
                .collect(),
            sizes,
            guard_level,
            reference,
            elements,
        })
    }

    /// Runs the item now (`inline`, or when it is small) or on pptm's worker pool.
    pub(crate) fn submit(self, inline: bool) -> CpuRun {
        if inline || self.elements < INLINE_ELEMENTS {
            return CpuRun::Done(self.run_caught());
        }
        let job = Arc::new(CpuJob::default());
        let done = job.clone();
        pool().spawn(move || done.finish(self.run_caught()));
        CpuRun::Running(job)
    }

    /// [`run`], with a panic of an op's CPU code as an error (the item's locks released either
    /// way: they drop with `self`).
    fn run_caught(self) -> Result<Completion> {
        let chain = self.chain;
        std::panic::catch_unwind(AssertUnwindSafe(|| run(self))).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            Err(Error::CpuPanic { chain, message })
        })
    }
}

/// A submitted item of the CPU backend: its result at once, or the job computing it.
pub(crate) enum CpuRun {
    Done(Result<Completion>),
    Running(Arc<CpuJob>),
}

/// The pool CPU items run on: pptm's own, so that an application that waits for a ticket on
/// rayon's global pool never holds up the workers the item needs.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|k| format!("pptm-cpu-{k}"))
            .build()
            .expect("pptm's CPU worker pool starts")
    })
}

/// An item running on the pool: its result once it ends, and who to wake then.
#[derive(Default)]
pub(crate) struct CpuJob {
    result: Mutex<Option<Result<Completion>>>,
    ended: Condvar,
    waker: Mutex<Option<Waker>>,
}

impl CpuJob {
    fn finish(&self, r: Result<Completion>) {
        *self.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
        self.ended.notify_all();
        if let Some(w) = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            w.wake();
        }
    }

    /// Whether the item has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.result
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Wakes `waker` when the item ends (at once if it has): true if it has ended already.
    pub(crate) fn wake_when_done(&self, waker: &Waker) -> bool {
        *self.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
        // An end between the store and this check still wakes: finish stores before it takes.
        self.is_done()
    }

    /// The item's result, waiting until `deadline` at most ([`Error::Timeout`] after it; the
    /// job keeps its result for a later wait).
    pub(crate) fn take(&self, deadline: Option<Instant>) -> Result<Completion> {
        let start = Instant::now();
        let mut r = self.result.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = r.take() {
                return r;
            }
            r = match deadline {
                None => self.ended.wait(r).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout(start.elapsed()));
                    }
                    self.ended
                        .wait_timeout(r, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

/// Runs an item; writes the output tensor, if any, as f32. A guarded chain's completion value is
/// the guard's (crate::guard::emulate) at the item's guard level; the output is f64 arithmetic
/// either way.
fn run(item: HostItem) -> Result<Completion> {
    let HostItem {
        chain,
        ir,
        mut args,
        sizes,
        guard_level,
        reference,
        ..
    } = item;
    // The output, taken out of the arguments so that they can be read beside it.
    let mut output: Option<HostWrite<f32>> = None;
    if let Some(slot) = args.iter().position(|a| matches!(a, HostArg::Output(_)))
        && let HostArg::Output(w) = std::mem::replace(&mut args[slot], HostArg::None)
    {
        output = Some(w);
    }
    let mut out_slice: Option<&mut [f32]> = output.as_mut().map(HostWrite::slice_mut);
    if let Some((value, non_finite)) = (!reference)
        .then(|| run_map(ir, &args, &mut out_slice))
        .flatten()
    {
        return Ok(completion(value, non_finite));
    }
    // Inputs widened to f64, by slot.
    let wide: Vec<Vec<f64>> = args
        .iter()
        .map(|a| match a {
            HostArg::Input(i) => i.widened(),
            _ => Vec::new(),
        })
        .collect();
    let eval: Vec<EvalArg> = args
        .iter()
        .zip(&ir.args)
        .zip(&wide)
        .map(|((a, slot), wide)| match a {
            HostArg::Input(_) => EvalArg::InputF64(wide),
            HostArg::Value(v) => EvalArg::Value(*v),
            HostArg::Output(_) | HostArg::None => {
                debug_assert!(matches!(
                    slot.kind,
                    ArgKind::Len | ArgKind::Guard | ArgKind::Scratch | ArgKind::Output
                ));
                EvalArg::None
            }
        })
        .collect();
    let guard_value = ir.guard().map(|(stage, _, _)| {
        let operand = |k: usize| match ir.stages[stage].inputs[k] {
            Source::Arg(slot) => wide[slot].as_slice(),
            Source::Stage(_) => unreachable!("a guarded matmul reads chain arguments"),
        };
        crate::guard::emulate(ir, stage, guard_level, operand(0), operand(1), &sizes)
    });
    let (evaluated, non_finite) = ir.eval_checked(&eval, &sizes);
    let value = match evaluated {
        Evaluated::Scalar(v) => v,
        Evaluated::Vector(v) => {
            let out = out_slice.ok_or_else(|| Error::BadArguments {
                chain,
                reason: "no output buffer".into(),
            })?;
            for (o, x) in out.iter_mut().zip(v) {
                *o = x as f32;
            }
            guard_value.unwrap_or(0.0)
        }
    };
    Ok(completion(value, non_finite.is_some()))
}

/// A completion as the device reports it (a non-finite value fails the item; its outputs are
/// written all the same).
fn completion(value: f64, non_finite: bool) -> Completion {
    Completion {
        status: if non_finite {
            crate::gpu::abi::PPTM_STATUS_NON_FINITE
        } else {
            crate::gpu::abi::PPTM_STATUS_OK
        },
        value,
        device_ns: None,
        paths: None,
    }
}

/// Elements per chunk of the elementwise fast path: each chunk is one rayon task, and reductions
/// combine their chunks' partials in chunk order (so results do not depend on the thread count).
const CHUNK: usize = 16 * 1024;

/// Elements per block within a chunk: each stage runs over a block at a time (one call of its
/// [`ElementFn::run`](pptm_spec::ElementFn), the op inlined into the loop), so that a block's
/// columns stay in the L1 cache between stages.
const BLOCK: usize = 512;

/// The most operands (flow, tensors, by-value arguments) a stage of the fast path takes.
const MAX_OPERANDS: usize = 16;

/// One elementwise stage of the fast path: its f64 reference, the f32 buffers it reads beside its
/// flow (by argument slot), and its by-value arguments.
struct MapStage<'a> {
    f: pptm_spec::ElementFn,
    tensors: Vec<&'a [f32]>,
    scalars: Vec<f64>,
    finite: bool,
}

/// A reduction's fold, as the op's f64 reference defines it.
struct Fold {
    identity: f64,
    combine: fn(f64, f64) -> f64,
    fold: fn(f64, &[f64]) -> f64,
    finish: fn(f64, usize) -> f64,
    finite: bool,
}

/// The elementwise stages of a fast-path chain over its flow, and one task's scratch columns.
struct Blocks<'s, 'a> {
    flow: &'a [f32],
    stages: &'s [MapStage<'a>],
    /// The running value of each element of the block, and the next stage's.
    value: Vec<f64>,
    next: Vec<f64>,
    /// A stage's tensor operands, widened; each stage's by-value operands as columns of copies.
    tensors: Vec<Vec<f64>>,
    scalars: Vec<Vec<Vec<f64>>>,
    /// Whether a checked stage produced a value that is not finite (as f32).
    bad: bool,
}

impl<'s, 'a> Blocks<'s, 'a> {
    fn new(flow: &'a [f32], stages: &'s [MapStage<'a>]) -> Self {
        let most_tensors = stages.iter().map(|s| s.tensors.len()).max().unwrap_or(0);
        Blocks {
            flow,
            stages,
            value: vec![0.0; BLOCK],
            next: vec![0.0; BLOCK],
            tensors: vec![vec![0.0; BLOCK]; most_tensors],
            scalars: stages
                .iter()
                .map(|s| s.scalars.iter().map(|&v| vec![v; BLOCK]).collect())
                .collect(),
            bad: false,
        }
    }

    /// Every stage over elements `start..start + len` (`len <= BLOCK`); their values.
    fn run(&mut self, start: usize, len: usize) -> &[f64] {
        let range = start..start + len;
        for (v, &x) in self.value.iter_mut().zip(&self.flow[range.clone()]) {
            *v = f64::from(x);
        }
        for (s, stage) in self.stages.iter().enumerate() {
            for (wide, t) in self.tensors.iter_mut().zip(&stage.tensors) {
                for (w, &x) in wide.iter_mut().zip(&t[range.clone()]) {
                    *w = f64::from(x);
                }
            }
            let mut columns: [&[f64]; MAX_OPERANDS] = [&[]; MAX_OPERANDS];
            columns[0] = &self.value[..len];
            let mut k = 1;
            for t in &self.tensors[..stage.tensors.len()] {
                columns[k] = &t[..len];
                k += 1;
            }
            for c in &self.scalars[s] {
                columns[k] = &c[..len];
                k += 1;
            }
            let next = &mut self.next[..len];
            (stage.f.run)(&columns[..k], next);
            if stage.finite {
                self.bad |= next.iter().any(|&v| !(v as f32).is_finite());
            }
            std::mem::swap(&mut self.value, &mut self.next);
        }
        &self.value[..len]
    }
}

/// An elementwise chain (`Map` pattern: elementwise stages, then maybe a reduction and stages on
/// its scalar) over f32 buffers of one length, run in parallel chunks, each stage over a block of
/// elements at a time in f64, reading the inputs where they are (no widened copies of whole
/// buffers). `None` for any other chain (the whole-tensor reference runs it).
fn run_map<'a>(
    ir: &ChainIr,
    args: &'a [HostArg],
    output: &mut Option<&mut [f32]>,
) -> Option<(f64, bool)> {
    if ir.plan.pattern != Pattern::Map || ir.guard().is_some() || ir.dims.len() != 1 {
        return None;
    }
    let f32_slot = |slot: usize| -> Option<&'a [f32]> {
        match &args[slot] {
            HostArg::Input(HostInput::F32(r)) => Some(r.slice()),
            _ => None,
        }
    };
    let value_slot = |slot: usize| -> Option<f64> {
        match args[slot] {
            HostArg::Value(v) => Some(v),
            _ => None,
        }
    };
    let Source::Arg(flow_slot) = ir.stages.first()?.inputs[0] else {
        return None;
    };
    // A state flow (several values per element) takes the whole-tensor reference.
    if ir.args[flow_slot].channels != 1 {
        return None;
    }
    let flow = f32_slot(flow_slot)?;
    let n = flow.len();
    let reduction = ir.plan.reduction;
    let elementwise_end = reduction.unwrap_or(ir.stages.len());
    let stage_of = |st: &StageIr| -> Option<MapStage<'a>> {
        let CpuImpl::Elementwise(f) = st.op.cpu else {
            return None;
        };
        if st.shape.channels() != 1 {
            return None;
        }
        let (mut tensors, mut scalars) = (Vec::new(), Vec::new());
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            let Source::Arg(slot) = *src else { return None };
            if p.ty.is_by_value() {
                scalars.push(value_slot(slot)?);
            } else if p.ty == Ty::Row {
                return None;
            } else {
                let t = f32_slot(slot)?;
                if t.len() != n {
                    return None;
                }
                tensors.push(t);
            }
        }
        Some(MapStage {
            f,
            tensors,
            scalars,
            finite: st.finite,
        })
    };
    let stages: Vec<MapStage> = ir.stages[..elementwise_end]
        .iter()
        .map(stage_of)
        .collect::<Option<_>>()?;
    let fold = match reduction {
        Some(r) => match ir.stages[r].op.cpu {
            CpuImpl::Reduction {
                identity,
                combine,
                fold,
                finish,
            } if !ir.stages[r].per_row => Some(Fold {
                identity,
                combine,
                fold,
                finish,
                finite: ir.stages[r].finite,
            }),
            _ => return None,
        },
        None => None,
    };
    let finish: Vec<MapStage> = match reduction {
        Some(r) => ir.stages[r + 1..]
            .iter()
            .map(|st| stage_of(st).filter(|s| s.tensors.is_empty()))
            .collect::<Option<_>>()?,
        None => Vec::new(),
    };
    if fold.is_none() && output.as_ref().is_none_or(|o| o.len() != n) {
        return None;
    }
    if stages
        .iter()
        .chain(&finish)
        .any(|s| 1 + s.tensors.len() + s.scalars.len() > MAX_OPERANDS)
    {
        return None;
    }

    // Each chunk's blocks in order: the elements' values written out, or folded.
    match (&fold, output.as_deref_mut()) {
        (None, Some(out)) => {
            let bad = out
                .par_chunks_mut(CHUNK)
                .enumerate()
                .map(|(c, out)| {
                    let mut blocks = Blocks::new(flow, &stages);
                    for (b, out) in out.chunks_mut(BLOCK).enumerate() {
                        let values = blocks.run(c * CHUNK + b * BLOCK, out.len());
                        for (o, &v) in out.iter_mut().zip(values) {
                            *o = v as f32;
                        }
                    }
                    blocks.bad
                })
                .reduce(|| false, |a, b| a | b);
            Some((0.0, bad))
        }
        (Some(fold), _) => {
            let partials: Vec<(f64, bool)> = (0..n.div_ceil(CHUNK))
                .into_par_iter()
                .map(|c| {
                    let mut blocks = Blocks::new(flow, &stages);
                    let mut acc = fold.identity;
                    let end = ((c + 1) * CHUNK).min(n);
                    for start in (c * CHUNK..end).step_by(BLOCK) {
                        acc = (fold.fold)(acc, blocks.run(start, BLOCK.min(end - start)));
                    }
                    (acc, blocks.bad)
                })
                .collect();
            let mut bad = partials.iter().any(|p| p.1);
            let total = partials
                .iter()
                .fold(fold.identity, |acc, p| (fold.combine)(acc, p.0));
            let mut v = (fold.finish)(total, n);
            bad |= fold.finite && !v.is_finite();
            let mut x = [0.0f64; MAX_OPERANDS];
            for s in &finish {
                x[0] = v;
                x[1..=s.scalars.len()].copy_from_slice(&s.scalars);
                v = (s.f.one)(&x[..=s.scalars.len()]);
                bad |= s.finite && !(v as f32).is_finite();
            }
            Some((v, bad))
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Buffer;
    use pptm_spec::{ChainSpec, FusionClass, OpDef, Param, Precision, StageSpec};

    /// `x` per element, or a panic on a negative one: an op whose CPU code fails.
    const PICKY: OpDef = OpDef {
        name: "Picky",
        class: FusionClass::Elementwise,
        inputs: &[Param {
            name: "x",
            ty: Ty::Like,
        }],
        output: Ty::Like,
        flow_channels: Some(1),
        out_channels: Some(1),
        states: pptm_spec::StateTypes::NONE,
        precisions: &[Precision::Fp32],
        tensor_precisions: &[],
        lanes: 1,
        header: "",
        cuda: "",
        device: "picky",
        cpu: CpuImpl::Elementwise(pptm_spec::element_fn!(|v| {
            assert!(v[0] >= 0.0, "a negative element");
            v[0]
        })),
        check: None,
        doc: "x, or a panic on a negative x.",
    };

    fn picky_chain() -> &'static ChainIr {
        let spec = ChainSpec {
            name: "PickyChain".into(),
            domain: "tests".into(),
            stages: vec![StageSpec {
                field: "picky".into(),
                number: 1,
                op: "Picky".into(),
                ..Default::default()
            }],
        };
        Box::leak(Box::new(pptm_spec::lower_with(&spec, &[&PICKY]).unwrap()))
    }

    /// Runs `PickyChain` over `x` into `out` on the pool (or at once when small), as `submit`
    /// does.
    fn picky(x: &Buffer<f32>, out: &mut Buffer<f32>) -> Result<Completion> {
        let ir = picky_chain();
        let mut args: Vec<Option<Arg<'_>>> = (0..ir.args.len()).map(|_| None).collect();
        let slot = |name: &str| ir.args.iter().position(|a| a.name == name).unwrap();
        args[slot("x")] = Some(Arg::Input("x", x.into()));
        args[ir.output_slot().unwrap()] = Some(Arg::Output("out", out));
        let item = HostItem::new("PickyChain", ir, args, vec![x.len()], 0, false)?;
        match item.submit(false) {
            CpuRun::Done(r) => r,
            CpuRun::Running(job) => job.take(None),
        }
    }

    #[test]
    fn items_run_on_the_pool_and_write_every_element() {
        for n in [1, 7, INLINE_ELEMENTS - 1, INLINE_ELEMENTS, 3 * CHUNK + 5] {
            let x =
                Buffer::host(0, Some(&(0..n).map(|i| i as f32).collect::<Vec<_>>()), n).unwrap();
            let mut out = Buffer::host(0, None, n).unwrap();
            out.fill(f32::NAN).unwrap();
            picky(&x, &mut out).unwrap();
            let got = out.to_vec().unwrap();
            assert!(
                got.iter().enumerate().all(|(i, &v)| v == i as f32),
                "n = {n}"
            );
        }
    }

    #[test]
    fn a_panicking_op_fails_its_item_and_releases_its_buffers() {
        for n in [7, 2 * INLINE_ELEMENTS] {
            let x = Buffer::host(0, Some(&vec![-1.0f32; n]), n).unwrap();
            let mut out = Buffer::host(0, None, n).unwrap();
            match picky(&x, &mut out) {
                Err(Error::CpuPanic { chain, message }) => {
                    assert_eq!(chain, "PickyChain");
                    assert!(message.contains("a negative element"), "{message}");
                }
                other => panic!("n = {n}: {other:?}"),
            }
            // Its locks are gone: the output can be written, the input read.
            out.fill(1.0).unwrap();
            assert_eq!(x.to_vec().unwrap().len(), n);
        }
    }

    #[test]
    fn an_item_holds_its_buffers_until_it_ends() {
        let n = 4 * CHUNK;
        let x = Buffer::host(0, Some(&vec![2.0f32; n]), n).unwrap();
        let mut out = Buffer::host(0, None, n).unwrap();
        out.fill(f32::NAN).unwrap();
        // What a leaked ticket leaves: the item running, nobody waiting for it. The output's
        // read waits for the item (its write lock), so it sees every element written.
        let ir = picky_chain();
        let mut args: Vec<Option<Arg<'_>>> = (0..ir.args.len()).map(|_| None).collect();
        let slot = |name: &str| ir.args.iter().position(|a| a.name == name).unwrap();
        args[slot("x")] = Some(Arg::Input("x", (&x).into()));
        args[ir.output_slot().unwrap()] = Some(Arg::Output("out", &mut out));
        let item = HostItem::new("PickyChain", ir, args, vec![n], 0, false).unwrap();
        let run = item.submit(false);
        assert!(matches!(run, CpuRun::Running(_)));
        drop(run);
        // Dropping the input buffer frees nothing under the item (it shares the memory).
        drop(x);
        assert!(out.to_vec().unwrap().iter().all(|&v| v == 2.0));
    }
}

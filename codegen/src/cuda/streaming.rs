//! The streaming emitters: an elementwise body over loaded inputs, for the patterns in
//! kernels/pptm/fuse.cuh (`pptm_map_reduce`, `pptm_map_store`, and `pptm_matrix_rows` for a
//! reduction of each row of a matrix).

use std::fmt::Write;

use super::*;

/// The functors of an elementwise chain (maybe ending in a reduction); returns the run
/// function's lines.
pub(super) fn map(out: &mut String, c: &ChainIr) -> String {
    if c.maps_each() {
        return map_each(out, c);
    }
    let t = tag(c);
    let store = store(c);
    let r = reducer(c);
    let mut call = String::new();
    let inputs: Vec<usize> = c.input_slots().map(|(slot, _)| slot).collect();
    let nin = inputs.len();
    map_body(out, c, &inputs);
    let ptrs: Vec<String> = inputs.iter().map(|&s| field(s)).collect();
    let _ = writeln!(
        call,
        "    const float* const in[{nin}] = {{{}}};",
        ptrs.join(", ")
    );
    let n = field(
        c.args[c.input_slots().next().expect("a map reads an input").0]
            .shape
            .iter()
            .map(|&d| c.dims[d].slot)
            .next()
            .expect("1-D"),
    );
    if c.reduction().is_some() {
        let _ = writeln!(
            call,
            "    partial = pptm_map_reduce<{nin}, {r}>(in, {n}, pptm_body_{t}{{e}}, b);"
        );
    } else {
        let _ = writeln!(
            call,
            "    pptm_map_store<{nin}>(in, {store}, {n}, pptm_body_{t}{{e}}, b);"
        );
        let _ = writeln!(call, "    partial = 0.0;");
    }
    call
}

/// The functor of an elementwise chain that is much work per element (a state, a long
/// `repeat`; `ChainIr::map_elems_per_block`), run by `pptm_map_each`: element i loaded (a
/// state's fields from `k * i` on), computed and stored (or returned to the reduction) by one
/// thread, or computed by the element's lanes (`ChainIr::lanes`) and stored by the first.
/// Returns the run function's lines.
///
/// With lanes, the functor is a template over them (`PPTM_PASS_LANES`), and the pass takes them
/// only while the elements times the lanes fit in the item's threads: with as many elements as
/// threads or more, every thread already has an element of its own, and lanes would only trade
/// the neighbouring elements' coalesced reads (consecutive threads, consecutive elements) for a
/// shorter loop each (examples/md.rs: 8 lanes ran its convolutions 3.5 times faster at 100
/// atoms, 6,400 elements, and 1.3 times slower at 1000).
fn map_each(out: &mut String, c: &ChainIr) -> String {
    let t = tag(c);
    let r = reducer(c);
    let Source::Arg(flow_slot) = c.stages[0].inputs[0] else {
        unreachable!("a map's first stage reads an argument")
    };
    let flow_arg = &c.args[flow_slot];
    let ch = usize::from(flow_arg.channels.max(1));
    let flow: Vec<String> = if ch == 1 {
        vec![format!("pptm_ld_cg_f32({} + i)", field(flow_slot))]
    } else {
        (0..ch)
            .map(|k| format!("pptm_ld_cg_f32({} + {ch} * i + {k})", field(flow_slot)))
            .collect()
    };
    let lanes = c.lanes();
    if lanes > 1 {
        let _ = writeln!(out, "template <unsigned int PPTM_PASS_LANES>");
    }
    let _ = writeln!(out, "struct pptm_each_{t} {{");
    let _ = writeln!(out, "    pptm_env_{t} e;");
    let _ = writeln!(
        out,
        "    __device__ __forceinline__ double operator()(uint64_t i) const {{"
    );
    let v = emit_stages(
        out,
        c,
        c.plan.prologue.clone(),
        flow,
        &Load::At {
            index: "i",
            column: "i",
            lanes,
        },
    );
    let last = c.plan.prologue.end.checked_sub(1);
    if lanes > 1 {
        let _ = writeln!(
            out,
            "        if (threadIdx.x % PPTM_PASS_LANES != 0u) return 0.0;"
        );
    }
    match (c.reduction(), c.output_slot(), last) {
        (Some(_), _, _) => {
            let _ = writeln!(out, "        return (double){};", v[0]);
        }
        (None, Some(slot), Some(l)) if c.stages[l].op.states.out.is_some() => {
            let k = c.args[slot].channels;
            let _ = writeln!(
                out,
                "        pptm_state_store({} + {k} * i, {});\n        return 0.0;",
                field(slot),
                v[0]
            );
        }
        (None, Some(slot), _) => {
            let _ = writeln!(
                out,
                "        {}[i] = (float){};\n        return 0.0;",
                field(slot),
                v[0]
            );
        }
        (None, None, _) => unreachable!("a map stores or reduces"),
    }
    let _ = writeln!(out, "    }}\n}};");
    let n = dims_product(c, &flow_arg.shape);
    if lanes == 1 {
        return format!("    partial = pptm_map_each<{r}>({n}, pptm_each_{t}{{e}}, b);\n");
    }
    format!(
        "    {{
        const uint64_t n = {n};
        if (n * {lanes}u <= (uint64_t)b.nblocks * PPTM_BLOCK_THREADS)
            partial = pptm_map_each<{r}, {lanes}>(n, pptm_each_{t}<{lanes}>{{e}}, b);
        else
            partial = pptm_map_each<{r}, 1>(n, pptm_each_{t}<1>{{e}}, b);
    }}
"
    )
}

/// The functors of a chain that folds each row of a matrix (`per_row = true`); returns the run
/// function's lines.
pub(super) fn rows(out: &mut String, c: &ChainIr) -> String {
    let t = tag(c);
    let plan = &c.plan;
    let store = store(c);
    let r = reducer(c);
    let mut call = String::new();
    let a = plan.anchor.expect("anchored");
    // The prologue, as a map's body over the buffers it reads (those of the epilogue
    // are read once per row, by the epilogue).
    let mut inputs: Vec<usize> = Vec::new();
    for st in &c.stages[..=a] {
        for (p, src) in st.op.inputs.iter().zip(&st.inputs) {
            if let Source::Arg(slot) = *src
                && !p.ty.is_by_value()
                && !matches!(p.ty, Ty::Table(..))
                && !inputs.contains(&slot)
            {
                inputs.push(slot);
            }
        }
    }
    let nin = inputs.len();
    map_body(out, c, &inputs);
    row_epilogue(out, c, a);
    let ptrs: Vec<String> = inputs.iter().map(|&s| field(s)).collect();
    let _ = writeln!(
        call,
        "    const float* const in[{nin}] = {{{}}};",
        ptrs.join(", ")
    );
    let (rows, cols) = matrix_rows(c, a);
    let _ = writeln!(
        call,
        "    partial = pptm_matrix_rows<{nin}, {r}, {}>(in, {rows}, {cols}, pptm_body_{t}{{e}}, pptm_epi_{t}{{e}}, {store}, b);",
        c.stages[a].op.device
    );
    call
}

/// The body functor of a streaming pass (`pptm_body_<tag>`): the prologue's stages for one
/// element, from the values of `inputs` (descriptor slots) loaded at it, `x[k]` for the k-th.
pub(super) fn map_body(out: &mut String, c: &ChainIr, inputs: &[usize]) {
    let t = tag(c);
    let nin = inputs.len();
    let _ = writeln!(out, "struct pptm_body_{t} {{");
    let _ = writeln!(out, "    pptm_env_{t} e;");
    let _ = writeln!(
        out,
        "    __device__ __forceinline__ {} operator()(const float (&x)[{nin}]) const {{",
        range_type(c, &c.plan.prologue)
    );
    let first = match c.stages[0].inputs[0] {
        Source::Arg(slot) => {
            format!("x[{}]", inputs.iter().position(|&x| x == slot).unwrap())
        }
        Source::Stage(_) => unreachable!(),
    };
    let v = emit_stages(
        out,
        c,
        c.plan.prologue.clone(),
        vec![first],
        &Load::Loaded(inputs),
    );
    let _ = writeln!(out, "        return {};", v[0]);
    let _ = writeln!(out, "    }}\n}};");
}

/// The row count and row length (C expressions) of the matrix whose rows stage `s` folds
/// (`per_row = true`): every dimension of its flow but the last, and the last.
pub(super) fn matrix_rows(c: &ChainIr, s: usize) -> (String, String) {
    let dims = match (s, c.stages[s].inputs[0]) {
        (0, Source::Arg(slot)) => c.args[slot].shape.clone(),
        (_, Source::Stage(p)) => match &c.stages[p].shape {
            Shape::Tensor { dims, .. } => dims.clone(),
            _ => unreachable!("a row-wise reduction reads a matrix"),
        },
        _ => unreachable!("only stage 0 reads an argument as its flow"),
    };
    let (last, lead) = dims.split_last().expect("a matrix has two dimensions");
    (dims_product(c, lead), field(c.dims[*last].slot))
}

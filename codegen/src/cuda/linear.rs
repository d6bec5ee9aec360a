//! The GEMV, GEMV-T and matmul emitter: the prologue that computes a GEMV's vector where it is
//! read, the epilogue applied to each output element, and the call of the pattern in
//! kernels/pptm/pattern/linear.cuh (CUDA cores), mma.cuh and wgmma.cuh (tensor cores).

use std::fmt::Write;

use super::*;

/// The functors of a GEMV, GEMV-T or matmul chain; returns the run function's lines.
pub(super) fn linear(out: &mut String, c: &ChainIr) -> String {
    let t = tag(c);
    let plan = &c.plan;
    let store = store(c);
    let r = reducer(c);
    let mut call = String::new();
    let a = plan.anchor.expect("anchored");
    let ast = &c.stages[a];
    let matrix = match ast.inputs[1] {
        Source::Arg(slot) => field(slot),
        Source::Stage(_) => unreachable!(),
    };
    if plan.pattern != Pattern::Matmul {
        // The prologue: the vector input at j.
        let _ = writeln!(out, "struct pptm_pro_{t} {{");
        let _ = writeln!(out, "    pptm_env_{t} e;");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ float operator()(uint64_t j) const {{"
        );
        let flow = if plan.prologue.is_empty() {
            match ast.inputs[0] {
                Source::Arg(slot) => vec![format!("pptm_ld_cg_f32({} + j)", field(slot))],
                Source::Stage(_) => unreachable!(),
            }
        } else {
            first_flow(c, "j")
        };
        let v = emit_stages(
            out,
            c,
            plan.prologue.clone(),
            flow,
            &Load::At {
                index: "j",
                column: "j",
                lanes: 1,
            },
        );
        let _ = writeln!(out, "        return {};", v[0]);
        let _ = writeln!(out, "    }}");
        if plan.prologue.is_empty()
            && let Source::Arg(slot) = ast.inputs[0]
        {
            // The vector is a buffer read as it is: pptm_gemv_n's stream walk loads it 16 bytes
            // at a time rather than through operator() an element at a time.
            let _ = writeln!(
                out,
                "    __device__ __forceinline__ const float* plain() const {{ return {}; }}",
                field(slot)
            );
        }
        let _ = writeln!(out, "}};");
    }
    // The epilogue: the output element from its dot product.
    let _ = writeln!(out, "struct pptm_epi_{t} {{");
    let _ = writeln!(out, "    pptm_env_{t} e;");
    if plan.pattern == Pattern::Matmul {
        // A matmul's epilogue comes in two halves too: `cols` loads what it reads by
        // column (a bias), so a tensor-core pattern loads those once for all the rows a
        // thread stores, all at once, instead of one dependent load per element.
        let cols = column_buffers(c, plan.epilogue.clone());
        let len = cols.len().max(1);
        let ty = range_type(c, &plan.epilogue);
        let _ = writeln!(out, "    static constexpr uint32_t col_loads = {len};");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ void cols(uint64_t j, float (&c)[{len}]) const {{"
        );
        if cols.is_empty() {
            let _ = writeln!(out, "        c[0] = 0.0f;");
        }
        for (k, &slot) in cols.iter().enumerate() {
            let _ = writeln!(out, "        c[{k}] = pptm_ld_cg_f32({} + j);", field(slot));
        }
        let _ = writeln!(out, "    }}");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ {ty} operator()(uint64_t i, uint64_t j, float acc, const float (&c)[{len}]) const {{"
        );
        let _ = writeln!(
            out,
            "        [[maybe_unused]] const uint64_t at = i * {} + j;",
            dim_field(c, ast, "n")
        );
        let load = Load::AtColumns {
            index: "at",
            cols: &cols,
        };
        let v = emit_stages(out, c, plan.epilogue.clone(), vec!["acc".into()], &load);
        let _ = writeln!(out, "        return {};", v[0]);
        let _ = writeln!(out, "    }}");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ {ty} operator()(uint64_t i, uint64_t j, float acc) const {{"
        );
        // Written out, as the GEMV's below, rather than through `cols`.
        let _ = writeln!(
            out,
            "        [[maybe_unused]] const uint64_t at = i * {} + j;",
            dim_field(c, ast, "n")
        );
        let load = Load::At {
            index: "at",
            column: "j",
            lanes: 1,
        };
        let v = emit_stages(out, c, plan.epilogue.clone(), vec!["acc".into()], &load);
        let _ = writeln!(out, "        return {};", v[0]);
    } else {
        // A GEMV's epilogue comes in two halves, so a pattern can issue the loads of
        // output i before its dot product is done: `load` reads the buffers the epilogue
        // uses at i, `apply` finishes from them.
        let slots = epilogue_buffers(c, plan.epilogue.clone());
        let len = slots.len().max(1);
        let _ = writeln!(out, "    static constexpr uint32_t loads = {len};");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ void load(uint64_t i, float (&x)[{len}]) const {{"
        );
        if slots.is_empty() {
            let _ = writeln!(out, "        x[0] = 0.0f;");
        }
        for (k, &slot) in slots.iter().enumerate() {
            let _ = writeln!(out, "        x[{k}] = pptm_ld_cg_f32({} + i);", field(slot));
        }
        let _ = writeln!(out, "    }}");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ {} apply(uint64_t, float acc, const float (&x)[{len}]) const {{",
            range_type(c, &plan.epilogue)
        );
        let v = emit_stages(
            out,
            c,
            plan.epilogue.clone(),
            vec!["acc".into()],
            &Load::Loaded(&slots),
        );
        let _ = writeln!(out, "        return {};", v[0]);
        let _ = writeln!(out, "    }}");
        let _ = writeln!(
            out,
            "    __device__ __forceinline__ {} operator()(uint64_t i, float acc) const {{",
            range_type(c, &plan.epilogue)
        );
        // Written out rather than as apply(i, acc, load(i)): the manifold it is inlined
        // into spilled 40 bytes more that way.
        let load = Load::At {
            index: "i",
            column: "i",
            lanes: 1,
        };
        let v = emit_stages(out, c, plan.epilogue.clone(), vec!["acc".into()], &load);
        let _ = writeln!(out, "        return {};", v[0]);
    }
    let _ = writeln!(out, "    }}\n}};");
    let (m, n) = (dim_field(c, ast, "m"), dim_field(c, ast, "n"));
    match plan.pattern {
        Pattern::Gemv => {
            let _ = writeln!(
                call,
                "    partial = {}<{r}>({matrix}, {m}, {n}, pptm_pro_{t}{{e}}, pptm_epi_{t}{{e}}, {store}, b);",
                gemv_pattern(ast)
            );
        }
        Pattern::GemvT => {
            let _ = writeln!(
                call,
                "    partial = pptm_gemv_t<{r}>({matrix}, {m}, {n}, pptm_pro_{t}{{e}}, pptm_epi_{t}{{e}}, {store}, b);"
            );
        }
        _ => {
            let a_ptr = match ast.inputs[0] {
                Source::Arg(slot) => field(slot),
                Source::Stage(_) => unreachable!(),
            };
            let k = dim_field(c, ast, "k");
            let args = format!("{a_ptr}, {matrix}, {m}, {k}, {n}, pptm_epi_{t}{{e}}, {store}, b");
            let _ = writeln!(call, "    {}", matmul_call(c, ast, &args));
        }
    }
    call
}

/// The matmul pattern call for stage `st` with its arguments (`args`: A, W, m, k, n, epilogue, out,
/// b): CUDA cores, tensor cores for a tensor stage, or the guard's choice of the two for a guarded
/// one (whose value, the sampled error, is the block's partial). A batched product's patterns
/// take the batch size first.
pub(super) fn matmul_call(c: &ChainIr, st: &StageIr, args: &str) -> String {
    // What mma.sync multiplies: the storage type, except fp8 operands, which the pattern widens to
    // fp16 (exactly) as it stages them (Hopper's wgmma path takes them as they are).
    let elem = match DType::matrix_storage(st.precision) {
        DType::F8E4M3 => "pptm_f16",
        storage => device_elem(storage),
    };
    if st.op.class == FusionClass::OutputFusable(Anchor::BatchedMatmul) {
        // The lowering refuses `tolerance` on a batched product: no guarded form.
        let batch = dim_field(c, st, "batch");
        let pattern = if st.tensor {
            format!("pptm_matmul_mma_batched<{elem}>")
        } else {
            "pptm_matmul_batched".to_string()
        };
        return format!("{pattern}({batch}, {args});\n    partial = 0.0;");
    }
    match (st.tensor, st.tolerance, c.guard()) {
        (true, Some(tol), Some((_, _, slot))) => format!(
            "partial = pptm_matmul_guarded<{elem}>({args}, {tol:e}f, {});",
            field(slot)
        ),
        // f32 operands split into bf16 halves in the runtime's scratch, three products on
        // Hopper's wgmma; f32 on CUDA cores where there is no scratch or no wgmma.
        (true, _, _) if st.precision == Precision::Bf16x3 => {
            let scratch = c
                .args
                .iter()
                .position(|a| a.kind == ArgKind::Scratch)
                .expect("a bf16x3 chain has a scratch slot");
            format!(
                "pptm_matmul_bf16x3<{}>({args}, {});\n    partial = 0.0;",
                st.promoted,
                field(scratch)
            )
        }
        // `accumulate = "promoted"`: the wgmma path adds each 512 of k into f32 sums.
        (true, _, _) if st.promoted => {
            format!("pptm_matmul_mma<{elem}, true>({args});\n    partial = 0.0;")
        }
        (true, _, _) => format!("pptm_matmul_mma<{elem}>({args});\n    partial = 0.0;"),
        _ => format!("pptm_matmul({args});\n    partial = 0.0;"),
    }
}

/// The GEMV pattern for stage `st` (Gemv or GemvT): the op's own, or for a tensor-core Gemv
/// (bf16 or fp8 A) the mma.sync one.
pub(super) fn gemv_pattern(st: &StageIr) -> &'static str {
    if st.tensor {
        debug_assert_eq!(st.op.device, pptm_spec::ops::GEMV.device);
        "pptm_gemv_n_mma"
    } else {
        st.op.device
    }
}

/// The buffers the stages in `range` read besides their flow (by-value arguments excluded), each
/// once, in first-use order: what a split epilogue loads ahead.
pub(super) fn epilogue_buffers(c: &ChainIr, range: std::ops::Range<usize>) -> Vec<usize> {
    let mut slots = Vec::new();
    for s in range {
        let st = &c.stages[s];
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            if let Source::Arg(slot) = *src
                && !p.ty.is_by_value()
                && !slots.contains(&slot)
            {
                slots.push(slot);
            }
        }
    }
    slots
}

/// The buffers the stages in `range` read by column (`Row` inputs), each once, in order.
pub(super) fn column_buffers(c: &ChainIr, range: std::ops::Range<usize>) -> Vec<usize> {
    let mut slots = Vec::new();
    for s in range {
        let st = &c.stages[s];
        for (p, src) in st.op.inputs.iter().zip(&st.inputs).skip(1) {
            if let (Source::Arg(slot), Ty::Row) = (*src, p.ty)
                && !slots.contains(&slot)
            {
                slots.push(slot);
            }
        }
    }
    slots
}

/// The channel expressions of the value a chain reads as stage 0's flow, loaded at `index`.
pub(super) fn first_flow(c: &ChainIr, index: &str) -> Vec<String> {
    match c.stages[0].inputs[0] {
        Source::Arg(slot) => vec![format!("pptm_ld_cg_f32({} + {index})", field(slot))],
        Source::Stage(_) => unreachable!(),
    }
}

//! The unfused variant: each stage of a chain a pass of its own over the whole grid, its value
//! stored to the manifold's scratch ring between passes (the debugging and comparison variant).

use std::fmt::Write;

use super::*;

/// Stored outputs the unfused mode keeps (`PPTM_MAX_STAGES` in kernels/pptm/abi.h).
pub(super) const SCRATCH_SLOTS: usize = 16;

/// The unfused mode's stored output of stage `s`: a ring of `PPTM_MAX_STAGES` buffers, so a chain
/// of more stages (`repeat = k`) reuses them; every stage reads only what the stage before it
/// stored. Stages below the ring's size keep their plain index.
pub(super) fn scratch(s: usize) -> String {
    if s < SCRATCH_SLOTS {
        format!("scratch[{s}]")
    } else {
        format!("scratch[{s} % PPTM_MAX_STAGES]")
    }
}

/// Channel expressions of stage `s`'s flow read from memory at element `index`: the previous
/// stage's stored output (`scratch[s - 1]`), or the chain argument of the first stage.
fn stored_flow(c: &ChainIr, s: usize, index: &str) -> (String, Vec<String>) {
    stored_flow_from(c, s, index, None)
}

/// [`stored_flow`], with the previous stage's stored output named by `src` where given (a run of
/// repeated stages whose stage index is only known at run time).
fn stored_flow_from(
    c: &ChainIr,
    s: usize,
    index: &str,
    src: Option<&str>,
) -> (String, Vec<String>) {
    match c.stages[s].inputs[0] {
        Source::Arg(slot) => {
            let ch = c.args[slot].channels.max(1);
            let exprs = (0..ch)
                .map(|k| {
                    if ch == 1 {
                        format!("pptm_ld_cg_f32({} + {index})", field(slot))
                    } else {
                        format!("pptm_ld_cg_f32({} + {index} * {ch} + {k})", field(slot))
                    }
                })
                .collect();
            (field(slot), exprs)
        }
        Source::Stage(j) => {
            let ch = match &c.stages[j].shape {
                Shape::Tensor { channels, .. } | Shape::Pairs { channels, .. } => *channels,
                Shape::Scalar => 1,
            };
            let src = src.map_or_else(|| scratch(j), str::to_string);
            let exprs = (0..ch)
                .map(|k| {
                    if ch == 1 {
                        format!("pptm_ld_cg_f32({src} + {index})")
                    } else {
                        format!("pptm_ld_cg_f32({src} + {index} * {ch} + {k})")
                    }
                })
                .collect();
            (src, exprs)
        }
    }
}

/// `code` with every line indented `by` more spaces.
fn indent(code: &str, by: usize) -> String {
    code.lines().map(|l| format!("{:by$}{l}\n", "")).collect()
}

/// The unfused mode's two switches (`pptm_run_stage`, `pptm_finish_stage`): every stage of every
/// chain as a pass of its own over stored values, from the same op code.
pub(super) fn unfused(out: &mut String, chains: &[ChainIr]) {
    let mut run = String::new();
    let mut fin = String::new();
    for c in chains {
        let t = tag(c);
        let _ = writeln!(run, "    case 0x{t}u: {{  // {}", c.name);
        let _ = writeln!(run, "        const pptm_env_{t} e(d);");
        let _ = writeln!(run, "        switch (stage) {{");
        let last = c.stages.len() - 1;
        let after_reduction = |s: usize| c.plan.reduction.is_some_and(|r| s > r);
        // A stage repeated (`repeat = k`) is the same pass again: its copies after the first,
        // up to the one before the chain's last stage, share one case, which finds the stored
        // outputs it reads and writes from the stage index.
        let middle_copy = |k: usize| {
            k > 0
                && k < last
                && c.stages[k].number == c.stages[k - 1].number
                && c.stages[k].op.class == FusionClass::Elementwise
                && !after_reduction(k)
                && matches!(c.stages[k].inputs[0], Source::Stage(j) if j == k - 1)
        };
        let mut s = 0;
        while s < c.stages.len() {
            let st = &c.stages[s];
            let run_end = (s..c.stages.len())
                .take_while(|&k| middle_copy(k))
                .last()
                .filter(|&hi| hi > s);
            let (dst, flow_src) = match run_end {
                Some(hi) => {
                    let labels: Vec<String> = (s..=hi).map(|k| format!("case {k}:")).collect();
                    for line in labels.chunks(16) {
                        let _ = writeln!(run, "        {}", line.join(" "));
                    }
                    let _ = writeln!(run, "        {{  // {} x {}", st.op.name, hi - s + 1);
                    (
                        "scratch[stage % PPTM_MAX_STAGES]".to_string(),
                        Some("scratch[(stage - 1) % PPTM_MAX_STAGES]"),
                    )
                }
                None => {
                    let _ = writeln!(run, "        case {s}: {{  // {}", st.op.name);
                    let dst = if s == last && c.output == ChainOutput::Vector {
                        field(c.output_slot().expect("out"))
                    } else {
                        scratch(s)
                    };
                    (dst, None)
                }
            };
            let body = &mut run;
            match st.op.class {
                FusionClass::Elementwise | FusionClass::Broadcast if after_reduction(s) => {
                    let _ = writeln!(body, "            if (b.block == 0 && threadIdx.x == 0) {{");
                    let mut inner = String::new();
                    let v = emit_stages(
                        &mut inner,
                        c,
                        s..s + 1,
                        vec![format!("{}[0]", scratch(s - 1))],
                        &Load::At {
                            index: "0",
                            column: "0",
                            lanes: 1,
                        },
                    );
                    body.push_str(&indent(&inner, 8));
                    let _ = writeln!(body, "                {}[0] = {};", scratch(s), v[0]);
                    let _ = writeln!(body, "                out->value = (double){};", v[0]);
                    let _ = writeln!(body, "            }}");
                }
                FusionClass::Elementwise | FusionClass::Broadcast => {
                    let dims = match &st.shape {
                        Shape::Tensor { dims, .. } => dims.clone(),
                        _ => unreachable!("elementwise on a tensor"),
                    };
                    let cols = dims
                        .last()
                        .map_or("1".to_string(), |&d| field(c.dims[d].slot));
                    let _ = writeln!(
                        body,
                        "            const uint64_t count = {};",
                        dims_product(c, &dims)
                    );
                    let _ = writeln!(
                        body,
                        "            for (uint64_t i = (uint64_t)b.block * PPTM_BLOCK_THREADS + threadIdx.x; i < count; i += (uint64_t)b.nblocks * PPTM_BLOCK_THREADS) {{"
                    );
                    let _ = writeln!(
                        body,
                        "                [[maybe_unused]] const uint64_t col = i % {cols};"
                    );
                    let (_, flow) = stored_flow_from(c, s, "i", flow_src);
                    let mut inner = String::new();
                    let v = emit_stages(
                        &mut inner,
                        c,
                        s..s + 1,
                        flow,
                        &Load::At {
                            index: "i",
                            column: "col",
                            lanes: 1,
                        },
                    );
                    body.push_str(&indent(&inner, 8));
                    match &st.shape {
                        // A state: its fields, interleaved.
                        Shape::Tensor { channels, .. } if st.op.states.out.is_some() => {
                            let _ = writeln!(
                                body,
                                "                pptm_state_store({dst} + {channels} * i, {});",
                                v[0]
                            );
                        }
                        _ => {
                            let _ = writeln!(body, "                {dst}[i] = {};", v[0]);
                        }
                    }
                    let _ = writeln!(body, "            }}");
                }
                FusionClass::Reduction if st.per_row => {
                    let (src, _) = stored_flow(c, s, "0");
                    let (rows, cols) = matrix_rows(c, s);
                    let _ = writeln!(
                        body,
                        "            const float* const in[1] = {{{src}}};\n            pptm_matrix_rows<1, pptm_no_reducer, {}>(in, {rows}, {cols}, pptm_take_first{{}}, pptm_pass_row<{}>{{}}, {dst}, b);",
                        st.op.device, st.finite
                    );
                }
                FusionClass::Reduction if c.folds_rows(s) => {
                    let Source::Stage(p) = st.inputs[0] else {
                        unreachable!()
                    };
                    let (pch, row) = row_ctor(c, st);
                    // (A stage declared `finite` names the row type to reach the check.)
                    let targs = if st.finite {
                        format!("{pch}, pptm_row_fold<{}>, true", st.op.device)
                    } else {
                        pch.to_string()
                    };
                    let _ = writeln!(
                        body,
                        "            pptm_rows_stored<{targs}>({}, {}, {row}, {dst}, b);",
                        dim_field(c, &c.stages[p], "n"),
                        scratch(p)
                    );
                }
                FusionClass::Reduction => {
                    let (src, _) = stored_flow(c, s, "0");
                    let dims = match (s, c.stages[s].inputs[0]) {
                        (0, Source::Arg(slot)) => c.args[slot].shape.clone(),
                        _ => match &c.stages[s - 1].shape {
                            Shape::Tensor { dims, .. } => dims.clone(),
                            _ => unreachable!("a reduction reads a tensor"),
                        },
                    };
                    let count = dims_product(c, &dims);
                    let _ = writeln!(body, "            const float* const in[1] = {{{src}}};");
                    let _ = writeln!(
                        body,
                        "            partial = pptm_map_reduce<1, {}>(in, {count}, pptm_take_first{{}}, b);",
                        st.op.device
                    );
                    // The last block finishes the reduction.
                    let _ = writeln!(fin, "    case 0x{t}{s:02x}ull: {{  // {} stage {s}", c.name);
                    let _ = writeln!(fin, "        const pptm_env_{t} e(d);");
                    let _ = writeln!(
                        fin,
                        "        const double v = {r}::finish(pptm_combine_partials<{r}>(partials, nblocks, smem), {count});",
                        r = st.op.device
                    );
                    if st.finite {
                        let _ = writeln!(fin, "        pptm_check_finite_thread0(v);");
                    }
                    let _ = writeln!(
                        fin,
                        "        if (threadIdx.x == 0) {{ {}[0] = (float)v; out->value = v; }}",
                        scratch(s)
                    );
                    let _ = writeln!(fin, "        return;");
                    let _ = writeln!(fin, "    }}");
                }
                FusionClass::OutputFusable(_) => {
                    let (src, _) = stored_flow(c, s, "0");
                    let matrix = match st.inputs[1] {
                        Source::Arg(slot) => field(slot),
                        Source::Stage(_) => unreachable!(),
                    };
                    let (m, n) = (dim_field(c, st, "m"), dim_field(c, st, "n"));
                    if is_matmul(st.op) {
                        let k = dim_field(c, st, "k");
                        let args =
                            format!("{src}, {matrix}, {m}, {k}, {n}, pptm_pass_acc{{}}, {dst}, b");
                        let call = matmul_call(c, st, &args).replace("\n    ", "\n            ");
                        let _ = writeln!(body, "            {call}");
                        if st.tolerance.is_some() {
                            // The last block reports the guard's value, as the fused variant does.
                            let _ = writeln!(
                                fin,
                                "    case 0x{t}{s:02x}ull: {{  // {} stage {s}: the guard's value",
                                c.name
                            );
                            let _ = writeln!(
                                fin,
                                "        const double v = pptm_combine_partials<pptm_max_reducer>(partials, nblocks, smem);"
                            );
                            let _ = writeln!(fin, "        if (threadIdx.x == 0) out->value = v;");
                            let _ = writeln!(fin, "        (void)scratch;");
                            let _ = writeln!(fin, "        return;");
                            let _ = writeln!(fin, "    }}");
                        }
                    } else {
                        let _ = writeln!(
                            body,
                            "            {}<pptm_no_reducer>({matrix}, {m}, {n}, pptm_load_at{{{src}}}, pptm_pass_acc{{}}, {dst}, b);",
                            gemv_pattern(st)
                        );
                    }
                }
                FusionClass::Pairwise => {
                    let _ = writeln!(
                        body,
                        "            pptm_pairwise_store({}, {}, {dst}, b);",
                        dim_field(c, st, "n"),
                        distance_ctor(c, st)
                    );
                }
                FusionClass::RowReduction => {
                    let Source::Stage(p) = st.inputs[0] else {
                        unreachable!()
                    };
                    let (pch, row) = row_ctor(c, st);
                    let _ = writeln!(
                        body,
                        "            pptm_rows_stored<{pch}>({}, {}, {row}, {dst}, b);",
                        dim_field(c, st, "n"),
                        scratch(p)
                    );
                }
            }
            let sets_partial =
                (st.op.class == FusionClass::Reduction && !c.folds_rows(s)) || is_matmul(st.op);
            if !sets_partial {
                let _ = writeln!(body, "            partial = 0.0;");
            }
            let _ = writeln!(body, "            return PPTM_STATUS_OK;");
            let _ = writeln!(body, "        }}");
            s = run_end.map_or(s + 1, |hi| hi + 1);
        }
        let _ = writeln!(run, "        default: return PPTM_STATUS_BAD_OPCODE;");
        let _ = writeln!(run, "        }}");
        let _ = writeln!(run, "    }}");
    }
    out.push_str(
        "\n__device__ __forceinline__ uint32_t pptm_run_stage(const pptm_desc& d, uint32_t stage, float* const* scratch, pptm_launch_out* out, const pptm_block_ctx& b, double& partial) {\n",
    );
    out.push_str("    (void)out;\n    switch (d.opcode) {\n");
    out.push_str(&run);
    out.push_str("    default: partial = 0.0; return PPTM_STATUS_BAD_OPCODE;\n    }\n}\n");
    out.push_str(
        "\n__device__ __forceinline__ void pptm_finish_stage(const pptm_desc& d, uint32_t stage, float* const* scratch, pptm_launch_out* out, const double* partials, uint32_t nblocks, double* smem) {\n",
    );
    out.push_str("    switch (((uint64_t)d.opcode << 8) | stage) {\n");
    out.push_str(&fin);
    out.push_str("    default: (void)scratch; (void)out; (void)partials; (void)nblocks; (void)smem; return;\n    }\n}\n");
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_scratch_ring_is_the_abis() {
        let abi = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/pptm/abi.h"),
        )
        .unwrap();
        let line = format!("#define PPTM_MAX_STAGES {}u", super::SCRATCH_SLOTS);
        assert!(abi.contains(&line), "abi.h no longer has `{line}`");
        assert_eq!(super::scratch(3), "scratch[3]");
        assert_eq!(super::scratch(17), "scratch[17 % PPTM_MAX_STAGES]");
    }
}

//! What the generated CUDA says for chains of each pattern.

use super::*;
use pptm_spec::{ChainSpec, StageSpec, lower};

/// The spec of an `inference` chain of `ops`, no stage attributes written.
fn spec(name: &str, ops: &[&str]) -> ChainSpec {
    let stages = ops
        .iter()
        .enumerate()
        .map(|(i, op)| StageSpec {
            field: format!("s{i}"),
            number: i as u32 + 1,
            op: op.to_string(),
            ..Default::default()
        })
        .collect();
    ChainSpec {
        name: name.into(),
        domain: "inference".into(),
        stages,
    }
}

fn chain(name: &str, ops: &[&str]) -> ChainIr {
    lower(&spec(name, ops)).unwrap()
}

#[test]
fn finite_stages_are_checked_where_their_values_are_computed() {
    let mut spec = spec("CheckedKl", &["KlDivergence", "SumReduction"]);
    for st in &mut spec.stages {
        st.finite = Some(true);
    }
    let checked = lower(&spec).unwrap();
    let src = domain_source("inference", std::slice::from_ref(&checked));
    let t = tag(&checked);
    // The streaming body checks each element, the finish checks the total in thread 0 (the
    // only thread holding it), and the variant is listed so the manifold meets at a barrier
    // before reading the flag.
    assert!(
        src.contains(
            "const float s0 = pptm_op_kl_divergence(x[0], x[1]);\n        pptm_check_finite(s0);"
        ),
        "{src}"
    );
    assert!(src.contains("    pptm_check_finite_thread0(v);"), "{src}");
    assert!(src.contains(&format!("    case 0x{t}u: return true;  // CheckedKl")));
    // The unfused passes check too.
    assert!(src.contains("        const double v = pptm_op_sum_reduction_reducer::finish(pptm_combine_partials<pptm_op_sum_reduction_reducer>(partials, nblocks, smem), e.a2);\n        pptm_check_finite_thread0(v);"), "{src}");
    // Unchecked, no check is emitted at all.
    for st in &mut spec.stages {
        st.finite = None;
    }
    let plain = domain_source("inference", &[lower(&spec).unwrap()]);
    assert!(!plain.contains("pptm_check_finite"), "{plain}");
    assert!(plain.contains("bool pptm_variant_checks_finite(uint32_t opcode) {\n    switch (opcode) {\n    default: return false;"));
}

/// `per_row = true`: the prologue computes each element where the row pass reads it, the
/// epilogue runs on each row's value (a `finite` row reduction is checked there), and the
/// unfused pass folds the stored matrix with the same pattern.
#[test]
fn a_repeated_stage_shares_one_unfused_case() {
    // Sigmoid x 20, then a sum: the first copy reads the chain's input, copies 2 to 20 share
    // one case that finds its stored outputs from the stage index (a ring of 16), the sum
    // reads the 20th.
    let mut spec = spec("Repeated", &["Sigmoid", "SumReduction"]);
    spec.stages[0].repeat = Some(20);
    let ir = lower(&spec).unwrap();
    let src = domain_source("inference", std::slice::from_ref(&ir));
    assert!(src.contains("        case 0: {  // Sigmoid\n"), "{src}");
    assert!(src.contains("        case 1: case 2: case 3:"), "{src}");
    assert!(
        src.contains("case 19:\n        {  // Sigmoid x 19\n"),
        "{src}"
    );
    assert!(
        src.contains("pptm_ld_cg_f32(scratch[(stage - 1) % PPTM_MAX_STAGES] + i)"),
        "{src}"
    );
    assert!(
        src.contains("scratch[stage % PPTM_MAX_STAGES][i] = "),
        "{src}"
    );
    assert!(src.contains("        case 20: {  // SumReduction"), "{src}");
    assert!(src.contains("scratch[19 % PPTM_MAX_STAGES]"), "{src}");
    assert_eq!(src.matches("// Sigmoid").count(), 2, "{src}");
}

#[test]
fn a_row_wise_reduction_runs_the_rows_pattern() {
    let mut spec = spec(
        "RowRms",
        &["Square", "MeanReduction", "Sigmoid", "MaxReduction"],
    );
    spec.stages[1].per_row = Some(true);
    spec.stages[1].finite = Some(true);
    let ir = lower(&spec).unwrap();
    let t = tag(&ir);
    let src = domain_source("inference", std::slice::from_ref(&ir));
    let pro = format!(
        "struct pptm_body_{t} {{\n    pptm_env_{t} e;\n    __device__ __forceinline__ float operator()(const float (&x)[1]) const {{\n        const float s0 = pptm_op_square(x[0]);"
    );
    assert!(src.contains(&pro), "{src}");
    let epi = "const float (&v)[1]) const {\n        pptm_check_finite(v[0]);\n        const float s2 = pptm_op_sigmoid(v[0]);";
    assert!(src.contains(epi), "{src}");
    let call = format!(
        "const float* const in[1] = {{e.a0}};\n    partial = pptm_matrix_rows<1, pptm_op_max_reduction_reducer, pptm_op_mean_reduction_reducer>(in, e.a1, e.a2, pptm_body_{t}{{e}}, pptm_epi_{t}{{e}}, nullptr, b);"
    );
    assert!(src.contains(&call), "{src}");
    assert!(
        src.contains(&format!("__device__ __noinline__ uint32_t pptm_run_{t}(")),
        "{src}"
    );
    let unfused = "const float* const in[1] = {scratch[0]};\n            pptm_matrix_rows<1, pptm_no_reducer, pptm_op_mean_reduction_reducer>(in, e.a1, e.a2, pptm_take_first{}, pptm_pass_row<true>{}, scratch[1], b);";
    assert!(src.contains(unfused), "{src}");
}

#[test]
fn gemv_prologue_and_epilogue_stages_are_checked_where_they_compute() {
    let ops = [
        "PredictionError",
        "PrecisionWeight",
        "GemvT",
        "BeliefUpdate",
    ];
    let mut spec = spec("CheckedBelief", &ops);
    spec.stages[0].finite = Some(true);
    let checked = lower(&spec).unwrap();
    let t = tag(&checked);
    let src = domain_source("inference", std::slice::from_ref(&checked));
    // The fused GEMV-T's prologue checks the prediction error as it computes it, before the
    // precision weight; the epilogue, unchecked here, has no check.
    let pro = format!("struct pptm_pro_{t} {{");
    let epi = format!("struct pptm_epi_{t} {{");
    let (pro_at, epi_at) = (src.find(&pro).unwrap(), src.find(&epi).unwrap());
    let prologue = &src[pro_at..epi_at];
    let epilogue = &src[epi_at..src[epi_at..].find("\n};").unwrap() + epi_at];
    assert!(
        prologue.contains("const float s0 = pptm_op_prediction_error(pptm_ld_cg_f32(e.a0 + j), pptm_ld_cg_f32(e.a1 + j));\n        pptm_check_finite(s0);\n        const float s1 = pptm_op_precision_weight("),
        "{prologue}"
    );
    assert_eq!(
        prologue.matches("pptm_check_finite").count(),
        1,
        "{prologue}"
    );
    assert!(!epilogue.contains("pptm_check_finite"), "{epilogue}");
    // The unfused stage 1 checks too.
    assert!(src.contains("const float s0 = pptm_op_prediction_error(pptm_ld_cg_f32(e.a0 + i), pptm_ld_cg_f32(e.a1 + i));\n                pptm_check_finite(s0);\n                scratch[0][i] = s0;"), "{src}");
    assert!(
        src.contains(&format!("    case 0x{t}u: return true;  // CheckedBelief")),
        "{src}"
    );
    // The epilogue stage checked instead: the check moves there, and the prologue has none.
    spec.stages[0].finite = None;
    spec.stages[3].finite = Some(true);
    let checked = lower(&spec).unwrap();
    let t = tag(&checked);
    let src = domain_source("inference", std::slice::from_ref(&checked));
    let (pro, epi) = (
        format!("struct pptm_pro_{t} {{"),
        format!("struct pptm_epi_{t} {{"),
    );
    let (pro_at, epi_at) = (src.find(&pro).unwrap(), src.find(&epi).unwrap());
    assert!(!src[pro_at..epi_at].contains("pptm_check_finite"));
    let epilogue = &src[epi_at..src[epi_at..].find("\n};").unwrap() + epi_at];
    assert_eq!(
        epilogue.matches("pptm_check_finite(s3);").count(),
        2,
        "{epilogue}"
    );
}

#[test]
fn fuses_elementwise_into_a_reduction_pass() {
    let kl = chain("KlComplexity", &["KlDivergence", "SumReduction"]);
    let src = domain_source("inference", std::slice::from_ref(&kl));
    let t = tag(&kl);
    assert!(
        src.contains("const float s0 = pptm_op_kl_divergence(x[0], x[1]);"),
        "{src}"
    );
    assert!(src.contains("return s0;"));
    assert!(src.contains(&format!(
        "partial = pptm_map_reduce<2, pptm_op_sum_reduction_reducer>(in, e.a2, pptm_body_{t}{{e}}, b);"
    )), "{src}");
    assert!(src.contains(&format!("case 0x{t}u: return pptm_run_{t}(d, b, partial);")));
    assert!(src.contains(
        "double v = pptm_op_sum_reduction_reducer::finish(pptm_combine_partials<pptm_op_sum_reduction_reducer>(partials, nblocks, smem), e.a2);"
    ), "{src}");
    assert!(src.contains("#include \"pptm/ops/divergence.cuh\""));
    assert!(src.trim_end().ends_with("#include \"pptm/manifold.cuh\""));
    // The generated code carries no addresses: every pointer comes from the descriptor.
    assert!(!src.contains("0x7f"));
}

#[test]
fn vector_chains_store_and_reduction_only_chains_reduce_their_input() {
    let terms = chain("KlTerms", &["KlDivergence"]);
    let sum = chain("Total", &["SumReduction"]);
    let src = domain_source("inference", &[terms.clone(), sum.clone()]);
    assert!(
        src.contains(&format!(
            "pptm_map_store<2>(in, e.a2, e.a3, pptm_body_{}{{e}}, b);",
            tag(&terms)
        )),
        "{src}"
    );
    assert!(src.contains("return x[0];"), "{src}");
    assert!(src.contains("pptm_map_reduce<1, pptm_op_sum_reduction_reducer>"));
    assert!(
        src.contains(&format!(
            "case 0x{}u: return true;  // KlTerms",
            tag(&terms)
        )),
        "{src}"
    );
    assert!(src.contains(&format!(
        "case 0x{t}u: return pptm_finish_{t}",
        t = tag(&sum)
    )));
    assert!(!src.contains(&format!("pptm_finish_{}", tag(&terms))));
}

#[test]
fn prologue_and_epilogue_fuse_into_gemv() {
    let c = chain(
        "Belief",
        &[
            "PredictionError",
            "PrecisionWeight",
            "GemvT",
            "BeliefUpdate",
        ],
    );
    let src = domain_source("inference", std::slice::from_ref(&c));
    let t = tag(&c);
    // The prologue computes the weighted error where GemvT reads it.
    assert!(src.contains("const float s0 = pptm_op_prediction_error(pptm_ld_cg_f32(e.a0 + j), pptm_ld_cg_f32(e.a1 + j));"), "{src}");
    assert!(
        src.contains("const float s1 = pptm_op_precision_weight(s0, pptm_ld_cg_f32(e.a2 + j));"),
        "{src}"
    );
    // The epilogue runs on each output element.
    assert!(
        src.contains(
            "const float s3 = pptm_op_belief_update(acc, pptm_ld_cg_f32(e.a4 + i), e.a5);"
        ),
        "{src}"
    );
    // Its split form loads the epilogue's buffer ahead and finishes from the loaded value.
    assert!(src.contains("x[0] = pptm_ld_cg_f32(e.a4 + i);"), "{src}");
    assert!(
        src.contains("const float s3 = pptm_op_belief_update(acc, x[0], e.a5);"),
        "{src}"
    );
    assert!(src.contains(&format!(
        "partial = pptm_gemv_t<pptm_no_reducer>(e.a3, e.a7, e.a8, pptm_pro_{t}{{e}}, pptm_epi_{t}{{e}}, e.a6, b);"
    )), "{src}");
    assert!(
        src.contains("float a5;  // lr") && src.contains("__uint_as_float((uint32_t)d.args[5])")
    );
    let g = chain("Gas", &["Gemv", "Axpby", "Square", "SumReduction"]);
    let src = domain_source("inference", std::slice::from_ref(&g));
    assert!(
        src.contains("pptm_gemv_n<pptm_op_sum_reduction_reducer>(e.a1, e.a6, e.a5,"),
        "{src}"
    );
    assert!(
        src.contains("const float s2 = pptm_op_square(s1);"),
        "{src}"
    );
}

#[test]
fn fp64_stages_widen_their_inputs_and_pass_f64_on() {
    let mut s = spec("Wide", &["Matmul", "AddBias", "Gelu"]);
    s.stages[1].precision = Some(Precision::Fp64);
    s.stages[2].precision = Some(Precision::Fp64);
    let src = domain_source("inference", std::slice::from_ref(&lower(&s).unwrap()));
    // The f64 epilogue returns its f64 value (stored as f32 by the pattern).
    assert!(
        src.contains("__device__ __forceinline__ double operator()(uint64_t i, uint64_t j, float acc) const {"),
        "{src}"
    );
    assert!(
        src.contains("const double s1 = pptm_op_add_bias((double)acc, (double)pptm_ld_cg_f32(e.a2 + j));\n        const double s2 = pptm_op_gelu((double)s1);"),
        "{src}"
    );
    // An f32 stage after an f64 one narrows its flow; an f64 reduction's result stays f64 for
    // the f64 stage after it.
    let mut s = spec("Mix", &["Digamma", "Square", "MeanReduction", "AddDigamma"]);
    for k in [0, 2, 3] {
        s.stages[k].precision = Some(Precision::Fp64);
    }
    let src = domain_source("inference", std::slice::from_ref(&lower(&s).unwrap()));
    assert!(
        src.contains("const double s0 = pptm_op_digamma((double)x[0]);"),
        "{src}"
    );
    assert!(
        src.contains("const float s1 = pptm_op_square((float)s0);"),
        "{src}"
    );
    assert!(src.contains("        const double f = v;\n        const double s3 = pptm_op_add_digamma((double)f, e.a1);"), "{src}");
    // Ops without an f64 form refuse it.
    let mut s = spec("MatmulWide", &["Matmul"]);
    s.stages[0].precision = Some(Precision::Fp64);
    assert!(
        lower(&s)
            .unwrap_err()
            .to_string()
            .contains("does not implement precision \"fp64\"")
    );
}

#[test]
fn matmul_epilogue_broadcasts_the_bias_by_column() {
    let c = chain("Mlp", &["Matmul", "AddBias", "Gelu"]);
    let src = domain_source("inference", std::slice::from_ref(&c));
    assert!(
        src.contains("[[maybe_unused]] const uint64_t at = i * e.a6 + j;"),
        "{src}"
    );
    assert!(
        src.contains("const float s1 = pptm_op_add_bias(acc, pptm_ld_cg_f32(e.a2 + j));"),
        "{src}"
    );
    assert!(src.contains("const float s2 = pptm_op_gelu(s1);"));
    // The column half: the bias loaded by `cols`, read from `c` by the four-argument form.
    assert!(
        src.contains(
            "    static constexpr uint32_t col_loads = 1;\n    __device__ __forceinline__ void cols(uint64_t j, float (&c)[1]) const {\n        c[0] = pptm_ld_cg_f32(e.a2 + j);\n    }"
        ),
        "{src}"
    );
    assert!(
        src.contains("const float s1 = pptm_op_add_bias(acc, c[0]);"),
        "{src}"
    );
    assert!(
        src.contains("pptm_matmul(e.a0, e.a1, e.a4, e.a5, e.a6,"),
        "{src}"
    );
    // Without a column input, `cols` loads nothing.
    let c = chain("Plain", &["Matmul", "Gelu"]);
    let src = domain_source("inference", std::slice::from_ref(&c));
    assert!(
        src.contains("void cols(uint64_t j, float (&c)[1]) const {\n        c[0] = 0.0f;\n    }"),
        "{src}"
    );
}

#[test]
fn pairwise_rows_with_epilogue_reduction_and_finish() {
    let c = chain(
        "Te",
        &[
            "SubspaceDistances",
            "RadiusCount",
            "KsgDigamma",
            "MeanReduction",
            "AddDigamma",
        ],
    );
    let src = domain_source("inference", std::slice::from_ref(&c));
    let t = tag(&c);
    assert!(src.contains(&format!(
        "partial = pptm_pairwise_rows<pptm_op_mean_reduction_reducer>(e.a5, pptm_op_subspace_distances{{e.a0, e.a1, e.a2, (uint32_t)e.a6, (uint32_t)e.a7, (uint32_t)e.a8}}, pptm_op_radius_count<3>{{e.a3}}, pptm_epi_{t}{{e}}, nullptr, b);"
    )), "{src}");
    assert!(
        src.contains("const float s2 = pptm_op_ksg_digamma(v[0], v[1], v[2]);"),
        "{src}"
    );
    assert!(src.contains("pptm_op_mean_reduction_reducer::finish(pptm_combine_partials<pptm_op_mean_reduction_reducer>(partials, nblocks, smem), e.a5);"), "{src}");
    assert!(
        src.contains("const float s4 = pptm_op_add_digamma(f, e.a4);"),
        "{src}"
    );
    let k = chain("Kth", &["ChebyshevDistance", "KthSmallest"]);
    let src = domain_source("inference", std::slice::from_ref(&k));
    assert!(
        src.contains("pptm_op_chebyshev{e.a0, (uint32_t)e.a4}, pptm_op_kth_smallest{e.a1}"),
        "{src}"
    );
}

#[test]
fn a_reduction_folds_pairwise_rows_with_its_reducer() {
    let c = chain(
        "Spread",
        &[
            "ChebyshevDistance",
            "MeanReduction",
            "Square",
            "MaxReduction",
        ],
    );
    let src = domain_source("inference", std::slice::from_ref(&c));
    let t = tag(&c);
    // Fused: the row type is the fold of the row stage's reducer; the chain's reducer is the
    // last stage's.
    assert!(src.contains(&format!(
        "partial = pptm_pairwise_rows<pptm_op_max_reduction_reducer>(e.a1, pptm_op_chebyshev{{e.a0, (uint32_t)e.a2}}, pptm_row_fold<pptm_op_mean_reduction_reducer>{{}}, pptm_epi_{t}{{e}}, nullptr, b);"
    )), "{src}");
    // Unfused: the stored rows, folded per point; no partial, and no finish case of its own.
    assert!(src.contains("pptm_rows_stored<1>(e.a1, scratch[0], pptm_row_fold<pptm_op_mean_reduction_reducer>{}, scratch[1], b);"), "{src}");
    assert!(!src.contains(&format!("case 0x{t}01ull:")), "{src}");
    assert!(src.contains(&format!("case 0x{t}03ull:")), "{src}");
}

#[test]
fn output_is_deterministic() {
    let kl = chain("KlComplexity", &["KlDivergence", "SumReduction"]);
    assert_eq!(
        domain_source("inference", std::slice::from_ref(&kl)),
        domain_source("inference", &[kl])
    );
}

#[test]
fn heavy_elementwise_domains_get_wide_registers() {
    // Sigmoid x 20 is a heavy pass (pptm_map_each); a domain of it alone runs one block an SM
    // with 128 registers a thread. Beside a GEMV chain, or with only light passes, it does not.
    let mut heavy = spec("Heavy", &["Sigmoid", "SumReduction"]);
    heavy.stages[0].repeat = Some(20);
    let heavy = lower(&heavy).unwrap();
    let light = chain("Light", &["Sigmoid", "SumReduction"]);
    let gemv = chain("Product", &["Gemv"]);
    let wide = "#define PPTM_WIDE_REGISTERS 1";
    assert!(domain_source("inference", &[heavy.clone(), light.clone()]).contains(wide));
    assert!(!domain_source("inference", std::slice::from_ref(&light)).contains(wide));
    assert!(!domain_source("inference", &[heavy, gemv]).contains(wide));
}

#[test]
fn a_lanes_op_runs_its_pass_with_lanes_where_they_fit() {
    let f: syn::ItemFn = syn::parse_str(
        "fn row_sum(idx: f64, t: Table) -> f64 {
             let mut acc = 0.0_f64;
             for j in lanes(0..t.cols()) { acc += t.at(idx as u32, j); }
             acc
         }",
    )
    .unwrap();
    let attr = pptm_spec::op_fn::parse_op_attr("lanes = 4, f32_form".parse().unwrap()).unwrap();
    let op = pptm_spec::op_fn::parse_op(&attr, &f)
        .unwrap()
        .leak_def(&[])
        .unwrap();
    let c = pptm_spec::lower_with(&spec("RowSums", &["RowSum"]), &[op]).unwrap();
    assert_eq!((c.lanes(), c.map_elems_per_block()), (4, 128));
    let src = domain_source("inference", std::slice::from_ref(&c));
    let t = tag(&c);
    for needle in [
        "template <unsigned int PPTM_LANES = 1>".to_string(),
        "template <unsigned int PPTM_PASS_LANES>".to_string(),
        "pptm_user_row_sum<PPTM_PASS_LANES>(".to_string(),
        "if (threadIdx.x % PPTM_PASS_LANES != 0u) return 0.0;".to_string(),
        "if (n * 4u <= (uint64_t)b.nblocks * PPTM_BLOCK_THREADS)".to_string(),
        format!("partial = pptm_map_each<pptm_no_reducer, 4>(n, pptm_each_{t}<4>{{e}}, b);"),
        format!("partial = pptm_map_each<pptm_no_reducer, 1>(n, pptm_each_{t}<1>{{e}}, b);"),
        "#define PPTM_WIDE_REGISTERS 1".to_string(),
    ] {
        assert!(src.contains(&needle), "no `{needle}` in\n{src}");
    }
    // The unfused kernels call it with one lane (the template's default).
    assert!(src.contains("pptm_user_row_sum(pptm_ld_cg_f32("), "{src}");
}

#[test]
fn a_promoted_product_asks_the_pattern_for_promoted_sums() {
    let mut s = spec("Promoted", &["Matmul"]);
    s.stages[0].tensor_eligible = Some(true);
    s.stages[0].precision = Some(pptm_spec::Precision::Bf16);
    s.stages[0].promoted = Some(true);
    let promoted = lower(&s).unwrap();
    let src = domain_source("inference", std::slice::from_ref(&promoted));
    assert!(src.contains("pptm_matmul_mma<pptm_bf16, true>("), "{src}");
    s.stages[0].promoted = None;
    let plain = domain_source("inference", &[lower(&s).unwrap()]);
    assert!(plain.contains("pptm_matmul_mma<pptm_bf16>("), "{plain}");
}

#[test]
fn a_bf16x3_product_hands_the_pattern_its_working_memory() {
    let mut s = spec("Split", &["Matmul"]);
    s.stages[0].tensor_eligible = Some(true);
    s.stages[0].precision = Some(pptm_spec::Precision::Bf16x3);
    let ir = lower(&s).unwrap();
    let slot = ir
        .args
        .iter()
        .position(|a| a.kind == pptm_spec::ArgKind::Scratch)
        .unwrap();
    let src = domain_source("inference", std::slice::from_ref(&ir));
    assert!(
        src.contains(&format!("void* a{slot};  // scratch")),
        "{src}"
    );
    assert!(
        src.contains(&format!(", b, e.a{slot});")) && src.contains("pptm_matmul_bf16x3<false>("),
        "{src}"
    );
    // The device checks its alignment (128 bytes) with the other pointers'.
    assert!(
        src.contains(&format!("d.args[{slot}]) & 127ull) == 0")),
        "{src}"
    );
    s.stages[0].promoted = Some(true);
    let src = domain_source("inference", &[lower(&s).unwrap()]);
    assert!(src.contains("pptm_matmul_bf16x3<true>("), "{src}");
}

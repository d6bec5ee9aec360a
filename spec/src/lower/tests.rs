//! Tests of the lowering: its checks and errors, the layouts and plans it produces, and whole
//! chains lowered, bound and evaluated end to end.

use super::test_support::{chain, layout, ops, stage};
use super::*;
use crate::StageSpec;

/// A letter bound twice in one stage (a square matrix, `Matrix("n", "n")`, would do it) must
/// name the same dimension both times; no catalog op has one yet, so this calls the table
/// directly.
#[test]
fn a_letter_bound_twice_in_a_stage_must_name_one_dimension() {
    let mut t = Tables::default();
    let (d, e) = (t.fresh("n", true), t.fresh("m", false));
    let mut letters = Vec::new();
    assert!(t.bind(&mut letters, "n", d));
    // Binding renames a weak (inferred) dimension after the op's letter.
    assert_eq!(t.dims[d].name, "n");
    assert!(!t.dims[d].weak);
    assert!(t.bind(&mut letters, "n", d), "the same dimension again");
    assert!(!t.bind(&mut letters, "n", e), "another dimension");
    assert_eq!(letters, vec![("n", d)]);
}

/// An argument name read as a matrix by one stage and as a vector by another is refused,
/// even where their leading dimensions agree: `y` is n x dy for SubspaceDistances and would be
/// n for Axpby.
#[test]
fn an_argument_read_with_another_rank_is_refused() {
    let err = ops(&["SubspaceDistances", "RadiusCount", "KsgDigamma", "Axpby"]).unwrap_err();
    assert!(
        err.to_string().contains("`y`") && err.to_string().contains("another shape"),
        "{err}"
    );
}

#[test]
fn variant_opcodes_never_take_a_built_in_opcode() {
    assert_eq!(variant_opcode(0), FIRST_VARIANT_OPCODE);
    assert_eq!(
        variant_opcode(FIRST_VARIANT_OPCODE - 1),
        2 * FIRST_VARIANT_OPCODE - 1
    );
    assert_eq!(variant_opcode(FIRST_VARIANT_OPCODE), FIRST_VARIANT_OPCODE);
    assert_eq!(variant_opcode(u32::MAX), u32::MAX);
}

/// A flow mismatch names what the earlier stage produces: a vector, a matrix, a stack of
/// matrices, a scalar.
#[test]
fn flow_mismatches_name_the_shape_they_got() {
    for (ops_, gives) in [
        (
            &["Gemv", "ChebyshevDistance", "KthSmallest"][..],
            "produces a vector",
        ),
        (&["Matmul", "Gemv"][..], "produces a matrix"),
        (
            &["BatchedMatmul", "Gemv"][..],
            "produces a stack of matrices",
        ),
        (
            &["KlDivergence", "SumReduction", "Gemv"][..],
            "produces a scalar",
        ),
    ] {
        let e = ops(ops_).unwrap_err();
        assert!(matches!(e, SpecError::FlowMismatch { .. }), "{ops_:?}: {e}");
        assert!(e.to_string().ends_with(gives), "{ops_:?}: {e}");
    }
}

/// The descriptor holds DESC_ARGS argument words: a chain that needs exactly that many
/// lowers, one more is refused. (A matmul's three sizes count, inferred or not; AddDigamma's
/// `k` meets the matmul's dimension `k`, which becomes `k_len`.)
#[test]
fn a_chain_may_fill_the_descriptor_but_not_overflow_it() {
    let full = [
        "Matmul",          // a, w, out and the sizes m, k, n
        "AddBias",         // b
        "Axpby",           // y, alpha, beta
        "BeliefUpdate",    // mu, lr
        "PrecisionWeight", // prec
        "KlDivergence",    // p
        "AddDigamma",      // k (u32)
    ];
    let ir = ops(&full).unwrap();
    assert_eq!(ir.args.len(), DESC_ARGS);
    assert!(
        ir.args
            .iter()
            .any(|a| a.name == "k" && a.kind == ArgKind::U32)
    );
    assert!(
        ir.args
            .iter()
            .any(|a| a.name == "k_len" && a.kind == ArgKind::Len)
    );
    let mut over = full.to_vec();
    over.push("PredictionError"); // pred
    let e = ops(&over).unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::TooManyArgs {
                count: 16,
                max: DESC_ARGS
            }
        ),
        "{e}"
    );
}

/// `tolerance = x`: a number strictly between 0 and 1, on a Matmul computing in bf16 or fp16
/// on tensor cores, and nowhere else.
#[test]
fn tolerances_are_checked() {
    let guarded = |op: &str, tensor: bool, precision: Precision, t: f64| {
        let mut s = stage(1, op);
        s.tensor_eligible = Some(tensor);
        s.precision = Some(precision);
        s.tolerance = Some(crate::Tolerance(t));
        lower(&chain(vec![s]))
    };
    for p in [Precision::Bf16, Precision::Fp16] {
        assert!(guarded("Matmul", true, p, 0.5).is_ok());
        assert!(guarded("Matmul", true, p, 1e-9).is_ok());
        for t in [0.0, 1.0, -0.1, 2.0, f64::NAN, f64::INFINITY] {
            let e = guarded("Matmul", true, p, t).unwrap_err();
            assert!(e.to_string().contains("between 0 and 1"), "{t}: {e}");
        }
    }
    let e = guarded("Gemv", true, Precision::Bf16, 0.5).unwrap_err();
    assert!(e.to_string().contains("single Matmul"), "{e}");
    let e = guarded("Matmul", true, Precision::Fp8, 0.5).unwrap_err();
    assert!(e.to_string().contains("16-bit tensor-core stage"), "{e}");
    let e = guarded("Matmul", false, Precision::Fp32, 0.5).unwrap_err();
    assert!(e.to_string().contains("16-bit tensor-core stage"), "{e}");
}

/// Each anchor op runs its own pattern.
#[test]
fn anchors_pick_their_pattern() {
    for (chain, pattern) in [
        (&["KlDivergence", "SumReduction"][..], Pattern::Map),
        (&["Gemv", "Relu"][..], Pattern::Gemv),
        (&["PredictionError", "GemvT"][..], Pattern::GemvT),
        (&["Matmul", "AddBias"][..], Pattern::Matmul),
        (&["BatchedMatmul"][..], Pattern::Matmul),
        (&["ChebyshevDistance", "KthSmallest"][..], Pattern::Pairwise),
    ] {
        assert_eq!(ops(chain).unwrap().plan.pattern, pattern, "{chain:?}");
    }
}

#[test]
fn a_reduction_after_a_pairwise_op_folds_each_row() {
    // Alone: one value per point, stored; the chain has no reduction of its own.
    let rows = ops(&["ChebyshevDistance", "MeanReduction"]).unwrap();
    assert_eq!(rows.plan.pattern, Pattern::Pairwise);
    assert_eq!(rows.plan.anchor, Some(0));
    assert_eq!(rows.plan.reduction, None);
    assert!(rows.folds_rows(1));
    assert!(!rows.folds_rows(0));
    assert_eq!(rows.output, ChainOutput::Vector);
    assert!(
        matches!(&rows.stages[1].shape, Shape::Tensor { dims, channels: 1 } if dims.len() == 1)
    );
    // Then an epilogue and a reduction over the points, which is the chain's.
    let total = ops(&[
        "ChebyshevDistance",
        "MeanReduction",
        "Square",
        "MaxReduction",
    ])
    .unwrap();
    assert_eq!(total.plan.epilogue, 2..3);
    assert_eq!(total.plan.reduction, Some(3));
    assert!(total.folds_rows(1) && !total.folds_rows(3));
    assert_eq!(total.output, ChainOutput::Scalar);
    // It asks for blocks by points, as KthSmallest does, not by pairs.
    let kth = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
    let sizes = |ir: &ChainIr| {
        ir.dims
            .iter()
            .map(|d| if d.name == "n" { 100_000 } else { 3 })
            .collect::<Vec<_>>()
    };
    assert_eq!(rows.blocks_for(&sizes(&rows)), kth.blocks_for(&sizes(&kth)));
    // Three values a pair: a reduction folds one.
    let e = ops(&["SubspaceDistances", "SumReduction"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 value(s) per element"), "{e}");
    // An elementwise op cannot take the pairs.
    let e = ops(&["ChebyshevDistance", "Relu"]).unwrap_err().to_string();
    assert!(e.contains("per-pair values"), "{e}");
    // The f64 evaluator folds each point's row: three points on a line at 0, 1 and 3 have
    // mean distances 2, 1.5 and 2.5 to the others, and their largest is 2.5.
    assert_eq!(
        layout(&rows),
        [
            ("x", ArgKind::Input),
            ("out", ArgKind::Output),
            ("n", ArgKind::Len),
            ("d", ArgKind::Len)
        ]
    );
    let sizes = rows
        .bind(&[
            ArgValue::Buffer(3),
            ArgValue::Buffer(3),
            ArgValue::Inferred,
            ArgValue::Dim(1),
        ])
        .unwrap();
    let x = [0.0f32, 1.0, 3.0];
    let got = rows.eval_f64(
        &[
            EvalArg::Input(&x),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![2.0, 1.5, 2.5]));
    let widest = ops(&["ChebyshevDistance", "MeanReduction", "MaxReduction"]).unwrap();
    let sizes = widest
        .bind(&[ArgValue::Buffer(3), ArgValue::Dim(3), ArgValue::Dim(1)])
        .unwrap();
    let got = widest.eval_f64(&[EvalArg::Input(&x), EvalArg::None, EvalArg::None], &sizes);
    assert_eq!(got, Evaluated::Scalar(2.5));

    // Its values go on as f32: an fp64 row-wise reduction is refused, not quietly narrowed.
    let mut fold = stage(2, "SumReduction");
    fold.precision = Some(Precision::Fp64);
    let e = lower(&chain(vec![stage(1, "ChebyshevDistance"), fold]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("row-wise reduction folds in f64 already"), "{e}");
}

/// `per_row = true`: a reduction folds each row of a matrix (the chain's first input read as
/// rows x cols), then an epilogue, and perhaps the chain's reduction over the rows.
#[test]
fn per_row_folds_each_row_of_a_matrix() {
    let per_row = |number: u32, op: &str| {
        let mut s = stage(number, op);
        s.per_row = Some(true);
        s
    };
    // (obs - pred)^2 summed per row: a `Rows` pass anchored at the reduction.
    let chi2 = lower(&chain(vec![
        stage(1, "PredictionError"),
        stage(2, "Square"),
        per_row(3, "SumReduction"),
    ]))
    .unwrap();
    assert_eq!(chi2.plan.pattern, Pattern::Rows);
    assert_eq!(chi2.plan.anchor, Some(2));
    assert_eq!(chi2.plan.prologue, 0..2);
    assert_eq!(chi2.plan.reduction, None);
    assert!(chi2.folds_rows(2) && !chi2.folds_pair_rows(2));
    assert!(chi2.stages[2].per_row);
    assert_eq!(chi2.output, ChainOutput::Vector);
    assert_eq!(
        layout(&chi2),
        [
            ("obs", ArgKind::Input),
            ("pred", ArgKind::Input),
            ("out", ArgKind::Output),
            ("rows", ArgKind::Len),
            ("cols", ArgKind::Len)
        ]
    );
    // `out` gives the row count; the row length is passed.
    assert_eq!(chi2.dims[0].inferred_from, Some(2));
    assert_eq!(chi2.dims[1].inferred_from, None);
    let sizes = chi2
        .bind(&[
            ArgValue::Buffer(6),
            ArgValue::Buffer(6),
            ArgValue::Buffer(2),
            ArgValue::Inferred,
            ArgValue::Dim(3),
        ])
        .unwrap();
    assert_eq!(sizes, [2, 3]);
    let e = chi2
        .bind(&[
            ArgValue::Buffer(6),
            ArgValue::Buffer(6),
            ArgValue::Buffer(3),
            ArgValue::Inferred,
            ArgValue::Dim(3),
        ])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rows x cols = 3 x 3"), "{e}");
    // The f64 evaluator folds each row in order.
    let (x, mu) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [0.0f32; 6]);
    let got = chi2.eval_f64(
        &[
            EvalArg::Input(&x),
            EvalArg::Input(&mu),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![14.0, 77.0]));
    // A warp a row, 16 rows a block, whatever the row length.
    for (rows, cols) in [
        (100_000usize, 3usize),
        (100_000, 3000),
        (64, 64),
        (1, 1 << 26),
    ] {
        let want = rows.div_ceil(crate::work::ROWS_PER_BLOCK);
        assert_eq!(
            chi2.blocks_for(&[rows, cols]) as usize,
            want,
            "{rows} x {cols}"
        );
    }
    // Rows of zero length finish the identity (a mean's is NaN), and no rows make nothing.
    let means = lower(&chain(vec![per_row(1, "MeanReduction")])).unwrap();
    let sizes = means
        .bind(&[
            ArgValue::Buffer(0),
            ArgValue::Buffer(2),
            ArgValue::Inferred,
            ArgValue::Dim(0),
        ])
        .unwrap();
    let got = means.eval_f64(
        &[
            EvalArg::Input(&[]),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert!(
        matches!(&got, Evaluated::Vector(v) if v.len() == 2 && v.iter().all(|x| x.is_nan())),
        "{got:?}"
    );

    // Then an epilogue and the chain's own reduction over the rows.
    let total = lower(&chain(vec![
        stage(1, "Square"),
        per_row(2, "MaxReduction"),
        stage(3, "Sigmoid"),
        stage(4, "SumReduction"),
    ]))
    .unwrap();
    assert_eq!(total.plan.pattern, Pattern::Rows);
    assert_eq!(total.plan.epilogue, 2..3);
    assert_eq!(total.plan.reduction, Some(3));
    assert!(total.folds_rows(1) && !total.folds_rows(3));
    assert_eq!(total.output, ChainOutput::Scalar);
    // `per_row` is part of the chain's identity.
    let whole = ops(&["Square", "MaxReduction", "Sigmoid", "SumReduction"]);
    assert!(whole.is_err() || whole.unwrap().spec_hash != total.spec_hash);

    // Refused: on an op that is not a reduction, on a vector, after Matmul, in fp64.
    let e = lower(&chain(vec![per_row(1, "Relu")])).unwrap_err();
    assert!(e.to_string().contains("is not a reduction"), "{e}");
    assert_eq!(e.blame(), Blame::StageAttr(0, "per_row"));
    let e = lower(&chain(vec![stage(1, "Gemv"), per_row(2, "SumReduction")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("a matrix, whose rows"), "{e}");
    let e = lower(&chain(vec![stage(1, "Matmul"), per_row(2, "SumReduction")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rows of a Matmul's output is not supported yet"),
        "{e}"
    );
    let mut wide = per_row(1, "SumReduction");
    wide.precision = Some(Precision::Fp64);
    let e = lower(&chain(vec![wide])).unwrap_err().to_string();
    assert!(e.contains("row-wise reduction folds in f64 already"), "{e}");
    // Two row-wise folds: the second's flow is a vector of row values.
    let e = lower(&chain(vec![
        per_row(1, "SumReduction"),
        per_row(2, "SumReduction"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(e.contains("a matrix, whose rows"), "{e}");
    // After a pairwise op every reduction folds rows; `per_row` says so again, harmlessly.
    let pairs = lower(&chain(vec![
        stage(1, "ChebyshevDistance"),
        per_row(2, "SumReduction"),
    ]))
    .unwrap();
    assert_eq!(pairs.plan.pattern, Pattern::Pairwise);
    assert!(!pairs.stages[1].per_row && pairs.folds_pair_rows(1));
}

#[test]
fn kl_complexity_lowers_to_a_fused_reduction() {
    let ir = ops(&["KlDivergence", "SumReduction"]).unwrap();
    assert_eq!(ir.output, ChainOutput::Scalar);
    assert_eq!(
        layout(&ir),
        [
            ("q", ArgKind::Input),
            ("p", ArgKind::Input),
            ("n", ArgKind::Len)
        ]
    );
    assert_eq!(ir.dims[0].inferred_from, Some(0));
    assert_eq!(ir.stages[1].inputs, [Source::Stage(0)]);
    assert!(ir.opcode >= FIRST_VARIANT_OPCODE);
    assert_eq!(ir.describe(), "KlDivergence -> SumReduction");
    assert_eq!(ir.plan.pattern, Pattern::Map);
    assert_eq!(ir.plan.prologue, 0..1);
    assert_eq!(ir.plan.reduction, Some(1));
}

#[test]
fn belief_update_types_and_names_its_dimensions() {
    let ir = ops(&[
        "PredictionError",
        "PrecisionWeight",
        "GemvT",
        "BeliefUpdate",
    ])
    .unwrap();
    assert_eq!(
        layout(&ir),
        [
            ("obs", ArgKind::Input),
            ("pred", ArgKind::Input),
            ("prec", ArgKind::Input),
            ("a", ArgKind::Input),
            ("mu", ArgKind::Input),
            ("lr", ArgKind::F32),
            ("out", ArgKind::Output),
            ("m", ArgKind::Len),
            ("n", ArgKind::Len),
        ]
    );
    // obs is m long (the vector GemvT reduces), a is m x n, mu and out are n long.
    assert_eq!(ir.args[0].shape, [0]);
    assert_eq!(ir.args[3].shape, [0, 1]);
    assert_eq!(ir.args[4].shape, [1]);
    assert_eq!(ir.dims[0].inferred_from, Some(0));
    assert_eq!(ir.dims[1].inferred_from, Some(4));
    assert_eq!(ir.plan.pattern, Pattern::GemvT);
    assert_eq!(ir.plan.prologue, 0..2);
    assert_eq!(ir.plan.epilogue, 3..4);
    let sizes = ir
        .bind(&[
            ArgValue::Buffer(3),
            ArgValue::Buffer(3),
            ArgValue::Buffer(3),
            ArgValue::Buffer(6),
            ArgValue::Buffer(2),
            ArgValue::F32(0.5),
            ArgValue::Buffer(2),
            ArgValue::Inferred,
            ArgValue::Inferred,
        ])
        .unwrap();
    assert_eq!(sizes, [3, 2]);
    let e = ir
        .bind(&[
            ArgValue::Buffer(3),
            ArgValue::Buffer(3),
            ArgValue::Buffer(3),
            ArgValue::Buffer(7),
            ArgValue::Buffer(2),
            ArgValue::F32(0.5),
            ArgValue::Buffer(2),
            ArgValue::Inferred,
            ArgValue::Inferred,
        ])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "argument `a` has 7 elements, but m x n = 3 x 2 makes 6"
    );
    // obs = (1, 2, 3), pred = 0, prec = 1, a = [[1, 0], [0, 1], [1, 1]], mu = (10, 20).
    let a = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let got = ir.eval_f64(
        &[
            EvalArg::Input(&[1.0, 2.0, 3.0]),
            EvalArg::Input(&[0.0; 3]),
            EvalArg::Input(&[1.0; 3]),
            EvalArg::Input(&a),
            EvalArg::Input(&[10.0, 20.0]),
            EvalArg::Value(0.5),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![12.0, 22.5]));
}

#[test]
fn gemv_axpby_sum_of_squares() {
    let ir = ops(&["Gemv", "Axpby", "Square", "SumReduction"]).unwrap();
    assert_eq!(
        layout(&ir),
        [
            ("x", ArgKind::Input),
            ("a", ArgKind::Input),
            ("y", ArgKind::Input),
            ("alpha", ArgKind::F32),
            ("beta", ArgKind::F32),
            ("n", ArgKind::Len),
            ("m", ArgKind::Len),
        ]
    );
    assert_eq!(ir.plan.pattern, Pattern::Gemv);
    assert_eq!(ir.plan.epilogue, 1..3);
    let args = [
        ArgValue::Buffer(2),
        ArgValue::Buffer(2),
        ArgValue::Buffer(1),
        ArgValue::F32(2.0),
        ArgValue::F32(-1.0),
        ArgValue::Inferred,
        ArgValue::Inferred,
    ];
    let sizes = ir.bind(&args).unwrap();
    assert_eq!(sizes, [2, 1]);
    let got = ir.eval_f64(
        &[
            EvalArg::Input(&[1.0, 2.0]),
            EvalArg::Input(&[3.0, 4.0]),
            EvalArg::Input(&[1.0]),
            EvalArg::Value(2.0),
            EvalArg::Value(-1.0),
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    // z = 2 * 11 - 1 = 21.
    assert_eq!(got, Evaluated::Scalar(441.0));
    // Sizes are [n, m]: 16 rows a block below 8192 rows, 64 from there.
    assert_eq!(ir.blocks_for(&[100_000, 4096]), 256);
    assert_eq!(ir.blocks_for(&[100_000, 16_384]), 256);
    assert_eq!(ir.blocks_for(&[7, 1]), 1);
}

#[test]
fn pairwise_chains() {
    let ir = ops(&["ChebyshevDistance", "KthSmallest"]).unwrap();
    assert_eq!(
        layout(&ir),
        [
            ("x", ArgKind::Input),
            ("k", ArgKind::U32),
            ("out", ArgKind::Output),
            ("n", ArgKind::Len),
            ("d", ArgKind::Len),
        ]
    );
    assert_eq!(ir.plan.pattern, Pattern::Pairwise);
    assert_eq!(ir.dims[0].inferred_from, Some(2));
    assert_eq!(ir.dims[1].inferred_from, None);
    // Points 0, 1, 3, 3 on a line (d = 1): a tie at distance 0 counts as a neighbour.
    let x = [0.0f32, 1.0, 3.0, 3.0];
    let args = [
        ArgValue::Buffer(4),
        ArgValue::U32(2),
        ArgValue::Buffer(4),
        ArgValue::Inferred,
        ArgValue::Dim(1),
    ];
    let sizes = ir.bind(&args).unwrap();
    let got = ir.eval_f64(
        &[
            EvalArg::Input(&x),
            EvalArg::Value(2.0),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![3.0, 2.0, 2.0, 2.0]));
    let mut bad = args;
    bad[1] = ArgValue::U32(4);
    assert!(matches!(
        ir.bind(&bad),
        Err(BindError::Op {
            op: "KthSmallest",
            ..
        })
    ));
    bad[1] = ArgValue::U32(0);
    assert!(ir.bind(&bad).is_err());
    bad[1] = ArgValue::U32(2);
    bad[4] = ArgValue::Inferred;
    assert!(matches!(ir.bind(&bad), Err(BindError::Kind { .. })));

    let te = ops(&[
        "SubspaceDistances",
        "RadiusCount",
        "KsgDigamma",
        "MeanReduction",
        "AddDigamma",
    ])
    .unwrap();
    assert_eq!(
        layout(&te),
        [
            ("x", ArgKind::Input),
            ("y", ArgKind::Input),
            ("z", ArgKind::Input),
            ("eps", ArgKind::Input),
            ("k", ArgKind::U32),
            ("n", ArgKind::Len),
            ("dx", ArgKind::Len),
            ("dy", ArgKind::Len),
            ("dz", ArgKind::Len),
        ]
    );
    assert_eq!(te.dims[0].inferred_from, Some(3));
    assert_eq!(te.plan.epilogue, 2..3);
    assert_eq!(te.plan.finish, 4..5);
}

#[test]
fn matmul_bias_activation() {
    let ir = ops(&["Matmul", "AddBias", "Gelu"]).unwrap();
    assert_eq!(
        layout(&ir),
        [
            ("a", ArgKind::Input),
            ("w", ArgKind::Input),
            ("b", ArgKind::Input),
            ("out", ArgKind::Output),
            ("m", ArgKind::Len),
            ("k", ArgKind::Len),
            ("n", ArgKind::Len),
        ]
    );
    assert_eq!(ir.args[3].shape, [0, 2]);
    assert_eq!(ir.dims[2].inferred_from, Some(2));
    let sizes = ir
        .bind(&[
            ArgValue::Buffer(2),
            ArgValue::Buffer(1),
            ArgValue::Buffer(1),
            ArgValue::Buffer(2),
            ArgValue::Dim(2),
            ArgValue::Dim(1),
            ArgValue::Inferred,
        ])
        .unwrap();
    assert_eq!(sizes, [2, 1, 1]);
    // Sizes are [m, k, n]: 8 x 16 direct tiles up to 256 of them, then 32 x 32 tiles below
    // 64 tiles of 64 x 64, 64 x 64 from there.
    assert_eq!(ir.blocks_for(&[64, 256, 256]), 128);
    assert_eq!(ir.blocks_for(&[128, 9, 256]), 256);
    assert_eq!(ir.blocks_for(&[129, 9, 256]), 5 * 8);
    assert_eq!(ir.blocks_for(&[1, 1, 1]), 1);
    assert_eq!(ir.blocks_for(&[512, 7, 448]), 56 * 4);
    assert_eq!(ir.blocks_for(&[512, 7, 512]), 64);
    let relu = ops(&["Matmul", "AddBias", "Relu"]).unwrap();
    let got = relu.eval_f64(
        &[
            EvalArg::Input(&[1.0, -3.0]),
            EvalArg::Input(&[2.0]),
            EvalArg::Input(&[1.0]),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![3.0, 0.0]));
}

#[test]
fn batched_matmul_stacks_products_and_numbers_tiles_across_the_batch() {
    let ir = ops(&["BatchedMatmul", "AddBias", "Relu"]).unwrap();
    assert_eq!(
        layout(&ir),
        [
            ("a", ArgKind::Input),
            ("w", ArgKind::Input),
            ("b", ArgKind::Input),
            ("out", ArgKind::Output),
            ("batch", ArgKind::Len),
            ("m", ArgKind::Len),
            ("k", ArgKind::Len),
            ("n", ArgKind::Len),
        ]
    );
    // The bias is one per column (n), shared by every product.
    assert_eq!(ir.args[2].shape, [3]);
    assert_eq!(ir.dims[3].inferred_from, Some(2));
    // Two 1 x 2 times 2 x 1 products: [1 -1] [2 3]^T = -1 and [2 1] [1 1]^T = 3, plus 1.
    let sizes = [2, 1, 2, 1];
    let got = ir.eval_f64(
        &[
            EvalArg::Input(&[1.0, -1.0, 2.0, 1.0]),
            EvalArg::Input(&[2.0, 3.0, 1.0, 1.0]),
            EvalArg::Input(&[1.0]),
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
            EvalArg::None,
        ],
        &sizes,
    );
    assert_eq!(got, Evaluated::Vector(vec![0.0, 4.0]));
    // Sizes are [batch, m, k, n]: one product's blocks times the batch.
    assert_eq!(ir.blocks_for(&[1, 64, 256, 256]), 128);
    assert_eq!(ir.blocks_for(&[100, 64, 256, 256]), 12800);
    assert_eq!(ir.blocks_for(&[0, 64, 256, 256]), 1);

    let mut spec = chain(vec![
        stage(1, "BatchedMatmul"),
        stage(2, "AddBias"),
        stage(3, "Gelu"),
    ]);
    spec.stages[0].tensor_eligible = Some(true);
    spec.stages[0].precision = Some(Precision::Bf16);
    let tc = lower(&spec).unwrap();
    assert_eq!(tc.args[0].dtype, DType::Bf16);
    assert_eq!(tc.args[1].dtype, DType::Bf16);
    assert_eq!(tc.args[2].dtype, DType::F32);
    // 64 x 64 products take a 64 x 64 tile each however many there are; taller ones take
    // 128 x 64 tiles once the batch has 128 of them.
    assert_eq!(tc.blocks_for(&[100, 64, 64, 64]), 100);
    assert_eq!(tc.blocks_for(&[1000, 64, 64, 64]), 1000);
    assert_eq!(tc.blocks_for(&[100, 256, 64, 64]), 200);
    assert_eq!(tc.blocks_for(&[10, 256, 64, 64]), 10 * 4);
    assert_eq!(tc.blocks_for(&[128, 256, 64, 64]), 256);
    // The guard samples one product: a batched stage refuses it, naming the attribute.
    spec.stages[0].tolerance = Some(crate::Tolerance(1e-2));
    assert!(matches!(
        lower(&spec),
        Err(SpecError::ToleranceUnsupported { .. })
    ));
}

#[test]
fn unfusable_and_mistyped_chains_are_errors() {
    let e = ops(&["Gemv", "GemvT"]).unwrap_err();
    assert!(matches!(e, SpecError::Unfusable { stage: 1, .. }), "{e}");
    assert!(e.to_string().contains("barrier"), "{e}");
    let e = ops(&["KlDivergence", "ChebyshevDistance", "KthSmallest"]).unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::FlowMismatch { .. } | SpecError::Unfusable { .. }
        ),
        "{e}"
    );
    assert!(matches!(
        ops(&["KthSmallest"]).unwrap_err(),
        SpecError::Unfusable { .. }
    ));
    assert!(matches!(
        ops(&["ChebyshevDistance"]).unwrap_err(),
        SpecError::Unfusable { .. }
    ));
    assert!(matches!(
        ops(&["AddBias"]).unwrap_err(),
        SpecError::Unfusable { .. }
    ));
    // Three counts per point cannot be stored.
    let e = ops(&["SubspaceDistances", "RadiusCount"]).unwrap_err();
    assert!(e.to_string().contains("3 values per element"), "{e}");
    // KsgDigamma needs three counts per element.
    assert!(
        matches!(
            ops(&["KsgDigamma"]).unwrap_err(),
            SpecError::FlowMismatch { .. } | SpecError::Unfusable { .. }
        ) || ops(&["KsgDigamma"]).is_ok()
    );
    assert!(matches!(
        ops(&["KsgDigamma"]).unwrap_err(),
        SpecError::Unfusable { .. }
    ));
    let e = ops(&["ChebyshevDistance", "KthSmallest", "KsgDigamma"]).unwrap_err();
    assert!(matches!(e, SpecError::FlowMismatch { .. }), "{e}");
    // A reduction of a reduction, and a buffer after a reduction.
    assert!(matches!(
        ops(&["SumReduction", "SumReduction"]).unwrap_err(),
        SpecError::FlowMismatch { .. }
    ));
    assert!(matches!(
        ops(&["SumReduction", "KlDivergence"]).unwrap_err(),
        SpecError::FlowMismatch { .. }
    ));
    // A by-value name reused as a buffer.
    let e = ops(&[
        "ChebyshevDistance",
        "KthSmallest",
        "AddDigamma",
        "PrecisionWeight",
    ]);
    assert!(e.is_ok(), "{e:?}");
    let e = ops(&["Matmul", "AddBias", "SumReduction"]).unwrap_err();
    assert!(matches!(e, SpecError::Unfusable { .. }));
}

#[test]
fn declaration_order_does_not_matter_and_defaults_hash_like_explicit_values() {
    let a = ops(&["KlDivergence", "SumReduction"]).unwrap();
    let mut s2 = stage(2, "SumReduction");
    s2.reduction = Some(true);
    s2.precision = Some(Precision::Fp32);
    let b = lower(&chain(vec![s2, stage(1, "KlDivergence")])).unwrap();
    assert_eq!(a.spec_hash, b.spec_hash);
    assert_eq!(a.opcode, b.opcode);
}

#[test]
fn hash_changes_with_name_domain_and_stages() {
    let base = ops(&["KlDivergence"]).unwrap();
    let mut renamed = chain(vec![stage(1, "KlDivergence")]);
    renamed.name = "D".into();
    assert_ne!(lower(&renamed).unwrap().spec_hash, base.spec_hash);
    let mut moved = chain(vec![stage(1, "KlDivergence")]);
    moved.domain = "other".into();
    assert_ne!(lower(&moved).unwrap().spec_hash, base.spec_hash);
    let longer = ops(&["KlDivergence", "SumReduction"]).unwrap();
    assert_ne!(longer.spec_hash, base.spec_hash);
}

#[test]
fn vector_chain_gets_an_out_argument() {
    let ir = ops(&["KlDivergence"]).unwrap();
    assert_eq!(ir.output, ChainOutput::Vector);
    assert_eq!(
        ir.args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["q", "p", "out", "n"]
    );
}

#[test]
fn declaration_errors() {
    assert_eq!(lower(&chain(vec![])).unwrap_err(), SpecError::Empty);
    let e = lower(&chain(vec![
        stage(1, "KlDivergence"),
        stage(3, "SumReduction"),
    ]))
    .unwrap_err();
    assert_eq!(
        e,
        SpecError::StageGap {
            stage: 1,
            expected: 2,
            found: 3
        }
    );
    assert_eq!(e.blame(), Blame::StageNumber(1));
    let e = lower(&chain(vec![
        stage(1, "KlDivergence"),
        stage(1, "SumReduction"),
    ]))
    .unwrap_err();
    assert_eq!(
        e,
        SpecError::DuplicateStage {
            stage: 1,
            number: 1
        }
    );
    let e = lower(&chain(vec![stage(2, "KlDivergence")])).unwrap_err();
    assert!(matches!(
        e,
        SpecError::StageGap {
            expected: 1,
            found: 2,
            ..
        }
    ));
    let e = ops(&["KlDivergance"]).unwrap_err();
    assert!(e.to_string().contains("did you mean `KlDivergence`"), "{e}");
    let e = ops(&["SumReduction", "KlDivergence"]).unwrap_err();
    assert_eq!(e.blame(), Blame::StageOp(1));
    let mut s = stage(1, "KlDivergence");
    s.reduction = Some(true);
    assert!(matches!(
        lower(&chain(vec![s])).unwrap_err(),
        SpecError::ReductionMismatch { .. }
    ));
    let mut s = stage(1, "KlDivergence");
    s.precision = Some(Precision::Bf16);
    let e = lower(&chain(vec![s])).unwrap_err();
    assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
    let mut s = stage(1, "KlDivergence");
    s.tensor_eligible = Some(true);
    assert!(matches!(
        lower(&chain(vec![s])).unwrap_err(),
        SpecError::TensorUnsupported { .. }
    ));
    let mut bad = chain(vec![stage(1, "KlDivergence")]);
    bad.domain = "Bad Domain".into();
    assert!(matches!(lower(&bad).unwrap_err(), SpecError::BadDomain(_)));
}

#[test]
fn tensor_core_precisions() {
    let mm = |precision: Option<Precision>, tensor: Option<bool>| {
        let mut s = stage(1, "Matmul");
        s.precision = precision;
        s.tensor_eligible = tensor;
        lower(&chain(vec![s, stage(2, "AddBias"), stage(3, "Gelu")]))
    };
    // bf16 and fp16 operands are stored in that type; the bias and the output stay f32.
    for (p, dtype) in [
        (Precision::Bf16, DType::Bf16),
        (Precision::Fp16, DType::F16),
    ] {
        let ir = mm(Some(p), Some(true)).unwrap();
        let types: Vec<(&str, DType)> = ir
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
            .map(|a| (a.name.as_str(), a.dtype))
            .collect();
        assert_eq!(
            types,
            [
                ("a", dtype),
                ("w", dtype),
                ("b", DType::F32),
                ("out", DType::F32)
            ]
        );
        assert!(ir.stages[0].tensor);
        // The attributes are part of the chain's identity.
        assert_ne!(ir.spec_hash, mm(None, None).unwrap().spec_hash);
    }
    assert_ne!(
        mm(Some(Precision::Bf16), Some(true)).unwrap().spec_hash,
        mm(Some(Precision::Fp16), Some(true)).unwrap().spec_hash
    );
    // A 16-bit precision only exists on tensor cores: the error names the fix.
    let e = mm(Some(Precision::Bf16), None).unwrap_err();
    assert!(matches!(e, SpecError::TensorRequired { .. }), "{e}");
    assert!(e.to_string().contains("tensor_eligible = true"), "{e}");
    assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
    // Tensor cores take no f32 (tf32 would miss the 1e-4 bar) and no fp64.
    for p in [None, Some(Precision::Fp32), Some(Precision::Fp64)] {
        let e = mm(p, Some(true)).unwrap_err();
        assert!(e.to_string().contains("on tensor cores"), "{p:?}: {e}");
    }
    // Large outputs take 128 x 64 tiles, smaller ones 64 x 64 (sizes are [m, k, n]).
    let ir = mm(Some(Precision::Bf16), Some(true)).unwrap();
    let order: Vec<&str> = ir.dims.iter().map(|d| d.name.as_str()).collect();
    let sizes = |m: usize, k: usize, n: usize| -> Vec<usize> {
        order
            .iter()
            .map(|d| match *d {
                "m" => m,
                "k" => k,
                "n" => n,
                other => panic!("dimension {other}"),
            })
            .collect()
    };
    assert_eq!(ir.blocks_for(&sizes(8192, 8192, 8192)), 64 * 128);
    assert_eq!(ir.blocks_for(&sizes(1024, 1024, 1024)), 8 * 16);
    assert_eq!(ir.blocks_for(&sizes(1000, 1024, 960)), 16 * 15);
    assert_eq!(ir.blocks_for(&sizes(64, 256, 256)), 4);
    assert_eq!(ir.blocks_for(&sizes(1, 1, 1)), 1);
}

#[test]
fn tensor_core_gemv_stores_a_in_its_precision_and_keeps_the_vector_f32() {
    let gemv = |precision: Precision, tolerance: Option<f64>| {
        let mut s = stage(1, "Gemv");
        s.precision = Some(precision);
        s.tensor_eligible = Some(true);
        s.tolerance = tolerance.map(crate::Tolerance);
        lower(&chain(vec![s]))
    };
    for (p, dtype) in [
        (Precision::Bf16, DType::Bf16),
        (Precision::Fp8, DType::F8E4M3),
    ] {
        let ir = gemv(p, None).unwrap();
        let types: Vec<(&str, DType)> = ir
            .args
            .iter()
            .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
            .map(|a| (a.name.as_str(), a.dtype))
            .collect();
        assert_eq!(
            types,
            [("x", DType::F32), ("a", dtype), ("out", DType::F32)]
        );
        assert!(ir.stages[0].tensor);
        // One block per 16 rows, whatever n (sizes in the chain's dimension order).
        let sizes: Vec<usize> = ir
            .dims
            .iter()
            .map(|d| if d.name == "m" { 1000 } else { 4096 })
            .collect();
        assert_eq!(ir.blocks_for(&sizes), 63);
    }
    // fp16 would have to carry the f32 vector in fp16's range: not offered.
    let e = gemv(Precision::Fp16, None).unwrap_err();
    assert!(e.to_string().contains("on tensor cores"), "{e}");
    // The accuracy guard samples matrix products only.
    assert!(matches!(
        gemv(Precision::Bf16, Some(1e-2)),
        Err(SpecError::ToleranceUnsupported { .. })
    ));
}

#[test]
fn cuda_core_gemvs_store_a_narrow_and_keep_the_rest_f32() {
    for op in ["Gemv", "GemvT"] {
        for (p, dtype) in [
            (None, DType::F32),
            (Some(Precision::Fp32), DType::F32),
            (Some(Precision::Bf16), DType::Bf16),
            (Some(Precision::Fp16), DType::F16),
            (Some(Precision::Fp8), DType::F8E4M3),
        ] {
            let mut s = stage(1, op);
            s.precision = p;
            let ir = lower(&chain(vec![s, stage(2, "Square")])).unwrap();
            let types: Vec<(&str, DType)> = ir
                .args
                .iter()
                .filter(|a| matches!(a.kind, ArgKind::Input | ArgKind::Output))
                .map(|a| (a.name.as_str(), a.dtype))
                .collect();
            assert_eq!(
                types,
                [("x", DType::F32), ("a", dtype), ("out", DType::F32)],
                "{op} {p:?}"
            );
            assert!(!ir.stages[0].tensor);
            // The blocks asked for do not depend on A's storage (sizes in dimension order).
            let sizes: Vec<usize> = ir
                .dims
                .iter()
                .map(|d| if d.name == "m" { 1000 } else { 4096 })
                .collect();
            let want = if op == "Gemv" { 63 } else { 128 };
            assert_eq!(ir.blocks_for(&sizes), want, "{op} {p:?}");
        }
        // The patterns accumulate in f32: fp64 is refused at the attribute.
        let mut s = stage(1, op);
        s.precision = Some(Precision::Fp64);
        let e = lower(&chain(vec![s])).unwrap_err();
        assert!(matches!(e, SpecError::PrecisionUnsupported { .. }), "{e}");
        assert_eq!(e.blame(), Blame::StageAttr(0, "precision"));
    }
    // GemvT has no tensor-core form.
    let mut s = stage(1, "GemvT");
    s.tensor_eligible = Some(true);
    s.precision = Some(Precision::Bf16);
    assert!(matches!(
        lower(&chain(vec![s])).unwrap_err(),
        SpecError::TensorUnsupported { .. }
    ));
}

#[test]
fn finite_is_accepted_where_values_are_computed_and_refused_inside_patterns() {
    let with_finite = |ops: &[&str], at: usize| {
        let mut stages: Vec<StageSpec> = ops
            .iter()
            .enumerate()
            .map(|(i, n)| stage(i as u32 + 1, n))
            .collect();
        stages[at].finite = Some(true);
        lower(&chain(stages))
    };
    let kl = with_finite(&["KlDivergence", "SumReduction"], 1).unwrap();
    assert!(kl.stages[1].finite && !kl.stages[0].finite);
    // `finite` is part of the chain's identity: a checked chain is a different variant.
    assert_ne!(
        kl.opcode,
        ops(&["KlDivergence", "SumReduction"]).unwrap().opcode
    );
    assert!(
        with_finite(
            &[
                "PredictionError",
                "PrecisionWeight",
                "GemvT",
                "BeliefUpdate"
            ],
            3
        )
        .is_ok()
    );
    let err = with_finite(
        &[
            "PredictionError",
            "PrecisionWeight",
            "GemvT",
            "BeliefUpdate",
        ],
        2,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SpecError::FiniteUnsupported {
                stage: 2,
                op: "GemvT"
            }
        ),
        "{err}"
    );
    assert_eq!(err.blame(), Blame::StageAttr(2, "finite"));
    assert!(
        err.to_string().contains("elementwise stage after it"),
        "{err}"
    );
}

/// An elementwise op reading a table, as `#[pptm::op]` declares one (`t: pptm::Table`).
static TABLE_LOOKUP: OpDef = OpDef {
    name: "TableLookup",
    class: FusionClass::Elementwise,
    inputs: &[
        crate::ops::param("x", crate::ops::Ty::Vector("n")),
        crate::ops::param("t", crate::ops::Ty::Table("t_rows", "t_cols")),
    ],
    output: crate::ops::Ty::Vector("n"),
    flow_channels: None,
    out_channels: None,
    states: crate::ops::StateTypes::NONE,
    precisions: &[Precision::Fp32],
    tensor_precisions: &[],
    lanes: 1,
    header: "",
    cuda: "",
    device: "pptm_user_table_lookup",
    cpu: crate::ops::CpuImpl::PerElement(|x, t, out| out[0] = x[0] + t[0].at(0, 0)),
    check: None,
    doc: "",
};

#[test]
fn a_table_side_of_2_pow_32_is_refused_at_binding() {
    let ir = lower_with(&chain(vec![stage(1, "TableLookup")]), &[&TABLE_LOOKUP]).unwrap();
    let names: Vec<&str> = ir.args.iter().map(|a| a.name.as_str()).collect();
    let args = |rows: usize, cols: usize| -> Vec<ArgValue> {
        names
            .iter()
            .map(|&n| match n {
                "x" => ArgValue::Buffer(3),
                "t" => ArgValue::Buffer(rows * cols),
                "out" => ArgValue::Buffer(3),
                "t_rows" => ArgValue::Dim(rows),
                "t_cols" => ArgValue::Dim(cols),
                _ => ArgValue::Inferred,
            })
            .collect()
    };
    let big = u32::MAX as usize + 1;
    assert!(ir.bind(&args(u32::MAX as usize, 1)).is_ok());
    for (rows, cols) in [(big, 1), (1, big), (big, 2)] {
        match ir.bind(&args(rows, cols)) {
            Err(BindError::TableTooLarge {
                arg,
                rows: r,
                cols: c,
            }) => {
                assert_eq!((arg.as_str(), r, c), ("t", rows, cols))
            }
            other => panic!("{rows} x {cols}: {other:?}"),
        }
    }
}

#[test]
fn promoted_accumulation_is_for_tensor_core_products() {
    let with = |op: &str, tensor: Option<bool>, tolerance: Option<f64>, promoted: bool| {
        let mut st = stage(1, op);
        st.tensor_eligible = tensor;
        st.precision = (tensor == Some(true)).then_some(crate::Precision::Bf16);
        st.tolerance = tolerance.map(crate::Tolerance);
        st.promoted = Some(promoted);
        lower(&chain(vec![st]))
    };
    let ir = with("Matmul", Some(true), None, true).unwrap();
    assert!(ir.stages[0].promoted);
    assert!(!with("Matmul", Some(true), None, false).unwrap().stages[0].promoted);
    for (op, tensor, tolerance) in [
        ("Matmul", None, None),
        ("Matmul", Some(false), None),
        ("Matmul", Some(true), Some(1e-2)),
        ("Gemv", Some(true), None),
        ("BatchedMatmul", Some(true), None),
    ] {
        let e = with(op, tensor, tolerance, true).unwrap_err();
        assert!(
            e.to_string().contains("accumulate = \"promoted\""),
            "{op} {tensor:?} {tolerance:?}: {e}"
        );
    }
}

#[test]
fn bf16x3_is_a_tensor_core_matmul_with_working_memory() {
    let with = |op: &str, tensor: Option<bool>, tolerance: Option<f64>| {
        let mut st = stage(1, op);
        st.tensor_eligible = tensor;
        st.precision = Some(crate::Precision::Bf16x3);
        st.tolerance = tolerance.map(crate::Tolerance);
        lower(&chain(vec![st]))
    };
    let ir = with("Matmul", Some(true), None).unwrap();
    // f32 operands, and a slot the runtime fills with its working memory: not a parameter.
    assert!(
        ir.args
            .iter()
            .filter(|a| a.kind == ArgKind::Input)
            .all(|a| a.dtype == DType::F32)
    );
    let slot = ir.args.iter().position(|a| a.kind == ArgKind::Scratch);
    assert!(slot.is_some(), "{:?}", ir.args);
    // m = 3, k = 65, n = 9: k padded to 128, n to 16; A's halves 3 x 256 bf16 (1536 bytes, a
    // multiple of 128), W's 256 x 16 bf16.
    let st = &ir.stages[0];
    let mut sizes = vec![0; ir.dims.len()];
    for (l, v) in [("m", 3), ("k", 65), ("n", 9)] {
        sizes[st.dim(l).unwrap()] = v;
    }
    assert_eq!(
        ir.scratch(&sizes),
        Some((slot.unwrap(), 1536 + 256 * 16 * 2))
    );
    // Not on CUDA cores (a tensor-core precision), not on other ops, not guarded.
    let e = with("Matmul", None, None).unwrap_err().to_string();
    assert!(e.contains("bf16x3") && e.contains("tensor"), "{e}");
    let e = with("Gemv", Some(true), None).unwrap_err().to_string();
    assert!(e.contains("bf16x3"), "{e}");
    let e = with("BatchedMatmul", Some(true), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bf16x3"), "{e}");
    let e = with("Matmul", Some(true), Some(1e-2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tolerance") || e.contains("guards"), "{e}");
    // A chain without such a stage lends nothing.
    let mut plain = stage(1, "Matmul");
    plain.tensor_eligible = Some(true);
    plain.precision = Some(crate::Precision::Bf16);
    let ir = lower(&chain(vec![plain])).unwrap();
    assert!(ir.args.iter().all(|a| a.kind != ArgKind::Scratch));
    assert_eq!(ir.scratch(&vec![4; ir.dims.len()]), None);
}

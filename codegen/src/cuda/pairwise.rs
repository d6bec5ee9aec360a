//! The pairwise emitter: the distance of each pair and the row stage that folds a point's pairs,
//! for the pattern in kernels/pptm/pattern/pairwise.cuh; and the row epilogue it shares with the
//! row-wise reductions of a matrix.

use std::fmt::Write;

use super::*;

/// The functors of a pairwise chain; returns the run function's lines.
pub(super) fn pairwise(out: &mut String, c: &ChainIr) -> String {
    let t = tag(c);
    let plan = &c.plan;
    let store = store(c);
    let r = reducer(c);
    let mut call = String::new();
    let a = plan.anchor.expect("anchored");
    let (pst, rst) = (&c.stages[a], &c.stages[a + 1]);
    let (_, row) = row_ctor(c, rst);
    row_epilogue(out, c, a + 1);
    let n = dim_field(c, pst, "n");
    let _ = writeln!(
        call,
        "    partial = pptm_pairwise_rows<{r}>({n}, {}, {row}, pptm_epi_{t}{{e}}, {store}, b);",
        distance_ctor(c, pst)
    );
    call
}

/// The constructor of a pairwise stage's distance type: its buffers in op order, then each
/// matrix's column count (`pptm_op_chebyshev{x, d}`).
pub(super) fn distance_ctor(c: &ChainIr, st: &StageIr) -> String {
    let mut dist = Vec::new();
    let mut cols = Vec::new();
    for (p, src) in st.op.inputs.iter().zip(&st.inputs) {
        if let (Source::Arg(slot), Ty::Matrix(_, col)) = (src, p.ty) {
            dist.push(field(*slot));
            cols.push(format!("(uint32_t){}", dim_field(c, st, col)));
        }
    }
    dist.extend(cols);
    format!("{}{{{}}}", st.op.device, dist.join(", "))
}

/// Values per pair of the pairwise stage a row reduction `st` reads, and the constructor of the
/// row type (its other inputs in op order; channel-generic rows take the channel count).
pub(super) fn row_ctor(c: &ChainIr, st: &StageIr) -> (u8, String) {
    let Source::Stage(p) = st.inputs[0] else {
        unreachable!("a row reduction reads a pairwise stage")
    };
    let Shape::Pairs { channels: pch, .. } = c.stages[p].shape else {
        unreachable!("a row reduction reads a pairwise stage")
    };
    // A reduction folds each point's row with its reducer (pptm_row_fold, pattern/pairwise.cuh).
    let ty = if st.op.class == FusionClass::Reduction {
        format!("pptm_row_fold<{}>", st.op.device)
    } else if st.op.flow_channels.is_none() {
        format!("{}<{pch}>", st.op.device)
    } else {
        st.op.device.to_string()
    };
    let args: Vec<String> = st.inputs[1..]
        .iter()
        .filter_map(|s| match s {
            Source::Arg(slot) => Some(field(*slot)),
            Source::Stage(_) => None,
        })
        .collect();
    (pch, format!("{ty}{{{}}}", args.join(", ")))
}

/// The epilogue functor of a row-wise pass (`pptm_epi_<tag>`): from the values the row stage `s`
/// made for row (point) i, the chain's value for it. A row-wise reduction declared `finite` is
/// checked here, on the value as it is stored (f32).
pub(super) fn row_epilogue(out: &mut String, c: &ChainIr, s: usize) {
    let t = tag(c);
    let och = c.stages[s].shape.channels();
    let _ = writeln!(out, "struct pptm_epi_{t} {{");
    let _ = writeln!(out, "    pptm_env_{t} e;");
    let _ = writeln!(
        out,
        "    __device__ __forceinline__ {} operator()(uint64_t i, const float (&v)[{och}]) const {{",
        range_type(c, &c.plan.epilogue)
    );
    if c.stages[s].finite {
        let _ = writeln!(out, "        pptm_check_finite(v[0]);");
    }
    let flow: Vec<String> = (0..och).map(|k| format!("v[{k}]")).collect();
    let v = emit_stages(
        out,
        c,
        c.plan.epilogue.clone(),
        flow,
        &Load::At {
            index: "i",
            column: "i",
            lanes: 1,
        },
    );
    let _ = writeln!(out, "        return {};", v[0]);
    let _ = writeln!(out, "    }}\n}};");
}

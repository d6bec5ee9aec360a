//! Helpers the lowering's tests share: a stage, a chain of stages, a chain lowered from op names,
//! and a chain's argument layout.

use super::{ArgKind, ChainIr, SpecError, lower};
use crate::{ChainSpec, StageSpec};

pub(super) fn stage(number: u32, op: &str) -> StageSpec {
    StageSpec {
        field: format!("s{number}"),
        number,
        op: op.into(),
        ..Default::default()
    }
}

pub(super) fn chain(stages: Vec<StageSpec>) -> ChainSpec {
    ChainSpec {
        name: "C".into(),
        domain: "inference".into(),
        stages,
    }
}

pub(super) fn ops(names: &[&str]) -> Result<ChainIr, SpecError> {
    lower(&chain(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| stage(i as u32 + 1, n))
            .collect(),
    ))
}

pub(super) fn layout(ir: &ChainIr) -> Vec<(&str, ArgKind)> {
    ir.args.iter().map(|a| (a.name.as_str(), a.kind)).collect()
}

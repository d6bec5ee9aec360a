//! The device-side sources under `kernels/`, embedded so that codegen (and the input hash) always
//! sees exactly the files this crate was built with, and the header of the built-in ops written
//! in the `#[pptm::op]` subset, translated from their Rust functions (pptm-spec's `ops::subset`).

use std::sync::LazyLock;

/// (include name, text) of every header the generated code may include: the hand-written ones
/// and the subset ops'.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    static ALL: LazyLock<Vec<(&'static str, &'static str)>> = LazyLock::new(|| {
        let mut all = HAND_WRITTEN.to_vec();
        let subset: &'static str = Box::leak(pptm_spec::ops::subset::device_header().into());
        all.push((pptm_spec::ops::subset::HEADER, subset));
        all
    });
    &ALL
}

/// (include name, text) of the headers under `kernels/`.
const HAND_WRITTEN: &[(&str, &str)] = &[
    ("pptm/abi.h", include_str!("../../kernels/pptm/abi.h")),
    (
        "pptm/device.cuh",
        include_str!("../../kernels/pptm/device.cuh"),
    ),
    ("pptm/fuse.cuh", include_str!("../../kernels/pptm/fuse.cuh")),
    (
        "pptm/manifold.cuh",
        include_str!("../../kernels/pptm/manifold.cuh"),
    ),
    (
        "pptm/pattern/linear.cuh",
        include_str!("../../kernels/pptm/pattern/linear.cuh"),
    ),
    (
        "pptm/pattern/mma.cuh",
        include_str!("../../kernels/pptm/pattern/mma.cuh"),
    ),
    (
        "pptm/pattern/wgmma.cuh",
        include_str!("../../kernels/pptm/pattern/wgmma.cuh"),
    ),
    (
        "pptm/pattern/pairwise.cuh",
        include_str!("../../kernels/pptm/pattern/pairwise.cuh"),
    ),
    (
        "pptm/ops/linalg.cuh",
        include_str!("../../kernels/pptm/ops/linalg.cuh"),
    ),
    (
        "pptm/ops/neighbours.cuh",
        include_str!("../../kernels/pptm/ops/neighbours.cuh"),
    ),
    (
        "pptm/ops/divergence.cuh",
        include_str!("../../kernels/pptm/ops/divergence.cuh"),
    ),
];

/// The text of one embedded header.
pub fn header(name: &str) -> Option<&'static str> {
    headers().iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_header_is_embedded() {
        for op in pptm_spec::ops::CATALOG {
            assert!(
                header(op.header).is_some_and(|t| t.contains(op.device)),
                "{} / {}",
                op.header,
                op.device
            );
        }
    }

    #[test]
    fn every_file_under_kernels_is_embedded() {
        // Relative to the package folder, where cargo test (and .device/run-tests) run tests.
        let root = std::path::PathBuf::from("../kernels");
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let name = path
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/");
                    let text = std::fs::read_to_string(&path).unwrap();
                    assert_eq!(
                        header(&name),
                        Some(text.as_str()),
                        "kernels/{name} is not in HAND_WRITTEN"
                    );
                }
            }
        }
    }
}

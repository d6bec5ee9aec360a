//! The CUDA C that codegen emits for every chain of pptm's (src/ into generated/; examples/,
//! tests/ into generated-dev/) is exactly the committed <folder>/<domain>/<domain>.cu, and every
//! domain's input hash matches its manifest. Without NVRTC: the committed sources were compiled and run on a GPU, so any change to
//! the fusion rules that alters what a shipped chain compiles to fails here, on every machine,
//! until `cargo xtask codegen` regenerates generated/ (which a GPU run then has to confirm).

use std::path::Path;

use pptm_codegen::project::plan_trees;

#[test]
fn every_shipped_domain_emits_its_committed_source() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let trees = plan_trees(&root).expect("the workspace's chains scan and lower");
    let names = |i: usize| {
        trees[i]
            .1
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
    };
    for domain in ["inference", "linear_algebra", "tensor", "batched", "narrow"] {
        assert!(
            names(0).contains(&domain),
            "library domains: {:?}",
            names(0)
        );
    }
    assert!(
        names(1).contains(&"checked"),
        "test domains: {:?}",
        names(1)
    );
    for (project, plan) in &trees {
        check_tree(project, plan);
    }
}

fn check_tree(
    project: &pptm_codegen::project::Project,
    plan: &[pptm_codegen::project::DomainPlan],
) {
    let folder = project.folder();
    for d in plan {
        let path = project
            .generated
            .join(&d.name)
            .join(format!("{}.cu", d.name));
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if committed != d.source {
            let (line, (want, got)) = committed
                .lines()
                .zip(d.source.lines())
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .map(|(i, p)| (i + 1, p))
                .unwrap_or((
                    committed.lines().count().min(d.source.lines().count()) + 1,
                    ("<end>", "<end>"),
                ));
            panic!(
                "domain `{}`: codegen no longer emits {folder}/{0}/{0}.cu (first difference at \
                 line {line}:\n  committed: {want}\n  emitted:   {got})\nrun `cargo xtask codegen`",
                d.name
            );
        }
    }
    let stale = project.verify(plan);
    assert!(
        stale.is_empty(),
        "{folder}/ is stale: {stale:?}; run `cargo xtask codegen`"
    );
}

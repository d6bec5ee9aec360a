//! The CUDA C that codegen emits for every chain pptm ships (src/, examples/, tests/) is exactly
//! the committed generated/<domain>/<domain>.cu, and every domain's input hash matches its
//! manifest. Without NVRTC: the committed sources were compiled and run on a GPU, so any change to
//! the fusion rules that alters what a shipped chain compiles to fails here, on every machine,
//! until `cargo xtask codegen` regenerates generated/ (which a GPU run then has to confirm).

use std::path::Path;

use pptm_codegen::project::Project;

#[test]
fn every_shipped_domain_emits_its_committed_source() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let project = Project::at(&root);
    let plan = project
        .plan()
        .expect("the workspace's chains scan and lower");
    assert!(
        plan.len() >= 10,
        "expected pptm's shipped domains, found {:?}",
        plan.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    for d in &plan {
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
                "domain `{}`: codegen no longer emits generated/{0}/{0}.cu (first difference at \
                 line {line}:\n  committed: {want}\n  emitted:   {got})\nrun `cargo xtask codegen`",
                d.name
            );
        }
    }
    let stale = project.verify(&plan);
    assert!(
        stale.is_empty(),
        "generated/ is stale: {stale:?}; run `cargo xtask codegen`"
    );
}

//! Keeps generated/ (the PTX of every chain declared in src/, examples/ and tests/) in step with
//! the chains and kernels/. See pptm_codegen::build_script for what happens when it is stale.
fn main() {
    pptm_codegen::build_script();
}

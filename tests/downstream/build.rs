// Keeps generated/ (this crate's chains) and generated-dev/ (its tests') in step with the sources.
fn main() {
    pptm_codegen::build_script();
}

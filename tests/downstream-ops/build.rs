// Publishes this crate's src/ folder, so that the crates that depend on it can name its ops in
// their chains (and keeps generated code in step, were it to declare chains of its own).
fn main() {
    pptm_codegen::build_script();
}

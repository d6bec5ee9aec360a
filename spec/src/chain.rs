//! What a user declares: a named chain of numbered stages in a domain.

use std::fmt;
use std::str::FromStr;

/// Arithmetic precision of a stage (`precision = "..."` in `#[stage]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f64 arithmetic on f32 inputs, which are widened exactly.
    Fp64,
    /// f32 arithmetic: the default when a stage names no precision.
    Fp32,
    /// Matrix operands stored as bfloat16 (see [`crate::DType::matrix_storage`]).
    Bf16,
    /// Matrix operands stored as IEEE binary16.
    Fp16,
    /// Matrix operands stored as fp8 E4M3.
    Fp8,
    /// f32 matrix operands multiplied on bf16 tensor cores at about f32's accuracy: each operand
    /// is split into a high and a low bf16 part (x = hi + lo to about 2^-17 of x) and the product
    /// sums three bf16 products, hi·hi + lo·hi + hi·lo (a `Matmul` with `tensor_eligible = true`).
    Bf16x3,
}

impl Precision {
    /// Every precision, widest first (the order the error message lists them in).
    pub const ALL: [Precision; 6] = [
        Precision::Fp64,
        Precision::Fp32,
        Precision::Bf16x3,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
    ];

    /// The name written in `precision = "..."` (and shown by `Display`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp64 => "fp64",
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Bf16x3 => "bf16x3",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Precision::ALL.iter().map(|p| format!("\"{p}\"")).collect();
                format!(
                    "unknown precision \"{s}\"; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// `tolerance = x` of a stage: the error its low-precision result may have, relative to the
/// magnitude of the terms it sums, before the accuracy guard runs it in the next precision up.
/// (A newtype so specs stay `Eq`: tolerances compare by their bits.)
#[derive(Debug, Clone, Copy)]
pub struct Tolerance(pub f64);

impl PartialEq for Tolerance {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Tolerance {}

/// One `#[stage(n, ...)]` field, as written (defaults not yet applied). `Default` is a stage with
/// nothing written but what a test sets (`StageSpec { number: 1, op: "Square".into(),
/// ..Default::default() }`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StageSpec {
    /// The field name (documentation only).
    pub field: String,
    /// The `n` of `#[stage(n)]`: the stage's position in the data flow, from 1.
    pub number: u32,
    /// The op's DSL name (last segment of the field's type).
    pub op: String,
    /// `reduction = ...`, if written.
    pub reduction: Option<bool>,
    /// `tensor_eligible = ...`, if written.
    pub tensor_eligible: Option<bool>,
    /// `precision = "..."`, if written.
    pub precision: Option<Precision>,
    /// `tolerance = x`, if written: the stage is guarded (see [`Tolerance`]).
    pub tolerance: Option<Tolerance>,
    /// `finite = ...`, if written: with `true`, a NaN or infinity among the stage's values fails
    /// the item with a non-finite status (its outputs are still written).
    pub finite: Option<bool>,
    /// `per_row = ...`, if written: with `true`, a reduction folds each row of its flow (the last
    /// dimension of a matrix) into one value per row instead of folding everything into one.
    /// A chain with such a stage reads its first input as a `rows x cols` row-major matrix.
    pub per_row: Option<bool>,
    /// `args(param = "name", ...)`: the chain argument each named parameter of the op binds to,
    /// where it is not the parameter's own name. Stages share an argument by name, so this is
    /// how one chain takes two matrices (`#[stage(3, args(a = "w2"))] second: Gemv`).
    pub args: Vec<(String, String)>,
    /// `repeat = k`, if written: the stage runs k times over, each time on what the time before
    /// produced, all in the one fused pass (an elementwise op only: its output is its flow's
    /// shape). `repeat = 170` is 170 dependent steps with no memory round trip between them.
    pub repeat: Option<u32>,
    /// `tables = "fp16"`, if written: the stage's tables (`pptm::Table` parameters of its op) are
    /// stored in f16, half the bytes, and widened as they are read; f32 (`"fp32"`) otherwise.
    pub tables: Option<crate::DType>,
    /// `accumulate = "promoted"` (`Some(true)`) or `"tensor"` (`Some(false)`), if written: on a
    /// tensor-core product, whether each 512 of k's partial sums are added into f32 sums with
    /// round-to-nearest rather than kept in the tensor cores' accumulators throughout, whose
    /// additions on Hopper truncate (see docs/dsl.md, "Accumulation").
    pub promoted: Option<bool>,
}

/// A chain as declared with `#[derive(FusionBuilder)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// The struct's name.
    pub name: String,
    /// `#[fusion(domain = "...")]`: which manifold hosts the chain.
    pub domain: String,
    /// Stages in declaration order.
    pub stages: Vec<StageSpec>,
}

/// The most times `repeat = k` may run a stage (each is a step of the fused body that codegen
/// writes out, so the bound keeps generated code to a size NVRTC compiles in seconds).
pub const MAX_REPEAT: u32 = 4096;

/// Whether `s` is a valid domain name: it names a folder under generated/ and a manifold.
pub fn valid_domain_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        }
        let err = "fp31".parse::<Precision>().unwrap_err();
        assert!(err.contains("\"fp32\""), "{err}");
    }

    #[test]
    fn domain_names() {
        assert!(valid_domain_name("inference"));
        assert!(valid_domain_name("transfer_entropy2"));
        assert!(!valid_domain_name(""));
        assert!(!valid_domain_name("Inference"));
        assert!(!valid_domain_name("a/b"));
        assert!(!valid_domain_name("1x"));
        assert!(valid_domain_name(&"a".repeat(64)));
        assert!(!valid_domain_name(&"a".repeat(65)));
        assert!(!valid_domain_name("a-b"));
    }

    #[test]
    fn tolerances_compare_by_their_bits() {
        assert_eq!(Tolerance(0.1), Tolerance(0.1));
        assert_ne!(Tolerance(0.1), Tolerance(0.2));
        // By bits, not by value: NaN equals itself (specs stay Eq), 0 and -0 differ.
        assert_eq!(Tolerance(f64::NAN), Tolerance(f64::NAN));
        assert_ne!(Tolerance(0.0), Tolerance(-0.0));
    }

    #[test]
    fn precisions_display_as_their_names() {
        let shown: Vec<String> = Precision::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown, ["fp64", "fp32", "bf16x3", "bf16", "fp16", "fp8"]);
    }
}

//! The Rust subset an elementwise op of the user's own is written in (issue 32, `#[pptm::op]`):
//! [`parse_op_fn`] checks a function against it, with every error at the offending tokens, and
//! translates it to a CUDA C device function. The same Rust function, unchanged, is the op's CPU
//! reference, so the subset is chosen to mean the same thing on both sides:
//!
//! * parameters are plain names of type `f32`, `f64` or `u32`; the result is `f32` or `f64`;
//! * the body is statements and a final expression. Statements: `let` (each with a value; `let
//!   mut` for a name that changes), assignments (`=`, `+=`, `-=`, `*=`, `/=`) to a `let mut` name
//!   or to a field of a state bound so, `for j in a..b { ... }` over a `u32` range (the bound
//!   evaluated once), `if` whose branches are statements, and local arrays (`let mut a =
//!   [0.0_f64; 9];`, `[v0, v1, ...]`; f32, f64 or u32, 1 to [`MAX_ARRAY_LEN`] elements) read and
//!   written as `a[k]` with a u32 index, which the device clamps to the array (the CPU backend,
//!   running the function itself, panics past the end as Rust does). A block that gives a value (an
//!   `if`'s branch, a `{ ... }` expression) only binds with `let`: the translation evaluates it
//!   inside an expression, where C++ leaves the order of side effects open;
//! * expressions: names, literals, `+ - * / %`, comparisons, `&& || !`, unary `-`, parentheses,
//!   `if`/`else` (both branches), `as` between `f32`, `f64` and `u32`, the constants of
//!   `f32::consts`/`f64::consts` (also through `std::` or `core::`), and the math methods in
//!   [`METHODS`] (`x.exp()`, or `f32::exp(x)`);
//! * a float literal bound by `let` needs a suffix or a type (`let c = 0.5_f32;`): Rust infers its
//!   type from later uses, which this translator does not follow.
//!
//! Where Rust and CUDA differ, the translation follows Rust: `as u32` from a float saturates (NaN
//! gives 0), `powi` is repeated squaring, `clamp` keeps a NaN, `max`/`min` ignore a NaN operand
//! (fmax/fmin do too).
//! NVRTC may contract `a * b + c` into one fused multiply-add, as it does for the built-in ops; a
//! user op is held to the same tolerance as they are.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{BinOp, Expr, FnArg, ItemFn, Lit, Pat, ReturnType, Stmt, Type, UnOp};

use crate::{CpuImpl, FusionClass, OpDef, Param, Precision, StateTypes, Ty};

/// A scalar type of the subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// `f32` (CUDA `float`).
    F32,
    /// `f64` (CUDA `double`).
    F64,
    /// `u32` (CUDA `unsigned int`).
    U32,
    /// What comparisons and `&& || !` give: a `let` may bind one, a parameter or result may not.
    Bool,
    /// A state of several fields (`#[derive(pptm::State)]`): an op's flow, its result, a `let`.
    State(&'static StateTy),
    /// A table read at computed coordinates (a parameter `t: pptm::Table`; see
    /// [`Table`](crate::Table)).
    Table,
    /// A fixed-size array local to the op (`let mut a = [0.0_f64; 8];`), read and written
    /// element by element (`a[k]`, k a u32).
    Array(ArrayTy),
}

/// A local array's element type and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayTy {
    /// f32, f64 or u32.
    pub elem: ArrayElem,
    /// Between 1 and [`MAX_ARRAY_LEN`].
    pub len: u32,
}

/// What a local array holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayElem {
    /// `f32` values.
    F32,
    /// `f64` values.
    F64,
    /// `u32` values.
    U32,
}

impl ArrayElem {
    fn scalar(self) -> Scalar {
        match self {
            ArrayElem::F32 => Scalar::F32,
            ArrayElem::F64 => Scalar::F64,
            ArrayElem::U32 => Scalar::U32,
        }
    }

    fn of(s: Scalar) -> Option<ArrayElem> {
        match s {
            Scalar::F32 => Some(ArrayElem::F32),
            Scalar::F64 => Some(ArrayElem::F64),
            Scalar::U32 => Some(ArrayElem::U32),
            _ => None,
        }
    }
}

/// The longest local array: it lives in each thread's registers or local memory.
pub const MAX_ARRAY_LEN: u32 = 1024;

impl Scalar {
    fn cuda(self) -> &'static str {
        match self {
            Scalar::F32 => "float",
            Scalar::F64 => "double",
            Scalar::U32 => "unsigned int",
            Scalar::Bool => "bool",
            Scalar::State(st) => st.cuda,
            Scalar::Table => "pptm_table",
            // (An array's declaration is written apart: this is its element's type.)
            Scalar::Array(a) => a.elem.scalar().cuda(),
        }
    }

    fn rust(self) -> &'static str {
        match self {
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
            Scalar::U32 => "u32",
            Scalar::Bool => "bool",
            Scalar::State(st) => st.name,
            Scalar::Table => "Table",
            Scalar::Array(_) => "an array",
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Scalar::F32 | Scalar::F64)
    }
}

/// A state of several values per element: a struct with `#[derive(pptm::State)]`, whose named
/// fields are each f32 or f64. An op may take one as its flow and return one; a chain stores it as
/// its fields, interleaved, in f32 (element i's fields at `i * fields .. (i + 1) * fields`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDef {
    /// The struct's name.
    pub name: String,
    /// Its fields in declaration order, each [`Scalar::F32`] or [`Scalar::F64`].
    pub fields: Vec<(String, Scalar)>,
}

/// A state as the translator types it: one form of a [`StateDef`] (as declared, or with every
/// field f32 for an op's f32 form), leaked.
#[derive(Debug, PartialEq, Eq)]
pub struct StateTy {
    /// The Rust struct's name.
    pub name: &'static str,
    /// The device struct's name: `pptm_state_<name>`, or `pptm_state_<name>_f32`.
    pub cuda: &'static str,
    /// The fields, in order, with their types in this form.
    pub fields: Vec<(&'static str, Scalar)>,
}

/// The most fields a state may have: its values per element travel as channels.
pub const MAX_STATE_FIELDS: usize = 64;

/// The device struct of a state, as declared.
pub fn state_struct(name: &str) -> String {
    format!("pptm_state_{name}")
}

/// The device struct of a state with every field f32 (what an fp32 stage holds it in).
pub fn state_struct_f32(name: &str) -> String {
    format!("pptm_state_{name}_f32")
}

impl StateDef {
    /// Checks a struct with `#[derive(pptm::State)]`: named fields, each `f32` or `f64`, at least
    /// one and at most [`MAX_STATE_FIELDS`], no generics, `#[repr(C)]` (so that a slice of states
    /// is the interleaved fields a chain reads and writes).
    pub fn parse(item: &syn::ItemStruct) -> syn::Result<StateDef> {
        if !item.generics.params.is_empty() {
            return err(
                item.generics.span(),
                "a state cannot be generic: its fields are f32 or f64",
            );
        }
        let repr_c = item.attrs.iter().any(|a| {
            a.path().is_ident("repr") && {
                let mut c = false;
                let _ = a.parse_nested_meta(|m| {
                    c |= m.path.is_ident("C");
                    Ok(())
                });
                c
            }
        });
        if !repr_c {
            return err(
                item.ident.span(),
                "a state needs `#[repr(C)]`: its fields are stored in declaration order",
            );
        }
        let syn::Fields::Named(named) = &item.fields else {
            return err(
                item.fields.span(),
                "a state has named fields, e.g. `struct Particle { x: f64, v: f64 }`",
            );
        };
        let mut fields: Vec<(String, Scalar)> = Vec::new();
        for f in &named.named {
            let name = f.ident.as_ref().expect("named").to_string();
            let ty = match scalar_type(&f.ty, false) {
                Ok(t @ (Scalar::F32 | Scalar::F64)) => t,
                _ => return err(f.ty.span(), "a state's fields are f32 or f64"),
            };
            fields.push((name, ty));
        }
        if fields.is_empty() || fields.len() > MAX_STATE_FIELDS {
            return err(
                item.ident.span(),
                format!("a state has from 1 to {MAX_STATE_FIELDS} fields"),
            );
        }
        Ok(StateDef {
            name: item.ident.to_string(),
            fields,
        })
    }

    /// The state typed as declared, or (`narrow`) with every field f32; leaked.
    pub fn ty(&self, narrow: bool) -> &'static StateTy {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        Box::leak(Box::new(StateTy {
            name: leak(self.name.clone()),
            cuda: leak(if narrow {
                state_struct_f32(&self.name)
            } else {
                state_struct(&self.name)
            }),
            fields: self
                .fields
                .iter()
                .map(|(n, t)| (leak(n.clone()), if narrow { Scalar::F32 } else { *t }))
                .collect(),
        }))
    }

    /// Whether every field is f64 (an op returning it then serves fp64 stages too).
    pub fn all_f64(&self) -> bool {
        self.fields.iter().all(|(_, t)| *t == Scalar::F64)
    }

    /// The device side: the struct as declared and with every field f32 (the same type when
    /// every field is f32 already), conversions between the two, and the load and store of one
    /// element of an interleaved f32 buffer. Guarded by a name that hashes the fields, so that
    /// two ops of one state paste it once, and two different states of one name do not compile.
    pub fn cuda(&self) -> String {
        use sha2::Digest;
        let (name, wide, narrow) = (
            &self.name,
            state_struct(&self.name),
            state_struct_f32(&self.name),
        );
        let mut sig = String::new();
        for (f, t) in &self.fields {
            sig.push_str(&format!("{f}:{};", t.rust()));
        }
        let hash: String = sha2::Sha256::digest(sig.as_bytes())
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        let guard = format!("PPTM_STATE_{name}_{hash}");
        let decls = |narrowed: bool| -> String {
            self.fields
                .iter()
                .map(|(f, t)| {
                    let ty = if narrowed { Scalar::F32 } else { *t };
                    format!("    {} {f};\n", ty.cuda())
                })
                .collect()
        };
        let convert = |to: &str, ty: Scalar| -> String {
            let vals: Vec<String> = self
                .fields
                .iter()
                .map(|(f, _)| format!("({}){f}", ty.cuda()))
                .collect();
            format!("{to}{{{}}}", vals.join(", "))
        };
        let mut out = format!(
            "#ifndef {guard}\n#define {guard}\n// #[derive(pptm::State)] struct {name}: its fields as declared, and every field f32.\n"
        );
        if self.fields.iter().all(|(_, t)| *t == Scalar::F32) {
            out.push_str(&format!(
                "struct {wide} {{\n{}}};\ntypedef {wide} {narrow};\n",
                decls(false)
            ));
        } else {
            out.push_str(&format!(
                "struct {narrow};\nstruct {wide} {{\n{}    __device__ __forceinline__ operator {narrow}() const;\n}};\n\
                 struct {narrow} {{\n{}    __device__ __forceinline__ operator {wide}() const {{ return {}; }}\n}};\n\
                 __device__ __forceinline__ {wide}::operator {narrow}() const {{ return {}; }}\n",
                decls(false),
                decls(true),
                convert(&wide, Scalar::F64),
                convert(&narrow, Scalar::F32),
            ));
        }
        let k = self.fields.len();
        let stores: String = self
            .fields
            .iter()
            .enumerate()
            .map(|(i, (f, _))| format!(" p[{i}] = (float)s.{f};"))
            .collect();
        let types: Vec<&String> = if self.fields.iter().all(|(_, t)| *t == Scalar::F32) {
            vec![&wide]
        } else {
            vec![&wide, &narrow]
        };
        out.push_str(&format!(
            "// Element i of an interleaved f32 buffer of {name}s starts at p = base + {k} * i.\n"
        ));
        let finite: String = self
            .fields
            .iter()
            .map(|(f, _)| format!(" pptm_check_finite(s.{f});"))
            .collect();
        for t in types {
            out.push_str(&format!(
                "__device__ __forceinline__ void pptm_state_store(float* p, const {t}& s) {{{stores} }}\n\
                 __device__ __forceinline__ void pptm_check_finite(const {t}& s) {{{finite} }}\n"
            ));
        }
        out.push_str(&format!("#endif  // {guard}\n"));
        out
    }
}

/// A function of the subset, checked and translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpFn {
    /// The function's name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<(String, Scalar)>,
    /// Its result.
    pub ret: Scalar,
    /// The device function's name: `pptm_user_<name>` (`pptm_op_<name>` for a built-in op).
    pub device: String,
    /// The device function, ready to paste into a translation unit after [`HELPERS`]. For a
    /// reduction, the combine function and the reducer type (`device`) that wraps it.
    pub cuda: String,
    /// [`FusionClass::Elementwise`], or [`FusionClass::Reduction`] for `#[pptm::op(reduction(...))]`.
    pub class: FusionClass,
    /// The threads an element of an elementwise pass gets for this op ([`OpAttr::lanes`]): 1
    /// unless the body has a `for s in lanes(a..b)` loop. With such a loop the device function is
    /// a template over the lanes (`PPTM_LANES`, 1 by default, as every pattern but the
    /// elementwise pass calls it), which split that loop's iterations and sum what it
    /// accumulates.
    pub lanes: u8,
}

impl OpFn {
    /// The op's name in chains: the function's name in CamelCase (`log_sum` → `LogSum`), the name
    /// of the marker type a stage's field is declared with.
    pub fn op_name(&self) -> String {
        self.name
            .split('_')
            .filter(|w| !w.is_empty())
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The op's parameters as the catalog describes them. The first is the flow (the value the op
    /// maps); the others named in `tensors` are inputs of their own, one element per element of
    /// the flow; the rest are passed by value (f32 or u32: what a descriptor carries).
    pub fn catalog_params(&self, tensors: &[String]) -> Result<Vec<Param>, String> {
        if self.class == FusionClass::Reduction {
            // A reduction folds its flow, element by element: its parameters are the combine's two
            // accumulators, not inputs.
            if let Some(t) = tensors.first() {
                return Err(format!(
                    "`{t}`: a reduction reads only its flow; map other inputs in a stage before it"
                ));
            }
            return Ok(vec![Param {
                name: "x",
                ty: Ty::Like,
            }]);
        }
        for t in tensors {
            if !self.params.iter().skip(1).any(|(p, _)| p == t) {
                return Err(format!(
                    "`{t}` is not a parameter of `{}` after its first (the flow)",
                    self.name
                ));
            }
        }
        let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
        let mut out = vec![Param {
            name: leak(&self.params[0].0),
            ty: Ty::Like,
        }];
        for (p, ty) in &self.params[1..] {
            let catalog_ty = if *ty == Scalar::Table {
                if tensors.contains(p) {
                    return Err(format!(
                        "`{p}` is a table, read whole: it is not one of `tensors(...)`"
                    ));
                }
                // Its two dimensions, named after it (`gamma_rows`, `gamma_cols`).
                Ty::Table(leak(&format!("{p}_rows")), leak(&format!("{p}_cols")))
            } else if tensors.contains(p) {
                if *ty == Scalar::U32 {
                    return Err(format!("`{p}` is a u32: an input of its own is f32 or f64"));
                }
                Ty::Like
            } else {
                match ty {
                    Scalar::F32 => Ty::F32,
                    Scalar::U32 => Ty::U32,
                    _ => {
                        return Err(format!(
                            "`{p}` is an f64 passed by value, which a descriptor cannot carry: make it \
                             f32, or an input of its own (`tensors({p})`)"
                        ));
                    }
                }
            };
            out.push(Param {
                name: leak(p),
                ty: catalog_ty,
            });
        }
        Ok(out)
    }

    /// The op as an [`OpDef`] whose CPU reference is a stub, leaked: what build.rs and the derive
    /// macro need (they do not link the user's function; the attribute macro builds the real
    /// [`OpDef`], with the function as its CPU reference, from the same [`OpFn`]).
    pub fn leak_def(&self, tensors: &[String]) -> Result<&'static OpDef, String> {
        let inputs: &'static [Param] = Box::leak(self.catalog_params(tensors)?.into_boxed_slice());
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let reduction = self.class == FusionClass::Reduction;
        Ok(Box::leak(Box::new(OpDef {
            name: leak(self.op_name()),
            class: self.class,
            inputs,
            output: self.output(),
            flow_channels: Some(self.channels().0),
            out_channels: Some(self.channels().1),
            states: self.state_types(),
            precisions: self.precisions(),
            tensor_precisions: &[],
            lanes: self.lanes,
            header: "",
            cuda: leak(self.cuda.clone()),
            device: leak(self.device.clone()),
            cpu: if reduction {
                CpuImpl::Reduction {
                    identity: f64::NAN,
                    combine: |_, _| f64::NAN,
                    fold: |_, _| f64::NAN,
                    finish: |_, _| f64::NAN,
                }
            } else if self.state_types().out.is_some() || self.has_tables() {
                CpuImpl::PerElement(|_, _, out| out.fill(f64::NAN))
            } else {
                CpuImpl::Elementwise(crate::element_fn!(|_| f64::NAN))
            },
            check: None,
            doc: leak(format!(
                "`{}`, an op of the user's own (#[pptm::op]).",
                self.name
            )),
        })))
    }

    /// Whether the op reads a table (a parameter `t: pptm::Table`).
    pub fn has_tables(&self) -> bool {
        self.params.iter().any(|(_, t)| *t == Scalar::Table)
    }

    /// Whether the op computes in f64: it returns an f64, or a state whose fields are all f64.
    pub fn returns_f64(&self) -> bool {
        match self.ret {
            Scalar::F64 => true,
            Scalar::State(st) => st.fields.iter().all(|(_, t)| *t == Scalar::F64),
            _ => false,
        }
    }

    /// The states its flow and its result are, if they are (see [`StateTypes`]).
    pub fn state_types(&self) -> StateTypes {
        let name = |t: Scalar| match t {
            Scalar::State(st) => Some(st.name),
            _ => None,
        };
        StateTypes {
            flow: name(self.params[0].1),
            out: name(self.ret),
        }
    }

    /// Values per element of its flow and of its result: 1, or a state's fields.
    pub fn channels(&self) -> (u8, u8) {
        let of = |t: Scalar| match t {
            Scalar::State(st) => st.fields.len() as u8,
            _ => 1,
        };
        (of(self.params[0].1), of(self.ret))
    }

    /// What the op produces: one value per element of its flow, or a reduction's one value.
    pub fn output(&self) -> Ty {
        if self.class == FusionClass::Reduction {
            Ty::Scalar
        } else {
            Ty::Like
        }
    }

    /// The precisions a stage of this op may declare. An f64 function serves an fp32 stage too
    /// (its result rounded); an f32 one only fp32. A reduction accumulates in f64 either way.
    pub fn precisions(&self) -> &'static [Precision] {
        if self.returns_f64() {
            &[Precision::Fp32, Precision::Fp64]
        } else {
            &[Precision::Fp32]
        }
    }
}

/// The arguments of `#[pptm::op(...)]`. Shared by the attribute macro and build.rs, so both read
/// them alike.
#[derive(Default)]
pub struct OpAttr {
    /// `tensors(a, b)`: the parameters after the first that are inputs of their own (one element
    /// per element of the flow) rather than values passed by value.
    pub tensors: Vec<syn::Ident>,
    /// `reduction(identity = ..., finish = |total, n| ...)`: the function is the combine of a
    /// reduction rather than an elementwise op.
    pub reduction: Option<ReductionAttr>,
    /// `f32_form`: an f64 op also gets an f32 device form, the same function with every `f64`
    /// read as `f32`, which fp32 stages call instead of computing in f64 and rounding. (The CPU
    /// reference stays the f64 function.)
    pub f32_form: Option<Span>,
    /// `lanes = N` (a power of two from 2 to 32): how many threads share each element of an
    /// elementwise pass that runs the op, splitting the iterations of its `for s in lanes(a..b)`
    /// loops among them and summing, as a warp does, what those loops accumulate with `+=` or
    /// `-=`. An op with such a loop and no `lanes = N` gets [`DEFAULT_LANES`].
    pub lanes: Option<(u8, Span)>,
}

/// The lanes an element gets where an op has a `lanes(a..b)` loop and no `lanes = N`.
pub const DEFAULT_LANES: u8 = 8;

/// `reduction(identity = EXPR, finish = CLOSURE)` in `#[pptm::op(...)]`.
pub struct ReductionAttr {
    /// The `reduction` keyword, for errors.
    pub span: Span,
    /// The combine's identity: a constant (`0.0`, `f64::NEG_INFINITY`).
    pub identity: Expr,
    /// Turns the combined total of `n` elements into the result (`|total, n| total / n`, with
    /// `n` an f64); the total itself when absent.
    pub finish: Option<syn::ExprClosure>,
}

impl OpAttr {
    /// The parameter names of `tensors(...)`, as strings.
    pub fn tensor_names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.to_string()).collect()
    }
}

/// Parses the arguments of `#[pptm::op(...)]`: nothing, `tensors(a, b)`, or
/// `reduction(identity = ..., finish = ...)`.
pub fn parse_op_attr(attr: proc_macro2::TokenStream) -> syn::Result<OpAttr> {
    let mut out = OpAttr::default();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("tensors") {
            if !out.tensors.is_empty() {
                return Err(meta.error("`tensors` is given twice"));
            }
            meta.parse_nested_meta(|inner| {
                let Some(id) = inner.path.get_ident() else {
                    return Err(inner.error("name a parameter, e.g. tensors(obs)"));
                };
                out.tensors.push(id.clone());
                Ok(())
            })
        } else if meta.path.is_ident("f32_form") {
            if out.f32_form.is_some() {
                return Err(meta.error("`f32_form` is given twice"));
            }
            out.f32_form = Some(meta.path.span());
            Ok(())
        } else if meta.path.is_ident("lanes") {
            if out.lanes.is_some() {
                return Err(meta.error("`lanes` is given twice"));
            }
            let lit: syn::LitInt = meta.value()?.parse()?;
            match lit.base10_parse::<u8>() {
                Ok(n @ (2 | 4 | 8 | 16 | 32)) => out.lanes = Some((n, lit.span())),
                _ => {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`lanes` is a power of two from 2 to 32 (the threads of a warp that share an element)",
                    ));
                }
            }
            Ok(())
        } else if meta.path.is_ident("reduction") {
            if out.reduction.is_some() {
                return Err(meta.error("`reduction` is given twice"));
            }
            let span = meta.path.span();
            let (mut identity, mut finish) = (None, None);
            if meta.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in meta.input);
                while !content.is_empty() {
                    let name: syn::Ident = content.parse()?;
                    content.parse::<syn::Token![=]>()?;
                    let value: Expr = content.parse()?;
                    match (name.to_string().as_str(), value) {
                        ("identity", v) => identity = Some(v),
                        ("finish", Expr::Closure(c)) => finish = Some(c),
                        ("finish", other) => {
                            return Err(syn::Error::new(
                                other.span(),
                                "`finish` is a closure of the total and the element count: `|total, n| total / n`",
                            ));
                        }
                        _ => {
                            return Err(syn::Error::new(
                                name.span(),
                                "unknown reduction argument; expected `identity = ...` or `finish = |total, n| ...`",
                            ));
                        }
                    }
                    if !content.is_empty() {
                        content.parse::<syn::Token![,]>()?;
                    }
                }
            }
            let Some(identity) = identity else {
                return Err(syn::Error::new(
                    span,
                    "a reduction needs the identity of its combine: `reduction(identity = 0.0)`",
                ));
            };
            out.reduction = Some(ReductionAttr {
                span,
                identity,
                finish,
            });
            Ok(())
        } else {
            Err(meta.error(
                "unknown op attribute; expected `tensors(param, ...)`, `f32_form`, `lanes = N` \
                 or `reduction(identity = ...)`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    if let (Some(r), Some(t)) = (&out.reduction, out.tensors.first()) {
        let mut e = syn::Error::new(
            t.span(),
            "a reduction reads only its flow: map other inputs in a stage before it",
        );
        e.combine(syn::Error::new(r.span, "declared a reduction here"));
        return Err(e);
    }
    if let (Some(_), Some((_, span))) = (&out.reduction, out.lanes) {
        return Err(syn::Error::new(
            span,
            "`lanes` splits the `lanes(a..b)` loops of an elementwise op, not a reduction's combine",
        ));
    }
    if let (Some(_), Some(f)) = (&out.reduction, out.f32_form) {
        return Err(syn::Error::new(
            f,
            "a reduction accumulates in f64 on every stage: `f32_form` is for elementwise ops",
        ));
    }
    Ok(out)
}

/// Checks a function with its `#[pptm::op(...)]` arguments and translates it: an elementwise op
/// ([`parse_op_fn`]), or the combine of a reduction ([`parse_reduction_fn`]).
pub fn parse_op(attr: &OpAttr, f: &ItemFn) -> syn::Result<OpFn> {
    parse_op_as(attr, f, USER_PREFIX, &[])
}

/// [`parse_op`] for a crate that declares states (`#[derive(pptm::State)]`): the op may take one
/// of `states` as its flow and return one.
pub fn parse_op_with_states(attr: &OpAttr, f: &ItemFn, states: &[StateDef]) -> syn::Result<OpFn> {
    parse_op_as(attr, f, USER_PREFIX, states)
}

/// The prefix of the device names of ops of the user's own (`pptm_user_swish`).
pub const USER_PREFIX: &str = "pptm_user_";
/// The prefix of the device names of the built-in ops written in the subset (`pptm_op_relu`:
/// pptm-spec's `ops::subset`).
pub const BUILTIN_PREFIX: &str = "pptm_op_";

/// [`parse_op`] with the device names under `prefix`.
pub fn parse_op_as(
    attr: &OpAttr,
    f: &ItemFn,
    prefix: &str,
    states: &[StateDef],
) -> syn::Result<OpFn> {
    let Some(r) = &attr.reduction else {
        let mut op = parse_op_fn_as(f, prefix, states, false)?;
        if let Some((n, span)) = attr.lanes {
            if op.lanes == 1 {
                return err(
                    span,
                    "`lanes = N` splits the op's `for s in lanes(a..b)` loops among the threads of \
                     an element, and this op has none",
                );
            }
            op.lanes = n;
        }
        let Some(span) = attr.f32_form else {
            return Ok(op);
        };
        if !op.returns_f64() {
            return err(
                span,
                "`f32_form` adds an f32 device form to an f64 op; this op returns f32 already",
            );
        }
        let narrow = parse_op_fn_as(&narrowed(f), prefix, states, true).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("in the op's f32 form (`f32_form`: every f64 read as f32): {e}"),
            )
        })?;
        // (The narrow form's states are the same definitions, already pasted once.)
        let narrow_fn = &narrow.cuda[narrow.cuda.find("// #[pptm::op] fn").unwrap_or(0)..];
        let cuda = format!(
            "{}{}",
            op.cuda,
            narrow_fn.replacen("// #[pptm::op] fn", "// #[pptm::op(f32_form)] fn", 1)
        );
        return Ok(OpFn { cuda, ..op });
    };
    parse_reduction_fn_as(f, r, prefix)
}

/// `f` with every `f64` (types, paths such as `f64::consts::PI`, literal suffixes) read as `f32`:
/// the source of an op's f32 form.
fn narrowed(f: &ItemFn) -> ItemFn {
    use syn::visit_mut::VisitMut;
    struct Narrow;
    impl VisitMut for Narrow {
        fn visit_ident_mut(&mut self, i: &mut syn::Ident) {
            if i == "f64" {
                *i = syn::Ident::new("f32", i.span());
            }
        }
        fn visit_lit_float_mut(&mut self, l: &mut syn::LitFloat) {
            if l.suffix() == "f64" {
                *l = syn::LitFloat::new(&format!("{}_f32", l.base10_digits()), l.span());
            }
        }
    }
    let mut f = f.clone();
    Narrow.visit_item_fn_mut(&mut f);
    f
}

/// The math methods of the subset: Rust name, number of arguments besides the receiver, and the
/// CUDA function for f32 and for f64 (`None`: written out below).
pub const METHODS: &[(&str, usize, &str, &str)] = &[
    ("abs", 0, "fabsf", "fabs"),
    ("sqrt", 0, "sqrtf", "sqrt"),
    ("cbrt", 0, "cbrtf", "cbrt"),
    ("exp", 0, "expf", "exp"),
    ("exp2", 0, "exp2f", "exp2"),
    ("exp_m1", 0, "expm1f", "expm1"),
    ("ln", 0, "logf", "log"),
    ("log2", 0, "log2f", "log2"),
    ("log10", 0, "log10f", "log10"),
    ("ln_1p", 0, "log1pf", "log1p"),
    ("sin", 0, "sinf", "sin"),
    ("cos", 0, "cosf", "cos"),
    ("tan", 0, "tanf", "tan"),
    ("asin", 0, "asinf", "asin"),
    ("acos", 0, "acosf", "acos"),
    ("atan", 0, "atanf", "atan"),
    ("sinh", 0, "sinhf", "sinh"),
    ("cosh", 0, "coshf", "cosh"),
    ("tanh", 0, "tanhf", "tanh"),
    ("floor", 0, "floorf", "floor"),
    ("ceil", 0, "ceilf", "ceil"),
    ("round", 0, "roundf", "round"),
    ("trunc", 0, "truncf", "trunc"),
    ("recip", 0, "", ""),
    ("max", 1, "fmaxf", "fmax"),
    ("min", 1, "fminf", "fmin"),
    ("powf", 1, "powf", "pow"),
    ("powi", 1, "pptm_user_powi", "pptm_user_powi"),
    ("atan2", 1, "atan2f", "atan2"),
    ("hypot", 1, "hypotf", "hypot"),
    ("copysign", 1, "copysignf", "copysign"),
    ("mul_add", 2, "fmaf", "fma"),
    ("clamp", 2, "", ""),
];

/// Device helpers a translation may call: codegen emits them once, before the ops of the user's
/// own, in each translation unit that has any (`OpFn::cuda` holds the op alone).
pub const HELPERS: &str = "
#ifndef PPTM_OP_HELPERS
#define PPTM_OP_HELPERS
// Rust's powi: repeated squaring (a negative power inverts the result).
template <class T> __device__ __forceinline__ T pptm_user_powi(T x, int n) {
    unsigned int e = n < 0 ? 0u - (unsigned int)n : (unsigned int)n;
    T r = (T)1, b = x;
    while (e != 0u) {
        if (e & 1u) r *= b;
        b *= b;
        e >>= 1;
    }
    return n < 0 ? (T)1 / r : r;
}
// The lanes of an element (`for s in lanes(a..b)`: PPTM_LANES consecutive threads of a warp that
// share one element of an elementwise pass): this thread's lane, and the sum of a value over the
// element's lanes, which every lane gets. With one lane, the lane is 0 and the sum the value.
template <unsigned int L> __device__ __forceinline__ unsigned int pptm_lane() { return L > 1u ? threadIdx.x % L : 0u; }
template <unsigned int L, class T> __device__ __forceinline__ T pptm_lane_sum(T v) {
    static_assert(L >= 1u && L <= 32u && (L & (L - 1u)) == 0u, \"lanes: a power of two up to 32\");
    if (L > 1u) {
        // Only this element's lanes take part: elements of one warp may be at different points.
        const unsigned int first = threadIdx.x % 32u & ~(L - 1u);
        const unsigned int mask = L == 32u ? 0xffffffffu : ((1u << (L % 32u)) - 1u) << first;
        for (unsigned int o = L / 2u; o > 0u; o /= 2u) v += __shfl_xor_sync(mask, v, o, L);
    }
    return v;
}
// Rust's clamp: below lo gives lo, above hi gives hi, and NaN stays NaN.
template <class T> __device__ __forceinline__ T pptm_user_clamp(T x, T lo, T hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
// Rust's `as u32` from a float: saturating, NaN to 0.
template <class T> __device__ __forceinline__ unsigned int pptm_user_to_u32(T x) {
    return x != x ? 0u : x <= (T)0 ? 0u : x >= (T)4294967295.0 ? 4294967295u : (unsigned int)x;
}
// A table an op reads at computed coordinates (pptm::Table): row-major, f32 values or (`half`,
// a stage's `tables = \"fp16\"`) f16 ones, widened as they are read.
struct pptm_table {
    const void* p;
    // Each side is below 2^32 (binding refuses a larger table: BindError::TableTooLarge), so
    // indices are 32-bit and only an offset needs 64 bits: one wide multiply-add.
    unsigned int rows, cols;
    unsigned int half;
};
template <class T> __device__ __forceinline__ T pptm_table_nan() { return (T)__longlong_as_double(0x7ff8000000000000ll); }
// A NaN both as an f32 and, in its first two bytes, as an f16: what an empty table reads.
__device__ const unsigned int pptm_table_nan_cell = 0x7fc07e00u;
// The table a chain passes, made so that every read needs no branch: an empty one (no rows or
// no columns) becomes one cell of NaN, so every read of it is NaN, as on the CPU.
__device__ __forceinline__ pptm_table pptm_table_make(const void* p, unsigned long long rows, unsigned long long cols, unsigned int half) {
    if (rows == 0ull || cols == 0ull) return pptm_table{&pptm_table_nan_cell, 1u, 1u, half};
    return pptm_table{p, (unsigned int)rows, (unsigned int)cols, half};
}
// Value k of the table, through the read-only cache.
__device__ __forceinline__ float pptm_table_value(const pptm_table& t, unsigned long long k) {
    if (t.half) {
        float f;
        const unsigned short h = __ldg(reinterpret_cast<const unsigned short*>(t.p) + k);
        asm(\"{ .reg .b16 a; mov.b16 a, %1; cvt.f32.f16 %0, a; }\" : \"=f\"(f) : \"h\"(h));
        return f;
    }
    return __ldg(reinterpret_cast<const float*>(t.p) + k);
}
__device__ __forceinline__ unsigned long long pptm_table_offset(const pptm_table& t, unsigned int i, unsigned int j) {
    return (unsigned long long)i * t.cols + j;
}
// The value at (i, j), each index clamped to the table.
template <class T> __device__ __forceinline__ T pptm_table_at(const pptm_table& t, unsigned int i, unsigned int j) {
    return (T)pptm_table_value(t, pptm_table_offset(t, min(i, t.rows - 1u), min(j, t.cols - 1u)));
}
// floor(x) as an index, in one conversion, for 0 <= x < 2^32; NaN gives 0.
__device__ __forceinline__ unsigned int pptm_table_floor(float x) { return __float2uint_rd(x); }
__device__ __forceinline__ unsigned int pptm_table_floor(double x) { return __double2uint_rd(x); }
// Bilinear interpolation at (x, y) in grid units, each clamped to the table, in T (as
// pptm_spec::Table::bilinear computes it). No branch on the coordinates: the index arithmetic is
// on the critical path of a time step that reads the table (examples/geodesics.rs), and a
// branch would keep the loop-invariant column's arithmetic from leaving the loop. A NaN
// coordinate reads cell (0, 0) (its index converts to 0), and the result is NaN.
template <class T> __device__ __forceinline__ T pptm_table_bilinear(const pptm_table& t, T x, T y) {
    const bool nan_in = x != x || y != y;
    const T xc = fmin(fmax(x, (T)0), (T)(t.rows - 1u)), yc = fmin(fmax(y, (T)0), (T)(t.cols - 1u));
    const unsigned int i0 = pptm_table_floor(xc), j0 = pptm_table_floor(yc);
    const unsigned long long k = pptm_table_offset(t, i0, j0);
    // The next row and column, or the same ones at the table's last.
    const unsigned long long di = i0 + 1u < t.rows ? t.cols : 0u;
    const unsigned int dj = j0 + 1u < t.cols ? 1u : 0u;
    const T v00 = (T)pptm_table_value(t, k), v01 = (T)pptm_table_value(t, k + dj);
    const T v10 = (T)pptm_table_value(t, k + di), v11 = (T)pptm_table_value(t, k + di + dj);
    const T tx = xc - (T)i0, ty = yc - (T)j0;
    const T a = v00 + ty * (v01 - v00), b = v10 + ty * (v11 - v10);
    const T r = a + tx * (b - a);
    return nan_in ? pptm_table_nan<T>() : r;
}
// (An empty table, made one cell of NaN, still says it has no rows and no columns.)
__device__ __forceinline__ bool pptm_table_empty(const pptm_table& t) { return t.p == &pptm_table_nan_cell; }
__device__ __forceinline__ unsigned int pptm_table_rows(const pptm_table& t) { return pptm_table_empty(t) ? 0u : t.rows; }
__device__ __forceinline__ unsigned int pptm_table_cols(const pptm_table& t) { return pptm_table_empty(t) ? 0u : t.cols; }
#endif  // PPTM_OP_HELPERS
";

fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

/// What the subset allows, for errors.
const ALLOWED: &str = "an op's body may use `let` (and `let mut`) bindings, local arrays \
    (`let mut a = [0.0_f64; 8];`, `a[k]`), assignments, `for` loops over u32 ranges, arithmetic, comparisons, `&&`/`||`/`!`, `if`/`else`, `as` casts \
    between f32/f64/u32, f32/f64 constants and math methods (see pptm-spec's op_fn module)";

/// Checks `f` against the subset and translates it (see the module docs).
pub fn parse_op_fn(f: &ItemFn) -> syn::Result<OpFn> {
    parse_op_fn_as(f, USER_PREFIX, &[], false)
}

/// [`parse_op_fn`] with the device name under `prefix`.
/// `states` are the crate's states an op may take and return; `narrow` types them with every
/// field f32 (an op's f32 form, translated from the function with every f64 read as f32).
fn parse_op_fn_as(
    f: &ItemFn,
    prefix: &str,
    states: &[StateDef],
    narrow: bool,
) -> syn::Result<OpFn> {
    let state_tys: Vec<&'static StateTy> = states.iter().map(|d| d.ty(narrow)).collect();
    let value_type = |ty: &Type, allow_bool: bool| value_type(ty, allow_bool, &state_tys);
    let sig = &f.sig;
    if let Some(c) = &sig.constness {
        return err(c.span(), "an op is a plain `fn`, not `const fn`");
    }
    if let Some(a) = &sig.asyncness {
        return err(a.span(), "an op is a plain `fn`, not `async fn`");
    }
    if let Some(u) = &sig.unsafety {
        return err(u.span(), "an op is a plain `fn`, not `unsafe fn`");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return err(
            sig.generics.span(),
            "an op cannot be generic: write it for f32 or f64",
        );
    }
    if let Some(v) = &sig.variadic {
        return err(v.span(), "an op takes named scalar parameters");
    }
    let name = sig.ident.to_string();
    let mut params = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else {
            return err(input.span(), "an op is a free function, not a method");
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return err(pt.pat.span(), "a parameter is a plain name, e.g. `x: f32`");
        };
        if pi.by_ref.is_some() || pi.mutability.is_some() || pi.subpat.is_some() {
            return err(pi.span(), "a parameter is a plain name, e.g. `x: f32`");
        }
        let ty = value_type(&pt.ty, false)?;
        if ty == Scalar::Table && params.is_empty() {
            return err(
                pt.ty.span(),
                "a table is read at computed coordinates: it cannot be an op's flow (its first parameter)",
            );
        }
        if matches!(ty, Scalar::State(_)) && !params.is_empty() {
            return err(
                pt.ty.span(),
                "a state is an op's flow: only its first parameter can be one",
            );
        }
        let pname = pi.ident.to_string();
        if params.iter().any(|(p, _): &(String, Scalar)| *p == pname) {
            return err(pi.ident.span(), format!("`{pname}` is a parameter twice"));
        }
        params.push((pname, ty));
    }
    if params.is_empty() {
        return err(
            sig.paren_token.span.join(),
            "an op takes at least its input, e.g. `fn swish(x: f32) -> f32`",
        );
    }
    if !params[0].1.is_float() && !matches!(params[0].1, Scalar::State(_)) {
        return err(
            sig.inputs[0].span(),
            "an op's first parameter is the value it maps: f32, f64 or a state",
        );
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) => value_type(ty, false)?,
        ReturnType::Default => {
            return err(
                sig.ident.span(),
                "an op returns its value: `-> f32` or `-> f64`",
            );
        }
    };
    if !ret.is_float() && !matches!(ret, Scalar::State(_)) {
        return err(sig.output.span(), "an op returns f32, f64 or a state");
    }

    let mut t = Translator {
        scopes: vec![immutable(&params)],
        body: String::new(),
        temps: 0,
        states: state_tys.clone(),
        narrow,
        in_value: 0,
        lanes_loop: None,
        has_lanes: false,
    };
    let value = t.block(&f.block.stmts, f.block.span(), Some(ret), 1)?;
    let device = format!("{prefix}{name}");
    let args = params
        .iter()
        .map(|(p, ty)| format!("{} {p}", ty.cuda()))
        .collect::<Vec<_>>()
        .join(", ");
    // The states it takes or returns, defined before it.
    let mut cuda = String::new();
    for d in states {
        let used = [params[0].1, ret]
            .iter()
            .any(|t| matches!(t, Scalar::State(st) if st.name == d.name));
        if used
            || t.body.contains(&state_struct(&d.name))
            || value.code.contains(&state_struct(&d.name))
        {
            cuda.push_str(&d.cuda());
        }
    }
    // An op with a `lanes(a..b)` loop is a template over the lanes of an element.
    let template = if t.has_lanes {
        "template <unsigned int PPTM_LANES = 1>\n"
    } else {
        ""
    };
    cuda.push_str(&format!(
        "// #[pptm::op] fn {name}\n{template}__device__ __forceinline__ {} {device}({args}) {{\n{}    return {};\n}}\n",
        ret.cuda(),
        t.body,
        value.code
    ));
    Ok(OpFn {
        name,
        params,
        ret,
        device,
        cuda,
        class: FusionClass::Elementwise,
        lanes: if t.has_lanes { DEFAULT_LANES } else { 1 },
    })
}

/// Checks the combine function of a reduction and translates it with its identity and finish
/// into a reducer type (`pptm_user_<name>_reducer`) the fused patterns use as they use the
/// built-in reductions'. The accumulator is f64 on both backends, so the combine is
/// `fn(a: f64, b: f64) -> f64`: it folds two partial results (an element is the partial result
/// of itself), in any order and grouping, so it must be associative and commutative.
pub fn parse_reduction_fn(f: &ItemFn, r: &ReductionAttr) -> syn::Result<OpFn> {
    parse_reduction_fn_as(f, r, USER_PREFIX)
}

/// [`parse_reduction_fn`] with the device names under `prefix`.
fn parse_reduction_fn_as(f: &ItemFn, r: &ReductionAttr, prefix: &str) -> syn::Result<OpFn> {
    let combine = parse_op_fn_as(f, prefix, &[], false)?;
    let f64s = combine.params.len() == 2
        && combine.params.iter().all(|(_, t)| *t == Scalar::F64)
        && combine.ret == Scalar::F64;
    if !f64s {
        return err(
            f.sig.span(),
            "a reduction's function is its combine: `fn(a: f64, b: f64) -> f64` (reductions \
             accumulate in f64), associative and commutative",
        );
    }
    let mut t = Translator {
        scopes: Vec::new(),
        body: String::new(),
        temps: 0,
        states: Vec::new(),
        narrow: false,
        in_value: 0,
        lanes_loop: None,
        has_lanes: false,
    };
    check_constant(&r.identity)?;
    let identity = t.expr(&r.identity, Some(Scalar::F64))?;
    let (finish_body, finish_value) = match &r.finish {
        None => (String::new(), "pptm_total".to_string()),
        Some(c) => finish_closure(c)?,
    };
    let device = format!("{prefix}{}_reducer", combine.name);
    let cuda = format!(
        "{}// #[pptm::op(reduction)] fn {name}: identity, combine and finish for the fused patterns.\n\
         struct {device} {{\n\
         \x20   __device__ __forceinline__ static double identity() {{ return {id}; }}\n\
         \x20   __device__ __forceinline__ static double combine(double a, double b) {{ return {comb}(a, b); }}\n\
         \x20   __device__ __forceinline__ static double finish(double pptm_total, unsigned long long pptm_count) {{\n\
         \x20       (void)pptm_total;\n\
         \x20       (void)pptm_count;\n\
         {finish_body}\x20       return {finish_value};\n\
         \x20   }}\n\
         }};\n",
        combine.cuda,
        name = combine.name,
        id = identity.code,
        comb = combine.device,
    );
    Ok(OpFn {
        device,
        cuda,
        class: FusionClass::Reduction,
        ..combine
    })
}

/// A reduction's identity is a constant: literals, f32/f64 constants, arithmetic on them.
fn check_constant(e: &Expr) -> syn::Result<()> {
    match e {
        Expr::Lit(_) | Expr::Path(_) => Ok(()),
        Expr::Paren(p) => check_constant(&p.expr),
        Expr::Group(g) => check_constant(&g.expr),
        Expr::Unary(u) => check_constant(&u.expr),
        Expr::Cast(c) => check_constant(&c.expr),
        Expr::Binary(b) => check_constant(&b.left).and_then(|()| check_constant(&b.right)),
        other => err(
            other.span(),
            "a reduction's identity is a constant: a literal, an f64 constant such as \
             `f64::NEG_INFINITY`, or arithmetic on them",
        ),
    }
}

/// Translates `finish = |total, n| ...` (`total` and `n`, the element count, are f64): the
/// statements before its value, indented for the reducer's `finish`, and the value.
fn finish_closure(c: &syn::ExprClosure) -> syn::Result<(String, String)> {
    if let Some(tok) = c
        .asyncness
        .as_ref()
        .map(|a| a.span())
        .or(c.movability.as_ref().map(|m| m.span()))
        .or(c.capture.as_ref().map(|m| m.span()))
        .or(c.constness.as_ref().map(|m| m.span()))
    {
        return err(tok, "`finish` is a plain closure: `|total, n| total / n`");
    }
    if c.inputs.is_empty() || c.inputs.len() > 2 {
        return err(
            c.inputs.span(),
            "`finish` takes the total and, optionally, the element count: `|total, n| total / n`",
        );
    }
    let mut scope = Vec::new();
    for input in &c.inputs {
        let (pat, ty) = match input {
            Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            other => (other, None),
        };
        let Pat::Ident(pi) = pat else {
            return err(input.span(), "a `finish` parameter is a plain name");
        };
        if let Some(ty) = ty
            && scalar_type(ty, false)? != Scalar::F64
        {
            return err(
                ty.span(),
                "`finish` parameters are f64 (the total, and the element count as f64)",
            );
        }
        scope.push((pi.ident.to_string(), Scalar::F64));
    }
    if let ReturnType::Type(_, ty) = &c.output
        && scalar_type(ty, false)? != Scalar::F64
    {
        return err(ty.span(), "`finish` returns f64");
    }
    let mut t = Translator {
        scopes: vec![immutable(&scope)],
        body: String::new(),
        temps: 0,
        states: Vec::new(),
        narrow: false,
        in_value: 0,
        lanes_loop: None,
        has_lanes: false,
    };
    let v = match &*c.body {
        Expr::Block(b) if b.label.is_none() => {
            t.block(&b.block.stmts, b.span(), Some(Scalar::F64), 2)?
        }
        other => t.expr(other, Some(Scalar::F64))?,
    };
    if t.has_lanes {
        return err(
            c.body.span(),
            "a reduction's `finish` runs once, on one thread: its loops are plain `a..b` ranges, not `lanes(a..b)`",
        );
    }
    // The reducer's finish receives `pptm_total` and `pptm_count`: the closure's parameters are
    // bound to them by its own names.
    let mut prelude = String::new();
    for (k, (name, _)) in scope.iter().enumerate() {
        let from = if k == 0 {
            "pptm_total"
        } else {
            "(double)pptm_count"
        };
        prelude.push_str(&format!("        const double {name} = {from};\n"));
    }
    Ok((prelude + &t.body, v.code))
}

/// `f32`, `f64` or `u32` (and `bool` where `allow_bool`), possibly written `core::primitive::f32`.
fn scalar_type(ty: &Type, allow_bool: bool) -> syn::Result<Scalar> {
    if let Type::Path(p) = ty
        && p.qself.is_none()
        && let Some(last) = p.path.segments.last()
        && last.arguments.is_empty()
    {
        match last.ident.to_string().as_str() {
            "f32" => return Ok(Scalar::F32),
            "f64" => return Ok(Scalar::F64),
            "u32" => return Ok(Scalar::U32),
            "bool" if allow_bool => return Ok(Scalar::Bool),
            _ => {}
        }
    }
    err(ty.span(), "an op's values are f32, f64 or u32")
}

/// A value type of the subset: [`scalar_type`], or one of `states` named by its struct's name.
fn value_type(ty: &Type, allow_bool: bool, states: &[&'static StateTy]) -> syn::Result<Scalar> {
    if let Ok(t) = scalar_type(ty, allow_bool) {
        return Ok(t);
    }
    if let Type::Path(p) = ty
        && p.qself.is_none()
        && let Some(last) = p.path.segments.last()
    {
        // `Table`, `Table<'_>`, `pptm::Table<'a>`.
        let lifetimes_only = match &last.arguments {
            syn::PathArguments::None => true,
            syn::PathArguments::AngleBracketed(a) => a
                .args
                .iter()
                .all(|g| matches!(g, syn::GenericArgument::Lifetime(_))),
            syn::PathArguments::Parenthesized(_) => false,
        };
        if last.ident == "Table" && lifetimes_only {
            return Ok(Scalar::Table);
        }
        if last.arguments.is_empty()
            && let Some(st) = states.iter().find(|st| last.ident == st.name)
        {
            return Ok(Scalar::State(st));
        }
    }
    err(
        ty.span(),
        "an op's values are f32, f64, u32, a `pptm::Table`, or a state: a struct of this \
         crate with `#[derive(pptm::State)]`",
    )
}

/// An array's length: an integer literal from 1 to [`MAX_ARRAY_LEN`].
fn array_len(e: &Expr) -> syn::Result<u32> {
    if let Expr::Lit(l) = e
        && let Lit::Int(i) = &l.lit
        && let Ok(n) = i.base10_parse::<u32>()
        && (1..=MAX_ARRAY_LEN).contains(&n)
    {
        return Ok(n);
    }
    err(
        e.span(),
        format!("an array's length is an integer literal from 1 to {MAX_ARRAY_LEN}"),
    )
}

/// A translated expression: its CUDA text and type. `None` type: an unsuffixed float literal,
/// which takes the type of what it meets.
#[derive(Debug, Clone)]
struct Value {
    code: String,
    ty: Option<Scalar>,
}

struct Translator {
    /// Names in scope, innermost last, and whether each is `let mut`.
    scopes: Vec<Vec<(String, Scalar, bool)>>,
    /// Statements emitted so far (for the current block).
    body: String,
    temps: usize,
    /// The states the body may name (`let s: Geo`, `Geo { .. }`), typed for this form.
    states: Vec<&'static StateTy>,
    /// The op's f32 form (every f64 read as f32): a table's `at` gives f32.
    narrow: bool,
    /// Inside a block that gives a value (an `if`'s branch, a block expression): assignments and
    /// loops are refused there, because the translation evaluates such blocks inside expressions,
    /// where C++ leaves the order of operands' side effects open and Rust does not.
    in_value: usize,
    /// The `for s in lanes(a..b)` loop being translated, if any.
    lanes_loop: Option<LanesLoop>,
    /// Whether the body has a `lanes(a..b)` loop (the device function is then a template).
    has_lanes: bool,
}

/// A `for s in lanes(a..b)` loop: its iterations are split among the lanes of an element, so a
/// name from outside it may change only by `+=` or `-=`, summed over the lanes after the loop.
struct LanesLoop {
    /// The index in `Translator::scopes` of the loop's own scope: names bound below it are
    /// outside the loop.
    scope: usize,
    /// The places (`acc`, `out.px`) the loop accumulates into, in order of first appearance.
    sums: Vec<String>,
}

/// Why an assignment is refused inside a `lanes(a..b)` loop.
const LANES_SUMS_ONLY: &str = "inside a `lanes(a..b)` loop, whose iterations the lanes of an element \
    share, a name from outside the loop changes only by `+=` or `-=` (summed over the lanes after \
    the loop); bind what else you need inside the loop";

/// Why an assignment or a loop is refused inside a block that gives a value.
const VALUE_BLOCK_ONLY: &str = "assignments, `let mut` and loops are statements of the op's body, \
    of a loop or of an `if` without a value; a block that gives a value (an `if`'s branch, a \
    `{ ... }` expression) only binds with `let`";

/// An expression that is a statement, giving no value: an assignment, a loop, an `if` whose
/// branches end in statements (or that has no `else`).
fn is_statement_expr(e: &Expr) -> bool {
    match e {
        Expr::Assign(_) | Expr::ForLoop(_) => true,
        Expr::Binary(b) => matches!(
            b.op,
            BinOp::AddAssign(_)
                | BinOp::SubAssign(_)
                | BinOp::MulAssign(_)
                | BinOp::DivAssign(_)
                | BinOp::RemAssign(_)
                | BinOp::BitAndAssign(_)
                | BinOp::BitOrAssign(_)
                | BinOp::BitXorAssign(_)
                | BinOp::ShlAssign(_)
                | BinOp::ShrAssign(_)
        ),
        Expr::If(i) => {
            let unit = |stmts: &[Stmt]| !matches!(stmts.last(), Some(Stmt::Expr(e, None)) if !is_statement_expr(e));
            unit(&i.then_branch.stmts)
                && match i.else_branch.as_ref().map(|(_, e)| &**e) {
                    None => true,
                    Some(Expr::Block(b)) => unit(&b.block.stmts),
                    Some(nested @ Expr::If(_)) => is_statement_expr(nested),
                    Some(_) => false,
                }
        }
        _ => false,
    }
}

/// A scope of names bound once (parameters).
fn immutable(names: &[(String, Scalar)]) -> Vec<(String, Scalar, bool)> {
    names.iter().map(|(n, t)| (n.clone(), *t, false)).collect()
}

impl Translator {
    fn lookup(&self, name: &str) -> Option<Scalar> {
        self.binding(name).map(|(t, _)| t)
    }

    /// The innermost binding of `name`: its type, and whether it is `let mut`.
    fn binding(&self, name: &str) -> Option<(Scalar, bool)> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.iter().rev())
            .find(|(n, _, _)| n == name)
            .map(|(_, t, m)| (*t, *m))
    }

    /// Translates a block's statements into `self.body` (indented `depth`) and returns its final
    /// expression, of type `want` when given.
    fn block(
        &mut self,
        stmts: &[Stmt],
        span: Span,
        want: Option<Scalar>,
        depth: usize,
    ) -> syn::Result<Value> {
        self.scopes.push(Vec::new());
        let (tail, body) = match stmts.split_last() {
            Some((Stmt::Expr(e, None), rest)) if !is_statement_expr(e) => (Some(e), rest),
            _ => (None, stmts),
        };
        for stmt in body {
            self.stmt(stmt, depth)?;
        }
        let Some(tail) = tail else {
            return err(
                span,
                "the body must end with the op's value (an expression without `;`)",
            );
        };
        let v = self.expr(tail, want)?;
        self.scopes.pop();
        Ok(v)
    }

    /// Translates statements that give no value (a loop's body, an `if` without a value) into
    /// `self.body`, in a scope of their own.
    fn statements(&mut self, stmts: &[Stmt], depth: usize) -> syn::Result<()> {
        self.scopes.push(Vec::new());
        for stmt in stmts {
            self.stmt(stmt, depth)?;
        }
        self.scopes.pop();
        Ok(())
    }

    /// One statement: a `let` (or `let mut`), an assignment to a `let mut` name (or a field of a
    /// state bound so), a `for` loop over a `u32` range, or an `if` whose branches are statements.
    fn stmt(&mut self, stmt: &Stmt, depth: usize) -> syn::Result<()> {
        let indent = "    ".repeat(depth);
        match stmt {
            Stmt::Local(local) => {
                let (pat, annotation) = match &local.pat {
                    Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
                    other => (other, None),
                };
                let is_array = matches!(
                    local.init.as_ref().map(|i| &*i.expr),
                    Some(Expr::Repeat(_) | Expr::Array(_))
                );
                let annotated = match annotation {
                    Some(ty) if !is_array => Some(value_type(ty, true, &self.states)?),
                    _ => None,
                };
                let Pat::Ident(pi) = pat else {
                    return err(
                        pat.span(),
                        "a `let` binds one name, e.g. `let t = x * 0.5_f32;`",
                    );
                };
                let mutable = pi.mutability.is_some();
                if let Some(m) = &pi.mutability
                    && self.in_value > 0
                {
                    return err(m.span(), VALUE_BLOCK_ONLY);
                }
                if pi.by_ref.is_some() || pi.subpat.is_some() {
                    return err(pi.span(), "a `let` binds one name");
                }
                let Some(init) = &local.init else {
                    return err(local.span(), "a `let` needs its value");
                };
                if let Some((else_token, _)) = &init.diverge {
                    return err(else_token.span(), "`let ... else` is not in the op subset");
                }
                if is_array {
                    return self.array_let(pi, &local.pat, &init.expr, depth);
                }
                let v = self.expr(&init.expr, annotated)?;
                let ty = match (annotated, v.ty) {
                    (Some(a), _) => a,
                    (None, Some(t)) => t,
                    (None, None) => {
                        return err(
                            init.expr.span(),
                            "give this literal a type: `0.5_f32`, or `let c: f32 = 0.5;` (the translator does not infer it from later uses)",
                        );
                    }
                };
                if mutable && ty == Scalar::Table {
                    return err(pi.span(), "a table is read, never assigned: drop the `mut`");
                }
                let name = pi.ident.to_string();
                self.body.push_str(&format!(
                    "{indent}{}{} {name} = {};\n",
                    if mutable { "" } else { "const " },
                    ty.cuda(),
                    v.code
                ));
                self.scopes
                    .last_mut()
                    .expect("pushed")
                    .push((name, ty, mutable));
            }
            Stmt::Expr(Expr::Return(r), _) => {
                return err(
                    r.span(),
                    "an op ends with its value as the last expression, not `return`",
                );
            }
            Stmt::Expr(e, _) if is_statement_expr(e) => {
                if self.in_value > 0 {
                    return err(e.span(), VALUE_BLOCK_ONLY);
                }
                match e {
                    Expr::Assign(a) => {
                        let (target, ty) = self.place(&a.left)?;
                        if self.outside_lanes_loop(&a.left) {
                            return err(a.left.span(), LANES_SUMS_ONLY);
                        }
                        let v = self.expr(&a.right, Some(ty))?;
                        self.body
                            .push_str(&format!("{indent}{target} = {};\n", v.code));
                    }
                    Expr::Binary(b) => {
                        let op = match b.op {
                            BinOp::AddAssign(_) => "+=",
                            BinOp::SubAssign(_) => "-=",
                            BinOp::MulAssign(_) => "*=",
                            BinOp::DivAssign(_) => "/=",
                            _ => {
                                return err(
                                    b.op.span(),
                                    "of the compound assignments, `+=`, `-=`, `*=` and `/=` are in the op subset",
                                );
                            }
                        };
                        let (target, ty) = self.place(&b.left)?;
                        if !ty.is_float() && ty != Scalar::U32 {
                            return err(
                                b.left.span(),
                                format!("`{op}` applies to f32, f64 or u32"),
                            );
                        }
                        if self.outside_lanes_loop(&b.left) {
                            if !matches!(op, "+=" | "-=") || matches!(&*b.left, Expr::Index(_)) {
                                return err(b.left.span(), LANES_SUMS_ONLY);
                            }
                            let sums = &mut self.lanes_loop.as_mut().expect("inside").sums;
                            if !sums.contains(&target) {
                                sums.push(target.clone());
                            }
                        }
                        let v = self.expr(&b.right, Some(ty))?;
                        self.body
                            .push_str(&format!("{indent}{target} {op} {};\n", v.code));
                    }
                    Expr::ForLoop(f) => self.for_loop(f, depth)?,
                    Expr::If(i) => self.if_stmt(i, depth)?,
                    _ => unreachable!("is_statement_expr"),
                }
            }
            Stmt::Expr(e, _) => {
                return err(
                    e.span(),
                    format!(
                        "a statement that is not a `let`, an assignment, a `for` or an `if` has no effect here; {ALLOWED}"
                    ),
                );
            }
            Stmt::Item(item) => {
                return err(item.span(), "an op cannot declare items inside its body");
            }
            Stmt::Macro(m) => {
                return err(
                    m.span(),
                    "macros are not in the op subset (the body is translated to CUDA)",
                );
            }
        }
        Ok(())
    }

    /// Whether `e` (an assignment's target) names something bound outside the `lanes(a..b)` loop
    /// being translated (false outside such a loop).
    fn outside_lanes_loop(&self, e: &Expr) -> bool {
        let Some(l) = &self.lanes_loop else {
            return false;
        };
        let mut root = e;
        loop {
            match root {
                Expr::Field(f) => root = &f.base,
                Expr::Index(ix) => root = &ix.expr,
                Expr::Paren(p) => root = &p.expr,
                _ => break,
            }
        }
        let Expr::Path(p) = root else {
            return false;
        };
        let Some(name) = p.path.get_ident().map(|i| i.to_string()) else {
            return false;
        };
        // The innermost scope that binds it.
        self.scopes
            .iter()
            .rposition(|s| s.iter().any(|(n, _, _)| *n == name))
            .is_some_and(|scope| scope < l.scope)
    }

    /// What an assignment may change: a `let mut` name, a field of a state bound so, or an
    /// element of an array bound so.
    fn place(&mut self, e: &Expr) -> syn::Result<(String, Scalar)> {
        if let Expr::Index(ix) = e {
            let (code, elem, mutable) = self.element(ix)?;
            if !mutable {
                return err(
                    ix.expr.span(),
                    "this array is not `let mut`: only arrays bound with `let mut` change",
                );
            }
            return Ok((code, elem));
        }
        let (name, field) = match e {
            Expr::Path(p) => (p.path.get_ident(), None),
            Expr::Field(f) => match (&*f.base, &f.member) {
                (Expr::Path(p), syn::Member::Named(m)) => (p.path.get_ident(), Some(m)),
                _ => (None, None),
            },
            _ => (None, None),
        };
        let Some(name) = name else {
            return err(
                e.span(),
                "an assignment changes a `let mut` name, or a field of a state bound with `let mut`",
            );
        };
        let Some((ty, mutable)) = self.binding(&name.to_string()) else {
            return err(name.span(), format!("`{name}` is not bound here"));
        };
        if !mutable {
            return err(
                name.span(),
                format!("`{name}` is not `let mut`: only names bound with `let mut` change"),
            );
        }
        match (field, ty) {
            (None, Scalar::Array(_)) => err(
                name.span(),
                format!("`{name}` is an array: assign its elements, `{name}[k] = ...`"),
            ),
            (None, ty) => Ok((name.to_string(), ty)),
            (Some(m), Scalar::State(st)) => {
                let Some((_, fty)) = st.fields.iter().find(|(f, _)| m == f) else {
                    return err(m.span(), format!("`{}` has no field `{m}`", st.name));
                };
                Ok((format!("{name}.{m}"), *fty))
            }
            (Some(m), _) => err(
                m.span(),
                format!("`{name}` is not a state: it has no fields"),
            ),
        }
    }

    /// `let a = [v; N];` or `let a = [v0, v1, ...];` (maybe `mut`, maybe annotated
    /// `[f64; N]`): a local array of f32, f64 or u32, N a literal from 1 to MAX_ARRAY_LEN.
    fn array_let(
        &mut self,
        pi: &syn::PatIdent,
        pat: &Pat,
        init: &Expr,
        depth: usize,
    ) -> syn::Result<()> {
        let indent = "    ".repeat(depth);
        if self.in_value > 0 {
            return err(
                init.span(),
                "an array is declared among statements, not inside a block that gives a value",
            );
        }
        let annotated = match pat {
            Pat::Type(pt) => match &*pt.ty {
                Type::Array(a) => {
                    Some((scalar_type(&a.elem, false)?, array_len(&a.len)?, a.span()))
                }
                other => {
                    return err(other.span(), "an array's type is written `[f64; N]`");
                }
            },
            _ => None,
        };
        let want = annotated.map(|(t, _, _)| t);
        let (values, len) = match init {
            Expr::Repeat(r) => (vec![self.expr(&r.expr, want)?], array_len(&r.len)?),
            Expr::Array(a) => {
                let mut values = Vec::with_capacity(a.elems.len());
                let mut ty = want;
                for v in &a.elems {
                    let v = self.expr(v, ty)?;
                    ty = ty.or(v.ty);
                    values.push(v);
                }
                let len = u32::try_from(values.len()).unwrap_or(u32::MAX);
                if len == 0 || len > MAX_ARRAY_LEN {
                    return err(
                        init.span(),
                        format!("an array holds 1 to {MAX_ARRAY_LEN} elements"),
                    );
                }
                // An untyped literal before the first typed element takes its type.
                if let Some(t) = ty {
                    for (v, e) in values.iter_mut().zip(&a.elems) {
                        if v.ty.is_none() {
                            *v = self.expr(e, Some(t))?;
                        }
                    }
                }
                (values, len)
            }
            _ => unreachable!("called for arrays"),
        };
        let ty = match (want, values.iter().find_map(|v| v.ty)) {
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return err(
                    init.span(),
                    "give the elements a type: `[0.0_f64; 8]`, or `let a: [f64; 8] = [0.0; 8];`",
                );
            }
        };
        let Some(elem) = ArrayElem::of(ty) else {
            return err(init.span(), "an array holds f32, f64 or u32 values");
        };
        if let Some(v) = values.iter().find(|v| v.ty.is_some_and(|t| t != ty)) {
            return err(
                init.span(),
                format!(
                    "every element of an array has one type: {} and {}",
                    ty.rust(),
                    v.ty.map_or("a literal", Scalar::rust)
                ),
            );
        }
        if let Some((_, n, span)) = annotated
            && n != len
        {
            return err(
                span,
                format!("the type says {n} elements, the value has {len}"),
            );
        }
        let name = pi.ident.to_string();
        let cuda = ty.cuda();
        if let [v] = &values[..]
            && matches!(init, Expr::Repeat(_))
        {
            // The value once, then every element.
            let fill = format!("pptm_fill_{}", self.temps);
            self.temps += 1;
            self.body.push_str(&format!(
                "{indent}{cuda} {name}[{len}];\n{indent}{{\n{indent}    const {cuda} {fill} = {};\n\
                 {indent}    for (unsigned int pptm_k = 0u; pptm_k < {len}u; ++pptm_k) {name}[pptm_k] = {fill};\n\
                 {indent}}}\n",
                v.code
            ));
        } else {
            let list: Vec<&str> = values.iter().map(|v| v.code.as_str()).collect();
            self.body.push_str(&format!(
                "{indent}{cuda} {name}[{len}] = {{{}}};\n",
                list.join(", ")
            ));
        }
        self.scopes.last_mut().expect("pushed").push((
            name,
            Scalar::Array(ArrayTy { elem, len }),
            pi.mutability.is_some(),
        ));
        Ok(())
    }

    /// `a[k]`, `a` a local array and `k` a u32: its CUDA text, the element's type, and whether
    /// `a` is `let mut`. On the device an index past the end reads or writes the last element
    /// (never outside the array); the CPU backend, which runs the function itself, panics there
    /// as Rust does.
    fn element(&mut self, ix: &syn::ExprIndex) -> syn::Result<(String, Scalar, bool)> {
        let name = match &*ix.expr {
            Expr::Path(p) => p.path.get_ident(),
            _ => None,
        };
        let Some(name) = name else {
            return err(ix.expr.span(), "only a local array is indexed: `a[k]`");
        };
        let Some((Scalar::Array(a), mutable)) = self.binding(&name.to_string()) else {
            return err(
                name.span(),
                format!(
                    "`{name}` is not a local array: an op sees one element of each input (a \
                     table is read with `t.at(i, j)`, a state's fields as `s.field`)"
                ),
            );
        };
        let k = self.expr(&ix.index, Some(Scalar::U32))?;
        if k.ty != Some(Scalar::U32) {
            return err(ix.index.span(), "an array's index is a u32");
        }
        Ok((
            format!("{name}[min({}, {}u)]", k.code, a.len - 1),
            a.elem.scalar(),
            mutable,
        ))
    }

    /// `for i in a..b { ... }`: `i` a u32 from a up to b (excluded), b evaluated once, as Rust
    /// evaluates the range once.
    fn for_loop(&mut self, f: &syn::ExprForLoop, depth: usize) -> syn::Result<()> {
        let indent = "    ".repeat(depth);
        if let Some(l) = &f.label {
            return err(l.span(), "loop labels are not in the op subset");
        }
        let name = match &*f.pat {
            Pat::Wild(_) => format!("pptm_i_{}", self.temps),
            Pat::Ident(pi)
                if pi.mutability.is_none() && pi.by_ref.is_none() && pi.subpat.is_none() =>
            {
                pi.ident.to_string()
            }
            other => return err(other.span(), "a `for` binds one name: `for j in 0..n`"),
        };
        // `lanes(a..b)`: the range, its iterations split among the lanes of an element.
        let (range, lanes) = match &*f.expr {
            Expr::Call(c)
                if c.args.len() == 1
                    && matches!(&*c.func, Expr::Path(p)
                        if p.path.segments.last().is_some_and(|s| s.ident == "lanes")) =>
            {
                (&c.args[0], true)
            }
            e => (e, false),
        };
        let Expr::Range(r) = range else {
            return err(
                f.expr.span(),
                "a `for` runs over a range of u32: `0..n` (or `lanes(0..n)`)",
            );
        };
        if lanes && self.lanes_loop.is_some() {
            return err(
                f.expr.span(),
                "`lanes(a..b)` loops do not nest: the lanes of an element split one loop at a time",
            );
        }
        let (Some(from), Some(to), syn::RangeLimits::HalfOpen(_)) = (&r.start, &r.end, &r.limits)
        else {
            return err(
                r.span(),
                "a `for` runs over a half-open range of u32: `a..b`",
            );
        };
        let from = self.expr(from, Some(Scalar::U32))?;
        let to = self.expr(to, Some(Scalar::U32))?;
        let end = format!("pptm_end_{}", self.temps);
        let k = self.temps;
        self.temps += 1;
        let (start, step) = if lanes {
            (
                format!("{} + pptm_lane<PPTM_LANES>()", from.code),
                format!("{name} += PPTM_LANES"),
            )
        } else {
            (from.code, format!("++{name}"))
        };
        let at = self.body.len();
        self.body.push_str(&format!(
            "{indent}{{
{indent}    const unsigned int {end} = {};
{indent}    for (unsigned int {name} = {start}; {name} < {end}; {step}) {{
",
            to.code
        ));
        if lanes {
            self.has_lanes = true;
            self.lanes_loop = Some(LanesLoop {
                scope: self.scopes.len(),
                sums: Vec::new(),
            });
        }
        self.scopes.push(vec![(name, Scalar::U32, false)]);
        let body = self.statements(&f.body.stmts, depth + 2);
        self.scopes.pop();
        let sums = if lanes {
            self.lanes_loop.take().expect("set above").sums
        } else {
            Vec::new()
        };
        body?;
        self.body.push_str(&format!(
            "{indent}    }}
{indent}}}
"
        ));
        // Each lane sums its share of the iterations from zero; the start value is added back
        // once to the lanes' total (every lane holds the same value before and after the loop).
        let mut before = String::new();
        for (j, place) in sums.iter().enumerate() {
            before.push_str(&format!(
                "{indent}const auto pptm_start_{k}_{j} = {place};\n{indent}{place} = 0;\n"
            ));
            self.body.push_str(&format!(
                "{indent}{place} = pptm_start_{k}_{j} + pptm_lane_sum<PPTM_LANES>({place});\n"
            ));
        }
        self.body.insert_str(at, &before);
        Ok(())
    }

    /// An `if` whose branches are statements (no value): `if r < cut { f += g; }`.
    fn if_stmt(&mut self, i: &syn::ExprIf, depth: usize) -> syn::Result<()> {
        let indent = "    ".repeat(depth);
        let cond = self.expr(&i.cond, Some(Scalar::Bool))?;
        self.body.push_str(&format!(
            "{indent}if ({}) {{
",
            cond.code
        ));
        self.statements(&i.then_branch.stmts, depth + 1)?;
        match i.else_branch.as_ref().map(|(_, e)| &**e) {
            None => self.body.push_str(&format!(
                "{indent}}}
"
            )),
            Some(Expr::Block(b)) => {
                self.body.push_str(&format!(
                    "{indent}}} else {{
"
                ));
                self.statements(&b.block.stmts, depth + 1)?;
                self.body.push_str(&format!(
                    "{indent}}}
"
                ));
            }
            Some(Expr::If(nested)) => {
                self.body.push_str(&format!(
                    "{indent}}} else {{
"
                ));
                self.if_stmt(nested, depth + 1)?;
                self.body.push_str(&format!(
                    "{indent}}}
"
                ));
            }
            Some(other) => return err(other.span(), "`else` takes a block"),
        }
        Ok(())
    }

    fn expr(&mut self, e: &Expr, want: Option<Scalar>) -> syn::Result<Value> {
        let v = self.expr_inner(e, want)?;
        match (want, v.ty) {
            (Some(w), Some(t)) if w != t => err(
                e.span(),
                format!(
                    "expected {}, found {} (convert with `as {}`)",
                    w.rust(),
                    t.rust(),
                    w.rust()
                ),
            ),
            (Some(w), None) => Ok(literal_as(&v.code, w, e.span())?),
            _ => Ok(v),
        }
    }

    fn expr_inner(&mut self, e: &Expr, want: Option<Scalar>) -> syn::Result<Value> {
        match e {
            Expr::Lit(l) => literal(&l.lit),
            // Every operator's translation is parenthesised already.
            Expr::Paren(p) => self.expr(&p.expr, want),
            Expr::Group(g) => self.expr(&g.expr, want),
            Expr::Path(p) => self.path(p),
            Expr::Unary(u) => {
                let v = self.expr(&u.expr, want)?;
                match (&u.op, v.ty) {
                    (UnOp::Neg(_), Some(Scalar::F32 | Scalar::F64) | None) => Ok(Value {
                        code: format!("(-{})", v.code),
                        ty: v.ty,
                    }),
                    (UnOp::Not(_), Some(Scalar::Bool)) => Ok(Value {
                        code: format!("(!{})", v.code),
                        ty: v.ty,
                    }),
                    (UnOp::Neg(_), _) => {
                        err(u.span(), "`-` applies to f32 or f64 (a u32 has no sign)")
                    }
                    (UnOp::Not(_), _) => err(u.span(), "`!` applies to a bool here"),
                    _ => err(
                        u.span(),
                        "`*` is not in the op subset (there are no references)",
                    ),
                }
            }
            Expr::Binary(b) => self.binary(b, want),
            Expr::Cast(c) => {
                let to = scalar_type(&c.ty, false)?;
                let v = self.expr(&c.expr, None)?;
                let from = match v.ty {
                    Some(t) => t,
                    None => {
                        // An unsuffixed literal cast: Rust takes it as f64.
                        return literal_as(&v.code, Scalar::F64, c.expr.span())
                            .and_then(|v| cast(v, to, c.span()));
                    }
                };
                if from == Scalar::Bool {
                    return err(
                        c.expr.span(),
                        "a bool cannot be cast in the op subset: use `if`",
                    );
                }
                cast(
                    Value {
                        code: v.code,
                        ty: Some(from),
                    },
                    to,
                    c.span(),
                )
            }
            Expr::If(i) => self.if_expr(i, want),
            Expr::Block(b) if b.label.is_none() => {
                let cond_free = self.temps;
                self.temps += 1;
                let ty = want.ok_or_else(|| {
                    syn::Error::new(
                        b.span(),
                        "a block's type must be clear from where it is used",
                    )
                })?;
                let saved = std::mem::take(&mut self.body);
                self.in_value += 1;
                let v = self.block(&b.block.stmts, b.span(), Some(ty), 2);
                self.in_value -= 1;
                let v = v?;
                let inner = std::mem::replace(&mut self.body, saved);
                let _ = cond_free;
                Ok(Value {
                    code: format!(
                        "[&]() -> {} {{\n{inner}        return {};\n    }}()",
                        ty.cuda(),
                        v.code
                    ),
                    ty: Some(ty),
                })
            }
            Expr::MethodCall(m) => {
                if m.turbofish.is_some() {
                    return err(m.span(), "method calls take no type arguments here");
                }
                // A table's methods give a type of their own: its name is typed alone.
                let table = matches!(&*m.receiver, Expr::Path(p)
                    if p.path.get_ident().is_some_and(|i| self.lookup(&i.to_string()) == Some(Scalar::Table)));
                let recv = self.expr(&m.receiver, if table { None } else { want })?;
                let args: Vec<&Expr> = m.args.iter().collect();
                self.method(
                    &m.method.to_string(),
                    m.method.span(),
                    recv,
                    &args,
                    m.span(),
                )
            }
            Expr::Call(c) => {
                let mut func = &*c.func;
                while let Expr::Paren(p) = func {
                    func = &p.expr;
                }
                if matches!(func, Expr::Closure(_)) {
                    return err(func.span(), "closures are not in the op subset");
                }
                // `f32::exp(x)`: a method called by its path.
                if let Expr::Path(p) = &*c.func
                    && p.qself.is_none()
                    && p.path.segments.len() >= 2
                {
                    let segs: Vec<String> = p
                        .path
                        .segments
                        .iter()
                        .map(|s| s.ident.to_string())
                        .collect();
                    let ty = match segs[segs.len() - 2].as_str() {
                        "f32" => Some(Scalar::F32),
                        "f64" => Some(Scalar::F64),
                        _ => None,
                    };
                    if let Some(ty) = ty
                        && !c.args.is_empty()
                    {
                        let recv = self.expr(&c.args[0], Some(ty))?;
                        let rest: Vec<&Expr> = c.args.iter().skip(1).collect();
                        return self.method(&segs[segs.len() - 1], p.span(), recv, &rest, c.span());
                    }
                }
                err(
                    c.span(),
                    format!(
                        "only the f32/f64 math functions can be called here (`x.exp()` or `f32::exp(x)`); {ALLOWED}"
                    ),
                )
            }
            Expr::Return(r) => err(
                r.span(),
                "an op ends with its value as the last expression, not `return`",
            ),
            Expr::Loop(_) | Expr::While(_) | Expr::ForLoop(_) => err(
                e.span(),
                format!(
                    "`loop` and `while` are not in the op subset, and a `for` is a statement, not a value: loops run over u32 ranges, `for j in 0..n {{ ... }}`; {ALLOWED}"
                ),
            ),
            Expr::Closure(_) => err(e.span(), "closures are not in the op subset"),
            Expr::Reference(_) => err(
                e.span(),
                "references are not in the op subset: values are scalars",
            ),
            Expr::Macro(_) => err(
                e.span(),
                "macros are not in the op subset (the body is translated to CUDA)",
            ),
            Expr::Match(_) => err(e.span(), "`match` is not in the op subset: use `if`/`else`"),
            Expr::Assign(_) => err(
                e.span(),
                "assignment is not in the op subset: bind a new name with `let`",
            ),
            Expr::Field(f) => self.field(f),
            Expr::Struct(st) => self.state_literal(st, want),
            Expr::Index(ix) => {
                let (code, elem, _) = self.element(ix)?;
                Ok(Value {
                    code,
                    ty: Some(elem),
                })
            }
            Expr::Array(_) | Expr::Repeat(_) => err(
                e.span(),
                "an array is bound by `let` (`let mut a = [0.0_f64; 8];`) and used element by \
                 element: it is not a value of its own",
            ),
            Expr::Tuple(_) => err(
                e.span(),
                "tuples are not in the op subset (a state's fields are read as `s.field`)",
            ),
            _ => err(e.span(), format!("not in the op subset; {ALLOWED}")),
        }
    }

    /// `s.field` of a state.
    fn field(&mut self, f: &syn::ExprField) -> syn::Result<Value> {
        let base = self.expr(&f.base, None)?;
        let Some(Scalar::State(st)) = base.ty else {
            return err(
                f.base.span(),
                "only a state (`#[derive(pptm::State)]`) has fields here",
            );
        };
        let syn::Member::Named(name) = &f.member else {
            return err(f.member.span(), "a state's fields have names");
        };
        let Some(&(field, ty)) = st.fields.iter().find(|(n, _)| name == n) else {
            return err(
                name.span(),
                format!(
                    "`{}` has no field `{name}` (its fields: {})",
                    st.name,
                    st.fields.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                ),
            );
        };
        Ok(Value {
            code: format!("{}.{field}", base.code),
            ty: Some(ty),
        })
    }

    /// `Geo { c: .., v: .., ..s }`: a state from its fields (the rest from another state).
    fn state_literal(&mut self, e: &syn::ExprStruct, want: Option<Scalar>) -> syn::Result<Value> {
        let st = match e.path.get_ident() {
            Some(id) if e.qself.is_none() => self.states.iter().copied().find(|st| *id == st.name),
            _ => None,
        };
        let Some(st) = st else {
            return err(
                e.path.span(),
                "only a state (a struct of this crate with `#[derive(pptm::State)]`) can be built here",
            );
        };
        if let Some(w) = want
            && w != Scalar::State(st)
        {
            return err(
                e.span(),
                format!("expected {}, found the state {}", w.rust(), st.name),
            );
        }
        let mut sets = String::new();
        let mut given: Vec<&str> = Vec::new();
        for fv in &e.fields {
            let syn::Member::Named(name) = &fv.member else {
                return err(fv.member.span(), "a state's fields have names");
            };
            let Some(&(field, ty)) = st.fields.iter().find(|(n, _)| name == n) else {
                return err(name.span(), format!("`{}` has no field `{name}`", st.name));
            };
            if given.contains(&field) {
                return err(name.span(), format!("`{field}` is given twice"));
            }
            given.push(field);
            let v = self.expr(&fv.expr, Some(ty))?;
            sets.push_str(&format!(" pptm_s.{field} = {};", v.code));
        }
        let start = match &e.rest {
            Some(rest) => self.expr(rest, Some(Scalar::State(st)))?.code,
            None => {
                if let Some(missing) = st.fields.iter().find(|(n, _)| !given.contains(n)) {
                    return err(
                        e.span(),
                        format!(
                            "`{}` needs every field: `{}` is missing (or take the rest from \
                             another state with `..s`)",
                            st.name, missing.0
                        ),
                    );
                }
                format!("{}{{}}", st.cuda)
            }
        };
        Ok(Value {
            code: format!(
                "[&]() -> {t} {{ {t} pptm_s = {start};{sets} return pptm_s; }}()",
                t = st.cuda
            ),
            ty: Some(Scalar::State(st)),
        })
    }

    fn path(&self, p: &syn::ExprPath) -> syn::Result<Value> {
        if p.qself.is_some() {
            return err(p.span(), "qualified paths are not in the op subset");
        }
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        if segs.len() == 1 {
            return match self.lookup(&segs[0]) {
                Some(Scalar::Array(_)) => err(
                    p.span(),
                    format!(
                        "`{0}` is an array: it is read element by element, `{0}[k]`",
                        segs[0]
                    ),
                ),
                Some(ty) => Ok(Value {
                    code: segs[0].clone(),
                    ty: Some(ty),
                }),
                None => err(
                    p.span(),
                    format!(
                        "`{}` is neither a parameter nor a `let` binding of this op",
                        segs[0]
                    ),
                ),
            };
        }
        // f32::consts::PI, std::f64::consts::E, core::f32::consts::LN_2, f32::MAX, ...
        let tail: Vec<&str> = segs
            .iter()
            .map(String::as_str)
            .skip_while(|s| *s == "std" || *s == "core")
            .collect();
        let (ty, rest) = match tail.split_first() {
            Some((&"f32", rest)) => (Scalar::F32, rest),
            Some((&"f64", rest)) => (Scalar::F64, rest),
            _ => {
                return err(
                    p.span(),
                    "only parameters, `let` bindings and f32/f64 constants can be named here",
                );
            }
        };
        let name = match rest {
            [c] | ["consts", c] => *c,
            _ => return err(p.span(), "not an f32/f64 constant"),
        };
        let value: f64 = match name {
            "PI" => std::f64::consts::PI,
            "TAU" => std::f64::consts::TAU,
            "E" => std::f64::consts::E,
            "SQRT_2" => std::f64::consts::SQRT_2,
            "FRAC_1_SQRT_2" => std::f64::consts::FRAC_1_SQRT_2,
            "LN_2" => std::f64::consts::LN_2,
            "LN_10" => std::f64::consts::LN_10,
            "LOG2_E" => std::f64::consts::LOG2_E,
            "LOG10_E" => std::f64::consts::LOG10_E,
            "FRAC_PI_2" => std::f64::consts::FRAC_PI_2,
            "FRAC_2_SQRT_PI" => std::f64::consts::FRAC_2_SQRT_PI,
            "MAX" | "MIN" | "EPSILON" | "MIN_POSITIVE" | "INFINITY" | "NEG_INFINITY" | "NAN" => {
                return Ok(limit(ty, name));
            }
            other => {
                return err(
                    p.span(),
                    format!("`{other}` is not a constant the op subset knows"),
                );
            }
        };
        Ok(match ty {
            Scalar::F32 => Value {
                code: float_text(f64::from(value as f32), Scalar::F32),
                ty: Some(Scalar::F32),
            },
            _ => Value {
                code: float_text(value, Scalar::F64),
                ty: Some(Scalar::F64),
            },
        })
    }

    fn binary(&mut self, b: &syn::ExprBinary, want: Option<Scalar>) -> syn::Result<Value> {
        let (sym, kind) = match b.op {
            BinOp::Add(_) => ("+", Kind::Arith),
            BinOp::Sub(_) => ("-", Kind::Arith),
            BinOp::Mul(_) => ("*", Kind::Arith),
            BinOp::Div(_) => ("/", Kind::Arith),
            BinOp::Rem(_) => ("%", Kind::Arith),
            BinOp::Lt(_) => ("<", Kind::Compare),
            BinOp::Le(_) => ("<=", Kind::Compare),
            BinOp::Gt(_) => (">", Kind::Compare),
            BinOp::Ge(_) => (">=", Kind::Compare),
            BinOp::Eq(_) => ("==", Kind::Compare),
            BinOp::Ne(_) => ("!=", Kind::Compare),
            BinOp::And(_) => ("&&", Kind::Logic),
            BinOp::Or(_) => ("||", Kind::Logic),
            _ => {
                return err(
                    b.op.span(),
                    format!(
                        "`{}` is not in the op subset; {ALLOWED}",
                        quote::ToTokens::to_token_stream(&b.op)
                    ),
                );
            }
        };
        match kind {
            Kind::Logic => {
                let l = self.expr(&b.left, Some(Scalar::Bool))?;
                let r = self.expr(&b.right, Some(Scalar::Bool))?;
                Ok(Value {
                    code: format!("({} {sym} {})", l.code, r.code),
                    ty: Some(Scalar::Bool),
                })
            }
            Kind::Arith | Kind::Compare => {
                let hint = if kind == Kind::Arith { want } else { None };
                // Type the operands: a typed side gives an untyped literal its type.
                let mut l = self.expr(&b.left, hint)?;
                let mut r = self.expr(&b.right, l.ty.or(hint))?;
                if let (None, Some(rt)) = (l.ty, r.ty) {
                    l = literal_as(&l.code, rt, b.left.span())?;
                }
                if l.ty.is_none() && r.ty.is_none() {
                    let ty = hint.unwrap_or(Scalar::F64);
                    l = literal_as(&l.code, ty, b.left.span())?;
                    r = literal_as(&r.code, ty, b.right.span())?;
                }
                let ty = l.ty.expect("typed");
                if r.ty != Some(ty) {
                    return err(
                        b.span(),
                        format!(
                            "`{sym}` between {} and {}: convert one side with `as`",
                            ty.rust(),
                            r.ty.map_or("a literal", Scalar::rust)
                        ),
                    );
                }
                if ty == Scalar::Bool {
                    return err(b.span(), format!("`{sym}` does not apply to bools"));
                }
                if ty == Scalar::Table {
                    return err(
                        b.span(),
                        format!(
                            "`{sym}` does not apply to a table: read it with `.at(i, j)` or `.bilinear(x, y)`"
                        ),
                    );
                }
                if let Scalar::State(st) = ty {
                    return err(
                        b.span(),
                        format!(
                            "`{sym}` does not apply to a state ({}): work on its fields, and \
                             build the result with `{} {{ field: value, .. }}`",
                            st.name, st.name
                        ),
                    );
                }
                let code = match (sym, ty) {
                    ("%", Scalar::F32) => format!("fmodf({}, {})", l.code, r.code),
                    ("%", Scalar::F64) => format!("fmod({}, {})", l.code, r.code),
                    _ => format!("({} {sym} {})", l.code, r.code),
                };
                Ok(Value {
                    code,
                    ty: Some(if kind == Kind::Compare {
                        Scalar::Bool
                    } else {
                        ty
                    }),
                })
            }
        }
    }

    fn if_expr(&mut self, i: &syn::ExprIf, want: Option<Scalar>) -> syn::Result<Value> {
        let cond = self.expr(&i.cond, Some(Scalar::Bool))?;
        let Some((_, else_branch)) = &i.else_branch else {
            return err(
                i.span(),
                "an `if` in an op gives a value: it needs an `else`",
            );
        };
        // Each branch in a lambda when it has statements; a plain expression otherwise.
        let then = self.branch(&i.then_branch.stmts, i.then_branch.span(), want)?;
        let ty = want.or(then.ty);
        let other = match &**else_branch {
            Expr::Block(b) => self.branch(&b.block.stmts, b.span(), ty)?,
            Expr::If(nested) => self.if_expr(nested, ty)?,
            other => return err(other.span(), "`else` takes a block"),
        };
        let ty = ty.or(other.ty);
        let (then, other) = match ty {
            Some(t) => (
                if then.ty.is_none() {
                    literal_as(&then.code, t, i.then_branch.span())?
                } else {
                    then
                },
                if other.ty.is_none() {
                    literal_as(&other.code, t, else_branch.span())?
                } else {
                    other
                },
            ),
            None => {
                return err(
                    i.span(),
                    "give the branches' literals a type, e.g. `1.0_f32`",
                );
            }
        };
        if then.ty != other.ty {
            return err(i.span(), "both branches of an `if` have the same type");
        }
        Ok(Value {
            code: format!("({} ? {} : {})", cond.code, then.code, other.code),
            ty: then.ty,
        })
    }

    fn branch(&mut self, stmts: &[Stmt], span: Span, want: Option<Scalar>) -> syn::Result<Value> {
        if let [Stmt::Expr(e, None)] = stmts {
            return self.expr(e, want);
        }
        let ty = want.ok_or_else(|| {
            syn::Error::new(
                span,
                "a branch with `let`s needs a type clear from where the `if` is used",
            )
        })?;
        let saved = std::mem::take(&mut self.body);
        self.in_value += 1;
        let v = self.block(stmts, span, Some(ty), 2);
        self.in_value -= 1;
        let v = v?;
        let inner = std::mem::replace(&mut self.body, saved);
        Ok(Value {
            code: format!(
                "[&]() -> {} {{\n{inner}        return {};\n    }}()",
                ty.cuda(),
                v.code
            ),
            ty: Some(ty),
        })
    }

    /// `t.at(i, j)`, `t.bilinear(x, y)`, `t.rows()`, `t.cols()` of a table.
    fn table_method(
        &mut self,
        name: &str,
        name_span: Span,
        recv: Value,
        args: &[&Expr],
        span: Span,
    ) -> syn::Result<Value> {
        let arity = match name {
            "at" | "bilinear" => 2,
            "rows" | "cols" => 0,
            _ => {
                return err(
                    name_span,
                    format!(
                        "a table has `at(i, j)`, `bilinear(x, y)`, `rows()` and `cols()`, not `{name}`"
                    ),
                );
            }
        };
        if args.len() != arity {
            return err(span, format!("`{name}` takes {arity} argument(s)"));
        }
        let t = recv.code;
        Ok(match name {
            "at" => {
                let i = self.expr(args[0], Some(Scalar::U32))?;
                let j = self.expr(args[1], Some(Scalar::U32))?;
                let ty = if self.narrow {
                    Scalar::F32
                } else {
                    Scalar::F64
                };
                Value {
                    code: format!("pptm_table_at<{}>({t}, {}, {})", ty.cuda(), i.code, j.code),
                    ty: Some(ty),
                }
            }
            "bilinear" => {
                let x = self.expr(args[0], None)?;
                let ty = match x.ty {
                    Some(t @ (Scalar::F32 | Scalar::F64)) => t,
                    _ => {
                        return err(
                            args[0].span(),
                            "`bilinear` takes f32 or f64 coordinates (a literal needs a suffix)",
                        );
                    }
                };
                let y = self.expr(args[1], Some(ty))?;
                Value {
                    code: format!(
                        "pptm_table_bilinear<{}>({t}, {}, {})",
                        ty.cuda(),
                        x.code,
                        y.code
                    ),
                    ty: Some(ty),
                }
            }
            _ => Value {
                code: format!("pptm_table_{name}({t})"),
                ty: Some(Scalar::U32),
            },
        })
    }

    fn method(
        &mut self,
        name: &str,
        name_span: Span,
        recv: Value,
        args: &[&Expr],
        span: Span,
    ) -> syn::Result<Value> {
        if recv.ty == Some(Scalar::Table) {
            return self.table_method(name, name_span, recv, args, span);
        }
        let Some(&(_, arity, f32_fn, f64_fn)) = METHODS.iter().find(|m| m.0 == name) else {
            return err(
                name_span,
                format!(
                    "`{name}` is not one of the op subset's math methods ({})",
                    METHODS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
                ),
            );
        };
        let ty = match recv.ty {
            Some(t @ (Scalar::F32 | Scalar::F64)) => t,
            Some(other) => {
                return err(
                    span,
                    format!("`{name}` is a method of f32 and f64, not {}", other.rust()),
                );
            }
            None => {
                return err(
                    span,
                    "give the literal a type to call a method on it, e.g. `2.0_f32.sqrt()`",
                );
            }
        };
        if args.len() != arity {
            return err(
                span,
                format!("`{name}` takes {arity} argument(s) besides the value"),
            );
        }
        let mut codes = vec![recv.code];
        for (k, a) in args.iter().enumerate() {
            let want = if name == "powi" { None } else { Some(ty) };
            if name == "powi" {
                let v = self.expr(a, None)?;
                if v.ty.is_some() || v.code.contains('.') {
                    return err(
                        a.span(),
                        "`powi` takes an integer literal power here, e.g. `x.powi(3)`",
                    );
                }
                codes.push(v.code);
                let _ = k;
                continue;
            }
            codes.push(self.expr(a, want)?.code);
        }
        let code = match name {
            "recip" => format!("({} / {})", float_text(1.0, ty), codes[0]),
            // Rust's clamp(min, max): max(min(x, max), min) for in-order bounds.
            "clamp" => format!("pptm_user_clamp({}, {}, {})", codes[0], codes[1], codes[2]),
            _ => {
                let f = if ty == Scalar::F32 { f32_fn } else { f64_fn };
                format!("{f}({})", codes.join(", "))
            }
        };
        Ok(Value { code, ty: Some(ty) })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Arith,
    Compare,
    Logic,
}

fn literal(l: &Lit) -> syn::Result<Value> {
    match l {
        Lit::Float(f) => {
            let v: f64 = f.base10_parse()?;
            match f.suffix() {
                "f32" => f32_literal(v, f.span()),
                "f64" => Ok(Value {
                    code: float_text(v, Scalar::F64),
                    ty: Some(Scalar::F64),
                }),
                "" => Ok(Value {
                    code: format!("{v:?}"),
                    ty: None,
                }),
                other => err(
                    f.span(),
                    format!("a float literal is f32 or f64, not `{other}`"),
                ),
            }
        }
        Lit::Int(i) => match i.suffix() {
            "u32" => Ok(Value {
                code: format!("{}u", i.base10_parse::<u32>()?),
                ty: Some(Scalar::U32),
            }),
            "f32" => f32_literal(i.base10_parse::<f64>()?, i.span()),
            "f64" => Ok(Value {
                code: float_text(i.base10_parse::<f64>()?, Scalar::F64),
                ty: Some(Scalar::F64),
            }),
            // An unsuffixed integer: a literal that takes its type from what it meets (a float
            // operand needs Rust's `2.0`, which the CPU reference would not compile otherwise;
            // the u32 side is checked by rustc itself).
            "" => Ok(Value {
                code: i.base10_digits().to_string(),
                ty: None,
            }),
            other => err(
                i.span(),
                format!("an integer literal here is u32, not `{other}`"),
            ),
        },
        Lit::Bool(b) => Ok(Value {
            code: b.value.to_string(),
            ty: Some(Scalar::Bool),
        }),
        other => err(
            other.span(),
            "only number and bool literals are in the op subset",
        ),
    }
}

/// An untyped literal given type `ty`.
fn literal_as(code: &str, ty: Scalar, span: Span) -> syn::Result<Value> {
    let v: f64 = code
        .parse()
        .map_err(|_| syn::Error::new(span, "expected a literal"))?;
    match ty {
        Scalar::F32 => f32_literal(v, span),
        Scalar::F64 => Ok(Value {
            code: float_text(v, Scalar::F64),
            ty: Some(ty),
        }),
        Scalar::U32
            if v >= 0.0 && v <= f64::from(u32::MAX) && v.fract() == 0.0 && !code.contains('.') =>
        {
            Ok(Value {
                code: format!("{}u", v as u64),
                ty: Some(ty),
            })
        }
        Scalar::U32 => err(span, "not a u32 literal"),
        Scalar::Bool => err(span, "expected a bool"),
        Scalar::State(st) => err(
            span,
            format!("expected the state {}, found a number", st.name),
        ),
        Scalar::Table => err(span, "expected a table, found a number"),
        Scalar::Array(_) => err(span, "expected an array, found a number"),
    }
}

/// A literal of value `v` as an f32: refused where it does not fit, as Rust refuses such an f32
/// literal (what an f64 literal becomes in an op's f32 form, `f32_form`).
fn f32_literal(v: f64, span: Span) -> syn::Result<Value> {
    let narrow = v as f32;
    if v.is_finite() && narrow.is_infinite() {
        return err(span, format!("{v:e} does not fit an f32"));
    }
    Ok(Value {
        code: float_text(f64::from(narrow), Scalar::F32),
        ty: Some(Scalar::F32),
    })
}

/// A float as CUDA source that reads back to exactly `v` in `ty`.
fn float_text(v: f64, ty: Scalar) -> String {
    if v.is_nan() {
        // The quiet NaN Rust's `f32::NAN` and `f64::NAN` are.
        return if ty == Scalar::F32 {
            "__int_as_float(0x7fc00000)".to_string()
        } else {
            "__longlong_as_double(0x7ff8000000000000ll)".to_string()
        };
    }
    if v.is_infinite() {
        let inf = if ty == Scalar::F32 {
            "__int_as_float(0x7f800000)"
        } else {
            "__longlong_as_double(0x7ff0000000000000ll)"
        };
        return if v > 0.0 {
            inf.to_string()
        } else {
            format!("(-{inf})")
        };
    }
    match ty {
        Scalar::F32 => {
            let s = format!("{:?}", v as f32);
            let s = if s.contains(['.', 'e', 'E']) {
                s
            } else {
                format!("{s}.0")
            };
            format!("{s}f")
        }
        _ => {
            let s = format!("{v:?}");
            if s.contains(['.', 'e', 'E']) {
                s
            } else {
                format!("{s}.0")
            }
        }
    }
}

fn limit(ty: Scalar, name: &str) -> Value {
    let v = match (ty, name) {
        (Scalar::F32, "MAX") => f64::from(f32::MAX),
        (Scalar::F32, "MIN") => f64::from(f32::MIN),
        (Scalar::F32, "EPSILON") => f64::from(f32::EPSILON),
        (Scalar::F32, "MIN_POSITIVE") => f64::from(f32::MIN_POSITIVE),
        (_, "MAX") => f64::MAX,
        (_, "MIN") => f64::MIN,
        (_, "EPSILON") => f64::EPSILON,
        (_, "MIN_POSITIVE") => f64::MIN_POSITIVE,
        (_, "INFINITY") => f64::INFINITY,
        (_, "NAN") => f64::NAN,
        _ => f64::NEG_INFINITY,
    };
    Value {
        code: float_text(v, ty),
        ty: Some(ty),
    }
}

fn cast(v: Value, to: Scalar, span: Span) -> syn::Result<Value> {
    let from = v.ty.expect("typed");
    if let Scalar::State(st) = from {
        return err(
            span,
            format!("a state ({}) cannot be cast: cast its fields", st.name),
        );
    }
    if from == Scalar::Table {
        return err(span, "a table cannot be cast: cast what it reads");
    }
    let code = match (from, to) {
        (a, b) if a == b => v.code,
        (Scalar::F32 | Scalar::F64, Scalar::U32) => format!("pptm_user_to_u32({})", v.code),
        (_, Scalar::Bool) => return err(span, "cannot cast to bool"),
        (_, to) => format!("(({}){})", to.cuda(), v.code),
    };
    Ok(Value { code, ty: Some(to) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(src: &str) -> syn::Result<OpFn> {
        parse_op_fn(&syn::parse_str::<ItemFn>(src)?)
    }

    #[test]
    fn swish_huber_and_friends_translate() {
        let swish =
            translate("fn swish(x: f32, beta: f32) -> f32 { x / (1.0 + (-beta * x).exp()) }")
                .unwrap();
        assert_eq!(swish.device, "pptm_user_swish");
        assert_eq!(
            swish.params,
            vec![("x".into(), Scalar::F32), ("beta".into(), Scalar::F32)]
        );
        assert!(
            swish
                .cuda
                .contains("__device__ __forceinline__ float pptm_user_swish(float x, float beta)"),
            "{}",
            swish.cuda
        );
        assert!(
            swish
                .cuda
                .contains("return (x / (1.0f + expf(((-beta) * x))));"),
            "{}",
            swish.cuda
        );

        let huber = translate(
            "fn huber(r: f64, delta: f32) -> f64 {
                 let a = r.abs();
                 let d = delta as f64;
                 if a <= d { 0.5 * r * r } else { d * (a - 0.5 * d) }
             }",
        )
        .unwrap();
        let c = &huber.cuda;
        assert!(c.contains("const double a = fabs(r);"), "{c}");
        assert!(c.contains("const double d = ((double)delta);"), "{c}");
        assert!(
            c.contains("return ((a <= d) ? ((0.5 * r) * r) : (d * (a - (0.5 * d))));"),
            "{c}"
        );

        let consts = translate(
            "fn g(x: f32) -> f32 { let k = (2.0_f32 / std::f32::consts::PI).sqrt(); 0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh()) }",
        )
        .unwrap();
        assert!(
            consts.cuda.contains("pptm_user_powi(x, 3)"),
            "{}",
            consts.cuda
        );
        assert!(consts.cuda.contains("3.1415927f"), "{}", consts.cuda);

        let branches = translate(
            "fn relu6(x: f32) -> f32 { if x < 0.0 { 0.0 } else if x > 6.0 { let s = 6.0_f32; s } else { x } }",
        )
        .unwrap();
        assert!(
            branches.cuda.contains("[&]() -> float {"),
            "{}",
            branches.cuda
        );
        let casts = translate("fn q(x: f32, levels: u32) -> f32 { let k = (x * levels as f32) as u32; k as f32 / levels as f32 }").unwrap();
        assert!(casts.cuda.contains("pptm_user_to_u32("), "{}", casts.cuda);
        assert!(
            casts.cuda.contains("const unsigned int k ="),
            "{}",
            casts.cuda
        );
        let methods = translate("fn m(x: f64, y: f64) -> f64 { f64::max(x.mul_add(y, 1.0), x.clamp(-1.0, 1.0).recip()) }").unwrap();
        assert!(
            methods
                .cuda
                .contains("fmax(fma(x, y, 1.0), (1.0 / pptm_user_clamp(x, (-1.0), 1.0)))"),
            "{}",
            methods.cuda
        );
    }

    #[test]
    fn loops_and_assignments_translate_to_statements() {
        let op = translate(
            "fn f(x: f32, n: u32) -> f32 {
                 let mut total = 0.0_f32;
                 for j in 0..n {
                     let w = j as f32;
                     if w < x { total += w; } else if w > 10.0_f32 { total -= 1.0_f32; }
                 }
                 total *= 2.0_f32;
                 total
             }",
        )
        .unwrap();
        for needle in [
            "float total = 0.0f;",
            "const unsigned int pptm_end_0 = n;",
            "for (unsigned int j = 0u; j < pptm_end_0; ++j) {",
            "const float w = ((float)j);",
            "total += w;",
            "} else {",
            "total -= 1.0f;",
            "total *= 2.0f;",
            "return total;",
        ] {
            assert!(op.cuda.contains(needle), "no `{needle}` in\n{}", op.cuda);
        }
    }

    #[test]
    fn local_arrays_translate() {
        let op = translate(
            "fn fit(x: f64, t: Table) -> f64 {
                 let mut m = [0.0_f64; 9];
                 let w: [f64; 3] = [1.0, 2.0, 3.0];
                 let mut at = [0_u32; 2];
                 for k in 0..3 {
                     m[k * 4] += w[k] * x;
                 }
                 at[1] = 2;
                 m[at[1]] + w[0] + t.at(at[0], 0)
             }",
        )
        .unwrap();
        for needle in [
            "double m[9];",
            "const double pptm_fill_",
            "for (unsigned int pptm_k = 0u; pptm_k < 9u; ++pptm_k) m[pptm_k] = pptm_fill_",
            "double w[3] = {1.0, 2.0, 3.0};",
            "unsigned int at[2];",
            "m[min((k * 4u), 8u)] += (w[min(k, 2u)] * x);",
            "at[min(1u, 1u)] = 2u;",
            "m[min(at[min(1u, 1u)], 8u)]",
        ] {
            assert!(op.cuda.contains(needle), "no `{needle}` in\n{}", op.cuda);
        }
        // The f32 form narrows the elements.
        let f = parse_op_fn_as(
            &narrowed(
                &syn::parse_str::<ItemFn>(
                    "fn g(x: f64) -> f64 { let a: [f64; 2] = [x, 0.5]; a[0] * a[1] }",
                )
                .unwrap(),
            ),
            USER_PREFIX,
            &[],
            true,
        )
        .unwrap();
        assert!(f.cuda.contains("float a[2] = {x, 0.5f};"), "{}", f.cuda);
    }

    #[test]
    fn what_the_subset_refuses_is_an_error_that_says_so() {
        for (src, needle) in [
            (
                "fn f(x: f32) -> f32 { let a = [x; 0]; a[0] }",
                "integer literal from 1 to 1024",
            ),
            (
                "fn f(x: f32, n: u32) -> f32 { let a = [x; n]; a[0] }",
                "integer literal from 1 to 1024",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [x; 2000]; a[0] }",
                "integer literal from 1 to 1024",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [1.0_f32, 2.0_f64]; a[0] }",
                "expected f32",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [1.0; 4]; a[0] }",
                "give the elements a type",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [x; 4]; a + x }",
                "read element by element",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [x; 4]; let b = a; x }",
                "read element by element",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [x; 4]; a[1] = x; a[0] }",
                "not `let mut`",
            ),
            (
                "fn f(x: f32) -> f32 { let mut a = [x; 4]; a = [x; 4]; a[0] }",
                "assign its elements",
            ),
            (
                "fn f(x: f32) -> f32 { let a = [x; 4]; a[x] }",
                "expected u32",
            ),
            ("fn f(x: f32) -> f32 { x[0] }", "not a local array"),
            (
                "fn f(x: f32) -> f32 { let a = [true; 2]; x }",
                "f32, f64 or u32 values",
            ),
            (
                "fn f(x: f32) -> f32 { if x > 0.0_f32 { let a = [x; 2]; a[0] } else { x } }",
                "not inside a block that gives a value",
            ),
            (
                "fn f(x: f32) -> f32 { let a: [f32; 3] = [x; 2]; a[0] }",
                "the type says 3",
            ),
            ("fn f(a: [f32; 4]) -> f32 { a[0] }", "f32, f64, u32"),
            (
                "fn f(x: f32) -> f32 { [x; 2][0] }",
                "only a local array is indexed",
            ),
            (
                "fn f(x: f32) -> f32 { let y = [x; 2]; x + [x; 2].len() as f32 }",
                "bound by `let`",
            ),
            ("fn f<T>(x: f32) -> f32 { x }", "cannot be generic"),
            ("unsafe fn f(x: f32) -> f32 { x }", "not `unsafe fn`"),
            ("fn f(x: &f32) -> f32 { *x }", "f32, f64, u32"),
            ("fn f(x: i32) -> f32 { 1.0 }", "f32, f64, u32"),
            (
                "fn f(n: u32) -> f32 { 1.0 }",
                "first parameter is the value",
            ),
            ("fn f() -> f32 { 1.0 }", "at least its input"),
            ("fn f(x: f32) { }", "returns its value"),
            ("fn f(x: f32) -> u32 { 1 }", "returns f32, f64 or a state"),
            ("fn f((a, b): (f32, f32)) -> f32 { a }", "plain name"),
            (
                "fn f(x: f32) -> f32 { let y = x; y = 2.0_f32; y }",
                "not `let mut`",
            ),
            ("fn f(x: f32) -> f32 { x = 2.0_f32; x }", "not `let mut`"),
            (
                "fn f(x: f32) -> f32 { let mut y = x; y += 1.0_f64; y }",
                "expected f32",
            ),
            (
                "fn f(x: f32) -> f32 { let mut y = x; y %= 2.0_f32; y }",
                "compound assignments",
            ),
            (
                "fn f(x: f32) -> f32 { let mut y = x; if x > 0.0_f32 { y += 1.0_f32; y } else { y } }",
                "a block that gives a value",
            ),
            (
                "fn f(x: f32) -> f32 { let y: f32 = { let mut z = x; z }; y }",
                "a block that gives a value",
            ),
            (
                "fn f(x: f32) -> f32 { for j in 0..=3 { } x }",
                "half-open range",
            ),
            (
                "fn f(x: f32) -> f32 { for j in 0..x { } x }",
                "expected u32",
            ),
            ("fn f(x: f32) -> f32 { 'a: for j in 0..3 { } x }", "labels"),
            (
                "fn f(x: f32) -> f32 { let mut y = x; for j in 0..3 { j = 1; } y }",
                "not `let mut`",
            ),
            (
                "fn f(x: f32) -> f32 { let mut y = x; for j in 0..3 { y += 1.0_f32; } }",
                "must end with the op's value",
            ),
            (
                "fn f(x: f32) -> f32 { let c = 0.5; x * c }",
                "give this literal a type",
            ),
            ("fn f(x: f32) -> f32 { return x; }", "not `return`"),
            (
                "fn f(x: f32) -> f32 { while x > 0.0_f32 { } x }",
                "has no effect",
            ),
            (
                "fn f(x: f32) -> f32 { loop { } }",
                "`loop` and `while` are not in the op subset",
            ),
            (
                "fn f(x: f32) -> f32 { println!(\"{x}\"); x }",
                "macros are not",
            ),
            (
                "fn f(x: f32) -> f32 { (x, x).0 }",
                "tuples are not in the op subset",
            ),
            (
                "fn f(x: f32) -> f32 { x.signum() }",
                "not one of the op subset's math methods",
            ),
            (
                "fn f(x: f32) -> f32 { y }",
                "neither a parameter nor a `let` binding",
            ),
            (
                "fn f(x: f32, y: f64) -> f32 { x + y }",
                "convert with `as f32`",
            ),
            (
                "fn f(x: f32, y: f64) -> f32 { if x < y { x } else { x } }",
                "convert with `as f32`",
            ),
            ("fn f(x: f32) -> f64 { x }", "expected f64, found f32"),
            (
                "fn f(x: f32) -> f32 { if x > 0.0 { x } }",
                "needs an `else`",
            ),
            (
                "fn f(x: f32) -> f32 { match x { _ => x } }",
                "use `if`/`else`",
            ),
            ("fn f(x: f32) -> f32 { (|y: f32| y)(x) }", "closures"),
            ("fn f(x: f32) -> f32 { x << 1 }", "not in the op subset"),
            (
                "fn f(x: f32) -> f32 { x.powi(x as i32) }",
                "f32, f64 or u32",
            ),
            ("fn f(x: f32) -> f32 { x.powf() }", "takes 1 argument"),
            ("fn f(x: f32, x: f32) -> f32 { x }", "a parameter twice"),
            ("fn f(x: f32) -> f32 { f32::NAN_BOX }", "not a constant"),
            ("fn f(x: f32) -> f32 { x + (return x) }", "not `return`"),
            ("fn f(x: f32) -> f32 { x + (|| 1.0_f32) }", "closures"),
            (
                "fn f(x: f32) -> f32 { let y = &x; x }",
                "references are not",
            ),
            ("fn f(x: f32) -> f32 { x + m!() }", "macros are not"),
            (
                "fn f(x: f32) -> f32 { let y = (x = 1.0); x }",
                "assignment is not",
            ),
            ("fn f(x: f32) -> f32 { !x }", "`!` applies to a bool"),
            (
                "fn f(x: f32, k: u32) -> f32 { (-k) as f32 }",
                "a u32 has no sign",
            ),
            (
                "fn f(x: f32) -> f32 { x.powi(2.0) }",
                "integer literal power",
            ),
            (
                "fn f(x: f32, k: u32) -> f32 { x.powi(k) }",
                "integer literal power",
            ),
            ("fn f(x: bool) -> f32 { 1.0 }", "f32, f64, u32"),
            (
                "fn f(x: f32) -> f32 { sqrt(x) }",
                "only the f32/f64 math functions",
            ),
        ] {
            match translate(src) {
                Ok(op) => panic!("{src}: accepted, translated to\n{}", op.cuda),
                Err(e) => assert!(
                    e.to_string().contains(needle),
                    "{src}: `{e}` does not say `{needle}`"
                ),
            }
        }
    }

    #[test]
    fn an_op_is_cataloged_by_its_parameters() {
        let op = translate(
            "fn weighted_sq_err(pred: f32, w: f32, obs: f64, levels: u32) -> f64 { pred as f64 }",
        )
        .unwrap();
        assert_eq!(op.op_name(), "WeightedSqErr");
        assert_eq!(
            translate("fn _leaky__relu_(x: f32) -> f32 { x }")
                .unwrap()
                .op_name(),
            "LeakyRelu"
        );
        let kinds = |tensors: &[&str]| {
            let t: Vec<String> = tensors.iter().map(|s| s.to_string()).collect();
            op.catalog_params(&t)
                .map(|ps| ps.iter().map(|p| (p.name, p.ty)).collect::<Vec<_>>())
        };
        assert_eq!(
            kinds(&["obs"]).unwrap(),
            vec![
                ("pred", Ty::Like),
                ("w", Ty::F32),
                ("obs", Ty::Like),
                ("levels", Ty::U32)
            ]
        );
        assert!(kinds(&["w", "obs"]).unwrap()[1].1 == Ty::Like);
        let e = kinds(&[]).unwrap_err();
        assert!(e.contains("`obs` is an f64 passed by value"), "{e}");
        let e = kinds(&["obs", "levels"]).unwrap_err();
        assert!(e.contains("`levels` is a u32"), "{e}");
        let e = kinds(&["obs", "pred"]).unwrap_err();
        assert!(
            e.contains("not a parameter of `weighted_sq_err` after its first"),
            "{e}"
        );
        let e = kinds(&["obs", "nothing"]).unwrap_err();
        assert!(e.contains("`nothing` is not a parameter"), "{e}");

        assert_eq!(op.precisions(), &[Precision::Fp32, Precision::Fp64]);
        let f32_op = translate("fn s(x: f32) -> f32 { x }").unwrap();
        assert_eq!(f32_op.precisions(), &[Precision::Fp32]);
        let def = f32_op.leak_def(&[]).unwrap();
        assert_eq!(
            (def.name, def.class, def.output),
            ("S", FusionClass::Elementwise, Ty::Like)
        );
        assert_eq!(def.precisions, &[Precision::Fp32]);

        let attr = parse_op_attr("tensors(obs, prec)".parse().unwrap()).unwrap();
        assert_eq!(
            attr.tensor_names(),
            vec!["obs".to_string(), "prec".to_string()]
        );
        assert!(attr.reduction.is_none());
        let e = parse_op_attr("tensors(a), tensors(b)".parse().unwrap())
            .err()
            .unwrap();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn parameters_are_plain_names() {
        for src in [
            "fn f(mut x: f32) -> f32 { x }",
            "fn f(ref x: f32) -> f32 { x }",
            "fn f(x @ _: f32) -> f32 { x }",
        ] {
            let e = translate(src).err().unwrap();
            assert!(e.to_string().contains("plain name"), "{src}: {e}");
        }
    }

    fn reduction(attr: &str, src: &str) -> syn::Result<OpFn> {
        let attr = parse_op_attr(attr.parse().unwrap())?;
        parse_op(&attr, &syn::parse_str::<ItemFn>(src)?)
    }

    #[test]
    fn f32_form_narrows_types_constants_and_literal_suffixes() {
        let attr = parse_op_attr(quote::quote!(f32_form)).unwrap();
        let f: ItemFn = syn::parse_str(
            "fn g(x: f64, k: f32) -> f64 { let c = 2.5_f64; c * x + std::f64::consts::PI * (k as f64) }",
        )
        .unwrap();
        let op = parse_op(&attr, &f).unwrap();
        let (wide, narrow) = op
            .cuda
            .split_once("// #[pptm::op(f32_form)] fn g")
            .expect("two forms");
        assert!(
            wide.contains("double pptm_user_g(double x, float k)"),
            "{wide}"
        );
        assert!(wide.contains("2.5") && !wide.contains("2.5f"), "{wide}");
        assert!(
            narrow.contains("float pptm_user_g(float x, float k)"),
            "{narrow}"
        );
        // The suffixed literal, the constant and the cast are f32 in the f32 form.
        assert!(narrow.contains("const float c = 2.5f;"), "{narrow}");
        assert!(!narrow.contains("double"), "{narrow}");
        assert!(narrow.contains("3.1415927f * k"), "{narrow}");
        // The f64 function itself is unchanged: its form and precisions are an f64 op's.
        assert_eq!(op.ret, Scalar::F64);
        assert_eq!(op.precisions(), &[Precision::Fp32, Precision::Fp64]);
        // A literal the f32 form cannot hold is an error there, at the literal.
        let f: ItemFn = syn::parse_str("fn h(x: f64) -> f64 { x * 1e300 }").unwrap();
        let e = parse_op(&attr, &f).unwrap_err().to_string();
        assert!(
            e.contains("in the op's f32 form") && e.contains("1e300 does not fit an f32"),
            "{e}"
        );
        let f: ItemFn = syn::parse_str("fn h(x: f64) -> f64 { x * 1e300_f64 }").unwrap();
        assert!(parse_op(&attr, &f).is_err());
    }

    #[test]
    fn a_reduction_becomes_a_reducer_type() {
        let lse = reduction(
            "reduction(identity = f64::NEG_INFINITY)",
            "fn log_sum_exp(a: f64, b: f64) -> f64 {
                 let m = a.max(b);
                 if m == f64::NEG_INFINITY { m } else { m + ((a - m).exp() + (b - m).exp()).ln() }
             }",
        )
        .unwrap();
        assert_eq!(lse.class, FusionClass::Reduction);
        assert_eq!(lse.device, "pptm_user_log_sum_exp_reducer");
        let c = &lse.cuda;
        assert!(c.contains("struct pptm_user_log_sum_exp_reducer {"), "{c}");
        assert!(c.contains("static double identity() { return (-"), "{c}");
        assert!(c.contains("return pptm_user_log_sum_exp(a, b);"), "{c}");
        assert!(c.contains("return pptm_total;"), "{c}");
        let def = lse.leak_def(&[]).unwrap();
        assert_eq!(def.output, Ty::Scalar);
        assert_eq!(def.inputs.len(), 1);

        let rms = reduction(
            "reduction(identity = 0.0, finish = |s: f64, count| { let mean = s / count; mean.sqrt() })",
            "fn rms(a: f64, b: f64) -> f64 { a + b }",
        )
        .unwrap();
        let c = &rms.cuda;
        assert!(c.contains("const double s = pptm_total;"), "{c}");
        assert!(
            c.contains("const double count = (double)pptm_count;"),
            "{c}"
        );
        assert!(c.contains("return sqrt(mean);"), "{c}");
        // A block body is the finish's own statements, not a lambda.
        assert!(!c.contains("[&]"), "{c}");
    }

    #[test]
    fn what_a_reduction_refuses_is_an_error_that_says_so() {
        let sum = "fn s(a: f64, b: f64) -> f64 { a + b }";
        for (attr, src, needle) in [
            ("reduction()", sum, "needs the identity"),
            (
                "reduction(identity = 0.0, zero = 1)",
                sum,
                "unknown reduction argument",
            ),
            (
                "reduction(identity = 0.0), reduction(identity = 0.0)",
                sum,
                "given twice",
            ),
            (
                "reduction(identity = 0.0), tensors(b)",
                sum,
                "reads only its flow",
            ),
            (
                "reduction(identity = 0.0_f64.exp())",
                sum,
                "identity is a constant",
            ),
            (
                "reduction(identity = 0.0)",
                "fn s(a: f32, b: f32) -> f32 { a + b }",
                "`fn(a: f64, b: f64) -> f64`",
            ),
            (
                "reduction(identity = 0.0)",
                "fn s(a: f64) -> f64 { a }",
                "`fn(a: f64, b: f64) -> f64`",
            ),
            (
                "reduction(identity = 0.0)",
                "fn s(a: f64, b: f64, c: f64) -> f64 { a }",
                "`fn(a: f64, b: f64) -> f64`",
            ),
            (
                "reduction(identity = 0.0, finish = total)",
                sum,
                "is a closure",
            ),
            (
                "reduction(identity = 0.0, finish = || 1.0)",
                sum,
                "takes the total",
            ),
            (
                "reduction(identity = 0.0, finish = |a, b, c| a)",
                sum,
                "takes the total",
            ),
            (
                "reduction(identity = 0.0, finish = move |t| t)",
                sum,
                "plain closure",
            ),
            (
                "reduction(identity = 0.0, finish = |t: f32| t)",
                sum,
                "parameters are f64",
            ),
            (
                "reduction(identity = 0.0, finish = |t| -> f32 { 1.0 })",
                sum,
                "returns f64",
            ),
            (
                "reduction(identity = 0.0, finish = |t| u)",
                sum,
                "neither a parameter",
            ),
            (
                "reduction(identity = 0.0, finish = |(a, b)| a)",
                sum,
                "plain name",
            ),
            (
                "reduction(identity = 0.0, finish = |t| 'a: { t })",
                sum,
                "not in the op subset",
            ),
            ("reduce(identity = 0.0)", sum, "unknown op attribute"),
        ] {
            match reduction(attr, src) {
                Ok(op) => panic!("{attr} {src}: accepted, translated to\n{}", op.cuda),
                Err(e) => assert!(
                    e.to_string().contains(needle),
                    "{attr} {src}: `{e}` does not say `{needle}`"
                ),
            }
        }
    }

    /// An op with its attribute, through `parse_op` as the macro and build.rs call it.
    fn with_attr(attr: &str, src: &str) -> syn::Result<OpFn> {
        let attr = parse_op_attr(attr.parse().expect("tokens"))?;
        parse_op(&attr, &syn::parse_str::<ItemFn>(src)?)
    }

    #[test]
    fn a_lanes_loop_splits_its_iterations_and_sums_what_it_accumulates() {
        let src = "fn f(x: f64, t: Table) -> f64 {
                 let mut acc = x;
                 let mut count = 0_u32;
                 for j in lanes(0..t.cols()) {
                     let y = t.at(0, j);
                     if y > 0.0 { acc += y; } else { acc -= y; }
                     count += 1;
                 }
                 acc + count as f64
             }";
        let op = with_attr("lanes = 4, f32_form", src).unwrap();
        assert_eq!(op.lanes, 4);
        for needle in [
            "template <unsigned int PPTM_LANES = 1>\n__device__ __forceinline__ double pptm_user_f(",
            "template <unsigned int PPTM_LANES = 1>\n__device__ __forceinline__ float pptm_user_f(",
            "const auto pptm_start_0_0 = acc;",
            "acc = 0;",
            "const auto pptm_start_0_1 = count;",
            "for (unsigned int j = 0u + pptm_lane<PPTM_LANES>(); j < pptm_end_0; j += PPTM_LANES) {",
            "acc = pptm_start_0_0 + pptm_lane_sum<PPTM_LANES>(acc);",
            "count = pptm_start_0_1 + pptm_lane_sum<PPTM_LANES>(count);",
        ] {
            assert!(op.cuda.contains(needle), "no `{needle}` in\n{}", op.cuda);
        }
        // Without `lanes = N`, the default; without a lanes loop, one lane and no template.
        assert_eq!(with_attr("", src).unwrap().lanes, DEFAULT_LANES);
        let plain = translate(
            "fn g(x: f32, n: u32) -> f32 { let mut a = x; for j in 0..n { a += 1.0; } a }",
        )
        .unwrap();
        assert_eq!(plain.lanes, 1);
        assert!(!plain.cuda.contains("template"), "{}", plain.cuda);
    }

    #[test]
    fn what_lanes_refuse_is_an_error_that_says_so() {
        let body = |inner: &str| {
            format!(
                "fn f(x: f64, t: Table) -> f64 {{ let mut acc = x; let mut v = [0.0_f64; 2]; {inner} acc + v[0] }}"
            )
        };
        for (attr, src, needle) in [
            (
                "lanes = 3",
                body("for j in lanes(0..4) { acc += 1.0; }"),
                "power of two",
            ),
            (
                "lanes = 64",
                body("for j in lanes(0..4) { acc += 1.0; }"),
                "power of two",
            ),
            (
                "lanes = 4, lanes = 8",
                body("for j in lanes(0..4) { acc += 1.0; }"),
                "given twice",
            ),
            (
                "lanes = 4",
                body("for j in 0..4 { acc += 1.0; }"),
                "this op has none",
            ),
            (
                "",
                body("for j in lanes(0..4) { acc = 1.0; }"),
                "changes only by `+=` or `-=`",
            ),
            (
                "",
                body("for j in lanes(0..4) { acc *= 2.0; }"),
                "changes only by `+=` or `-=`",
            ),
            (
                "",
                body("for j in lanes(0..4) { v[0] += 1.0; }"),
                "changes only by `+=` or `-=`",
            ),
            (
                "",
                body("for j in lanes(0..4) { for k in 0..2 { acc = 0.0; } }"),
                "changes only by `+=` or `-=`",
            ),
            (
                "",
                body("for j in lanes(0..4) { for k in lanes(0..2) { acc += 1.0; } }"),
                "do not nest",
            ),
            (
                "",
                body("for j in lanes(0..=4) { acc += 1.0; }"),
                "half-open range",
            ),
            (
                "lanes = 4, reduction(identity = 0.0)",
                "fn s(a: f64, b: f64) -> f64 { a + b }".to_string(),
                "not a reduction",
            ),
        ] {
            match with_attr(attr, &src) {
                Ok(op) => panic!("{attr} {src}: accepted, translated to\n{}", op.cuda),
                Err(e) => assert!(
                    e.to_string().contains(needle),
                    "{attr} {src}: `{e}` does not say `{needle}`"
                ),
            }
        }
        // Names bound inside the loop change freely; so does a plain loop's.
        with_attr(
            "",
            &body("for j in lanes(0..4) { let mut y = 1.0_f64; for k in 0..2 { y *= 2.0; } acc += y; }"),
        )
        .unwrap();
    }

    /// Every operator, constant and conversion of the subset, with the CUDA it becomes.
    #[test]
    fn each_construct_translates_to_its_cuda() {
        for (src, want) in [
            (
                "fn f(x: f32, y: f32) -> f32 { x % y }",
                "return fmodf(x, y);",
            ),
            (
                "fn f(x: f64, y: f64) -> f64 { x % y }",
                "return fmod(x, y);",
            ),
            (
                "fn f(x: f32, y: f32) -> f32 { if x >= y { x } else { y } }",
                "return ((x >= y) ? x : y);",
            ),
            (
                "fn f(x: f32, y: f32) -> f32 { if x != y { x } else { y } }",
                "return ((x != y) ? x : y);",
            ),
            (
                "fn f(x: f32, y: f32) -> f32 { if x > 0.0 && y > 0.0 { x } else { y } }",
                "return (((x > 0.0f) && (y > 0.0f)) ? x : y);",
            ),
            (
                "fn f(x: f32, y: f32) -> f32 { if x > 0.0 || !(y > 0.0) { x } else { y } }",
                "return (((x > 0.0f) || (!(y > 0.0f))) ? x : y);",
            ),
            ("fn f(x: f32) -> f32 { (x) }", "return x;"),
            (
                "fn f(x: f32) -> f32 { ({ let t = x * 2.0_f32; t }) + 1.0 }",
                "const float t = (x * 2.0f);",
            ),
            (
                "fn f(x: f32, k: u32) -> f32 { (k + 2) as f32 * x }",
                "return (((float)(k + 2u)) * x);",
            ),
            (
                "fn f(x: f32, k: u32) -> f32 { (k % 3) as f32 }",
                "return ((float)(k % 3u));",
            ),
            (
                "fn f(x: f32) -> f32 { x * 3 as f32 }",
                "return (x * ((float)3.0));",
            ),
            (
                "fn f(x: f64) -> f64 { x * 2.5e-3 + 1e10 }",
                "return ((x * 0.0025) + 10000000000.0);",
            ),
            ("fn f(x: f32) -> f32 { x + 100.0 }", "return (x + 100.0f);"),
            (
                "fn f(x: f32) -> f32 { f32::MAX + f32::MIN + f32::EPSILON + f32::MIN_POSITIVE + f32::INFINITY + f32::NEG_INFINITY }",
                "return (((((3.4028235e38f + -3.4028235e38f) + 1.1920929e-7f) + 1.1754944e-38f) + __int_as_float(0x7f800000)) + (-__int_as_float(0x7f800000)));",
            ),
            (
                "fn f(x: f64) -> f64 { f64::MAX + f64::MIN + f64::EPSILON + f64::MIN_POSITIVE + f64::INFINITY + f64::NEG_INFINITY }",
                "return (((((1.7976931348623157e308 + -1.7976931348623157e308) + 2.220446049250313e-16) + 2.2250738585072014e-308) + __longlong_as_double(0x7ff0000000000000ll)) + (-__longlong_as_double(0x7ff0000000000000ll)));",
            ),
            (
                "fn f(x: f32) -> f32 { f32::NAN + x }",
                "return (__int_as_float(0x7fc00000) + x);",
            ),
            (
                "fn f(x: f64) -> f64 { if x > 0.0 { x } else { f64::NAN } }",
                "return ((x > 0.0) ? x : __longlong_as_double(0x7ff8000000000000ll));",
            ),
            ("fn f(x: f32) -> f32 { x as f32 }", "return x;"),
            ("fn f(x: f32) -> f64 { x as f64 }", "return ((double)x);"),
            (
                "fn f(x: f32) -> f32 { f32::powi(x, 2) + x.recip() + x.clamp(0.0, 1.0) + x.hypot(2.0) }",
                "return (((pptm_user_powi(x, 2) + (1.0f / x)) + pptm_user_clamp(x, 0.0f, 1.0f)) + hypotf(x, 2.0f));",
            ),
            (
                "fn f(x: f64) -> f64 { f64::powf(x, 0.5) }",
                "return pow(x, 0.5);",
            ),
            (
                "fn f(x: f32) -> f32 { (x as u32) as f32 }",
                "return ((float)pptm_user_to_u32(x));",
            ),
            (
                "fn f(x: f32, k: u32) -> f32 { if k == 0 { x } else { -x } }",
                "return ((k == 0u) ? x : (-x));",
            ),
            ("fn f(x: f32) -> f32 { 1.0 / x }", "return (1.0f / x);"),
            (
                "fn f(x: f32, k: u32) -> f32 { (k as u32) as f32 }",
                "return ((float)k);",
            ),
            (
                "fn f(x: f32) -> f32 { let b: bool = x > 0.0; if b { x } else { 0.0 } }",
                "const bool b = (x > 0.0f);",
            ),
        ] {
            let op = translate(src).unwrap_or_else(|e| panic!("{src}: {e}"));
            assert!(
                op.cuda.contains(want),
                "{src}: wanted `{want}` in\n{}",
                op.cuda
            );
        }
    }
    fn osc() -> StateDef {
        StateDef {
            name: "Osc".into(),
            fields: vec![("x".into(), Scalar::F64), ("v".into(), Scalar::F32)],
        }
    }

    fn translate_with_states(src: &str, f32_form: bool) -> syn::Result<OpFn> {
        let attr = OpAttr {
            f32_form: f32_form.then(Span::call_site),
            ..Default::default()
        };
        parse_op_with_states(&attr, &syn::parse_str::<ItemFn>(src)?, &[osc()])
    }

    #[test]
    fn a_state_is_read_by_field_and_built_field_by_field() {
        let op = translate_with_states(
            "fn step(s: Osc, dt: f32) -> Osc { let a = -s.x; Osc { x: s.x + (dt as f64) * (s.v as f64), v: s.v + dt * (a as f32) } }",
            false,
        )
        .unwrap();
        assert_eq!(op.channels(), (2, 2));
        assert_eq!(op.state_types().flow, Some("Osc"));
        assert!(
            op.cuda
                .contains("struct pptm_state_Osc {\n    double x;\n    float v;"),
            "{}",
            op.cuda
        );
        assert!(
            op.cuda
                .contains("pptm_state_Osc pptm_user_step(pptm_state_Osc s, float dt)"),
            "{}",
            op.cuda
        );
        assert!(
            op.cuda
                .contains("pptm_s.x = (s.x + (((double)dt) * ((double)s.v)));"),
            "{}",
            op.cuda
        );
        // Mixed fields: only fp32 stages.
        assert_eq!(op.precisions(), &[Precision::Fp32]);

        // The rest of a state from another; a state as a `let`, and from a scalar.
        // (`Osc { x, .. }` is shorthand for `Osc { x: x, .. }`, as in Rust.)
        let op = translate_with_states(
            "fn kick(x: f64, f: f32) -> Osc { let s: Osc = Osc { x, v: 0.0 }; Osc { v: f, ..s } }",
            false,
        )
        .unwrap();
        assert_eq!(op.channels(), (1, 2));
        assert!(op.cuda.contains("pptm_s.x = x;"), "{}", op.cuda);
        assert!(
            op.cuda.contains("pptm_state_Osc pptm_s = s; pptm_s.v = f;"),
            "{}",
            op.cuda
        );

        // The f32 form holds every field in f32.
        let op =
            translate_with_states("fn grow(s: Osc) -> Osc { Osc { x: s.x * 2.0, ..s } }", true)
                .unwrap_err();
        assert!(op.to_string().contains("returns f32 already"), "{op}");
    }

    #[test]
    fn what_states_refuse_is_an_error_that_says_so() {
        for (src, needle) in [
            (
                "fn f(x: f32, s: Osc) -> f32 { x }",
                "only its first parameter",
            ),
            ("fn f(s: Osc) -> Osc { s + s }", "does not apply to a state"),
            (
                "fn f(s: Osc) -> f64 { s.y }",
                "has no field `y` (its fields: x, v)",
            ),
            ("fn f(s: Osc) -> Osc { Osc { x: 1.0 } }", "`v` is missing"),
            (
                "fn f(s: Osc) -> Osc { Osc { x: 1.0, x: 2.0, v: 1.0 } }",
                "given twice",
            ),
            ("fn f(s: Osc) -> f64 { s }", "expected f64, found Osc"),
            ("fn f(x: f32) -> f32 { x.y }", "only a state"),
            ("fn f(s: Osc) -> f32 { s as f32 }", "cannot be cast"),
            (
                "fn f(s: Other) -> f32 { 1.0 }",
                "a state: a struct of this crate",
            ),
            ("fn f(s: Osc) -> Osc { Other { x: 1.0 } }", "only a state"),
            (
                "fn f(s: Osc) -> f32 { Osc { x: 1.0, v: 1.0 } }",
                "expected f32, found the state Osc",
            ),
        ] {
            match translate_with_states(src, false) {
                Ok(op) => panic!("{src}: accepted, translated to\n{}", op.cuda),
                Err(e) => assert!(
                    e.to_string().contains(needle),
                    "{src}: `{e}` does not say `{needle}`"
                ),
            }
        }
        let parse = |src: &str| StateDef::parse(&syn::parse_str::<syn::ItemStruct>(src).unwrap());
        assert_eq!(
            parse("#[repr(C)] struct Osc { x: f64, v: f32 }").unwrap(),
            osc()
        );
        for (src, needle) in [
            ("struct Osc { x: f64 }", "#[repr(C)]"),
            ("#[repr(C)] struct Osc { x: u32 }", "f32 or f64"),
            ("#[repr(C)] struct Osc(f64, f64);", "named fields"),
            ("#[repr(C)] struct Osc {}", "from 1 to 64 fields"),
            ("#[repr(C)] struct Osc<T> { x: T }", "cannot be generic"),
        ] {
            let e = parse(src).unwrap_err();
            assert!(
                e.to_string().contains(needle),
                "{src}: `{e}` does not say `{needle}`"
            );
        }
    }
}

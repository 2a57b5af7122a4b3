//! Kernel declarations: the `extern "C" __global__` entry points a `.cu` source defines, and
//! the C types their parameters may have.
//!
//! One parser and one table of C types, shared by the build script (`build/`, which includes
//! this file by `#[path]` to generate the signatures and typed launchers of nanoddp's own
//! kernels) and by [`crate::backend::simt_module`] (a user's kernel file, at run time). It
//! depends on `std`, `thiserror` and the sibling `lowering` module only, so that the build
//! script can compile it.

use thiserror::Error;

use super::lowering::strip_comments;

/// Element and scalar types kernels use, with their C spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// `float`
    F32,
    /// `double`
    F64,
    /// `__half` (IEEE binary16)
    F16,
    /// `__nv_bfloat16` (bfloat16: the top half of an f32)
    BF16,
    /// `int`
    I32,
    /// `unsigned int`
    U32,
    /// `long long`
    I64,
    /// `unsigned long long`
    U64,
    /// `unsigned char`
    U8,
}

/// How one [`Scalar`] is spelled in each language that names it: the C spellings a
/// declaration may use (the first is the canonical one), the Rust type, and the code
/// `simt.cuh`'s `::simt::signature` reports it by (`kernels/simt.cuh`, `scalar_code`).
struct Spelling {
    scalar: Scalar,
    c: &'static [&'static str],
    rust: &'static str,
    code: &'static str,
}

const fn spelling(
    scalar: Scalar,
    c: &'static [&'static str],
    rust: &'static str,
    code: &'static str,
) -> Spelling {
    Spelling {
        scalar,
        c,
        rust,
        code,
    }
}

/// The table of C types: every scalar a kernel parameter may have, written once.
const SPELLINGS: &[Spelling] = &[
    spelling(Scalar::F32, &["float"], "f32", "f32"),
    spelling(Scalar::F64, &["double"], "f64", "f64"),
    spelling(Scalar::F16, &["__half", "half"], "half::f16", "f16"),
    spelling(
        Scalar::BF16,
        &["__nv_bfloat16", "nv_bfloat16"],
        "half::bf16",
        "bf16",
    ),
    spelling(Scalar::I32, &["int", "int32_t"], "i32", "i32"),
    spelling(
        Scalar::U32,
        &["unsigned int", "unsigned", "uint32_t"],
        "u32",
        "u32",
    ),
    spelling(Scalar::I64, &["long long", "int64_t"], "i64", "i64"),
    spelling(
        Scalar::U64,
        &["unsigned long long", "uint64_t"],
        "u64",
        "u64",
    ),
    spelling(Scalar::U8, &["unsigned char", "uint8_t"], "u8", "u8"),
];

impl Scalar {
    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            Scalar::U8 => 1,
            Scalar::F16 | Scalar::BF16 => 2,
            Scalar::F32 | Scalar::I32 | Scalar::U32 => 4,
            Scalar::F64 | Scalar::I64 | Scalar::U64 => 8,
        }
    }

    fn spelling(self) -> &'static Spelling {
        SPELLINGS
            .iter()
            .find(|s| s.scalar == self)
            .expect("every scalar is in the table")
    }

    /// The canonical C spelling, e.g. `unsigned long long`.
    pub fn c_name(self) -> &'static str {
        self.spelling().c[0]
    }

    /// The code `simt.cuh`'s signatures name it by, which is also the suffix of a per-type
    /// kernel entry (`f32`, `f16`, `bf16`, `u64`, ...).
    pub fn code(self) -> &'static str {
        self.spelling().code
    }

    /// The Rust type, e.g. `half::f16`.
    pub fn rust_type(self) -> &'static str {
        self.spelling().rust
    }

    /// The scalar a C type names (`float`, `unsigned`, `uint64_t`, ...), if any.
    pub fn from_c(c_type: &str) -> Option<Scalar> {
        SPELLINGS
            .iter()
            .find(|s| s.c.contains(&c_type))
            .map(|s| s.scalar)
    }
}

/// The type of a kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A scalar passed by value.
    Value(Scalar),
    /// `const T*`: device memory the kernel only reads.
    ConstPtr(Scalar),
    /// `T*`: device memory the kernel may write.
    MutPtr(Scalar),
}

impl ParamKind {
    /// The scalar passed, or pointed to.
    pub fn scalar(self) -> Scalar {
        match self {
            ParamKind::Value(s) | ParamKind::ConstPtr(s) | ParamKind::MutPtr(s) => s,
        }
    }

    /// The canonical C spelling, e.g. `const float*`.
    pub fn c_type(self) -> String {
        match self {
            ParamKind::Value(s) => s.c_name().to_string(),
            ParamKind::ConstPtr(s) => format!("const {}*", s.c_name()),
            ParamKind::MutPtr(s) => format!("{}*", s.c_name()),
        }
    }

    /// Reads one parameter code of the signature string `simt.cuh`'s `::simt::signature`
    /// builds, such as `f32`, `const f16*` or `u8*`.
    pub fn from_code(code: &str) -> Option<ParamKind> {
        let (constant, rest) = match code.strip_prefix("const ") {
            Some(r) => (true, r),
            None => (false, code),
        };
        let (pointer, base) = match rest.strip_suffix('*') {
            Some(s) => (true, s),
            None => (false, rest),
        };
        let scalar = SPELLINGS.iter().find(|s| s.code == base)?.scalar;
        Some(match (pointer, constant) {
            (false, _) => ParamKind::Value(scalar),
            (true, true) => ParamKind::ConstPtr(scalar),
            (true, false) => ParamKind::MutPtr(scalar),
        })
    }
}

/// A kernel's `__launch_bounds__(max_threads[, min_blocks])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchBounds {
    /// The most threads per block the kernel is compiled for: a bigger block cannot launch.
    pub max_threads: u32,
    /// The blocks per multiprocessor the compiler is asked to fit (an occupancy hint that
    /// limits registers, nothing a launch can break).
    pub min_blocks: Option<u32>,
}

/// One `__global__` function declaration, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The function name.
    pub name: String,
    /// 1-based line of its `__global__` keyword.
    pub line: u32,
    /// Declared `extern "C"`: its symbol is its name, so launchers can find it.
    pub extern_c: bool,
    /// Its `__launch_bounds__`, if any.
    pub launch_bounds: Option<LaunchBounds>,
    /// The parameter declarations as written, e.g. `const float* __restrict__ x`.
    pub params: Vec<String>,
}

/// A parameter whose C type maps to a [`ParamKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredParam {
    /// Its name in the source.
    pub name: String,
    /// Its type.
    pub kind: ParamKind,
}

/// A declaration the parser cannot read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {message}")]
pub struct DeclarationError {
    /// 1-based line of the `__global__` keyword.
    pub line: u32,
    /// What is wrong, and what to write instead.
    pub message: String,
}

/// Every `__global__` function declared in `source`, in order. Comments are ignored, and so
/// are `#define` lines (the portability header defines `__global__` itself);
/// `__launch_bounds__` may stand before or after `void`.
pub fn parse(source: &str) -> Result<Vec<Declaration>, DeclarationError> {
    let code = strip_comments(source);
    let mut declarations = Vec::new();
    let mut search = 0;
    while let Some(found) = code[search..].find("__global__") {
        let at = search + found;
        search = at + "__global__".len();
        let line_start = code[..at].rfind('\n').map_or(0, |p| p + 1);
        if code[line_start..at].trim_start().starts_with('#') {
            continue;
        }
        let line = code[..at].matches('\n').count() as u32 + 1;
        let fail = |message: String| DeclarationError { line, message };
        let extern_c = code[..at].trim_end().ends_with("extern \"C\"");
        let mut launch_bounds = None;
        let rest =
            launch_bounds_prefix(code[search..].trim_start(), &mut launch_bounds).map_err(fail)?;
        let rest = rest
            .strip_prefix("void")
            .ok_or_else(|| fail("a __global__ kernel must return void".into()))?
            .trim_start();
        let rest = launch_bounds_prefix(rest, &mut launch_bounds).map_err(fail)?;
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after_name = rest[name.len()..].trim_start();
        if name.is_empty() || !after_name.starts_with('(') {
            return Err(fail("expected `void name(`".into()));
        }
        let close = after_name
            .find(')')
            .ok_or_else(|| fail(format!("{name}: expected `)`")))?;
        let params = after_name[1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(str::to_string)
            .collect();
        declarations.push(Declaration {
            name,
            line,
            extern_c,
            launch_bounds,
            params,
        });
    }
    declarations.extend(per_type_entries(&code)?);
    declarations.sort_by_key(|d| d.line);
    Ok(declarations)
}

/// The storage types `simt.cuh`'s `NANODDP_ENTRY_EACH_TYPE` defines an entry for: the suffix
/// of each entry's name and the C type `T` stands for, in [`crate::dtype::DType::ALL`]'s
/// order (a test in `src/dtype.rs` checks the two agree).
pub const ENTRY_TYPES: [(&str, Scalar); 3] = [
    ("f32", Scalar::F32),
    ("f16", Scalar::F16),
    ("bf16", Scalar::BF16),
];

/// The entry points `simt.cuh`'s `NANODDP_ENTRY_EACH_TYPE(name, (bounds), (params), (args))`
/// defines: one per [`ENTRY_TYPES`], named `name_<suffix>`, `extern "C"`, with
/// `__launch_bounds__(bounds)` and the parameters `params` with the storage type `T` spelled
/// as that type.
fn per_type_entries(code: &str) -> Result<Vec<Declaration>, DeclarationError> {
    const MACRO: &str = "NANODDP_ENTRY_EACH_TYPE";
    let mut entries = Vec::new();
    for (at, _) in code.match_indices(MACRO) {
        let line_start = code[..at].rfind('\n').map_or(0, |p| p + 1);
        if code[line_start..at].trim_start().starts_with('#') {
            continue; // its definition
        }
        let line = code[..at].matches('\n').count() as u32 + 1;
        let fail = |message: String| DeclarationError { line, message };
        let usage = || {
            fail(format!(
                "expected `{MACRO}(name, (max_threads[, min_blocks]), (parameters), (arguments))`"
            ))
        };
        let rest = code[at + MACRO.len()..]
            .trim_start()
            .strip_prefix('(')
            .ok_or_else(usage)?;
        let (name, rest) = rest.split_once(',').ok_or_else(usage)?;
        let name = name.trim();
        // `(max_threads[, min_blocks])`, read as `__launch_bounds__` would be.
        if !rest.trim_start().starts_with('(') {
            return Err(usage());
        }
        let mut launch_bounds = None;
        let rest = launch_bounds_prefix(
            &format!("__launch_bounds__{}", rest.trim_start()),
            &mut launch_bounds,
        )
        .map(str::to_string)
        .map_err(|e| fail(format!("{MACRO}({name}: {e}")))?;
        if launch_bounds.is_none() {
            return Err(usage());
        }
        let params = rest
            .trim_start()
            .strip_prefix(',')
            .ok_or_else(usage)?
            .trim_start();
        let close = params
            .find(')')
            .filter(|_| params.starts_with('('))
            .ok_or_else(|| fail(format!("{MACRO}({name}: expected `(parameters)`")))?;
        for (suffix, scalar) in ENTRY_TYPES {
            entries.push(Declaration {
                name: format!("{name}_{suffix}"),
                line,
                extern_c: true,
                launch_bounds,
                params: params[1..close]
                    .split(',')
                    .map(|p| spell_type(p.trim(), scalar.c_name()))
                    .filter(|p| !p.is_empty())
                    .collect(),
            });
        }
    }
    Ok(entries)
}

/// `param` with every whole-word `T` replaced by `c_type`.
fn spell_type(param: &str, c_type: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    for c in param.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        out.push_str(if word == "T" { c_type } else { &word });
        word.clear();
        out.push(c);
    }
    out.pop();
    out
}

/// Reads a `__launch_bounds__(maxThreads[, minBlocks])` at the start of `rest` into
/// `bounds` and returns what follows it (`rest` itself when there is none). Both arguments
/// must be integer literals: they are what the launch checks compare against.
fn launch_bounds_prefix<'a>(
    rest: &'a str,
    bounds: &mut Option<LaunchBounds>,
) -> Result<&'a str, String> {
    let Some(after) = rest.strip_prefix("__launch_bounds__") else {
        return Ok(rest);
    };
    let after = after.trim_start();
    let close = after
        .find(')')
        .filter(|_| after.starts_with('('))
        .ok_or("unclosed __launch_bounds__(")?;
    let args: Vec<&str> = after[1..close].split(',').map(str::trim).collect();
    let literal = |text: &str| {
        text.parse::<u32>()
            .map_err(|_| format!("__launch_bounds__ takes integer literals, got `{text}`"))
    };
    *bounds = Some(match args[..] {
        [max] => LaunchBounds {
            max_threads: literal(max)?,
            min_blocks: None,
        },
        [max, min] => LaunchBounds {
            max_threads: literal(max)?,
            min_blocks: Some(literal(min)?),
        },
        _ => {
            return Err(format!(
                "__launch_bounds__({}) takes one or two arguments here",
                args.join(", ")
            ))
        }
    });
    Ok(after[close + 1..].trim_start())
}

impl Declaration {
    /// The parameters with their types: each must be one of the [`Scalar`]s' C types, or a
    /// pointer (`const` or not) to one. `__restrict__` is allowed and ignored.
    pub fn typed_params(&self) -> Result<Vec<DeclaredParam>, DeclarationError> {
        self.params.iter().map(|p| self.typed_param(p)).collect()
    }

    fn typed_param(&self, text: &str) -> Result<DeclaredParam, DeclarationError> {
        let fail = |message: String| DeclarationError {
            line: self.line,
            message: format!("{}: parameter `{text}`: {message}", self.name),
        };
        let spaced = text.replace('*', " * ");
        let mut words: Vec<&str> = spaced
            .split_whitespace()
            .filter(|w| *w != "__restrict__" && *w != "__restrict")
            .collect();
        let name = words.pop().ok_or_else(|| fail("empty parameter".into()))?;
        let stars = words.iter().filter(|w| **w == "*").count();
        let is_const = words.first() == Some(&"const");
        let base: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| *w != "*" && *w != "const")
            .collect();
        let base = base.join(" ");
        let scalar = Scalar::from_c(&base).ok_or_else(|| {
            let known: Vec<&str> = SPELLINGS.iter().map(|s| s.c[0]).collect();
            fail(format!(
                "type `{base}` has no Rust mapping; use {} (or pointers to them)",
                known.join(", ")
            ))
        })?;
        let kind = match stars {
            0 => ParamKind::Value(scalar),
            1 if is_const => ParamKind::ConstPtr(scalar),
            1 => ParamKind::MutPtr(scalar),
            _ => return Err(fail("pointers to pointers are not supported".into())),
        };
        Ok(DeclaredParam {
            name: name.to_string(),
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_read_with_their_launch_bounds_in_either_place() {
        let src = r#"
            #define __global__
            // extern "C" __global__ void commented(float* x) {}
            extern "C" __global__ void first(const float* __restrict__ x, unsigned long long n) {}
            extern "C" __global__ void __launch_bounds__(256) second(__half* h) {}
            extern "C" __global__ __launch_bounds__(128, 4) void third() {}
            __global__ void not_extern_c(void) {}
        "#;
        let found = parse(src).expect("parses");
        let summary: Vec<(&str, u32, bool, Option<LaunchBounds>)> = found
            .iter()
            .map(|d| (d.name.as_str(), d.line, d.extern_c, d.launch_bounds))
            .collect();
        let bounds = |max_threads, min_blocks| {
            Some(LaunchBounds {
                max_threads,
                min_blocks,
            })
        };
        assert_eq!(
            summary,
            [
                ("first", 4, true, None),
                ("second", 5, true, bounds(256, None)),
                ("third", 6, true, bounds(128, Some(4))),
                ("not_extern_c", 7, false, None),
            ]
        );
        let first = found[0].typed_params().expect("typed");
        assert_eq!(
            first,
            [
                DeclaredParam {
                    name: "x".into(),
                    kind: ParamKind::ConstPtr(Scalar::F32)
                },
                DeclaredParam {
                    name: "n".into(),
                    kind: ParamKind::Value(Scalar::U64)
                },
            ]
        );
        assert!(found[2].typed_params().expect("typed").is_empty());
    }

    #[test]
    fn per_type_entry_macros_read_as_one_declaration_per_type() {
        let src = "#define NANODDP_ENTRY_EACH_TYPE(name, bounds, params, args) ...\n\
                   extern \"C\" __global__ void plain(int n) {}\n\
                   NANODDP_ENTRY_EACH_TYPE(scale, (256),\n  (const T* __restrict__ x, Tx* y, int n),\n  (x, y, n))\n";
        let found = parse(src).expect("parses");
        let summary: Vec<(&str, u32, Option<u32>, Vec<&str>)> = found
            .iter()
            .map(|d| {
                assert!(d.extern_c, "{}", d.name);
                let params = d.params.iter().map(String::as_str).collect();
                let bounds = d.launch_bounds.map(|b| b.max_threads);
                (d.name.as_str(), d.line, bounds, params)
            })
            .collect();
        let entry = |name, c_type: &str| {
            let x = format!("const {c_type}* __restrict__ x");
            (name, 3, Some(256), vec![x, "Tx* y".into(), "int n".into()])
        };
        let want = [
            entry("scale_f32", "float"),
            entry("scale_f16", "__half"),
            entry("scale_bf16", "__nv_bfloat16"),
        ];
        assert_eq!(summary[0], ("plain", 2, None, vec!["int n"]));
        assert_eq!(summary.len(), 4);
        for (got, (name, line, bounds, params)) in summary[1..].iter().zip(&want) {
            assert_eq!((got.0, got.1, got.2), (*name, *line, *bounds));
            assert_eq!(got.3, params.iter().map(String::as_str).collect::<Vec<_>>());
        }
        for (src, needle) in [
            ("NANODDP_ENTRY_EACH_TYPE(scale)", "expected"),
            (
                "NANODDP_ENTRY_EACH_TYPE(scale, (N), (int n), (n))",
                "integer literals, got `N`",
            ),
            (
                "NANODDP_ENTRY_EACH_TYPE(scale, 256, (int n), (n))",
                "expected",
            ),
        ] {
            let e = parse(src).expect_err(src);
            assert!(e.message.contains(needle), "{e}");
        }
        let both = parse("NANODDP_ENTRY_EACH_TYPE(scale, (256, 1), (int n), (n))").expect("parses");
        assert_eq!(both.len(), 3);
        assert!(both.iter().all(|d| d.launch_bounds
            == Some(LaunchBounds {
                max_threads: 256,
                min_blocks: Some(1)
            })
            && d.params == ["int n"]));
    }

    #[test]
    fn malformed_declarations_are_errors_with_their_line() {
        for (src, needle) in [
            ("\nextern \"C\" __global__ int f() {}", "must return void"),
            (
                "\nextern \"C\" __global__ void __launch_bounds__(BLOCK) f() {}",
                "integer literals, got `BLOCK`",
            ),
            (
                "\nextern \"C\" __global__ void __launch_bounds__(1, 2, 3) f() {}",
                "one or two arguments",
            ),
        ] {
            let err = parse(src).expect_err(src);
            assert_eq!(err.line, 2, "{src}");
            assert!(err.to_string().contains(needle), "{err}");
        }
        let bad_type = parse("extern \"C\" __global__ void f(bool b, float** p) {}").unwrap();
        let err = bad_type[0].typed_params().expect_err("bool");
        assert!(
            err.to_string().contains("`bool` has no Rust mapping"),
            "{err}"
        );
    }

    #[test]
    fn the_c_types_and_signature_codes_come_from_one_table() {
        for s in SPELLINGS {
            for c in s.c {
                assert_eq!(Scalar::from_c(c), Some(s.scalar));
            }
            let kind = ParamKind::ConstPtr(s.scalar);
            assert_eq!(
                ParamKind::from_code(&format!("const {}*", s.code)),
                Some(kind)
            );
            assert_eq!(kind.c_type(), format!("const {}*", s.scalar.c_name()));
        }
        assert_eq!(
            ParamKind::from_code("u8*"),
            Some(ParamKind::MutPtr(Scalar::U8))
        );
        assert_eq!(ParamKind::from_code("bool"), None);
    }
}

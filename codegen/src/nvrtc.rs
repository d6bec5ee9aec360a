//! A minimal NVRTC driver, loaded at run time from the pinned pip wheels (or `PPTM_NVRTC`), so that
//! no CUDA toolkit is needed to build pptm and NVRTC is only needed to regenerate PTX.
//!
//! Only NVRTC 13.0 is accepted: newer NVRTC emits a PTX ISA that driver 580 (the GPU hosts')
//! cannot load.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use libloading::Library;

/// The NVRTC major.minor pptm pins.
pub const PINNED_VERSION: (i32, i32) = (13, 0);

/// Why NVRTC could not be loaded, or did not compile a translation unit.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// No candidate path holds NVRTC.
    #[error("NVRTC not found (looked in: {}); install it with: {}", searched.join(", "), crate::NVRTC_INSTALL_HINT)]
    NotFound {
        /// The paths tried, in order.
        searched: Vec<String>,
    },
    /// `PPTM_NVRTC` names neither an NVRTC library nor a folder that holds one.
    #[error(
        "PPTM_NVRTC is `{path}`, where there is no NVRTC library (no such file, nor libnvrtc.so.13 \
         in such a folder): point it at libnvrtc.so.13 or its folder, or unset it. {}",
        crate::NVRTC_INSTALL_HINT
    )]
    BadEnv {
        /// The variable's value.
        path: String,
    },
    /// The library (or one of its symbols) could not be loaded.
    #[error("cannot load {path}: {msg}")]
    Load {
        /// The library's path, with ` (symbol name)` for a missing symbol.
        path: String,
        /// What the dynamic loader said.
        msg: String,
    },
    /// The library is not the pinned version ([`PINNED_VERSION`]).
    #[error("NVRTC at {path} is version {}.{}; pptm pins {}.{} (newer PTX does not load on driver 580). {}",
        found.0, found.1, PINNED_VERSION.0, PINNED_VERSION.1, crate::NVRTC_INSTALL_HINT)]
    WrongVersion {
        /// The library's path.
        path: String,
        /// Its major and minor version.
        found: (i32, i32),
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("{call} failed: {msg} (nvrtcResult {code})")]
    Api {
        /// The NVRTC function's name.
        call: &'static str,
        /// The `nvrtcResult` it returned.
        code: c_int,
        /// `nvrtcGetErrorString` of it.
        msg: String,
    },
    /// The translation unit did not compile, or compiled with warnings (generated code must
    /// compile cleanly).
    #[error("NVRTC could not compile {name} for {arch}:\n{log}")]
    Compile {
        /// The translation unit's name.
        name: String,
        /// The `--gpu-architecture` it was compiled for (`?` if the options name none).
        arch: String,
        /// NVRTC's program log.
        log: String,
    },
}

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded NVRTC library.
pub struct Nvrtc {
    lib: Library,
    // Kept loaded for as long as `lib`: NVRTC dlopens it by soname at compile time.
    _builtins: Option<Library>,
    path: PathBuf,
    version: (i32, i32),
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Nvrtc {
    /// Finds and loads NVRTC: `$PPTM_NVRTC` (a file or a folder), then the `nvidia/cu13/lib` folder of
    /// python3's site-packages (the pip wheels), then /usr/local/cuda.
    pub fn find() -> Result<Self, NvrtcError> {
        // A PPTM_NVRTC that names nothing is a mistake to report, not a reason to look elsewhere.
        check_env(std::env::var_os("PPTM_NVRTC").map(PathBuf::from))?;
        let candidates = candidates();
        for path in &candidates {
            if path.is_file() {
                return Self::load(path);
            }
        }
        Err(NvrtcError::NotFound {
            searched: candidates.iter().map(|p| p.display().to_string()).collect(),
        })
    }

    /// Loads NVRTC from `path` (libnvrtc.so.13) and checks its version.
    pub fn load(path: &Path) -> Result<Self, NvrtcError> {
        let load_err = |p: &Path, e: libloading::Error| NvrtcError::Load {
            path: p.display().to_string(),
            msg: e.to_string(),
        };
        // NVRTC loads libnvrtc-builtins by soname when it compiles. Loading it first, globally, from
        // the same folder makes that lookup succeed without touching LD_LIBRARY_PATH.
        let builtins = path
            .parent()
            .map(|d| d.join("libnvrtc-builtins.so.13.0"))
            .filter(|p| p.is_file());
        let builtins = match builtins {
            Some(b) => {
                // SAFETY: loading a shared library runs its initialisers; this is NVIDIA's own
                // libnvrtc-builtins, whose initialisers have no preconditions.
                let lib = unsafe {
                    libloading::os::unix::Library::open(
                        Some(&b),
                        libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                    )
                }
                .map_err(|e| load_err(&b, e))?;
                Some(Library::from(lib))
            }
            None => None,
        };
        // SAFETY: as above, for libnvrtc itself.
        let lib = unsafe { Library::new(path) }.map_err(|e| load_err(path, e))?;
        let mut nvrtc = Nvrtc {
            lib,
            _builtins: builtins,
            path: path.to_path_buf(),
            version: (0, 0),
        };
        let version_fn: VersionFn = nvrtc.sym("nvrtcVersion")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes two ints through valid pointers.
        let code = unsafe { version_fn(&mut major, &mut minor) };
        nvrtc.check("nvrtcVersion", code)?;
        nvrtc.version = (major, minor);
        if nvrtc.version != PINNED_VERSION {
            return Err(NvrtcError::WrongVersion {
                path: path.display().to_string(),
                found: nvrtc.version,
            });
        }
        Ok(nvrtc)
    }

    /// NVRTC's major and minor version (always [`PINNED_VERSION`] once loaded).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The library it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sym<T: Copy>(&self, name: &'static str) -> Result<T, NvrtcError> {
        // SAFETY: every `T` used with this function is the C signature NVRTC documents for `name`.
        unsafe { self.lib.get::<T>(name.as_bytes()).map(|s| *s) }.map_err(|e| NvrtcError::Load {
            path: format!("{} (symbol {name})", self.path.display()),
            msg: e.to_string(),
        })
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), NvrtcError> {
        if code == 0 {
            return Ok(());
        }
        let msg = match self.sym::<ErrorStringFn>("nvrtcGetErrorString") {
            // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
            Ok(f) => unsafe { CStr::from_ptr(f(code)) }
                .to_string_lossy()
                .into_owned(),
            Err(_) => "unknown error".into(),
        };
        Err(NvrtcError::Api { call, code, msg })
    }

    /// Compiles `src` (named `name`, with in-memory `headers`) with `options`; returns the PTX.
    pub fn compile(
        &self,
        name: &str,
        src: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<String, NvrtcError> {
        let create: CreateFn = self.sym("nvrtcCreateProgram")?;
        let compile: CompileFn = self.sym("nvrtcCompileProgram")?;
        let log_size: SizeFn = self.sym("nvrtcGetProgramLogSize")?;
        let get_log: GetFn = self.sym("nvrtcGetProgramLog")?;
        let ptx_size: SizeFn = self.sym("nvrtcGetPTXSize")?;
        let get_ptx: GetFn = self.sym("nvrtcGetPTX")?;
        let destroy: DestroyFn = self.sym("nvrtcDestroyProgram")?;

        let cstr = |s: &str| CString::new(s).expect("no NUL in sources or options");
        let c_src = cstr(src);
        let c_name = cstr(name);
        let c_header_texts: Vec<CString> = headers.iter().map(|(_, t)| cstr(t)).collect();
        let c_header_names: Vec<CString> = headers.iter().map(|(n, _)| cstr(n)).collect();
        let header_text_ptrs: Vec<*const c_char> =
            c_header_texts.iter().map(|c| c.as_ptr()).collect();
        let header_name_ptrs: Vec<*const c_char> =
            c_header_names.iter().map(|c| c.as_ptr()).collect();
        let c_opts: Vec<CString> = options.iter().map(|o| cstr(o)).collect();
        let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is to a live NUL-terminated string (or an array of them of the
        // stated length) owned by this frame; NVRTC copies what it keeps.
        let code = unsafe {
            create(
                &mut prog,
                c_src.as_ptr(),
                c_name.as_ptr(),
                headers.len() as c_int,
                header_text_ptrs.as_ptr(),
                header_name_ptrs.as_ptr(),
            )
        };
        self.check("nvrtcCreateProgram", code)?;
        let arch = options
            .iter()
            .find_map(|o| o.strip_prefix("--gpu-architecture="))
            .unwrap_or("?")
            .to_string();
        let result = (|| {
            // SAFETY: `prog` is a live program; the options array has `opt_ptrs.len()` entries.
            let compiled = unsafe { compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            let mut size = 0usize;
            // SAFETY: writes one usize.
            self.check("nvrtcGetProgramLogSize", unsafe {
                log_size(prog, &mut size)
            })?;
            let mut log = vec![0u8; size.max(1)];
            // SAFETY: `log` has the size NVRTC asked for.
            self.check("nvrtcGetProgramLog", unsafe {
                get_log(prog, log.as_mut_ptr().cast())
            })?;
            let log = String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .trim()
                .to_string();
            if compiled != 0 {
                return Err(NvrtcError::Compile {
                    name: name.to_string(),
                    arch: arch.clone(),
                    log,
                });
            }
            // SAFETY: writes one usize.
            self.check("nvrtcGetPTXSize", unsafe { ptx_size(prog, &mut size) })?;
            let mut ptx = vec![0u8; size.max(1)];
            // SAFETY: `ptx` has the size NVRTC asked for.
            self.check("nvrtcGetPTX", unsafe {
                get_ptx(prog, ptx.as_mut_ptr().cast())
            })?;
            let text = String::from_utf8_lossy(&ptx)
                .trim_end_matches('\0')
                .to_string();
            if !log.is_empty() {
                // Warnings are errors: generated code must compile cleanly.
                return Err(NvrtcError::Compile {
                    name: name.to_string(),
                    arch: arch.clone(),
                    log,
                });
            }
            Ok(text)
        })();
        // SAFETY: `prog` was created above and is destroyed once.
        let _ = unsafe { destroy(&mut prog) };
        result
    }
}

/// `PPTM_NVRTC`'s value, if set, must name libnvrtc.so.13 or a folder holding it.
fn check_env(value: Option<PathBuf>) -> Result<(), NvrtcError> {
    let Some(p) = value else { return Ok(()) };
    let file = if p.is_dir() {
        p.join("libnvrtc.so.13")
    } else {
        p.clone()
    };
    if file.is_file() {
        Ok(())
    } else {
        Err(NvrtcError::BadEnv {
            path: p.display().to_string(),
        })
    }
}

/// Where NVRTC is looked for, in order.
fn candidates() -> Vec<PathBuf> {
    const LIB: &str = "libnvrtc.so.13";
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("PPTM_NVRTC") {
        let p = PathBuf::from(p);
        out.push(if p.is_dir() { p.join(LIB) } else { p });
    }
    let script = "import site, sysconfig\n\
                  paths = [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]\n\
                  paths += site.getsitepackages() + [site.getusersitepackages()]\n\
                  print('\\n'.join(paths))";
    for python in ["python3", "python"] {
        if let Ok(o) = Command::new(python).args(["-c", script]).output()
            && o.status.success()
        {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let p = Path::new(line.trim()).join("nvidia/cu13/lib").join(LIB);
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            break;
        }
    }
    out.push(PathBuf::from("/usr/local/cuda/lib64").join(LIB));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pptm_nvrtc_naming_nothing_is_an_error() {
        assert!(check_env(None).is_ok());
        let e = check_env(Some(PathBuf::from("/nonexistent/libnvrtc.so.13"))).unwrap_err();
        assert!(matches!(e, NvrtcError::BadEnv { .. }));
        let shown = e.to_string();
        assert!(
            shown.contains("PPTM_NVRTC is `/nonexistent/libnvrtc.so.13`"),
            "{shown}"
        );
        // A folder without the library is no better.
        let dir = std::env::temp_dir();
        assert!(
            matches!(check_env(Some(dir.clone())), Err(NvrtcError::BadEnv { .. }))
                || dir.join("libnvrtc.so.13").is_file()
        );
    }
}

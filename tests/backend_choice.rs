//! How a runtime picks its backend, and how the test suite tells an absent GPU from a broken one.
//!
//! Each case runs this test binary again in a child process with its own environment
//! (`PPTM_BACKEND`, and `LD_LIBRARY_PATH` pointing at a stand-in `libcuda.so` whose `cuInit` fails
//! as a driver that is installed but cannot start does), so the choice made at process start is
//! what is observed. The child's half of each case is an `#[ignore]`d test that does nothing unless
//! the parent set `PPTM_BACKEND_CHILD`.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use pptm::{BackendKind, Error, Runtime};

const CHILD: &str = "PPTM_BACKEND_CHILD";

/// Runs the ignored test `name` of this binary in a child process with `env` set (a value of
/// `None` removes the variable).
fn run_child(name: &str, env: &[(&str, Option<&str>)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1")
    .env_remove("PPTM_REQUIRE_GPU")
    .env_remove("PPTM_BACKEND");
    for &(k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A folder holding a `libcuda.so` whose `cuInit` returns CUDA_ERROR_UNKNOWN (999), with the two
/// calls that name an error and nothing else: the driver library is found, and fails at its first
/// call. Built with the C
/// compiler that links Rust programs on Linux (`cc`), in a fresh temporary folder: one per call, as
/// the tests that call it run in parallel in one process (a shared folder let one test load the
/// library while the other was rewriting it).
fn broken_driver() -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("pptm-broken-driver-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake_cuda.c");
    std::fs::write(
        &src,
        r#"
int cuInit(unsigned int flags) { (void)flags; return 999; }
int cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_UNKNOWN"; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; *s = "stand-in driver that cannot start"; return 0; }
"#,
    )
    .unwrap();
    let lib = dir.join("libcuda.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `cc` to build the stand-in libcuda.so ({e}); install a C compiler")
        });
    assert!(out.status.success(), "cc failed: {}", text(&out));
    dir
}

/// Whether a real GPU runtime opens in this process (skips are counted as usual).
fn gpu_here() -> bool {
    common::open_gpu("backend_choice (is a GPU here?)", pptm::Config::default()).is_some()
}

#[test]
fn a_driver_that_fails_to_start_fails_a_gpu_test_instead_of_skipping() {
    let dir = broken_driver();
    let out = run_child(
        "child_opens_the_shared_gpu_runtime",
        &[("LD_LIBRARY_PATH", Some(dir.to_str().unwrap()))],
    );
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a broken driver passed a GPU test:\n{log}"
    );
    assert!(log.contains("cannot open the GPU runtime"), "{log}");
    assert!(log.contains("cuInit"), "{log}");
    assert!(!log.contains("SKIPPED"), "{log}");
}

#[test]
fn the_automatic_choice_falls_back_to_the_cpu_on_a_broken_driver_and_says_why() {
    let dir = broken_driver();
    let out = run_child(
        "child_describes_runtime_new",
        &[("LD_LIBRARY_PATH", Some(dir.to_str().unwrap()))],
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("backend: CPU backend"), "{log}");
    assert!(log.contains("the CUDA driver failed"), "{log}");
    assert!(log.contains("cuInit"), "{log}");
    // Forced onto the GPU, the same driver is the driver's error, not "no GPU".
    let out = run_child(
        "child_describes_runtime_new",
        &[
            ("LD_LIBRARY_PATH", Some(dir.to_str().unwrap())),
            ("PPTM_BACKEND", Some("gpu")),
        ],
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("error: Driver { call: \"cuInit\""), "{log}");
}

#[test]
fn runtime_new_takes_the_gpu_when_present_and_obeys_pptm_backend() {
    let gpu = gpu_here();
    let out = run_child("child_describes_runtime_new", &[]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    if gpu {
        assert!(log.contains("backend: GPU backend"), "{log}");
    } else {
        assert!(log.contains("backend: CPU backend"), "{log}");
    }
    for auto in ["auto", ""] {
        let out = run_child(
            "child_describes_runtime_new",
            &[("PPTM_BACKEND", Some(auto))],
        );
        let log = text(&out);
        let want = if gpu {
            "backend: GPU backend"
        } else {
            "backend: CPU backend"
        };
        assert!(log.contains(want), "PPTM_BACKEND={auto:?}: {log}");
    }
    let out = run_child(
        "child_describes_runtime_new",
        &[("PPTM_BACKEND", Some("cpu"))],
    );
    let log = text(&out);
    assert!(log.contains("backend: CPU backend"), "{log}");
    assert!(log.contains("PPTM_BACKEND=cpu"), "{log}");
    let out = run_child(
        "child_describes_runtime_new",
        &[("PPTM_BACKEND", Some("gpu"))],
    );
    let log = text(&out);
    if gpu {
        assert!(log.contains("backend: GPU backend"), "{log}");
    } else {
        assert!(log.contains("error: NoGpu("), "{log}");
    }
    let out = run_child(
        "child_describes_runtime_new",
        &[("PPTM_BACKEND", Some("tpu"))],
    );
    let log = text(&out);
    assert!(log.contains("error: Config("), "{log}");
    assert!(log.contains("expected cpu, gpu or auto"), "{log}");
}

#[test]
#[ignore = "the child half of tests in this file; does nothing unless they run it"]
fn child_opens_the_shared_gpu_runtime() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // What every GPU test does first.
    if let Some(rt) = common::gpu() {
        println!("opened: {}", rt.describe());
    }
}

#[test]
#[ignore = "the child half of tests in this file; does nothing unless they run it"]
fn child_describes_runtime_new() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match Runtime::new() {
        Ok(rt) => {
            println!("backend: {}", rt.describe());
            // The choice is real: the runtime computes on what it says it chose.
            let kind = rt.backend();
            assert!(matches!(kind, BackendKind::Cpu | BackendKind::Gpu));
            let q = rt.upload(&[0.25f32, 0.75]).unwrap();
            let p = rt.upload(&[0.5f32, 0.5]).unwrap();
            let got = pptm::chains::KlComplexity::submit(&rt, &q, &p)
                .unwrap()
                .wait()
                .unwrap();
            let want = 0.25 * (0.5f64).ln() + 0.75 * (1.5f64).ln();
            assert!((f64::from(got) - want).abs() < 1e-6, "{got} vs {want}");
        }
        Err(e @ Error::NoGpu(_)) | Err(e @ Error::Driver { .. }) | Err(e @ Error::Config(_)) => {
            println!("error: {e:?}")
        }
        Err(e) => panic!("unexpected: {e:?}"),
    }
}

/// `Runtime::every_gpu`: one runtime a device, each on its own device and working; without a GPU
/// the same error as `Runtime::gpu` (NoGpu here, where no driver is installed).
#[test]
fn every_gpu_opens_one_runtime_a_device() {
    match Runtime::every_gpu(&pptm::Config::default()) {
        Ok(all) => {
            assert!(!all.is_empty());
            for (i, rt) in all.iter().enumerate() {
                assert_eq!(rt.backend(), BackendKind::Gpu);
                assert_eq!(rt.config().device, i);
                let x = rt.upload(&[1.0f32, 2.0, 3.0]).unwrap();
                assert_eq!(x.to_vec().unwrap(), [1.0, 2.0, 3.0]);
            }
            println!("every_gpu: {} runtime(s)", all.len());
        }
        Err(e) => {
            assert!(
                !gpu_here(),
                "a GPU runtime opens here, but every_gpu failed: {e}"
            );
            assert!(matches!(e, Error::NoGpu(_) | Error::Driver { .. }), "{e:?}");
        }
    }
}

/// `Buffer::copy_from` between runtimes: CPU-backend buffers, a GPU's own buffers, the CPU to a
/// GPU and back, and every pair of GPUs (peer to peer where they allow it); odd sizes, outputs
/// poisoned first, a wrong length a typed error.
#[test]
fn buffers_copy_between_backends_and_gpus() {
    let cpu = Runtime::cpu();
    let sizes = [1usize, 7, 1023, (1 << 20) + 3];
    for &len in &sizes {
        let data = common::uniform(len, -1.0, 1.0);
        let a = cpu.upload(&data).unwrap();
        let mut b = cpu.upload(&vec![f32::NAN; len]).unwrap();
        b.copy_from(&a).unwrap();
        assert_eq!(b.to_vec().unwrap(), data, "cpu to cpu, {len}");
        let short = cpu.alloc::<f32>(len + 1).unwrap();
        assert!(matches!(
            b.copy_from(&short),
            Err(Error::SliceLength { .. })
        ));
    }
    let gpus = match Runtime::every_gpu(&pptm::Config::default()) {
        Ok(g) => g,
        Err(_) => {
            assert!(
                !gpu_here(),
                "a GPU runtime opens here, but every_gpu failed"
            );
            common::skip("backend_choice::buffers_copy_between_backends_and_gpus (GPU part)");
            return;
        }
    };
    if gpus.len() < 2 {
        eprintln!(
            "SKIPPED (one GPU on this host): backend_choice::buffers_copy_between_backends_and_gpus, \
             the copies between two GPUs"
        );
    }
    for &len in &sizes {
        let data = common::uniform(len, -1.0, 1.0);
        let host = cpu.upload(&data).unwrap();
        // CPU to GPU 0, within GPU 0, GPU 0 to every other GPU, and each back to the CPU.
        let mut first = gpus[0].upload(&vec![f32::NAN; len]).unwrap();
        first.copy_from(&host).unwrap();
        let mut same = gpus[0].upload(&vec![f32::NAN; len]).unwrap();
        same.copy_from(&first).unwrap();
        assert_eq!(same.to_vec().unwrap(), data, "cpu to gpu 0 to gpu 0, {len}");
        for (i, rt) in gpus.iter().enumerate().skip(1) {
            let mut there = rt.upload(&vec![f32::NAN; len]).unwrap();
            there.copy_from(&same).unwrap();
            let mut back = cpu.upload(&vec![f32::NAN; len]).unwrap();
            back.copy_from(&there).unwrap();
            assert_eq!(
                back.to_vec().unwrap(),
                data,
                "gpu 0 to gpu {i} to cpu, {len}"
            );
            // And the other way, gathering onto GPU 0.
            let mut gathered = gpus[0].upload(&vec![f32::NAN; len]).unwrap();
            gathered.copy_from(&there).unwrap();
            assert_eq!(gathered.to_vec().unwrap(), data, "gpu {i} to gpu 0, {len}");
            println!(
                "gpu 0 <-> gpu {i}: peer access {}",
                if gpus[0].peer_access(rt) {
                    "on"
                } else {
                    "off (staged by the driver)"
                }
            );
        }
    }
    assert!(gpus[0].peer_access(&gpus[0]));
    assert!(!gpus[0].peer_access(&cpu));
}

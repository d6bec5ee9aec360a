//! A crash report for runs on the GPU host. With `PPTM_CRASH_REPORT=1`, a SIGSEGV or SIGBUS prints
//! the faulting thread's name and stack, then asks every other thread of the process for its own
//! (SIGUSR2), and then hands the signal to the handler that was there before (compute-sanitizer's,
//! or the default one, which ends the process as before).
//!
//! Why: a crash at process exit under a sanitizer (RELIABILITY.md) leaves no trace of which thread
//! was where. Diagnostics only: taking a backtrace allocates, which a signal handler should not;
//! a report that deadlocks is still a crash, and what it printed first names the thread.

use std::backtrace::Backtrace;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The handlers there before ours, for SIGSEGV and SIGBUS.
struct Previous {
    segv: libc::sigaction,
    bus: libc::sigaction,
}

// SAFETY: plain data (handler addresses, flags, a signal mask), only read after it is set.
unsafe impl Sync for Previous {}
unsafe impl Send for Previous {}

static PREVIOUS: OnceLock<Previous> = OnceLock::new();
/// One thread prints at a time.
static PRINTING: Mutex<()> = Mutex::new(());

/// Installs the report once per process, if `PPTM_CRASH_REPORT=1`.
pub fn install_if_asked() {
    if std::env::var("PPTM_CRASH_REPORT").is_ok_and(|v| v == "1") {
        PREVIOUS.get_or_init(|| {
            // SAFETY: installs handlers with a zeroed, then filled, sigaction; the previous
            // ones are kept to hand the signal on.
            unsafe {
                let dump = handler(on_dump as *const () as usize);
                libc::sigaction(libc::SIGUSR2, &dump, std::ptr::null_mut());
                let fault = handler(on_fault as *const () as usize);
                let mut segv: libc::sigaction = std::mem::zeroed();
                let mut bus: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGSEGV, &fault, &mut segv);
                libc::sigaction(libc::SIGBUS, &fault, &mut bus);
                Previous { segv, bus }
            }
        });
    }
}

/// A sigaction that calls `f` with siginfo.
unsafe fn handler(f: usize) -> libc::sigaction {
    // SAFETY: sigaction is plain data; zero is a valid (empty) mask and no flags.
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    a.sa_sigaction = f;
    a.sa_flags = libc::SA_SIGINFO;
    a
}

fn thread_name() -> String {
    std::fs::read_to_string("/proc/thread-self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::SeqCst) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() };
        // SAFETY: plain system calls.
        let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
        {
            let _one = PRINTING.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!(
                "pptm crash report: signal {sig} at address {addr:?} in thread `{}` (tid {me})\n{}",
                thread_name(),
                Backtrace::force_capture()
            );
        }
        let others: Vec<i32> = std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&tid| tid != me)
            .collect();
        eprintln!("pptm crash report: {} other threads", others.len());
        for tid in others {
            // SAFETY: a signal to a thread of this process; its handler only prints.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR2) };
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Hand the signal on: with the previous handler back, the faulting instruction runs again
    // and faults into it.
    if let Some(p) = PREVIOUS.get() {
        let previous = if sig == libc::SIGBUS { &p.bus } else { &p.segv };
        // SAFETY: restores a sigaction the system gave us.
        unsafe { libc::sigaction(sig, previous, std::ptr::null_mut()) };
    }
}

extern "C" fn on_dump(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let _one = PRINTING.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a plain system call.
    let me = unsafe { libc::gettid() };
    eprintln!(
        "pptm crash report: thread `{}` (tid {me})\n{}",
        thread_name(),
        Backtrace::force_capture()
    );
}

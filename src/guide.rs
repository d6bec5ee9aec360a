//! A tour of the API in runnable examples (every block here is a doctest, run by `cargo test`
//! on the CPU backend: `Runtime::cpu()` has the GPU backend's API and computes in f64).
//!
//! # Submitting a chain
//!
//! A chain's derive gives it `submit`: buffers and scalars in, a [`Ticket`](crate::Ticket) out.
//! `wait` gives the result.
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::KlComplexity;
//!
//! let rt = Runtime::cpu();
//! let q = rt.upload(&[0.2f32, 0.3, 0.5])?;
//! let p = rt.upload(&[0.25f32, 0.25, 0.5])?;
//! let kl: f32 = KlComplexity::submit(&rt, &q, &p)?.wait()?;
//! let want = 0.2 * (0.2f64 / 0.25).ln() + 0.3 * (0.3f64 / 0.25).ln();
//! assert!((f64::from(kl) - want).abs() < 1e-6);
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Chains that write a tensor
//!
//! A chain that ends in an elementwise stage writes its `out` buffer; the ticket borrows it
//! mutably until it resolves, so it cannot be read too early.
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::KlTerms;
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[0.5f32, 0.5])?, rt.upload(&[0.25f32, 0.75])?);
//! let mut terms = rt.alloc::<f32>(2)?;
//! KlTerms::submit(&rt, &q, &p, &mut terms)?.wait()?;
//! let got = terms.to_vec()?;
//! assert!((f64::from(got[0]) - 0.5 * 2f64.ln()).abs() < 1e-6);
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Typed errors, never panics
//!
//! Bad input is an [`Error`](crate::Error) that says what to fix.
//!
//! ```
//! use pptm::{Error, Runtime};
//! use pptm::chains::KlComplexity;
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[0.5f32, 0.5])?, rt.upload(&[1.0f32])?);
//! match KlComplexity::submit(&rt, &q, &p) {
//!     Err(Error::LengthMismatch { arg, expected, got, .. }) => {
//!         assert_eq!((arg, expected, got), ("p", 2, 1));
//!     }
//!     other => panic!("expected a length mismatch, got {other:?}"),
//! }
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Buffers
//!
//! Buffers live in device memory on the GPU (host memory on the CPU backend); `write` and
//! `to_vec` copy, and a length that does not fit is an error.
//!
//! ```
//! use pptm::Runtime;
//!
//! let rt = Runtime::cpu();
//! let mut b = rt.upload(&[1.0f32, 2.0, 3.0])?;
//! b.write(&[4.0, 5.0, 6.0])?;
//! assert_eq!(b.to_vec()?, [4.0, 5.0, 6.0]);
//! assert_eq!(b.len(), 3);
//! assert!(b.write(&[1.0, 2.0]).is_err());
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Pipelines: dependent items, one submission
//!
//! Items whose buffers flow from one to the next go into a pipeline; the GPU orders them on the
//! device (docs/pipelines.md). Here the second item reads the terms the first wrote.
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::{KlComplexity, KlTerms};
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[0.5f32, 0.5])?, rt.upload(&[0.25f32, 0.75])?);
//! let mut terms = rt.alloc::<f32>(2)?;
//! let mut p1 = rt.pipeline();
//! let (qi, pi) = (p1.input(&q), p1.input(&p));
//! let t = p1.output(&mut terms);
//! KlTerms::push(&mut p1, qi, pi, t)?;
//! let total = KlComplexity::push(&mut p1, qi, pi)?;
//! let results = p1.wait()?;
//! let want = 0.5 * (2f64.ln() + (0.5f64 / 0.75).ln());
//! assert!((f64::from(results.get(total)?) - want).abs() < 1e-6);
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Kept pipelines: record once, run again
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::KlComplexity;
//!
//! let rt = Runtime::cpu();
//! let mut q = rt.upload(&[0.5f32, 0.5])?;
//! let p = rt.upload(&[0.5f32, 0.5])?;
//! let mut pipe = rt.pipeline();
//! let (qo, pi) = (pipe.output(&mut q), pipe.input(&p));
//! let total = KlComplexity::push(&mut pipe, qo, pi)?;
//! let (first, mut kept) = pipe.wait_and_keep()?;
//! assert_eq!(first.get(total)?, 0.0);
//! kept.buffer_mut(qo)?.write(&[0.25, 0.75])?; // the next run's input
//! let again = kept.run()?;
//! assert!(again.get(total)? != 0.0);
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Loops on the device
//!
//! `repeat` runs its body's items again and again inside one submission (on the GPU, with no
//! host round trip between iterations).
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::KlTerms;
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[0.5f32, 0.5])?, rt.upload(&[0.25f32, 0.75])?);
//! let mut terms = rt.alloc::<f32>(2)?;
//! let mut pipe = rt.pipeline();
//! let (qi, pi, t) = (pipe.input(&q), pipe.input(&p), pipe.output(&mut terms));
//! let lp = pipe.repeat(5, |pipe| KlTerms::push(pipe, qi, pi, t).map(|_| ()))?;
//! assert_eq!(pipe.wait()?.iterations(lp)?, 5);
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! `when` runs its body's items only when an earlier item's value reaches a threshold; on the
//! GPU the device reads the value and runs or skips the body itself, so it may sit inside a
//! `repeat` and decide at every iteration.
//!
//! ```
//! use pptm::Runtime;
//! use pptm::chains::{KlComplexity, KlTerms};
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[0.5f32, 0.5])?, rt.upload(&[0.25f32, 0.75])?);
//! let mut terms = rt.alloc::<f32>(2)?;
//! let mut pipe = rt.pipeline();
//! let (qi, pi, t) = (pipe.input(&q), pipe.input(&p), pipe.output(&mut terms));
//! let kl = KlComplexity::push(&mut pipe, qi, pi)?; // KL(q ‖ p) = 0.144
//! let far = pipe.when(kl, 0.1, |pipe| KlTerms::push(pipe, qi, pi, t).map(|_| ()))?;
//! let near = pipe.when(kl, 0.5, |pipe| KlTerms::push(pipe, qi, pi, t).map(|_| ()))?;
//! let r = pipe.wait()?;
//! assert_eq!((r.runs(far)?, r.runs(near)?), (1, 0));
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Async
//!
//! A ticket is a `Future`: `ticket.await` in an async runtime resolves it without blocking the
//! task's thread (one watcher thread of pptm's wakes awaited tasks). Here it is polled by hand.
//!
//! ```
//! use std::future::Future;
//! use std::task::{Context, Poll, Waker};
//! use pptm::Runtime;
//! use pptm::chains::KlComplexity;
//!
//! let rt = Runtime::cpu();
//! let (q, p) = (rt.upload(&[1.0f32])?, rt.upload(&[1.0f32])?);
//! let mut ticket = std::pin::pin!(KlComplexity::submit(&rt, &q, &p)?);
//! // The CPU backend runs an item this small at submission: the first poll is ready. (A large
//! // one runs on pptm's worker pool, and the poll says `Pending` until it ends.)
//! match ticket.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
//!     Poll::Ready(kl) => assert_eq!(kl?, 0.0),
//!     Poll::Pending => unreachable!("the CPU backend runs small items at once"),
//! }
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Choosing the backend and variant
//!
//! `Runtime::new()` takes the GPU when one is usable and says otherwise; `PPTM_BACKEND=cpu`
//! forces the CPU backend. `describe()` says what was chosen.
//!
//! ```
//! use pptm::{BackendKind, Runtime};
//!
//! let rt = Runtime::new()?;
//! println!("{}", rt.describe());
//! if rt.backend() == BackendKind::Cpu {
//!     assert!(rt.describe().contains("CPU"));
//! }
//! # Ok::<(), pptm::Error>(())
//! ```
//!
//! # Timing
//!
//! [`timing::Stats`](crate::timing::Stats) gives the median and p99 of repeated measurements.
//!
//! ```
//! use std::time::Duration;
//! use pptm::timing::Stats;
//!
//! let s = Stats::of((1..=100).map(Duration::from_micros).collect());
//! assert_eq!(s.median_us, 51.0);
//! assert_eq!(s.p99_us, 100.0);
//! ```

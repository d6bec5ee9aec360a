//! Choices made by timing candidates, remembered on disk: the tile size of a kernel matrix, the
//! blocks of a product, anything whose best value depends on the device and the problem and is
//! cheaper to measure than to model.
//!
//! [`TuneCache::tune`] times each candidate with the caller's function and keeps the fastest, keyed
//! by a [`TuneKey`] (what is tuned, the device, the dtype, the shape). The next call with the same
//! key, in this process or a later one, returns the remembered choice without timing anything and
//! says how long the tuning it skipped took ([`Tuned::saved`]).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use pptm_runtime::tune::{TuneCache, TuneKey};
//!
//! # fn main() -> pptm_runtime::Result<()> {
//! // `TuneCache::open_default()` keeps choices across runs; this one lives in memory.
//! let mut cache = TuneCache::in_memory();
//! let key = TuneKey::new("my_op.tile", "NVIDIA H200", "f32", &[4096, 4096]);
//! let tiles = [64u32, 128, 256];
//! let run = |tile: u32| std::hint::black_box(tile * 2); // the real work, with this tile
//! let tuned = cache.tune(&key, &tiles, |t| t.to_string(), |&tile| {
//!     let start = Instant::now();
//!     for _ in 0..10 {
//!         run(tile);
//!     }
//!     Ok(start.elapsed() / 10)
//! })?;
//! println!("tile {} ({:?} a run)", tuned.choice, tuned.best);
//! // Asked again, the cache answers without timing anything.
//! let again = cache.tune(&key, &tiles, |t| t.to_string(), |_| unreachable!())?;
//! assert!(again.from_cache && again.choice == tuned.choice);
//! cache.save()?;
//! # Ok(())
//! # }
//! ```
//!
//! # The file
//!
//! [`TuneCache::open_default`] reads `tune-v1.json` in `$PPTM_CACHE_DIR`, or else in `pptm/` under
//! the user's cache folder (`$XDG_CACHE_HOME` or `~/.cache` on Linux, `~/Library/Caches` on macOS,
//! `%LOCALAPPDATA%` on Windows). It is JSON:
//!
//! ```json
//! {
//!   "format": "pptm-tune/1",
//!   "entries": [
//!     { "what": "kernel_matrix.tile", "device": "NVIDIA H200", "dtype": "c64",
//!       "shape": [16384, 4096], "choice": "128x128", "best_ns": 812345, "tuned_in_ns": 91234567 }
//!   ]
//! }
//! ```
//!
//! `choice` is the winning candidate's label, `best_ns` its time, `tuned_in_ns` how long the whole
//! tuning took. A file that cannot be read or parsed, or that has another `format`, is ignored with
//! a warning (`tracing`) and replaced at the next [`TuneCache::save`]; so is an entry whose choice is
//! no longer among the candidates (the code changed): it is tuned again. Saving writes a temporary
//! file beside the cache and renames it over, so a reader never sees half a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The file format's name and version, in the file's `format` field.
pub const FORMAT: &str = "pptm-tune/1";
/// The cache file's name in its folder.
pub const FILE_NAME: &str = "tune-v1.json";

/// What a tuned choice is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TuneKey {
    /// What is tuned, e.g. `kernel_matrix.tile`.
    pub what: String,
    /// The device's name as the driver gives it ([`crate::GpuInfo`]'s `name`).
    pub device: String,
    /// The element type, e.g. `f32` or `c64`.
    pub dtype: String,
    /// The problem's dimensions.
    pub shape: Vec<u64>,
}

impl TuneKey {
    /// A key from its parts.
    pub fn new(what: &str, device: &str, dtype: &str, shape: &[u64]) -> TuneKey {
        TuneKey {
            what: what.into(),
            device: device.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    #[serde(flatten)]
    key: TuneKey,
    choice: String,
    best_ns: u64,
    tuned_in_ns: u64,
}

#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    entries: Vec<Entry>,
}

/// A choice [`TuneCache::tune`] made or remembered.
#[derive(Debug)]
pub struct Tuned<'c, C> {
    /// The fastest candidate.
    pub choice: &'c C,
    /// Its time, as measured when it was tuned.
    pub best: Duration,
    /// Whether the choice came from the cache (nothing was timed).
    pub from_cache: bool,
    /// The time this call spent timing candidates (zero when the cache had the choice).
    pub spent: Duration,
    /// The tuning time the cache saved this call: what tuning this key took when it was done
    /// (zero when it was done now).
    pub saved: Duration,
}

/// Tuned choices by key, read from and saved to one file.
#[derive(Debug)]
pub struct TuneCache {
    path: Option<PathBuf>,
    entries: BTreeMap<TuneKey, Entry>,
    dirty: bool,
}

/// The folder [`TuneCache::open_default`] uses: `$PPTM_CACHE_DIR`, or `pptm/` in the user's cache
/// folder; `None` when neither is known (no home folder).
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("PPTM_CACHE_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::cache_dir().map(|d| d.join("pptm")),
    }
}

impl TuneCache {
    /// The cache in its default place ([`default_dir`]), or an in-memory one (with a warning)
    /// where there is no such folder.
    pub fn open_default() -> TuneCache {
        match default_dir() {
            Some(dir) => TuneCache::open(dir.join(FILE_NAME)),
            None => {
                tracing::warn!("no cache folder (set PPTM_CACHE_DIR): tuned choices are not kept");
                TuneCache::in_memory()
            }
        }
    }

    /// A cache that lives as long as the value: nothing is read or saved.
    pub fn in_memory() -> TuneCache {
        TuneCache {
            path: None,
            entries: BTreeMap::new(),
            dirty: false,
        }
    }

    /// The cache at `path`. A missing file is an empty cache; an unreadable, corrupt or foreign
    /// one is ignored with a warning (and replaced at the next save).
    pub fn open(path: impl Into<PathBuf>) -> TuneCache {
        let path = path.into();
        let mut cache = TuneCache {
            path: Some(path.clone()),
            entries: BTreeMap::new(),
            dirty: false,
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return cache,
            Err(e) => {
                tracing::warn!(
                    "tuning cache {}: cannot read it ({e}); ignoring it",
                    path.display()
                );
                return cache;
            }
        };
        match serde_json::from_str::<File>(&text) {
            Ok(f) if f.format == FORMAT => {
                for e in f.entries {
                    cache.entries.insert(e.key.clone(), e);
                }
            }
            Ok(f) => tracing::warn!(
                "tuning cache {}: format `{}`, not `{FORMAT}`; ignoring it",
                path.display(),
                f.format
            ),
            Err(e) => tracing::warn!(
                "tuning cache {}: not a tuning cache ({e}); ignoring it",
                path.display()
            ),
        }
        cache
    }

    /// Where the cache is saved (`None` for an in-memory one).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// How many choices it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The remembered choice's label for `key`, if any.
    pub fn choice(&self, key: &TuneKey) -> Option<&str> {
        self.entries.get(key).map(|e| e.choice.as_str())
    }

    /// The fastest of `candidates` for `key`: remembered, or found by timing each with `time`
    /// (which runs the candidate as the real work would and returns how long it took; it is
    /// called once per candidate, so it should warm up and repeat inside). `label` names a
    /// candidate in the file and must tell them apart.
    ///
    /// Errors: [`Error::BadArguments`] for no candidates or two with one label; the first error
    /// `time` returns. A candidate whose time is an error is not skipped: tuning stops, as the
    /// real work would fail the same way.
    pub fn tune<'c, C>(
        &mut self,
        key: &TuneKey,
        candidates: &'c [C],
        label: impl Fn(&C) -> String,
        mut time: impl FnMut(&C) -> Result<Duration>,
    ) -> Result<Tuned<'c, C>> {
        let labels: Vec<String> = candidates.iter().map(&label).collect();
        let bad = |reason: String| Error::BadArguments {
            chain: "tune",
            reason,
        };
        if candidates.is_empty() {
            return Err(bad(format!("no candidates to tune `{}`", key.what)));
        }
        if let Some(i) = (1..labels.len()).find(|&i| labels[..i].contains(&labels[i])) {
            return Err(bad(format!(
                "two candidates for `{}` are labelled `{}`",
                key.what, labels[i]
            )));
        }
        if let Some(e) = self.entries.get(key) {
            if let Some(i) = labels.iter().position(|l| *l == e.choice) {
                return Ok(Tuned {
                    choice: &candidates[i],
                    best: Duration::from_nanos(e.best_ns),
                    from_cache: true,
                    spent: Duration::ZERO,
                    saved: Duration::from_nanos(e.tuned_in_ns),
                });
            }
            tracing::info!(
                "tuning cache: `{}` is no longer a candidate for {key:?}; tuning again",
                e.choice
            );
        }
        let start = Instant::now();
        let mut best: Option<(usize, Duration)> = None;
        for (i, c) in candidates.iter().enumerate() {
            let t = time(c)?;
            tracing::debug!("tuning {key:?}: {} took {t:?}", labels[i]);
            if best.is_none_or(|(_, b)| t < b) {
                best = Some((i, t));
            }
        }
        let spent = start.elapsed();
        let (i, t) = best.expect("at least one candidate");
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.entries.insert(
            key.clone(),
            Entry {
                key: key.clone(),
                choice: labels[i].clone(),
                best_ns: nanos(t),
                tuned_in_ns: nanos(spent),
            },
        );
        self.dirty = true;
        Ok(Tuned {
            choice: &candidates[i],
            best: t,
            from_cache: false,
            spent,
            saved: Duration::ZERO,
        })
    }

    /// Writes the cache to its file if anything was tuned since it was opened (nothing for an
    /// in-memory cache). The folder is created if need be; the file is replaced whole. Choices
    /// another process saved there meanwhile are kept (this cache's own win for a key both
    /// tuned), so processes tuning different keys side by side do not undo each other.
    ///
    /// Errors: [`Error::Config`] naming the path and what failed.
    pub fn save(&mut self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if !self.dirty {
            return Ok(());
        }
        let fail = |what: &str, e: std::io::Error| {
            Error::Config(format!("tuning cache {}: {what}: {e}", path.display()))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| fail("creating its folder", e))?;
        }
        let mut merged = match std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<File>(&t).ok())
        {
            Some(f) if f.format == FORMAT => {
                f.entries.into_iter().map(|e| (e.key.clone(), e)).collect()
            }
            _ => BTreeMap::new(),
        };
        merged.extend(self.entries.iter().map(|(k, e)| (k.clone(), e.clone())));
        let file = File {
            format: FORMAT.into(),
            entries: merged.values().cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&file).expect("plain data serialises");
        // A name no other saver uses at the same time: this process's id, and a count within it.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("json.tmp-{}-{n}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| fail("writing", e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail("replacing it", e)
        })?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pptm-tune-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn key() -> TuneKey {
        TuneKey::new("kernel_matrix.tile", "NVIDIA H200", "c64", &[16384, 4096])
    }

    const TILES: [u32; 3] = [64, 128, 256];
    /// A made-up cost: 128 is fastest.
    fn cost(t: &u32) -> Duration {
        Duration::from_micros(u64::from(t.abs_diff(128)) + 10)
    }

    #[test]
    fn the_fastest_is_chosen_saved_and_reused_without_timing() {
        let dir = temp_dir("reuse");
        let path = dir.join(FILE_NAME);
        let timed = Cell::new(0);
        let time = |t: &u32| {
            timed.set(timed.get() + 1);
            std::thread::sleep(Duration::from_millis(2));
            Ok(cost(t))
        };
        let mut cache = TuneCache::open(&path);
        assert!(cache.is_empty());
        let first = cache.tune(&key(), &TILES, u32::to_string, time).unwrap();
        assert_eq!((*first.choice, first.from_cache), (128, false));
        assert_eq!(first.best, Duration::from_micros(10));
        assert!(first.spent >= Duration::from_millis(6) && first.saved.is_zero());
        let spent = first.spent;
        assert_eq!(timed.get(), 3);
        cache.save().unwrap();

        let mut again = TuneCache::open(&path);
        assert_eq!(again.choice(&key()), Some("128"));
        let second = again.tune(&key(), &TILES, u32::to_string, time).unwrap();
        assert_eq!((*second.choice, second.from_cache), (128, true));
        assert!(second.spent.is_zero());
        // The saved time is the first tuning's, to the nanosecond.
        assert_eq!(second.saved, spent);
        assert_eq!(timed.get(), 3, "nothing was timed the second time");

        // Another shape is another key.
        let other = TuneKey::new("kernel_matrix.tile", "NVIDIA H200", "c64", &[4096, 4096]);
        assert!(
            !again
                .tune(&other, &TILES, u32::to_string, time)
                .unwrap()
                .from_cache
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_and_foreign_files_are_ignored_and_replaced() {
        let dir = temp_dir("corrupt");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE_NAME);
        for text in [
            "not json at all {",
            r#"{"format": "someone-else/3", "entries": []}"#,
            r#"{"format": "pptm-tune/1", "entries": [{"what": 1}]}"#,
            "",
        ] {
            std::fs::write(&path, text).unwrap();
            let mut cache = TuneCache::open(&path);
            assert!(cache.is_empty(), "{text}");
            let t = cache
                .tune(&key(), &TILES, u32::to_string, |t| Ok(cost(t)))
                .unwrap();
            assert!(!t.from_cache);
            cache.save().unwrap();
            assert_eq!(TuneCache::open(&path).choice(&key()), Some("128"));
        }
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn saving_keeps_what_another_process_saved_meanwhile() {
        let dir = temp_dir("merge");
        let path = dir.join(FILE_NAME);
        let (mut one, mut two) = (TuneCache::open(&path), TuneCache::open(&path));
        let other = TuneKey::new("kernel_matrix.tile", "NVIDIA H200", "c64", &[4096, 4096]);
        one.tune(&key(), &TILES, u32::to_string, |t| Ok(cost(t)))
            .unwrap();
        two.tune(&other, &[256u32, 512], u32::to_string, |t| Ok(cost(t)))
            .unwrap();
        one.save().unwrap();
        two.save().unwrap();
        let both = TuneCache::open(&path);
        assert_eq!(both.len(), 2);
        assert_eq!(both.choice(&key()), Some("128"));
        assert_eq!(both.choice(&other), Some("256"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_choice_that_is_no_longer_a_candidate_is_tuned_again() {
        let mut cache = TuneCache::in_memory();
        cache
            .tune(&key(), &TILES, u32::to_string, |t| Ok(cost(t)))
            .unwrap();
        let fewer = [64u32, 256];
        let t = cache
            .tune(&key(), &fewer, u32::to_string, |t| Ok(cost(t)))
            .unwrap();
        assert!(!t.from_cache);
        assert_eq!(cache.choice(&key()), Some("64"));
        // In memory: save has nowhere to write and succeeds.
        assert!(cache.path().is_none());
        cache.save().unwrap();
    }

    #[test]
    fn bad_candidates_and_failing_timings_are_errors() {
        let mut cache = TuneCache::in_memory();
        let none: [u32; 0] = [];
        let err = cache
            .tune(&key(), &none, u32::to_string, |t| Ok(cost(t)))
            .unwrap_err();
        assert!(err.to_string().contains("no candidates"), "{err}");
        let err = cache
            .tune(&key(), &TILES, |_| "same".into(), |t| Ok(cost(t)))
            .unwrap_err();
        assert!(err.to_string().contains("labelled `same`"), "{err}");
        let err = cache
            .tune(&key(), &TILES, u32::to_string, |_| {
                Err(Error::Config("the candidate failed".into()))
            })
            .unwrap_err();
        assert!(err.to_string().contains("the candidate failed"), "{err}");
        assert!(
            cache.is_empty(),
            "nothing is remembered from a failed tuning"
        );
    }

    #[test]
    fn an_unwritable_place_is_a_typed_error() {
        let dir = temp_dir("unwritable");
        std::fs::create_dir_all(&dir).unwrap();
        // The cache's folder is a file.
        let blocker = dir.join("file");
        std::fs::write(&blocker, "x").unwrap();
        let mut cache = TuneCache::open(blocker.join(FILE_NAME));
        cache
            .tune(&key(), &TILES, u32::to_string, |t| Ok(cost(t)))
            .unwrap();
        let err = cache.save().unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains("creating its folder"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

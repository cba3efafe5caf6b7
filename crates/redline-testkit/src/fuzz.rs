//! A small mutation fuzzer for the readers of user files (IDX/gzip, .npy,
//! CSV, safetensors, config, run records, TensorBoard events).
//!
//! `cargo fuzz` needs a nightly toolchain, which neither this machine nor CI
//! has, so this runs inside `cargo test`: each target starts from a corpus of
//! valid seed files kept in the repository (`testdata/fuzz/<target>/`), runs
//! every seed and every prefix of it at a few cut points, then mutates seeds
//! for a time budget (`REDLINE_FUZZ_SECS`, default 20 s a target) with the
//! mutations coverage-guided fuzzers use on binary formats: bit flips,
//! interesting bytes and integers (0, 1, -1, `u32::MAX`, `i32::MAX`, powers of
//! two, the input's own length) written little- and big-endian over length
//! fields, deletions, duplications, truncations, splices of two seeds, and
//! for text the numbers a hostile user types (`1e308`, `nan`, `-0`,
//! `99999999999999999999`). The stream is seeded (`REDLINE_FUZZ_SEED`,
//! default 0), so a run is reproducible. A check that panics fails the test
//! with the input saved under `target/fuzz-crashes/` (and printed in hex when short).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one fuzz run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's name.
    pub target: String,
    /// Seeds in its corpus.
    pub seeds: usize,
    /// Inputs checked (seeds, prefixes and mutants).
    pub runs: u64,
    /// Seconds spent.
    pub secs: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz {}: {} inputs from {} seeds in {:.1} s, no panic",
            self.target, self.runs, self.seeds, self.secs
        )
    }
}

/// The time budget of one target: `REDLINE_FUZZ_SECS` seconds, default 20.
pub fn budget() -> Duration {
    let secs = std::env::var("REDLINE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(20.0);
    Duration::from_secs_f64(secs)
}

/// The repository's `testdata/fuzz/<target>` folder.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/fuzz")
        .join(target)
}

/// Every file of the target's corpus, in name order.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!seeds.is_empty(), "fuzz corpus {} is empty", dir.display());
    seeds
}

/// Runs `check` on the corpus of `target`, its prefixes and mutants for
/// [`budget`]; panics (failing the test) with the input when `check` panics.
pub fn fuzz(target: &str, check: impl Fn(&[u8])) -> Report {
    fuzz_seeds(target, &corpus(target), budget(), check)
}

/// [`fuzz`] over the given seeds and budget.
pub fn fuzz_seeds(
    target: &str,
    seeds: &[Vec<u8>],
    budget: Duration,
    check: impl Fn(&[u8]),
) -> Report {
    let seed = std::env::var("REDLINE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0u64);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = Instant::now();
    let mut runs = 0u64;
    let mut run = |input: &[u8]| {
        runs += 1;
        if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
            crashed(target, input);
        }
    };
    for s in seeds {
        run(s);
        for cut in [0, 1, 4, 8, s.len() / 2, s.len().saturating_sub(1)] {
            run(&s[..cut.min(s.len())]);
        }
    }
    while start.elapsed() < budget {
        let mut input = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..=4) {
            mutate(&mut input, seeds, &mut rng);
        }
        run(&input);
    }
    let report = Report {
        target: target.to_string(),
        seeds: seeds.len(),
        runs,
        secs: start.elapsed().as_secs_f64(),
    };
    eprintln!("{report}");
    report
}

/// Saves a crashing input and fails with where it is.
fn crashed(target: &str, input: &[u8]) -> ! {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-crashes");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{target}-{}.bin", input.len()));
    let _ = std::fs::write(&path, input);
    let hex: String = if input.len() <= 256 {
        input.iter().map(|b| format!("{b:02x}")).collect()
    } else {
        format!("({} bytes)", input.len())
    };
    panic!(
        "fuzz {target}: the check panicked on an input saved as {}: {hex}",
        path.display()
    );
}

/// Integers that cross bounds when written over a length or count field.
fn interesting(len: usize, rng: &mut ChaCha8Rng) -> u64 {
    const VALUES: [u64; 12] = [
        0,
        1,
        2,
        0x7f,
        0x80,
        0xff,
        0xffff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        1 << 40,
        u64::MAX,
    ];
    match rng.random_range(0..4) {
        0 => len as u64,
        1 => (len as u64).wrapping_add(rng.random_range(0..16)),
        _ => VALUES[rng.random_range(0..VALUES.len())],
    }
}

/// Numbers a hostile user types into text formats.
const TEXT_NUMBERS: [&str; 10] = [
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "-0",
    "99999999999999999999",
    "-1",
    "0",
    "4294967296",
    "1e-320",
];

/// Applies one random mutation.
fn mutate(input: &mut Vec<u8>, seeds: &[Vec<u8>], rng: &mut ChaCha8Rng) {
    const MAX: usize = 1 << 20;
    let len = input.len();
    let at = |rng: &mut ChaCha8Rng| {
        if len == 0 {
            0
        } else {
            rng.random_range(0..len)
        }
    };
    match rng.random_range(0..10) {
        0 if len > 0 => {
            let i = at(rng);
            input[i] ^= 1 << rng.random_range(0..8);
        }
        1 if len > 0 => {
            let i = at(rng);
            input[i] = [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)];
        }
        2 if len >= 4 => {
            let i = rng.random_range(0..=len - 4);
            let v = interesting(len, rng) as u32;
            let b = if rng.random() {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            input[i..i + 4].copy_from_slice(&b);
        }
        3 if len >= 8 => {
            let i = rng.random_range(0..=len - 8);
            let v = interesting(len, rng);
            input[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        4 if len > 0 => {
            let i = at(rng);
            let n = rng.random_range(1..=(len - i).min(64));
            input.drain(i..i + n);
        }
        5 if len > 0 && len < MAX => {
            let i = at(rng);
            let n = rng.random_range(1..=(len - i).min(64));
            let chunk = input[i..i + n].to_vec();
            let j = at(rng);
            input.splice(j..j, chunk);
        }
        6 => input.truncate(at(rng)),
        7 => {
            let other = &seeds[rng.random_range(0..seeds.len())];
            let (i, j) = (at(rng), rng.random_range(0..=other.len()));
            input.truncate(i);
            input.extend_from_slice(&other[j..]);
        }
        8 if len < MAX => {
            let i = at(rng);
            let n = rng.random_range(1..16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            input.splice(i..i, bytes);
        }
        _ => {
            // A run of ASCII digits becomes a hostile number.
            let starts: Vec<usize> = (0..len)
                .filter(|&i| {
                    input[i].is_ascii_digit() && (i == 0 || !input[i - 1].is_ascii_digit())
                })
                .collect();
            if let Some(&i) = starts.get(if starts.is_empty() {
                0
            } else {
                rng.random_range(0..starts.len())
            }) {
                let end = (i..len)
                    .find(|&k| !input[k].is_ascii_digit())
                    .unwrap_or(len);
                let n = TEXT_NUMBERS[rng.random_range(0..TEXT_NUMBERS.len())];
                input.splice(i..end, n.bytes());
            }
        }
    }
}

/// Paths that are not regular files, each with `name` (so a reader picks it
/// by its extension) in its own folder under `dir`: a FIFO, links to
/// `/dev/zero`, `/dev/urandom` and `/dev/null`, a dangling link, a loop of
/// links, and a folder. A reader given any of them must refuse it, not
/// block, read forever or panic.
pub fn special_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut make = |kind: &str, f: &dyn Fn(&Path) -> std::io::Result<()>| {
        let folder = dir.join(kind);
        let p = folder.join(name);
        let made = std::fs::create_dir_all(&folder).and_then(|()| f(&p));
        if let Err(e) = made {
            panic!("making the {kind} {}: {e}", p.display());
        }
        out.push(p);
    };
    make("fifo", &|p| {
        let status = std::process::Command::new("mkfifo").arg(p).status()?;
        match status.success() {
            true => Ok(()),
            false => Err(std::io::Error::other("mkfifo failed")),
        }
    });
    for dev in ["/dev/zero", "/dev/urandom", "/dev/null"] {
        let kind = dev.trim_start_matches("/dev/");
        make(kind, &|p| std::os::unix::fs::symlink(dev, p));
    }
    make("dangling", &|p| {
        std::os::unix::fs::symlink("/nonexistent/redline", p)
    });
    make("loop", &|p| std::os::unix::fs::symlink(p, p));
    make("folder", &|p| std::fs::create_dir_all(p));
    out
}

/// Runs `f` on another thread and panics when it has not returned within
/// `limit`: a reader blocked on a FIFO or reading `/dev/zero` fails the test
/// instead of hanging it (the stuck thread is left behind).
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {limit:?} (blocked or reading forever)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_check_fails_with_the_input() {
        let seeds = vec![b"abc".to_vec()];
        let got = catch_unwind(AssertUnwindSafe(|| {
            fuzz_seeds("selftest", &seeds, Duration::from_millis(50), |b| {
                assert!(!b.contains(&b'x'), "found x");
            })
        }));
        // Some mutant holds an 'x' (random bytes, bit flips) within the budget.
        let msg = got
            .err()
            .and_then(|e| e.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(msg.contains("fuzz selftest: the check panicked"), "{msg}");
    }

    #[test]
    fn mutants_cover_prefixes_and_run_within_the_budget() {
        let seeds = vec![vec![1u8; 32], b"12,34\n".to_vec()];
        let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let r = fuzz_seeds("selftest", &seeds, Duration::from_millis(100), |b| {
            seen.borrow_mut().insert(b.len());
        });
        assert!(r.runs > 100, "{r}");
        assert!(seen.borrow().contains(&0) && seen.borrow().contains(&16));
        assert!(r.secs < 5.0);
    }
}

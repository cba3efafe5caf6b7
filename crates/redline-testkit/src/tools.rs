//! Where the external tools are looked for, and what a test does without one.
//!
//! A test asks for its tool and returns when it is missing:
//!
//! ```no_run
//! let Some(python) = redline_testkit::tools::need_tensorboard_python() else {
//!     return;
//! };
//! # let _ = python;
//! ```
//!
//! The `need_*` functions hand a missing tool's reason to [`missing`], which
//! prints a `skipped: ...` note, or panics when `REDLINE_REQUIRE_TOOLS=1` (CI
//! sets it, so a tool that failed to install cannot pass as a silent skip).

use std::path::{Path, PathBuf};
use std::process::Command;

/// True when `REDLINE_REQUIRE_TOOLS=1`: a missing tool fails the test instead
/// of skipping it.
pub fn require_tools() -> bool {
    std::env::var("REDLINE_REQUIRE_TOOLS").as_deref() == Ok("1")
}

/// Reports a missing tool: `what` names it (`"chromium"`), `why` says what was
/// tried (the `Err` of [`tensorboard_python`] or [`chromium`]).
///
/// Prints `skipped: ...` to stderr so the caller can return, or panics with
/// the same message when [`require_tools`] is set; the panic names the
/// caller's line, not this one.
#[track_caller]
pub fn missing(what: &str, why: &str) {
    let msg = format!(
        "no {what} found ({why}). HINT: run scripts/setup-test-tools.sh \
         and export the variables it prints"
    );
    if require_tools() {
        panic!("REDLINE_REQUIRE_TOOLS=1: {msg}");
    }
    eprintln!("skipped: {msg}");
}

/// Candidate interpreters for [`tensorboard_python`], in the order they are
/// tried, each with where it came from.
fn python_candidates() -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("REDLINE_TB_PYTHON") {
        out.push(("$REDLINE_TB_PYTHON", PathBuf::from(p)));
    }
    out.push((
        "default venv",
        PathBuf::from("/root/.venvs/redline-tb/bin/python"),
    ));
    if let Some(home) = std::env::var_os("HOME") {
        let p = Path::new(&home).join(".cache/redline-tools/tb-venv/bin/python");
        out.push(("setup-test-tools.sh venv", p));
    }
    out
}

/// A Python that can `import tensorboard`: `$REDLINE_TB_PYTHON`, then
/// `/root/.venvs/redline-tb/bin/python`, then
/// `$HOME/.cache/redline-tools/tb-venv/bin/python` (made by
/// `scripts/setup-test-tools.sh`). The first that imports it wins; `Err`
/// lists every candidate and why it failed.
pub fn tensorboard_python() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    for (source, python) in python_candidates() {
        if !python.exists() {
            tried.push(format!("{} ({source}): not found", python.display()));
            continue;
        }
        match Command::new(&python)
            .args(["-c", "import tensorboard"])
            .output()
        {
            Ok(o) if o.status.success() => return Ok(python),
            Ok(o) => tried.push(format!(
                "{} ({source}): cannot import tensorboard: {}",
                python.display(),
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Err(e) => tried.push(format!("{} ({source}): {e}", python.display())),
        }
    }
    Err(format!("tried: {}", tried.join("; ")))
}

/// The Chromium binary: `$REDLINE_CHROMIUM`, else `/usr/bin/chromium`. `Err`
/// names the path that is not a file.
pub fn chromium() -> Result<PathBuf, String> {
    let (source, path) = match std::env::var_os("REDLINE_CHROMIUM") {
        Some(p) => ("$REDLINE_CHROMIUM", PathBuf::from(p)),
        None => (
            "default; set REDLINE_CHROMIUM to use another",
            PathBuf::from("/usr/bin/chromium"),
        ),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} ({source}): not found", path.display()))
    }
}

/// [`tensorboard_python`], or `None` after [`missing`] reported why not.
#[track_caller]
pub fn need_tensorboard_python() -> Option<PathBuf> {
    need(tensorboard_python(), "Python with tensorboard")
}

/// [`chromium`], or `None` after [`missing`] reported why not.
#[track_caller]
pub fn need_chromium() -> Option<PathBuf> {
    need(chromium(), "chromium")
}

#[track_caller]
fn need(found: Result<PathBuf, String>, what: &str) -> Option<PathBuf> {
    found.map_err(|why| missing(what, &why)).ok()
}

/// `mpirun -n <ranks>` (OpenMPI's, from `scripts/setup-test-tools.sh`) set up
/// for tests: `--oversubscribe` (this machine may have fewer cores than
/// ranks) and allowed to run as root (containers and CI run as root).
/// Panics with the fix when `mpirun` is missing: the tests that call this
/// are built only with the `mpi` feature, which needs MPI installed.
pub fn mpirun(ranks: usize) -> Command {
    let found = Command::new("mpirun").arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        panic!(
            "no mpirun on PATH, but this test was built with the `mpi` feature. \
             HINT: run scripts/setup-test-tools.sh (it installs Debian's openmpi-bin)"
        );
    }
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Shared memory and loopback TCP only; no probing for fabrics the
        // machine does not have.
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .args(["--oversubscribe", "-n", &ranks.to_string()]);
    cmd
}

//! Picking and creating the run folder, and writing its files whole.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub use redline_core::time::unix_now;

/// `(YYYYmmdd-HHMMSS, YYYY-mm-dd HH:MM:SS UTC)` of a Unix time.
pub fn utc_stamp(unix: f64) -> (String, String) {
    let t = redline_core::time::Utc::from_unix(unix);
    (t.stamp(), t.to_string())
}

/// Picks and creates the run folder: `explicit` when given (refused if it
/// already holds a run, or anything at all, so nothing is overwritten), else
/// `<base>/<stamp>-<model>` (with `-2`, `-3`, ... when taken). `model` may
/// come from a file (a model file's `name`), so it is made one safe path
/// component first: the folder is always a child of `base`.
pub fn create(
    explicit: Option<&Path>,
    base: &Path,
    model: &str,
    started_unix: f64,
) -> Result<PathBuf> {
    let dir = match explicit {
        Some(d) => {
            if d.join("summary.json").exists() || d.join("metrics.jsonl").exists() {
                return Err(Error::Exists(d.to_path_buf()));
            }
            if let Some(entries) = contents(d) {
                return Err(Error::NotEmpty {
                    dir: d.to_path_buf(),
                    entries,
                });
            }
            d.to_path_buf()
        }
        None => {
            let stamp = utc_stamp(started_unix).0;
            let model = redline_core::files::safe_component(model);
            let first = base.join(format!("{stamp}-{model}"));
            let mut dir = first.clone();
            let mut n = 1;
            while dir.exists() {
                n += 1;
                dir = PathBuf::from(format!("{}-{n}", first.display()));
            }
            dir
        }
    };
    std::fs::create_dir_all(&dir).map_err(Error::io("creating the run folder", &dir))?;
    Ok(dir)
}

/// What the existing folder `dir` holds, as the first few names (sorted)
/// and the count; `None` for a folder that is empty or not there.
fn contents(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        return None;
    }
    names.sort();
    let shown: Vec<String> = names
        .iter()
        .take(4)
        .map(|n| redline_core::text::clip(n, 60))
        .collect();
    Some(match names.len() {
        n if n > shown.len() => format!("{}, ... ({n} entries)", shown.join(", ")),
        1 => shown.join(", "),
        n => format!("{} ({n} entries)", shown.join(", ")),
    })
}

/// The files a run folder holds (docs/run-dir.md): an output the user names
/// (`--save`, `--metrics`) must not be one of them.
const RUN_FILES: [&str; 15] = [
    "config.toml",
    "inputs.json",
    "segments.json",
    "model.toml",
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "breakdown.json",
    "profile.json",
    "profile.txt",
    "trace.json",
    "report.html",
    "pid",
    ".space-reserve",
    "checkpoints",
];

/// Whether a run folder writes a file of this name itself.
pub fn is_run_file(name: &str) -> bool {
    RUN_FILES.contains(&name) || name.starts_with("events.out.tfevents.")
}

/// Writes `text` to `path` through a temporary file, `fsync` and a rename,
/// so a reader (or a crash, or a full disk) never sees half a file, and no
/// temporary file is left behind on failure.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    redline_core::files::write_atomic(path, text.as_bytes()).map_err(Error::io("writing", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_folder_holding_a_run_is_refused() -> Result<()> {
        let t = tempfile::tempdir().map_err(Error::io("creating", "a temp folder"))?;
        let dir = t.path().join("r");
        assert_eq!(create(Some(&dir), t.path(), "mlp", 0.0)?, dir);
        write_atomic(&dir.join("summary.json"), "{}")?;
        let err = create(Some(&dir), t.path(), "mlp", 0.0)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("already holds a run")));
        Ok(())
    }

    /// A folder of the user's own files is refused with what it holds; an
    /// empty one is taken. Before, `--run-dir` wrote over a user's
    /// `config.toml`, `metrics.csv` and `report.html` in it.
    #[test]
    fn explicit_folder_holding_other_files_is_refused() -> Result<()> {
        let t = tempfile::tempdir().map_err(Error::io("creating", "a temp folder"))?;
        let dir = t.path().join("mine");
        std::fs::create_dir(&dir).map_err(Error::io("creating", &dir))?;
        assert_eq!(
            create(Some(&dir), t.path(), "mlp", 0.0)?,
            dir,
            "empty: taken"
        );
        for f in ["config.toml", "report.html", "notes.txt", "a", "b"] {
            write_atomic(&dir.join(f), "mine")?;
        }
        let err = create(Some(&dir), t.path(), "mlp", 0.0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("not empty") && err.contains("a, b, config.toml, notes.txt, ... (5"),
            "{err}"
        );
        let kept = std::fs::read_to_string(dir.join("config.toml")).unwrap_or_default();
        assert_eq!(kept, "mine");
        Ok(())
    }

    #[test]
    fn automatic_folders_are_stamped_and_never_reused() -> Result<()> {
        let t = tempfile::tempdir().map_err(Error::io("creating", "a temp folder"))?;
        let a = create(None, t.path(), "mlp", 0.0)?;
        let b = create(None, t.path(), "mlp", 0.0)?;
        assert_eq!(a, t.path().join("19700101-000000-mlp"));
        assert_eq!(b, t.path().join("19700101-000000-mlp-2"));
        Ok(())
    }

    #[test]
    fn a_model_name_from_a_file_never_leaves_the_base_folder() -> Result<()> {
        let t = tempfile::tempdir().map_err(Error::io("creating", "a temp folder"))?;
        let base = t.path().join("runs");
        for name in ["../../..", "/etc", "a/../../b", "..", ""] {
            let dir = create(None, &base, name, 0.0)?;
            assert_eq!(dir.parent(), Some(base.as_path()), "{name:?}: {dir:?}");
        }
        Ok(())
    }
}

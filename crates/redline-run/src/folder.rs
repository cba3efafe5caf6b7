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
/// already holds a run, so nothing is overwritten), else
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

/// The files a run folder holds (docs/run-dir.md): an output the user names
/// (`--save`, `--metrics`) must not be one of them.
const RUN_FILES: [&str; 13] = [
    "config.toml",
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

//! Resuming a stopped run through the library (what `redline train
//! --resume` does, without the CLI): the newest good checkpoint of its
//! folder is picked (newer damaged or foreign ones are set aside), then the
//! folder is reopened at it ([`Run::reopen`]) and the trainer continues from
//! it ([`redline_train::Trainer::resume_from`]), bit for bit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redline_train::checkpoint::{self, Loaded};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::reopen::ResumePoint;

/// The checkpoint a resume starts from, and what was skipped to reach it.
pub struct Picked {
    /// The checkpoint, loaded.
    pub loaded: Loaded,
    /// Where the run picks up, for [`crate::Run::reopen`].
    pub at: ResumePoint,
    /// Why each newer checkpoint was refused.
    pub refused: Vec<String>,
    /// Where those were moved (`refused-step-N`).
    pub set_aside: Vec<PathBuf>,
}

/// Picks the newest good checkpoint of the run folder `dir` (its
/// `checkpoints/`) for a run of `identity` and a model of `params`
/// (`(name, shape)`), and sets newer refused ones aside. A `max_steps`
/// below its step is refused, naming both.
pub fn pick(
    dir: &Path,
    identity: &BTreeMap<String, Value>,
    params: &[(String, Vec<usize>)],
    max_steps: Option<usize>,
) -> Result<Picked> {
    let folder = dir.join("checkpoints");
    let (loaded, refused) = checkpoint::latest_good(&folder, identity, params)?;
    let m = &loaded.meta;
    // Before anything is set aside.
    m.check_max_steps(max_steps)
        .map_err(|why| Error::Resume(format!("{}: {why}", loaded.dir.display())))?;
    let set_aside = checkpoint::set_aside(&folder, m.step)?;
    let at = ResumePoint {
        step: m.step,
        epochs: m.logs.len(),
        written_unix_s: m.written_unix_s,
        checkpoint: loaded.dir.display().to_string(),
    };
    Ok(Picked {
        loaded,
        at,
        refused,
        set_aside,
    })
}

//! `redline train --resume RUN_DIR|last`: which run folder, which of its
//! checkpoints, and what a checkpoint must match (the run's identity: every
//! flag but those that only change how long it runs or what it logs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use redline_train::checkpoint::{self, CheckpointConfig, Loaded};
use redline_train::early_stop::Direction;
use serde_json::Value;

use crate::cli::TrainArgs;

/// Flags a resumed run may change without changing what it computes (how
/// long it runs, what it logs and where); every other flag is the run's
/// identity, which a checkpoint must match.
pub const RESUMABLE_FLAGS: &[&str] = &[
    "epochs",
    "max-steps",
    "log-every",
    "profiler",
    "monitor-interval",
    "metrics",
    "save",
    "prefetch",
    "eval-batch-size",
    "checkpoint-every",
    "keep-last",
    "monitor",
    "mode",
    "no-checkpoint",
    "early-stop",
    "kernel-trace",
    // What MFU is read against, not what is trained.
    "peak-flops",
    "no-validate",
    // How ranks are joined; the number of ranks is in the identity as `ranks`.
    "strategy",
    "dist-timeout",
    "devices",
    // Decode threads and the memory budget change where images are decoded,
    // not their values (a sample's draws are keyed by epoch and sample).
    "workers",
    "host-memory-budget",
];

/// Where `runs` keeps its run folders (as `redline runs` lists them).
const RUNS: &str = "runs";

/// The run folder `--resume` (or `redline test`, `redline predict`: the
/// `command` named in errors) names: a folder with a `config.toml`, or
/// `last`, the newest run under `runs/` (by its config's time) that holds
/// a checkpoint.
pub fn run_folder(arg: &Path, command: &str) -> anyhow::Result<PathBuf> {
    if arg == Path::new("last") && !arg.is_dir() {
        return newest(Path::new(RUNS), command);
    }
    if !arg.is_dir() {
        bail!(
            "{command} {}: no such run folder\nHINT: give a folder under runs/ (`redline runs` \
             lists them), or `{command} last`",
            arg.display()
        );
    }
    if !arg.join("config.toml").is_file() {
        bail!(
            "{command} {}: not a run folder (it has no config.toml)\nHINT: give the folder a \
             `redline train` wrote, e.g. runs/<date-time>-<model>",
            arg.display()
        );
    }
    Ok(arg.to_path_buf())
}

/// The newest run under `root` with a checkpoint.
fn newest(root: &Path, command: &str) -> anyhow::Result<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let dir = e.path();
        let Ok(config) = std::fs::metadata(dir.join("config.toml")) else {
            continue;
        };
        if checkpoint::list(&dir.join("checkpoints")).is_empty() {
            continue;
        }
        let when = config.modified().unwrap_or(std::time::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(t, _)| when > *t) {
            best = Some((when, dir));
        }
    }
    best.map(|(_, d)| d).with_context(|| {
        format!(
            "{command} last: no run under {}/ holds a checkpoint\nHINT: runs write one at each \
             epoch end (unless --no-checkpoint); give a run folder: {command} RUN_DIR",
            root.display()
        )
    })
}

/// The flags that make a run what it is: `recorded` (the config as
/// `config.toml` holds it) without [`RESUMABLE_FLAGS`].
pub fn identity(recorded: &TrainArgs) -> anyhow::Result<BTreeMap<String, Value>> {
    Ok(match serde_json::to_value(recorded)? {
        Value::Object(m) => m
            .into_iter()
            .filter(|(k, _)| !RESUMABLE_FLAGS.contains(&k.as_str()))
            .collect(),
        _ => BTreeMap::new(),
    })
}

/// `--checkpoint-every`, `--keep-last`, `--monitor`, `--mode`: where and
/// when the run checkpoints (`None` with `--no-checkpoint`). Without
/// `--monitor`, the best is by `val_loss` in a run that `validates`, and
/// none is tracked in one that does not.
pub fn checkpoint_config(
    args: &TrainArgs,
    run_dir: &Path,
    identity: BTreeMap<String, Value>,
    validates: bool,
) -> anyhow::Result<Option<CheckpointConfig>> {
    if args.no_checkpoint {
        return Ok(None);
    }
    let monitor = args
        .monitor
        .clone()
        .or_else(|| validates.then(|| "val_loss".to_string()));
    let mode = match (args.mode.as_deref(), &monitor) {
        (Some("max"), _) => Direction::Max,
        (Some(_), _) => Direction::Min,
        (None, Some(m)) if m.contains("acc") => Direction::Max,
        (None, _) => Direction::Min,
    };
    let cfg = CheckpointConfig {
        dir: run_dir.join("checkpoints"),
        every: args.checkpoint_every,
        keep_last: args.keep_last,
        monitor: monitor.map(|m| (m, mode)),
        identity,
    };
    cfg.check()?;
    Ok(Some(cfg))
}

/// The fingerprints of what a run reads: `--data`, and `--init` if given.
pub fn fingerprints(
    data: &Path,
    init: Option<&Path>,
    tokenizer: Option<&Path>,
) -> anyhow::Result<Vec<redline_run::inputs::InputFingerprint>> {
    let data_print = match redline_data::stream::shards::is_pattern(data) {
        true => redline_run::inputs::fingerprint_files(
            "--data",
            data,
            redline_data::stream::shards::expand(&data.to_string_lossy())?,
        )?,
        false => redline_run::inputs::fingerprint("--data", data)?,
    };
    let mut out = vec![data_print];
    if let Some(init) = init {
        out.push(redline_run::inputs::fingerprint("--init", init)?);
    }
    if let Some(t) = tokenizer {
        out.push(redline_run::inputs::fingerprint("--tokenizer", t)?);
    }
    Ok(out)
}

/// Refuses to resume the run folder `dir` onto inputs that differ from
/// those it recorded when it started (its `inputs.json`), naming the file,
/// unless `accept` (`--accept-changed-data`); a run without the record
/// (from before it was kept) is resumed with a note.
pub fn same_inputs(
    dir: &Path,
    now: &[redline_run::inputs::InputFingerprint],
    accept: bool,
) -> anyhow::Result<()> {
    let Some(was) = redline_run::inputs::recorded(dir) else {
        println!(
            "  {} has no readable {}: the data cannot be checked against the run's",
            dir.display(),
            redline_run::inputs::INPUTS
        );
        return Ok(());
    };
    let changes = redline_run::inputs::changes(&was, now);
    if changes.is_empty() {
        return Ok(());
    }
    if accept {
        for c in &changes {
            println!("  --accept-changed-data: resuming onto changed input: {c}");
        }
        return Ok(());
    }
    bail!(
        "--resume {}: the run's input changed since it started: {}\nHINT: put the original \
         back, or pass --accept-changed-data to continue on the changed input (the resumed run \
         then differs from one never stopped)",
        dir.display(),
        changes.join("; ")
    )
}

/// The newest good checkpoint of the run folder `dir` for a model with
/// `params` (`(name, shape)`): says which it resumes from and why it
/// skipped any newer one, and sets those aside (`refused-step-N`). A
/// `max_steps` (`--max-steps`) below its step is refused.
pub fn load(
    dir: &Path,
    identity: &BTreeMap<String, Value>,
    params: &[(String, Vec<usize>)],
    max_steps: Option<usize>,
) -> anyhow::Result<(Loaded, redline_run::ResumePoint)> {
    let picked = match redline_run::resume::pick(dir, identity, params, max_steps) {
        Err(e @ redline_run::Error::Resume(_)) => bail!("--resume {e}"),
        other => other,
    };
    let picked = picked.map_err(anyhow::Error::from).with_context(|| {
        format!(
            "--resume {}: nothing to resume from\nHINT: flags other than {} must be the \
                 run's own (its config.toml); a run with no good checkpoint starts again \
                 without --resume",
            dir.display(),
            RESUMABLE_FLAGS
                .iter()
                .map(|f| format!("--{f}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    for why in &picked.refused {
        println!("  checkpoint refused: {why}");
    }
    let (loaded, m) = (&picked.loaded, &picked.loaded.meta);
    if !picked.refused.is_empty() {
        println!(
            "  falling back to the newest good checkpoint, {}",
            loaded.dir.display()
        );
        for p in &picked.set_aside {
            println!("  set aside: {}", p.display());
        }
    }
    println!(
        "resuming {} from {} (step {}, epoch {}, {} batches into it)",
        dir.display(),
        loaded.dir.display(),
        m.step,
        m.epoch,
        m.batch
    );
    Ok((picked.loaded, picked.at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_is_the_newest_run_with_a_checkpoint() -> anyhow::Result<()> {
        let t = tempfile::tempdir()?;
        let err = newest(t.path(), "--resume").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("holds a checkpoint")));
        for (name, ckpt) in [("a", true), ("b", true), ("c", false)] {
            let d = t.path().join(name);
            std::fs::create_dir_all(d.join("checkpoints"))?;
            std::fs::write(d.join("config.toml"), "")?;
            if ckpt {
                std::fs::create_dir(d.join("checkpoints").join("step-00000001"))?;
            }
            // Distinct modification times.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(newest(t.path(), "--resume")?, t.path().join("b"));
        Ok(())
    }
}

//! Checkpoints and resume with real short fits: a run stopped at any step
//! and resumed from its checkpoint gives the same losses, validation and
//! final weights, bit for bit, as the run never stopped; damaged or foreign
//! checkpoints are refused by name and the resume falls back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Split, TargetKind};
use redline_models::{MlpConfig, ModelConfig, SequentialConfig};
use redline_train::checkpoint::{self, CheckpointConfig};
use redline_train::{Callback, Classifier, Event, OptimizerConfig, TrainConfig, Trainer};

type R = anyhow::Result<()>;

/// `n` samples of 4 features: class 1 where the first feature is positive.
fn classes(n: usize) -> anyhow::Result<Split> {
    let x: Vec<f32> = (0..n * 4)
        .map(|i| ((i * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let y: Vec<u32> = (0..n).map(|i| u32::from(x[i * 4] > 0.0)).collect();
    Ok(Split {
        x: Tensor::from_vec(x, (n, 1, 2, 2), &candle_core::Device::Cpu)?,
        y: Tensor::from_vec(y, n, &candle_core::Device::Cpu)?,
        target: TargetKind::Classes(2),
        source: PathBuf::from("synthetic"),
    })
}

fn loader(n: usize, shuffle: bool, prefetch: usize) -> anyhow::Result<Loader> {
    Ok(Loader::new(
        classes(n)?,
        LoaderConfig {
            batch_size: 8,
            shuffle,
            seed: 3,
            prefetch,
            drop_last: false,
        },
    )?)
}

/// The step's losses and rates at every log point, and each epoch's losses.
#[derive(Default, Debug, Clone, PartialEq)]
struct Seen {
    logs: Vec<(usize, u64, u64)>,
    epochs: Vec<(usize, u64, Option<u64>)>,
}

/// Where a test run is stopped, as a signal would.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// After this step.
    After(usize),
    /// In the validation pass that follows this step (an epoch's last).
    InValidationAfter(usize),
}

impl Stop {
    /// The last step before the stop.
    fn step(self) -> usize {
        match self {
            Self::After(s) | Self::InValidationAfter(s) => s,
        }
    }
}

/// Records what the fit logs; sets `stop` where `stop_at` says.
struct Watch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    stop_at: Option<Stop>,
    /// The last step that ended.
    last: usize,
}

impl Callback for Watch {
    fn name(&self) -> &str {
        "watch"
    }
    fn on_event(&mut self, e: &Event<'_>) -> Result<(), String> {
        let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
        match e {
            Event::Log(s) => seen.logs.push((s.step, s.loss.to_bits(), s.lr.to_bits())),
            Event::EpochEnd(e) => seen.epochs.push((
                e.epoch,
                e.train_loss.to_bits(),
                e.val.as_ref().map(|v| v.loss.to_bits()),
            )),
            Event::StepEnd { step, .. } => {
                self.last = *step;
                if matches!(self.stop_at, Some(Stop::After(s)) if s == *step) {
                    self.stop.store(true, Ordering::Relaxed)
                }
            }
            Event::ValidationStart { .. } => {
                if matches!(self.stop_at, Some(Stop::InValidationAfter(s)) if s == self.last) {
                    self.stop.store(true, Ordering::Relaxed)
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn identity() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([("model".to_string(), serde_json::json!("mlp 4-8-2"))])
}

/// A trainer of the test's model, optionally checkpointing into `dir`.
fn trainer(
    ckpt: Option<(&Path, Option<usize>)>,
    stop_at: Option<usize>,
    case: (usize, bool),
) -> anyhow::Result<(Trainer, Arc<Mutex<Seen>>)> {
    trainer_with(ckpt, stop_at.map(Stop::After), case, false)
}

/// [`trainer`], through graph mode's loop where `cursor` is set (the loop a
/// GPU captures, its steps run uncaptured here).
fn trainer_with(
    ckpt: Option<(&Path, Option<usize>)>,
    stop_at: Option<Stop>,
    case: (usize, bool),
    cursor: bool,
) -> anyhow::Result<(Trainer, Arc<Mutex<Seen>>)> {
    trainer_until(ckpt, stop_at, case, cursor, None)
}

/// [`trainer_with`], limited to `max_steps` (`--max-steps`).
fn trainer_until(
    ckpt: Option<(&Path, Option<usize>)>,
    stop_at: Option<Stop>,
    (accumulate, dropout): (usize, bool),
    cursor: bool,
    max_steps: Option<usize>,
) -> anyhow::Result<(Trainer, Arc<Mutex<Seen>>)> {
    let cfg = match dropout {
        false => ModelConfig::Mlp(MlpConfig {
            in_features: 4,
            hidden: vec![8],
            classes: 2,
        }),
        // Two dropout streams, one inside a residual block.
        true => ModelConfig::Sequential(SequentialConfig::from_toml(
            r#"[model]
layers = [
  { type = "flatten" }, { type = "linear", out = 8 }, { type = "relu" }, { type = "dropout", p = 0.3 },
  { type = "residual", layers = [{ type = "linear", out = 8 }, { type = "dropout", p = 0.5 }] },
  { type = "linear" },
]"#,
            "dropout-mlp",
            &[1, 2, 2],
            2,
        )?),
    };
    let model = cfg.build(&Device::cpu(), Precision::Fp32, 1)?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut b = Trainer::builder()
        .config(TrainConfig {
            epochs: 3,
            max_steps,
            log_every: 2,
            accumulate,
            // A cosine fills its length from the run's, so runs limited to
            // different step counts differ by design: limited runs here
            // take a constant rate.
            schedule: match max_steps {
                None => "cosine:warmup=3:interval=step".parse()?,
                Some(_) => "constant".parse()?,
            },
            log_grad_norm: true,
            ..TrainConfig::default()
        })
        .optimizer(OptimizerConfig::by_name("adamw", 0.01)?)
        .cursor_steps(cursor)
        .stop_when(Arc::clone(&stop))
        .callback(Box::new(Watch {
            seen: seen.clone(),
            stop,
            stop_at,
            last: 0,
        }));
    if let Some((dir, every)) = ckpt {
        b = b.checkpoints(CheckpointConfig {
            dir: dir.to_path_buf(),
            every,
            keep_last: 100,
            monitor: Some(("val_loss".into(), redline_train::early_stop::Direction::Min)),
            identity: identity(),
        });
    }
    Ok((b.build(Classifier::new(model), Device::cpu())?, seen))
}

fn weights(t: &Trainer) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
    t.params()
        .state()
        .map(|(n, v)| {
            let bits = v
                .as_tensor()
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|x| x.to_bits())
                .collect();
            Ok((n.to_string(), bits))
        })
        .collect()
}

/// Each epoch's training and validation loss, as bits.
fn epoch_bits(f: &redline_train::FitSummary) -> Vec<(u64, Option<u64>)> {
    f.epochs_log
        .iter()
        .map(|e| {
            (
                e.train_loss.to_bits(),
                e.val.as_ref().map(|v| v.loss.to_bits()),
            )
        })
        .collect()
}

fn params_of(t: &Trainer) -> Vec<(String, Vec<usize>)> {
    t.params()
        .state()
        .map(|(n, v)| (n.to_string(), v.as_tensor().dims().to_vec()))
        .collect()
}

/// Stops a checkpointing run after `stop_at`, resumes from the checkpoint
/// `pick` chooses, and compares with a run never stopped.
fn stop_and_resume(
    stop_at: usize,
    every: Option<usize>,
    case: (usize, bool),
    pick: impl Fn(&Path),
) -> R {
    stop_and_resume_at(Loop::Ordinary, Stop::After(stop_at), every, case, pick)
}

/// Which loop the stopped and the resumed runs take (the run never stopped
/// takes the ordinary one).
#[derive(Clone, Copy, PartialEq)]
enum Loop {
    /// The loader's batches, launched eagerly.
    Ordinary,
    /// Graph mode's loop, uncaptured: the device cursor over resident data.
    Cursor,
    /// Graph mode's loop over streamed batches (static buffers).
    CursorStreaming,
}

/// [`stop_and_resume`] with the stopped and resumed runs in `how`, stopped
/// where `stop` says.
fn stop_and_resume_at(
    how: Loop,
    stop: Stop,
    every: Option<usize>,
    case: (usize, bool),
    pick: impl Fn(&Path),
) -> R {
    let stop_at = stop.step();
    let (train, val) = (loader(100, true, 2)?, loader(30, false, 0)?);
    let (mut whole, whole_seen) = trainer(None, None, case)?;
    let want = whole.fit(&train, Some(&val))?;
    let train = match how {
        Loop::CursorStreaming => Loader::streaming(
            classes(100)?,
            &candle_core::Device::Cpu,
            train.config().clone(),
        )?,
        _ => train,
    };
    let cursor = how != Loop::Ordinary;
    let dir = tempfile::tempdir()?;
    let (mut first, _) = trainer_with(Some((dir.path(), every)), Some(stop), case, cursor)?;
    let err = first.fit(&train, Some(&val)).err();
    assert!(
        matches!(err, Some(redline_train::Error::Interrupted { step, .. }) if step == stop_at),
        "{err:?}"
    );
    let written = &first.checkpoint_log().stop;
    assert!(
        matches!(written, Some(Ok(p)) if p.ends_with(checkpoint::folder_name(stop_at))),
        "the stop's own checkpoint: {written:?}"
    );
    pick(dir.path());
    let (mut second, seen) = trainer_with(Some((dir.path(), every)), None, case, cursor)?;
    let (loaded, refused) = checkpoint::latest_good(dir.path(), &identity(), &params_of(&second))?;
    assert!(refused.is_empty(), "{refused:?}");
    let from = loaded.meta.step;
    second.resume_from(loaded)?;
    let got = second.fit(&train, Some(&val))?;
    // The loop asked for is the loop that ran.
    let status = got.cuda_graph.to_string();
    assert_eq!(status.contains("uncaptured"), cursor, "{status}");
    assert_eq!(
        weights(&second)?,
        weights(&whole)?,
        "stopped at {stop_at}, resumed at {from}"
    );
    let whole_seen = whole_seen
        .lock()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    let seen = seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?.clone();
    let later: Vec<_> = whole_seen
        .logs
        .iter()
        .filter(|l| l.0 > from)
        .cloned()
        .collect();
    assert_eq!(seen.logs, later, "log points after step {from}");
    assert_eq!(epoch_bits(&got), epoch_bits(&want), "epoch losses");
    assert_eq!(got.steps, want.steps);
    Ok(())
}

#[test]
fn a_run_stopped_mid_epoch_resumes_bit_for_bit() -> R {
    // 13 batches an epoch: step 7 is mid-epoch 1, step 20 mid-epoch 2.
    for stop_at in [7, 20] {
        stop_and_resume(stop_at, Some(4), (1, false), |_| {})?;
    }
    Ok(())
}

/// Graph mode's loop (a GPU's default; here its steps run uncaptured) writes
/// its checkpoints where the ordinary loop does, on a signal too, and a run
/// stopped mid-epoch resumes at its batch, bit for bit the run never
/// stopped. Before, that loop wrote no step checkpoints nor the signal's,
/// and started every epoch at its first batch.
#[test]
fn graph_modes_loop_checkpoints_and_resumes_mid_epoch() -> R {
    for how in [Loop::Cursor, Loop::CursorStreaming] {
        // 13 steps an epoch (12 full batches and one of 4): step 13 stops
        // after the epoch's last batch, before its end.
        let cases = [
            (7, vec![4, 7]),
            (13, vec![4, 8, 12, 13]),
            (20, vec![4, 8, 12, 13, 16, 20]),
        ];
        for (stop_at, want) in cases {
            stop_and_resume_at(how, Stop::After(stop_at), Some(4), (1, false), |dir| {
                let steps: Vec<usize> = checkpoint::list(dir).iter().map(|c| c.0).collect();
                assert_eq!(steps, want, "stopped after step {stop_at}");
            })?;
        }
    }
    // From an epoch-end checkpoint too (the stop's own removed).
    stop_and_resume_at(Loop::Cursor, Stop::After(15), None, (1, false), |dir| {
        std::fs::remove_dir_all(dir.join(checkpoint::folder_name(15))).unwrap_or_default();
    })
}

/// A stop after an epoch's last step, before its end (validation, its log),
/// writes `batch` = the epoch's batches; that checkpoint resumes at the
/// epoch's end. Before, the resume refused it ("an epoch of this data has 13
/// batches ... was the data or --batch-size changed?").
#[test]
fn a_run_stopped_after_an_epochs_last_step_resumes() -> R {
    // 13 batches an epoch; accumulating 2, step 7 takes the 13th alone.
    stop_and_resume(13, Some(4), (1, false), |_| {})?;
    stop_and_resume(7, Some(3), (2, false), |_| {})
}

/// A stop whose checkpoint cannot be written says so and why (the CLI then
/// does not claim one): its folder lies under a file here.
#[test]
fn a_stop_that_cannot_write_its_checkpoint_says_why() -> R {
    let t = tempfile::tempdir()?;
    let file = t.path().join("a-file");
    std::fs::write(&file, b"not a folder")?;
    let (mut first, _) = trainer(Some((&file.join("checkpoints"), None)), Some(3), (1, false))?;
    let val = loader(30, false, 0)?;
    let err = first.fit(&loader(100, true, 0)?, Some(&val)).err();
    assert!(
        matches!(err, Some(redline_train::Error::Interrupted { step: 3, .. })),
        "{err:?}"
    );
    let log = first.checkpoint_log();
    assert!(log.last.is_none(), "{log:?}");
    let why = match &log.stop {
        Some(Err(why)) => why,
        other => anyhow::bail!("the stop's checkpoint cannot have been written: {other:?}"),
    };
    assert!(why.contains("no earlier checkpoint"), "{why}");
    Ok(())
}

/// A stop during an epoch's validation writes a checkpoint of the finished
/// steps and names the last step; the run resumed from it validates that
/// epoch again and ends bit for bit as the run never stopped. Before, it
/// wrote none and said "after step 0 (epoch 0)".
#[test]
fn a_stop_during_validation_checkpoints_the_epochs_steps() -> R {
    for how in [Loop::Ordinary, Loop::Cursor] {
        // Epoch 1 ends at step 13, epoch 2 at step 26.
        for step in [13, 26] {
            stop_and_resume_at(
                how,
                Stop::InValidationAfter(step),
                Some(4),
                (1, false),
                |_| {},
            )?;
        }
    }
    Ok(())
}

/// The position a `state.json` may name: up to the epoch's batch count (only
/// its end left to run), never past it; inside an epoch, a step boundary.
#[test]
fn a_checkpoints_position_is_checked_against_the_epoch() -> R {
    let dir = tempfile::tempdir()?;
    let (mut t, _) = trainer(Some((dir.path(), Some(3))), None, (1, false))?;
    t.fit(&loader(40, true, 0)?, Some(&loader(8, false, 0)?))?;
    let (_, first) = checkpoint::list(dir.path())
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no checkpoint"))?;
    let mut meta = checkpoint::read(&first, &identity(), &params_of(&t))?.meta;
    assert_eq!((meta.epoch, meta.step), (1, 3));
    for (batch, accumulate, ok) in [(5, 1, true), (5, 2, true), (4, 2, true), (6, 1, false)] {
        meta.batch = batch;
        meta.step = batch.div_ceil(accumulate);
        let r = meta.check_position(5, accumulate);
        assert_eq!(
            r.is_ok(),
            ok,
            "batch {batch} of 5, every {accumulate}: {r:?}"
        );
    }
    meta.batch = 3;
    let e = meta.check_position(5, 2).err().unwrap_or_default();
    assert!(
        e.contains("`batch` 3") && e.contains("a step every 2"),
        "{e}"
    );
    meta.step = 2;
    meta.batch = 5;
    let e = meta.check_position(5, 2).err().unwrap_or_default();
    assert!(e.contains("fewer than the 3 steps"), "{e}");
    // Before: an edited `step` of 10^15 was taken as it was.
    meta.step = 1_000_000_000_000_000;
    let e = meta.check_position(5, 2).err().unwrap_or_default();
    assert!(e.contains("does not match the 3 steps"), "{e}");
    Ok(())
}

/// A fit that `--max-steps` ends inside an epoch, with validation on,
/// checkpoints that position (not the next epoch's start): resumed with a
/// higher limit, it ends bit for bit as a run never stopped, in either
/// loop and with either checkpoint interval. Before, the checkpoint said
/// "epoch 2, batch 0" and the resume reshuffled. A limit below the
/// checkpoint's step is refused, naming both.
#[test]
fn a_run_ended_by_max_steps_mid_epoch_resumes_bit_for_bit() -> R {
    let (train, val) = (loader(100, true, 2)?, loader(30, false, 0)?);
    // 13 batches an epoch: step 7 is inside epoch 1, step 20 inside epoch 2.
    let (mut whole, _) = trainer_until(None, None, (1, false), false, Some(20))?;
    let want = whole.fit(&train, Some(&val))?;
    for cursor in [false, true] {
        for every in [None, Some(5)] {
            let dir = tempfile::tempdir()?;
            let ckpt = Some((dir.path(), every));
            let (mut first, _) = trainer_until(ckpt, None, (1, false), cursor, Some(7))?;
            first.fit(&train, Some(&val))?;
            let (mut second, _) = trainer_until(ckpt, None, (1, false), cursor, Some(20))?;
            let (loaded, _) =
                checkpoint::latest_good(dir.path(), &identity(), &params_of(&second))?;
            let m = &loaded.meta;
            assert_eq!((m.step, m.epoch, m.batch), (7, 1, 7), "every {every:?}");
            assert!(m.logs.is_empty(), "epoch 1 has not ended: {:?}", m.logs);
            let (mut low, _) = trainer_until(ckpt, None, (1, false), cursor, Some(6))?;
            let (again, _) = checkpoint::latest_good(dir.path(), &identity(), &params_of(&low))?;
            let e = low.resume_from(again).err().map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains("--max-steps 6 is below step 7")),
                "{e:?}"
            );
            second.resume_from(loaded)?;
            let got = second.fit(&train, Some(&val))?;
            assert_eq!(weights(&second)?, weights(&whole)?, "every {every:?}");
            assert_eq!(epoch_bits(&got), epoch_bits(&want), "every {every:?}");
        }
    }
    Ok(())
}

#[test]
fn accumulating_runs_resume_at_a_step_boundary() -> R {
    stop_and_resume(9, Some(3), (2, false), |_| {})
}

#[test]
fn dropout_masks_resume_where_they_were() -> R {
    // Before: a resumed dropout model drew its masks from the stream's start.
    for stop_at in [5, 14] {
        stop_and_resume(stop_at, Some(3), (1, true), |_| {})?;
    }
    Ok(())
}

#[test]
fn losing_the_newest_checkpoints_falls_back_to_an_older_one() -> R {
    // As after `kill -9`: the stop's own checkpoint and the newest periodic
    // one are gone; the run resumes from an older one and still ends the same.
    stop_and_resume(22, Some(5), (1, false), |dir| {
        let all = checkpoint::list(dir);
        for (_, p) in all.iter().rev().take(2) {
            std::fs::remove_dir_all(p).unwrap_or_default();
        }
    })
}

#[test]
fn epoch_end_checkpoints_resume_at_the_next_epoch() -> R {
    stop_and_resume(15, None, (1, false), |dir| {
        let steps: Vec<usize> = checkpoint::list(dir).iter().map(|c| c.0).collect();
        // Epoch 1 ended at step 13, then the stop at 15 wrote its own.
        assert_eq!(steps, [13, 15]);
        std::fs::remove_dir_all(dir.join(checkpoint::folder_name(15))).unwrap_or_default();
    })
}

#[test]
fn damaged_or_foreign_checkpoints_are_refused_by_name() -> R {
    let (train, val) = (loader(40, true, 0)?, loader(16, false, 0)?);
    let dir = tempfile::tempdir()?;
    let (mut t, _) = trainer(Some((dir.path(), Some(2))), None, (1, false))?;
    t.fit(&train, Some(&val))?;
    let all = checkpoint::list(dir.path());
    assert!(all.len() >= 3, "{all:?}");
    let params = params_of(&t);
    // Truncate the newest weights file: refused, the previous one is used.
    let (newest, prev) = (&all[all.len() - 1].1, &all[all.len() - 2]);
    let w = newest.join(checkpoint::WEIGHTS);
    let bytes = std::fs::read(&w)?;
    std::fs::write(&w, &bytes[..bytes.len() / 2])?;
    let (loaded, refused) = checkpoint::latest_good(dir.path(), &identity(), &params)?;
    assert_eq!(loaded.meta.step, prev.0);
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].contains("weights.safetensors") && refused[0].contains("truncated"),
        "{refused:?}"
    );
    // A flipped byte in the optimizer state is caught by its CRC.
    let o = prev.1.join(checkpoint::OPTIMIZER);
    let mut bytes = std::fs::read(&o)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&o, &bytes)?;
    let (_, refused) = checkpoint::latest_good(dir.path(), &identity(), &params)?;
    assert!(refused[1].contains("CRC-32"), "{refused:?}");
    // Another run's settings or another model: every checkpoint refused, naming what differs.
    let other = BTreeMap::from([("model".to_string(), serde_json::json!("cnn"))]);
    let e = checkpoint::latest_good(dir.path(), &other, &params)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("model") && e.contains("\"cnn\" now"), "{e}");
    let mut wider = params.clone();
    wider[0].1[0] += 1;
    let e = checkpoint::latest_good(dir.path(), &identity(), &wider)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("another model"), "{e}");
    // A truncated state.json is named too.
    let s = all[0].1.join(checkpoint::STATE);
    let text = std::fs::read(&s)?;
    std::fs::write(&s, &text[..text.len() / 3])?;
    let e = checkpoint::read(&all[0].1, &identity(), &params)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("state.json") && e.contains("truncated"), "{e}");
    Ok(())
}

#[test]
fn keep_last_prunes_all_but_the_newest_and_the_best() -> R {
    let (train, val) = (loader(40, true, 0)?, loader(16, false, 0)?);
    let dir = tempfile::tempdir()?;
    let model = ModelConfig::Mlp(MlpConfig {
        in_features: 4,
        hidden: vec![8],
        classes: 2,
    })
    .build(&Device::cpu(), Precision::Fp32, 1)?;
    let mut t = Trainer::builder()
        .config(TrainConfig {
            epochs: 6,
            ..TrainConfig::default()
        })
        // A rate so high that validation gets worse after the first epochs.
        .optimizer(OptimizerConfig::by_name("sgd", 5.0)?)
        .checkpoints(CheckpointConfig {
            dir: dir.path().to_path_buf(),
            every: None,
            keep_last: 2,
            monitor: Some(("val_loss".into(), redline_train::early_stop::Direction::Min)),
            identity: identity(),
        })
        .build(Classifier::new(model), Device::cpu())?;
    // A folder of the user's under a checkpoint's name: never pruned. Before,
    // `--keep-last` deleted it, files and all.
    let mine = dir.path().join(checkpoint::folder_name(1));
    std::fs::create_dir(&mine)?;
    std::fs::write(mine.join("notes.txt"), "mine")?;
    std::fs::write(mine.join(checkpoint::STATE), "{}")?;
    let fit = t.fit(&train, Some(&val))?;
    assert_eq!(std::fs::read_to_string(mine.join("notes.txt"))?, "mine");
    let log = fit.checkpoints.clone().unwrap_or_default();
    assert_eq!(log.written, 6);
    let steps: Vec<usize> = checkpoint::list(dir.path()).iter().map(|c| c.0).collect();
    let (best_step, _) = log.best.unwrap_or_default();
    let mut want = vec![1, best_step, 5 * 5, 6 * 5];
    want.sort_unstable();
    want.dedup();
    assert_eq!(steps, want, "best {:?}", log.best);
    Ok(())
}

/// Fuzzing a checkpoint's `state.json` (`redline_testkit::fuzz`, seeded by a
/// real mid-epoch checkpoint, whose tensor files stay whole so that mutants
/// reach the resume): reading it gives a checkpoint or an error naming the
/// file, and a checkpoint that reads resumes and fits, or errs, never panics.
#[test]
fn fuzz_checkpoint_state_json() -> R {
    let (train, val) = (loader(40, true, 0)?, loader(16, false, 0)?);
    let dir = tempfile::tempdir()?;
    let (mut t, _) = trainer(Some((dir.path(), Some(3))), Some(7), (1, true))?;
    let _ = t.fit(&train, Some(&val));
    let params = params_of(&t);
    let (_, ckpt) = checkpoint::list(dir.path())
        .into_iter()
        .find(|(s, _)| *s == 6)
        .ok_or_else(|| anyhow::anyhow!("no checkpoint at step 6"))?;
    let state = ckpt.join(checkpoint::STATE);
    let mut seeds = vec![std::fs::read(&state)?];
    let regressions = redline_testkit::fuzz::corpus_dir("checkpoint");
    if regressions.is_dir() {
        seeds.extend(redline_testkit::fuzz::corpus("checkpoint"));
    }
    let report = redline_testkit::fuzz::fuzz_seeds(
        "checkpoint",
        &seeds,
        redline_testkit::fuzz::budget(),
        |bytes| {
            std::fs::write(&state, bytes).unwrap_or_default();
            match checkpoint::read(&ckpt, &identity(), &params) {
                Err(e) => assert!(e.to_string().contains(&*ckpt.to_string_lossy())),
                Ok(loaded) => {
                    let Ok((mut t, _)) = trainer(None, None, (1, true)) else {
                        return;
                    };
                    if t.resume_from(loaded).is_ok() {
                        let _ = t.fit(&train, Some(&val));
                    }
                }
            }
        },
    );
    eprintln!("{report}");
    Ok(())
}

/// A checkpoint whose loss-scaler state was edited into a scale no f32
/// holds (or none at all) is refused by name when a loss-scaled trainer
/// resumes from it, and a sound one is taken.
#[test]
fn an_edited_loss_scale_is_refused_by_name() -> R {
    let (train, val) = (loader(40, true, 0)?, loader(16, false, 0)?);
    let dir = tempfile::tempdir()?;
    let (mut t, _) = trainer(Some((dir.path(), Some(3))), None, (1, false))?;
    t.fit(&train, Some(&val))?;
    let params = params_of(&t);
    let (_, ckpt) = checkpoint::list(dir.path())
        .into_iter()
        .last()
        .ok_or_else(|| anyhow::anyhow!("no checkpoint"))?;
    let state = ckpt.join(checkpoint::STATE);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&state)?)?;
    let scaled = || -> anyhow::Result<Trainer> {
        let model = ModelConfig::Mlp(MlpConfig {
            in_features: 4,
            hidden: vec![8],
            classes: 2,
        })
        .build(&Device::cpu(), Precision::Fp32, 1)?;
        Ok(Trainer::builder()
            .loss_scale(Some(redline_train::LossScale::default()))
            .optimizer(OptimizerConfig::by_name("adamw", 0.01)?)
            .build(Classifier::new(model), Device::cpu())?)
    };
    for (scale, ok) in [(1e39, false), (-4.0, false), (0.0, false), (1024.0, true)] {
        v["scaler"] = serde_json::json!({"scale": scale, "growth_tracker": 2, "skipped_steps": 5});
        std::fs::write(&state, serde_json::to_vec(&v)?)?;
        let loaded = checkpoint::read(&ckpt, &identity(), &params)?;
        let got = scaled()?.resume_from(loaded);
        match (got, ok) {
            (Ok(()), true) => {}
            (Err(e), false) => {
                let e = e.to_string();
                assert!(e.contains("state.json") && e.contains("scale"), "{e}");
            }
            (got, _) => panic!("scale {scale}: {got:?}"),
        }
    }
    Ok(())
}

/// Before: a `checkpoints` path that is a file or a FIFO was reported as
/// "holds no checkpoint to resume from", as an empty folder is.
#[test]
fn a_checkpoints_path_that_is_no_folder_says_what_it_is() -> R {
    let t = tempfile::tempdir()?;
    let file = t.path().join("checkpoints");
    std::fs::write(&file, "x")?;
    let e = checkpoint::latest_good(&file, &identity(), &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("is not a folder (it is a regular file)"), "{e}");
    let fifo = t.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()?
        .success());
    let e = checkpoint::latest_good(&fifo, &identity(), &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("it is a FIFO"), "{e}");
    let e = checkpoint::latest_good(&t.path().join("none"), &identity(), &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("does not exist"), "{e}");
    Ok(())
}

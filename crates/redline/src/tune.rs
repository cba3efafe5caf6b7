//! `redline tune batch-size|lr` and `train --batch-size auto` / `--lr auto`:
//! the finders of `redline_train::tune` run on the plan's own job (model,
//! data, optimizer, device), print their table, and leave it on disk.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use redline_core::{memory, Precision};
use redline_data::{Dataset, Loader, LoaderConfig, Placement};
use redline_train::tune::{
    self, BatchSizeChoice, BatchSizeSearch, BatchTrial, LrCurve, LrRangeTest, Trial,
};
use redline_train::{probe, TrainStep};
use serde::Serialize;
use serde_json::json;

use crate::cli::{TrainArgs, TuneArgs, TuneCommand};
use crate::plan::Plan;

/// Seconds each batch size is timed for, after its warm-up.
const TRIAL_SECONDS: f64 = 0.4;

/// The share of free memory a trial may plan to peak at.
const MEMORY_SHARE: f64 = 0.8;

/// What the range test found.
#[derive(Debug, Clone, Serialize)]
pub struct LrFound {
    /// The test's settings.
    pub test: LrRangeTest,
    /// The measured curve.
    pub curve: LrCurve,
    /// The step of the suggestion.
    pub index: usize,
    /// The suggested rate.
    pub lr: f64,
    /// The batch size it ran at.
    pub batch_size: usize,
}

impl LrFound {
    /// One line for the user.
    pub fn line(&self) -> String {
        format!(
            "lr auto: {:.3e}, the steepest fall of the smoothed loss ({} steps from {:.0e} to \
             {:.0e} at batch {}{})",
            self.lr,
            self.curve.lr.len(),
            self.test.min_lr,
            self.test.max_lr,
            self.batch_size,
            self.curve
                .stopped
                .as_ref()
                .map_or(String::new(), |s| format!("; stopped: {s}"))
        )
    }

    /// The curve as CSV: step, lr, loss, smoothed.
    pub fn csv(&self) -> String {
        let mut s = String::from("step,lr,loss,smoothed_loss\n");
        for i in 0..self.curve.lr.len() {
            s.push_str(&format!(
                "{},{},{},{}\n",
                i + 1,
                self.curve.lr[i],
                self.curve.loss.get(i).copied().unwrap_or(f64::NAN),
                self.curve.smoothed.get(i).copied().unwrap_or(f64::NAN)
            ));
        }
        s
    }
}

/// What `auto` flags were settled to.
#[derive(Debug, Default)]
pub struct Tuned {
    /// `--batch-size auto`.
    pub batch: Option<BatchSizeChoice>,
    /// `--lr auto`.
    pub lr: Option<LrFound>,
}

impl Tuned {
    /// Leaves the tables in the run folder (`tune_batch_size.json`,
    /// `tune_lr.json`, `tune_lr.csv`) and the choices in `summary.json`.
    pub fn record(&self, run: &mut redline_run::Run) -> anyhow::Result<()> {
        if let Some(c) = &self.batch {
            run.write_file("tune_batch_size.json", &serde_json::to_string_pretty(c)?)?;
            run.set(
                "batch_size_choice",
                json!(format!("auto: {} ({})", c.batch_size, c.stopped)),
            )?;
        }
        if let Some(f) = &self.lr {
            run.write_file("tune_lr.json", &serde_json::to_string_pretty(f)?)?;
            run.write_file("tune_lr.csv", &f.csv())?;
            run.set("lr_choice", json!(f.line()))?;
        }
        Ok(())
    }
}

/// Settles `--batch-size auto` and `--lr auto` on the plan's job (the batch
/// first: the rate is found at the batch that will train).
pub fn resolve(args: &TrainArgs, plan: &mut Plan) -> anyhow::Result<Tuned> {
    let mut tuned = Tuned::default();
    if plan.ranks.is_distributed() && (args.batch_size.is_auto() || args.lr.is_auto()) {
        bail!(
            "--batch-size auto / --lr auto with {} data-parallel ranks: the finders time one \
             process\nHINT: run `redline tune batch-size` (or `tune lr`) without mpirun, then \
             pass the numbers it found",
            plan.ranks.launch.world_size
        );
    }
    if args.batch_size.is_auto() {
        println!("batch size auto: timing batch sizes on {} ...", plan.device);
        let choice = batch_size(plan, BatchSizeSearch::default())?;
        print!("{}", choice.table());
        println!(
            "batch size auto: {} ({})",
            choice.batch_size, choice.stopped
        );
        plan.batch_size = choice.batch_size;
        tuned.batch = Some(choice);
    }
    if args.lr.is_auto() {
        println!("lr auto: running the learning-rate range test ...");
        let found = lr(plan, LrRangeTest::default())?;
        println!("{}", found.line());
        plan.lr = found.lr;
        plan.opt_cfg = crate::plan::optimizer(args, found.lr)?;
        tuned.lr = Some(found);
    }
    Ok(tuned)
}

/// A fresh training step of the plan's model (the same seed each time).
fn step_maker(plan: &Plan) -> impl Fn() -> redline_train::Result<Box<dyn TrainStep>> + '_ {
    move || {
        let model = plan
            .model_cfg
            .build(&plan.device, Precision::Fp32, plan.seed)?;
        Ok(plan.step_kind.step(model))
    }
}

/// Whether an error is the device running out of memory.
fn out_of_memory(e: &redline_train::Error) -> bool {
    memory::is_out_of_memory_text(&e.to_string())
}

/// The batch-size search on the plan's job.
pub fn batch_size(plan: &Plan, mut search: BatchSizeSearch) -> anyhow::Result<BatchSizeChoice> {
    let train = &plan.prepared.train;
    search.max = search.max.min(train.len().max(1));
    let make = step_maker(plan);
    // The training split on the device once, as training holds it: every
    // trial reads it, so each peak is the real job's (data and step).
    // Streamed images: the samples the largest batch reads, decoded.
    let head = train.head(search.max.max(1))?;
    let split = redline_data::Split::from_host(&head, plan.device.candle())
        .context("the batch-size search: placing the training split on the device")?;
    // What the trials may peak at: what the process holds now and most of
    // what is free (on a GPU, its memory; out-of-memory is caught too).
    memory::reset_peak(&plan.device);
    let now = memory::peak(&plan.device).unwrap_or_default();
    search.memory_budget = match memory::stats(&plan.device)? {
        Some(s) => Some(s.allocated + (s.device_free as f64 * MEMORY_SHARE) as u64),
        None => redline_core::system::host_memory_free()
            .map(|free| now + (free as f64 * MEMORY_SHARE) as u64),
    };
    let trial = |b: usize| -> anyhow::Result<Trial> {
        let loader = Loader::new(
            split.clone(),
            LoaderConfig {
                batch_size: b,
                shuffle: false,
                seed: plan.seed,
                prefetch: 0,
                drop_last: false,
            },
        )?;
        memory::reset_peak(&plan.device);
        let first = probe::measure(
            &make,
            &plan.device,
            &loader,
            &plan.opt_cfg,
            plan.loss_scale,
            (2, 3),
            false,
        );
        let est = match first {
            Ok(m) => m.step_ms,
            Err(e) if out_of_memory(&e) => return Ok(Trial::OutOfMemory(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let steps = ((TRIAL_SECONDS * 1e3 / est.max(1e-3)).ceil() as usize).clamp(5, 2000);
        let timed = probe::measure(
            &make,
            &plan.device,
            &loader,
            &plan.opt_cfg,
            plan.loss_scale,
            (1, steps),
            true,
        );
        let m = match timed {
            Ok(m) => m,
            Err(e) if out_of_memory(&e) => return Ok(Trial::OutOfMemory(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let t = BatchTrial {
            batch_size: b,
            samples_per_s: b as f64 * 1e3 / m.step_ms,
            step_ms: m.step_ms,
            peak_bytes: memory::peak(&plan.device),
            gpu_busy_pct: m.gpu_busy_pct,
        };
        println!(
            "  batch {b:>6}: {:>10.0} samples/s, {:.3} ms/step",
            t.samples_per_s, t.step_ms
        );
        Ok(Trial::Ran(t))
    };
    let mut failed = None;
    let choice = search.run(|b| {
        // A signal ends the search between trials (each is about a second).
        if plan.stop.flag.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(redline_train::Error::Interrupted { step: 0, epoch: 0 });
        }
        match trial(b) {
            Ok(t) => Ok(t),
            Err(e) => {
                let message = format!("batch {b}: {e:#}");
                failed = Some(message.clone());
                Err(redline_train::Error::Config(message))
            }
        }
    });
    if let Err(redline_train::Error::Interrupted { .. }) = &choice {
        return Err(plan.stop.stopped("searching for the batch size"));
    }
    match (choice, failed) {
        (Ok(c), _) => Ok(c),
        (Err(_), Some(why)) => bail!("the batch-size search failed at {why}"),
        (Err(e), None) => Err(e.into()),
    }
}

/// The learning-rate range test on the plan's job, at its batch size.
pub fn lr(plan: &Plan, test: LrRangeTest) -> anyhow::Result<LrFound> {
    let train = Loader::placed_host(
        plan.prepared.train.clone(),
        plan.device.candle(),
        Placement::Resident,
        LoaderConfig {
            batch_size: plan.batch_size.min(plan.prepared.train.len().max(1)),
            shuffle: true,
            seed: plan.seed,
            prefetch: 0,
            drop_last: false,
        },
    )?;
    let make = step_maker(plan);
    println!(
        "lr range test: {} steps from {:e} to {:e} at batch {} (Ctrl-C stops it)",
        test.steps, test.min_lr, test.max_lr, plan.batch_size
    );
    let curve = match test.run_until(&make, &plan.device, &train, &plan.opt_cfg, &plan.stop.flag) {
        Err(redline_train::Error::Interrupted { .. }) => {
            return Err(plan.stop.stopped("running the learning-rate range test"))
        }
        other => other?,
    };
    let Some(index) = tune::suggestion(&curve.lr, &curve.smoothed, 10, 1) else {
        bail!(
            "the learning-rate range test gave {} points, too few to suggest a rate{}\nHINT: \
             narrow its range (--min-lr, --max-lr: the loss blew up early) or give it more \
             --steps or data; `train --lr auto` can take a --lr value instead",
            curve.lr.len(),
            curve
                .stopped
                .as_ref()
                .map_or(String::new(), |s| format!(" (stopped: {s})"))
        );
    };
    Ok(LrFound {
        lr: curve.lr[index],
        index,
        batch_size: plan.batch_size,
        test,
        curve,
    })
}

/// `redline tune batch-size|lr`: the finder alone, its table printed and
/// saved into `--out` (default `tune/<date-time>-<what>`).
pub fn run(args: &TuneArgs) -> anyhow::Result<()> {
    let (what, flags) = match &args.command {
        TuneCommand::BatchSize(f) => ("batch-size", f),
        TuneCommand::Lr(f) => ("lr", f),
        TuneCommand::Workers(f) => ("workers", f),
    };
    if flags.train.print_config {
        return crate::print_config::print(&flags.train);
    }
    let test = LrRangeTest {
        min_lr: flags.min_lr,
        max_lr: flags.max_lr,
        steps: flags.steps,
        ..LrRangeTest::default()
    };
    // Before the data is read: a bad range is refused by its flags.
    if what == "lr" {
        test.check()?;
    }
    let mut plan = crate::plan::prepare(&flags.train)?;
    if plan.ranks.is_distributed() {
        bail!(
            "redline tune under a launcher of {} ranks: the finders time one process\nHINT: \
             run it without mpirun/srun",
            plan.ranks.launch.world_size
        );
    }
    let out = match &flags.out {
        Some(o) => o.clone(),
        None => {
            let stamp = redline_core::time::Utc::from_unix(redline_core::time::unix_now()).stamp();
            PathBuf::from("tune").join(format!("{stamp}-{what}"))
        }
    };
    std::fs::create_dir_all(&out)
        .with_context(|| format!("--out {}: cannot create it", out.display()))?;
    match &args.command {
        TuneCommand::BatchSize(_) => {
            let choice = batch_size(&plan, BatchSizeSearch::default())?;
            print!("{}", choice.table());
            println!("batch size: {} ({})", choice.batch_size, choice.stopped);
            write(
                &out,
                "batch_size.json",
                &serde_json::to_string_pretty(&choice)?,
            )?;
            write(&out, "batch_size.csv", &batch_csv(&choice))?;
        }
        TuneCommand::Lr(_) => {
            if flags.train.batch_size.is_auto() {
                plan.batch_size = batch_size(&plan, BatchSizeSearch::default())?.batch_size;
            }
            let found = lr(&plan, test)?;
            println!("{}", found.line());
            write(&out, "lr.json", &serde_json::to_string_pretty(&found)?)?;
            write(&out, "lr.csv", &found.csv())?;
            let page = redline_report::lr_finder_page(
                &found.curve.lr,
                &found.curve.smoothed,
                Some(found.index),
            )?;
            write(&out, "lr.html", &page)?;
        }
        TuneCommand::Workers(_) => {
            let choice = crate::tune_workers::search(&plan, flags.train.prefetch)?;
            print!("{}", choice.table());
            println!("{}", choice.line());
            write(
                &out,
                "workers.json",
                &serde_json::to_string_pretty(&choice)?,
            )?;
            write(&out, "workers.csv", &choice.csv())?;
        }
    }
    println!("saved in {}", out.display());
    Ok(())
}

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> anyhow::Result<()> {
    let p = dir.join(name);
    redline_core::files::write_atomic(&p, text.as_bytes())
        .with_context(|| format!("writing {}", p.display()))
}

/// The trials as CSV.
fn batch_csv(c: &BatchSizeChoice) -> String {
    let mut s = String::from("batch_size,samples_per_s,step_ms,peak_bytes,gpu_busy_pct,chosen\n");
    for t in &c.trials {
        s.push_str(&format!(
            "{},{},{},{},{},{}\n",
            t.batch_size,
            t.samples_per_s,
            t.step_ms,
            t.peak_bytes.map_or(String::new(), |b| b.to_string()),
            t.gpu_busy_pct.map_or(String::new(), |g| g.to_string()),
            t.batch_size == c.batch_size
        ));
    }
    s
}

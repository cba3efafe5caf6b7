//! The data stage of `redline train`: the prepared splits placed on the
//! device (resident or streamed), sharded across ranks, augmented and
//! limited as the flags say.

use std::sync::Arc;

use anyhow::bail;
use redline_data::{
    place, Augmented, DataOnDevice, Dataset, Loader, LoaderConfig, Placement, Prepared, Samples,
    TargetKind,
};

use crate::cli::TrainArgs;
use crate::data_flags::augment;
use crate::plan::Plan;
use crate::short_runs::{apply, Limit};

/// The loaders of a run and what the startup line says of its data.
pub(super) struct Loaders {
    /// The training split's loader (this rank's shard, limited).
    pub train: Loader,
    /// Validation's, unless `--no-validate` or none.
    pub val: Option<Loader>,
    /// The test split's, unless `--no-validate` or none.
    pub test: Option<Loader>,
    /// The batch size used: `--batch-size`, at most the training samples.
    pub batch_size: usize,
    /// Samples of train, val and test.
    pub counts: (usize, usize, usize),
    /// Dimensions of one input.
    pub inputs: Vec<usize>,
    /// What the targets are.
    pub target: TargetKind,
    /// The format read.
    pub format: String,
    /// What reading decided and why.
    pub notes: Vec<String>,
    /// The streamed image sources (training with validation, and test), for
    /// the count of skipped bad samples and the decode workers.
    pub streamed: Vec<redline_data::Streamed>,
}

impl Loaders {
    /// Images skipped as undecodable so far (`--bad-samples skip`).
    pub fn skipped(&self) -> usize {
        self.streamed.iter().map(|s| s.skipped()).sum()
    }

    /// What the decode workers did so far, over every streamed split
    /// (`None`: nothing streams).
    pub fn pipeline(&self) -> Option<redline_data::PipelineStats> {
        // Splits of one source count into the same totals: each once.
        let mut all = self
            .streamed
            .iter()
            .enumerate()
            .filter(|(i, s)| !self.streamed[..*i].iter().any(|o| o.shares_pipeline(s)))
            .map(|(_, s)| s.pipeline());
        let first = all.next()?;
        Some(all.fold(first, |a, b| redline_data::PipelineStats {
            workers: a.workers,
            images: a.images + b.images,
            busy_s: a.busy_s + b.busy_s,
        }))
    }

    /// Decode threads of streamed images (`None`: nothing streams).
    pub fn workers(&self) -> Option<usize> {
        self.streamed.first().map(|s| s.workers())
    }
}

/// Builds the loaders of the plan's data (taken out of it: the host copies
/// go to the loaders) on its device for this rank, at its batch size,
/// limited by its short-run flags.
pub(super) fn build(args: &TrainArgs, plan: &mut Plan) -> anyhow::Result<Loaders> {
    let prepared = take(&mut plan.prepared);
    let streamed: Vec<redline_data::Streamed> = [Some(&prepared.train), prepared.test.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|s| s.streamed().cloned())
        .collect();
    let (device, strategy, short) = (&plan.device, &plan.ranks.strategy, &plan.short);
    let wanted_batch = plan.batch_size;
    // Each rank reads its shard of every epoch (DistributedSampler): padded
    // for training, so every rank takes the same steps; evaluation counts
    // each sample once.
    let shard =
        |l: Loader, pad: bool| -> anyhow::Result<Loader> { Ok(l.shard(strategy.shard(pad))?) };
    let (inputs, target) = (
        prepared.train.input_dims().to_vec(),
        prepared.train.target(),
    );
    let policy: DataOnDevice = args.data_on_device.parse()?;
    // Read on the host, then placed: uploaded once, or streamed per batch.
    let mut device_free = redline_core::memory::stats(device)?.map(|m| m.device_free);
    let mut load = |data: Samples, cfg: LoaderConfig| -> anyhow::Result<Loader> {
        let placement = place(policy, data.bytes(), device_free)?;
        if let (Placement::Resident, Some(free)) = (placement, device_free.as_mut()) {
            *free = free.saturating_sub(data.bytes());
        }
        Ok(Loader::placed_host(data, device.candle(), placement, cfg)?)
    };
    let eval_cfg = LoaderConfig {
        batch_size: args.eval_batch_size,
        shuffle: false,
        seed: 0,
        prefetch: args.prefetch,
        drop_last: false,
    };
    let (train_n, val_n, test_n) = (
        prepared.train.len(),
        prepared.val.as_ref().map_or(0, |v| v.len()),
        prepared.test.as_ref().map_or(0, |t| t.len()),
    );
    // A stated clamp: a batch larger than the data is the whole data.
    let batch_size = wanted_batch.min(train_n.max(1));
    if batch_size < wanted_batch {
        println!(
            "  --batch-size {} is more than the {train_n} training samples: each step uses all \
             {train_n} (batch {batch_size})",
            wanted_batch
        );
    }
    let buffer = shuffle_buffer(args, &prepared.train)?;
    let train_cfg = LoaderConfig {
        batch_size,
        // Overfitting takes the same batches every epoch.
        shuffle: !args.no_shuffle && !short.overfit,
        seed: args.seed,
        prefetch: args.prefetch,
        drop_last: false,
    };
    let train_loader = match augment(args)? {
        Some(_) if policy == DataOnDevice::On => bail!(
            "--augment transforms batches on the loader thread, so the training split streams; \
             it cannot be combined with --data-on-device on"
        ),
        // Transforms run while gathering on the loader thread: the split streams.
        Some(mut aug) => {
            // Image folders and shards are normalised per channel (ImageNet's
            // by default): the padding is black in those units.
            if matches!(prepared.format.id(), "images" | "shards") {
                let opts = crate::data_flags::data_options(args, 1)?;
                let channels = inputs.first().copied().unwrap_or(3);
                aug.fill = redline_data::pixel_norm(&opts, channels).black();
            }
            Loader::from_dataset(
                Arc::new(Augmented::new(prepared.train, aug, args.seed)?),
                device.candle(),
                train_cfg,
            )?
        }
        None => load(prepared.train, train_cfg)?,
    };
    let train_loader = match buffer.0 {
        Some(n) => train_loader.shuffle_buffer(n),
        None => train_loader,
    };
    let train_loader = shard(train_loader, true)?;
    let train_loader = apply(&short.flag("train"), train_loader, short.train)?;
    // A limit of 0 batches is no pass at all.
    let none = |l: Option<Limit>| l == Some(Limit::Batches(0));
    let (val_loader, test_loader) = if args.no_validate {
        (None, None)
    } else {
        let test = prepared
            .test
            .filter(|_| !none(short.test))
            .map(|t| shard(load(t, eval_cfg.clone())?, false))
            .transpose()?
            .map(|l| apply(&short.flag("test"), l, short.test))
            .transpose()?;
        let val = prepared
            .val
            .filter(|_| !none(short.val))
            .map(|v| shard(load(v, eval_cfg)?, false))
            .transpose()?
            .map(|l| apply(&short.flag("val"), l, short.val))
            .transpose()?;
        (val, test)
    };
    Ok(Loaders {
        train: train_loader,
        val: val_loader,
        test: test_loader,
        batch_size,
        counts: (train_n, val_n, test_n),
        inputs,
        target,
        format: prepared.format.to_string(),
        notes: prepared.notes.into_iter().chain(buffer.1).collect(),
        streamed,
    })
}

/// The plan's data, leaving empty splits in its place: the loaders own the
/// host copies (one of each split is held, never two).
fn take(prepared: &mut Prepared) -> Prepared {
    Prepared {
        format: prepared.format.clone(),
        train: prepared.train.take(),
        val: prepared.val.take(),
        test: prepared.test.take(),
        notes: std::mem::take(&mut prepared.notes),
    }
}

/// The training split's shuffle buffer: `--shuffle-buffer N` (0: none), or
/// by default 4096 samples when tar shards exceed the host-memory budget
/// (the page cache cannot hold them, so reads should run through each
/// shard), and the startup note that says which and why. No buffer and no
/// note for data that is not in shards.
fn shuffle_buffer(
    args: &TrainArgs,
    train: &Samples,
) -> anyhow::Result<(Option<usize>, Option<String>)> {
    let Some(stored) = train.streamed().filter(|s| s.shard_ids().is_some()) else {
        let note = args.shuffle_buffer.map(|_| {
            "--shuffle-buffer: applies to tar shards read from disk (--stream); this split is \
             shuffled by a full permutation each epoch"
                .to_string()
        });
        return Ok((None, note));
    };
    let bytes = stored.stored_bytes();
    let budget = crate::data_flags::host_memory_budget(args.host_memory_budget.as_deref())?;
    let gb = |b: u64| b as f64 / 1e9;
    let size = format!("the shards ({:.2} GB)", gb(bytes));
    let (n, why) = match args.shuffle_buffer {
        Some(0) => (None, "--shuffle-buffer 0".to_string()),
        Some(n) => (Some(n), "--shuffle-buffer".to_string()),
        None if bytes > budget => (
            Some(4096),
            format!(
                "{size} exceed the host-memory budget ({:.2} GB)",
                gb(budget)
            ),
        ),
        None => (
            None,
            format!("{size} fit the host-memory budget ({:.2} GB)", gb(budget)),
        ),
    };
    let note = match n {
        Some(n) => format!(
            "shuffle: shard order each epoch, then a buffer of {n} samples (WebDataset's), \
             each shard read front to back ({why}; --shuffle-buffer 0 for a full permutation)"
        ),
        None => format!(
            "shuffle: a full permutation of the shards' samples each epoch ({why}; \
             --shuffle-buffer N reads shard by shard through a buffer of N)"
        ),
    };
    Ok((n, Some(note)))
}

//! `redline pack SRC DEST`: an image folder into WebDataset tar shards
//! (`redline_data::pack`), with a progress bar; Ctrl-C stops it cleanly,
//! leaving nothing behind.

use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use redline_data::pack::{pack, PackOptions};

use crate::cli::PackArgs;

/// Runs `redline pack`.
pub fn run(args: &PackArgs) -> anyhow::Result<()> {
    let shard_bytes = crate::data_flags::size("--shard-size", &args.shard_size, "")?;
    if shard_bytes < 1 << 20 {
        bail!(
            "--shard-size {}: give at least 1MB (WebDataset's shards hold 100MB to 1GB)",
            args.shard_size
        );
    }
    if !(1..=100).contains(&args.quality) {
        bail!(
            "--quality {}: give a JPEG quality from 1 to 100",
            args.quality
        );
    }
    if !(16..=16384).contains(&args.max_side) {
        bail!("--max-side {}: give 16 to 16384 pixels", args.max_side);
    }
    let cores = redline_core::threads::usable_cores();
    let workers = match args.workers {
        Some(n) if (1..=1024).contains(&n) => n,
        Some(n) => bail!("--workers {n}: give 1 to 1024 threads"),
        None => cores,
    };
    let stop = crate::signals::stop_on_signals()?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("packing {bar:30} {pos}/{len} images {per_sec} eta {eta}")
            .context("the progress bar")?,
    );
    let opts = PackOptions {
        max_side: args.max_side,
        quality: args.quality,
        shard_bytes,
        workers,
        seed: args.seed,
    };
    let start = Instant::now();
    let result = pack(&args.src, &args.dest, &opts, &stop.flag, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let packed = match result {
        Err(redline_data::Error::Interrupted) => {
            bail!(
                "pack stopped by a signal; nothing was written ({} does not exist)",
                args.dest.display()
            )
        }
        other => other.with_context(|| format!("pack {}", args.src.display()))?,
    };
    let splits: Vec<String> = packed
        .splits
        .iter()
        .map(|(s, n, k)| {
            format!(
                "{s}: {n} images in {k} shard{}",
                if *k == 1 { "" } else { "s" }
            )
        })
        .collect();
    println!(
        "packed {} into {}: {} ({:.1} MiB; {} shrunk to {} px) in {:.1} s on {workers} workers\n\
         train on it with: redline train --data {}",
        args.src.display(),
        args.dest.display(),
        splits.join(", "),
        packed.bytes as f64 / (1u64 << 20) as f64,
        packed.shrunk,
        args.max_side,
        start.elapsed().as_secs_f64(),
        args.dest.display()
    );
    Ok(())
}

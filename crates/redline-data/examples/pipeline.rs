//! The streamed image pipeline alone: reads, decodes, random-resized-crops,
//! flips and normalises an image folder or tar shards into batches on the
//! CPU, with no model, and prints images/s (bench/pipeline.py runs it beside
//! torchvision's DataLoader).
//!
//! ```sh
//! cargo run --release -p redline-data --example pipeline -- DATA [WORKERS] [SIZE] [BATCH] [BATCHES]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use candle_core::Device;
use redline_data::{
    prepare, DataOptions, Dataset, Loader, LoaderConfig, StreamMode, StreamOptions,
};

/// The CLI's allocator: a batch's buffers come back from its cache of
/// mappings instead of being faulted in afresh each batch, as in `redline
/// train`.
#[global_allocator]
static ALLOC: redline_core::host_alloc::HostAlloc = redline_core::host_alloc::HostAlloc;

fn main() -> anyhow::Result<()> {
    redline_core::host_alloc::reuse_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: usize| -> anyhow::Result<usize> {
        Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d))
    };
    let data = PathBuf::from(args.first().map_or("data", String::as_str));
    let (workers, size, batch, batches) = (arg(1, 2)?, arg(2, 224)?, arg(3, 64)?, arg(4, 20)?);
    let opts = DataOptions {
        val_split: Some(0.0),
        stream: StreamOptions {
            mode: StreamMode::On,
            workers,
            crop: Some(size as u32),
            hflip: true,
            ..StreamOptions::default()
        },
        ..DataOptions::default()
    };
    let p = prepare(&data, &opts)?;
    let n = p.train.len();
    let cfg = LoaderConfig {
        batch_size: batch,
        shuffle: true,
        seed: 0,
        prefetch: 2,
        drop_last: true,
    };
    let loader = Loader::placed_host(
        p.train,
        &Device::Cpu,
        redline_data::Placement::Streaming,
        cfg,
    )?;
    let per_epoch = n / batch;
    let (mut seen, mut epoch, mut warm) = (0usize, 0usize, None);
    let start = Instant::now();
    'outer: loop {
        for b in loader.epoch(epoch) {
            let b = b?;
            seen += b.size();
            // The first batches warm the pool and the page cache up.
            if warm.is_none() && seen >= 2 * batch {
                warm = Some((Instant::now(), seen));
            }
            if seen >= (batches + 2) * batch {
                break 'outer;
            }
        }
        epoch += 1;
        anyhow::ensure!(per_epoch > 0, "fewer than {batch} images");
    }
    let (t0, s0) = warm.unwrap_or((start, 0));
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "redline pipeline: {} images in {secs:.3} s = {:.1} images/s ({workers} workers, {size} px, batch {batch})",
        seen - s0,
        (seen - s0) as f64 / secs
    );
    Ok(())
}

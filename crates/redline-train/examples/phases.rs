//! Times each phase of a training step (batch, forward, loss, backward,
//! optimizer, running sums) over one epoch, to find where the time goes.
//!
//! `cargo run --release -p redline-train --example phases -- [mlp|cnn] [batch] [steps] [epochs]`
//!
//! With `epochs` > 1 it prints each epoch's phases (steps counts per epoch).

use std::path::PathBuf;
use std::time::Instant;

use redline_core::{Device, Precision};
use redline_data::{Loader, LoaderConfig, Normalize, Split, SplitKind};
use redline_models::ModelConfig;
use redline_train::{loss::cross_entropy, OptimizerConfig};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model_name = args.get(1).map_or("mlp", String::as_str);
    let batch: usize = args.get(2).map_or(Ok(64), |s| s.parse())?;
    let max_steps: usize = args.get(3).map_or(Ok(usize::MAX), |s| s.parse())?;
    let epochs: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let dev = Device::cpu();
    let split = Split::load(
        &dir,
        SplitKind::Train,
        10,
        Normalize::default(),
        dev.candle(),
    )?;
    let loader = Loader::new(
        split,
        LoaderConfig {
            batch_size: batch,
            prefetch: 0,
            ..Default::default()
        },
    )?;
    let model = ModelConfig::by_name(model_name)?.build(&dev, Precision::Fp32, 0)?;
    let mut opt = OptimizerConfig::by_name("adam", 1e-3)?.build(model.params().to_vec())?;
    for epoch in 0..epochs {
        run_epoch(
            &loader,
            model.as_ref(),
            &mut opt,
            epoch,
            max_steps,
            model_name,
            batch,
        )?;
    }
    Ok(())
}

fn run_epoch(
    loader: &Loader,
    model: &dyn redline_models::Model,
    opt: &mut redline_train::Optimizer,
    epoch: usize,
    max_steps: usize,
    model_name: &str,
    batch: usize,
) -> anyhow::Result<()> {
    let mut t = [0f64; 5];
    let names = ["batch", "forward", "loss", "backward", "optimizer"];
    let start = Instant::now();
    let mut steps = 0;
    let mut it = loader.epoch(epoch);
    while steps < max_steps {
        let t0 = Instant::now();
        let Some(b) = it.next() else { break };
        let b = b?;
        let t1 = Instant::now();
        let logits = model.forward(&b.x)?;
        let t2 = Instant::now();
        let loss = cross_entropy(&logits, &b.y)?;
        let t3 = Instant::now();
        model.params().backward(&loss)?;
        let t4 = Instant::now();
        opt.step()?;
        let t5 = Instant::now();
        for (i, d) in [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4]
            .iter()
            .enumerate()
        {
            t[i] += d.as_secs_f64();
        }
        steps += 1;
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "{model_name} batch {batch}, epoch {}: {steps} steps in {total:.3} s ({:.3} ms/step)",
        epoch + 1,
        1e3 * total / steps as f64
    );
    for (n, s) in names.iter().zip(t) {
        println!(
            "  {n:<10} {:>8.3} ms/step {:>5.1}%",
            1e3 * s / steps as f64,
            100.0 * s / total
        );
    }
    Ok(())
}

//! The data flags of `redline train` (`--task`, `--target`, `--val-split`,
//! `--image-size`, `--augment`, `--hidden`, ...) turned into configs.

use anyhow::{bail, Context};
use redline_data::{Augment, ChannelNorm, DataOptions, Normalize, StreamOptions};

use crate::cli::TrainArgs;

/// How `--data` is read, from the flags; streamed images are decoded on
/// `workers` threads.
pub fn data_options(args: &TrainArgs, workers: usize) -> anyhow::Result<DataOptions> {
    let max = crate::plan::MAX_IMAGE_SIZE;
    if let Some(s) = args.image_size.filter(|s| !(1..=max).contains(s)) {
        bail!("--image-size {s}: give a side from 1 to {max} pixels");
    }
    let (crop, hflip) = resized_crop(args)?;
    let (means, stds) = channel_stats(args)?;
    let given = args.mean.is_some() || args.std.is_some();
    let uniform = means.iter().all(|&m| m == means[0]) && stds.iter().all(|&s| s == stds[0]);
    // One value for every channel is the scalar every format takes; three
    // differing ones only image folders and shards take (checked with the data).
    let norm = match uniform {
        true => normalisation(means[0], stds[0])?,
        false => Normalize::default(),
    };
    let channel = ChannelNorm {
        mean: means,
        std: stds,
    };
    let stream = StreamOptions {
        mode: args.stream.parse()?,
        budget: Some(host_memory_budget(args.host_memory_budget.as_deref())?),
        workers,
        crop,
        hflip,
        norm: given.then_some(channel),
        skip_bad: args.bad_samples == "skip",
    };
    let block = redline_models::ModelConfig::token_block(&args.model)?;
    if let (Some(t), None) = (&args.tokenizer, block) {
        bail!(
            "--tokenizer {}: tokenises text for a language model, and --model {} is not one\n\
             HINT: --model gpt-char, gpt2, or a model file with kind = \"gpt\"",
            t.display(),
            args.model
        );
    }
    Ok(DataOptions {
        task: args.task.parse()?,
        classes: args.classes,
        target: match &args.target {
            Some(t) => t.parse()?,
            None => Default::default(),
        },
        header: args.header.parse()?,
        norm,
        standardize: !args.no_standardize,
        val_split: args.val_split,
        seed: args.seed,
        image_size: args.image_size,
        stream,
        // Token data is cut into the language model's windows.
        block,
        tokenizer: args.tokenizer.clone(),
    })
}

/// The most decode threads `--workers` takes.
const MAX_WORKERS: usize = 1024;

/// `--workers`, or its default: on the CPU the cores the `threads` compute
/// threads leave (at least 1), with a GPU all cores but one.
pub fn workers(args: &TrainArgs, cores: usize, threads: usize, gpu: bool) -> anyhow::Result<usize> {
    match args.workers {
        Some(n) if (1..=MAX_WORKERS).contains(&n) => Ok(n),
        Some(n) => bail!("--workers {n}: give 1 to {MAX_WORKERS} decode threads"),
        None if gpu => Ok(cores.saturating_sub(1).max(1)),
        None => Ok(cores.saturating_sub(threads).max(1)),
    }
}

/// `--host-memory-budget`: `64GB`, `512MiB`, `1e9` (bytes) or `50%` of RAM;
/// half of RAM by default.
pub fn host_memory_budget(text: Option<&str>) -> anyhow::Result<u64> {
    let total = redline_core::system::host_memory_total();
    let share = |f: f64| -> anyhow::Result<u64> {
        let t = total.context(
            "--host-memory-budget: the host's memory cannot be read; give a size such as 16GB",
        )?;
        Ok((t as f64 * f) as u64)
    };
    let Some(text) = text.map(str::trim) else {
        return share(0.5);
    };
    let bad = || {
        anyhow::anyhow!(
            "--host-memory-budget {text:?}: give a size such as 64GB, 512MiB or 1e9 (bytes),              or a share of RAM such as 50%"
        )
    };
    if let Some(p) = text.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&p) || p.is_nan() {
            bail!("--host-memory-budget {text}: give a share from 0% to 100%");
        }
        return share(p / 100.0);
    }
    size(
        "--host-memory-budget",
        text,
        "or a share of RAM such as 50%",
    )
}

/// A size flag's bytes: `64GB`, `512MiB`, `1e9` (bytes); `more` adds to
/// what the message says the flag takes.
pub fn size(flag: &str, text: &str, more: &str) -> anyhow::Result<u64> {
    let bad = || {
        let sep = if more.is_empty() { "" } else { ", " };
        anyhow::anyhow!(
            "{flag} {text:?}: give a size such as 64GB, 512MiB or 1e9 (bytes){sep}{more}"
        )
    };
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let num: f64 = num.trim().parse().map_err(|_| bad())?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        "tib" => 1099511627776.0,
        _ => return Err(bad()),
    };
    let bytes = num * scale;
    if !bytes.is_finite() || !(0.0..=1e18).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// `random-resized-crop=SIZE` and `hflip` of `--augment`: the crop's side
/// and the flip (`None`: no random-resized crop).
fn resized_crop(args: &TrainArgs) -> anyhow::Result<(Option<u32>, bool)> {
    let Some(text) = &args.augment else {
        return Ok((None, false));
    };
    let mut crop = None;
    let mut flip = false;
    for part in text.split(',').map(str::trim) {
        match part.split_once('=') {
            Some(("random-resized-crop", n)) => {
                crop = Some(
                    n.parse::<u32>()
                        .ok()
                        .filter(|s| (1..=crate::plan::MAX_IMAGE_SIZE).contains(s))
                        .with_context(|| {
                            format!(
                                "--augment random-resized-crop={n}: give the output side, 1 to \
                                 {} pixels (e.g. 224)",
                                crate::plan::MAX_IMAGE_SIZE
                            )
                        })?,
                )
            }
            None if part == "flip" || part == "hflip" => flip = true,
            _ => {}
        }
    }
    let other = text
        .split(',')
        .map(str::trim)
        .find(|p| !(p.starts_with("random-resized-crop=") || *p == "flip" || *p == "hflip"));
    if let (Some(_), Some(p)) = (crop, other) {
        bail!(
            "--augment {p:?}: with random-resized-crop=SIZE, give only hflip (the ImageNet \
             recipe); crop and pad-crop cannot be combined with it"
        );
    }
    Ok((crop, crop.is_some() && flip))
}

/// `--mean` and `--std` per channel (R, G, B; one value repeated), each
/// checked as [`normalisation`] checks a pair.
fn channel_stats(args: &TrainArgs) -> anyhow::Result<([f32; 3], [f32; 3])> {
    let three = |s: Option<&crate::cli::Stat>| -> [f32; 3] {
        match s.map(|s| s.0.as_slice()) {
            Some([one]) => [*one; 3],
            Some([r, g, b]) => [*r, *g, *b],
            _ => [0.5; 3],
        }
    };
    let (m, s) = (three(args.mean.as_ref()), three(args.std.as_ref()));
    for c in 0..3 {
        normalisation(m[c], s[c])?;
    }
    Ok((m, s))
}

/// `--mean`/`--std`, refused when dividing by the std would turn pixels into
/// infinities or flip their sign (the loss would later be blamed instead).
fn normalisation(mean: f32, std: f32) -> anyhow::Result<Normalize> {
    if !mean.is_finite() || mean.abs() > 1e6 {
        bail!("--mean {mean}: give a finite mean of the pixels in [0, 1], e.g. 0.5");
    }
    if !(std.is_finite() && (1e-6..=1e6).contains(&std)) {
        bail!(
            "--std {std}: give the pixels' standard deviation, a positive number between 1e-6 \
             and 1e6 (e.g. 0.5); dividing by {std} would make the inputs {}",
            if std <= 0.0 || std.is_nan() {
                "meaningless (zero, negative or NaN scale)"
            } else {
                "enormous or infinite"
            }
        );
    }
    Ok(Normalize { mean, std })
}

/// `--augment flip,crop=4` as the transforms on the loader thread (`None`
/// without the flag, or when random-resized-crop, which the streamed images
/// apply themselves, is given).
pub fn augment(args: &TrainArgs) -> anyhow::Result<Option<Augment>> {
    let Some(text) = &args.augment else {
        return Ok(None);
    };
    if resized_crop(args)?.0.is_some() {
        return Ok(None);
    }
    let mut aug = Augment {
        flip: false,
        crop_padding: 0,
        fill: {
            let (m, s) = channel_stats(args)?;
            std::array::from_fn(|c| -m[c] / s[c])
        },
    };
    for part in text.split(',').map(str::trim) {
        match part.split_once('=') {
            None if part == "flip" || part == "hflip" => aug.flip = true,
            None if part == "crop" => aug.crop_padding = 4,
            Some(("crop", n)) => {
                aug.crop_padding = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--augment crop={n}: give a padding >= 1"))?
            }
            _ => bail!(
                "--augment {part:?}: expected flip, crop or crop=N, or \
                 random-resized-crop=SIZE[,hflip] (comma-separated)"
            ),
        }
    }
    Ok(Some(aug))
}

/// `--hidden 256,128` as widths.
pub fn hidden(args: &TrainArgs) -> anyhow::Result<Option<Vec<usize>>> {
    let Some(text) = &args.hidden else {
        return Ok(None);
    };
    let widths = text
        .split(',')
        .map(|w| w.trim().parse::<usize>().ok().filter(|&w| w > 0))
        .collect::<Option<Vec<usize>>>();
    match widths {
        Some(w) if !w.is_empty() => Ok(Some(w)),
        _ => bail!("--hidden {text:?}: give widths >= 1 separated by commas, e.g. 256,128"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(flags: &[&str]) -> anyhow::Result<TrainArgs> {
        let argv = ["redline", "train"].iter().chain(flags);
        match Cli::try_parse_from(argv)?.command {
            Command::Train(a) => Ok(*a),
            _ => bail!("not train"),
        }
    }

    #[test]
    fn hidden_widths_and_augment_lists_parse_or_say_why_not() -> anyhow::Result<()> {
        assert_eq!(
            hidden(&args(&["--hidden", "256, 128"])?)?,
            Some(vec![256, 128])
        );
        assert_eq!(hidden(&args(&[])?)?, None);
        for bad in ["", "8,", "x", "0"] {
            assert!(hidden(&args(&["--hidden", bad])?).is_err(), "{bad:?}");
        }
        let a = augment(&args(&[
            "--augment",
            "flip,crop=2",
            "--mean",
            "0.5",
            "--std",
            "0.25",
        ])?)?;
        assert_eq!(
            a,
            Some(Augment {
                flip: true,
                crop_padding: 2,
                fill: [-2.0; 3]
            })
        );
        let a = augment(&args(&["--augment", "crop"])?)?;
        assert_eq!(a.map(|a| (a.flip, a.crop_padding)), Some((false, 4)));
        for bad in ["crop=0", "crop=-1", "blur", "flip,,crop"] {
            assert!(augment(&args(&["--augment", bad])?).is_err(), "{bad:?}");
        }
        let d = data_options(&args(&["--target", "-2", "--task", "regression"])?, 1)?;
        assert_eq!(d.target, redline_data::TargetColumn::Index(-2));
        assert_eq!(d.task, redline_data::Task::Regression);
        Ok(())
    }
}

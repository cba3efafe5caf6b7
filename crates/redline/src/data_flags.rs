//! The data flags of `redline train` (`--task`, `--target`, `--val-split`,
//! `--image-size`, `--augment`, `--hidden`, ...) turned into configs.

use anyhow::{bail, Context};
use redline_data::{Augment, DataOptions, Normalize};

use crate::cli::TrainArgs;

/// How `--data` is read, from the flags.
pub fn data_options(args: &TrainArgs) -> anyhow::Result<DataOptions> {
    Ok(DataOptions {
        task: args.task.parse()?,
        classes: args.classes,
        target: match &args.target {
            Some(t) => t.parse()?,
            None => Default::default(),
        },
        header: args.header.parse()?,
        norm: normalisation(args.mean, args.std)?,
        standardize: !args.no_standardize,
        val_split: args.val_split,
        seed: args.seed,
        image_size: args.image_size,
    })
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

/// `--augment flip,crop=4` as the transforms (`None` without the flag).
pub fn augment(args: &TrainArgs) -> anyhow::Result<Option<Augment>> {
    let Some(text) = &args.augment else {
        return Ok(None);
    };
    let mut aug = Augment {
        flip: false,
        crop_padding: 0,
        fill: -args.mean / args.std,
    };
    for part in text.split(',').map(str::trim) {
        match part.split_once('=') {
            None if part == "flip" => aug.flip = true,
            None if part == "crop" => aug.crop_padding = 4,
            Some(("crop", n)) => {
                aug.crop_padding = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--augment crop={n}: give a padding >= 1"))?
            }
            _ => bail!("--augment {part:?}: expected flip, crop or crop=N (comma-separated)"),
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
                fill: -2.0
            })
        );
        let a = augment(&args(&["--augment", "crop"])?)?;
        assert_eq!(a.map(|a| (a.flip, a.crop_padding)), Some((false, 4)));
        for bad in ["crop=0", "crop=-1", "blur", "flip,,crop"] {
            assert!(augment(&args(&["--augment", bad])?).is_err(), "{bad:?}");
        }
        let d = data_options(&args(&["--target", "-2", "--task", "regression"])?)?;
        assert_eq!(d.target, redline_data::TargetColumn::Index(-2));
        assert_eq!(d.task, redline_data::Task::Regression);
        Ok(())
    }
}

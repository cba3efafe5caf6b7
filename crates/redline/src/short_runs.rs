//! Short runs, as Lightning's: `--fast-dev-run [N]` (N batches of training,
//! validation and test, one epoch, nothing kept but a marked run folder),
//! `--limit-train-batches`, `--limit-val-batches`, `--limit-test-batches`
//! (a count, or a fraction of each epoch's batches) and `--overfit-batches`
//! (the same first batches every epoch, unshuffled).

use anyhow::bail;
use redline_data::Loader;

use crate::cli::TrainArgs;

/// A limit on an epoch's batches: a count or a fraction of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// At most this many batches.
    Batches(usize),
    /// This fraction of the batches, rounded down (Lightning's `int(n * f)`).
    Fraction(f64),
}

impl Limit {
    /// Parses `N` or a fraction `0.25` of flag `flag`.
    fn parse(flag: &str, s: &str) -> anyhow::Result<Self> {
        let hint = format!("HINT: {flag} 10 (batches) or {flag} 0.25 (a quarter of them)");
        if let Ok(n) = s.trim().parse::<usize>() {
            return Ok(Self::Batches(n));
        }
        match s.trim().parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(Self::Fraction(f)),
            Ok(f) => bail!("{flag} {f}: a fraction must be above 0 and at most 1\n{hint}"),
            Err(_) => bail!("{flag} {s:?}: not a number of batches or a fraction\n{hint}"),
        }
    }

    /// The limit as the user wrote it: `10` or `0.25`.
    fn shown(&self) -> String {
        match self {
            Self::Batches(n) => n.to_string(),
            Self::Fraction(f) => f.to_string(),
        }
    }

    /// The batches of an epoch of `all` this limit keeps.
    fn of(&self, all: usize) -> usize {
        match *self {
            Self::Batches(n) => n.min(all),
            Self::Fraction(f) => ((all as f64) * f).floor() as usize,
        }
    }
}

/// The short-run flags, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShortRun {
    /// `--fast-dev-run N`.
    pub fast_dev_run: Option<usize>,
    /// Training batches an epoch.
    pub train: Option<Limit>,
    /// Validation batches.
    pub val: Option<Limit>,
    /// Test batches.
    pub test: Option<Limit>,
    /// `--overfit-batches`: training unshuffled on the same batches.
    pub overfit: bool,
}

impl ShortRun {
    /// Reads and checks the flags: `--fast-dev-run` sets every limit itself,
    /// and `--overfit-batches` the training and validation ones.
    pub fn from_args(args: &TrainArgs) -> anyhow::Result<Self> {
        let parse = |flag: &str, v: &Option<String>| {
            v.as_deref().map(|s| Limit::parse(flag, s)).transpose()
        };
        let train = parse("--limit-train-batches", &args.limit_train_batches)?;
        let val = parse("--limit-val-batches", &args.limit_val_batches)?;
        let test = parse("--limit-test-batches", &args.limit_test_batches)?;
        let overfit = parse("--overfit-batches", &args.overfit_batches)?;
        let given: Vec<&str> = [
            ("--limit-train-batches", train.is_some()),
            ("--limit-val-batches", val.is_some()),
            ("--limit-test-batches", test.is_some()),
            ("--overfit-batches", overfit.is_some()),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect();
        if let Some(n) = args.fast_dev_run {
            if n == 0 {
                bail!("--fast-dev-run 0: give the batches to run (at least 1), or leave it out");
            }
            if let Some(f) = given.first() {
                bail!(
                    "--fast-dev-run sets every batch limit itself (N batches of each); {f} \
                     cannot be given with it"
                );
            }
            let n = Some(Limit::Batches(n));
            return Ok(Self {
                fast_dev_run: args.fast_dev_run,
                train: n,
                val: n,
                test: n,
                overfit: false,
            });
        }
        if let Some(o) = overfit {
            if train.is_some() || val.is_some() {
                bail!(
                    "--overfit-batches sets the training and validation limits itself; leave \
                     out --limit-train-batches and --limit-val-batches"
                );
            }
            if o == Limit::Batches(0) {
                bail!("--overfit-batches 0: give the batches to overfit (at least 1)");
            }
            return Ok(Self {
                fast_dev_run: None,
                train: Some(o),
                val: Some(o),
                test,
                overfit: true,
            });
        }
        if train == Some(Limit::Batches(0)) {
            bail!(
                "--limit-train-batches 0: no training at all\nHINT: give at least 1 batch; \
                 --no-validate skips validation, --limit-val-batches 0 too"
            );
        }
        Ok(Self {
            fast_dev_run: None,
            train,
            val,
            test,
            overfit: false,
        })
    }

    /// Whether any limit is set.
    pub fn is_short(&self) -> bool {
        self.train.is_some() || self.val.is_some() || self.test.is_some()
    }

    /// The flag that set the limit of a split (`train`, `val`, `test`), for
    /// messages: `--fast-dev-run` and `--overfit-batches` set several.
    pub fn flag(&self, split: &str) -> String {
        match (self.fast_dev_run, self.overfit, split) {
            (Some(_), _, _) => "--fast-dev-run".into(),
            (None, true, "train" | "val") => "--overfit-batches".into(),
            _ => format!("--limit-{split}-batches"),
        }
    }

    /// One line for the startup output and `summary.json` `short_run`,
    /// with the batches an epoch of each split runs (`None`: no such split,
    /// or not run), as limited: a limit above a split's batches says so.
    pub fn describe(&self, ran: [Option<usize>; 3]) -> Option<String> {
        if !self.is_short() {
            return None;
        }
        let show = |l: &Option<Limit>, ran: Option<usize>| match (l, ran) {
            (None, _) => "all".to_string(),
            (Some(l), None) => format!("{} (none run)", l.shown()),
            (Some(Limit::Batches(n)), Some(r)) if *n > r => format!("{r}, all there are"),
            (Some(Limit::Fraction(f)), Some(r)) => format!("{r} ({:.0}%)", f * 100.0),
            (Some(_), Some(r)) => r.to_string(),
        };
        let what = match (self.fast_dev_run, self.overfit) {
            (Some(asked), _) => {
                // What actually runs: no more batches than a split has.
                let n = ran
                    .iter()
                    .flatten()
                    .copied()
                    .max()
                    .map_or(asked, |m| asked.min(m));
                let note = match n < asked {
                    true => format!(" (--fast-dev-run {asked}; no split has more)"),
                    false => String::new(),
                };
                format!(
                    "fast dev run: {n} batch{} of train, val and test{note}, 1 epoch; no \
                     checkpoints, --save not written",
                    if n == 1 { "" } else { "es" }
                )
            }
            (None, true) => "overfitting the same first batches every epoch, unshuffled".into(),
            (None, false) => "limited batches".into(),
        };
        Some(format!(
            "{what} (batches an epoch: train {}, val {}, test {})",
            show(&self.train, ran[0]),
            show(&self.val, ran[1]),
            show(&self.test, ran[2])
        ))
    }
}

/// `loader` limited by `limit`; refuses a fraction that keeps no batch.
pub fn apply(flag: &str, loader: Loader, limit: Option<Limit>) -> anyhow::Result<Loader> {
    let Some(limit) = limit else {
        return Ok(loader);
    };
    let all = loader.batches_per_epoch();
    let keep = limit.of(all);
    if keep == 0 && matches!(limit, Limit::Fraction(_)) {
        bail!(
            "{flag} {}: that fraction of {all} batches keeps none\nHINT: give a larger fraction \
             or a number of batches",
            limit.shown()
        );
    }
    Ok(loader.limit_batches(keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_as_counts_or_fractions() {
        assert_eq!(Limit::parse("--x", "3").ok(), Some(Limit::Batches(3)));
        assert_eq!(
            Limit::parse("--x", "0.25").ok(),
            Some(Limit::Fraction(0.25))
        );
        for bad in ["1.5", "-1", "nan", "x", "0.0"] {
            assert!(Limit::parse("--x", bad).is_err(), "{bad}");
        }
        assert_eq!(Limit::Fraction(0.25).of(10), 2);
        assert_eq!(Limit::Batches(30).of(10), 10);
    }

    /// Before: `--fast-dev-run 1000000` said "1000000 batches" where 844
    /// ran, and `--overfit-batches 0.001` was refused as
    /// `--limit-train-batches: Fraction(0.001) ...`.
    #[test]
    fn descriptions_and_errors_say_what_ran_and_which_flag() {
        let dev = ShortRun {
            fast_dev_run: Some(1_000_000),
            train: Some(Limit::Batches(1_000_000)),
            val: Some(Limit::Batches(1_000_000)),
            test: Some(Limit::Batches(1_000_000)),
            overfit: false,
        };
        let line = dev
            .describe([Some(844), Some(94), None])
            .unwrap_or_default();
        assert!(
            line.contains("844 batches of train, val and test (--fast-dev-run 1000000;"),
            "{line}"
        );
        assert!(line.contains("train 844, all there are"), "{line}");
        assert!(!line.contains("1000000 batches"), "{line}");
        assert_eq!(dev.flag("test"), "--fast-dev-run");
        let overfit = ShortRun {
            train: Some(Limit::Fraction(0.001)),
            val: Some(Limit::Fraction(0.001)),
            overfit: true,
            ..ShortRun::default()
        };
        assert_eq!(overfit.flag("train"), "--overfit-batches");
        assert_eq!(overfit.flag("test"), "--limit-test-batches");
        let loader = redline_data::Loader::new(
            redline_data::Split {
                x: candle_core::Tensor::zeros(
                    (40, 2),
                    candle_core::DType::F32,
                    &candle_core::Device::Cpu,
                )
                .unwrap(),
                y: candle_core::Tensor::zeros(
                    40,
                    candle_core::DType::U32,
                    &candle_core::Device::Cpu,
                )
                .unwrap(),
                target: redline_data::TargetKind::Classes(2),
                source: "t".into(),
            },
            redline_data::LoaderConfig {
                batch_size: 4,
                shuffle: false,
                seed: 0,
                prefetch: 0,
                drop_last: false,
            },
        )
        .unwrap();
        let e = apply(&overfit.flag("train"), loader, overfit.train)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.starts_with("--overfit-batches 0.001: that fraction of 10"),
            "{e}"
        );
        assert!(!e.contains("Fraction("), "{e}");
    }
}

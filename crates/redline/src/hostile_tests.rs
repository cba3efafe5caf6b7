//! `redline train` against what a hostile user types: every numeric flag
//! with values from proptest (NaN, infinities, signed zeros, 1e±300,
//! `u64::MAX`, random bits), and `--config` files from the fuzz corpus
//! mutated (`redline_testkit::fuzz`). No input panics; a value outside a
//! flag's bounds is refused with an error naming the flag (or, for sizes that
//! would not fit in memory, saying how much they would need).
//!
//! Each case is a real run on `data/tables/wine.csv` (2 steps), in process.

use std::path::Path;

use clap::Parser;
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::cli::{Cli, Command};

/// `redline train` on the wine table with `extra` flags: Ok, or the error text.
fn train(extra: &[String]) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let wine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables/wine.csv");
    let run = tmp.path().join("run");
    let mut argv: Vec<String> = [
        "redline",
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--max-steps",
        "2",
        "--batch-size",
        "16",
        "--monitor-interval",
        "0",
        "--threads",
        "1",
    ]
    .map(String::from)
    .to_vec();
    argv.extend([
        "--data".into(),
        wine.display().to_string(),
        "--run-dir".into(),
        run.display().to_string(),
    ]);
    argv.extend(extra.iter().cloned());
    let cli = Cli::try_parse_from(&argv).map_err(|e| e.to_string())?;
    let Command::Train(args) = cli.command else {
        panic!("not train");
    };
    crate::train::run(&args).map_err(|e| format!("{e:#}"))
}

fn hostile_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            1e308,
            -1e308,
            5e-324,
            1.0,
            -1.0,
            0.5,
            0.999_999_999,
        ]),
        (-300i32..300).prop_map(|e| 10f64.powi(e)),
        (-300i32..300).prop_map(|e| -(10f64.powi(e))),
        any::<f64>(),
    ]
}

fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0u64,
            1,
            2,
            3,
            64,
            65,
            1024,
            1025,
            1 << 32,
            1 << 40,
            u64::MAX
        ]),
        0u64..100,
        any::<u64>(),
    ]
}

/// Runs the flag with `value`; `bound` says whether the value is in bounds;
/// out of bounds, the error must contain `names`' text.
fn check(flag: &str, value: String, extra: &[&str], in_bounds: bool, names: &str) {
    let mut flags: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    flags.push(format!("--{flag}={value}"));
    let got = train(&flags);
    if !in_bounds {
        let err = got.err().unwrap_or_default();
        assert!(
            err.contains(names),
            "--{flag}={value} is out of bounds: expected an error naming {names:?}, got {err:?}"
        );
    }
}

fn config() -> Config {
    Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn float_flags_are_bounded(v in hostile_f64()) {
        let finite = v.is_finite();
        check("lr", v.to_string(), &[], finite && v >= 0.0, "--lr");
        check("weight-decay", v.to_string(), &[], finite && v >= 0.0, "--weight-decay");
        check("beta1", v.to_string(), &[], (0.0..1.0).contains(&v), "beta");
        check("beta2", v.to_string(), &[], (0.0..1.0).contains(&v), "beta");
        check("eps", v.to_string(), &[], finite && v >= 0.0, "--eps");
        check("momentum", v.to_string(), &["--optimizer", "sgd"], finite && v >= 0.0, "--momentum");
        check("clip-grad-norm", v.to_string(), &[], finite && v > 0.0, "--clip-grad-norm");
        check("clip-grad-value", v.to_string(), &[], finite && v > 0.0, "--clip-grad-value");
        check(
            "divergence-threshold",
            v.to_string(),
            &[],
            v == 0.0 || (finite && v > 1.0),
            "--divergence-threshold",
        );
        check(
            "monitor-interval",
            v.to_string(),
            &[],
            (0.0..=86_400.0).contains(&v),
            "--monitor-interval",
        );
        check("val-split", v.to_string(), &[], (0.0..1.0).contains(&v), "--val-split");
        // FLOP/s of one device: 1e6 to 1e18, as a number or with a unit.
        check("peak-flops", v.to_string(), &[], (1e6..=1e18).contains(&v), "--peak-flops");
        check("peak-flops", format!("{v}T"), &[], (1e-6..=1e6).contains(&v), "--peak-flops");
        // The pixel normalisation is parsed as fp32: a scale that would make
        // the inputs infinite or meaningless is refused, whatever the data.
        let f = v as f32;
        check("mean", v.to_string(), &[], f.is_finite() && f.abs() <= 1e6, "--mean");
        check("std", v.to_string(), &[], f.is_finite() && (1e-6..=1e6).contains(&f), "--std");
    }

    #[test]
    fn integer_flags_are_bounded(v in hostile_u64()) {
        check("epochs", v.to_string(), &[], true, "");
        check("max-steps", v.to_string(), &[], v >= 1, "--max-steps");
        check("batch-size", v.to_string(), &[], v >= 1, "--batch-size");
        check("eval-batch-size", v.to_string(), &[], v >= 1, "--eval-batch-size");
        check("accumulate", v.to_string(), &[], v >= 1, "--accumulate");
        check("prefetch", v.to_string(), &[], v <= 64, "--prefetch");
        check("log-every", v.to_string(), &[], v >= 1, "--log-every");
        check("threads", v.to_string(), &[], (1..=1024).contains(&v), "--threads");
        check("seed", v.to_string(), &[], true, "");
        check("image-size", v.to_string(), &[], (1..=4096).contains(&v), "--image-size");
        // Wine has 3 classes. A class count or width that makes the model
        // larger than any memory says how large (between 2^20 and 2^34 it
        // depends on the machine's free memory: either is right).
        check("classes", v.to_string(), &[], (3..=1 << 34).contains(&v), if v < 3 { "--classes" } else { "GiB" });
        check("hidden", v.to_string(), &[], (1..=1 << 34).contains(&v), if v == 0 { "--hidden" } else { "GiB" });
    }
}

/// `redline train --config PATH`.
fn config_argv(path: &Path) -> Vec<std::ffi::OsString> {
    ["redline", "train", "--config"]
        .map(std::ffi::OsString::from)
        .into_iter()
        .chain([path.as_os_str().to_owned()])
        .collect()
}

#[test]
fn fuzz_config_files() {
    // A mutated run config is read, expanded and parsed, or refused: no panic.
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = tmp.path().join("config.toml");
    redline_testkit::fuzz::fuzz("config", |bytes| {
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
        let argv = config_argv(&path);
        if let Ok((argv, flags)) = crate::cli::expand_config(argv) {
            if let Err(e) = Cli::try_parse_from(argv) {
                let _ = crate::cli::config_key_of(&e, &flags);
            }
        }
    });
}

/// `--cpu-bf16-gemm`, on the command line or in a config file, takes only
/// auto, on or off: anything else is refused naming the flag (and, from a
/// file, its key), before any training. `on` runs only where the CPU has
/// AVX-512 BF16 and is refused by name elsewhere.
#[test]
fn a_bad_cpu_bf16_gemm_is_refused_by_name() {
    for v in ["maybe", "", "ON ", "1", "native", "\u{0}"] {
        let err = train(&[format!("--cpu-bf16-gemm={v}")])
            .err()
            .unwrap_or_default();
        assert!(err.contains("--cpu-bf16-gemm"), "{v:?}: {err}");
    }
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = tmp.path().join("config.toml");
    for body in ["cpu-bf16-gemm = \"maybe\"\n", "cpu-bf16-gemm = \"\"\n"] {
        std::fs::write(&path, body).unwrap_or_else(|e| panic!("{e}"));
        let argv = config_argv(&path);
        let (argv, flags) =
            crate::cli::expand_config(argv).unwrap_or_else(|e| panic!("{body:?}: {e:#}"));
        let Err(e) = Cli::try_parse_from(argv) else {
            panic!("{body:?} was accepted")
        };
        assert_eq!(
            crate::cli::config_key_of(&e, &flags).as_deref(),
            Some("cpu-bf16-gemm"),
            "{body:?}: {e}"
        );
    }
    // A non-string value is refused too, without a panic.
    std::fs::write(&path, "cpu-bf16-gemm = 3\n").unwrap_or_else(|e| panic!("{e}"));
    let argv = config_argv(&path);
    if let Ok((argv, _)) = crate::cli::expand_config(argv) {
        assert!(
            Cli::try_parse_from(argv).is_err(),
            "cpu-bf16-gemm = 3 was accepted"
        );
    }
    let on = train(&["--cpu-bf16-gemm=on".to_string()]);
    if redline_kernels::gemm_bf16::available() {
        assert!(on.is_ok(), "{on:?}");
    } else {
        let err = on.err().unwrap_or_default();
        assert!(err.contains("no AVX-512 BF16"), "{err}");
    }
}

/// `--gpu-conv` takes auto, redline or cudnn; `cudnn` is refused before any
/// training where it cannot run: in a build without CUDA (this one, in CI),
/// or where cuDNN does not load, saying which and what to do.
#[test]
fn gpu_conv_names_what_it_cannot_do() {
    for v in ["maybe", "", "CUDNN", "cublas"] {
        let err = train(&[format!("--gpu-conv={v}")])
            .err()
            .unwrap_or_default();
        assert!(err.contains("--gpu-conv"), "{v:?}: {err}");
    }
    for ok in ["auto", "redline"] {
        assert_eq!(train(&[format!("--gpu-conv={ok}")]), Ok(()), "{ok}");
    }
    let err = train(&["--gpu-conv=cudnn".into()])
        .err()
        .unwrap_or_default();
    if cfg!(feature = "cuda") {
        assert!(err.is_empty() || err.contains("cuDNN"), "{err}");
    } else {
        assert!(err.contains("no CUDA support"), "{err}");
    }
}

/// A config file that names another config or a run to resume, or a key
/// that is no flag, is refused by file and key. Before, `config = "x"` was
/// silently ignored, and an unknown key read as clap's "unexpected argument
/// '--bogus-key'" with a hint to pass that non-existent flag.
#[test]
fn config_files_hold_only_the_flags_of_train() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = tmp.path().join("config.toml");
    let expand = |body: &str| {
        std::fs::write(&path, body).unwrap_or_else(|e| panic!("{e}"));
        let argv = config_argv(&path);
        crate::cli::expand_config(argv).map_err(|e| format!("{e:#}"))
    };
    for (body, want) in [
        (
            "config = \"other.toml\"\n",
            "`config` cannot be set in a config file",
        ),
        (
            "resume = \"runs/x\"\n",
            "`resume` cannot be set in a config file",
        ),
        (
            "bogus-key = 3\n",
            "`bogus-key` is not a setting of `redline train`",
        ),
    ] {
        let err = expand(body).err().unwrap_or_default();
        assert!(
            err.contains(want) && err.contains("config.toml"),
            "{body:?}: {err}"
        );
    }
    assert!(expand("epochs = 2\nbatch-size = 8\nno-validate = true\n").is_ok());
}

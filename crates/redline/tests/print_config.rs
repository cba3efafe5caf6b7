//! `redline train --print-config` (issue 47): the resolved flags as TOML,
//! printed without reading data or making a run folder; `--config` on that
//! file runs the same job, to the same weights bit for bit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::root;

fn redline(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn ok(args: &[&str], cwd: &Path) -> String {
    let out = redline(args, cwd);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{args:?}\n{so}\n{se}");
    so
}

/// The job `flags` trained directly and through its printed config: the
/// same weights, byte for byte.
fn same_weights_through_the_printed_config(name: &str, flags: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let p = |f: &str| t.path().join(f).display().to_string();
    let mut base = vec!["train", "--device", "cpu", "--monitor-interval", "0"];
    base.extend_from_slice(flags);
    let printed = ok(&[&base[..], &["--print-config"]].concat(), &root());
    assert!(!printed.contains("loading"), "{name}: read data\n{printed}");
    assert!(!printed.contains("run-dir"), "{printed}");
    std::fs::write(p("printed.toml"), &printed).unwrap();
    // From another folder: the config's paths are absolute.
    ok(
        &[
            &base[..],
            &["--save", &p("a.safetensors"), "--run-dir", &p("ra")],
        ]
        .concat(),
        &root(),
    );
    let config = p("printed.toml");
    let again = [
        "train",
        "--config",
        &config,
        "--save",
        &p("b.safetensors"),
        "--run-dir",
        &p("rb"),
    ];
    ok(&again, t.path());
    assert!(
        common::same_tensors(
            std::path::Path::new(&p("a.safetensors")),
            std::path::Path::new(&p("b.safetensors"))
        ),
        "{name}: the printed config trained other weights\n{printed}"
    );
}

#[test]
fn a_printed_config_runs_the_same_job_bit_for_bit() {
    let wine = root().join("data/tables/wine.csv");
    let diabetes = root().join("data/tables/diabetes.csv");
    let model = root().join("examples/models/residual-mlp.toml");
    let (wine, diabetes, model) = (
        wine.to_str().unwrap(),
        diabetes.to_str().unwrap(),
        model.to_str().unwrap(),
    );
    // The zoo MLP on the default data (its path resolved in the config).
    same_weights_through_the_printed_config("mlp", &["--max-steps", "4"]);
    same_weights_through_the_printed_config(
        "model file",
        &[
            "--data",
            diabetes,
            "--model",
            model,
            "--max-steps",
            "6",
            "--batch-size",
            "16",
        ],
    );
    same_weights_through_the_printed_config(
        "csv regression",
        &[
            "--data",
            diabetes,
            "--max-steps",
            "6",
            "--batch-size",
            "16",
            "--seed",
            "3",
        ],
    );
    same_weights_through_the_printed_config(
        "lr schedule",
        &[
            "--data",
            wine,
            "--epochs",
            "2",
            "--lr-schedule",
            "cosine:warmup=2:interval=step",
        ],
    );
}

/// Values settled by measurement print as `auto`; nothing is made.
#[test]
fn measured_values_print_as_auto_and_nothing_is_made() {
    let t = tempfile::tempdir().unwrap();
    let printed = ok(
        &[
            "train",
            "--batch-size",
            "auto",
            "--lr",
            "auto",
            "--print-config",
        ],
        t.path(),
    );
    let table: toml::Table = toml::from_str(&printed).unwrap();
    assert_eq!(table["batch-size"].as_str(), Some("auto"), "{printed}");
    assert_eq!(table["lr"].as_str(), Some("auto"), "{printed}");
    assert_eq!(table["device"].as_str(), Some("auto"), "{printed}");
    assert!(
        table["data"]
            .as_str()
            .is_some_and(|d| d.ends_with("data/fashion-mnist")),
        "{printed}"
    );
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        0,
        "no runs/ made"
    );
}

//! Image folders and tar shards streamed from disk (issue 48): a streamed
//! split trains exactly as the same split decoded into memory; the ImageNet
//! recipe (random-resized crops, centre-cropped evaluation) runs end to end;
//! shards train like the folder they were made from; bad files and bad
//! flags are refused by name, or skipped and counted when asked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{fails, image_folder, json, step_losses, train_in};

fn cnn(data: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--model",
        "cnn",
        "--hidden",
        "16",
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--log-every",
        "1",
        "--threads",
        "1",
        "--data",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(data.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn train(run: &Path, flags: &[String]) -> String {
    let f: Vec<&str> = flags.iter().map(String::as_str).collect();
    train_in(run, &f)
}

#[test]
fn a_streamed_folder_trains_bit_for_bit_as_the_same_folder_in_memory() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 12);
    let (mem, disk) = (t.path().join("mem"), t.path().join("disk"));
    let out = train(
        &mem,
        &cnn(t.path(), &["--image-size", "16", "--stream", "off"]),
    );
    assert!(
        out.contains("decoded into memory once (--stream off"),
        "{out}"
    );
    assert!(out.contains("ImageNet's mean and std"), "{out}");
    let out = train(
        &disk,
        &cnn(
            t.path(),
            &["--image-size", "16", "--stream", "on", "--workers", "3"],
        ),
    );
    assert!(
        out.contains("streamed from disk") && out.contains("3 worker threads"),
        "{out}"
    );
    let (a, b) = (step_losses(&mem), step_losses(&disk));
    assert!(a.len() >= 8, "{a:?}");
    assert_eq!(a, b, "streamed and resident losses differ");
    let (sa, sb) = (
        json(&mem.join("summary.json")),
        json(&disk.join("summary.json")),
    );
    assert_eq!(sa["test_loss"], sb["test_loss"]);
    assert_eq!(sb["data_placement"], "streaming");
    assert_eq!(sb["data_workers"], 3);
    assert_eq!(sb["bad_samples_skipped"], 0);
    // What bounds the streamed run, from the workers' busy time; resident
    // data has no pipeline to measure.
    assert!(sa.get("data_pipeline").is_none(), "{sa}");
    let p = &sb["data_pipeline"];
    assert_eq!(p["workers"], 3);
    // At least every training sample of both epochs (validation and the
    // test pass decode too).
    let train = sb["samples"].as_u64().unwrap();
    assert!(p["images"].as_u64().unwrap() >= train, "{p}");
    let (rate, busy) = (
        p["images_per_s"].as_f64().unwrap(),
        p["workers_busy"].as_f64().unwrap(),
    );
    assert!(rate > 0.0 && busy > 0.0 && busy < 1.5, "{p}");
    let bound = if busy >= 0.9 { "data" } else { "model" };
    assert_eq!(p["bound"], bound, "{p}");
    let said = format!("the {bound} bounds this run");
    assert!(
        out.contains("data pipeline: 3 workers make") && out.contains(&said),
        "{out}"
    );
}

#[test]
fn the_imagenet_recipe_streams_crops_that_change_and_a_seed_repeats_them() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 8);
    let flags = cnn(
        t.path(),
        &[
            "--augment",
            "random-resized-crop=16,hflip",
            "--workers",
            "2",
        ],
    );
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let out = train(&a, &flags);
    assert!(
        out.contains("random-resized-cropped to 16 and flipped")
            && out.contains("auto: random-resized-crop=16"),
        "{out}"
    );
    train(&b, &flags);
    assert_eq!(step_losses(&a), step_losses(&b), "same seed, same crops");
    let mut other = flags.clone();
    other.extend(["--seed".to_string(), "9".to_string()]);
    let c = t.path().join("c");
    train(&c, &other);
    assert_ne!(step_losses(&a), step_losses(&c));
}

#[test]
fn shards_by_folder_or_pattern_train_and_bad_shards_are_named() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 6);
    let out = t.path().join("shards");
    let made = common::shards(t.path(), &out, 7);
    assert_eq!(made.len(), 3);
    let run = t.path().join("run");
    let text = train(&run, &cnn(&out, &["--image-size", "16", "--stream", "on"]));
    assert!(
        text.contains("tar shards: 18 training samples in 3 shards, 3 classes"),
        "{text}"
    );
    let pattern = out.join("train-{0000..0001}.tar");
    let run2 = t.path().join("run2");
    let text = train(
        &run2,
        &cnn(&pattern, &["--image-size", "16", "--epochs", "1"]),
    );
    assert!(
        text.contains("tar shards: 14 training samples in 2 shards"),
        "{text}"
    );
    let missing = out.join("train-{0000..0007}.tar");
    let m = fails(&[
        "train",
        "--device",
        "cpu",
        "--data",
        missing.to_str().unwrap(),
    ]);
    assert!(
        m.contains("train-0003.tar") && m.contains("no such file"),
        "{m}"
    );
    // A shard cut short is named, and training does not start.
    let bytes = std::fs::read(&made[1]).unwrap();
    // (GNU tar pads to 10 KiB records: a cut into the padding loses nothing.)
    std::fs::write(&made[1], &bytes[..bytes.len() / 2]).unwrap();
    let m = fails(&["train", "--device", "cpu", "--data", out.to_str().unwrap()]);
    assert!(
        m.contains("train-0001.tar") && m.contains("truncated"),
        "{m}"
    );
}

#[test]
fn a_corrupt_image_stops_the_run_by_name_or_is_skipped_and_counted() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 6);
    std::fs::write(
        t.path().join("train/class1/bad.jpg"),
        b"\xff\xd8\xffnot a jpeg",
    )
    .unwrap();
    let d = t.path().to_str().unwrap();
    let m = fails(&[
        "train",
        "--device",
        "cpu",
        "--model",
        "cnn",
        "--data",
        d,
        "--image-size",
        "16",
        "--stream",
        "on",
        "--max-steps",
        "4",
    ]);
    assert!(
        m.contains("bad.jpg") && m.contains("--bad-samples skip"),
        "{m}"
    );
    let run = t.path().join("run");
    let text = train(
        &run,
        &cnn(
            t.path(),
            &[
                "--image-size",
                "16",
                "--stream",
                "on",
                "--bad-samples",
                "skip",
                "--val-split",
                "0",
            ],
        ),
    );
    // Two epochs each read the bad file once.
    assert!(
        text.contains("data: 2 undecodable images skipped"),
        "{text}"
    );
    assert_eq!(json(&run.join("summary.json"))["bad_samples_skipped"], 2);
}

#[test]
fn bad_streaming_flags_are_refused_with_the_fix() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 3);
    let d = t.path().to_str().unwrap();
    let base = ["train", "--device", "cpu", "--model", "cnn", "--data", d];
    for (flags, want) in [
        (vec!["--workers", "0"], "--workers 0: give 1 to"),
        (vec!["--stream", "sometimes"], "expected auto, on or off"),
        (
            vec!["--host-memory-budget", "lots"],
            "give a size such as 64GB",
        ),
        (vec!["--host-memory-budget", "150%"], "from 0% to 100%"),
        (
            vec!["--augment", "random-resized-crop=0"],
            "give the output side",
        ),
        (
            vec!["--augment", "random-resized-crop=16,crop=4"],
            "give only hflip",
        ),
        (
            vec!["--augment", "random-resized-crop=16", "--stream", "off"],
            "cannot be combined with --stream off",
        ),
        (
            vec!["--bad-samples", "ignore"],
            "possible values: error, skip",
        ),
    ] {
        let mut a = base.to_vec();
        a.extend(flags.iter());
        let m = fails(&a);
        assert!(m.contains(want), "{flags:?}: {m}");
    }
    // A budget smaller than the data streams it, and says why.
    let run = t.path().join("run");
    let out = train(
        &run,
        &cnn(
            t.path(),
            &[
                "--image-size",
                "16",
                "--host-memory-budget",
                "1KB",
                "--epochs",
                "1",
            ],
        ),
    );
    assert!(out.contains("more than the host-memory budget"), "{out}");
}

#[test]
fn pack_writes_shards_that_train_and_refuses_what_it_would_overwrite() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 6);
    let src = t.path().to_str().unwrap();
    let dest = t.path().join("packed");
    let d = dest.to_str().unwrap();
    let out = common::ok(&["pack", src, d, "--max-side", "24", "--workers", "2"]);
    assert!(
        out.contains("train: 18 images in 1 shard, val: 6 images in 1 shard")
            && out.contains("redline train --data"),
        "{out}"
    );
    assert!(dest.join("train/train-000000.tar").is_file() && dest.join("index.json").is_file());
    let run = t.path().join("run");
    let text = train(&run, &cnn(&dest, &["--image-size", "16", "--epochs", "1"]));
    assert!(
        text.contains("classes (index.json of `redline pack`): class0, class1, class2")
            && text.contains("18 training samples in 1 shard"),
        "{text}"
    );
    // Nothing is ever written over.
    let m = fails(&["pack", src, d]);
    assert!(m.contains("already exists (a folder)"), "{m}");
    let m = fails(&["pack", src, "/dev/null"]);
    assert!(m.contains("a device, pipe or socket"), "{m}");
    for (flag, value, want) in [
        ("--quality", "0", "quality from 1 to 100"),
        ("--shard-size", "1KB", "at least 1MB"),
        ("--shard-size", "big", "give a size such as"),
        ("--max-side", "0", "16 to 16384"),
        ("--workers", "0", "1 to 1024"),
    ] {
        let m = fails(&[
            "pack",
            src,
            t.path().join("x").to_str().unwrap(),
            flag,
            value,
        ]);
        assert!(m.contains(want), "{flag} {value}: {m}");
    }
    let none = t.path().join("none");
    let m = fails(&[
        "pack",
        t.path().join("train/class0/0.jpg").to_str().unwrap(),
        none.to_str().unwrap(),
    ]);
    assert!(m.contains("is not an image folder"), "{m}");
}

#[test]
fn mean_and_std_take_one_value_or_one_per_channel() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 6);
    let runs: Vec<_> = ["default", "listed", "scalar"]
        .iter()
        .map(|n| t.path().join(n))
        .collect();
    let base = ["--image-size", "16", "--epochs", "1"];
    train(&runs[0], &cnn(t.path(), &base));
    let mut listed = base.to_vec();
    listed.extend(["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]);
    let out = train(&runs[1], &cnn(t.path(), &listed));
    assert!(!out.contains("ImageNet's mean and std"), "{out}");
    // ImageNet's values given by hand are the default's, channel by channel.
    assert_eq!(step_losses(&runs[0]), step_losses(&runs[1]));
    let config = std::fs::read_to_string(runs[1].join("config.toml")).unwrap();
    assert!(config.contains("mean = [0.485, 0.456, 0.406]"), "{config}");
    let mut scalar = base.to_vec();
    scalar.extend(["--mean", "0.5", "--std", "0.5"]);
    train(&runs[2], &cnn(t.path(), &scalar));
    assert_ne!(step_losses(&runs[0]), step_losses(&runs[2]));
    // The recorded config runs the same job again.
    let again = t.path().join("again");
    let cfg = runs[1].join("config.toml");
    train_in(&again, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(step_losses(&runs[1]), step_losses(&again));
    for (flags, want) in [
        (
            vec!["--mean", "0.1,0.2"],
            "give one number (every channel) or three",
        ),
        (vec!["--std", "0.2,0,0.2"], "--std 0"),
        (
            vec!["--data", "data/tables/digits.npz", "--mean", "0.1,0.2,0.3"],
            "apply to image folders and tar shards",
        ),
    ] {
        let mut a = vec![
            "train",
            "--device",
            "cpu",
            "--data",
            t.path().to_str().unwrap(),
        ];
        a.extend(flags.iter());
        let m = fails(&a);
        assert!(m.contains(want), "{flags:?}: {m}");
    }
}

/// `--shuffle-buffer`: shards read shard by shard through a buffer (the
/// startup line says so, and why); another order than the full
/// permutation, repeated by its seed; the default on shards that fit the
/// budget is the full permutation, and says so.
#[test]
fn a_shuffle_buffer_reads_shards_in_webdatasets_order() {
    let t = tempfile::tempdir().unwrap();
    image_folder(t.path(), 8);
    let out = t.path().join("shards");
    common::shards(t.path(), &out, 6);
    let run = |name: &str, extra: &[&str]| {
        let dir = t.path().join(name);
        let mut f = vec!["--image-size", "16", "--stream", "on", "--epochs", "1"];
        f.extend_from_slice(extra);
        let text = train(&dir, &cnn(&out, &f));
        (text, step_losses(&dir))
    };
    let (text, full) = run("full", &[]);
    assert!(
        text.contains("shuffle: a full permutation") && text.contains("fit the host-memory budget"),
        "{text}"
    );
    let (text, buffered) = run("buffered", &["--shuffle-buffer", "4"]);
    assert!(
        text.contains("shuffle: shard order each epoch, then a buffer of 4 samples"),
        "{text}"
    );
    assert_ne!(full, buffered);
    let (_, again) = run("again", &["--shuffle-buffer", "4"]);
    assert_eq!(buffered, again);
    // A budget below the shards' size turns the buffer on by default.
    let (text, _) = run("small-budget", &["--host-memory-budget", "1KB"]);
    assert!(
        text.contains("buffer of 4096 samples") && text.contains("exceed the host-memory budget"),
        "{text}"
    );
}

//! `--data PATH` end to end: every shipped format detected, read, split and
//! fed through both loader placements, and the clear errors for bad files.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use redline_data::{
    DataOptions, Dataset, HostData, Loader, LoaderConfig, Placement, Split, TargetKind, Targets,
    Task,
};

/// The splits of `--data` in host memory, as these tests inspect them.
struct Resident {
    format: redline_data::Format,
    train: HostData,
    val: Option<HostData>,
    test: Option<HostData>,
    #[allow(dead_code)]
    notes: Vec<String>,
}

/// [`redline_data::prepare`], every split decoded into host memory.
fn prepare(path: &Path, opts: &DataOptions) -> redline_data::Result<Resident> {
    let p = redline_data::prepare(path, opts)?;
    Ok(Resident {
        format: p.format,
        train: p.train.into_host()?,
        val: p.val.map(|v| v.into_host()).transpose()?,
        test: p.test.map(|t| t.into_host()).transpose()?,
        notes: p.notes,
    })
}

fn tables() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables")
}

fn err(r: redline_data::Result<Resident>) -> String {
    r.err().map(|e| format!("{e:#}")).unwrap_or_default()
}

#[test]
fn wine_csv_is_a_standardised_three_class_table_with_a_holdout() {
    let p = prepare(&tables().join("wine.csv"), &DataOptions::default()).unwrap();
    assert_eq!(p.format.id(), "csv");
    assert_eq!(p.train.target, TargetKind::Classes(3));
    assert_eq!(p.train.input_dims, vec![13]);
    let val = p.val.as_ref().unwrap();
    assert_eq!(
        (p.train.len(), val.len(), p.test.is_none()),
        (160, 18, true)
    );
    // Each feature of the training rows now has mean 0 and std 1.
    for c in 0..13 {
        let col: Vec<f64> = p
            .train
            .x
            .iter()
            .skip(c)
            .step_by(13)
            .map(|&v| v as f64)
            .collect();
        let mean = col.iter().sum::<f64>() / col.len() as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
            "column {c}: {mean} {var}"
        );
    }
    assert!(p
        .notes
        .iter()
        .any(|n| n.contains("task: classification, 3 classes")));
    // The same seed holds out the same rows; another seed other rows.
    let again = prepare(&tables().join("wine.csv"), &DataOptions::default()).unwrap();
    assert_eq!(again.val.unwrap().y, val.y);
    let other = DataOptions {
        seed: 1,
        standardize: false,
        ..Default::default()
    };
    let moved = prepare(&tables().join("wine.csv"), &other).unwrap();
    assert_ne!(moved.val.unwrap().x, val.x);
    // Raw first row of the file: alcohol 14.23 ... proline 1065, cultivar 0.
    assert_eq!(moved.train.x[0], 14.23);
}

#[test]
fn diabetes_csv_is_regression_and_the_task_and_target_can_be_chosen() {
    let path = tables().join("diabetes.csv");
    let p = prepare(&path, &DataOptions::default()).unwrap();
    assert_eq!(p.train.target, TargetKind::Values(1));
    assert_eq!(p.train.len() + p.val.as_ref().unwrap().len(), 442);
    let Targets::Values(y) = &p.train.y else {
        panic!("float targets expected")
    };
    assert_eq!(y[0], 151.0, "the first patient's progression");
    // `sex` (1 or 2) as a two-class target: ids must start at 0, so 3 classes.
    let opts = DataOptions {
        target: "sex".parse().unwrap(),
        task: Task::Classification,
        val_split: Some(0.0),
        ..Default::default()
    };
    let p = prepare(&path, &opts).unwrap();
    assert_eq!(p.train.target, TargetKind::Classes(3));
    assert!(p.val.is_none(), "--val-split 0 turns validation off");
    let bad = DataOptions {
        target: "bmi".parse().unwrap(),
        task: Task::Classification,
        ..Default::default()
    };
    assert!(
        err(prepare(&path, &bad)).contains("target `bmi` holds values that are not whole numbers")
    );
    let bad = DataOptions {
        val_split: Some(1.0),
        ..Default::default()
    };
    assert!(err(prepare(&path, &bad)).contains("fraction in [0, 1)"));
}

#[test]
fn digits_npz_has_a_test_split_and_keeps_float_pixels() {
    let held = prepare(&tables().join("digits.npz"), &DataOptions::default()).unwrap();
    let whole = DataOptions {
        val_split: Some(0.0),
        ..Default::default()
    };
    let p = prepare(&tables().join("digits.npz"), &whole).unwrap();
    assert!(p.val.is_none(), "--val-split 0: no validation");
    assert_eq!((p.train.len(), p.test.as_ref().unwrap().len()), (1500, 297));
    assert_eq!(p.format.id(), "arrays");
    assert_eq!(p.train.input_dims, vec![1, 8, 8]);
    assert_eq!(p.train.target, TargetKind::Classes(10));
    // Validation is held out of the training split (10%), never the test split.
    let val = held.val.as_ref().unwrap();
    assert_eq!(
        (
            held.train.len(),
            val.len(),
            held.test.as_ref().unwrap().len()
        ),
        (1350, 150, 297)
    );
    // Stratified: each class gives its share of the 150, within one.
    let count = |d: &redline_data::HostData, c: u32| match &d.y {
        redline_data::Targets::Classes(ids) => ids.iter().filter(|&&i| i == c).count(),
        redline_data::Targets::Values(_) => 0,
    };
    for c in 0..10 {
        let (v, t) = (count(val, c) as f64, count(&held.train, c) as f64);
        assert!(
            (v - (v + t) * 0.1).abs() <= 1.0,
            "class {c}: {v} of {}",
            v + t
        );
    }
    // scikit-learn's digits.images[0][0] / 16: 0 0 5 13 9 1 0 0.
    let want: Vec<f32> = [0., 0., 5., 13., 9., 1., 0., 0.]
        .iter()
        .map(|v| v / 16.0)
        .collect();
    assert_eq!(&p.train.x[..8], &want[..]);
    let Targets::Classes(labels) = &p.train.y else {
        panic!("class ids expected")
    };
    assert_eq!(&labels[..5], &[0, 1, 2, 3, 4]);
}

/// Batches of a loader, as host vectors of inputs and targets.
fn batches(l: &Loader, epoch: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    l.epoch(epoch)
        .map(|b| {
            let b = b.unwrap();
            let y = b.y.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
            (
                b.x.flatten_all().unwrap().to_vec1().unwrap(),
                y.to_vec1().unwrap(),
            )
        })
        .collect()
}

#[test]
fn npy_folders_and_safetensors_with_vector_targets_feed_both_placements() {
    let dir = tempfile::tempdir().unwrap();
    let x = Tensor::arange(0f32, 30., &Device::Cpu)
        .unwrap()
        .reshape((10, 3))
        .unwrap();
    let y = (x.narrow(1, 0, 2).unwrap() * -1.0).unwrap();
    let npy = dir.path().join("arrays");
    std::fs::create_dir(&npy).unwrap();
    x.write_npy(npy.join("x.npy")).unwrap();
    y.write_npy(npy.join("y.npy")).unwrap();
    let st = dir.path().join("d.safetensors");
    candle_core::safetensors::save(
        &[("x".to_string(), x.clone()), ("y".to_string(), y.clone())]
            .into_iter()
            .collect(),
        &st,
    )
    .unwrap();
    let opts = DataOptions {
        val_split: Some(0.0),
        ..Default::default()
    };
    for path in [npy, st] {
        let p = prepare(&path, &opts).unwrap();
        assert_eq!(p.train.target, TargetKind::Values(2), "{}", path.display());
        assert_eq!(p.train.input_dims, vec![3]);
        let cfg = LoaderConfig {
            batch_size: 4,
            shuffle: true,
            seed: 5,
            prefetch: 1,
            drop_last: false,
        };
        let dev = Device::Cpu;
        let resident =
            Loader::placed_host(p.train.clone(), &dev, Placement::Resident, cfg.clone()).unwrap();
        let streaming =
            Loader::placed_host(p.train.clone(), &dev, Placement::Streaming, cfg).unwrap();
        let (r, s) = (batches(&resident, 1), batches(&streaming, 1));
        assert_eq!(r.len(), 3);
        assert_eq!(r, s);
        // Every target row is minus the first two inputs of its sample.
        for (xs, ys) in &r {
            for (xr, yr) in xs.chunks(3).zip(ys.chunks(2)) {
                assert_eq!(yr, &[-xr[0], -xr[1]]);
            }
        }
        let b = resident.epoch(0).next().unwrap().unwrap();
        assert_eq!(b.y.dims(), &[4, 2]);
    }
}

#[test]
fn cifar10_binary_folder_reads_all_five_batches_and_the_test_file() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("cifar-10-batches-bin");
    std::fs::create_dir(&bin).unwrap();
    let record = |label: u8, px: u8| {
        let mut r = vec![label];
        r.extend(std::iter::repeat_n(px, 3072));
        r
    };
    for b in 1..=5u8 {
        let mut bytes = record(b, 0);
        bytes.extend(record(9, 255));
        std::fs::write(bin.join(format!("data_batch_{b}.bin")), bytes).unwrap();
    }
    std::fs::write(bin.join("test_batch.bin"), record(3, 51)).unwrap();
    let whole = DataOptions {
        val_split: Some(0.0),
        ..Default::default()
    };
    let p = prepare(dir.path(), &whole).unwrap();
    assert_eq!(p.format.to_string(), "CIFAR-10");
    assert_eq!(
        (p.train.len(), p.train.input_dims.clone()),
        (10, vec![3, 32, 32])
    );
    assert_eq!(p.train.target, TargetKind::Classes(10));
    assert_eq!(
        p.train.y,
        Targets::Classes(vec![1, 9, 2, 9, 3, 9, 4, 9, 5, 9])
    );
    assert_eq!((p.train.x[0], p.train.x[3072]), (-1.0, 1.0));
    let test = p.test.unwrap();
    assert_eq!(test.x[0], (51.0 / 255.0 - 0.5) / 0.5);
    let split = Split::from_host(&test, &Device::Cpu).unwrap();
    assert_eq!(split.x.dims(), &[1, 3, 32, 32]);
    // A regression task on class ids is refused with the reason.
    let reg = DataOptions {
        task: Task::Regression,
        ..Default::default()
    };
    assert!(err(prepare(dir.path(), &reg)).contains("labels are class ids"));
}

#[test]
fn unreadable_data_names_the_file_and_what_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = err(prepare(&d.join("missing.csv"), &DataOptions::default()));
    assert!(
        m.contains("missing.csv") && m.contains("no such file"),
        "{m}"
    );
    std::fs::write(d.join("x.parquet"), b"PAR1").unwrap();
    let m = err(prepare(&d.join("x.parquet"), &DataOptions::default()));
    assert!(m.contains("unknown data file type"), "{m}");
    let m = err(prepare(d, &DataOptions::default()));
    assert!(m.contains("no data set recognised in this folder"), "{m}");
    // An .npy whose header promises more than the file holds is refused
    // before anything is allocated from the header.
    let x = Tensor::zeros((4, 2), DType::F32, &Device::Cpu).unwrap();
    x.write_npy(d.join("x.npy")).unwrap();
    x.write_npy(d.join("y.npy")).unwrap();
    let mut bytes = std::fs::read(d.join("x.npy")).unwrap();
    // The shape's first dimension, 4, becomes 9 (same header length).
    let at = bytes.windows(2).position(|w| w == b"(4").unwrap();
    bytes[at + 1] = b'9';
    std::fs::write(d.join("x.npy"), bytes).unwrap();
    let m = err(prepare(d, &DataOptions::default()));
    assert!(m.contains("declares shape [9, 2] (72 bytes)"), "{m}");
    // Arrays with other names list what was found.
    let st = d.join("w.safetensors");
    candle_core::safetensors::save(&[("weight".to_string(), x)].into_iter().collect(), &st)
        .unwrap();
    let m = err(prepare(&st, &DataOptions::default()));
    assert!(m.contains("found arrays [\"weight\"]"), "{m}");
}

#[test]
fn a_custom_dataset_streams_through_the_loader() {
    /// Sample i is (i, 2i) with target i mod 3, made on demand.
    struct Made(PathBuf);
    impl Dataset for Made {
        fn len(&self) -> usize {
            7
        }
        fn input_dims(&self) -> &[usize] {
            &[2]
        }
        fn target(&self) -> TargetKind {
            TargetKind::Classes(3)
        }
        fn gather(
            &self,
            idx: &[u32],
            x: &mut [f32],
            y: redline_data::TargetsMut<'_>,
        ) -> redline_data::Result<()> {
            let redline_data::TargetsMut::Classes(y) = y else {
                return Err(redline_data::Error::Config("class targets".into()));
            };
            for (k, &i) in idx.iter().enumerate() {
                x[2 * k] = i as f32;
                x[2 * k + 1] = 2.0 * i as f32;
                y[k] = i % 3;
            }
            Ok(())
        }
        fn source(&self) -> &Path {
            &self.0
        }
    }
    let cfg = LoaderConfig {
        batch_size: 3,
        shuffle: false,
        seed: 0,
        prefetch: 2,
        drop_last: false,
    };
    let l = Loader::from_dataset(Arc::new(Made("made".into())), &Device::Cpu, cfg).unwrap();
    let got = batches(&l, 0);
    assert_eq!(got.len(), 3);
    assert_eq!(got[2], (vec![6.0, 12.0], vec![0.0]));
    let whole: HostData = Split::from_dataset(&Made("m".into()), &Device::Cpu)
        .unwrap()
        .to_host()
        .unwrap();
    assert_eq!(whole.y, Targets::Classes(vec![0, 1, 2, 0, 1, 2, 0]));
}

/// Writes the first `n` Fashion-MNIST test images as PNG files under
/// `dir/<split>/<class name>/`, returning them as read from the IDX file.
fn fashion_pngs(dir: &Path, split: &str, skip: usize, n: usize) -> HostData {
    let names = [
        "0-tshirt",
        "1-trouser",
        "2-pullover",
        "3-dress",
        "4-coat",
        "5-sandal",
        "6-shirt",
        "7-sneaker",
        "8-bag",
        "9-boot",
    ];
    let fm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let raw = redline_data::Normalize {
        mean: 0.0,
        std: 1.0 / 255.0,
    };
    let all = redline_data::mnist::load(&fm, redline_data::SplitKind::Test, Some(10), raw).unwrap();
    let idx: Vec<u32> = (skip as u32..(skip + n) as u32).collect();
    let part = all.subset(&idx).unwrap();
    let Targets::Classes(labels) = &part.y else {
        panic!()
    };
    for (k, &l) in labels.iter().enumerate() {
        let px: Vec<u8> = part.x[k * 784..(k + 1) * 784]
            .iter()
            .map(|&v| v.round() as u8)
            .collect();
        let d = dir.join(split).join(names[l as usize]);
        std::fs::create_dir_all(&d).unwrap();
        image::GrayImage::from_raw(28, 28, px)
            .unwrap()
            .save(d.join(format!("{k:04}.png")))
            .unwrap();
    }
    part
}

#[test]
fn an_image_folder_of_real_pngs_reads_back_the_idx_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let want = fashion_pngs(dir.path(), "train", 0, 120);
    fashion_pngs(dir.path(), "test", 120, 30);
    let opts = DataOptions {
        norm: redline_data::Normalize {
            mean: 0.0,
            std: 1.0 / 255.0,
        },
        val_split: Some(0.0),
        ..Default::default()
    };
    let held = prepare(
        dir.path(),
        &DataOptions {
            val_split: None,
            ..opts.clone()
        },
    )
    .unwrap();
    assert_eq!(
        (held.train.len(), held.val.as_ref().map(|v| v.len())),
        (108, Some(12))
    );
    let p = prepare(dir.path(), &opts).unwrap();
    assert_eq!(p.format.id(), "images");
    assert_eq!(p.train.input_dims, vec![1, 28, 28]);
    assert_eq!(p.train.target, TargetKind::Classes(10));
    assert_eq!(p.test.as_ref().unwrap().len(), 30);
    // Files are read class by class: compare each image with its IDX original
    // through its label and position within the class.
    let (Targets::Classes(got), Targets::Classes(orig)) = (&p.train.y, &want.y) else {
        panic!()
    };
    for class in 0..10u32 {
        let mine: Vec<usize> = (0..got.len()).filter(|&i| got[i] == class).collect();
        let theirs: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] == class).collect();
        assert_eq!(mine.len(), theirs.len(), "class {class}");
        for (&a, &b) in mine.iter().zip(&theirs) {
            assert_eq!(
                p.train.x[a * 784..(a + 1) * 784],
                want.x[b * 784..(b + 1) * 784]
            );
        }
    }
    // Resized on request.
    let small = DataOptions {
        image_size: Some(14),
        ..Default::default()
    };
    assert_eq!(
        prepare(dir.path(), &small).unwrap().train.input_dims,
        vec![1, 14, 14]
    );
}

#[test]
fn test_images_of_another_size_are_refused_before_training() {
    use redline_data::idx::encode;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, dims: &[usize]| {
        let n: usize = dims.iter().product();
        std::fs::write(d.join(name), encode(dims, &vec![1u8; n])).unwrap();
    };
    write("train-images-idx3-ubyte", &[4, 28, 28]);
    write("train-labels-idx1-ubyte", &[4]);
    write("t10k-images-idx3-ubyte", &[2, 32, 32]);
    write("t10k-labels-idx1-ubyte", &[2]);
    let m = err(prepare(d, &DataOptions::default()));
    // The file at fault, not its labels file or the folder.
    assert!(
        m.contains("t10k-images-idx3-ubyte: the test samples"),
        "{m}"
    );
    assert!(
        m.contains("the test samples are [1, 32, 32] but the training samples are [1, 28, 28]"),
        "{m}"
    );
}

#[test]
fn a_data_path_that_cannot_be_read_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A loop of symbolic links.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(d.join("b"), d.join("a")).unwrap();
        std::os::unix::fs::symlink(d.join("a"), d.join("b")).unwrap();
        let m = err(prepare(&d.join("a"), &DataOptions::default()));
        assert!(m.contains("loop of symbolic links"), "{m}");
        assert!(!m.contains("no such file"), "{m}");
    }
    // One file of the shipped Fashion-MNIST folder: the folder is meant.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let m = err(prepare(
        &data.join("train-images-idx3-ubyte.gz"),
        &DataOptions::default(),
    ));
    assert!(m.contains("--data takes the folder that holds it"), "{m}");
}

#[test]
fn classes_given_on_the_command_line_shape_the_targets() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    let opts = DataOptions {
        classes: Some(20),
        ..DataOptions::default()
    };
    let p = prepare(&data, &opts).unwrap();
    assert_eq!(p.train.target, TargetKind::Classes(20));
    assert_eq!(p.test.unwrap().target, TargetKind::Classes(20));
    // Fewer classes than the labels hold is refused with the label named.
    let opts = DataOptions {
        classes: Some(5),
        ..DataOptions::default()
    };
    let m = err(prepare(&data, &opts));
    assert!(m.contains("label") || m.contains("class"), "{m}");
}

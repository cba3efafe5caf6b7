//! The Fashion-MNIST shipped in `data/` is the real, intact dataset.

// Tests may panic on unexpected values: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use candle_core::Device;
use redline_data::{idx, Normalize, Split, SplitKind};
use sha2::{Digest, Sha256};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist")
}

#[test]
fn files_match_the_recorded_sha256() {
    let expected = [
        (
            "train-images-idx3-ubyte.gz",
            "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
        ),
        (
            "train-labels-idx1-ubyte.gz",
            "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        ),
    ];
    for (name, sha) in expected {
        let bytes = std::fs::read(data_dir().join(name)).unwrap();
        let got: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, sha, "{name}");
    }
}

#[test]
fn splits_load_balanced_and_normalised() {
    for (kind, n) in [(SplitKind::Train, 60_000), (SplitKind::Test, 10_000)] {
        let s = Split::load(&data_dir(), kind, 10, Normalize::default(), &Device::Cpu).unwrap();
        assert_eq!(s.x.dims(), &[n, 1, 28, 28]);
        let labels = s.y.to_vec1::<u32>().unwrap();
        for class in 0..10 {
            // Fashion-MNIST is balanced: 6000 / 1000 images per class.
            assert_eq!(labels.iter().filter(|&&l| l == class).count(), n / 10);
        }
        let min = s.x.min_all().unwrap().to_scalar::<f32>().unwrap();
        let max = s.x.max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!((min, max), (-1.0, 1.0));
    }
}

#[test]
fn first_label_is_the_known_ankle_boot() {
    // The first training image of Fashion-MNIST is an ankle boot (class 9).
    let labels = idx::read(&data_dir().join("train-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!(labels.dims, vec![60_000]);
    assert_eq!(labels.data[0], 9);
}

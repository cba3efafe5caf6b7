//! CIFAR-10 and CIFAR-100 in their binary format (`cifar-10-batches-bin`,
//! `cifar-100-binary`).
//!
//! A record is the label byte(s) then 3072 pixel bytes: 1024 red, 1024 green,
//! 1024 blue, each 32x32 row-major. CIFAR-10 has one label byte (10 classes)
//! and five training files plus `test_batch.bin`; CIFAR-100 has a coarse and
//! a fine label byte (the fine one, 100 classes, is used) in `train.bin` and
//! `test.bin`.

use std::path::{Path, PathBuf};

use crate::dataset::{HostData, TargetKind, Targets};
use crate::error::{Error, Result};
use crate::mnist::{check_norm, normalise, Normalize, SplitKind};

/// Pixel bytes per image: 3 channels of 32x32.
pub const IMAGE_BYTES: usize = 3 * 32 * 32;

/// Which CIFAR a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// 10 classes, one label byte.
    Cifar10,
    /// 100 fine classes, a coarse and a fine label byte.
    Cifar100,
}

impl Variant {
    /// Label bytes before each image.
    fn label_bytes(self) -> usize {
        match self {
            Self::Cifar10 => 1,
            Self::Cifar100 => 2,
        }
    }

    /// Classes of the (fine) label.
    pub fn classes(self) -> usize {
        match self {
            Self::Cifar10 => 10,
            Self::Cifar100 => 100,
        }
    }

    fn files(self, kind: SplitKind) -> Vec<&'static str> {
        match (self, kind) {
            (Self::Cifar10, SplitKind::Train) => vec![
                "data_batch_1.bin",
                "data_batch_2.bin",
                "data_batch_3.bin",
                "data_batch_4.bin",
                "data_batch_5.bin",
            ],
            (Self::Cifar10, SplitKind::Test) => vec!["test_batch.bin"],
            (Self::Cifar100, SplitKind::Train) => vec!["train.bin"],
            (Self::Cifar100, SplitKind::Test) => vec!["test.bin"],
        }
    }
}

/// The CIFAR variant in `dir` (or in its `cifar-10-batches-bin` /
/// `cifar-100-binary` sub-folder), with the folder that holds the files.
pub fn detect(dir: &Path) -> Option<(Variant, PathBuf)> {
    let candidates = [
        dir.to_path_buf(),
        dir.join("cifar-10-batches-bin"),
        dir.join("cifar-100-binary"),
    ];
    candidates.into_iter().find_map(|d| {
        if d.join("data_batch_1.bin").is_file() {
            Some((Variant::Cifar10, d))
        } else if d.join("train.bin").is_file() && d.join("test.bin").is_file() {
            Some((Variant::Cifar100, d))
        } else {
            None
        }
    })
}

/// Decodes one file's records, appending pixels and labels.
fn decode(
    path: &Path,
    bytes: &[u8],
    variant: Variant,
    pixels: &mut Vec<u8>,
    labels: &mut Vec<u32>,
) -> Result<()> {
    let lb = variant.label_bytes();
    let record = lb + IMAGE_BYTES;
    let invalid = |msg: String| Error::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(invalid(format!(
            "{} bytes is not a whole number of {record}-byte {variant:?} records \
             (truncated, or not the binary version?)\nHINT: download the binary version \
             (cifar-10-binary.tar.gz / cifar-100-binary.tar.gz) and extract it",
            bytes.len()
        )));
    }
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        // CIFAR-100: byte 0 is the coarse label, byte 1 the fine one.
        let label = r[lb - 1];
        if label as usize >= variant.classes() {
            return Err(invalid(format!(
                "record {i}: label {label} is >= {} classes (is this {variant:?}?)",
                variant.classes()
            )));
        }
        labels.push(label as u32);
        pixels.extend_from_slice(&r[lb..]);
    }
    Ok(())
}

/// Reads one split of a CIFAR folder as normalised `(3, 32, 32)` images.
pub fn load(dir: &Path, variant: Variant, kind: SplitKind, norm: Normalize) -> Result<HostData> {
    check_norm(norm)?;
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for name in variant.files(kind) {
        let path = dir.join(name);
        // A regular file of at most 1 GiB (a CIFAR batch is 30 MB).
        let bytes =
            redline_core::files::read_input(&path, 1 << 30).map_err(|source| Error::Io {
                path: path.clone(),
                source,
                hint: format!(
                    "a {variant:?} folder holds {} (the binary version)",
                    variant.files(kind).join(", ")
                ),
            })?;
        decode(&path, &bytes, variant, &mut pixels, &mut labels)?;
    }
    HostData::new(
        normalise(&pixels, norm),
        vec![3, 32, 32],
        Targets::Classes(labels),
        TargetKind::Classes(variant.classes()),
        dir.to_path_buf(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(labels: &[u8], fill: impl Fn(usize) -> u8) -> Vec<u8> {
        let mut r = labels.to_vec();
        r.extend((0..IMAGE_BYTES).map(fill));
        r
    }

    #[test]
    fn cifar100_uses_the_fine_label_and_channel_planes() -> Result<()> {
        let mut bytes = record(&[3, 97], |i| (i / 1024) as u8 * 100);
        bytes.extend(record(&[0, 5], |_| 255));
        let (mut px, mut lb) = (Vec::new(), Vec::new());
        decode(Path::new("t"), &bytes, Variant::Cifar100, &mut px, &mut lb)?;
        assert_eq!(lb, vec![97, 5]);
        assert_eq!((px[0], px[1024], px[2048], px[3072]), (0, 100, 200, 255));
        Ok(())
    }

    #[test]
    fn partial_records_and_bad_labels_are_refused() {
        let msg = |bytes: &[u8], v| {
            decode(
                Path::new("f.bin"),
                bytes,
                v,
                &mut Vec::new(),
                &mut Vec::new(),
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        let mut short = record(&[1], |_| 0);
        short.pop();
        let m = msg(&short, Variant::Cifar10);
        assert!(
            m.contains("3072 bytes is not a whole number of 3073-byte"),
            "{m}"
        );
        let m = msg(&record(&[10], |_| 0), Variant::Cifar10);
        assert!(m.contains("record 0: label 10 is >= 10 classes"), "{m}");
    }

    #[test]
    fn detects_both_variants_and_the_extracted_sub_folder() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let ten = tmp.path().join("cifar-10-batches-bin");
        std::fs::create_dir_all(&ten).map_err(|e| Error::Config(e.to_string()))?;
        std::fs::write(ten.join("data_batch_1.bin"), b"")
            .map_err(|e| Error::Config(e.to_string()))?;
        assert_eq!(detect(tmp.path()), Some((Variant::Cifar10, ten.clone())));
        assert_eq!(detect(&ten), Some((Variant::Cifar10, ten)));
        assert_eq!(detect(&tmp.path().join("nothing")), None);
        Ok(())
    }
}

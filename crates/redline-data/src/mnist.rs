//! An MNIST-format folder (MNIST, Fashion-MNIST, KMNIST): each split becomes
//! normalised images `(1, H, W)` and class ids, in host memory or on a device.

use std::path::Path;

use candle_core::Device;

use crate::dataset::{HostData, TargetKind, Targets};
use crate::error::{Error, Result};
use crate::idx;
use crate::split::Split;

/// Which split of the folder to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    /// `train-*` files.
    Train,
    /// `t10k-*` files.
    Test,
}

impl SplitKind {
    fn prefix(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Test => "t10k",
        }
    }
}

/// Per-pixel normalisation `(x/255 - mean) / std`, applied once in bulk at load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Subtracted after scaling to [0, 1].
    pub mean: f32,
    /// Divided by after subtracting the mean; must be non-zero.
    pub std: f32,
}

impl Default for Normalize {
    /// torchvision's tutorial `Normalize((0.5,), (0.5,))`: maps pixels to [-1, 1].
    fn default() -> Self {
        Self {
            mean: 0.5,
            std: 0.5,
        }
    }
}

/// True when `dir` holds MNIST-format training images.
pub fn is_idx_dir(dir: &Path) -> bool {
    idx::locate(
        dir,
        &format!("{}-images-idx3-ubyte", SplitKind::Train.prefix()),
    )
    .is_ok()
}

/// Reads `dir`'s split as host data: normalised images `(1, H, W)` and class
/// ids checked against `classes` (`None`: one more than the largest label).
pub fn load(
    dir: &Path,
    kind: SplitKind,
    classes: Option<usize>,
    norm: Normalize,
) -> Result<HostData> {
    let img_path = idx::locate(dir, &format!("{}-images-idx3-ubyte", kind.prefix()))?;
    let lbl_path = idx::locate(dir, &format!("{}-labels-idx1-ubyte", kind.prefix()))?;
    let images = idx::read(&img_path)?;
    let labels = idx::read(&lbl_path)?;
    from_idx(&img_path, images, &lbl_path, labels, classes, norm)
}

impl Split {
    /// Reads `dir`'s split onto `device`, checking counts and label range, and normalises it.
    pub fn load(
        dir: &Path,
        kind: SplitKind,
        classes: usize,
        norm: Normalize,
        device: &Device,
    ) -> Result<Self> {
        Self::from_host(&load(dir, kind, Some(classes), norm)?, device)
    }
}

/// Checks a normalisation before it is applied.
pub(crate) fn check_norm(norm: Normalize) -> Result<()> {
    if norm.std == 0.0 || !norm.std.is_finite() || !norm.mean.is_finite() {
        return Err(Error::Config(format!(
            "normalisation mean {} / std {} is not usable (std must be finite and non-zero)",
            norm.mean, norm.std
        )));
    }
    Ok(())
}

/// Pixels to floats with the same arithmetic as torchvision's ToTensor + Normalize.
pub(crate) fn normalise(bytes: &[u8], norm: Normalize) -> Vec<f32> {
    bytes
        .iter()
        .map(|&p| (p as f32 / 255.0 - norm.mean) / norm.std)
        .collect()
}

/// Builds host data from decoded arrays, validating shapes and labels.
pub fn from_idx(
    img_path: &Path,
    images: idx::IdxArray,
    lbl_path: &Path,
    labels: idx::IdxArray,
    classes: Option<usize>,
    norm: Normalize,
) -> Result<HostData> {
    let bad = |path: &Path, msg: String| Error::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let [n, h, w] = images.dims[..] else {
        return Err(bad(
            img_path,
            format!(
                "images must have 3 dimensions (N, H, W), found {:?}",
                images.dims
            ),
        ));
    };
    let [m] = labels.dims[..] else {
        return Err(bad(
            lbl_path,
            format!("labels must have 1 dimension (N), found {:?}", labels.dims),
        ));
    };
    if n != m {
        return Err(bad(
            lbl_path,
            format!(
                "{m} labels but {n} images in {} (file truncated or from another split?)",
                img_path.display()
            ),
        ));
    }
    if n == 0 {
        return Err(bad(img_path, "the split holds 0 images".into()));
    }
    check_norm(norm)?;
    let classes =
        classes.unwrap_or_else(|| labels.data.iter().max().map_or(1, |&l| l as usize + 1));
    // Checked here, naming the labels file; the split itself is named by its
    // images file, so a later shape error names the file at fault.
    if let Some((i, l)) = labels
        .data
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= classes)
    {
        return Err(bad(
            lbl_path,
            format!(
                "label {l} at index {i} is >= the {classes} classes\nHINT: pass --classes {} or \
                 check the file",
                *l as usize + 1
            ),
        ));
    }
    HostData::new(
        normalise(&images.data, norm),
        vec![1, h, w],
        Targets::Classes(labels.data.iter().map(|&l| l as u32).collect()),
        TargetKind::Classes(classes),
        img_path.to_path_buf(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idx::IdxArray;

    fn arr(dims: &[usize], data: Vec<u8>) -> IdxArray {
        IdxArray {
            dims: dims.to_vec(),
            data,
        }
    }

    fn build(images: IdxArray, labels: IdxArray) -> std::result::Result<Split, String> {
        from_idx(
            Path::new("img"),
            images,
            Path::new("lbl"),
            labels,
            Some(10),
            Normalize::default(),
        )
        .and_then(|h| Split::from_host(&h, &Device::Cpu))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn normalises_like_torchvision() -> std::result::Result<(), String> {
        let s = build(arr(&[1, 1, 3], vec![0, 255, 51]), arr(&[1], vec![4]))?;
        let v =
            s.x.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| e.to_string())?;
        assert_eq!(v, vec![-1.0, 1.0, (51.0 / 255.0 - 0.5) / 0.5]);
        assert_eq!(s.x.dims(), &[1, 1, 1, 3]);
        Ok(())
    }

    #[test]
    fn count_mismatch_is_an_error() {
        let m = build(arr(&[2, 1, 1], vec![0, 0]), arr(&[1], vec![0]))
            .err()
            .unwrap_or_default();
        assert!(m.starts_with("lbl: 1 labels but 2 images"), "{m}");
    }

    #[test]
    fn label_out_of_range_is_an_error() {
        let m = build(arr(&[2, 1, 1], vec![0, 0]), arr(&[2], vec![3, 10]))
            .err()
            .unwrap_or_default();
        assert!(
            m.contains("label 10 at index 1 is >= the 10 classes"),
            "{m}"
        );
    }

    #[test]
    fn wrong_rank_is_an_error() {
        let m = build(arr(&[2, 1], vec![0, 0]), arr(&[2], vec![0, 1]))
            .err()
            .unwrap_or_default();
        assert!(m.contains("3 dimensions"), "{m}");
    }
}

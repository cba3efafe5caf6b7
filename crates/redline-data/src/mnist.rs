//! An MNIST-format folder (MNIST, Fashion-MNIST, KMNIST): each split becomes one
//! normalised image tensor and one label tensor, created directly on the device.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::idx;

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

/// One split held as two tensors on the device.
#[derive(Debug, Clone)]
pub struct Split {
    /// Normalised images, `(N, 1, H, W)` f32.
    pub images: Tensor,
    /// Class indices, `(N,)` u32, each `< classes`.
    pub labels: Tensor,
    /// Number of classes the labels were checked against.
    pub classes: usize,
    /// Where the images came from (for messages).
    pub source: PathBuf,
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.images.dims().first().copied().unwrap_or(0)
    }

    /// True when the split holds no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the split's tensors take (images and labels).
    pub fn bytes(&self) -> u64 {
        let t = |x: &Tensor| (x.elem_count() * x.dtype().size_in_bytes()) as u64;
        t(&self.images) + t(&self.labels)
    }

    /// The same split on `device` (one upload; a cheap clone when already there).
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            images: self.images.to_device(device)?,
            labels: self.labels.to_device(device)?,
            classes: self.classes,
            source: self.source.clone(),
        })
    }

    /// Reads `dir`'s split, checking counts and label range, and normalises it.
    pub fn load(
        dir: &Path,
        kind: SplitKind,
        classes: usize,
        norm: Normalize,
        device: &Device,
    ) -> Result<Self> {
        let img_path = idx::locate(dir, &format!("{}-images-idx3-ubyte", kind.prefix()))?;
        let lbl_path = idx::locate(dir, &format!("{}-labels-idx1-ubyte", kind.prefix()))?;
        let images = idx::read(&img_path)?;
        let labels = idx::read(&lbl_path)?;
        Self::from_idx(&img_path, images, &lbl_path, labels, classes, norm, device)
    }

    /// Builds a split from decoded arrays, validating shapes and labels.
    pub fn from_idx(
        img_path: &Path,
        images: idx::IdxArray,
        lbl_path: &Path,
        labels: idx::IdxArray,
        classes: usize,
        norm: Normalize,
        device: &Device,
    ) -> Result<Self> {
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
        if let Some((i, &l)) = labels
            .data
            .iter()
            .enumerate()
            .find(|(_, &l)| l as usize >= classes)
        {
            return Err(bad(
                lbl_path,
                format!("label {l} at index {i} is >= the {classes} classes (wrong --classes?)"),
            ));
        }
        if norm.std == 0.0 || !norm.std.is_finite() || !norm.mean.is_finite() {
            return Err(Error::Config(format!(
                "normalisation mean {} / std {} is not usable (std must be finite and non-zero)",
                norm.mean, norm.std
            )));
        }
        // One pass over the bytes, the same arithmetic as ToTensor + Normalize.
        let pixels: Vec<f32> = images
            .data
            .iter()
            .map(|&p| (p as f32 / 255.0 - norm.mean) / norm.std)
            .collect();
        let labels_u32: Vec<u32> = labels.data.iter().map(|&l| l as u32).collect();
        Ok(Self {
            images: Tensor::from_vec(pixels, (n, 1, h, w), device)?,
            labels: Tensor::from_vec(labels_u32, n, device)?,
            classes,
            source: img_path.to_path_buf(),
        })
    }
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
        Split::from_idx(
            Path::new("img"),
            images,
            Path::new("lbl"),
            labels,
            10,
            Normalize::default(),
            &Device::Cpu,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn normalises_like_torchvision() -> std::result::Result<(), String> {
        let s = build(arr(&[1, 1, 3], vec![0, 255, 51]), arr(&[1], vec![4]))?;
        let v = s
            .images
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| e.to_string())?;
        assert_eq!(v, vec![-1.0, 1.0, (51.0 / 255.0 - 0.5) / 0.5]);
        assert_eq!(s.images.dims(), &[1, 1, 1, 3]);
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

//! The streamed pipeline's transforms against torchvision's (PIL backend):
//! evaluation's Resize + CenterCrop, a plain resize, and a resized crop with
//! and without the flip, each then ToTensor + Normalize(ImageNet). Golden
//! values from tools/reference/make_golden_transforms.py.
//!
//! PIL resizes 8-bit images in fixed point and rounds to bytes; Redline's
//! resize (fast_image_resize: the same antialiased bilinear weights, its own
//! fixed-point rounding) gives every pixel within one step of 1/255 of
//! PIL's, most of them exactly (measured: 82% of a resize, 81% of the
//! evaluation crop, which Redline resizes from the original's region
//! instead of from the whole resized image).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use rand::SeedableRng;
use redline_data::stream::{crop, decode, ChannelNorm, Transform};

fn golden() -> std::collections::HashMap<String, Vec<f32>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden");
    candle_core::safetensors::load(
        root.join("transforms.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap()
    .into_iter()
    .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
    .collect()
}

fn image() -> decode::Pixels {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden");
    let bytes = std::fs::read(root.join("transforms.png")).unwrap();
    decode::decode(&bytes, 3, Path::new("transforms.png")).unwrap()
}

/// Values differ by at most one pixel step (in normalised units, 1/255/std)
/// and at most a quarter of them differ at all.
fn close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    let step = 1.0 / 255.0 / 0.224 + 1e-4;
    let mut differ = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        assert!(d <= step * 1.05, "{name}[{i}]: {g} vs torchvision's {w}");
        differ += usize::from(d > 1e-5);
    }
    eprintln!(
        "{name}: {differ} of {} values differ by one step",
        got.len()
    );
    assert!(
        differ * 4 <= got.len(),
        "{name}: {differ} of {} values differ",
        got.len()
    );
}

#[test]
fn eval_resize_and_resized_crops_match_torchvision() {
    let g = golden();
    let px = image();
    assert_eq!((px.width, px.height), (61, 43));
    let norm = ChannelNorm::IMAGENET;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut out = vec![0f32; 3 * 16 * 16];
    let mut big = vec![0f32; 3 * 20 * 20];
    crop::apply(
        &px,
        Transform::Resize(Some(20)),
        &norm,
        &mut rng,
        &mut big,
        (20, 20),
    )
    .unwrap();
    close("resize", &big, &g["resize"]);
    crop::resized_crop(&px, (5, 7, 30, 25), 16, false, &norm, &mut out);
    close("crop", &out, &g["crop"]);
    crop::resized_crop(&px, (5, 7, 30, 25), 16, true, &norm, &mut out);
    close("crop_flip", &out, &g["crop_flip"]);
    crop::apply(
        &px,
        Transform::ResizeCenterCrop(16),
        &norm,
        &mut rng,
        &mut out,
        (16, 16),
    )
    .unwrap();
    close("eval", &out, &g["eval"]);
}

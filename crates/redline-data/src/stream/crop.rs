//! The per-sample transforms of streamed images, as torchvision computes
//! them: `RandomResizedCrop(size)` (scale 0.08-1, ratio 3/4-4/3, ten tries
//! then a centre crop), `RandomHorizontalFlip()`, evaluation's
//! `Resize(size / 0.875)` + `CenterCrop(size)`, and a plain resize to a
//! square; then `ToTensor` + `Normalize(mean, std)` into channel planes.

use std::borrow::Cow;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType as ResizeFilter, PixelType, ResizeAlg, ResizeOptions, Resizer};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::decode::Pixels;

/// What each sample goes through after decoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// Resize to `size x size` (no crop), as the resident image folder does
    /// with `--image-size`; the image's own size when `None` (every image
    /// must then have the first one's size).
    Resize(Option<u32>),
    /// Training: `RandomResizedCrop(size)`, then a flip when `hflip`.
    RandomResizedCrop {
        /// Output side.
        size: u32,
        /// `RandomHorizontalFlip()` after the crop.
        hflip: bool,
    },
    /// Evaluation: the shorter side resized to `size / 0.875`, then the
    /// centre `size x size`.
    ResizeCenterCrop(u32),
}

impl Transform {
    /// The output side, when it does not depend on the image.
    pub fn size(self) -> Option<u32> {
        match self {
            Self::Resize(s) => s,
            Self::RandomResizedCrop { size, .. } | Self::ResizeCenterCrop(size) => Some(size),
        }
    }

    /// The transform validation and test use with this training transform.
    pub fn for_eval(self) -> Self {
        match self {
            Self::RandomResizedCrop { size, .. } => Self::ResizeCenterCrop(size),
            t => t,
        }
    }
}

/// Per-channel `Normalize(mean, std)` after scaling to [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelNorm {
    /// Means of the channels (a grey image uses the first).
    pub mean: [f32; 3],
    /// Standard deviations of the channels.
    pub std: [f32; 3],
}

impl ChannelNorm {
    /// ImageNet's statistics, as every torchvision recipe normalises.
    pub const IMAGENET: Self = Self {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };

    /// The same mean and std for every channel.
    pub fn is_uniform(&self) -> bool {
        self.mean.iter().all(|&m| m == self.mean[0]) && self.std.iter().all(|&s| s == self.std[0])
    }

    /// Black in these units, per channel: `-mean/std`.
    pub fn black(&self) -> [f32; 3] {
        std::array::from_fn(|c| -self.mean[c] / self.std[c])
    }

    /// One mean and std for every channel.
    pub fn same(mean: f32, std: f32) -> Self {
        Self {
            mean: [mean; 3],
            std: [std; 3],
        }
    }
}

/// A crop box: top, left, height, width.
pub type Box4 = (u32, u32, u32, u32);

/// torchvision's `RandomResizedCrop.get_params` for a `width x height`
/// image (scale 0.08-1, ratio 3/4-4/3).
pub fn random_resized_box(width: u32, height: u32, rng: &mut ChaCha8Rng) -> Box4 {
    let area = f64::from(width) * f64::from(height);
    let (lo, hi) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
    for _ in 0..10 {
        let target = area * rng.random_range(0.08..1.0);
        let aspect = rng.random_range(lo..hi).exp();
        // Python's round(): halves to even.
        let w = (target * aspect).sqrt().round_ties_even() as i64;
        let h = (target / aspect).sqrt().round_ties_even() as i64;
        if 0 < w && w <= i64::from(width) && 0 < h && h <= i64::from(height) {
            let (w, h) = (w as u32, h as u32);
            let top = rng.random_range(0..=height - h);
            let left = rng.random_range(0..=width - w);
            return (top, left, h, w);
        }
    }
    // The fallback: a centre crop at the nearest allowed ratio.
    let ratio = f64::from(width) / f64::from(height);
    let (w, h) = if ratio < 3.0 / 4.0 {
        (
            width,
            (f64::from(width) / (3.0 / 4.0)).round_ties_even() as u32,
        )
    } else if ratio > 4.0 / 3.0 {
        (
            (f64::from(height) * (4.0 / 3.0)).round_ties_even() as u32,
            height,
        )
    } else {
        (width, height)
    };
    (
        (height - h.min(height)) / 2,
        (width - w.min(width)) / 2,
        h.min(height),
        w.min(width),
    )
}

/// torchvision's `Resize(s)` for an int `s`: the shorter side becomes `s`,
/// the longer `int(s * long / short)`.
pub fn shorter_side_to(width: u32, height: u32, s: u32) -> (u32, u32) {
    let long = |l: u32, short: u32| ((u64::from(s) * u64::from(l)) / u64::from(short)) as u32;
    match width <= height {
        true => (s, long(height, width)),
        false => (long(width, height), s),
    }
}

/// torchvision's `CenterCrop(size)` offsets: `int(round((dim - size) / 2))`
/// (Python's `round`, halves to even).
pub fn centre(width: u32, height: u32, size: u32) -> (u32, u32) {
    let off = |d: u32| {
        ((f64::from(d) - f64::from(size)) / 2.0)
            .round_ties_even()
            .max(0.0) as u32
    };
    (off(height), off(width))
}

/// Crops `b` out of `px` and resizes it to `w x h` with PIL's antialiased
/// bilinear filter (a triangle filter scaled with the reduction), on
/// `fast_image_resize`'s SIMD kernels, which follow PIL's arithmetic.
fn crop_resize(px: &Pixels, b: Box4, w: u32, h: u32) -> Pixels {
    let (top, left, ch, cw) = b;
    let c = px.channels;
    let whole = (top, left, ch, cw) == (0, 0, px.height, px.width);
    // The crop is cut out first, as torchvision's `resized_crop` (PIL's
    // `crop` then `resize`) does: the filter near its edges sees only the
    // crop, not the pixels beyond it.
    let cut;
    let src = match whole {
        true => px,
        false => {
            let stride = px.width as usize * c;
            let (t, l) = (top as usize, left as usize);
            let mut data = Vec::with_capacity((cw * ch) as usize * c);
            for y in t..t + ch as usize {
                data.extend_from_slice(
                    &px.data[y * stride + l * c..y * stride + (l + cw as usize) * c],
                );
            }
            cut = Pixels {
                width: cw,
                height: ch,
                channels: c,
                data,
            };
            &cut
        }
    };
    if (cw, ch) == (w, h) {
        return src.clone();
    }
    resize_region(src, (0.0, 0.0, f64::from(ch), f64::from(cw)), w, h)
}

/// The region `(top, left, height, width)` of `px` (fractional pixels)
/// resized to `w x h`: what resizing the whole image and cropping the
/// matching pixels gives, without the whole resized image.
fn resize_region(px: &Pixels, region: (f64, f64, f64, f64), w: u32, h: u32) -> Pixels {
    let (top, left, ch, cw) = region;
    let c = px.channels;
    let kind = if c == 1 {
        PixelType::U8
    } else {
        PixelType::U8x3
    };
    let mut out = Pixels {
        width: w,
        height: h,
        channels: c,
        data: vec![0; (w * h) as usize * c],
    };
    let resized = ImageRef::new(px.width, px.height, &px.data, kind).and_then(|src| {
        let mut dst = Image::from_slice_u8(w, h, &mut out.data, kind)?;
        let opts = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(ResizeFilter::Bilinear))
            .crop(left, top, cw, ch);
        Resizer::new()
            .resize(&src, &mut dst, &opts)
            .map_err(|_| fast_image_resize::ImageBufferError::InvalidBufferSize)
    });
    // The buffers are sized from the dimensions above: the resize cannot
    // refuse them; were it to, the zeroed output stands.
    debug_assert!(resized.is_ok(), "{resized:?}");
    out
}

/// torchvision's `F.resized_crop(img, top, left, height, width, [size, size])`
/// (the box `b` as `(top, left, height, width)`), mirrored when `flip`, as
/// normalised planes in `out`.
pub fn resized_crop(
    px: &Pixels,
    b: Box4,
    size: u32,
    flip: bool,
    norm: &ChannelNorm,
    out: &mut [f32],
) {
    f32::planes(&crop_resize(px, b, size, size), norm, flip, out);
}

/// `px` resized to `w x h` (PIL's antialiased bilinear).
pub fn resize(px: &Pixels, w: u32, h: u32) -> Pixels {
    crop_resize(px, (0, 0, px.height, px.width), w, h)
}

/// Applies `t` to `px` (its random draws from `rng`) and writes the result
/// as channel planes `(C, size, size)` into `out`: fp32 values normalised by
/// `norm`, or the bytes themselves for a device to normalise ([`Plane`]).
/// `None` when the image is not of the size `t` needs (a plain resize of
/// images of their own size).
pub fn apply<T: Plane>(
    px: &Pixels,
    t: Transform,
    norm: &ChannelNorm,
    rng: &mut ChaCha8Rng,
    out: &mut [T],
    side: (u32, u32),
) -> Option<()> {
    let (img, flip) = transformed(px, t, rng, side)?;
    T::planes(&img, norm, flip, out);
    Some(())
}

/// `px` through `t`: the image to write, and whether to mirror it.
fn transformed<'a>(
    px: &'a Pixels,
    t: Transform,
    rng: &mut ChaCha8Rng,
    side: (u32, u32),
) -> Option<(Cow<'a, Pixels>, bool)> {
    let full = (0, 0, px.height, px.width);
    Some(match t {
        Transform::Resize(None) if (px.width, px.height) != side => return None,
        Transform::Resize(None) => (Cow::Borrowed(px), false),
        Transform::Resize(Some(s)) if (px.width, px.height) == (s, s) => (Cow::Borrowed(px), false),
        Transform::Resize(Some(s)) => (Cow::Owned(crop_resize(px, full, s, s)), false),
        Transform::RandomResizedCrop { size, hflip } => {
            let b = random_resized_box(px.width, px.height, rng);
            let img = crop_resize(px, b, size, size);
            (Cow::Owned(img), hflip && rng.random_bool(0.5))
        }
        Transform::ResizeCenterCrop(size) => {
            let s = (f64::from(size) / 0.875) as u32;
            let (w, h) = shorter_side_to(px.width, px.height, s);
            let (top, left) = centre(w, h, size);
            // The centre crop of the resized image, mapped back onto the
            // original: only that region is resized (an image of extreme
            // aspect ratio never makes a huge intermediate).
            let sx = f64::from(px.width) / f64::from(w);
            let sy = f64::from(px.height) / f64::from(h);
            let region = (
                f64::from(top) * sy,
                f64::from(left) * sx,
                f64::from(size) * sy,
                f64::from(size) * sx,
            );
            (Cow::Owned(resize_region(px, region, size, size)), false)
        }
    })
}

/// A value of a sample's channel planes: what [`apply`] writes.
pub trait Plane: Copy + Send + Sync + 'static {
    /// Interleaved bytes to channel planes `(C, H, W)`, mirrored left-right
    /// when `flip`.
    fn planes(img: &Pixels, norm: &ChannelNorm, flip: bool, out: &mut [Self]);
}

impl Plane for f32 {
    /// Normalised: `(p / 255 - mean) / std`, as torchvision computes it.
    fn planes(img: &Pixels, norm: &ChannelNorm, flip: bool, out: &mut [f32]) {
        let luts = byte_values(norm);
        map_planes(img, flip, out, |ch, p| luts[ch][usize::from(p)]);
    }
}

impl Plane for u8 {
    /// The bytes themselves (a quarter of fp32's): the device normalises
    /// them with [`byte_values`].
    fn planes(img: &Pixels, _norm: &ChannelNorm, flip: bool, out: &mut [u8]) {
        map_planes(img, flip, out, |_, p| p);
    }
}

/// Each channel's normalised value of each byte, `(p / 255 - mean) / std`
/// as torchvision computes it (three channels; a grey image uses the first).
pub fn byte_values(norm: &ChannelNorm) -> [[f32; 256]; 3] {
    std::array::from_fn(|ch| {
        let (mean, std) = (norm.mean[ch], norm.std[ch]);
        std::array::from_fn(|p| (p as f32 / 255.0 - mean) / std)
    })
}

/// Interleaved bytes to planes of `f(channel, byte)`, mirrored left-right
/// when `flip`.
fn map_planes<T: Copy>(img: &Pixels, flip: bool, out: &mut [T], f: impl Fn(usize, u8) -> T) {
    let (w, h, c) = (img.width as usize, img.height as usize, img.channels);
    let plane = w * h;
    for ch in 0..c {
        let dst = &mut out[ch * plane..(ch + 1) * plane];
        for y in 0..h {
            let row = &img.data[y * w * c..(y + 1) * w * c];
            let d = &mut dst[y * w..(y + 1) * w];
            match flip {
                false => {
                    for (v, px) in d.iter_mut().zip(row.chunks_exact(c)) {
                        *v = f(ch, px[ch]);
                    }
                }
                true => {
                    for (v, px) in d.iter_mut().zip(row.chunks_exact(c).rev()) {
                        *v = f(ch, px[ch]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn random_resized_boxes_lie_inside_with_torchvisions_scale_and_ratio() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (w, h) = (500u32, 375u32);
        let mut fallbacks = 0;
        for _ in 0..2000 {
            let (top, left, bh, bw) = random_resized_box(w, h, &mut rng);
            assert!(top + bh <= h && left + bw <= w && bh > 0 && bw > 0);
            let scale = f64::from(bh) * f64::from(bw) / f64::from(w * h);
            let ratio = f64::from(bw) / f64::from(bh);
            if (bh, bw) == (h, w) {
                fallbacks += 1;
                continue;
            }
            // Rounding to whole pixels moves both a little.
            assert!((0.07..=1.0).contains(&scale), "{scale}");
            assert!((0.70..=1.45).contains(&ratio), "{ratio}");
        }
        assert!(fallbacks < 40, "{fallbacks}");
        // A strip far beyond 4/3: every try fails, the centre crop at 4/3.
        assert_eq!(random_resized_box(1000, 10, &mut rng), (0, 493, 10, 13));
    }

    #[test]
    fn eval_resize_and_centre_crop_follow_torchvision() {
        // Resize(256) of 500 x 375: the shorter side 256, the longer int(256 * 500 / 375).
        assert_eq!(shorter_side_to(500, 375, 256), (341, 256));
        assert_eq!(shorter_side_to(375, 500, 256), (256, 341));
        // CenterCrop(224) of 341 x 256: int(round(58.5)) = 58 (banker's: 58), 16.
        assert_eq!(centre(341, 256, 224), (16, 58));
    }

    #[test]
    fn planes_normalise_per_channel_and_flip_mirrors() {
        let img = Pixels {
            width: 2,
            height: 1,
            channels: 3,
            data: vec![255, 0, 0, 0, 255, 0],
        };
        let mut out = vec![0.0; 6];
        f32::planes(&img, &ChannelNorm::same(0.0, 1.0), false, &mut out);
        assert_eq!(out, vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        f32::planes(&img, &ChannelNorm::same(0.0, 1.0), true, &mut out);
        assert_eq!(out, vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        f32::planes(&img, &ChannelNorm::IMAGENET, false, &mut out);
        assert!((out[0] - (1.0 - 0.485) / 0.229).abs() < 1e-6);
    }
}

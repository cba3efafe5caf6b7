//! One image's bytes to pixels: its size checked before it is decoded (a
//! decompression bomb is refused by its pixel count, as PIL's
//! `MAX_IMAGE_PIXELS`), then decoded and converted to RGB or grey as PIL's
//! `convert("RGB")` / `convert("L")` would (CMYK, 16-bit, palette, alpha).

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageReader, Limits};

use crate::error::{Error, Result};

/// The most pixels an image may have: PIL's `MAX_IMAGE_PIXELS` (89,478,485,
/// a 9,459 x 9,459 image). Larger ones are refused before decoding.
pub const MAX_PIXELS: u64 = 89_478_485;

/// Decoded pixels, interleaved (`channels` bytes per pixel, row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// 1 (grey) or 3 (RGB).
    pub channels: usize,
    /// `width * height * channels` bytes.
    pub data: Vec<u8>,
}

fn bad(what: &Path, msg: String) -> Error {
    Error::Invalid {
        path: what.to_path_buf(),
        msg,
    }
}

/// The width and height `bytes` declare, read from the header alone.
pub fn dimensions(bytes: &[u8], what: &Path) -> Result<(u32, u32)> {
    ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(what, format!("cannot be read as an image: {e}")))?
        .into_dimensions()
        .map_err(|e| bad(what, format!("cannot be decoded as an image: {e}")))
}

/// The channels a data set of images like this one gets (1 for grey,
/// with or without alpha; else 3) and its width and height, from the header.
pub fn probe(bytes: &[u8], what: &Path) -> Result<(usize, u32, u32)> {
    use image::ImageDecoder;
    let decoder = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(what, format!("cannot be read as an image: {e}")))?
        .into_decoder()
        .map_err(|e| bad(what, format!("cannot be decoded as an image: {e}")))?;
    let (w, h) = decoder.dimensions();
    let channels = match decoder.color_type().channel_count() {
        1 | 2 => 1,
        _ => 3,
    };
    Ok((channels, w, h))
}

/// Decodes `bytes` (PNG or JPEG) into `channels` channels. `what` names the
/// file (or shard member) in errors.
pub fn decode(bytes: &[u8], channels: usize, what: &Path) -> Result<Pixels> {
    let (w, h) = dimensions(bytes, what)?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels > MAX_PIXELS {
        return Err(bad(
            what,
            format!(
                "is {w} x {h} = {pixels} pixels, more than the {MAX_PIXELS} an image may have \
                 (PIL's MAX_IMAGE_PIXELS; a decompression bomb?)\nHINT: shrink it, or pack \
                 the folder with `redline pack --max-side 512`"
            ),
        ));
    }
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(what, format!("cannot be read as an image: {e}")))?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(w);
    limits.max_image_height = Some(h);
    // Room for a 16-bit RGBA decode of the declared size, and no more.
    limits.max_alloc = Some(pixels * 8 + (1 << 20));
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| bad(what, format!("cannot be decoded as an image: {e}")))?;
    Ok(convert(img, channels))
}

/// The image as `channels` channels of 8 bits.
fn convert(img: DynamicImage, channels: usize) -> Pixels {
    let (width, height) = (img.width(), img.height());
    let grey = img.color().channel_count() <= 2;
    let data = match (channels, grey) {
        (1, true) => img.into_luma8().into_raw(),
        // PIL's convert("L"): ITU-R 601-2 luma in its fixed-point form
        // (the image crate weighs the channels as Rec. 709).
        (1, false) => img
            .into_rgb8()
            .into_raw()
            .chunks_exact(3)
            .map(|p| {
                let l = u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471;
                ((l + 0x8000) >> 16) as u8
            })
            .collect(),
        _ => img.into_rgb8().into_raw(),
    };
    Pixels {
        width,
        height,
        channels: if channels == 1 { 1 } else { 3 },
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(img: DynamicImage, fmt: image::ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        let written = img.write_to(&mut out, fmt);
        assert!(written.is_ok(), "{written:?}");
        out.into_inner()
    }

    #[test]
    fn grey_16_bit_and_alpha_pngs_become_rgb_as_pil_converts_them() -> Result<()> {
        let p = Path::new("x.png");
        let grey = DynamicImage::ImageLuma8(image::GrayImage::from_pixel(3, 2, image::Luma([77])));
        let px = decode(&encode(grey, image::ImageFormat::Png), 3, p)?;
        assert_eq!((px.width, px.height, px.channels), (3, 2, 3));
        assert!(px.data.iter().all(|&v| v == 77));
        let deep = DynamicImage::ImageRgb16(image::ImageBuffer::from_pixel(
            2,
            2,
            image::Rgb([65535u16, 0, 32896]),
        ));
        let px = decode(&encode(deep, image::ImageFormat::Png), 3, p)?;
        assert_eq!(&px.data[..3], &[255, 0, 128]);
        let rgba = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(
            1,
            1,
            image::Rgba([10, 20, 30, 0]),
        ));
        let px = decode(&encode(rgba, image::ImageFormat::Png), 3, p)?;
        assert_eq!(px.data, vec![10, 20, 30]);
        let px = decode(
            &encode(
                DynamicImage::ImageRgb8(image::RgbImage::from_pixel(1, 1, image::Rgb([255, 0, 0]))),
                image::ImageFormat::Png,
            ),
            1,
            p,
        )?;
        // ITU-R 601-2 luma, as PIL's convert("L"): 0.299 * 255.
        assert_eq!(px.channels, 1);
        assert_eq!(px.data, vec![76]);
        Ok(())
    }

    #[test]
    fn a_bomb_is_refused_by_its_header_and_a_truncated_jpeg_is_named() {
        // A 30,000 x 30,000 PNG header: only the IHDR chunk is read.
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&30_000u32.to_be_bytes());
        png.extend_from_slice(&30_000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0]);
        let sum = crc(&png[12..]);
        png.extend_from_slice(&sum.to_be_bytes());
        // An empty IDAT: the decoder reads up to the first image data.
        png.extend_from_slice(b"\0\0\0\0IDAT");
        png.extend_from_slice(&crc(b"IDAT").to_be_bytes());
        let m = decode(&png, 3, Path::new("bomb.png"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("bomb.png")
                && m.contains("900000000 pixels")
                && m.contains("MAX_IMAGE_PIXELS"),
            "{m}"
        );
        let img =
            DynamicImage::ImageRgb8(image::RgbImage::from_pixel(64, 64, image::Rgb([9, 9, 9])));
        let jpeg = encode(img, image::ImageFormat::Jpeg);
        let m = decode(&jpeg[..jpeg.len() / 3], 3, Path::new("cut.jpg"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("cut.jpg") && m.contains("cannot be decoded"),
            "{m}"
        );
    }

    /// PNG's CRC-32 of a chunk's type and data.
    fn crc(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
}

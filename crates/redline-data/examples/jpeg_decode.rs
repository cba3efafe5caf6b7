//! Times JPEG decoders on one thread (issue 48 item 3): the `image` crate's
//! (zune-jpeg) whole decode against `jpeg-decoder`'s whole and DCT-scaled
//! (1/2, 1/4, 1/8) decodes, on JPEGs encoded here at ImageNet's typical
//! sizes (quality 90, 4:2:0, a smooth scene with texture and noise).
//!
//! `cargo run --release -p redline-data --example jpeg_decode -- [--reps N] [FILE.jpg ...]`;
//! `bench/jpeg_decode.py` runs it beside PIL (libjpeg-turbo) on the same files.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Cursor;
use std::time::Instant;

fn scene(w: u32, h: u32) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = (state % 24) as f32;
            let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
            let r = 120.0 + 90.0 * (6.0 * fx + 2.0 * fy).sin() + n;
            let g = 100.0 + 80.0 * (9.0 * fy).cos() * fx + n;
            let b = 90.0 + 60.0 * ((x / 7 + y / 5) % 2) as f32 + n;
            out.extend([r, g, b].map(|v| v.clamp(0.0, 255.0) as u8));
        }
    }
    out
}

fn encode(w: u32, h: u32) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90);
    image::ImageEncoder::write_image(enc, &scene(w, h), w, h, image::ExtendedColorType::Rgb8)
        .expect("encode");
    out.into_inner()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut() -> usize) -> (f64, usize) {
    let mut out = 0;
    let v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            out = f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    (median(v), out)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(21);
    let files: Vec<String> = args
        .iter()
        .filter(|a| a.ends_with(".jpg") || a.ends_with(".jpeg"))
        .cloned()
        .collect();
    let mut inputs: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read(f).expect("read")))
        .collect();
    if inputs.is_empty() {
        for (w, h) in [(500, 375), (1024, 768), (2048, 1536)] {
            inputs.push((format!("synthetic {w}x{h} q90"), encode(w, h)));
        }
    }
    println!("one thread, median of {reps}");
    println!(
        "| image | KB | image (zune-jpeg) ms | jpeg-decoder 1/1 ms | 1/2 ms | 1/4 ms | 1/8 ms |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, bytes) in &inputs {
        let (zune, _) = time(reps, || {
            image::load_from_memory(bytes)
                .expect("decode")
                .into_rgb8()
                .len()
        });
        let mut row = vec![format!("{zune:.2}")];
        let (w, h) = {
            let mut d = jpeg_decoder::Decoder::new(Cursor::new(bytes));
            d.read_info().expect("info");
            let i = d.info().expect("info");
            (i.width, i.height)
        };
        for div in [1u16, 2, 4, 8] {
            let (ms, n) = time(reps, || {
                let mut d = jpeg_decoder::Decoder::new(Cursor::new(bytes));
                d.scale(w.div_ceil(div), h.div_ceil(div)).expect("scale");
                d.decode().expect("decode").len()
            });
            assert!(n >= (w / div) as usize * (h / div) as usize * 3);
            row.push(format!("{ms:.2}"));
        }
        let short = name.rsplit('/').next().unwrap_or(name);
        println!("| {short} | {} | {} |", bytes.len() / 1024, row.join(" | "));
    }
}

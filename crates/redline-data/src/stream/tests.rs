//! Streamed folders and shards: the same samples whatever the batch, the
//! order or the workers; resident and streamed alike; bad files named.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::*;
use crate::image_folder;

fn io(e: std::io::Error) -> Error {
    Error::Config(e.to_string())
}

/// A gradient image, so crops and flips change the pixels.
fn gradient(w: u32, h: u32, seed: u8) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 7) as u8 ^ seed, (y * 5) as u8, seed.wrapping_mul(3)])
    })
}

fn folder(d: &Path) -> Result<()> {
    for (class, n) in [("ant", 5), ("bee", 4)] {
        std::fs::create_dir_all(d.join(class)).map_err(io)?;
        for i in 0..n {
            let img = gradient(40 + i * 3, 30 + i, i as u8 * 17);
            let ext = if i % 2 == 0 { "png" } else { "jpg" };
            img.save(d.join(class).join(format!("{i}.{ext}")))
                .map_err(|e| Error::Config(e.to_string()))?;
        }
    }
    Ok(())
}

fn view(transform: Transform) -> View {
    View {
        transform,
        norm: ChannelNorm::IMAGENET,
        channels: 3,
        side: (16, 16),
        skip_bad: false,
    }
}

fn all(s: &Streamed, idx: &[u32]) -> Result<(Vec<f32>, Vec<u32>)> {
    let row: usize = s.input_dims().iter().product();
    let (mut x, mut y) = (vec![0.0; idx.len() * row], vec![0u32; idx.len()]);
    s.gather(idx, &mut x, TargetsMut::Classes(&mut y))?;
    Ok((x, y))
}

#[test]
fn a_samples_crop_depends_on_seed_epoch_and_sample_not_on_batch_or_workers() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(io)?;
    folder(tmp.path())?;
    let (list, names) = image_folder::listing(tmp.path(), None)?;
    assert_eq!(names, vec!["ant", "bee"]);
    let list = Arc::new(list);
    let t = Transform::RandomResizedCrop {
        size: 16,
        hflip: true,
    };
    let one = Streamed::new(list.clone(), view(t), worker_pool(1)?, 7)?;
    let three = Streamed::new(list.clone(), view(t), worker_pool(3)?, 7)?;
    let (a, ya) = all(&one, &[0, 1, 2, 3, 4, 5, 6, 7, 8])?;
    let (b, yb) = all(&three, &[8, 7, 6, 5, 4, 3, 2, 1, 0])?;
    assert_eq!(ya, vec![0, 0, 0, 0, 0, 1, 1, 1, 1]);
    let row = 3 * 16 * 16;
    for i in 0..9 {
        assert_eq!(
            a[i * row..(i + 1) * row],
            b[(8 - i) * row..(9 - i) * row],
            "{i}"
        );
        assert_eq!(ya[i], yb[8 - i]);
    }
    // Another epoch draws other crops; the same epoch again the same.
    three.set_epoch(1);
    let (c, _) = all(&three, &[0, 1, 2, 3, 4, 5, 6, 7, 8])?;
    assert_ne!(a, c);
    three.set_epoch(0);
    assert_eq!(all(&three, &[0, 1, 2, 3, 4, 5, 6, 7, 8])?.0, a);
    // Another seed, other crops.
    let other = Streamed::new(list, view(t), worker_pool(1)?, 8)?;
    assert_ne!(all(&other, &[0, 1, 2, 3, 4, 5, 6, 7, 8])?.0, a);
    Ok(())
}

#[test]
fn resident_and_streamed_hold_the_same_values_and_held_out_samples_centre_crop() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(io)?;
    folder(tmp.path())?;
    let (list, _) = image_folder::listing(tmp.path(), None)?;
    let s = Streamed::new(
        Arc::new(list),
        view(Transform::Resize(Some(16))),
        worker_pool(2)?,
        0,
    )?;
    let host = s.materialise(&AtomicBool::new(false))?;
    let (x, y) = all(&s, &(0..9).collect::<Vec<u32>>())?;
    assert_eq!(host.x, x);
    assert_eq!(host.y, Targets::Classes(y));
    // A held-out part of a randomly cropped split is centre-cropped: the
    // same pixels every epoch.
    let rrc = Streamed::new(
        s.list.clone(),
        view(Transform::RandomResizedCrop {
            size: 16,
            hflip: true,
        }),
        worker_pool(1)?,
        0,
    )?;
    let (_, held) = crate::samples::Samples::Streamed(Box::new(rrc)).split_rows(&[2, 6])?;
    let held = held
        .streamed()
        .cloned()
        .ok_or(Error::Config("streamed".into()))?;
    assert_eq!(held.view().transform, Transform::ResizeCenterCrop(16));
    assert_eq!(held.labels(), vec![0, 1]);
    let e0 = all(&held, &[0, 1])?;
    held.set_epoch(3);
    assert_eq!(all(&held, &[0, 1])?, e0);
    Ok(())
}

#[test]
fn a_corrupt_image_is_named_or_skipped_and_counted() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(io)?;
    folder(tmp.path())?;
    std::fs::write(tmp.path().join("bee/9.jpg"), b"\xff\xd8\xff garbage").map_err(io)?;
    let (list, _) = image_folder::listing(tmp.path(), None)?;
    let list = Arc::new(list);
    let s = Streamed::new(
        list.clone(),
        view(Transform::Resize(Some(16))),
        worker_pool(1)?,
        0,
    )?;
    let m = all(&s, &[9])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        m.contains("bee/9.jpg") && m.contains("cannot be") && m.contains("--bad-samples skip"),
        "{m}"
    );
    let mut v = view(Transform::Resize(Some(16)));
    v.skip_bad = true;
    let s = Streamed::new(list, v, worker_pool(1)?, 0)?;
    let (_, y) = all(&s, &[9, 0])?;
    // Sample 9 is replaced by the next that decodes (sample 0, an ant).
    assert_eq!((y, s.skipped()), (vec![0, 0], 1));
    Ok(())
}

/// Writes a tar of `members` (name, bytes); `cut` bytes are dropped from its end.
fn tar_file(path: &Path, members: &[(&str, Vec<u8>)], cut: usize) -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, &bytes[..]).map_err(io)?;
    }
    let mut data = b.into_inner().map_err(io)?;
    data.truncate(data.len() - cut);
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&data).map_err(io)
}

fn png(seed: u8) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(gradient(20, 20, seed))
        .write_to(&mut out, image::ImageFormat::Png)
        .map_err(|e| Error::Config(e.to_string()))?;
    Ok(out.into_inner())
}

#[test]
fn shards_pair_members_by_key_and_bad_shards_are_named() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(io)?;
    let d = tmp.path();
    let stop = AtomicBool::new(false);
    tar_file(
        &d.join("train-0.tar"),
        &[
            ("a/x1.png", png(1)?),
            ("a/x1.cls", b"2\n".to_vec()),
            ("x2.json", br#"{"label": 0}"#.to_vec()),
            ("x2.png", png(2)?),
        ],
        0,
    )?;
    tar_file(
        &d.join("train-1.tar"),
        &[("y.png", png(3)?), ("y.cls", b"1".to_vec())],
        0,
    )?;
    let shards = shards::expand(&d.join("train-{0..1}.tar").to_string_lossy())?;
    let list = shards::list(&shards, None, d, &stop)?;
    assert_eq!((list.labels.clone(), list.classes), (vec![2, 0, 1], 3));
    let s = Streamed::new(
        Arc::new(list),
        view(Transform::Resize(Some(16))),
        worker_pool(2)?,
        0,
    )?;
    let (x, y) = all(&s, &[1, 2])?;
    assert_eq!(y, vec![0, 1]);
    // The member's pixels: decode x2.png directly and compare.
    let direct = decode::decode(&png(2)?, 3, Path::new("x2"))?;
    let mut want = vec![0.0; 3 * 16 * 16];
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    crop::apply(
        &direct,
        Transform::Resize(Some(16)),
        &ChannelNorm::IMAGENET,
        &mut rng,
        &mut want,
        (16, 16),
    );
    assert_eq!(x[..want.len()], want[..]);
    let msg = |shards: &[std::path::PathBuf]| {
        shards::list(shards, None, d, &stop)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    tar_file(
        &d.join("lonely.tar"),
        &[("k.png", png(1)?), ("j.cls", b"0".to_vec())],
        0,
    )?;
    let m = msg(&[d.join("lonely.tar")]);
    assert!(
        m.contains("lonely.tar") && m.contains("do not pair up"),
        "{m}"
    );
    tar_file(&d.join("empty.tar"), &[], 0)?;
    let m = msg(&[d.join("empty.tar")]);
    assert!(m.contains("empty.tar") && m.contains("empty shard"), "{m}");
    tar_file(
        &d.join("cut.tar"),
        &[("k.png", png(1)?), ("k.cls", b"0".to_vec())],
        1500,
    )?;
    let m = msg(&[d.join("cut.tar")]);
    assert!(
        m.contains("cut.tar") && (m.contains("truncated") || m.contains("damaged")),
        "{m}"
    );
    let list = shards::list(&[d.join("train-0.tar")], Some(2), d, &stop)?;
    let m = Streamed::new(
        Arc::new(list),
        view(Transform::Resize(Some(16))),
        worker_pool(1)?,
        0,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        m.contains("x1.png") && m.contains("label 2 is beyond the 2 classes"),
        "{m}"
    );
    Ok(())
}

#[test]
fn a_fifo_or_an_oversized_member_is_a_bad_sample_named_not_read() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(io)?;
    let fifo = tmp.path().join("pipe.jpg");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map_err(io)?;
    assert!(made.success());
    let list = Listing {
        items: vec![
            Item::File(fifo.clone()),
            Item::Member {
                shard: 0,
                offset: 0,
                len: MAX_IMAGE_BYTES + 1,
                name: "big.jpg".into(),
            },
        ],
        labels: vec![0, 0],
        shards: vec![tmp.path().join("s.tar")],
        classes: 1,
        source: tmp.path().to_path_buf(),
    };
    // A FIFO would block a plain read until a writer came: refused at once.
    match list.read(0) {
        Err(Error::Invalid { path, msg }) => {
            assert_eq!(path, fifo);
            assert!(msg.contains("not a regular file"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    match list.read(1) {
        Err(Error::Invalid { path, msg }) => {
            assert!(
                path.to_string_lossy().ends_with("s.tar:big.jpg"),
                "{path:?}"
            );
            assert!(msg.contains("at most 1073741824 bytes"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// Samples `idx` of `s` through a stage of values and a stage of bytes
/// (normalised as a device would): the same values and labels, which are
/// also the host's gather's. Returns the bytes that crossed.
fn bytes_and_values_agree(s: &Streamed, batches: &[Vec<u32>]) -> Result<Vec<u8>> {
    use crate::stage::{PlainStage, Stage};
    let dev = candle_core::Device::Cpu;
    let mut values = PlainStage::with_bytes(&dev, s, 4, 2, false)?;
    let mut bytes = PlainStage::with_bytes(&dev, s, 4, 2, true)?;
    let mut crossed = Vec::new();
    for (slot, idx) in batches.iter().enumerate() {
        let staged = bytes.stage(slot, s, idx)?;
        assert_eq!(staged.x.dtype(), candle_core::DType::U8, "bytes cross");
        crossed.extend(staged.x.flatten_all()?.to_vec1::<u8>()?);
        let (xb, yb) = staged.ready()?;
        let (xv, yv) = values.stage(slot, s, idx)?.ready()?;
        let side = s.input_dims()[1];
        assert_eq!(xb.dims(), &[idx.len(), 3, side, side]);
        assert_eq!(xb.dtype(), candle_core::DType::F32);
        assert_eq!(
            xb.flatten_all()?.to_vec1::<f32>()?,
            xv.flatten_all()?.to_vec1::<f32>()?
        );
        assert_eq!(yb.to_vec1::<u32>()?, yv.to_vec1::<u32>()?);
        assert_eq!(xv.flatten_all()?.to_vec1::<f32>()?, all(s, idx)?.0);
    }
    Ok(crossed)
}

#[test]
fn bytes_normalised_on_the_device_equal_the_hosts_values() -> Result<()> {
    // Unequal channels, so a channel mixed up in the table shows.
    let norm = ChannelNorm {
        mean: [0.1, 0.5, 0.9],
        std: [0.2, 0.3, 0.7],
    };
    // Every byte value in every channel, unresized: 0 and 255 cross too.
    let tmp = tempfile::tempdir().map_err(io)?;
    for (class, n) in [("a", 3u32), ("b", 2)] {
        std::fs::create_dir_all(tmp.path().join(class)).map_err(io)?;
        for i in 0..n {
            let img = image::RgbImage::from_fn(16, 16, |x, y| {
                let p = (y * 16 + x + i * 40) as u8;
                image::Rgb([p, p.wrapping_add(85), p.wrapping_add(170)])
            });
            img.save(tmp.path().join(class).join(format!("{i}.png")))
                .map_err(|e| Error::Config(e.to_string()))?;
        }
    }
    let (list, _) = image_folder::listing(tmp.path(), None)?;
    let mut v = view(Transform::Resize(None));
    v.norm = norm;
    let s = Streamed::new(Arc::new(list), v, worker_pool(2)?, 3)?;
    assert_eq!(s.byte_norm(), Some(norm));
    // A full batch and a partial one (the table narrowed to 3 samples).
    let crossed = bytes_and_values_agree(&s, &[vec![4, 0, 3, 1], vec![2, 1, 0]])?;
    assert!((0..=255u8).all(|p| crossed.contains(&p)));
    // Random crops and flips of the photos: the same draws either way.
    let tmp = tempfile::tempdir().map_err(io)?;
    folder(tmp.path())?;
    let (list, _) = image_folder::listing(tmp.path(), None)?;
    let mut v = view(Transform::RandomResizedCrop {
        size: 16,
        hflip: true,
    });
    v.norm = norm;
    let s = Streamed::new(Arc::new(list), v, worker_pool(2)?, 3)?;
    s.set_epoch(2);
    bytes_and_values_agree(&s, &[vec![8, 0, 3, 5], vec![1, 7, 2]])?;
    Ok(())
}

#[test]
fn a_grey_batch_of_bytes_takes_the_first_channels_table() -> Result<()> {
    use crate::stage::{byte_table, normalise_bytes};
    let dev = candle_core::Device::Cpu;
    let norm = ChannelNorm {
        mean: [0.5, 0.0, 0.0],
        std: [0.25, 1.0, 1.0],
    };
    let table = byte_table(&norm, 1, 3, &dev)?;
    assert_eq!(table.dims(), &[3, 1, 256]);
    let x = candle_core::Tensor::from_vec(vec![0u8, 255, 51, 128], (2, 1, 2, 1), &dev)?;
    let got = normalise_bytes(&x, &table)?;
    assert_eq!(got.dims(), &[2, 1, 2, 1]);
    let want: Vec<f32> = [0u8, 255, 51, 128]
        .iter()
        .map(|&p| (f32::from(p) / 255.0 - 0.5) / 0.25)
        .collect();
    assert_eq!(got.flatten_all()?.to_vec1::<f32>()?, want);
    // A batch of bytes without channels is refused, not misread.
    let flat = candle_core::Tensor::from_vec(vec![0u8, 1], 2, &dev)?;
    assert!(normalise_bytes(&flat, &table).is_err());
    Ok(())
}

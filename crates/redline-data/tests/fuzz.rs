//! Fuzzing the data readers (`redline_testkit::fuzz`, corpus in
//! `testdata/fuzz/`): IDX raw and gzipped, `.npy`, and CSV through the whole
//! `--data` preparation, tar shards (listing, then every member read,
//! decoded and cropped) and single images (PNG, JPEG). Every input gives
//! data or an error, never a panic, and IDX never holds more than its
//! header declares.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use redline_data::{idx, prepare, DataOptions, Dataset};
use redline_testkit::fuzz::fuzz;

#[test]
fn fuzz_idx_raw_and_gzip() {
    fuzz("idx", |bytes| {
        if let Ok(a) = idx::decode(Path::new("fuzz.idx"), bytes) {
            let want: usize = a.dims.iter().product();
            assert_eq!(a.data.len(), want, "payload matches the header");
        }
    });
}

#[test]
fn fuzz_npy_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.npy");
    fuzz("npy", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        let _ = redline_data::arrays::read_all(dir.path());
    });
}

#[test]
fn fuzz_csv_through_prepare() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    fuzz("csv", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        if let Ok(p) = prepare(&path, &DataOptions::default()) {
            let cols: usize = p.train.input_dims().iter().product();
            assert_eq!(
                p.train.host().map(|h| h.x.len()),
                Some(p.train.len() * cols)
            );
        }
    });
}

/// Token data (issue 50): any bytes as a nanoGPT `train.bin` and as a
/// text file read through `prepare` with a block size, and the first
/// windows gathered, either train or are refused; never a panic.
#[test]
fn fuzz_token_files_through_prepare() {
    use redline_data::Targets;
    let dir = tempfile::tempdir().unwrap();
    let (bin_dir, text) = (dir.path().join("bin"), dir.path().join("t.txt"));
    std::fs::create_dir(&bin_dir).unwrap();
    let opts = DataOptions {
        block: Some(4),
        ..DataOptions::default()
    };
    fuzz("tokens", |bytes| {
        std::fs::write(bin_dir.join("train.bin"), bytes).unwrap();
        std::fs::write(&text, bytes).unwrap();
        for path in [&bin_dir, &text] {
            if let Ok(p) = prepare(path, &opts) {
                let n = p.train.len().min(3);
                let idx: Vec<u32> = (0..n as u32).collect();
                let mut x = vec![0f32; n * 4];
                let mut y = Targets::zeros(p.train.target(), n);
                p.train.gather(&idx, &mut x, y.as_mut()).unwrap();
                assert_eq!(y.values(), n * 4);
            }
        }
    });
}

#[test]
fn fuzz_npz_archive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.npz");
    fuzz("npz", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        let _ = redline_data::arrays::read_all(&path);
    });
}

/// Every data reader refuses a path that is not a regular file (a FIFO, a
/// link to a device, a dangling link, a loop, a folder) within seconds.
#[test]
fn special_files_are_refused_by_every_data_reader() {
    use redline_testkit::fuzz::{special_files, within};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let limit = Duration::from_secs(30);
    for name in ["t.csv", "a.npz", "a.safetensors", "input.txt"] {
        for p in special_files(&dir.path().join(name), name) {
            let what = format!("--data {}", p.display());
            let r = within(limit, &what, move || {
                prepare(&p, &DataOptions::default()).map(|_| ())
            });
            assert!(r.is_err(), "{what}");
        }
    }
    for p in special_files(&dir.path().join("npy"), "x.npy") {
        let folder = p.parent().unwrap().to_path_buf();
        let what = format!("npy folder with {}", p.display());
        let r = within(limit, &what, move || {
            redline_data::arrays::read_all(&folder).map(|_| ())
        });
        assert!(r.is_err(), "{what}");
    }
    for p in special_files(&dir.path().join("idx"), "train-images-idx3-ubyte") {
        let what = format!("IDX {}", p.display());
        let r = within(limit, &what, move || idx::read(&p).map(|_| ()));
        assert!(r.is_err(), "{what}");
    }
}

#[test]
fn fuzz_tar_shards_listed_then_read_and_decoded() {
    use redline_data::stream::{shards, worker_pool, ChannelNorm, Streamed, Transform, View};
    use redline_data::TargetsMut;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.tar");
    let pool = worker_pool(1).unwrap();
    fuzz("shard", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        let Ok(list) = shards::list(
            std::slice::from_ref(&path),
            None,
            dir.path(),
            &AtomicBool::new(false),
        ) else {
            return;
        };
        assert_eq!(list.items.len(), list.labels.len());
        let view = View {
            transform: Transform::RandomResizedCrop {
                size: 8,
                hflip: true,
            },
            norm: ChannelNorm::IMAGENET,
            channels: 3,
            side: (8, 8),
            skip_bad: false,
        };
        let n = list.items.len();
        let Ok(s) = Streamed::new(Arc::new(list), view, pool.clone(), 0) else {
            return;
        };
        for i in 0..n as u32 {
            let (mut x, mut y) = (vec![0f32; 3 * 64], vec![0u32; 1]);
            if s.gather(&[i], &mut x, TargetsMut::Classes(&mut y)).is_ok() {
                assert!(x.iter().all(|v| v.is_finite()));
            }
        }
    });
}

#[test]
fn fuzz_images_decoded_and_cropped() {
    use rand::SeedableRng;
    use redline_data::stream::{crop, decode, ChannelNorm, Transform};
    fuzz("image", |bytes| {
        let Ok(px) = decode::decode(bytes, 3, Path::new("fuzz.img")) else {
            return;
        };
        assert_eq!(px.data.len(), (px.width * px.height) as usize * 3);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for t in [
            Transform::RandomResizedCrop {
                size: 5,
                hflip: true,
            },
            Transform::ResizeCenterCrop(5),
            Transform::Resize(Some(5)),
        ] {
            let mut out = vec![0f32; 75];
            let done = crop::apply(&px, t, &ChannelNorm::IMAGENET, &mut rng, &mut out, (5, 5));
            assert!(done.is_some() && out.iter().all(|v| v.is_finite()));
            // The bytes a GPU batch takes, from the same code.
            let mut bytes = vec![0u8; 75];
            let done = crop::apply(&px, t, &ChannelNorm::IMAGENET, &mut rng, &mut bytes, (5, 5));
            assert!(done.is_some());
        }
    });
}

/// `--tokenizer FILE` (and a folder's tokenizer.json under `redline
/// sample`): a tokenizer that encodes and decodes, or an error naming the
/// file; never a panic.
#[test]
fn fuzz_tokenizer_files() {
    use redline_data::tokens::Codec;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    fuzz("tokenizer", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        match Codec::tokenizer(&path) {
            Ok(c) => {
                if let Ok(ids) = c.encode("def f(x):\n    return x é→") {
                    let _ = c.decode(&ids);
                }
            }
            Err(e) => assert!(e.to_string().contains("tokenizer.json"), "{e}"),
        }
    });
}

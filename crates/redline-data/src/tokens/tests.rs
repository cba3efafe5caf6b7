#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn u16s(ids: &[u16]) -> Vec<u8> {
    ids.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn batch(w: &TokenWindows, idx: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let t = w.input_dims()[0];
    let (mut x, mut y) = (vec![0f32; idx.len() * t], vec![0u32; idx.len() * t]);
    w.gather(idx, &mut x, TargetsMut::Classes(&mut y)).unwrap();
    (x, y)
}

/// A text file's ids are its bytes; an evaluation split's windows are its
/// consecutive blocks, each target the id after its input.
#[test]
fn text_is_its_bytes_and_targets_are_the_next_ids() {
    let dir = tempfile::tempdir().unwrap();
    let text = "héllo, wörld! the quick brown fox";
    let f = Arc::new(TokenFile::open(&file(&dir, "t.txt", text.as_bytes()), IdWidth::U8).unwrap());
    assert_eq!(f.len(), text.len());
    assert_eq!(
        f.id_bound(),
        u32::from(*text.as_bytes().iter().max().unwrap()) + 1
    );
    let w = TokenWindows::new(f.clone(), 0..f.len(), 4, 256, Windows::Consecutive).unwrap();
    assert_eq!(w.len(), (text.len() - 1) / 4);
    assert_eq!(w.target(), TargetKind::Tokens { vocab: 256, len: 4 });
    let (x, y) = batch(&w, &[1, 0]);
    let b = text.as_bytes();
    let want_x: Vec<f32> = b[4..8]
        .iter()
        .chain(&b[0..4])
        .map(|&v| f32::from(v))
        .collect();
    let want_y: Vec<u32> = b[5..9]
        .iter()
        .chain(&b[1..5])
        .map(|&v| u32::from(v))
        .collect();
    assert_eq!((x, y), (want_x, want_y));
}

/// Training windows start at seeded random offsets, anywhere the window
/// fits: the same for the same (seed, epoch, sample) whatever order gathers
/// them, another set in another epoch.
#[test]
fn random_windows_are_seeded_per_epoch_and_sample() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..5000).map(|i| (i * 7 % 1000) as u16).collect();
    let f = Arc::new(TokenFile::open(&file(&dir, "train.bin", &u16s(&ids)), IdWidth::U16).unwrap());
    assert_eq!((f.len(), f.id_bound()), (5000, 1000));
    let make =
        || TokenWindows::new(f.clone(), 100..5000, 16, 1000, Windows::Random { seed: 3 }).unwrap();
    let (a, b) = (make(), make());
    assert_eq!(a.len(), (4900 - 1) / 16);
    let starts = |w: &TokenWindows| (0..w.len()).map(|i| w.window_start(i)).collect::<Vec<_>>();
    let first = starts(&a);
    assert!(first.iter().all(|&s| (100..5000 - 16).contains(&s)));
    // Different samples, different places (not one offset for all).
    let distinct: std::collections::BTreeSet<_> = first.iter().collect();
    assert!(distinct.len() > first.len() * 9 / 10);
    // Order-free: sample 7 gathered alone or in a batch gives one window.
    let (x1, _) = batch(&a, &[7]);
    let (x2, _) = batch(&b, &[3, 7]);
    assert_eq!(x1, x2[16..].to_vec());
    let s = a.window_start(7);
    assert_eq!(
        x1,
        ids[s..s + 16]
            .iter()
            .map(|&v| f32::from(v))
            .collect::<Vec<_>>()
    );
    // Another epoch, other windows; back to the first, the same again.
    a.set_epoch(1);
    assert_ne!(starts(&a), first);
    a.set_epoch(0);
    assert_eq!(starts(&a), first);
}

#[test]
fn bad_token_files_are_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let m = TokenFile::open(&file(&dir, "odd.bin", &[1, 2, 3]), IdWidth::U16)
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("odd.bin") && m.contains("odd length") && m.contains("uint16"),
        "{m}"
    );
    // An id at the vocabulary: named with its offset.
    let f = Arc::new(
        TokenFile::open(
            &file(&dir, "big.bin", &u16s(&[1, 2, 3, 50257, 4, 60000])),
            IdWidth::U16,
        )
        .unwrap(),
    );
    let m = TokenWindows::new(f, 0..6, 2, 50257, Windows::Consecutive)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        m.contains("big.bin")
            && m.contains("token id 50257 at id offset 3 (byte 6)")
            && m.contains("largest id is 60000")
            && m.contains("vocab_size to at least 60001"),
        "{m}"
    );
    // Text shorter than a window.
    let f = Arc::new(TokenFile::open(&file(&dir, "short.txt", b"abc"), IdWidth::U8).unwrap());
    let m = TokenWindows::new(f.clone(), 0..3, 3, 256, Windows::Consecutive)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        m.contains("short.txt")
            && m.contains("holds 3 token ids")
            && m.contains("block_size + 1 = 4"),
        "{m}"
    );
    assert!(TokenWindows::new(f, 0..3, 2, 256, Windows::Consecutive).is_ok());
    // An empty file maps to no ids (and is refused as too short).
    let f = Arc::new(TokenFile::open(&file(&dir, "empty.bin", &[]), IdWidth::U16).unwrap());
    assert!(f.is_empty());
    assert!(TokenWindows::new(f, 0..0, 1, 10, Windows::Random { seed: 0 }).is_err());
    let m = TokenFile::open(&dir.path().join("missing.bin"), IdWidth::U16)
        .unwrap_err()
        .to_string();
    assert!(m.contains("missing.bin"), "{m}");
}

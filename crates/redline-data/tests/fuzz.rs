//! Fuzzing the data readers (`redline_testkit::fuzz`, corpus in
//! `testdata/fuzz/`): IDX raw and gzipped, `.npy`, and CSV through the whole
//! `--data` preparation. Every input gives data or an error, never a panic,
//! and IDX never holds more than its header declares.

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
            let cols: usize = p.train.input_dims.iter().product();
            assert_eq!(p.train.x.len(), p.train.len() * cols);
        }
    });
}

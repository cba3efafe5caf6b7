//! Fuzzing the TensorBoard event reader (`redline_testkit::fuzz`, corpus in
//! `testdata/fuzz/tfevents/`): any file gives scalars or an error, never a
//! panic, and never more scalars than the file has bytes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use redline_tensorboard::read_scalars;
use redline_testkit::fuzz::fuzz;

#[test]
fn fuzz_event_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.out.tfevents.fuzz");
    fuzz("tfevents", |bytes| {
        std::fs::write(&path, bytes).unwrap();
        if let Ok(scalars) = read_scalars(&path) {
            // Every scalar takes bytes of the file (a tag and a value at least).
            assert!(scalars.len() <= bytes.len());
        }
    });
}

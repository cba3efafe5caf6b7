//! Reads files written by `EventWriter` with TensorBoard's own
//! `EventAccumulator`, so the format is checked against the real consumer,
//! not just against this crate's reader.
//!
//! Python is found by `redline_testkit::tools::tensorboard_python`. Without
//! one the test is skipped, unless `REDLINE_REQUIRE_TOOLS=1`, where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use redline_tensorboard::{read_scalars, EventWriter};
use redline_testkit::{event_accumulator, tools};

#[test]
fn event_accumulator_reads_written_scalars() {
    let Some(python) = tools::need_tensorboard_python() else {
        return;
    };

    let tmp = tempfile::tempdir().unwrap();
    let logdir = tmp.path().join("run");
    let mut want: Vec<(String, i64, f64, f64)> = Vec::new();
    let path = {
        let mut w = EventWriter::create(&logdir).unwrap();
        for step in 0..50i64 {
            let wall = 1_700_000_000.0 + step as f64 * 0.5;
            let loss = 2.3 / (1.0 + step as f64);
            w.add_scalar("train/loss", step, loss, wall).unwrap();
            want.push(("train/loss".into(), step, f64::from(loss as f32), wall));
            if step % 10 == 9 {
                let acc = 0.1 + step as f64 / 100.0;
                w.add_scalars(step, &[("val/acc", acc), ("val/loss", -loss)], wall + 0.25)
                    .unwrap();
                want.push(("val/acc".into(), step, f64::from(acc as f32), wall + 0.25));
                want.push((
                    "val/loss".into(),
                    step,
                    f64::from(-loss as f32),
                    wall + 0.25,
                ));
            }
        }
        w.path().to_path_buf()
    }; // dropped: flushed
    assert!(path.starts_with(&logdir));

    let got: Vec<(String, i64, f64, f64)> = event_accumulator(&python, &logdir)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|s| (s.tag, s.step, s.value, s.wall_time))
        .collect();

    // EventAccumulator groups by tag (sorted here) and keeps step order within a tag.
    let mut want_by_tag = want.clone();
    want_by_tag.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    assert_eq!(got.len(), want_by_tag.len());
    assert_eq!(got, want_by_tag);
    eprintln!(
        "EventAccumulator ({}) read {} scalars over tags {:?}",
        python.display(),
        got.len(),
        {
            let mut tags: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
            tags.dedup();
            tags
        }
    );

    // And this crate's reader agrees with the same file, in file order.
    let ours: Vec<(String, i64, f64)> = read_scalars(&path).unwrap();
    let want_ours: Vec<(String, i64, f64)> =
        want.into_iter().map(|(t, s, v, _)| (t, s, v)).collect();
    assert_eq!(ours, want_ours);
}

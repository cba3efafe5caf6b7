//! Reads a log directory with TensorBoard's own `EventAccumulator`, so event
//! files are checked against the real consumer, not just this repo's reader.

use std::path::Path;
use std::process::Command;

/// Prints one line per scalar: `tag<TAB>step<TAB>repr(value)<TAB>repr(wall_time)`.
/// `repr` of a Python float round-trips, so nothing is lost on the way.
const ACCUMULATE: &str = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for s in acc.Scalars(tag):
        print(f"{tag}\t{s.step}\t{s.value!r}\t{s.wall_time!r}")
"#;

/// One scalar as TensorBoard reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The tag, e.g. `train/loss`.
    pub tag: String,
    /// The global step it was logged at.
    pub step: i64,
    /// The value; event files store `f32`, so this is an `f32` widened.
    pub value: f64,
    /// Seconds since the Unix epoch, as written.
    pub wall_time: f64,
}

/// Every scalar under `logdir`, read by TensorBoard's `EventAccumulator` run
/// with `python` (see [`crate::tools::tensorboard_python`]).
///
/// Grouped by tag in sorted order, and in step order within a tag (as the
/// accumulator keeps them). `Err` carries Python's stderr or the bad line.
pub fn event_accumulator(python: &Path, logdir: &Path) -> Result<Vec<Scalar>, String> {
    let out = Command::new(python)
        .args(["-c", ACCUMULATE])
        .arg(logdir)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{} failed on {}: {}\n{stdout}",
            python.display(),
            logdir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    stdout.lines().map(parse_line).collect()
}

/// One line of [`ACCUMULATE`]'s output.
fn parse_line(line: &str) -> Result<Scalar, String> {
    let bad = || format!("bad line from EventAccumulator: {line:?}");
    let f: Vec<&str> = line.split('\t').collect();
    let [tag, step, value, wall_time] = f[..] else {
        return Err(bad());
    };
    Ok(Scalar {
        tag: tag.to_owned(),
        step: step.parse().map_err(|_| bad())?,
        value: value.parse().map_err(|_| bad())?,
        wall_time: wall_time.parse().map_err(|_| bad())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_python_reprs() {
        let s = parse_line("train/loss\t25\t1.2538254261016846\t1700000000.5").unwrap();
        assert_eq!(
            s,
            Scalar {
                tag: "train/loss".into(),
                step: 25,
                value: f64::from(1.253_825_4_f32),
                wall_time: 1_700_000_000.5,
            }
        );
        // Python writes non-finite floats as `nan` and `inf`.
        assert!(parse_line("a\t0\tnan\t1.0").unwrap().value.is_nan());
        assert_eq!(
            parse_line("a\t0\t-inf\t1.0").unwrap().value,
            f64::NEG_INFINITY
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        for line in ["", "a\t1\t2.0", "a\t1\t2.0\t3.0\textra", "a\tx\t2.0\t3.0"] {
            let err = parse_line(line).unwrap_err();
            assert!(err.contains("bad line"), "{line:?}: {err}");
        }
    }
}

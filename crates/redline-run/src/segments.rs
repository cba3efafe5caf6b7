//! A run's segments: the process that started it and each `--resume` after
//! a stop, kept in `segments.json` so that a resumed run reports totals
//! across all of them (wall time), and when each started, from which
//! checkpoint, and how it ended, rather than its last segment's numbers
//! alone ("157 epochs in 0.04 s").
//!
//! An entry is written when its segment starts and completed at the next
//! resume: from `summary.json` when the segment wrote one (its status and
//! end time), else as `killed`, ending at the checkpoint the resume takes
//! (the work after it is run again, so it is not counted).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::folder::write_atomic;
use crate::records::Summary;

/// The file in the run folder.
pub const SEGMENTS: &str = "segments.json";

/// The largest `segments.json` read (a few hundred bytes a resume).
const MAX_BYTES: u64 = 4 << 20;

/// One process's part of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Segment {
    /// When it started (Unix seconds).
    pub started_unix: f64,
    /// The step it started from (0 for the first).
    pub from_step: u64,
    /// The checkpoint it resumed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// How it ended: `finished`, `interrupted`, `failed`, `killed`; `None`
    /// while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// When it ended (a killed one: its last checkpoint's time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_unix: Option<f64>,
    /// The step it reached (a killed one: its last checkpoint's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_step: Option<u64>,
}

impl Segment {
    /// Its seconds, once it ended (never negative: clocks may step back).
    pub fn wall_s(&self) -> Option<f64> {
        self.ended_unix.map(|e| (e - self.started_unix).max(0.0))
    }
}

/// Reads `segments.json`; empty when there is none or it does not read.
pub fn read(dir: &Path) -> Vec<Segment> {
    redline_core::files::read_input_text(&dir.join(SEGMENTS), MAX_BYTES)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// Writes `segments.json` whole.
pub fn write(dir: &Path, segments: &[Segment]) -> Result<()> {
    let text = serde_json::to_string_pretty(segments).map_err(|source| Error::Json {
        what: "writing segments.json",
        source,
    })?;
    write_atomic(&dir.join(SEGMENTS), &text)
}

/// The run's segments at a resume: those `dir` recorded, the last one
/// completed from `previous` (the summary it wrote, if any; a run from
/// before segments were kept is one segment from its start) or as killed at
/// the checkpoint (`step` written at `written_unix`), then the new one,
/// starting `now` from that checkpoint.
pub fn resumed(
    dir: &Path,
    previous: Option<&Summary>,
    (step, written_unix, checkpoint): (u64, f64, &str),
    now: f64,
) -> Vec<Segment> {
    let mut list = read(dir);
    if list.is_empty() {
        list.push(Segment {
            started_unix: previous
                .and_then(|s| s.started_unix)
                .unwrap_or(written_unix),
            ..Segment::default()
        });
    }
    if let Some(last) = list.last_mut().filter(|l| l.ended.is_none()) {
        match previous {
            Some(s) => {
                last.ended = Some(s.status.to_string());
                last.ended_unix = s
                    .other
                    .get("ended_unix")
                    .and_then(serde_json::Value::as_f64)
                    .or_else(|| s.wall_s.map(|w| last.started_unix + w))
                    .or(Some(written_unix));
                last.to_step = s.steps.or(Some(step));
            }
            None => {
                last.ended = Some("killed".into());
                last.ended_unix = Some(written_unix);
                last.to_step = Some(step);
            }
        }
    }
    list.push(Segment {
        started_unix: now,
        from_step: step,
        checkpoint: Some(checkpoint.to_string()),
        ..Segment::default()
    });
    list
}

/// The seconds of all ended segments.
pub fn total_wall_s(segments: &[Segment]) -> f64 {
    segments.iter().filter_map(Segment::wall_s).sum()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Killed, then stopped by a signal, then resumed again: each segment
    /// keeps its start, end and steps, and the total is their sum.
    #[test]
    fn segments_chain_across_kills_and_stops() {
        let t = tempfile::tempdir().unwrap();
        write(
            t.path(),
            &[Segment {
                started_unix: 100.0,
                ..Segment::default()
            }],
        )
        .unwrap();
        // Killed: the checkpoint at step 40 was written at 130.
        let two = resumed(t.path(), None, (40, 130.0, "c40"), 200.0);
        assert_eq!(two[0].ended.as_deref(), Some("killed"));
        assert_eq!((two[0].wall_s(), two[0].to_step), (Some(30.0), Some(40)));
        assert_eq!((two[1].from_step, two[1].started_unix), (40, 200.0));
        write(t.path(), &two).unwrap();
        // Interrupted, with a summary that says when it ended.
        let mut s: Summary =
            serde_json::from_str(r#"{"status":"interrupted","steps":70,"ended_unix":215.0}"#)
                .unwrap();
        let three = resumed(t.path(), Some(&s), (70, 214.0, "c70"), 300.0);
        assert_eq!(three.len(), 3);
        assert_eq!(three[1].ended.as_deref(), Some("interrupted"));
        assert_eq!(three[1].wall_s(), Some(15.0));
        assert_eq!(total_wall_s(&three), 45.0);
        // A run from before segments: one segment from its start.
        let old = tempfile::tempdir().unwrap();
        s.started_unix = Some(50.0);
        s.other.remove("ended_unix");
        s.wall_s = Some(5.0);
        let from_old = resumed(old.path(), Some(&s), (70, 60.0, "c"), 90.0);
        assert_eq!(from_old[0].wall_s(), Some(5.0));
    }
}

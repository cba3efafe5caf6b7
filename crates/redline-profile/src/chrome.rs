//! Chrome trace format (`trace.json`): one track per thread (main loop,
//! loader/prefetch, monitor), complete events (`"ph":"X"`) in microseconds.
//! Opens in Perfetto and chrome://tracing.

use std::collections::BTreeMap;

use redline_core::trace::Trace;
use serde_json::{json, Value};

/// The trace as Chrome trace JSON, with per-step op counts in `otherData`.
pub fn to_chrome_json(
    trace: &Trace,
    op_counts_per_step: &BTreeMap<&'static str, f64>,
) -> serde_json::Result<String> {
    let pid = std::process::id();
    let mut events: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": "redline train"}
    })];
    for (tid, name) in &trace.threads {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}
        }));
    }
    for s in &trace.spans {
        events.push(json!({
            "name": &*s.name, "cat": s.cat, "ph": "X", "pid": pid, "tid": s.tid,
            "ts": s.start_us, "dur": s.dur_us,
        }));
    }
    serde_json::to_string(&json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"op_counts_per_step": op_counts_per_step},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redline_core::trace::SpanRecord;
    use std::sync::Arc;

    #[test]
    fn events_name_their_tracks() {
        let mut t = Trace::default();
        t.threads.insert(1, "main loop".into());
        t.threads.insert(2, "loader/prefetch".into());
        t.spans.push(SpanRecord {
            name: Arc::from("forward"),
            cat: "step",
            tid: 1,
            start_us: 10.0,
            dur_us: 5.0,
        });
        let text = to_chrome_json(&t, &BTreeMap::new()).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let evs = v["traceEvents"].as_array().cloned().unwrap_or_default();
        assert!(evs.iter().any(|e| e["args"]["name"] == "loader/prefetch"));
        let x = evs.iter().find(|e| e["ph"] == "X");
        assert_eq!(x.map(|e| e["dur"].as_f64()), Some(Some(5.0)));
    }
}

//! `metrics.csv`: the JSON records as rows, with a column for every key seen
//! so far (as Lightning's `CSVLogger`). A record with a key the header lacks
//! (a step's metric first seen at an epoch end, a test pass) grows the header
//! and the file is rewritten; rows are few (log points and epochs), so this
//! is cheap and the file is always a complete, valid CSV.

use std::io::Write;
use std::path::{Path, PathBuf};

use redline_core::files::LineFile;

use serde_json::{Map, Value};

/// The CSV writer.
pub struct CsvLog {
    path: PathBuf,
    header: Vec<String>,
    rows: Vec<Map<String, Value>>,
    out: LineFile,
}

/// A cell: numbers and strings as they are, null and absent keys empty.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

impl CsvLog {
    /// Creates `path` with `header` as its first columns.
    pub fn create(path: &Path, header: &[&str]) -> std::io::Result<Self> {
        let mut log = Self {
            path: path.to_path_buf(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            out: LineFile::create(path)?,
        };
        log.out.append(&log.header.join(","))?;
        Ok(log)
    }

    fn render(&self, row: &Map<String, Value>) -> String {
        self.header
            .iter()
            .map(|h| cell(row.get(h)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Appends one record (an object's keys are the columns); a key not in
    /// the header adds a column and rewrites the file.
    pub fn append(&mut self, record: &Value) -> std::io::Result<()> {
        let Value::Object(row) = record else {
            return Ok(());
        };
        let new: Vec<String> = row
            .keys()
            .filter(|k| !self.header.contains(k))
            .cloned()
            .collect();
        if new.is_empty() {
            let line = self.render(row);
            self.out.append(&line)?;
            self.rows.push(row.clone());
            return Ok(());
        }
        let (rows, header) = (self.rows.len(), self.header.len());
        self.rows.push(row.clone());
        self.header.extend(new);
        // Whole or not at all: on failure the file and the header stay as they were.
        let written = redline_core::files::write_atomic_with(&self.path, |w| {
            writeln!(w, "{}", self.header.join(","))?;
            for r in &self.rows {
                writeln!(w, "{}", self.render(r))?;
            }
            Ok(())
        })
        .and_then(|()| LineFile::append_to(&self.path));
        match written {
            Ok(out) => {
                self.out = out;
                Ok(())
            }
            Err(e) => {
                self.rows.truncate(rows);
                self.header.truncate(header);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn new_keys_grow_the_header_and_keep_every_row() -> anyhow::Result<()> {
        let t = tempfile::tempdir()?;
        let p = t.path().join("m.csv");
        let mut log = CsvLog::create(&p, &["kind", "step", "loss"])?;
        log.append(&json!({"kind": "step", "step": 1, "loss": 0.5}))?;
        log.append(&json!({"kind": "epoch", "step": 1, "val_mae": 0.25, "loss": null}))?;
        log.append(&json!({"kind": "step", "step": 2, "loss": 0.25}))?;
        let text = std::fs::read_to_string(&p)?;
        assert_eq!(
            text,
            "kind,step,loss,val_mae\nstep,1,0.5,\nepoch,1,,0.25\nstep,2,0.25,\n"
        );
        Ok(())
    }
}

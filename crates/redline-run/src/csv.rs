//! `metrics.csv`: the JSON records as rows, with a column for every key seen
//! so far (as Lightning's `CSVLogger`). A record with a key the header lacks
//! (a step's metric first seen at an epoch end, a test pass) grows the header
//! and the file is rewritten; rows are few (log points and epochs), so this
//! is cheap and the file is always a complete, valid CSV.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The CSV writer.
pub struct CsvLog {
    path: PathBuf,
    header: Vec<String>,
    rows: Vec<Map<String, Value>>,
    out: BufWriter<File>,
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
            out: BufWriter::new(File::create(path)?),
        };
        log.write_line(&log.header.join(","))?;
        Ok(log)
    }

    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.out, "{line}")?;
        self.out.flush()
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
        self.rows.push(row.clone());
        if new.is_empty() {
            let line = self.render(row);
            return self.write_line(&line);
        }
        self.header.extend(new);
        let tmp = self.path.with_extension("csv.tmp");
        {
            let mut w = BufWriter::new(File::create(&tmp)?);
            writeln!(w, "{}", self.header.join(","))?;
            for r in &self.rows {
                writeln!(w, "{}", self.render(r))?;
            }
            w.flush()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        self.out = BufWriter::new(File::options().append(true).open(&self.path)?);
        Ok(())
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

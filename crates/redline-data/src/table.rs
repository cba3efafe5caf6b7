//! CSV tables of numbers: one sample per row, one column is the target.
//!
//! A first row with any non-numeric cell is the header. Every cell must be a
//! number: categories must be encoded before training, and a missing or
//! non-numeric cell is an error naming the line and the column.

use std::path::Path;

use crate::arrays::RawSplit;
use crate::error::{Error, Result};
use crate::source::RawTargets;

/// Which column holds the target: a header name, a 0-based index, or a
/// negative index from the end (`-1`, the default, is the last column).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TargetColumn {
    /// The last column.
    #[default]
    Last,
    /// By header name.
    Name(String),
    /// By position; negative counts from the end.
    Index(i64),
}

impl std::str::FromStr for TargetColumn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            return Err(Error::Config(
                "--target: give a column name or index".into(),
            ));
        }
        Ok(match s.parse::<i64>() {
            Ok(-1) => Self::Last,
            Ok(i) => Self::Index(i),
            Err(_) => Self::Name(s.to_string()),
        })
    }
}

/// A table read from CSV.
#[derive(Debug)]
pub struct Table {
    /// Column names (from the header, else `column 0`, `column 1`, ...).
    pub columns: Vec<String>,
    /// Rows of values, row-major, `rows * columns.len()`.
    pub values: Vec<f64>,
}

impl Table {
    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.values.len() / self.columns.len().max(1)
    }

    /// Reads a CSV file (a `.tsv` is tab-separated).
    pub fn read(path: &Path) -> Result<Self> {
        let invalid = |msg: String| Error::Invalid {
            path: path.to_path_buf(),
            msg,
        };
        let tab = path.extension().is_some_and(|e| e == "tsv");
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .delimiter(if tab { b'\t' } else { b',' })
            .trim(csv::Trim::All)
            .flexible(true)
            .from_path(path)
            .map_err(|e| invalid(format!("cannot be opened: {e}")))?;
        let (mut columns, mut values) = (Vec::new(), Vec::new());
        for (i, record) in reader.records().enumerate() {
            let record = record.map_err(|e| invalid(format!("not valid CSV: {e}")))?;
            let line = record.position().map_or(i as u64 + 1, |p| p.line());
            if i == 0 {
                let numeric = record.iter().all(|c| c.parse::<f64>().is_ok());
                columns = (0..record.len())
                    .map(|c| match numeric {
                        true => format!("column {c}"),
                        false => record.get(c).unwrap_or_default().to_string(),
                    })
                    .collect();
                if !numeric {
                    continue;
                }
            }
            if record.len() != columns.len() {
                return Err(invalid(format!(
                    "line {line} has {} cells; the first line has {}",
                    record.len(),
                    columns.len()
                )));
            }
            for (c, cell) in record.iter().enumerate() {
                let v = cell.parse::<f64>().ok().filter(|v| v.is_finite());
                let v = v.ok_or_else(|| {
                    invalid(format!(
                        "line {line}, column `{}`: {cell:?} is not a finite number\nHINT: Redline \
                         reads numeric columns only; encode categories and fill missing values first",
                        columns[c]
                    ))
                })?;
                values.push(v);
            }
        }
        if values.is_empty() {
            return Err(invalid("holds no rows of data".into()));
        }
        if columns.len() < 2 {
            return Err(invalid(format!(
                "has {} column; a table needs at least one feature and a target",
                columns.len()
            )));
        }
        Ok(Self { columns, values })
    }

    /// The target column's position.
    pub fn target_index(&self, target: &TargetColumn) -> Result<usize> {
        let n = self.columns.len();
        let found = match target {
            TargetColumn::Last => Some(n - 1),
            TargetColumn::Name(name) => self.columns.iter().position(|c| c == name),
            TargetColumn::Index(i) if *i < 0 => n.checked_sub(i.unsigned_abs() as usize),
            TargetColumn::Index(i) => Some(*i as usize).filter(|&i| i < n),
        };
        found.ok_or_else(|| {
            Error::Config(format!(
                "--target {target:?}: the table's columns are {:?}",
                self.columns
            ))
        })
    }

    /// Splits into features `(N, F)` and a one-value target.
    pub fn split(&self, target: &TargetColumn) -> Result<RawSplit> {
        let t = self.target_index(target)?;
        let cols = self.columns.len();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for row in self.values.chunks_exact(cols) {
            y.push(row[t]);
            x.extend(
                row.iter()
                    .enumerate()
                    .filter(|&(c, _)| c != t)
                    .map(|(_, &v)| v as f32),
            );
        }
        Ok(RawSplit {
            x,
            input_dims: vec![cols - 1],
            y: RawTargets {
                values: y,
                width: 1,
                integer: false,
                name: self.columns[t].clone(),
            },
        })
    }
}

/// Per-column standardisation `(x - mean) / std` with statistics from the
/// training rows (scikit-learn's `StandardScaler`); a constant column is only centred.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardize {
    /// Column means.
    pub mean: Vec<f32>,
    /// Column standard deviations (population), 1 where a column is constant.
    pub std: Vec<f32>,
}

impl Standardize {
    /// Fits the statistics of `x`, rows of `cols` values.
    pub fn fit(x: &[f32], cols: usize) -> Self {
        let n = (x.len() / cols.max(1)).max(1) as f64;
        let mut mean = vec![0f64; cols];
        let mut sq = vec![0f64; cols];
        for row in x.chunks_exact(cols) {
            for (c, &v) in row.iter().enumerate() {
                mean[c] += v as f64;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        for row in x.chunks_exact(cols) {
            for (c, &v) in row.iter().enumerate() {
                sq[c] += (v as f64 - mean[c]).powi(2);
            }
        }
        Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std: sq
                .iter()
                .map(|&s| (s / n).sqrt() as f32)
                .map(|s| if s > 0.0 { s } else { 1.0 })
                .collect(),
        }
    }

    /// Applies the statistics in place.
    pub fn apply(&self, x: &mut [f32]) {
        let cols = self.mean.len();
        for row in x.chunks_exact_mut(cols) {
            for (c, v) in row.iter_mut().enumerate() {
                *v = (*v - self.mean[c]) / self.std[c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> Result<(tempfile::TempDir, std::path::PathBuf)> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let p = dir.path().join("t.csv");
        std::fs::write(&p, text).map_err(|e| Error::Config(e.to_string()))?;
        Ok((dir, p))
    }

    #[test]
    fn header_target_by_name_index_and_default() -> Result<()> {
        let (_d, p) = write("a,b,price\n1,2,3\n4,5,6\n")?;
        let t = Table::read(&p)?;
        assert_eq!(t.columns, vec!["a", "b", "price"]);
        let s = t.split(&TargetColumn::Last)?;
        assert_eq!(
            (s.x, s.y.values),
            (vec![1.0, 2.0, 4.0, 5.0], vec![3.0, 6.0])
        );
        let s = t.split(&"a".parse()?)?;
        assert_eq!(
            (s.x, s.y.values),
            (vec![2.0, 3.0, 5.0, 6.0], vec![1.0, 4.0])
        );
        assert_eq!(t.split(&"1".parse()?)?.y.values, vec![2.0, 5.0]);
        assert_eq!(t.split(&"-3".parse()?)?.y.values, vec![1.0, 4.0]);
        let m = t.split(&"cost".parse()?).err().map(|e| e.to_string());
        assert!(m.is_some_and(|m| m.contains("columns are [\"a\", \"b\", \"price\"]")));
        Ok(())
    }

    #[test]
    fn headerless_tables_and_bad_cells() -> Result<()> {
        let (_d, p) = write("1,2\n3,4\n")?;
        assert_eq!(Table::read(&p)?.rows(), 2);
        let (_d, p) = write("x,y\n1,2\n3,male\n")?;
        let m = Table::read(&p)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("line 3, column `y`: \"male\" is not a finite number"),
            "{m}"
        );
        let (_d, p) = write("x,y\n1,2\n3\n")?;
        let m = Table::read(&p)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            m.contains("line 3 has 1 cells; the first line has 2"),
            "{m}"
        );
        let (_d, p) = write("x,y\n")?;
        let m = Table::read(&p)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(m.contains("no rows"), "{m}");
        Ok(())
    }

    #[test]
    fn standardize_uses_population_std_and_leaves_constants_centred() {
        let x = vec![1.0, 5.0, 3.0, 5.0];
        let s = Standardize::fit(&x, 2);
        assert_eq!(
            (s.mean.clone(), s.std.clone()),
            (vec![2.0, 5.0], vec![1.0, 1.0])
        );
        let mut y = x;
        s.apply(&mut y);
        assert_eq!(y, vec![-1.0, 0.0, 1.0, 0.0]);
    }
}

//! CSV tables of numbers: one sample per row, one column is the target.
//!
//! The first row is the header when any cell is not a number or its numbers
//! are the column indices (`--header auto`; `yes`/`no` decide). Every cell
//! must be a number within fp32's range: categories must be encoded before
//! training, and a missing, non-numeric or out-of-range cell is an error
//! naming the line and the column. Cells are read one at a time (`csv-core`),
//! so memory is the values kept: 4 bytes a cell, at most 2x the file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether the first row of a table holds column names: `--header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Header {
    /// Decided from the row (and said on the startup line): names when any
    /// cell is not a number, or when the cells are the column indices
    /// `0,1,2,...` for three columns or more (what pandas writes for unnamed
    /// columns).
    #[default]
    Auto,
    /// The first row is column names.
    Yes,
    /// The first row is data.
    No,
}

impl std::str::FromStr for Header {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "yes" | "true" | "1" => Ok(Self::Yes),
            "no" | "false" | "0" => Ok(Self::No),
            _ => Err(Error::Config(format!(
                "--header {s:?}: expected `auto`, `yes` or `no`"
            ))),
        }
    }
}

/// The longest cell read (a number or a column name).
const MAX_CELL: usize = 1 << 16;

/// Rows between two looks at the stop flag.
const STOP_EVERY: usize = 4096;

/// Cells of a CSV file, one at a time, through `csv-core`: no record is held,
/// so memory is the values kept, not the text's structure.
struct Cells {
    path: PathBuf,
    rdr: csv_core::Reader,
    input: BufReader<File>,
    cell: Vec<u8>,
    len: usize,
}

impl Cells {
    fn open(path: &Path) -> Result<Self> {
        // A regular file only: /dev/zero or a FIFO would never end.
        let (file, _) =
            redline_core::files::open_input(path, u64::MAX).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
                hint: "--data takes a regular .csv/.tsv file".into(),
            })?;
        let tab = path.extension().is_some_and(|e| e == "tsv");
        Ok(Self {
            path: path.to_path_buf(),
            rdr: csv_core::ReaderBuilder::new()
                .delimiter(if tab { b'\t' } else { b',' })
                .build(),
            input: BufReader::with_capacity(1 << 16, file),
            cell: vec![0; 256],
            len: 0,
        })
    }

    /// The line being read (1-based).
    fn line(&self) -> u64 {
        self.rdr.line()
    }

    /// The next cell, trimmed, and whether it ends its row; `None` at the end.
    fn next(&mut self) -> Result<Option<(&[u8], bool)>> {
        self.len = 0;
        loop {
            let buf = self.input.fill_buf().map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
                hint: "the file could not be read to its end".into(),
            })?;
            let (res, read, wrote) = self.rdr.read_field(buf, &mut self.cell[self.len..]);
            self.input.consume(read);
            self.len += wrote;
            match res {
                csv_core::ReadFieldResult::InputEmpty => {}
                csv_core::ReadFieldResult::OutputFull => {
                    if self.cell.len() >= MAX_CELL {
                        return Err(Error::Invalid {
                            path: self.path.clone(),
                            msg: format!(
                                "line {}: a cell longer than {MAX_CELL} bytes (a quote left open?)",
                                self.line()
                            ),
                        });
                    }
                    let grown = self.cell.len() * 2;
                    self.cell.resize(grown, 0);
                }
                csv_core::ReadFieldResult::Field { record_end } => {
                    return Ok(Some((self.cell[..self.len].trim_ascii(), record_end)))
                }
                csv_core::ReadFieldResult::End => return Ok(None),
            }
        }
    }
}

/// A cell as a number (`None` when it is not one).
fn number(cell: &[u8]) -> Option<f64> {
    std::str::from_utf8(cell).ok()?.parse::<f64>().ok()
}

/// What the first row of a table is.
struct FirstRow {
    /// Cells in the row.
    columns: usize,
    /// Every cell is a number.
    numeric: bool,
    /// The cells are `0,1,...,n-1` (n >= 3): the column indices pandas writes.
    indices: bool,
}

/// Reads the first row without keeping it.
fn first_row(path: &Path) -> Result<FirstRow> {
    let mut cells = Cells::open(path)?;
    let (mut columns, mut numeric, mut from0) = (0usize, true, true);
    while let Some((cell, end)) = cells.next()? {
        let v = number(cell);
        numeric &= v.is_some();
        from0 &= v == Some(columns as f64);
        columns += 1;
        if end {
            break;
        }
    }
    if columns == 0 {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            msg: "is empty: a table needs rows of numbers".into(),
        });
    }
    Ok(FirstRow {
        columns,
        numeric,
        // Three or more: a data row `0,1` (a feature 0, a label 1) is common.
        indices: numeric && from0 && columns >= 3,
    })
}

/// Column names, packed: one buffer and the end of each name.
#[derive(Debug, Default)]
struct Names {
    text: String,
    ends: Vec<usize>,
}

impl Names {
    fn get(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { *self.ends.get(i - 1)? };
        self.text.get(start..*self.ends.get(i)?)
    }
}

/// A table's layout: the columns, their names and where its rows begin.
#[derive(Debug)]
pub struct Layout {
    /// Columns per row.
    pub columns: usize,
    /// The first row is names.
    pub header: bool,
    /// Why the header was taken as it was, for the startup line.
    pub note: String,
    names: Names,
}

impl Layout {
    /// Reads the first row of `path` and decides whether it is names (`header`).
    pub fn read(path: &Path, header: Header) -> Result<Self> {
        let first = first_row(path)?;
        let (is_header, note) = match header {
            Header::Yes => (true, "header: the first row (--header yes)".to_string()),
            Header::No => (
                false,
                "header: none, the first row is data (--header no)".into(),
            ),
            Header::Auto if !first.numeric => {
                (true, "header: the first row (auto: it holds names)".into())
            }
            Header::Auto if first.indices => (
                true,
                "header: the first row (auto: its numbers are the column indices; --header no \
                 reads it as data)"
                    .into(),
            ),
            Header::Auto => (
                false,
                "header: none (auto: the first row is numbers; --header yes reads it as names)"
                    .into(),
            ),
        };
        let mut names = Names::default();
        if is_header {
            let mut cells = Cells::open(path)?;
            while let Some((cell, end)) = cells.next()? {
                names.text.push_str(&String::from_utf8_lossy(cell));
                names.ends.push(names.text.len());
                if end {
                    break;
                }
            }
        }
        let layout = Self {
            columns: first.columns,
            header: is_header,
            note,
            names,
        };
        layout.check_names(path)?;
        Ok(layout)
    }

    /// A column's name as the header has it, else `column N`.
    pub fn name(&self, c: usize) -> String {
        match self.names.get(c) {
            Some(n) => n.to_string(),
            None => format!("column {c}"),
        }
    }

    /// Refuses a header naming two columns alike: `--target NAME` and the
    /// messages would be ambiguous.
    fn check_names(&self, path: &Path) -> Result<()> {
        if !self.header {
            return Ok(());
        }
        let mut order: Vec<usize> = (0..self.columns).collect();
        order.sort_by(|&a, &b| self.names.get(a).cmp(&self.names.get(b)));
        if let Some(w) = order
            .windows(2)
            .find(|w| self.names.get(w[0]) == self.names.get(w[1]))
        {
            let (a, b) = (w[0].min(w[1]), w[0].max(w[1]));
            return Err(Error::Invalid {
                path: path.to_path_buf(),
                msg: format!(
                    "columns {a} and {b} are both named `{}`\nHINT: give every column its own \
                     name (or --header no to read the first row as data)",
                    self.name(a)
                ),
            });
        }
        Ok(())
    }

    /// The target column's position.
    pub fn target_index(&self, target: &TargetColumn) -> Result<usize> {
        let n = self.columns;
        let found = match target {
            TargetColumn::Last => n.checked_sub(1),
            TargetColumn::Name(name) => (0..n).find(|&c| self.names.get(c) == Some(name)),
            TargetColumn::Index(i) if *i < 0 => n.checked_sub(i.unsigned_abs() as usize),
            TargetColumn::Index(i) => usize::try_from(*i).ok().filter(|&i| i < n),
        };
        found.ok_or_else(|| {
            let shown: Vec<String> = (0..n.min(20)).map(|c| self.name(c)).collect();
            Error::Config(format!(
                "--target {target}: no such column; the table's {n} columns are {shown:?}{}",
                if n > 20 { " ..." } else { "" }
            ))
        })
    }
}

impl std::fmt::Display for TargetColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Last => f.write_str("-1"),
            Self::Name(n) => f.write_str(n),
            Self::Index(i) => write!(f, "{i}"),
        }
    }
}

/// The largest magnitude a value may have: fp32's range. Beyond it the value
/// would become infinite and the loss NaN, blamed on the learning rate.
const MAX_VALUE: f64 = f32::MAX as f64;

/// Reads a CSV table (a `.tsv` is tab-separated) with `layout` into features
/// `(N, F)` and a one-value target, checking every cell. Looks at `stop`
/// every few thousand rows and returns [`Error::Interrupted`] once it is set.
pub fn read(
    path: &Path,
    layout: &Layout,
    target: &TargetColumn,
    stop: &AtomicBool,
) -> Result<RawSplit> {
    let invalid = |msg: String| Error::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let cols = layout.columns;
    if cols < 2 {
        return Err(invalid(format!(
            "has {cols} column; a table needs at least one feature and a target"
        )));
    }
    let t = layout.target_index(target)?;
    let mut cells = Cells::open(path)?;
    if layout.header {
        while let Some((_, end)) = cells.next()? {
            if end {
                break;
            }
        }
    }
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let (mut c, mut whole, mut rows) = (0usize, true, 0usize);
    loop {
        let line = cells.line();
        let Some((cell, end)) = cells.next()? else {
            break;
        };
        if c >= cols {
            return Err(invalid(format!(
                "line {line} has more than {cols} cells, the first line's count"
            )));
        }
        let v = number(cell).filter(|v| v.is_finite()).ok_or_else(|| {
            invalid(format!(
                "line {line}, column `{}`: {:?} is not a finite number\nHINT: Redline reads \
                 numeric columns only; encode categories and fill missing values first",
                layout.name(c),
                String::from_utf8_lossy(cell)
            ))
        })?;
        if v.abs() > MAX_VALUE {
            return Err(invalid(format!(
                "line {line}, column `{}`: {v:e} is beyond fp32's range (±3.4e38), where \
                 training computes\nHINT: rescale the column (e.g. to its logarithm)",
                layout.name(c)
            )));
        }
        if c == t {
            whole &= v.fract() == 0.0;
            y.push(v as f32);
        } else {
            x.push(v as f32);
        }
        c += 1;
        if end {
            if c != cols {
                return Err(invalid(format!(
                    "line {line} has {c} cells; the first line has {cols}"
                )));
            }
            c = 0;
            rows += 1;
            if rows.is_multiple_of(STOP_EVERY) && stop.load(Ordering::Relaxed) {
                return Err(Error::Interrupted);
            }
        }
    }
    if y.is_empty() {
        return Err(invalid("holds no rows of data".into()));
    }
    Ok(RawSplit {
        x,
        input_dims: vec![cols - 1],
        y: RawTargets {
            values: y,
            width: 1,
            integer: false,
            whole,
            name: layout.name(t),
        },
    })
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

    fn table(text: &str, header: Header, target: &str) -> Result<RawSplit> {
        let (_d, p) = write(text)?;
        let layout = Layout::read(&p, header)?;
        read(&p, &layout, &target.parse()?, &AtomicBool::new(false))
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn header_target_by_name_index_and_default() -> Result<()> {
        let s = table("a,b,price\n1,2,3\n4,5,6\n", Header::Auto, "-1")?;
        assert_eq!(
            (s.x, s.y.values, s.y.name),
            (vec![1.0, 2.0, 4.0, 5.0], vec![3.0, 6.0], "price".into())
        );
        let s = table("a,b,price\n1,2,3\n4,5,6\n", Header::Auto, "a")?;
        assert_eq!(
            (s.x, s.y.values),
            (vec![2.0, 3.0, 5.0, 6.0], vec![1.0, 4.0])
        );
        assert_eq!(
            table("a,b,c\n1,2,3\n4,5,6\n", Header::Auto, "1")?.y.values,
            vec![2.0, 5.0]
        );
        assert_eq!(
            table("a,b,c\n1,2,3\n4,5,6\n", Header::Auto, "-3")?.y.values,
            vec![1.0, 4.0]
        );
        // The column as the user wrote it, and the table's.
        let m = err(table("a,b,price\n1,2,3\n", Header::Auto, "cost"));
        assert!(
            m.contains("--target cost: no such column") && m.contains("[\"a\", \"b\", \"price\"]"),
            "{m}"
        );
        let m = err(table("a,b,price\n1,2,3\n", Header::Auto, "7"));
        assert!(m.contains("--target 7: no such column"), "{m}");
        Ok(())
    }

    #[test]
    fn a_header_of_column_indices_is_a_header_and_the_choice_is_said() -> Result<()> {
        // What pandas writes for a frame with unnamed columns.
        let s = table("0,1,2\n5,6,1\n7,8,0\n", Header::Auto, "-1")?;
        assert_eq!((s.y.values, s.y.name), (vec![1.0, 0.0], "2".into()));
        // Two columns `0,1` is as likely a data row.
        assert_eq!(
            table("0,1\n5,6\n", Header::Auto, "-1")?.y.values,
            vec![1.0, 6.0]
        );
        // Other numbers are data, and --header decides either way.
        assert_eq!(
            table("3,1,2\n5,6,1\n", Header::Auto, "-1")?.y.values,
            vec![2.0, 1.0]
        );
        assert_eq!(
            table("0,1,2\n5,6,1\n", Header::No, "-1")?.y.values,
            vec![2.0, 1.0]
        );
        assert_eq!(
            table("3,1,2\n5,6,1\n", Header::Yes, "-1")?.y.values,
            vec![1.0]
        );
        let (_d, p) = write("0,1,2\n5,6,1\n")?;
        assert!(Layout::read(&p, Header::Auto)?
            .note
            .contains("column indices"));
        Ok(())
    }

    #[test]
    fn duplicate_names_and_values_beyond_fp32_are_refused_by_line_and_column() {
        let m = err(table("a,b,a\n1,2,3\n", Header::Auto, "-1"));
        assert!(m.contains("columns 0 and 2 are both named `a`"), "{m}");
        let m = err(table("a,b\n1,2\n1e308,3\n", Header::Auto, "-1"));
        assert!(
            m.contains("line 3, column `a`: 1e308 is beyond fp32's range"),
            "{m}"
        );
        let m = err(table("a,b\n1,nan\n", Header::Auto, "-1"));
        assert!(
            m.contains("line 2, column `b`: \"nan\" is not a finite number"),
            "{m}"
        );
    }

    #[test]
    fn quoted_cells_blank_lines_and_a_stop() -> Result<()> {
        let s = table("\"a, the first\",b\n\n\" 1 \",2\n", Header::Auto, "-1")?;
        assert_eq!((s.x, s.y.values), (vec![1.0], vec![2.0]));
        let rows = "1,2\n".repeat(2 * STOP_EVERY);
        let (_d, p) = write(&rows)?;
        let layout = Layout::read(&p, Header::Auto)?;
        let stopped = read(&p, &layout, &TargetColumn::Last, &AtomicBool::new(true));
        assert!(matches!(stopped, Err(Error::Interrupted)));
        Ok(())
    }

    #[test]
    fn headerless_tables_and_bad_cells() -> Result<()> {
        assert_eq!(table("1,2\n3,4\n", Header::Auto, "-1")?.y.values.len(), 2);
        let m = err(table("x,y\n1,2\n3,male\n", Header::Auto, "-1"));
        assert!(
            m.contains("line 3, column `y`: \"male\" is not a finite number"),
            "{m}"
        );
        let m = err(table("x,y\n1,2\n3\n", Header::Auto, "-1"));
        assert!(
            m.contains("line 3 has 1 cells; the first line has 2"),
            "{m}"
        );
        let m = err(table("x,y\n1,2,3\n", Header::Auto, "-1"));
        assert!(m.contains("line 2 has more than 2 cells"), "{m}");
        let m = err(table("x,y\n", Header::Auto, "-1"));
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

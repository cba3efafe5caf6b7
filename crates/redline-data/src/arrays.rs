//! Named arrays from NumPy and safetensors files: an `.npz` archive, a
//! `.safetensors` file, or a folder of `.npy` files (the name is the stem).
//!
//! The arrays are `x_train`, `y_train` and optionally `x_test`, `y_test`
//! (the layout of Keras' `mnist.npz`), or just `x` and `y`. Byte images
//! (`u8`) are normalised as pixels and a `(N, H, W)` array gains a channel
//! axis; other inputs are used as they are. Integer targets are class ids,
//! float targets are values.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::mnist::{check_norm, Normalize};
use crate::source::RawTargets;

/// One split's inputs and targets as read from the file, before the task is chosen.
#[derive(Debug)]
pub struct RawSplit {
    /// Inputs, `n * row` values.
    pub x: Vec<f32>,
    /// Dimensions of one input.
    pub input_dims: Vec<usize>,
    /// Targets as read.
    pub y: RawTargets,
}

fn invalid(path: &Path, msg: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Reads every array of `path` (an `.npz`, a `.safetensors` or a folder of `.npy`).
pub fn read_all(path: &Path) -> Result<HashMap<String, Tensor>> {
    let candle = |e: candle_core::Error| invalid(path, format!("cannot be read: {e}"));
    if path.is_dir() {
        let mut out = HashMap::new();
        let entries = std::fs::read_dir(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
            hint: "check the folder's permissions".into(),
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "npy") {
                check_npy(&p)?;
                let name = p.file_stem().map(|s| s.to_string_lossy().into_owned());
                let t = Tensor::read_npy(&p)
                    .map_err(|e| invalid(&p, format!("cannot be read as .npy: {e}")))?;
                out.insert(name.unwrap_or_default(), t);
            }
        }
        Ok(out)
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        candle_core::safetensors::load(path, &Device::Cpu).map_err(candle)
    } else {
        Ok(Tensor::read_npz(path)
            .map_err(candle)?
            .into_iter()
            .collect())
    }
}

/// Refuses an `.npy` whose header declares more data than the file holds,
/// before anything is allocated from that header.
fn check_npy(path: &Path) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
        hint: "check the file's permissions".into(),
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut head = [0u8; 10];
    f.read_exact(&mut head).map_err(|_| {
        invalid(
            path,
            format!("{size} bytes is too short for an .npy header"),
        )
    })?;
    if &head[..6] != b"\x93NUMPY" {
        return Err(invalid(path, "not an .npy file (no \\x93NUMPY magic)"));
    }
    let (len, skip) = if head[6] == 1 {
        (u16::from_le_bytes([head[8], head[9]]) as u64, 10)
    } else {
        let mut more = [0u8; 2];
        f.read_exact(&mut more)
            .map_err(|_| invalid(path, "truncated .npy header"))?;
        (
            u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as u64,
            12,
        )
    };
    if len > 1 << 20 || skip + len > size {
        return Err(invalid(
            path,
            format!("header length {len} does not fit the file's {size} bytes"),
        ));
    }
    let mut text = vec![0u8; len as usize];
    f.read_exact(&mut text)
        .map_err(|_| invalid(path, "truncated .npy header"))?;
    let text = String::from_utf8_lossy(&text);
    // Read exactly as candle's reader will (its parser, last key wins), so the
    // size checked here is the size it allocates.
    let (width, dims) = npy_header(&text)
        .ok_or_else(|| invalid(path, format!("unreadable .npy header: {text:?}")))?;
    let need = dims
        .iter()
        .try_fold(width, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(path, format!("shape {dims:?} overflows")))?;
    let data = size.saturating_sub(skip + len);
    if need > data {
        return Err(invalid(
            path,
            format!(
                "the header declares shape {dims:?} ({need} bytes) but the file holds {data} bytes \
                 of data (truncated?)"
            ),
        ));
    }
    Ok(())
}

/// The element width and shape an `.npy` header declares, parsed as candle
/// parses it: the dict split at top-level commas, each part exactly
/// `key: value`, quotes and blanks trimmed, the last of a repeated key wins.
/// `None` where candle would refuse the header.
fn npy_header(text: &str) -> Option<(u64, Vec<u64>)> {
    let body = text.trim_matches(|c: char| c == '{' || c == '}' || c == ',' || c.is_whitespace());
    let mut parts = Vec::new();
    let (mut start, mut depth) = (0usize, 0i64);
    for (i, c) in body.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    let mut map = HashMap::new();
    for part in parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let [key, value] = part.split(':').collect::<Vec<_>>()[..] else {
            return None;
        };
        let trim = |s: &str| {
            s.trim_matches(|c: char| c == '\'' || c.is_whitespace())
                .to_string()
        };
        map.insert(trim(key), trim(value));
    }
    let descr = map.get("descr")?;
    let width = match descr.trim_matches(|c: char| c == '=' || c == '<' || c == '|') {
        "B" | "u1" | "?" | "b1" => 1,
        "e" | "f2" | "h" | "i2" => 2,
        "f" | "f4" | "i" | "i4" | "I" | "u4" => 4,
        "d" | "f8" | "q" | "i8" => 8,
        _ => return None,
    };
    let shape = map
        .get("shape")?
        .trim_matches(|c: char| c == '(' || c == ')' || c == ',')
        .to_string();
    let dims = if shape.is_empty() {
        Vec::new()
    } else {
        shape
            .split(',')
            .map(|v| v.trim().parse::<u64>().ok())
            .collect::<Option<Vec<u64>>>()?
    };
    Some((width, dims))
}

/// Inputs as f32: bytes are pixels (normalised), others are converted as they are.
fn inputs(path: &Path, name: &str, t: &Tensor, norm: Normalize) -> Result<(Vec<f32>, Vec<usize>)> {
    let dims = t.dims().to_vec();
    let Some((&_, rest)) = dims.split_first() else {
        return Err(invalid(
            path,
            format!("`{name}` is a scalar; expected (N, ...)"),
        ));
    };
    let mut input_dims = if rest.is_empty() {
        vec![1]
    } else {
        rest.to_vec()
    };
    let conv = |e: candle_core::Error| invalid(path, format!("`{name}`: {e}"));
    let x = if t.dtype() == DType::U8 {
        check_norm(norm)?;
        // Greyscale images (N, H, W) get the channel axis convolutions expect.
        if input_dims.len() == 2 {
            input_dims.insert(0, 1);
        }
        let bytes = t
            .flatten_all()
            .and_then(|t| t.to_vec1::<u8>())
            .map_err(conv)?;
        crate::mnist::normalise(&bytes, norm)
    } else {
        t.flatten_all()
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(conv)?
    };
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(invalid(
            path,
            format!("`{name}` holds a non-finite value at flat index {i}"),
        ));
    }
    Ok((x, input_dims))
}

fn targets(path: &Path, name: &str, t: &Tensor) -> Result<RawTargets> {
    let width = match t.dims() {
        [_] => 1,
        [_, w] => *w,
        d => {
            return Err(invalid(
                path,
                format!("`{name}` has shape {d:?}; targets must be (N,) or (N, W)"),
            ))
        }
    };
    let integer = !t.dtype().is_float();
    let values = t
        .flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .map_err(|e| invalid(path, format!("`{name}`: {e}")))?;
    Ok(RawTargets {
        values,
        width,
        integer,
        name: name.to_string(),
    })
}

/// The train and (when present) test splits of a tensor file.
pub fn load(path: &Path, norm: Normalize) -> Result<(RawSplit, Option<RawSplit>)> {
    let arrays = read_all(path)?;
    let split = |x: &str, y: &str| -> Result<Option<RawSplit>> {
        let (Some(xt), Some(yt)) = (arrays.get(x), arrays.get(y)) else {
            return Ok(None);
        };
        let (xs, input_dims) = inputs(path, x, xt, norm)?;
        let ys = targets(path, y, yt)?;
        let n = xt.dims().first().copied().unwrap_or(0);
        if ys.values.len() != n * ys.width || n == 0 {
            return Err(invalid(
                path,
                format!(
                    "`{x}` holds {n} samples but `{y}` has shape {:?}",
                    yt.dims()
                ),
            ));
        }
        Ok(Some(RawSplit {
            x: xs,
            input_dims,
            y: ys,
        }))
    };
    let train = match split("x_train", "y_train")? {
        Some(s) => s,
        None => split("x", "y")?.ok_or_else(|| {
            let mut names: Vec<&String> = arrays.keys().collect();
            names.sort();
            invalid(
                path,
                format!(
                    "found arrays {names:?}; expected `x_train` and `y_train` (and optionally \
                     `x_test`, `y_test`) or `x` and `y`"
                ),
            )
        })?,
    };
    Ok((train, split("x_test", "y_test")?))
}

/// Where a folder of `.npy` files is recognised: it holds `x.npy` or `x_train.npy`.
pub fn is_npy_dir(dir: &Path) -> bool {
    dir.join("x.npy").is_file() || dir.join("x_train.npy").is_file()
}

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
    if !path.is_dir() {
        // A regular file only: a device or FIFO has no end to read or map.
        regular(path)?;
    }
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
        read_npz(path)
    }
}

/// Opens `path` when it is a regular file (links followed).
fn regular(path: &Path) -> Result<(std::fs::File, u64)> {
    redline_core::files::open_input(path, u64::MAX).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
        hint: "--data takes regular files (not devices, FIFOs or sockets)".into(),
    })
}

/// Refuses an `.npy` whose header declares more data than the file holds,
/// or a type Redline does not read, before anything is allocated from that
/// header.
fn check_npy(path: &Path) -> Result<()> {
    let (f, size) = regular(path)?;
    check_npy_header(f, size).map_err(|why| invalid(path, why))
}

/// Checks an `.npy` stream of `size` bytes (a file, or an `.npz` member):
/// magic, header, dtype, and that the data the header declares is there.
fn check_npy_header(mut f: impl Read, size: u64) -> std::result::Result<(), String> {
    let mut head = [0u8; 10];
    f.read_exact(&mut head)
        .map_err(|_| format!("{size} bytes is too short for an .npy header"))?;
    if &head[..6] != b"\x93NUMPY" {
        return Err("not an .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, skip) = if head[6] == 1 {
        (u16::from_le_bytes([head[8], head[9]]) as u64, 10)
    } else {
        let mut more = [0u8; 2];
        f.read_exact(&mut more)
            .map_err(|_| "truncated .npy header".to_string())?;
        (
            u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as u64,
            12,
        )
    };
    if len > 1 << 20 || skip + len > size {
        return Err(format!(
            "header length {len} does not fit the file's {size} bytes"
        ));
    }
    let mut text = vec![0u8; len as usize];
    f.read_exact(&mut text)
        .map_err(|_| "truncated .npy header".to_string())?;
    let text = String::from_utf8_lossy(&text);
    // Read exactly as candle's reader will (its parser, last key wins), so the
    // size checked here is the size it allocates.
    let (width, dims) = npy_header(&text)?;
    let need = dims
        .iter()
        .try_fold(width, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {dims:?} overflows"))?;
    let data = size.saturating_sub(skip + len);
    if need > data {
        return Err(format!(
            "the header declares shape {dims:?} ({need} bytes) but the file holds {data} bytes \
             of data (truncated?)"
        ));
    }
    Ok(())
}

/// Reads every array of an `.npz`, checking each member's header against the
/// bytes it holds first (a member shorter than its header is named, and
/// nothing is allocated from a header that lies).
fn read_npz(path: &Path) -> Result<HashMap<String, Tensor>> {
    let (file, _) = regular(path)?;
    let zip_err = |e: zip::result::ZipError| invalid(path, format!("not a readable .npz: {e}"));
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(zip_err)?;
    for i in 0..zip.len() {
        let member = zip.by_index(i).map_err(zip_err)?;
        let name = member.name().map_err(zip_err)?.to_string();
        let size = member.size();
        check_npy_header(member, size).map_err(|why| {
            invalid(
                path,
                format!("array `{}`: {why}", name.trim_end_matches(".npy")),
            )
        })?;
    }
    let npz = candle_core::npy::NpzTensors::new(path)
        .map_err(|e| invalid(path, format!("cannot be read: {e}")))?;
    let mut out = HashMap::new();
    for name in npz.names() {
        let t = npz
            .get(name)
            .map_err(|e| invalid(path, format!("array `{name}`: {e}")))?;
        if let Some(t) = t {
            out.insert(name.clone(), t);
        }
    }
    Ok(out)
}

/// The element width and shape an `.npy` header declares, parsed as candle
/// parses it: the dict split at top-level commas, each part exactly
/// `key: value`, quotes and blanks trimmed, the last of a repeated key wins.
/// An error says why where candle would refuse the header.
fn npy_header(text: &str) -> std::result::Result<(u64, Vec<u64>), String> {
    let unreadable = || format!("unreadable .npy header: {text:?}");
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
            return Err(unreadable());
        };
        let trim = |s: &str| {
            s.trim_matches(|c: char| c == '\'' || c.is_whitespace())
                .to_string()
        };
        map.insert(trim(key), trim(value));
    }
    let descr = map.get("descr").ok_or_else(unreadable)?;
    let width = match descr.trim_matches(|c: char| c == '=' || c == '<' || c == '|') {
        "B" | "u1" | "?" | "b1" => 1,
        "e" | "f2" | "h" | "i2" => 2,
        "f" | "f4" | "i" | "i4" | "I" | "u4" => 4,
        "d" | "f8" | "q" | "i8" => 8,
        other => {
            return Err(format!(
                "its dtype `{other}` is not one Redline reads (bool, uint8, int16/32/64, uint32, \
                 float16/32/64, little-endian)\nHINT: convert it with numpy, e.g. \
                 `np.save(f, a.astype(np.float32))`"
            ))
        }
    };
    let shape = map
        .get("shape")
        .ok_or_else(unreadable)?
        .trim_matches(|c: char| c == '(' || c == ')' || c == ',')
        .to_string();
    let dims = if shape.is_empty() {
        Vec::new()
    } else {
        shape
            .split(',')
            .map(|v| v.trim().parse::<u64>().ok())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(unreadable)?
    };
    Ok((width, dims))
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
    let wide = t
        .flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .map_err(|e| invalid(path, format!("`{name}`: {e}")))?;
    // Checked now, naming the array: a NaN target would otherwise surface as
    // a NaN loss blamed on the learning rate.
    if let Some(i) = wide
        .iter()
        .position(|v| !v.is_finite() || v.abs() > f32::MAX as f64)
    {
        return Err(invalid(
            path,
            format!(
                "`{name}` holds {} at flat index {i}, not a finite fp32 value
HINT: drop or fill                  those samples, or rescale the targets",
                wide[i]
            ),
        ));
    }
    Ok(RawTargets {
        whole: wide.iter().all(|v| v.fract() == 0.0),
        values: wide.iter().map(|&v| v as f32).collect(),
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
    // Half a test split is a mistake, not "no test split".
    match (arrays.contains_key("x_test"), arrays.contains_key("y_test")) {
        (true, false) | (false, true) => {
            let (has, lacks) = match arrays.contains_key("x_test") {
                true => ("x_test", "y_test"),
                false => ("y_test", "x_test"),
            };
            Err(invalid(
                path,
                format!(
                    "holds `{has}` but no `{lacks}`: a test split needs both
HINT: add                      `{lacks}`, or remove `{has}` to train without a test split"
                ),
            ))
        }
        _ => Ok((train, split("x_test", "y_test")?)),
    }
}

/// Where a folder of `.npy` files is recognised: it holds `x.npy` or `x_train.npy`.
pub fn is_npy_dir(dir: &Path) -> bool {
    // `exists`, not `is_file`: an `x.npy` that is a device is then named as one.
    dir.join("x.npy").exists() || dir.join("x_train.npy").exists()
}

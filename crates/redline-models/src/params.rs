//! Named parameters in PyTorch `state_dict()` order, and their safetensors I/O.
//!
//! Files use PyTorch's names and shapes, so `safetensors.torch.save_file(
//! model.state_dict(), f)` loads here and our files load into the same module.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{Tensor, Var};

use crate::error::{Error, Result};

/// The trainable parameters of a model.
#[derive(Debug, Clone, Default)]
pub struct Params {
    entries: Vec<(String, Var)>,
}

impl Params {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a parameter; names must be unique.
    pub fn push(&mut self, name: impl Into<String>, var: Var) -> Result<()> {
        let name = name.into();
        if self.get(&name).is_some() {
            return Err(Error::Config(format!(
                "parameter {name:?} registered twice"
            )));
        }
        self.entries.push((name, var));
        Ok(())
    }

    /// Number of parameter tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the store is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total number of scalar parameters.
    pub fn numel(&self) -> usize {
        self.entries.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Var> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// `(name, var)` pairs in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// The variables in order (what optimizers update).
    pub fn vars(&self) -> Vec<Var> {
        self.entries.iter().map(|(_, v)| v.clone()).collect()
    }

    /// A name -> tensor map of the current values.
    pub fn to_map(&self) -> HashMap<String, Tensor> {
        self.entries
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// Overwrites every parameter from `tensors`, which must hold exactly these
    /// names with these shapes; otherwise nothing is changed and the error lists
    /// every missing, unexpected and mis-shaped name.
    pub fn assign(&self, tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
        let ours: BTreeSet<&str> = self.entries.iter().map(|(n, _)| n.as_str()).collect();
        let theirs: BTreeSet<&str> = tensors.keys().map(String::as_str).collect();
        let missing: Vec<&str> = ours.difference(&theirs).copied().collect();
        let unexpected: Vec<&str> = theirs.difference(&ours).copied().collect();
        let mut wrong = Vec::new();
        for (name, var) in &self.entries {
            if let Some(t) = tensors.get(name) {
                if t.dims() != var.dims() {
                    wrong.push(format!(
                        "{name}: file {:?}, model {:?}",
                        t.dims(),
                        var.dims()
                    ));
                }
            }
        }
        if !(missing.is_empty() && unexpected.is_empty() && wrong.is_empty()) {
            let mut parts = Vec::new();
            if !missing.is_empty() {
                parts.push(format!("missing {}", missing.join(", ")));
            }
            if !unexpected.is_empty() {
                parts.push(format!("unexpected {}", unexpected.join(", ")));
            }
            if !wrong.is_empty() {
                parts.push(format!("shape mismatch {}", wrong.join("; ")));
            }
            return Err(Error::Weights {
                path: path.to_path_buf(),
                msg: format!("weights do not fit the model: {}", parts.join("; ")),
                hint: format!(
                    "the model expects {}; was the file saved from another --model?",
                    self.entries
                        .iter()
                        .map(|(n, v)| format!("{n} {:?}", v.dims()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        for (name, var) in &self.entries {
            if let Some(t) = tensors.get(name) {
                let t = t.to_dtype(var.dtype())?.to_device(var.device())?;
                var.set(&t)?;
            }
        }
        Ok(())
    }

    /// Loads all parameters from a safetensors file (any float dtype is converted).
    pub fn load_safetensors(&self, path: &Path) -> Result<()> {
        if !path.is_file() {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such weights file"),
            });
        }
        let device = self
            .entries
            .first()
            .map(|(_, v)| v.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let tensors =
            candle_core::safetensors::load(path, &device).map_err(|e| Error::Weights {
                path: path.to_path_buf(),
                msg: format!("not a readable safetensors file: {e}"),
                hint:
                    "pass a file written by `redline train --save` or safetensors.torch.save_file"
                        .into(),
            })?;
        self.assign(&tensors, path)
    }

    /// Writes all parameters to a safetensors file, atomically: a temporary file
    /// beside it is renamed over the target, so a crash never leaves half a file.
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("safetensors.tmp");
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let map: HashMap<String, Tensor> = self
            .entries
            .iter()
            .map(|(n, v)| Ok((n.clone(), v.as_tensor().contiguous()?)))
            .collect::<Result<_>>()?;
        candle_core::safetensors::save(&map, &tmp)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn store() -> Result<Params> {
        let mut p = Params::new();
        p.push(
            "fc.weight",
            Var::zeros((2, 3), candle_core::DType::F32, &Device::Cpu)?,
        )?;
        p.push(
            "fc.bias",
            Var::zeros(2, candle_core::DType::F32, &Device::Cpu)?,
        )?;
        Ok(p)
    }

    #[test]
    fn save_load_round_trip() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let path = dir.path().join("w.safetensors");
        let a = store()?;
        let w = Tensor::arange(0f32, 6., &Device::Cpu)?.reshape((2, 3))?;
        a.get("fc.weight").map(|v| v.set(&w)).transpose()?;
        a.save_safetensors(&path)?;
        let b = store()?;
        b.load_safetensors(&path)?;
        let got = b
            .get("fc.weight")
            .map(|v| v.flatten_all().and_then(|t| t.to_vec1::<f32>()));
        assert_eq!(got.transpose()?, Some(vec![0., 1., 2., 3., 4., 5.]));
        assert!(!path.with_extension("safetensors.tmp").exists());
        Ok(())
    }

    #[test]
    fn mismatch_lists_every_offender_and_changes_nothing() -> Result<()> {
        let p = store()?;
        let mut m = HashMap::new();
        m.insert(
            "fc.weight".to_string(),
            Tensor::ones((3, 3), candle_core::DType::F32, &Device::Cpu)?,
        );
        m.insert(
            "head.bias".to_string(),
            Tensor::ones(2, candle_core::DType::F32, &Device::Cpu)?,
        );
        let msg = p
            .assign(&m, Path::new("w.st"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("missing fc.bias"), "{msg}");
        assert!(msg.contains("unexpected head.bias"), "{msg}");
        assert!(
            msg.contains("fc.weight: file [3, 3], model [2, 3]"),
            "{msg}"
        );
        let w = p
            .get("fc.weight")
            .map(|v| v.sum_all().and_then(|s| s.to_scalar::<f32>()));
        assert_eq!(w.transpose()?, Some(0.0));
        Ok(())
    }

    #[test]
    fn corrupt_file_is_a_clear_error() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
            .map_err(|e| Error::Config(e.to_string()))?;
        let msg = store()?
            .load_safetensors(&path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("bad.safetensors") && msg.contains("not a readable safetensors"),
            "{msg}"
        );
        Ok(())
    }
}

//! Named parameters in PyTorch `state_dict()` order, and their safetensors I/O.
//!
//! Files use PyTorch's names and shapes, so `safetensors.torch.save_file(
//! model.state_dict(), f)` loads here and our files load into the same module.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Tensor, Var};
use redline_kernels::grad::Param;

use crate::error::{Error, Result};

/// The trainable parameters of a model, each with its gradient
/// ([`Param::grad`]): clones share the variables and the gradients.
#[derive(Debug, Clone, Default)]
pub struct Params {
    entries: Vec<(String, Param)>,
    /// State that is saved and loaded but not trained (BatchNorm's running
    /// statistics): PyTorch's buffers.
    buffers: Vec<(String, Var)>,
    /// Parameters weight decay leaves alone (a model's choice, as nanoGPT's
    /// `configure_optimizers` makes its two groups).
    no_decay: BTreeSet<String>,
}

impl Params {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a parameter; names must be unique. Returns the [`Param`] (a
    /// shared handle) for the layer that uses it, so that the fused kernels
    /// write its gradient where the optimizer reads it.
    pub fn push(&mut self, name: impl Into<String>, var: Var) -> Result<Param> {
        let name = name.into();
        if self.state().any(|(n, _)| n == name) {
            return Err(Error::Config(format!(
                "parameter {name:?} registered twice"
            )));
        }
        let param = Param::new(var);
        self.entries.push((name, param.clone()));
        Ok(param)
    }

    /// Adds a buffer: saved, loaded and assigned with the parameters, never
    /// given to the optimizer (BatchNorm's `running_mean`). Names are unique
    /// across parameters and buffers.
    pub fn push_buffer(&mut self, name: impl Into<String>, var: Var) -> Result<Var> {
        let name = name.into();
        if self.state().any(|(n, _)| n == name) {
            return Err(Error::Config(format!(
                "parameter or buffer {name:?} registered twice"
            )));
        }
        self.buffers.push((name, var.clone()));
        Ok(var)
    }

    /// Everything `state_dict()` holds: the parameters, then the buffers.
    pub fn state(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.iter()
            .chain(self.buffers.iter().map(|(n, v)| (n.as_str(), v)))
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
        self.entries
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum()
    }

    /// The variable of the parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Var> {
        self.param(name).map(Param::var)
    }

    /// The parameter called `name`, with its gradient.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }

    /// `(name, var)` pairs in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.entries.iter().map(|(n, p)| (n.as_str(), p.var()))
    }

    /// `(name, param)` pairs in registration order.
    pub fn iter_params(&self) -> impl Iterator<Item = (&str, &Param)> {
        self.entries.iter().map(|(n, p)| (n.as_str(), p))
    }

    /// The variables in order.
    pub fn vars(&self) -> Vec<Var> {
        self.entries.iter().map(|(_, p)| p.var().clone()).collect()
    }

    /// The parameters in order (what optimizers update: shared handles).
    pub fn to_vec(&self) -> Vec<Param> {
        self.entries.iter().map(|(_, p)| p.clone()).collect()
    }

    /// Keeps weight decay off every parameter for which `skip(name,
    /// values)` holds: the model's choice of optimizer groups (nanoGPT
    /// decays 2-D tensors only, not biases and norms). By default every
    /// parameter decays, as a `torch.optim` optimizer over
    /// `model.parameters()` does.
    pub fn exclude_from_decay(&mut self, skip: impl Fn(&str, &Tensor) -> bool) {
        for (n, p) in &self.entries {
            if skip(n, p.as_tensor()) {
                self.no_decay.insert(n.clone());
            }
        }
    }

    /// The parameters in order, each with whether weight decay applies to
    /// it ([`Params::exclude_from_decay`]).
    pub fn with_decay(&self) -> Vec<(Param, bool)> {
        self.entries
            .iter()
            .map(|(n, p)| (p.clone(), !self.no_decay.contains(n)))
            .collect()
    }

    /// Back-propagates `loss` and adds every parameter's gradient to its
    /// [`Param::grad`] (PyTorch's `loss.backward()`): the fused layers wrote
    /// theirs during the pass, the rest are moved out of candle's `GradStore`.
    /// Gradients accumulate until the optimizer takes them or
    /// [`Params::zero_grad`].
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let mut grads = loss.backward()?;
        for (_, p) in &self.entries {
            p.absorb(&mut grads)?;
        }
        Ok(())
    }

    /// Drops every accumulated gradient.
    pub fn zero_grad(&self) {
        for (_, p) in &self.entries {
            p.grad().clear();
        }
    }

    /// A copy of the gradient of `name` accumulated so far (`None` when it
    /// has none, or no such parameter): for inspection.
    pub fn grad(&self, name: &str) -> Result<Option<Tensor>> {
        match self.param(name) {
            Some(p) => Ok(p.grad().to_tensor(p.as_tensor())?),
            None => Ok(None),
        }
    }

    /// A name -> tensor map of the current values (parameters and buffers).
    pub fn to_map(&self) -> HashMap<String, Tensor> {
        self.state()
            .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
            .collect()
    }

    /// Overwrites every parameter and buffer from `tensors`, which must hold
    /// exactly these names with these shapes; otherwise nothing is changed and
    /// the error lists every missing, unexpected and mis-shaped name.
    pub fn assign(&self, tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
        let ours: BTreeSet<&str> = self.state().map(|(n, _)| n).collect();
        let theirs: BTreeSet<&str> = tensors.keys().map(String::as_str).collect();
        let missing: Vec<&str> = ours.difference(&theirs).copied().collect();
        let unexpected: Vec<&str> = theirs.difference(&ours).copied().collect();
        let mut wrong = Vec::new();
        for (name, var) in self.state() {
            if let Some(t) = tensors.get(name) {
                if t.dims() != var.as_tensor().dims() {
                    wrong.push(format!(
                        "{name}: file {:?}, model {:?}",
                        t.dims(),
                        var.as_tensor().dims()
                    ));
                }
                check_values(name, t, var.dtype(), path)?;
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
                    self.state()
                        .map(|(n, v)| format!("{n} {:?}", v.as_tensor().dims()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        for (name, var) in self.state() {
            if let Some(t) = tensors.get(name) {
                let t = t.to_dtype(var.dtype())?.to_device(var.device())?;
                var.set(&t)?;
            }
        }
        Ok(())
    }

    /// Loads all parameters from a safetensors file (any float dtype is converted).
    pub fn load_safetensors(&self, path: &Path) -> Result<()> {
        // A regular file only: the file is mapped, and a device or FIFO has no
        // end to map. A regular file's size bounds what is read.
        redline_core::files::open_input(path, u64::MAX).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let device = self
            .entries
            .first()
            .map(|(_, p)| p.as_tensor().device().clone())
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
    /// beside it is renamed over the target, so a crash or a full disk never
    /// leaves half a file (nor the temporary one). Only a regular file (or a
    /// new path) is written: a device node or FIFO there is refused by name.
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        self.save_safetensors_with(path, &[])
    }

    /// [`Params::save_safetensors`] with string `metadata` in the file's
    /// header (`__metadata__`, which PyTorch's and Hugging Face's loaders
    /// ignore): Redline records the run folder the weights came from.
    pub fn save_safetensors_with(&self, path: &Path, metadata: &[(&str, &str)]) -> Result<()> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let map: HashMap<String, Tensor> = self
            .state()
            .map(|(n, v)| Ok((n.to_string(), v.as_tensor().contiguous()?)))
            .collect::<Result<_>>()?;
        // In memory, then a plain write: the file gets the mode the umask
        // gives (as PyTorch's files do), not a temporary file's 0600.
        let meta = (!metadata.is_empty()).then(|| {
            metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<String, String>>()
        });
        let bytes = safetensors::serialize(&map, meta).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            msg: format!("cannot be serialised: {e}"),
            hint: "a parameter has a dtype safetensors cannot store".into(),
        })?;
        redline_core::files::write_atomic(path, &bytes).map_err(io)
    }
}

/// The string metadata in the header of the safetensors file at `path`
/// (`__metadata__`; empty when it has none), read without its tensors.
pub fn safetensors_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let bad = |msg: String| Error::Weights {
        path: path.to_path_buf(),
        msg,
        hint: "give a .safetensors file (Redline's --save or a checkpoint's weights)".into(),
    };
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| bad("too short for a safetensors header".into()))?;
    // safetensors' own limit on a header.
    const MAX_HEADER: u64 = 100_000_000;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(bad(format!(
            "a header of {n} bytes: not a safetensors file"
        )));
    }
    let mut header = Vec::new();
    file.take(n).read_to_end(&mut header).map_err(io)?;
    let value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("its header is not JSON: {e}")))?;
    let meta = value.get("__metadata__").and_then(|m| m.as_object());
    Ok(meta
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect())
}

/// Refuses weights that would load silently wrong: integers where the model
/// holds floats (a converted file, or the wrong file), and NaN or infinite
/// values (which would otherwise surface later as a "diverged" loss).
fn check_values(name: &str, t: &Tensor, want: DType, path: &Path) -> Result<()> {
    let bad = |msg: String, hint: &str| Error::Weights {
        path: path.to_path_buf(),
        msg,
        hint: hint.into(),
    };
    if want.is_float() && !t.dtype().is_float() {
        return Err(bad(
            format!(
                "{name} holds {:?} integers where the model has {want:?} weights",
                t.dtype()
            ),
            "save the weights as floating point (e.g. `.float()` in PyTorch before save_file)",
        ));
    }
    if t.dtype().is_float() {
        let sum = t
            .to_dtype(DType::F64)?
            .abs()?
            .sum_all()?
            .to_scalar::<f64>()?;
        if !sum.is_finite() {
            return Err(bad(
                format!("{name} holds NaN or infinite values"),
                "the file comes from a run that diverged; start from a checkpoint saved before it",
            ));
        }
    }
    Ok(())
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

    /// Metadata is written into the header, read back without the tensors,
    /// and the weights still load; a file without any reads as empty, and
    /// what is not safetensors is refused by name.
    #[test]
    fn metadata_round_trips_through_the_header() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let (with, without) = (
            dir.path().join("m.safetensors"),
            dir.path().join("p.safetensors"),
        );
        let a = store()?;
        a.save_safetensors_with(&with, &[("redline_run", "/runs/a b"), ("k", "v")])?;
        a.save_safetensors(&without)?;
        let meta = safetensors_metadata(&with)?;
        assert_eq!(
            meta.get("redline_run").map(String::as_str),
            Some("/runs/a b")
        );
        assert_eq!(meta.len(), 2);
        assert!(safetensors_metadata(&without)?.is_empty());
        store()?.load_safetensors(&with)?;
        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\xffrest")
            .map_err(|e| Error::Config(e.to_string()))?;
        let e = safetensors_metadata(&junk).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("not a safetensors file")),
            "{e:?}"
        );
        Ok(())
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
        // The umask decides the mode, as for any file the user writes; a
        // temporary file's 0600 would hide the weights from the group.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let probe = dir.path().join("probe");
            std::fs::write(&probe, b"").map_err(|e| Error::Config(e.to_string()))?;
            let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
            let (want, got) = (mode(&probe), mode(&path));
            assert_eq!(got.ok(), want.ok());
        }
        Ok(())
    }

    #[test]
    fn integer_or_non_finite_weights_are_refused_by_name() -> Result<()> {
        let p = store()?;
        let load = |w: Tensor| {
            let mut m = HashMap::new();
            m.insert("fc.weight".to_string(), w);
            m.insert(
                "fc.bias".to_string(),
                Tensor::zeros(2, DType::F32, &Device::Cpu)?,
            );
            Ok::<_, Error>(
                p.assign(&m, Path::new("w.st"))
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            )
        };
        let ints = load(Tensor::ones((2, 3), DType::I64, &Device::Cpu)?)?;
        assert!(ints.contains("fc.weight holds I64 integers"), "{ints}");
        let nan = Tensor::new(&[[0f32, f32::NAN, 1.], [0., 0., 0.]], &Device::Cpu)?;
        let msg = load(nan)?;
        assert!(
            msg.contains("fc.weight holds NaN or infinite values"),
            "{msg}"
        );
        let inf = Tensor::new(&[[0f32, 1., 1.], [0., f32::INFINITY, 0.]], &Device::Cpu)?;
        assert!(load(inf)?.contains("NaN or infinite"));
        // Half-precision floats are converted, as before.
        assert_eq!(load(Tensor::ones((2, 3), DType::F16, &Device::Cpu)?)?, "");
        Ok(())
    }

    #[test]
    fn a_safetensors_file_whose_header_length_lies_is_refused() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Config(e.to_string()))?;
        let path = dir.path().join("w.safetensors");
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&path, bytes).map_err(|e| Error::Config(e.to_string()))?;
        let msg = store()?
            .load_safetensors(&path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("not a readable safetensors file"), "{msg}");
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

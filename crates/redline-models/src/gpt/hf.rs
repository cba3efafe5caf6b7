//! Hugging Face GPT-2 folders in and out: `config.json` (transformers'
//! `GPT2Config`) and `model.safetensors` (`GPT2LMHeadModel`'s state dict).
//!
//! transformers' GPT-2 keeps its projections as `Conv1D`, whose weights are
//! stored `(in, out)`, the transpose of nanoGPT's `nn.Linear` `(out, in)`:
//! `c_attn`, `c_proj` and `c_fc` weights are transposed on the way in and
//! out. The language-model head is tied to `wte` and absent from the file
//! (a file that holds it must hold `wte`'s values). Names may carry the
//! `transformer.` prefix (`GPT2LMHeadModel`) or not (`GPT2Model`, the
//! original `gpt2` upload); the attention's mask buffers (`attn.bias`,
//! `attn.masked_bias`) are skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde_json::{json, Value};

use super::{Gpt, GptConfig};
use crate::error::{Error, Result};
use crate::Model;

/// The folder's configuration file.
pub const CONFIG: &str = "config.json";
/// The folder's weights file.
pub const WEIGHTS: &str = "model.safetensors";
/// The folder's tokenizer (the `tokenizers` library's format).
pub const TOKENIZER: &str = "tokenizer.json";

/// The largest `config.json` read.
const MAX_CONFIG: u64 = 1 << 20;

/// Whether `dir` is a Hugging Face model folder (a `config.json` and a
/// `model.safetensors`).
pub fn is_folder(dir: &Path) -> bool {
    dir.is_dir() && dir.join(CONFIG).is_file() && dir.join(WEIGHTS).is_file()
}

fn bad(path: &Path, msg: String, hint: &str) -> Error {
    Error::Weights {
        path: path.to_path_buf(),
        msg,
        hint: hint.into(),
    }
}

/// Projections stored as `Conv1D`, `(in, out)`.
fn is_conv1d(name: &str) -> bool {
    name.ends_with("attn.c_attn.weight")
        || name.ends_with("attn.c_proj.weight")
        || name.ends_with("mlp.c_fc.weight")
        || name.ends_with("mlp.c_proj.weight")
}

impl GptConfig {
    /// The GPT a Hugging Face GPT-2 folder's `config.json` describes;
    /// refuses another architecture (naming its `model_type`) and GPT-2
    /// variants this model does not build.
    pub fn from_hf(dir: &Path) -> Result<Self> {
        let path = dir.join(CONFIG);
        let text = redline_core::files::read_input_text(&path, MAX_CONFIG).map_err(|source| {
            Error::Io {
                path: path.clone(),
                source,
            }
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            bad(
                &path,
                format!("not JSON: {e}"),
                "a transformers config.json",
            )
        })?;
        let kind = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if kind != "gpt2" {
            return Err(bad(
                &path,
                format!("model_type {kind:?}: this folder holds another architecture than GPT-2"),
                "give a transformers GPT-2 folder (model_type \"gpt2\")",
            ));
        }
        let size = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        &path,
                        format!("{k} is missing or not a count"),
                        "a GPT2Config",
                    )
                })
        };
        let cfg = Self {
            n_layer: size("n_layer")?,
            n_head: size("n_head")?,
            n_embd: size("n_embd")?,
            block_size: size("n_positions")?,
            vocab_size: size("vocab_size")?,
            dropout: 0.0,
            bias: true,
        };
        let unsupported = |what: String| {
            bad(
                &path,
                format!("{what}: Redline's GPT builds GPT-2's standard form only"),
                "activation gelu_new, layer_norm_epsilon 1e-5, n_inner 4 x n_embd, tied \
                 embeddings, scaled attention",
            )
        };
        let act = v.get("activation_function").and_then(Value::as_str);
        if !matches!(act, None | Some("gelu_new" | "gelu_pytorch_tanh")) {
            return Err(unsupported(format!("activation_function {act:?}")));
        }
        let eps = v.get("layer_norm_epsilon").and_then(Value::as_f64);
        if eps.is_some_and(|e| (e - 1e-5).abs() > 1e-12) {
            return Err(unsupported(format!("layer_norm_epsilon {eps:?}")));
        }
        match v.get("n_inner") {
            None | Some(Value::Null) => {}
            Some(n) if n.as_u64() == Some(4 * cfg.n_embd as u64) => {}
            Some(n) => return Err(unsupported(format!("n_inner {n}"))),
        }
        for (k, want) in [
            ("tie_word_embeddings", true),
            ("scale_attn_weights", true),
            ("scale_attn_by_inverse_layer_idx", false),
            ("reorder_and_upcast_attn", false),
            ("add_cross_attention", false),
        ] {
            if let Some(got) = v.get(k).and_then(Value::as_bool) {
                if got != want {
                    return Err(unsupported(format!("{k} {got}")));
                }
            }
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// transformers' `config.json` for this GPT (dropout 0, GPT-2's
    /// activation and epsilon, tied embeddings).
    pub fn to_hf(&self) -> Value {
        // GPT-2's <|endoftext|> where the vocabulary is GPT-2's.
        let special = match self.vocab_size {
            50257 => json!(50256),
            _ => Value::Null,
        };
        json!({
            "bos_token_id": special,
            "eos_token_id": special,
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_positions": self.block_size,
            "n_inner": null,
            "vocab_size": self.vocab_size,
            "layer_norm_epsilon": 1e-5,
            "attn_pdrop": self.dropout,
            "embd_pdrop": self.dropout,
            "resid_pdrop": self.dropout,
            "initializer_range": 0.02,
            "scale_attn_weights": true,
            "scale_attn_by_inverse_layer_idx": false,
            "reorder_and_upcast_attn": false,
            "tie_word_embeddings": true,
            "use_cache": true,
            "torch_dtype": "float32",
        })
    }
}

impl Gpt {
    /// Loads the weights of the Hugging Face GPT-2 folder `dir`. Its
    /// layers, heads, width and vocabulary must be this model's; its
    /// position table may be longer than this `block_size` (the first
    /// `block_size` rows are taken, as nanoGPT's `crop_block_size`), never
    /// shorter.
    pub fn load_hf(&self, dir: &Path) -> Result<()> {
        let theirs = GptConfig::from_hf(dir)?;
        let ours = &self.cfg;
        let path = dir.join(CONFIG);
        if ours.block_size > theirs.block_size {
            return Err(bad(
                &path,
                format!(
                    "block_size {} is above the folder's position table ({} positions, \
                     n_positions)",
                    ours.block_size, theirs.block_size
                ),
                &format!(
                    "train with a block_size of at most {} (a model file with kind = \"gpt\")",
                    theirs.block_size
                ),
            ));
        }
        let pairs = [
            ("n_layer", ours.n_layer, theirs.n_layer),
            ("n_head", ours.n_head, theirs.n_head),
            ("n_embd", ours.n_embd, theirs.n_embd),
            ("vocab_size", ours.vocab_size, theirs.vocab_size),
        ];
        let wrong: Vec<String> = pairs
            .iter()
            .filter(|(_, a, b)| a != b)
            .map(|(k, a, b)| format!("{k}: the model {a}, the folder {b}"))
            .collect();
        if !wrong.is_empty() {
            return Err(bad(
                &path,
                format!("does not fit the model: {}", wrong.join("; ")),
                "give --model the folder's sizes (a model file with kind = \"gpt\"), and \
                 --classes its vocab_size for token data with fewer ids",
            ));
        }
        let file = dir.join(WEIGHTS);
        redline_core::files::open_input(&file, u64::MAX).map_err(|source| Error::Io {
            path: file.clone(),
            source,
        })?;
        let device = self.wte.as_tensor().device().clone();
        let tensors = candle_core::safetensors::load(&file, &device).map_err(|e| {
            bad(
                &file,
                format!("not a readable safetensors file: {e}"),
                "the folder's model.safetensors, as save_pretrained writes it",
            )
        })?;
        let mut map = from_hf(tensors, &file)?;
        if let Some(wpe) = map.get_mut("transformer.wpe.weight") {
            if wpe.dim(0)? > ours.block_size {
                *wpe = wpe.narrow(0, 0, ours.block_size)?;
            }
        }
        self.params.assign(&map, &file)
    }

    /// Writes the model as a Hugging Face GPT-2 folder into `dir` (created;
    /// it must not hold a `config.json` or `model.safetensors` already):
    /// transformers' `GPT2LMHeadModel.from_pretrained(dir)` loads it.
    pub fn save_hf(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        if !self.cfg.bias {
            return Err(bad(
                dir,
                "a GPT without biases (bias = false): transformers' GPT-2 always has them".into(),
                "export a GPT trained with bias = true, or use its safetensors weights \
                 (nanoGPT's names) directly",
            ));
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        for f in [CONFIG, WEIGHTS] {
            let at = dir.join(f);
            if at.exists() {
                return Err(bad(
                    &at,
                    "already exists: an export never overwrites a file".into(),
                    "give a new folder, or remove the old export first",
                ));
            }
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let map = to_hf(self.params().to_map())?;
        let file = dir.join(WEIGHTS);
        // transformers reads `format` from the header.
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::serialize(&map, Some(meta)).map_err(|e| {
            bad(
                &file,
                format!("cannot be serialised: {e}"),
                "a parameter has a dtype safetensors cannot store",
            )
        })?;
        redline_core::files::write_atomic(&file, &bytes).map_err(io(&file))?;
        let config = dir.join(CONFIG);
        let text = serde_json::to_string_pretty(&self.cfg.to_hf()).map_err(|e| {
            bad(
                &config,
                e.to_string(),
                "report this: a config always serialises",
            )
        })?;
        redline_core::files::write_atomic(&config, text.as_bytes()).map_err(io(&config))?;
        Ok(vec![config, file])
    }
}

/// A transformers GPT-2 state dict as this model's: `transformer.` names,
/// `Conv1D` weights transposed, mask buffers dropped, a tied `lm_head`
/// checked against `wte` and dropped.
pub fn from_hf(tensors: HashMap<String, Tensor>, file: &Path) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let mut head = None;
    for (name, t) in tensors {
        if name == "lm_head.weight" {
            head = Some(t);
            continue;
        }
        let name = match name.strip_prefix("transformer.") {
            Some(rest) => format!("transformer.{rest}"),
            None => format!("transformer.{name}"),
        };
        if name.ends_with(".attn.bias") && t.rank() == 4 || name.ends_with(".attn.masked_bias") {
            continue;
        }
        let t = match is_conv1d(&name) && t.rank() == 2 {
            true => t.t()?.contiguous()?,
            false => t,
        };
        out.insert(name, t);
    }
    if let (Some(head), Some(wte)) = (head, out.get("transformer.wte.weight")) {
        let same = head.dims() == wte.dims()
            && (&head.to_dtype(candle_core::DType::F32)?
                - wte.to_dtype(candle_core::DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?
                == 0.0;
        if !same {
            return Err(bad(
                file,
                "lm_head.weight differs from transformer.wte.weight: an untied head".into(),
                "Redline's GPT ties the head to the token embedding, as GPT-2 does",
            ));
        }
    }
    Ok(out)
}

/// This model's state dict as transformers' `GPT2LMHeadModel` stores it.
pub fn to_hf(ours: HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    ours.into_iter()
        .map(|(name, t)| {
            let t = match is_conv1d(&name) {
                true => t.t()?.contiguous()?,
                false => t.contiguous()?,
            };
            Ok((name, t))
        })
        .collect()
}

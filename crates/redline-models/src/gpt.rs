//! A GPT as nanoGPT writes it (`model.py`), with its `GPTConfig` names and
//! its parameter names: token and learned position embeddings, `n_layer`
//! pre-norm blocks (`x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`, the MLP
//! C -> 4C -> C with GPT-2's tanh GELU), a final LayerNorm and the language
//! model head tied to the token embedding. Initialised as nanoGPT does:
//! N(0, 0.02) for weights and embeddings, the residual projections'
//! (`c_proj`) N(0, 0.02 / sqrt(2 n_layer)), zero biases, LayerNorm ones
//! and zeros. Ids `(B, T)` in, logits `(B, T, vocab)` out.

use candle_core::Tensor;
use redline_kernels::grad::Param;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::flops::Flops;
use crate::init::Initializer;
use crate::layers::attention::Attention;
use crate::layers::basic::{linear_rows, Dropout};
use crate::layers::norm::LayerNorm;
use crate::layers::{Layer, LayerSpec};
use crate::params::Params;
use crate::Model;

mod generate;
pub mod hf;
#[cfg(test)]
mod tests;

pub use generate::{pick, KvCache, Sampling};

/// Why a step through attention is not captured as a CUDA graph yet.
pub(crate) const ATTENTION_ON_GPU: &str =
    "the GPT's step has not been checked as a CUDA graph on a GPU yet (attention runs \
     Redline's kernels for heads up to 64 wide, candle's ops with a host-made causal mask \
     for wider ones); it runs eagerly";

/// nanoGPT's `GPTConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// The longest sequence (the position table's length).
    pub block_size: usize,
    /// Token ids are `0..vocab_size`.
    pub vocab_size: usize,
    /// Dropout probability in training: after the embeddings, of the
    /// attention probabilities, and after each block's two projections
    /// (nanoGPT's `drop`, `attn_dropout`, `resid_dropout`, MLP `dropout`).
    #[serde(default)]
    pub dropout: f64,
    /// Biases in the linear layers and LayerNorms (nanoGPT's `bias`).
    #[serde(default = "yes")]
    pub bias: bool,
}

fn yes() -> bool {
    true
}

impl GptConfig {
    /// nanoGPT's shakespeare-char model: 6 layers, 6 heads, 384 wide,
    /// block 256, 65 characters, dropout 0.2.
    pub fn char_level() -> Self {
        Self {
            n_layer: 6,
            n_head: 6,
            n_embd: 384,
            block_size: 256,
            vocab_size: 65,
            dropout: 0.2,
            bias: true,
        }
    }

    /// GPT-2's smallest (124M): 12 layers, 12 heads, 768 wide, block 1024,
    /// 50257 tokens (Hugging Face's `gpt2`).
    pub fn gpt2() -> Self {
        Self {
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            block_size: 1024,
            vocab_size: 50257,
            dropout: 0.0,
            bias: true,
        }
    }

    /// The GPT a model file describes: `[model]` with `kind = "gpt"` and
    /// nanoGPT's `GPTConfig` names (`n_layer`, `n_head`, `n_embd`,
    /// `block_size`, optional `vocab_size` [default: the data's], `dropout`,
    /// `bias`); `None` for a model file of layers.
    pub fn from_file_text(text: &str) -> Result<Option<Self>> {
        let bad = |e: String| Error::Config(format!("not a model file: {e}"));
        let value: toml::Value = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let Some(model) = value.get("model").and_then(toml::Value::as_table) else {
            return Ok(None);
        };
        if model.get("kind").and_then(toml::Value::as_str) != Some("gpt") {
            return Ok(None);
        }
        let mut table = model.clone();
        table.remove("kind");
        table.remove("name");
        // Set from the data when the file leaves it out.
        table.entry("vocab_size").or_insert(toml::Value::Integer(1));
        let cfg: Self = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                Error::Config(format!(
                    "a gpt model file: {e}HINT: [model] kind = \"gpt\" takes n_layer, n_head, \
                     n_embd, block_size, and optionally vocab_size, dropout, bias"
                ))
            })?;
        Ok(Some(cfg))
    }

    /// Refuses what does not build, with the numbers.
    pub fn check(&self) -> Result<()> {
        let Self {
            n_layer,
            n_head,
            n_embd,
            block_size,
            vocab_size,
            ..
        } = *self;
        if [n_layer, n_head, n_embd, block_size, vocab_size].contains(&0) || n_embd % n_head != 0 {
            return Err(Error::Config(format!(
                "gpt: n_layer {n_layer}, n_head {n_head}, n_embd {n_embd}, block_size \
                 {block_size}, vocab_size {vocab_size}: each must be at least 1 and n_embd \
                 must divide by n_head"
            )));
        }
        if [n_layer, n_head, n_embd, block_size, vocab_size]
            .iter()
            .any(|&v| v > 1 << 20)
        {
            return Err(Error::Config(
                "gpt: sizes are at most 1048576 (n_layer, n_head, n_embd, block_size, vocab_size)"
                    .into(),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Config(format!(
                "gpt: dropout {}: must be in [0, 1) (nanoGPT's shakespeare-char uses 0.2)",
                self.dropout
            )));
        }
        Ok(())
    }

    /// The model as the layer set's layers, for counting its FLOPs: the
    /// token embedding (the positions' addition counts nothing), the
    /// blocks as residuals, the final norm and the head (a linear layer,
    /// the tied weight's product).
    pub fn layers(&self) -> Vec<LayerSpec> {
        let c = self.n_embd;
        let block = [
            LayerSpec::Residual {
                layers: vec![
                    LayerSpec::Layernorm { eps: 1e-5 },
                    LayerSpec::Attention {
                        heads: self.n_head,
                        name: None,
                    },
                ],
                shortcut: vec![],
                name: None,
            },
            LayerSpec::Residual {
                layers: vec![
                    LayerSpec::Layernorm { eps: 1e-5 },
                    LayerSpec::Linear {
                        out: Some(4 * c),
                        name: None,
                    },
                    LayerSpec::Gelu {
                        approximate: crate::layers::GeluForm::Tanh,
                    },
                    LayerSpec::Linear {
                        out: Some(c),
                        name: None,
                    },
                ],
                shortcut: vec![],
                name: None,
            },
        ];
        let mut out = vec![LayerSpec::Embedding {
            num: self.vocab_size,
            dim: c,
        }];
        for _ in 0..self.n_layer {
            out.extend(block.iter().cloned());
        }
        out.push(LayerSpec::Layernorm { eps: 1e-5 });
        out.push(LayerSpec::Linear {
            out: Some(self.vocab_size),
            name: None,
        });
        out
    }

    /// FLOPs per sample of `block_size` tokens ([`crate::flops`]).
    pub fn flops(&self) -> Result<Flops> {
        self.check()?;
        let input = [self.block_size];
        Ok(crate::flops::fold(&self.layers(), &input, self.vocab_size, false)?.0)
    }
}

/// One block's parameters.
struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    c_fc: (Param, Param),
    c_proj: (Param, Param),
    /// After the attention's and the MLP's projections (`None` at p = 0).
    drop: Option<[Dropout; 2]>,
}

/// The GPT.
pub struct Gpt {
    cfg: GptConfig,
    wte: Param,
    wpe: Param,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    /// After the embeddings (`None` at p = 0).
    drop: Option<Dropout>,
    params: Params,
    flops: Flops,
    dtype: candle_core::DType,
}

impl Gpt {
    /// Builds the model with nanoGPT's initialisation drawn from `init`.
    pub fn new(cfg: &GptConfig, init: &mut Initializer) -> Result<Self> {
        cfg.check()?;
        let c = cfg.n_embd;
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        // In nanoGPT's state_dict order: embeddings, blocks, final norm.
        let mut p = Params::new();
        let wte = p.push(
            "transformer.wte.weight",
            init.normal_std(&[cfg.vocab_size, c], 0.02)?,
        )?;
        let wpe = p.push(
            "transformer.wpe.weight",
            init.normal_std(&[cfg.block_size, c], 0.02)?,
        )?;
        // Without biases (`bias = false`) a zero that is not a parameter
        // takes the bias's place: neither trained nor saved.
        let bias = |p: &mut Params, init: &mut Initializer, name: String, n: usize| {
            let b = init.constant(&[n], 0.0)?;
            match cfg.bias {
                true => p.push(name, b),
                false => Ok(Param::new(b)),
            }
        };
        let norm = |p: &mut Params, name: String, init: &mut Initializer| {
            Ok::<_, Error>(LayerNorm {
                w: p.push(format!("{name}.weight"), init.constant(&[c], 1.0)?)?,
                b: bias(p, init, format!("{name}.bias"), c)?,
                eps: 1e-5,
            })
        };
        let linear =
            |p: &mut Params, init: &mut Initializer, name: String, shape: [usize; 2], std| {
                let w = init.normal_std(&shape, std)?;
                Ok::<_, Error>((
                    p.push(format!("{name}.weight"), w)?,
                    bias(p, init, format!("{name}.bias"), shape[0])?,
                ))
            };

        let mut blocks = Vec::new();
        for i in 0..cfg.n_layer {
            let h = format!("transformer.h.{i}");
            let ln_1 = norm(&mut p, format!("{h}.ln_1"), init)?;
            let attn = Attention {
                c_attn: linear(&mut p, init, format!("{h}.attn.c_attn"), [3 * c, c], 0.02)?,
                c_proj: linear(&mut p, init, format!("{h}.attn.c_proj"), [c, c], proj_std)?,
                heads: cfg.n_head,
                dtype: init.compute_dtype(),
                dropout: None,
            };
            let ln_2 = norm(&mut p, format!("{h}.ln_2"), init)?;
            let c_fc = linear(&mut p, init, format!("{h}.mlp.c_fc"), [4 * c, c], 0.02)?;
            let c_proj = linear(
                &mut p,
                init,
                format!("{h}.mlp.c_proj"),
                [c, 4 * c],
                proj_std,
            )?;
            blocks.push(Block {
                ln_1,
                attn,
                ln_2,
                c_fc,
                c_proj,
                drop: None,
            });
        }
        let ln_f = norm(&mut p, "transformer.ln_f".into(), init)?;
        // nanoGPT's groups: matrices and embeddings decay; biases and
        // LayerNorms do not.
        p.exclude_from_decay(|_, t| t.rank() < 2);
        // Dropout streams, seeded after every weight is drawn (so the
        // weights do not depend on the dropout rate).
        let mut drop = None;
        if cfg.dropout > 0.0 {
            let base = init.fork_seed();
            let mut k = 0u64;
            let mut next = || {
                k += 1;
                Dropout::new(cfg.dropout, base.wrapping_add(k))
            };
            drop = Some(next()?);
            for b in &mut blocks {
                b.attn.dropout = Some(next()?);
                b.drop = Some([next()?, next()?]);
            }
        }
        Ok(Self {
            flops: cfg.flops()?,
            cfg: cfg.clone(),
            wte,
            wpe,
            blocks,
            ln_f,
            drop,
            params: p,
            dtype: init.compute_dtype(),
        })
    }
}

impl Gpt {
    /// Its configuration.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// The token rows of `ids` (`B * T` u32) plus the positions
    /// `start..start + T`: `(B, T, C)`.
    fn embed(&self, ids: &Tensor, (b, t): (usize, usize), start: usize) -> Result<Tensor> {
        let c = self.cfg.n_embd;
        let tok = self
            .wte
            .as_tensor()
            .index_select(ids, 0)?
            .reshape((b, t, c))?;
        let pos = self.wpe.as_tensor().narrow(0, start, t)?;
        Ok(tok.broadcast_add(&pos)?)
    }

    /// One block on the residual stream `h`: `x + attn(ln_1(x))`, then
    /// `x + mlp(ln_2(x))`; the attention through the key/value cache `kv`
    /// when generating. The stream stays in the parameters' dtype (fp32
    /// under bf16-mixed, as autocast keeps it): each sublayer's 16-bit
    /// output is cast back before it is added.
    fn block(
        &self,
        blk: &Block,
        h: Tensor,
        train: bool,
        kv: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let stream = h.dtype();
        let [d1, d2] = match &blk.drop {
            Some([a, b]) => [Some(a), Some(b)],
            None => [None, None],
        };
        let x = blk.ln_1.forward_t(&h, train)?;
        let a = match kv {
            Some(kv) => blk.attn.forward_cached(&x, kv)?,
            None => blk.attn.forward_t(&x, train)?,
        };
        let h = residual(d1, &h, &a.to_dtype(stream)?, train)?;
        let m = linear_rows(
            &blk.ln_2.forward_t(&h, train)?,
            (&blk.c_fc.0, &blk.c_fc.1),
            false,
            self.dtype,
        )?;
        let m = redline_kernels::gelu_tanh(&m)?;
        let m = linear_rows(&m, (&blk.c_proj.0, &blk.c_proj.1), false, self.dtype)?;
        residual(d2, &h, &m.to_dtype(stream)?, train)
    }

    /// The final norm and the head tied to the token embedding on rows
    /// `(N, C)`: logits `(N, V)`, fp32.
    fn head(&self, h: &Tensor) -> Result<Tensor> {
        let h = self.ln_f.forward_t(h, false)?;
        let w = self.wte.as_tensor().to_dtype(self.dtype)?;
        Ok(h.to_dtype(self.dtype)?
            .matmul(&w.t()?)?
            .to_dtype(candle_core::DType::F32)?)
    }
}

impl Model for Gpt {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let (b, t) = x.dims2()?;
        if t > self.cfg.block_size {
            return Err(Error::Config(format!(
                "gpt: a sequence of {t} tokens is longer than block_size {}",
                self.cfg.block_size
            )));
        }
        let ids = x.to_dtype(candle_core::DType::U32)?.flatten_all()?;
        let mut h = drop(self.drop.as_ref(), self.embed(&ids, (b, t), 0)?, train)?;
        for blk in &self.blocks {
            h = self.block(blk, h, train, None)?;
        }
        let logits = self.head(&h.reshape((b * t, self.cfg.n_embd))?)?;
        Ok(logits.reshape((b, t, self.cfg.vocab_size))?)
    }

    fn params(&self) -> &Params {
        &self.params
    }

    fn flops(&self) -> Option<Flops> {
        Some(self.flops)
    }

    fn capture_safe(&self) -> std::result::Result<(), String> {
        match self.cfg.dropout {
            0.0 => Err(ATTENTION_ON_GPU.into()),
            p => Err(format!(
                "gpt dropout (p = {p}) draws its masks on the host at every step"
            )),
        }
    }

    fn rng_state(&self) -> Vec<u128> {
        let mut out = Vec::new();
        for d in self.dropouts() {
            d.rng_state(&mut out);
        }
        out
    }

    fn load_rng_state(&self, state: &[u128]) -> Result<()> {
        let mut it = state.iter().copied();
        for d in self.dropouts() {
            d.load_rng_state(&mut it)?;
        }
        match it.next() {
            None => Ok(()),
            Some(_) => Err(Error::Config(format!(
                "random stream positions: the state holds {}, this model has {}",
                state.len(),
                self.rng_state().len()
            ))),
        }
    }
}

impl Gpt {
    /// Its dropout layers in a fixed order: the embeddings', then each
    /// block's attention probabilities' and two projections'.
    fn dropouts(&self) -> Vec<&dyn Layer> {
        let mut out: Vec<&dyn Layer> = Vec::new();
        if let Some(d) = &self.drop {
            out.push(d);
        }
        for b in &self.blocks {
            out.push(&b.attn);
            if let Some([x, y]) = &b.drop {
                out.push(x);
                out.push(y);
            }
        }
        out
    }
}

/// `h + dropout(x)` (`h + x` without a dropout layer).
fn residual(d: Option<&Dropout>, h: &Tensor, x: &Tensor, train: bool) -> Result<Tensor> {
    match d {
        Some(d) => d.add_to(h, x, train),
        None => Ok((h + x)?),
    }
}

/// `x` through the dropout `d` in training; `x` otherwise.
fn drop(d: Option<&Dropout>, x: Tensor, train: bool) -> Result<Tensor> {
    match (d, train) {
        (Some(d), true) => d.forward_t(&x, true),
        _ => Ok(x),
    }
}

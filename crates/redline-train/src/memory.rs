//! What a training step holds in memory, split the way precision changes
//! it: parameters, gradients, optimizer state and activations (the tensors
//! the forward keeps for the backward). Measured once, at a fit's first
//! step: on the CPU by the sizes of the tensors themselves, on a GPU by
//! the allocator (bytes allocated while the forward ran).

use std::collections::HashMap;

use candle_core::Tensor;
use redline_models::Params;
use serde::{Deserialize, Serialize};

/// A step's memory, in bytes (`summary.json`'s `memory`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MemorySplit {
    /// The parameters and buffers (fp32 master weights under mixed precision).
    pub parameters: u64,
    /// The gradients after a backward.
    pub gradients: u64,
    /// The optimizer's state after an update (moments, momentum buffers).
    pub optimizer: u64,
    /// What the forward of one batch holds for the backward.
    pub activations: u64,
    /// The batch the activations are of.
    pub batch: usize,
    /// How the activations were measured: `tensor sizes` (the storages
    /// the autograd graph holds, each once) or `allocator` (device bytes
    /// allocated during the forward).
    pub measured_by: String,
}

impl MemorySplit {
    /// The four parts added up.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer + self.activations
    }

    /// One line: `parameters 0.39 MiB, gradients ..., activations 1.2 MiB
    /// (batch 64, tensor sizes)`.
    pub fn line(&self) -> String {
        let mib = |b: u64| b as f64 / 1048576.0;
        format!(
            "parameters {:.2} MiB, gradients {:.2} MiB, optimizer state {:.2} MiB, activations \
             {:.2} MiB (batch {}, by {}); {:.2} MiB in all",
            mib(self.parameters),
            mib(self.gradients),
            mib(self.optimizer),
            mib(self.activations),
            self.batch,
            self.measured_by,
            mib(self.total())
        )
    }
}

/// The extent of `t`'s storage that its layout can reach, in bytes.
fn reach_bytes(t: &Tensor) -> u64 {
    let (_, layout) = t.storage_and_layout();
    let last: usize = layout
        .dims()
        .iter()
        .zip(layout.stride())
        .map(|(d, s)| d.saturating_sub(1) * s)
        .sum();
    let elems = if t.elem_count() == 0 {
        0
    } else {
        layout.start_offset() + last + 1
    };
    (elems * t.dtype().size_in_bytes()) as u64
}

/// The storage a tensor views, as an identity (shared by its views).
fn storage_key(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref(&*storage).addr()
}

/// Bytes held by the autograd graph of `loss`: every storage a node of the
/// graph views, counted once, except the parameters' own (16-bit copies of
/// the weights and the rounded operands count: the step holds them too).
pub fn activation_bytes(loss: &Tensor, params: &Params) -> u64 {
    let own: Vec<usize> = params
        .iter()
        .map(|(_, v)| storage_key(v.as_tensor()))
        .collect();
    let mut seen: HashMap<usize, u64> = HashMap::new();
    for node in loss.sorted_nodes() {
        let key = storage_key(node);
        if own.contains(&key) {
            continue;
        }
        let bytes = reach_bytes(node);
        let e = seen.entry(key).or_insert(0);
        *e = (*e).max(bytes);
    }
    seen.values().sum()
}

/// Bytes of every parameter and buffer.
pub fn parameter_bytes(params: &Params) -> u64 {
    params.iter().map(|(_, v)| reach_bytes(v.as_tensor())).sum()
}

/// Bytes of the gradients held now.
pub fn gradient_bytes(params: &Params) -> u64 {
    params.iter_params().map(|(_, p)| p.grad().bytes()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use candle_core::{DType, Device};
    use redline_core::Precision;
    use redline_models::{Model, ModelConfig};

    /// The MLP's forward at batch 4: the graph holds the input's products
    /// and activations (B x 128 and B x 10 in fp32, among others), not the
    /// weights; bf16 keeps its 16-bit activations besides the rounded
    /// operands, and the counts scale with the batch.
    #[test]
    fn activations_are_the_graphs_storages_not_the_weights() -> Result<()> {
        let dev = redline_core::Device::cpu();
        let acts = |p: Precision, b: usize| -> Result<u64> {
            let model = ModelConfig::by_name("mlp")?.build(&dev, p, 0)?;
            let x = Tensor::ones((b, 1, 28, 28), DType::F32, &Device::Cpu)?;
            let y = model.forward_t(&x, true)?;
            let loss = y.to_dtype(DType::F32)?.sqr()?.mean_all()?;
            Ok(activation_bytes(&loss, model.params()))
        };
        let (small, big) = (acts(Precision::Fp32, 4)?, acts(Precision::Fp32, 64)?);
        // At least the hidden layer and the logits, per sample.
        assert!(small >= 4 * (128 + 10) * 4, "{small}");
        assert!(big > 10 * small, "{small} -> {big}");
        let model = ModelConfig::by_name("mlp")?.build(&dev, Precision::Fp32, 0)?;
        let params = parameter_bytes(model.params());
        assert_eq!(params, (784 * 128 + 128 + 128 * 10 + 10) * 4);
        // The weights themselves are never counted as activations.
        assert!(small < params, "{small} vs {params}");
        Ok(())
    }

    #[test]
    fn a_line_names_every_part() {
        let m = MemorySplit {
            parameters: 1 << 20,
            gradients: 1 << 20,
            optimizer: 2 << 20,
            activations: 3 << 19,
            batch: 64,
            measured_by: "tensor sizes".into(),
        };
        assert_eq!(
            m.line(),
            "parameters 1.00 MiB, gradients 1.00 MiB, optimizer state 2.00 MiB, activations \
             1.50 MiB (batch 64, by tensor sizes); 5.50 MiB in all"
        );
    }
}
